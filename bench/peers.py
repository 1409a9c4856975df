"""polycast beside its peers: the same collectives and sizes with polycast, MPICH (mpi4py)
and torch.distributed's gloo, in one invocation, on local ranks.

    python bench/peers.py [-n 4] [--collectives allgather,allreduce,broadcast,reduce_scatter]
                          [--sizes 8B,64KiB,1MiB,16MiB] [--transport auto|shm|tcp]
                          [--iters N] [--warmup N] [--breakdown] [--json FILE]

prints busbw (GB/s, 1e9 bytes/s) per collective and size for each peer: polycast's engine
path (its best explicit algorithm: the engine's schedules over shm rings or TCP) and its
default ``auto`` (on one host the symm path), MPICH and gloo, the ratios engine/MPICH,
auto/MPICH and engine/gloo, then the latency of the smallest allreduce; ``--breakdown``
adds, per case, where the engine path's CPU time goes per call (bench/breakdown.py). The
same data goes to JSON (default bench/results/peers.json), with each polycast row's CPU
time per call (``cpu_us``).

Installing the peers on a fresh machine, with pip only (the ``peers`` extra):

    pip install "mpich>=4.1" "mpi4py>=4"   # no compiler needed: mpi4py 4 ships binary
                                           # wheels that load the libmpi the mpich wheel
                                           # installs; the wheel's mpiexec (hydra) lands
                                           # beside the python executable
    pip install torch==2.13.0              # here: a CPU build from the local index. Where
                                           # the default index serves the multi-GB CUDA
                                           # build, take it from PyTorch's CPU-only index

(mpi4py 3.x has no binary wheels: it builds from source and needs the mpich wheel's
``mpicc`` on PATH.) MPICH runs as ``mpiexec -n P python bench/peers_mpi_worker.py``; gloo as
``python bench/peers_gloo_worker.py``, which starts P ranks with torch.multiprocessing on
127.0.0.1 (GLOO_SOCKET_IFNAME=lo); polycast as ``polycast bench -n P COLLECTIVE ... --json``
once per collective and size, whose rows are parsed. A peer that is missing or fails shows
``n/a (reason)`` in its columns; the rest still prints and the exit status is 0. Every
launch is bounded by ``--timeout`` and its whole process group is killed when it runs out.

Measured as nccl-tests do (bench/peers_common.py has the details): float32 data, S = the
nccl-tests total size (allgather: per-rank count x P x 4 bytes), a size that does not split
evenly over the ranks is rounded up to the next one that does; time = the maximum over
ranks of each rank's mean over ``iters`` back-to-back calls after ``warmup`` calls, the same
``iters`` for every peer (``--iters``, or by size: 128 MiB / S clamped to 8..200, so that
8-byte latencies average over 200 calls and a 16 MiB case stays short); algbw = S / time;
busbw = algbw x ``Collective.busbw_factor(P)``. Every peer's output is checked against numpy
on every rank. polycast's rows are timed the same way by ``polycast bench`` itself.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import shlex
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import peers_common as pc  # noqa: E402
# The launches and the tables are modules of their own (bench/peers_launch.py,
# bench/peers_table.py); the tests reach their names here too.
from peers_launch import (PeerRun, find_mpiexec, run_bounded, run_gloo,  # noqa: E402,F401
                          run_mpich, with_bandwidth)
from peers_table import LABELS, breakdown, comparison, latency  # noqa: E402
from polycast.collectives import Collective, count_for_nbytes  # noqa: E402
from polycast.errors import InvalidArgument, PolycastError  # noqa: E402
from polycast.units import format_size, parse_size  # noqa: E402

PEERS = ("polycast", "mpich", "gloo")
DEFAULT_SIZES = "8B,64KiB,1MiB,16MiB"
TRANSPORTS = ("auto", "shm", "tcp")
DEFAULT_JSON = HERE / "results" / "peers.json"


# ---------------------------------------------------------------------------- the plan


ITERS_BYTES, MIN_ITERS, MAX_ITERS = 128 << 20, 8, 200


def iters_for(nbytes: int, iters: int = 0) -> int:
    """``iters`` when given (> 0), else by size: about 128 MiB moved per case, 8..200 calls."""
    return iters if iters > 0 else max(MIN_ITERS, min(MAX_ITERS, ITERS_BYTES // max(nbytes, 1)))


def plan_cases(collectives: list[str], sizes: list[int], nranks: int,
               iters: int = 0) -> list[pc.Case]:
    """One case per collective and size; a size that does not split into whole float32
    elements over ``nranks`` is rounded up to the next one that does (nccl-tests' S)."""
    itemsize = np.dtype(pc.DTYPE).itemsize
    cases = []
    for name in collectives:
        coll = Collective.parse(name)
        if coll.value not in pc.COLLECTIVES:
            raise InvalidArgument(f"bench/peers.py compares {', '.join(pc.COLLECTIVES)}; "
                                  f"got {name!r}")
        unit = coll.total_elements(nranks, 1) * itemsize
        for nbytes in sizes:
            nbytes = max(unit, -(-nbytes // unit) * unit)
            cases.append(pc.Case(coll.value, count_for_nbytes(coll, nranks, nbytes, itemsize),
                                 nbytes, iters_for(nbytes, iters)))
    return cases


# ---------------------------------------------------------------------------- polycast


def polycast_command() -> list[str]:
    exe = shutil.which("polycast")
    return [exe] if exe else [sys.executable, "-c",
                              "import sys; from polycast.cli.main import main; sys.exit(main())"]


def polycast_bench_help(timeout_seconds: float = 60.0) -> str | None:
    """``polycast bench --help`` text, or None when this polycast has no bench command."""
    done = run_bounded(polycast_command() + ["bench", "--help"], timeout_seconds)
    if done.timed_out or done.returncode != 0 or "--json" not in done.stdout:
        return None
    return done.stdout


def parse_json_rows(text: str) -> list[dict]:
    """The JSON list ``polycast bench --json`` prints (other lines around it ignored)."""
    try:
        rows = json.loads(text)
    except json.JSONDecodeError:
        start, end = text.find("["), text.rfind("]")
        if start < 0 or end < start:
            raise ValueError("no JSON list in polycast bench output") from None
        rows = json.loads(text[start:end + 1])
    if not isinstance(rows, list):
        raise ValueError("polycast bench --json printed no list")
    return rows


def best_rows(rows: list[dict], nranks: int) -> dict[tuple[str, int], dict]:
    """Per (collective, nbytes): the correct row with the highest busbw (recomputed from
    nbytes and time_us as for the other peers), else the best incorrect one. Rows of
    ``auto`` count only where no explicit algorithm ran: the best explicit one is the
    engine path's best (an explicit algorithm always runs the engine's schedule)."""
    best: dict[tuple[str, int], dict] = {}
    explicit = {(Collective.parse(r["collective"]).value, int(r["nbytes"])) for r in rows
                if r.get("requested", r.get("algorithm")) != "auto"}
    for raw in rows:
        if (raw.get("requested") == "auto"
                and (Collective.parse(raw["collective"]).value, int(raw["nbytes"])) in explicit):
            continue
        r = with_bandwidth({**raw, "collective": Collective.parse(raw["collective"]).value,
                            "nbytes": int(raw["nbytes"]), "peer": "polycast",
                            "correct": bool(raw.get("correct", False))}, nranks)
        key = (r["collective"], r["nbytes"])
        old = best.get(key)
        if old is None or (r["correct"], r["busbw"]) > (old["correct"], old["busbw"]):
            best[key] = r
    return best


def polycast_algorithms(collective: str, nranks: int, algo: str | None) -> list[str]:
    """``--algo`` as given, else the tuner's choice plus every algorithm this polycast
    supports for the collective at ``nranks`` (the table shows the best of them)."""
    names = [a.strip() for a in (algo or "").split(",") if a.strip()]
    if names:
        return names
    from polycast.algorithms import supported
    return ["auto", *supported(collective, nranks)]


_BENCH_ERROR = re.compile(r"^polycast bench: (\S+) at (\S+): (.*)$", re.M)


# polycast bench runs iters // 4 calls above 8 MiB (polycast/tools/bench_rank.py): ask
# for 4x there so that every peer makes the same number of calls; the rows say what ran.
BENCH_QUARTER_ABOVE_BYTES = 8 << 20


def bench_iters_arg(nbytes: int, iters: int) -> int:
    return iters * 4 if nbytes > BENCH_QUARTER_ABOVE_BYTES else iters


def run_polycast(cases, nranks, warmup, timeout_seconds, algo: str | None,
                 transport: str = "auto", nonblocking: bool = False) -> PeerRun:
    """``polycast bench --json`` with every algorithm: one launch per collective when the
    bench takes ``--sizes``, else one per case. The bench runs sizes in order and the
    algorithms in order within a size, and an algorithm that raises ends the launch: the
    (size, algorithm) pairs it did not reach are launched again, without the one that
    failed (at most one launch per pair)."""
    run = PeerRun("polycast")
    t0 = time.monotonic()
    helptext = polycast_bench_help()
    if helptext is None:
        run.unavailable = "polycast bench not available"
        return run
    opts = []
    if "--warmup" in helptext:
        opts += ["--warmup", str(warmup)]
    if "--timeout" in helptext:    # let it end its own ranks first
        opts += ["--timeout", f"{max(1.0, timeout_seconds - 10):g}"]
    if transport != "auto":
        opts += ["--transport", transport]
    if nonblocking and "--nonblocking" in helptext:
        opts += ["--nonblocking"]
    run.library = "polycast bench"
    by_collective: dict[str, list[pc.Case]] = {}
    for case in cases:
        by_collective.setdefault(case.collective, []).append(case)
    stop = False
    for coll, ccases in by_collective.items():
        algos = polycast_algorithms(coll, nranks, algo)
        sizes = [c.nbytes for c in ccases]
        iters = {c.nbytes: c.iters for c in ccases}
        if "--sizes" in helptext:    # one launch per iteration count
            same: dict[int, list[int]] = {}
            for n in sizes:
                same.setdefault(bench_iters_arg(n, iters[n]), []).append(n)
            queue = [(group, algos) for group in same.values()]
        else:
            queue = [([n], algos) for n in sizes]
        found: list[dict] = []
        for _ in range(len(sizes) * len(algos)):
            if not queue:
                break
            bsizes, balgos = queue.pop(0)
            size_opts = (["--sizes", ",".join(map(str, bsizes))] if len(bsizes) > 1 else
                         ["--min", str(bsizes[0]), "--max", str(bsizes[0])])
            if "--iters" in helptext:
                size_opts += ["--iters", str(bench_iters_arg(bsizes[0], iters[bsizes[0]]))]
            cmd = polycast_command() + ["bench", "-n", str(nranks), coll,
                                        "--algo", ",".join(balgos), *size_opts, *opts,
                                        "--json"]
            done = run_bounded(cmd, timeout_seconds)
            try:
                rows = parse_json_rows(done.stdout) if done.stdout.strip() else []
            except ValueError as exc:
                rows = []
                run.notes.append(f"{coll}: unreadable polycast bench output: {exc}")
            found += rows
            if not done.timed_out and done.returncode == 0:
                continue
            got = {(int(r["nbytes"]), r.get("requested", r.get("algorithm"))) for r in rows}
            pending = [(n, a) for n in bsizes for a in balgos if (n, a) not in got]
            if not pending:
                continue                     # exit 1 for a wrong result: the rows say it
            reason = done.why("polycast bench", timeout_seconds)
            if done.timed_out:
                run.notes.append(f"{coll}: {reason}; later polycast cases skipped")
                for n, _a in pending:
                    run.missing_by.setdefault((coll, n), reason)
                run.missing = "skipped after a polycast bench timeout"
                stop = True
                break
            named = [(a, err) for a, _size, err in _BENCH_ERROR.findall(done.stderr)]
            culprit = next((p for p in pending for a, _e in named if p[1] == a), pending[0])
            err = next((e for a, e in named if a == culprit[1]), reason)
            run.notes.append(f"{coll} {format_size(culprit[0])}: algorithm {culprit[1]} "
                             f"failed: {err[:200]}")
            run.missing_by.setdefault((coll, culprit[0]), f"{culprit[1]} failed: {err[:80]}")
            rest = [p for p in pending if p != culprit]
            for n in dict.fromkeys(p[0] for p in rest):
                queue.insert(0, ([n], [a for m, a in rest if m == n]))
        for case in ccases:
            key = (case.collective, case.nbytes)
            best = best_rows(found, nranks).get(key)
            if best is None:
                got = sorted({int(r["nbytes"]) for r in found})
                run.missing_by.setdefault(key, f"polycast bench gave no row for {case.nbytes} B"
                                          + (f" (got {got})" if got else ""))
                continue
            mine = [r for r in found if int(r["nbytes"]) == case.nbytes]
            ran = sorted({r.get("iters") for r in mine if r.get("iters") != case.iters},
                         key=str)
            if ran:
                run.notes.append(f"{coll} {format_size(case.nbytes)}: polycast bench ran "
                                 f"{ran} iterations, the others {case.iters}")
            auto = [r for r in mine if r.get("requested") == "auto"]
            if auto:
                a = with_bandwidth({**auto[0], "collective": coll, "nbytes": case.nbytes},
                                   nranks)
                best["auto"] = {"algorithm": a.get("algorithm"), "busbw": a["busbw"],
                                "time_us": a["time_us"], "correct": a.get("correct"),
                                "cpu_us": a.get("cpu_us")}
            best["all"] = [{k: r.get(k) for k in ("algorithm", "requested", "time_us",
                                                   "busbw", "correct", "transport", "iters",
                                                   "cpu_us")}
                           for r in mine]
            run.rows[key] = best
        if stop:
            break
    run.seconds = time.monotonic() - t0
    if not run.rows and run.missing_by:
        run.unavailable = next(iter(run.missing_by.values()))
    return run

# ---------------------------------------------------------------------------- main


def parse_args(argv):
    p = argparse.ArgumentParser(prog="bench/peers.py", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-n", "--nranks", type=int, default=4, help="local ranks (default 4)")
    p.add_argument("--collectives", default=",".join(pc.COLLECTIVES),
                   help="comma-separated, from: " + ", ".join(pc.COLLECTIVES))
    p.add_argument("--sizes", default=DEFAULT_SIZES,
                   help=f"comma-separated nccl-tests sizes S (default {DEFAULT_SIZES})")
    p.add_argument("--iters", type=int, default=0,
                   help="timed calls per case, the same for every peer; 0 (default): "
                        f"{ITERS_BYTES >> 20} MiB / size, clamped to {MIN_ITERS}..{MAX_ITERS}")
    p.add_argument("--warmup", type=int, default=5, help="untimed calls first (default 5)")
    p.add_argument("--peers", default=",".join(PEERS),
                   help="which to run, from: " + ", ".join(PEERS) + " (default all)")
    p.add_argument("--algo", default=None,
                   help="polycast algorithms, comma-separated (default: auto and every one "
                        "polycast supports for the collective; the table shows the best)")
    p.add_argument("--transport", default="auto", choices=TRANSPORTS,
                   help="between local ranks: polycast's POLYCAST_TRANSPORT, and for tcp "
                        "MPICH without its shared memory (UCX over TCP); gloo is always TCP")
    p.add_argument("--nonblocking", action="store_true",
                   help="time polycast's I-variants + Wait (Iallreduce(...).Wait()) instead "
                        "of the blocking calls the MPI and gloo peers make (the default)")
    p.add_argument("--breakdown", action="store_true",
                   help="also profile the engine path's best algorithm per case "
                        "(bench/breakdown.py: CPU per call by engine, driver, transport, "
                        "copies, waiting; needs py-spy)")
    p.add_argument("--timeout", type=float, default=120.0,
                   help="seconds each launch may take before it is killed (default 120)")
    p.add_argument("--json", default=str(DEFAULT_JSON), metavar="FILE",
                   help=f"where to write the results (default {DEFAULT_JSON.relative_to(HERE.parent)})")
    return p.parse_args(argv)


def _names(text: str, valid, what: str) -> list[str]:
    names = [s.strip() for s in text.split(",") if s.strip()]
    bad = [n for n in names if n not in valid]
    if bad or not names:
        raise InvalidArgument(f"unknown {what} {','.join(bad) or repr(text)}; "
                              f"valid choices: {', '.join(valid)}")
    return names


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        if args.nranks < 2:
            raise InvalidArgument(f"-n must be at least 2 ranks, got {args.nranks}")
        if args.iters < 0 or args.warmup < 0 or args.timeout <= 0:
            raise InvalidArgument("--iters and --warmup must be >= 0 and --timeout > 0")
        colls = [Collective.parse(c).value for c in
                 _names(args.collectives, [*pc.COLLECTIVES, "bcast"], "collective")]
        sizes = [parse_size(s.strip()) for s in args.sizes.split(",") if s.strip()]
        if not sizes:
            raise InvalidArgument("--sizes is empty; give e.g. 8B,64KiB,16MiB")
        wanted = _names(args.peers, PEERS, "peer")
        cases = plan_cases(colls, sizes, args.nranks, args.iters)
    except PolycastError as exc:
        print(f"bench/peers.py: error: {exc}", file=sys.stderr)
        return 2

    runs: dict[str, PeerRun] = {}
    load_before = list(os.getloadavg())
    with tempfile.TemporaryDirectory(prefix="peers-") as tmp:
        workdir = Path(tmp)
        for name in PEERS:
            if name not in wanted:
                runs[name] = PeerRun(name, unavailable="not selected")
                continue
            print(f"running {LABELS[name]} ...", file=sys.stderr, flush=True)
            if name == "polycast":
                runs[name] = run_polycast(cases, args.nranks, args.warmup, args.timeout,
                                          args.algo, args.transport, args.nonblocking)
            elif name == "mpich":
                runs[name] = run_mpich(cases, args.nranks, args.warmup, args.timeout,
                                       workdir, args.transport)
            else:
                runs[name] = run_gloo(cases, args.nranks, args.warmup, args.timeout,
                                      workdir)

    from polycast.cli.table import print_table
    columns, rows, records = comparison(cases, runs)
    print_table(f"busbw, {args.nranks} local ranks, float32 (GB/s = 1e9 B/s)", columns, rows,
                right=set(columns[2:3] + columns[4:]))
    print("engine: polycast's best explicit algorithm (the engine's schedules; --algo, "
          "default all it supports); auto: polycast's default (on one host the symm path, "
          "named auto(symm)); polycast times "
          + ("I-variants + Wait (--nonblocking)" if args.nonblocking else
             "the blocking calls (Allreduce, Bcast, ...), as the MPI and gloo peers do"))
    lat = latency(cases, runs)
    if lat:
        print_table(lat[0], lat[1], lat[2], right={"time us"})
    profile = breakdown(cases, runs, args) if args.breakdown else None
    for run in runs.values():
        for note in run.notes:
            print(f"note: {LABELS[run.name]}: {note}")
    if load_before[0] > 0.5:
        print(f"note: load average {load_before[0]:.2f} on {os.cpu_count()} cpus before the "
              "run: other work skews these numbers")

    result = {
        "command": "python bench/peers.py " + shlex.join(sys.argv[1:] if argv is None else argv),
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "nranks": args.nranks, "dtype": np.dtype(pc.DTYPE).name, "warmup": args.warmup,
        "iters": args.iters or f"by size: {ITERS_BYTES >> 20} MiB / S in "
                               f"{MIN_ITERS}..{MAX_ITERS}",
        "timing": "max over ranks of each rank's mean over iters back-to-back calls "
                  "after warmup (polycast: as polycast bench times it)",
        "polycast_calls": "nonblocking" if args.nonblocking else "blocking",
        "cpus": os.cpu_count(),
        # Other work on a small machine skews every peer (busy-polling MPI most): keep the
        # load next to the numbers.
        "loadavg_before": load_before, "loadavg_after": list(os.getloadavg()),
        "peers": {name: {"status": "ok" if run.rows else f"n/a: {run.reason()}",
                         "library": run.library, "seconds": round(run.seconds, 2),
                         "notes": run.notes, "rows": list(run.rows.values())}
                  for name, run in runs.items()},
        "transport": args.transport,
        "busbw": records,
        "latency": lat[3] if lat else None,
        "breakdown": profile,
    }
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
