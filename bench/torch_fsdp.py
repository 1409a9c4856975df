"""FSDP2 training steps on polycast against gloo, and the fused collective+matmul gain.

    python bench/torch_fsdp.py [--ranks 4,2] [--rounds 3] [--steps 3] [--json FILE]

For each rank count, one job (``polycast run``) whose ranks hold a gloo group and three
polycast groups — ``auto`` (the default: symmetric memory on this host), ``ring`` (ring
all-gather and reduce-scatter on the engine) and ``mcast`` (multicast all-gather) — and
train the example transformer (examples/tiny_transformer.py, 3.7 M parameters, FSDP2 with
one unit per block) on each, interleaved: every round runs ``--steps`` steps per group in
a rotated order, so load drifting on this shared machine hits every group alike. A
group's step time is the median over rounds of (the slowest rank's time for the round's
steps / steps); the ratio is gloo's step time over the group's (> 1: faster than gloo).

Then, on the ``auto`` group, ``allgather_matmul`` and ``matmul_reduce_scatter`` against
the unfused pair (all_gather_into_tensor then matmul; matmul then reduce_scatter_tensor)
at sizes where the collective and the matmul take comparable time (both are printed),
as the median over ``--iters`` of the slowest rank's time.

Prints the tables and the machine load (``uptime``), writes JSON (default
bench/results/torch_fsdp.json). Every rank uses one torch thread.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "examples"))

DEFAULT_JSON = HERE / "results" / "torch_fsdp.json"
GROUPS = ("gloo", "auto", "ring", "mcast")
# (rows per rank m, k, n): allgather_matmul gathers [P*m, k] and multiplies by [k, n].
# A narrow n makes the matmul cost about what moving the rows costs on one host (memcpy
# ~5 GB/s against ~50 GFLOP/s of one core: n ~ 20); wider ones are matmul-bound.
FUSED_SIZES = ((2048, 1024, 16), (2048, 1024, 32), (1024, 1024, 128))


# -------------------------------------------------------------------------- rank side
def _rank_main(args) -> None:
    import torch
    import torch.distributed as dist

    import polycast.torch as pt
    import tiny_transformer as tt
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import fully_shard

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, P = dist.get_rank(), dist.get_world_size()
    gloo = dist.group.WORLD
    names = args.groups.split(",")
    make = {"gloo": lambda: gloo,
            "auto": lambda: dist.new_group(backend="polycast"),
            "ring": lambda: dist.new_group(backend="polycast", pg_options=pt.Options(
                allgather="ring", reduce_scatter="ring")),
            "mcast": lambda: dist.new_group(backend="polycast", pg_options=pt.Options(
                allgather="mcast"))}
    groups = {name: make[name]() for name in names}
    GROUPS = tuple(names)
    cfg = argparse.Namespace(vocab=1024, width=args.width, layers=args.layers, seq=64,
                             batch=4, threads=1)

    def slowest(seconds: float) -> float:
        t = torch.tensor([seconds], dtype=torch.float64)
        dist.all_reduce(t, dist.ReduceOp.MAX, group=gloo)
        return t.item()

    # -- FSDP2 steps --------------------------------------------------------------------
    trainers = {}
    for name, g in groups.items():
        model = tt.build(cfg)
        mesh = DeviceMesh.from_group(g, "cpu")
        for layer in model.layers:
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
        trainers[name] = (model, torch.optim.AdamW(model.parameters(), lr=1e-3), [0])

    def steps(name: str, n: int) -> float:
        model, opt, counter = trainers[name]
        dist.barrier(group=gloo)
        t0 = time.perf_counter()
        for _ in range(n):
            x, y = tt.batch(counter[0], rank, cfg.batch, cfg.seq, cfg.vocab)
            counter[0] += 1
            loss = model(x, y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        return slowest(time.perf_counter() - t0) / n

    for name in GROUPS:
        steps(name, 1)                                     # warm-up: buffers, schedules
    per_round = {name: [] for name in GROUPS}
    for r in range(args.rounds):
        order = GROUPS[r % len(GROUPS):] + GROUPS[:r % len(GROUPS)]
        for name in order:
            per_round[name].append(steps(name, args.steps))
    fsdp = {name: {"step_ms": 1e3 * statistics.median(v), "rounds_ms": [1e3 * x for x in v]}
            for name, v in per_round.items()}
    mcast_bytes = groups["mcast"].comm.stats().datagram_bytes_out if "mcast" in groups else 0

    # -- fused vs unfused ----------------------------------------------------------------
    g = groups.get("auto")
    fused = []
    for m, k, n in FUSED_SIZES if g is not None and not args.no_fused else ():
        x = torch.randn(m, k)
        w = torch.randn(k, n)
        xs = torch.randn(P * m, k)
        full = torch.empty(P * m, k)
        part_out = torch.empty(m, n)
        # The unfused pair allocates its buffers per call as the fused operators do (fresh
        # pages cost as much as a copy here): the comparison is of the schedule alone.

        def timed(fn) -> float:
            fn()
            samples = []
            for _ in range(args.iters):
                dist.barrier(group=gloo)
                t0 = time.perf_counter()
                fn()
                samples.append(slowest(time.perf_counter() - t0))
            return 1e3 * statistics.median(samples)

        def ag():
            dist.all_gather_into_tensor(full, x, group=g)

        def ag_mm():
            gathered = torch.empty(P * m, k)
            dist.all_gather_into_tensor(gathered, x, group=g)
            return gathered @ w

        def mm_rs():
            out = torch.empty(m, n)
            dist.reduce_scatter_tensor(out, xs @ w, group=g)
            return out

        # The same pairs into buffers kept across calls: (fresh - kept) is what allocating
        # the outputs per call costs, (fresh unfused / fused) the overlap alone.
        product = torch.empty(P * m, n)
        part = torch.empty(P * m, n)

        def ag_mm_kept():
            dist.all_gather_into_tensor(full, x, group=g)
            return torch.mm(full, w, out=product)

        def mm_rs_kept():
            torch.mm(xs, w, out=part)
            dist.reduce_scatter_tensor(part_out, part, group=g)
            return part_out

        row = {"m": m, "k": k, "n": n,
               "allgather_ms": timed(ag),
               "matmul_ms": timed(lambda: full @ w),
               "reduce_scatter_ms": timed(lambda: dist.reduce_scatter_tensor(
                   part_out, torch.empty(P * m, n), group=g)),
               "allgather_matmul_unfused_ms": timed(ag_mm),
               "allgather_matmul_unfused_kept_ms": timed(ag_mm_kept),
               "matmul_reduce_scatter_unfused_kept_ms": timed(mm_rs_kept),
               "allgather_matmul_fused_ms": timed(lambda: pt.allgather_matmul(
                   x, w, g, nchunks=args.nchunks)),
               "matmul_reduce_scatter_unfused_ms": timed(mm_rs),
               "matmul_reduce_scatter_fused_ms": timed(lambda: pt.matmul_reduce_scatter(
                   xs, w, g, nchunks=args.nchunks))}
        fused.append(row)
    if rank == 0:
        Path(os.environ["BENCH_OUT"]).write_text(json.dumps(
            {"ranks": P, "fsdp2": fsdp, "fused": fused, "mcast_datagram_bytes": mcast_bytes,
             "width": args.width, "layers": args.layers,
             "rounds": args.rounds, "steps": args.steps, "iters": args.iters,
             "nchunks": args.nchunks}))
    dist.destroy_process_group()


# -------------------------------------------------------------------------- driver side
def _run_job(nranks: int, args) -> dict:
    from polycast.tools.launch import launch
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "result.json"
        cmd = [str(Path(__file__).resolve()), "--rank-side", "--rounds", str(args.rounds),
               "--steps", str(args.steps), "--iters", str(args.iters),
               "--nchunks", str(args.nchunks), "--groups", args.groups,
               "--width", str(args.width), "--layers", str(args.layers)]
        if args.no_fused:
            cmd.append("--no-fused")
        env = {"BENCH_OUT": str(out), "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
        if args.lab:
            from polycast.lab import runner
            status, _ = runner.run([sys.executable, *cmd], name=args.lab, nranks=nranks,
                                   where=args.placement, timeout_s=args.timeout,
                                   extra_env=env)
        else:
            status = launch(nranks, cmd, timeout_seconds=args.timeout, extra_env=env)
        if status != 0 or not out.exists():
            raise SystemExit(f"bench/torch_fsdp.py: the {nranks}-rank job failed "
                             f"(status {status})")
        return json.loads(out.read_text())


def _load() -> str:
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    except OSError:
        return "unknown"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ranks", default="4,2", help="rank counts, comma-separated")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=3, help="steps per group per round")
    p.add_argument("--iters", type=int, default=7, help="fused: timed calls per case")
    p.add_argument("--nchunks", type=int, default=4, help="fused: chunks per call")
    p.add_argument("--timeout", type=float, default=900.0, help="per job, seconds")
    p.add_argument("--json", default=str(DEFAULT_JSON))
    p.add_argument("--groups", default=",".join(GROUPS),
                   help="groups to train on (gloo first: it is the reference)")
    p.add_argument("--width", type=int, default=256, help="model width")
    p.add_argument("--layers", type=int, default=4, help="model blocks")
    p.add_argument("--no-fused", action="store_true", help="FSDP2 steps only")
    p.add_argument("--placement", default=None,
                   help="with --lab: linear (default), interleave (ring neighbours on "
                        "different leaves: every ring hop crosses the uplinks)...")
    p.add_argument("--lab", metavar="NAME",
                   help="run the ranks on lab NAME's hosts (polycast lab up; root), one per "
                        "host: e.g. `polycast lab up --name fsdp --hosts 4 --leaves 2 --link "
                        "200Mbps --uplink 4:1` then --lab fsdp --ranks 4 --groups "
                        "gloo,ring,mcast --no-fused")
    p.add_argument("--rank-side", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.rank_side:
        _rank_main(args)
        return
    from polycast.cli.table import print_table
    ranks = [int(r) for r in args.ranks.split(",") if r.strip()]
    names = args.groups.split(",")
    if not names or names[0] != "gloo" or any(n not in GROUPS for n in names):
        p.error(f"--groups {args.groups!r}: gloo first, then any of {', '.join(GROUPS[1:])}")
    load_before = _load()
    results = [_run_job(n, args) for n in ranks]
    load_after = _load()
    rows = []
    for res in results:
        gloo = res["fsdp2"]["gloo"]["step_ms"]
        for name in res["fsdp2"]:
            ms = res["fsdp2"][name]["step_ms"]
            rows.append([res["ranks"], "gloo" if name == "gloo" else f"polycast {name}",
                         round(ms, 1), round(gloo / ms, 2)])
    where = (f"lab {args.lab}, one rank per host, placement {args.placement or 'linear'}"
             if args.lab else "one host")
    print_table(f"FSDP2 step (transformer width {args.width}, {args.layers} blocks; batch 4 x "
                f"64 tokens per rank; {where})",
                ["ranks", "backend", "step ms", "gloo / this"], rows)
    frows = []
    for res in results:
        for f in res["fused"]:
            frows.append([res["ranks"], f"{f['m']}x{f['k']}x{f['n']}",
                          round(f["allgather_ms"], 2), round(f["matmul_ms"], 2),
                          round(f.get("allgather_matmul_unfused_kept_ms", float("nan")), 2),
                          round(f["allgather_matmul_unfused_ms"], 2),
                          round(f["allgather_matmul_fused_ms"], 2),
                          round(f["allgather_matmul_unfused_ms"]
                                / f["allgather_matmul_fused_ms"], 2),
                          round(f.get("matmul_reduce_scatter_unfused_kept_ms",
                                      float("nan")), 2),
                          round(f["matmul_reduce_scatter_unfused_ms"], 2),
                          round(f["matmul_reduce_scatter_fused_ms"], 2),
                          round(f["matmul_reduce_scatter_unfused_ms"]
                                / f["matmul_reduce_scatter_fused_ms"], 2)])
    print_table(f"fused collective + matmul on polycast auto (nchunks {args.nchunks}; "
                "shape m x k x n: x_shard m x k per rank, weight k x n)",
                ["ranks", "shape", "allgather ms", "matmul ms", "AG+MM kept ms",
                 "AG+MM fresh ms", "fused ms", "overlap gain", "MM+RS kept ms",
                 "MM+RS fresh ms", "fused ms", "overlap gain"], frows)
    print("kept: the unfused pair into buffers kept across calls; fresh: allocated per call, "
          "as the fused operators do; overlap gain = fresh / fused (same allocations)")
    print(f"load before: {load_before}\nload after:  {load_after}")
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"results": results, "load_before": load_before,
                               "load_after": load_after, "lab": args.lab,
                               "placement": args.placement}, indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
