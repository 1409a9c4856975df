"""Small-message latency on this host (issue 5): 8-byte allreduce on 2 and 4 local ranks
over shared memory and TCP, plus 16 MiB allgather busbw to show large messages did not pay
for it.

Runs ``polycast bench`` per case (nccl-tests timing: the slowest rank's average over
``--iters`` back-to-back calls) and prints a table; writes the rows to
bench/results/latency.json (or --out). ``--repo DIR`` measures another checkout (a
``git worktree`` of an older commit) for before/after numbers. Usage::

    python bench/latency.py [--ranks 2,4] [--transports shm,tcp] [--iters 1000] [--repo DIR]

Target: 8-byte allreduce under 100 us on 4 local ranks. On a 2-core machine 4 ranks are
CPU-bound: every rank spends ~75 us of CPU per 8-byte allreduce with 2 ranks, ~150 us with
4 (two rounds of recursive doubling), so 4 ranks need ~300 us of the 2 cores per call.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)


def bench(repo: str, nranks: int, coll: str, algos: str, size: str, iters: int, warmup: int,
          transport: str, timeout: float) -> list[dict]:
    cmd = [sys.executable, "-m", "polycast.cli.main", "bench", "-n", str(nranks), coll,
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
    args = p.parse_args(argv)
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
