"""Small-message latency on this host (issue 5, issue 9): 8-byte allreduce (and with
``--collectives``, broadcast and allgather) on 2 and 4 local ranks over shared memory and TCP,
on the engine path (POLYCAST_SYMM=0, explicit algorithms), plus 16 MiB allgather busbw to
show large messages did not pay for it.

Runs ``polycast bench`` per case (nccl-tests timing: the slowest rank's average over
``--iters`` back-to-back calls) and prints a table; writes the rows to
bench/results/latency.json (or --out). ``--repo DIR`` measures another checkout (a
``git worktree`` of an older commit). ``--before DIR`` measures DIR and this checkout in
alternation, ``--reps`` times each (the order flips every rep), and prints the medians and
their ratio: a before/after comparison taken in the same minutes, which is the only kind
that holds on a shared, loaded machine. Usage::

    python bench/latency.py [--ranks 2,4] [--transports shm,tcp] [--iters 1000] [--repo DIR]
    python bench/latency.py --before /path/to/old/checkout --collectives allreduce,broadcast,allgather \
        --reps 3 --no-large

Target: 8-byte allreduce under 100 us on 4 local ranks. On a 2-core machine 4 ranks are
CPU-bound: the Python work of a call (API, engine, driver, rings) is paid once per message
on every rank, and 4 ranks share 2 cores.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)


REALTIME = []        # --realtime: the command prefix that runs a case at real-time priority


def bench(repo: str, nranks: int, coll: str, algos: str, size: str, iters: int, warmup: int,
          transport: str, timeout: float) -> list[dict]:
    cmd = [*REALTIME, sys.executable, "-m", "polycast.cli.main", "bench", "-n", str(nranks), coll,
           "--algo", algos, "--sizes", size, "--iters", str(iters), "--warmup", str(warmup),
           "--transport", transport, "--json"]
    env = dict(os.environ, PYTHONPATH=repo + os.pathsep + os.environ.get("PYTHONPATH", ""))
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env,
                         cwd=repo)
    if res.returncode != 0:
        print(f"  {coll} {algos} {size} n={nranks} {transport}: polycast bench failed "
              f"({res.returncode}):\n{res.stderr[-2000:]}", file=sys.stderr)
    try:
        return json.loads(res.stdout)
    except json.JSONDecodeError:
        return []


# Per collective: the engine algorithm measured, and the size S (nccl-tests: allgather's S
# is the gathered buffer, 8 bytes per rank here).
ALGOS = {"allreduce": "recdoubling", "broadcast": "binomial", "allgather": "recdoubling"}


def size_of(coll: str, nranks: int) -> str:
    return f"{8 * nranks}B" if coll == "allgather" else "8B"


def compare(args) -> int:
    """--before: alternate the two checkouts case by case; medians and ratios."""
    import statistics
    trees = [("before", os.path.abspath(args.before)), ("after", os.path.abspath(args.repo))]
    colls = args.collectives.split(",")
    times: dict = {}
    loads = []
    for rep in range(args.reps):
        order = trees if rep % 2 == 0 else trees[::-1]
        for transport in args.transports.split(","):
            for n in (int(x) for x in args.ranks.split(",")):
                for coll in colls:
                    algo = args.algo if coll == "allreduce" and args.algo else ALGOS[coll]
                    for label, repo in order:
                        loads.append(os.getloadavg()[0])
                        rows = bench(repo, n, coll, algo, size_of(coll, n), args.iters,
                                     args.warmup, transport, args.timeout)
                        if rows:
                            times.setdefault((transport, n, coll, algo, label), []).append(
                                rows[0]["time_us"])
    print(f"8-byte engine-path latency, before = {trees[0][1]}, after = {trees[1][1]}"
          f"{' (ranks at real-time priority)' if REALTIME else ''}; "
          f"{args.reps} alternating runs each, medians; load average during: min "
          f"{min(loads):.1f}, median {statistics.median(loads):.1f}, max {max(loads):.1f}")
    print("| transport | ranks | collective (algo) | before us | after us | after/before |")
    print("|---|---|---|---|---|---|")
    out = []
    for (transport, n, coll, algo, label), ts in sorted(times.items()):
        if label != "before" or (transport, n, coll, algo, "after") not in times:
            continue
        a = statistics.median(ts)
        b = statistics.median(times[(transport, n, coll, algo, "after")])
        print(f"| {transport} | {n} | {coll} ({algo}) | {a:.1f} | {b:.1f} | {b / a:.2f} |")
        out.append(dict(transport=transport, nranks=n, collective=coll, algorithm=algo,
                        before_us=ts, after_us=times[(transport, n, coll, algo, "after")],
                        ratio=b / a))
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as fh:
        json.dump({"before": trees[0][1], "after": trees[1][1], "loads": loads, "rows": out},
                  fh, indent=1)
    print(f"wrote {args.out}")
    return 0 if out else 1


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ranks", default="2,4", help="comma-separated rank counts")
    p.add_argument("--transports", default="shm,tcp")
    p.add_argument("--algo", default="recdoubling", help="8-byte allreduce algorithm(s)")
    p.add_argument("--iters", type=int, default=1000)
    p.add_argument("--warmup", type=int, default=100)
    p.add_argument("--no-large", action="store_true", help="skip the 16 MiB allgather rows")
    p.add_argument("--repo", default=REPO, help="checkout to measure (default: this one)")
    p.add_argument("--out", default=os.path.join(HERE, "results", "latency.json"))
    p.add_argument("--timeout", type=float, default=600.0, help="per case, seconds")
    p.add_argument("--before", default=None, metavar="DIR",
                   help="compare with this checkout, alternating (see the module doc)")
    p.add_argument("--collectives", default="allreduce",
                   help="with --before: comma-separated, from " + ", ".join(ALGOS))
    p.add_argument("--reps", type=int, default=3, help="with --before: runs per case and tree")
    p.add_argument("--realtime", action="store_true",
                   help="run every case at real-time round-robin priority 1 (chrt -r 1; root): "
                        "the machine's other load cannot run while the ranks are runnable, "
                        "so a loaded shared machine measures like a quiet one (each case is "
                        "short; Linux keeps 5%% of every second for other tasks)")
    args = p.parse_args(argv)
    if args.realtime:
        chrt = shutil.which("chrt")
        if chrt is None:
            p.error("--realtime needs chrt (util-linux)")
        REALTIME[:] = [chrt, "-r", "1"]
    if args.before:
        return compare(args)
    repo = os.path.abspath(args.repo)
    rows = []
    t0 = time.time()
    for transport in args.transports.split(","):
        for n in (int(x) for x in args.ranks.split(",")):
            for r in bench(repo, n, "allreduce", args.algo, "8B", args.iters, args.warmup,
                           transport, args.timeout):
                rows.append(dict(r, case="8 B allreduce", nranks=n, transport=transport))
            if not args.no_large and n == max(int(x) for x in args.ranks.split(",")):
                for r in bench(repo, n, "allgather", "ring", "16MiB", 10, 2, transport,
                               args.timeout):
                    rows.append(dict(r, case="16 MiB allgather", nranks=n,
                                     transport=transport))
    print(f"polycast latency, {repo}, {os.cpu_count()} cores "
          f"(load average {os.getloadavg()[0]:.1f} at the end)")
    head = (f"{'case':18} {'ranks':>5} {'transport':9} {'algorithm':12} {'time (us)':>10} "
            f"{'busbw GB/s':>11} {'correct':>8}")
    print(head)
    print("-" * len(head))
    for r in rows:
        print(f"{r['case']:18} {r['nranks']:5d} {r['transport']:9} {r['algorithm']:12} "
              f"{r['time_us']:10.1f} {r['busbw']:11.3f} {str(r['correct']):>8}")
    four = [r for r in rows if r["case"].startswith("8 B") and r["nranks"] == 4]
    if four:
        best = min(four, key=lambda r: r["time_us"])
        print(f"8-byte allreduce on 4 ranks: best {best['time_us']:.1f} us "
              f"({best['algorithm']}, {best['transport']}); target < 100 us: "
              f"{'met' if best['time_us'] < 100 else 'NOT met'}")
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as fh:
        json.dump({"repo": repo, "seconds": round(time.time() - t0, 1), "rows": rows}, fh,
                  indent=1)
    print(f"wrote {args.out}")
    return 0 if rows and all(r["correct"] is not False for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
