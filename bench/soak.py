"""Soak: many mixed collectives (random collective, algorithm, size, root, op, dtype; up to
8 outstanding at once) on real ranks under ``polycast run`` with faults injected in the UDP
receive path, every result exact (issue 14 item 6; bench/soak_rank.py is the rank script).

    python bench/soak.py                         # 10,000 calls, 4 ranks, loss injected
    python bench/soak.py --calls 500 --ranks 2   # quick

Measures: collectives per second, resident memory and open file descriptors after a warm-up
(every collective x algorithm once), half-way and at the end, faults injected and survived, forged and
replayed (stale / foreign) packets dropped. Prints a table and writes bench/results/soak.json.
The peer in the same run is the same soak without faults (``--compare-clean``), so the cost of
recovery is a ratio, not an absolute time on a shared machine.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
DEFAULT_FAULTS = "loss=0.05,dup=0.02,reorder=0.05,replay=0.02,seed=11"


def run_soak(ranks: int, calls: int, outstanding: int, max_count: int, seed: int,
             faults: str, timeout_s: float, path: str = "numpy", sample_every: int = 0,
             trace: bool = False, series_dir: str | None = None) -> dict:
    env = dict(os.environ, PYTHONPATH=os.environ.get("PYTHONPATH", REPO),
               **({"SOAK_SERIES_DIR": series_dir} if series_dir else {}),
               POLYCAST_FAULTS=faults, POLYCAST_TIMEOUT=os.environ.get("POLYCAST_TIMEOUT",
                                                                       "60"))
    cmd = [sys.executable, "-m", "polycast.cli.main", "run", "-n", str(ranks), "--timeout",
           str(int(timeout_s)), os.path.join(HERE, "soak_rank.py"), "--calls", str(calls),
           "--outstanding", str(outstanding), "--max-count", str(max_count),
           "--seed", str(seed), "--path", path, "--sample-every", str(sample_every)]
    if trace:
        cmd.append("--tracemalloc")
    t0 = time.monotonic()
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s + 30,
                         env=env, cwd=REPO)
    wall = time.monotonic() - t0
    reports = [json.loads(ln.split("SOAK ", 1)[1]) for ln in res.stdout.splitlines()
               if "SOAK " in ln]
    reports.sort(key=lambda x: x["rank"])
    out = {"ranks": ranks, "calls": calls, "faults": faults, "path": path,
           "returncode": res.returncode,
           "wall_s": round(wall, 2), "per_rank": reports}
    if res.returncode != 0 or len(reports) != ranks:
        out["error"] = (res.stdout[-2000:] + res.stderr[-2000:]).strip()
        return out
    inj = {}
    drops = {}
    for x in reports:
        for k, v in (x["faults"] or {}).items():
            inj[k] = inj.get(k, 0) + v
        for k, v in x["drops"].items():
            drops[k] = drops.get(k, 0) + v
    out.update(
        failed=sum(x["nfailed"] for x in reports),
        calls_per_s=min(x["calls_per_s"] for x in reports),
        rss_start_mib=max(x["rss_start"] for x in reports) / 2**20,
        rss_end_mib=max(x["rss_end"] for x in reports) / 2**20,
        rss_growth_mib=max(x["rss_end"] - x["rss_start"] for x in reports) / 2**20,
        rss_growth_second_half_mib=max(x["rss_end"] - x["rss_mid"] for x in reports) / 2**20,
        fds_start=max(x["fds_start"] for x in reports),
        fds_end=max(x["fds_end"] for x in reports),
        fds_growth=max(x["fds_end"] - x["fds_start"] for x in reports),
        fds_growth_second_half=max(x["fds_end"] - x["fds_mid"] for x in reports),
        injected=inj, drops=drops,
        recovered_bytes=sum(x["recovered_bytes"] for x in reports),
        mcast=all(x["mcast"] for x in reports))
    # resident memory after the warm-up, per rank: (calls, MiB, seconds, malloc's view)
    out["rss_series"] = {x["rank"]: [(c, b / 2**20, t, {k: v / 2**20 for k, v in m.items()})
                                     for c, b, t, m in x.get("samples", [])]
                         for x in reports}
    out["python_growth"] = {x["rank"]: x.get("grew") for x in reports if x.get("grew")}
    return out


def _series_run(directory: str) -> dict:
    """A run's resident-memory series as written by its ranks (``--series-dir``)."""
    series, path = {}, "numpy"
    for name in sorted(os.listdir(directory)):
        if not name.endswith(".jsonl"):
            continue
        path, _, rank = name[:-len(".jsonl")].rpartition("-rank-")
        with open(os.path.join(directory, name)) as f:
            rows = [json.loads(line) for line in f if line.strip()]
        series[int(rank)] = [(c, b / 2**20, t, {k: v / 2**20 for k, v in m.items()})
                             for c, b, t, m in rows]
    return {"path": path, "ranks": len(series), "faults": "", "rss_series": series}


def plot_rss(runs: list, path: str, load) -> None:
    """Resident memory of every rank over the calls, one panel per path."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    shown = [x for x in runs if x.get("rss_series")]
    if not shown:
        return
    fig, axes = plt.subplots(1, len(shown), figsize=(5.5 * len(shown), 3.6), squeeze=False)
    for ax, x in zip(axes[0], shown):
        for rank, series in sorted(x["rss_series"].items(), key=lambda kv: int(kv[0])):
            ax.plot([c / 1000 for c, *_ in series], [m for _, m, *_ in series],
                    label=f"rank {rank}")
        ax.set_title(f"{x['path']} path, {x['ranks']} ranks"
                     f"{', faults' if x['faults'] else ''}")
        ax.set_xlabel("calls (thousands)")
        ax.set_ylabel("resident MiB")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle("bench/soak.py: resident memory after warm-up"
                 + (f" (load {load[0]:.1f} at the start)" if load else ""), fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"wrote {path}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=10_000)
    ap.add_argument("--ranks", default="4", help="comma list, e.g. 2,4")
    ap.add_argument("--outstanding", type=int, default=8)
    ap.add_argument("--max-count", type=int, default=65_536)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--faults", default=DEFAULT_FAULTS, help="POLYCAST_FAULTS spec")
    ap.add_argument("--compare-clean", action="store_true",
                    help="also run without faults (the peer for the rate ratio)")
    ap.add_argument("--timeout", type=float, default=1800.0, help="per run, seconds")
    ap.add_argument("--path", default="numpy",
                    help="comma list: numpy (Comm's methods), torch (torch.distributed on "
                         "polycast groups)")
    ap.add_argument("--sample-every", type=int, default=0,
                    help="record each rank's resident memory every N calls")
    ap.add_argument("--tracemalloc", action="store_true",
                    help="trace Python allocations; report what grew in the second half")
    ap.add_argument("--plot", help="draw resident memory over the run (needs matplotlib)")
    ap.add_argument("--series-dir", help="each rank appends its samples here as it goes "
                                         "(JSON lines; kept if the run is cut short)")
    ap.add_argument("--out", default=os.path.join(HERE, "results", "soak.json"))
    ap.add_argument("--from-series", metavar="DIR", action="append", default=[],
                    help="only draw --plot from the samples ranks wrote to DIR (--series-dir "
                         "of an earlier run, finished or cut short); repeatable")
    args = ap.parse_args(argv)
    if args.from_series:
        if not args.plot:
            ap.error("--from-series draws a figure: give --plot FILE")
        plot_rss([_series_run(d) for d in args.from_series], args.plot, None)
        return 0
    try:
        ranks = [int(x) for x in args.ranks.split(",")]
    except ValueError:
        ap.error(f"--ranks {args.ranks!r}: expected a comma list of integers")
    if args.calls < 1 or args.outstanding < 1 or args.max_count < 1 or min(ranks) < 2:
        ap.error("--calls, --outstanding and --max-count must be >= 1, --ranks >= 2")
    load = os.getloadavg()
    runs = []
    paths = [x for x in args.path.split(",") if x]
    if not paths or any(x not in ("numpy", "torch") for x in paths):
        ap.error(f"--path {args.path!r}: numpy, torch or numpy,torch")
    for path in paths:
        for P in ranks:
            for faults in ([args.faults, ""] if args.compare_clean else [args.faults]):
                runs.append(run_soak(P, args.calls, args.outstanding, args.max_count,
                                     args.seed, faults, args.timeout, path,
                                     args.sample_every, args.tracemalloc, args.series_dir))
    print(f"{'path':>6s} {'ranks':>5s} {'faults':>7s} {'calls':>6s} {'failed':>6s} {'calls/s':>8s} "
          f"{'rss MiB start->end':>19s} {'fds':>8s} {'injected':>9s} {'dropped':>8s} "
          f"{'recovered':>10s}")
    for x in runs:
        if "error" in x:
            print(f"{x['path']:>6s} {x['ranks']:5d} {'yes' if x['faults'] else 'no':>7s} "
                  f"{x['calls']:6d}  ERROR (status {x['returncode']}): {x['error'][-600:]}")
            continue
        inj = sum(v for k, v in x["injected"].items() if k != "read")
        print(f"{x['path']:>6s} {x['ranks']:5d} {'yes' if x['faults'] else 'no':>7s} "
              f"{x['calls']:6d} {x['failed']:6d} {x['calls_per_s']:8.1f} "
              f"{x['rss_start_mib']:8.1f} -> {x['rss_end_mib']:6.1f} "
              f"{x['fds_start']:3d}->{x['fds_end']:<3d} {inj:9d} "
              f"{sum(x['drops'].values()):8d} {x['recovered_bytes']:10d}")
    for x in runs:
        if "error" not in x and x["faults"]:
            print(f"  P={x['ranks']} injected {x['injected']}; drops {x['drops']}")
    for x in runs:
        for rank, grew in x.get("python_growth", {}).items():
            top = ", ".join(f"{g['bytes'] / 1024:+.0f} KiB at {g['where'][-1]}" for g in grew[:3])
            print(f"  {x['path']} P={x['ranks']} rank {rank} Python growth, second half: {top}")
    if args.plot:
        plot_rss(runs, args.plot, load)           # the load when the runs started
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump({"bench": "soak", "args": vars(args), "load_before": load,
                   "load_after": os.getloadavg(), "python": platform.python_version(),
                   "runs": runs}, f, indent=1)
    print(f"wrote {args.out}; load {load[0]:.1f} -> {os.getloadavg()[0]:.1f}")
    ok = all("error" not in x and x["failed"] == 0 and x["fds_growth"] == 0 for x in runs)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
