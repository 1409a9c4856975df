"""``polycast sim fsdp``: one FSDP or HSDP training step, simulated layer by layer
(docs/pipeline.md), optionally written out as Chakra traces."""

from __future__ import annotations

import argparse
import json
import sys
import time

from ...algorithms import get
from ...collectives import Collective
from ...errors import InvalidArgument
from ...units import parse_size
from .. import checks
from ..table import print_table
from .common import add_common, print_stats, process_stats, progress


def add_parser(ssub) -> None:
    f = ssub.add_parser("fsdp", help="one FSDP or HSDP training step, simulated layer by "
                                     "layer",
                        description="Simulate one training step of a model wrapped per block "
                                    "with FSDP2 (or HSDP with --shard): every layer's "
                                    "allgathers, reduce-scatters and compute are nodes of one "
                                    "simulation on the real engines (docs/pipeline.md).")
    add_common(f)
    f.set_defaults(nodes=64)
    f.add_argument("--model", default="llama2-7b",
                   help="model preset: " + ", ".join(_model_names()) + " (default llama2-7b)")
    f.add_argument("--ag", default="ring", help="allgather algorithm (ring | mcast | ...)")
    f.add_argument("--rs", default="ring", help="reduce-scatter algorithm (ring | innet | ...)")
    f.add_argument("--ar", default="ring", help="HSDP: the replica allreduce's algorithm")
    f.add_argument("--shard", type=int, default=None,
                   help="HSDP: shard each block over groups of this many consecutive ranks "
                        "and allreduce gradients across the groups (default: FSDP over all)")
    f.add_argument("--layers", type=int, default=None, help="override the preset's blocks")
    f.add_argument("--layer-bytes", default=None,
                   help="override a block's parameter bytes (e.g. 400MB; no root unit then)")
    f.add_argument("--compute-per-layer", default=None,
                   help="forward compute per block (e.g. 4ms; backward is twice it); "
                        "default 2 x params x tokens / tflops (+ attention with --seq)")
    f.add_argument("--tokens", type=int, default=4096, help="tokens per rank per step")
    f.add_argument("--seq", type=int, default=None,
                   help="sequence length: adds attention's FLOPs (default: matmuls only)")
    f.add_argument("--tflops", type=float, default=400.0,
                   help="effective TFLOP/s per rank (default 400)")
    f.add_argument("--optimizer", default=None, metavar="TIME",
                   help="optimizer step time (default: Adam over the rank's shard, "
                        "memory-bound at 2 TB/s)")
    f.add_argument("--roots", type=int, default=None,
                   help="multicast streams at a time (default: every rank of the group)")
    f.add_argument("--compare", action="store_true",
                   help="the four rows ring/mcast x ring/innet of specs/measures.md, with the "
                        "composed formula's step beside the simulated one")
    f.add_argument("--no-memo", dest="memo", action="store_false",
                   help="simulate every block (default: blocks b, b+1, b+2 and the checked "
                        "period of the repeated blocks)")
    f.add_argument("--nic", default=None, metavar="bf3-dpa|host-python|host-native|PARAMS",
                   help="receivers behind this NIC's rate and bounded queue, as sim "
                        "COLLECTIVE --nic (default: receivers keep up)")
    f.add_argument("--trace", metavar="FILE",
                   help="write a Perfetto timeline (JSON) of a few ranks; every block simulated")
    f.add_argument("--plot", metavar="FILE",
                   help="draw rank 0's timeline, ring/ring beside the asked rows (png/pdf/svg)")
    f.add_argument("--write-chakra", metavar="DIR",
                   help="also write the step as Chakra execution traces DIR/fsdp.<rank>.et "
                        "(the chakra extra)")
    f.set_defaults(func=run_fsdp)


def _seconds(text):
    from ...sim.topology import parse_seconds
    return parse_seconds(text)


def _model_names() -> list[str]:
    from ...workload.models import MODELS
    return list(MODELS)


def _ms(x) -> float | str:
    return "" if x is None else x * 1e3

def run_fsdp(args: argparse.Namespace) -> int:
    from ...sim.fsdp import COMPARE_ROWS, compare_fsdp, simulate_fsdp
    from ...sim.pipeline import representative_ranks
    from ...sim.topology import parse_topology
    from ...workload.models import get_model
    checks.positive_int("--nodes", args.nodes)
    if args.roots is not None:
        checks.positive_int("--roots", args.roots)
    if args.layers is not None:
        checks.positive_int("--layers", args.layers)
    for opt in ("tokens", "seq"):
        if getattr(args, opt) is not None:
            checks.positive_int(f"--{opt}", getattr(args, opt))
    if args.shard is not None:
        checks.positive_int("--shard", args.shard)
        if args.nodes % args.shard:
            raise InvalidArgument(f"--shard {args.shard} must divide --nodes {args.nodes}")
    if args.model:
        get_model(args.model)
    shard = args.shard or args.nodes
    if not args.compare:
        checks.algorithm_names(Collective.ALLGATHER, [args.ag], shard)
        checks.algorithm_names(Collective.REDUCE_SCATTER, [args.rs], shard)
    if args.shard and args.shard < args.nodes:
        checks.algorithm_names(Collective.ALLREDUCE, [args.ar], args.nodes // args.shard)
    checks.output_path(args.trace, "--trace", (".json",))
    checks.output_path(args.plot, "--plot", (".png", ".pdf", ".svg"))
    if args.write_chakra:
        from ...workload.chakra import require_chakra
        require_chakra()
        checks.output_dir(args.write_chakra, "--write-chakra")
    topo = parse_topology(args.topology, args.nodes, link=args.link, framing=args.framing)
    nic = None
    if args.nic is not None:
        from ...models.nic import parse_nic
        nic = parse_nic(args.nic)
        if args.shard and args.shard < args.nodes and (args.compare or get(
                Collective.ALLGATHER, args.ag).multicast):
            raise InvalidArgument("--nic covers multicast on the world communicator only, "
                                  "not HSDP's shard groups (--shard)")
    timeline = bool(args.trace or args.plot)
    kw = dict(layers=args.layers,
              layer_bytes=parse_size(args.layer_bytes) if args.layer_bytes else None,
              compute_per_layer_s=(_seconds(args.compute_per_layer)
                                   if args.compute_per_layer else None),
              optimizer_s=_seconds(args.optimizer) if args.optimizer else None,
              tokens_per_rank=args.tokens, seq=args.seq, tflops=args.tflops,
              roots=args.roots, nic=nic, shard=args.shard, ar=args.ar, memo=args.memo,
              record_ranks=representative_ranks(args.nodes) if timeline else None)
    model = args.model if args.model else None
    cpu0 = time.process_time()
    with progress(f"simulating an FSDP step on {args.nodes} ranks", args.json):
        if args.compare:
            results = compare_fsdp(model, args.nodes, topology=topo, **kw)
        else:
            rows = [(args.ag, args.rs)]
            if args.plot and rows[0] != COMPARE_ROWS[0]:
                rows.insert(0, COMPARE_ROWS[0])         # the baseline beside the asked row
            results = [simulate_fsdp(model, args.nodes, ag=a, rs=r, topology=topo, **kw)
                       for a, r in rows]
    stats = process_stats(cpu0) if args.stats else None
    runs = [(f"{r.ag}/{r.rs}" + (f"/{r.ar}" if r.ar else ""), r.pipeline) for r in results]
    if args.trace:
        from ...sim.timeline import write_trace
        write_trace(args.trace, runs)
    if args.plot:
        from ...sim.timeline import plot_timelines
        r0 = results[0]
        plot_timelines(runs, args.plot, title=(
            f"{r0.model}, {r0.nodes} ranks" + (f" (HSDP, shards of {r0.shard})"
                                               if r0.replicas > 1 else "")
            + f", {topo.description}: one training step"))
    if args.write_chakra:
        from ...workload.chakra import write_chakra
        from ...workload.fsdp import build_fsdp
        for r in results:
            w, _ = build_fsdp(r.spec)
            prefix = write_chakra(w, args.write_chakra, _chakra_name(r, len(results)))
            print(f"wrote {prefix}.0.et .. {prefix}.{w.nranks - 1}.et; simulate it with: "
                  f"polycast sim workload {prefix} -n {args.nodes} -t '{args.topology}' "
                  f"--link {args.link}", file=sys.stderr)
    if args.json:
        objs = [r.to_json() for r in results]
        for o in objs if stats else ():
            o["stats"] = stats
        print(json.dumps(objs if len(objs) > 1 else objs[0], indent=1))
        return 0
    _print_fsdp(topo, results, args.compare)
    if stats:
        print_stats(stats)
    return 0


def _chakra_name(r, n: int) -> str:
    return "fsdp" if n == 1 else f"fsdp-{r.ag}-{r.rs}"


def _print_fsdp(topo, results, compare: bool) -> None:
    r0 = results[0]
    N = r0.layer_nbytes
    B = topo.host_link_bw
    kind = (f"HSDP {r0.model}: shards of {r0.shard}, {r0.replicas} replicas"
            if r0.replicas > 1 else f"FSDP {r0.model}")
    print(f"{topo.summary()}\n{kind}: {r0.layers} blocks of {N / 1e6:.1f} MB, compute "
          f"{r0.compute_fwd_s * 1e3:.2f} ms fwd + {r0.compute_bwd_s * 1e3:.2f} ms bwd per "
          f"block, head {r0.head_fwd_s * 1e3:.2f} ms, optimizer {r0.optimizer_s * 1e3:.2f} ms;"
          f" N/B = {N / B * 1e3:.3f} ms")
    if r0.nic is not None:
        print(f"receivers' NIC {r0.nic}: {r0.nic_gbps:.1f} Gbit/s")
    cols = ["allgather", "reduce-scatter"] + (["allreduce"] if r0.replicas > 1 else []) + [
        "step (ms)"] + (["formula (ms)", "diff %"] if compare else []) + [
        "bubble %", "exposed fwd (ms)", "exposed bwd (ms)", "bwd/block (N/B)"] + (
        ["formula (N/B)", "sent/rank (N)", "recv/rank (N)"] if compare else []) + [
        "traffic (GB)", "wall s"]
    rows = []
    for r in results:
        row = [r.ag, r.rs] + ([r.ar] if r0.replicas > 1 else []) + [r.step_s * 1e3]
        if compare:
            d = r.formula_diff_pct
            row += [_ms(r.formula_step_s), "" if d is None else round(d, 1)]
        row += [r.bubble_pct, r.exposed_s.get("forward", 0.0) * 1e3,
                r.exposed_s.get("backward", 0.0) * 1e3,
                "" if r.window_over_n_b is None else r.window_over_n_b]
        if compare:
            row += ["" if r.formula_window_over_n_b is None else r.formula_window_over_n_b,
                    "" if r.sent_per_rank_nbytes is None else r.sent_per_rank_nbytes / N,
                    "" if r.recv_per_rank_nbytes is None else r.recv_per_rank_nbytes / N]
        row += [r.step_link_bytes / 1e9, round(r.wall_s, 1)]
        rows.append(row)
    print_table("one training step, simulated layer by layer" + (
        " (formula: the composed model of earlier versions, docs/pipeline.md)" if compare
        else ""), cols, rows)
    layers = [l for l in ("intra-host", "host-leaf", "leaf-spine", "spine-core")
              if any(l in r.link_bytes_by_layer for r in results)]
    print_table("bytes per link layer, one step (GB)", ["allgather", "reduce-scatter"] + layers,
                [[r.ag, r.rs] + [r.link_bytes_by_layer.get(l, 0) / 1e9 for l in layers]
                 for r in results])
    if not compare:
        r = results[-1]
        phases = sorted({p for c in r.rank_classes for p in c["exposed_s"]})
        print_table(f"{r.ag}/{r.rs}: ranks by class", ["ranks", "count", "end (ms)",
                                                         "compute (ms)"]
                    + [f"exposed {p} (ms)" for p in phases],
                    [[c["ranks"][:40], c["count"], c["end_s"] * 1e3, c["compute_s"] * 1e3]
                     + [c["exposed_s"].get(p, 0.0) * 1e3 for p in phases]
                     for c in r.rank_classes[:8]])
    memo = results[-1].memo
    if memo and memo.get("period_s") is not None:
        print(f"memo: blocks {memo['blocks_simulated']} simulated; the repeated blocks' "
              f"period ({memo['period_s'] * 1e3:.3f} ms) checked affine; --no-memo "
              "simulates all of them", file=sys.stderr)

