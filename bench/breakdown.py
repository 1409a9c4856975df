"""Where a collective's time goes, per call and rank: engine, driver, transport, copies,
waiting — from a py-spy profile of ``polycast bench`` (on-CPU samples of every rank and
thread) scaled by the CPU time the bench measures per call.

    python bench/breakdown.py [--cases NAME,...] [--iters N] [--rate HZ] [--json FILE]
    python bench/breakdown.py --list

Each case runs ``polycast bench`` (POLYCAST_SYMM=0: the engine path) under
``py-spy record --subprocesses``. Per call and rank it reports the wall time, the CPU time
(``process_time`` of each rank, every thread, averaged over ranks) and that CPU time split
by where the samples were (innermost polycast frame):

=========== =======================================================================
engine      polycast/engine: the sans-I/O state machine
driver      runtime/driver: turning actions into I/O and I/O into events, rounds
shm ring    runtime/transport/shm.py: writing frames into / reading them from the rings
tcp         runtime/transport/tcp.py (socket send/recv included)
multicast   UDP multicast send/receive (runtime/driver/datagrams.py, runtime/transport/mcast.py)
copies      polycast/memory.py: Deliver/Copy/gather (numpy copies and reductions), and
            runtime/transport/cma.py: single-copy reads of a peer's memory (process_vm_readv)
api         comm/, schedules, bench_rank: building and posting the call
waiting     spinning, yielding and select while nothing has arrived
threads     lock and condition hand-offs between the user and progress threads
other       everything else (numpy outside polycast frames, the interpreter)
=========== =======================================================================

``cores busy`` = ranks x CPU per call / wall per call: how many of the machine's cores the
call kept busy on average (2 on this machine means CPU-bound; less means time lost to
wake-ups and scheduling). py-spy must be installed (``pip install py-spy``); it samples
at ``--rate`` Hz, so a case needs a few thousand samples for shares to within ~2 %.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
CATEGORIES = ("engine", "driver", "shm ring", "tcp", "multicast", "copies", "api",
              "waiting", "threads", "other")


@dataclass
class Case:
    name: str
    collective: str
    size: str
    algo: str
    nranks: int
    transport: str = "auto"
    iters: int = 200
    env: dict = field(default_factory=lambda: {"POLYCAST_SYMM": "0"})


CASES = [
    Case("allreduce-8B-4", "allreduce", "8B", "recdoubling", 4, iters=3000),
    Case("allreduce-8B-2", "allreduce", "8B", "recdoubling", 2, iters=3000),
    Case("allgather-64KiB-4", "allgather", "64KiB", "ring", 4, iters=2000),
    Case("allreduce-64KiB-4", "allreduce", "64KiB", "ring", 4, iters=1000),
    Case("bcast-64KiB-4", "broadcast", "64KiB", "binomial", 4, iters=2000),
    Case("allgather-16MiB-4", "allgather", "16MiB", "ring", 4, iters=60),
    Case("allgather-16MiB-2", "allgather", "16MiB", "ring", 2, iters=60),
    Case("allreduce-16MiB-4", "allreduce", "16MiB", "ring", 4, iters=40),
    Case("bcast-16MiB-4", "broadcast", "16MiB", "chain", 4, iters=60),
    Case("allgather-16MiB-2-tcp", "allgather", "16MiB", "ring", 2, "tcp", iters=60),
    Case("allgather-16MiB-4-tcp", "allgather", "16MiB", "ring", 4, "tcp", iters=40),
    Case("mcast-allgather-16MiB-4", "allgather", "16MiB", "mcast", 4, iters=40),
]

# (substring of the frame's file, category), tried from the innermost frame outwards.
_FILE_RULES = (
    ("polycast/memory.py", "copies"),
    ("polycast/runtime/transport/cma.py", "copies"),         # single-copy reads (process_vm_readv)
    ("polycast/runtime/transport/shm.py", "shm ring"),
    ("polycast/runtime/transport/tcp.py", "tcp"),
    ("polycast/runtime/driver/datagrams.py", "multicast"),
    ("polycast/runtime/transport/mcast.py", "multicast"),
    ("polycast/runtime/driver/", "driver"),
    ("polycast/runtime/symm/", "driver"),
    ("polycast/engine/", "engine"),
    ("polycast/comm/", "api"), ("polycast/schedule/", "api"),
    ("polycast/algorithms/", "api"), ("polycast/collectives.py", "api"),
    ("polycast/tools/bench_rank.py", "api"),
)
_WAIT_FUNCS = ("Progress._spin ", "Progress._block ", "EpochBarrier.wait_for ",
               "JobQueue.drive ")
_THREAD_FILES = ("threading.py",)


def classify(frames: list[str]) -> str:
    """The category of one sample, its frames outermost first (py-spy's raw format)."""
    for fr in reversed(frames):
        if fr.startswith(_WAIT_FUNCS):
            return "waiting"
        for part, cat in _FILE_RULES:
            if part in fr:
                return cat
        if any(f"({t}:" in fr or f"/{t}:" in fr for t in _THREAD_FILES):
            return "threads"
    return "other"


_BLOCKED_LEAVES = ("Condition.wait ", "Event.wait ")


def blocked(frames: list[str]) -> bool:
    """A sample of a thread asleep (py-spy's idle detection misses these under load):
    parked on a condition, or sleeping in the select of ``Progress._block``. Measured per
    thread from /proc: the parked progress thread of an 8-byte allreduce uses ~1 % of a
    core while py-spy reported it on-CPU in 40 % of its samples."""
    leaf = frames[-1]
    if leaf.startswith(_BLOCKED_LEAVES):
        return True
    return (leaf.startswith("EpollSelector.select ") and len(frames) > 1
            and frames[-2].startswith("Progress._block "))


def in_timed_part(frames: list[str]) -> bool:
    """Samples of the bench's timed loop, the progress thread and the symm worker (the
    start-up and the result check are left out)."""
    timed = False
    for fr in frames:
        if "importlib._bootstrap" in fr:
            return False            # a module imported by the first (warm-up) call
        if fr.startswith(("measure (", "Progress._main ", "JobQueue._work ")):
            timed = True
    return timed


def parse_raw(path: str) -> collections.Counter:
    counts: collections.Counter = collections.Counter()
    with open(path) as fh:
        for line in fh:
            stack, _, n = line.rstrip("\n").rpartition(" ")
            if not stack or "bench_rank" not in stack:
                continue
            frames = stack.split(";")
            if not in_timed_part(frames) or blocked(frames):
                continue
            counts[classify(frames)] += int(n)
    return counts


def run_case(case: Case, rate: int, iters: int | None, timeout: float) -> dict:
    pyspy = shutil.which("py-spy")
    if pyspy is None:
        raise SystemExit("bench/breakdown.py: py-spy is not installed (pip install py-spy)")
    polycast = [sys.executable, "-m", "polycast.cli.main"]
    with tempfile.TemporaryDirectory(prefix="breakdown-") as tmp:
        raw = os.path.join(tmp, "profile.txt")
        cmd = [pyspy, "record", "--subprocesses", "--format", "raw", "--rate", str(rate),
               "--nonblocking", "-o", raw, "--", *polycast, "bench", "-n", str(case.nranks),
               case.collective, "--algo", case.algo, "--sizes", case.size, "--iters",
               str(iters or case.iters), "--transport", case.transport, "--no-check",
               "--json"]
        env = {**os.environ, **case.env}
        env["PYTHONPATH"] = REPO + os.pathsep + env.get("PYTHONPATH", "")
        done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout,
                              cwd=REPO)
        text = done.stdout
        start, end = text.find("["), text.rfind("]")
        if done.returncode != 0 or start < 0:
            raise RuntimeError(f"{case.name}: polycast bench failed: "
                               f"{(done.stderr or text)[-800:]}")
        row = json.loads(text[start:end + 1])[0]
        counts = parse_raw(raw) if os.path.exists(raw) else collections.Counter()
    total = sum(counts.values())
    cpu = row.get("cpu_us", 0.0)
    split = {c: (cpu * counts[c] / total if total else 0.0) for c in CATEGORIES}
    return {"case": case.name, "collective": case.collective, "nbytes": row["nbytes"],
            "algorithm": row["algorithm"], "nranks": case.nranks,
            "transport": row.get("transport", case.transport), "time_us": row["time_us"],
            "busbw": row["busbw"], "cpu_us": cpu,
            "cores_busy": case.nranks * cpu / row["time_us"] if row["time_us"] else 0.0,
            "samples": total, "cpu_us_by": split}


def print_rows(rows: list[dict]) -> None:
    short = {"engine": "engine", "driver": "driver", "shm ring": "shm", "tcp": "tcp",
             "multicast": "mcast", "copies": "copies", "api": "api", "waiting": "wait",
             "threads": "thrd", "other": "other"}
    head = (f"{'case':<26}{'wall us':>9}{'busbw':>7}{'cpu us':>9}{'cores':>6} "
            + "".join(f"{short[c]:>8}" for c in CATEGORIES))
    print("per call and rank: wall time, CPU time and where the CPU time went (us)")
    print(head)
    for r in rows:
        print(f"{r['case']:<26}{r['time_us']:>9.1f}{r['busbw']:>7.2f}{r['cpu_us']:>9.1f}"
              f"{r['cores_busy']:>6.2f} "
              + "".join(f"{r['cpu_us_by'][c]:>8.1f}" for c in CATEGORIES))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cases", default="", help="comma-separated case names (default all)")
    p.add_argument("--list", action="store_true", help="list the cases and exit")
    p.add_argument("--iters", type=int, default=None, help="override every case's iters")
    p.add_argument("--rate", type=int, default=250, help="py-spy samples per second")
    p.add_argument("--timeout", type=float, default=300.0)
    p.add_argument("--json", default=os.path.join(HERE, "results", "breakdown.json"))
    args = p.parse_args(argv)
    by_name = {c.name: c for c in CASES}
    if args.list:
        for c in CASES:
            print(f"{c.name:<26}{c.collective} {c.size} {c.algo} -n {c.nranks} "
                  f"--transport {c.transport}")
        return 0
    names = [n for n in args.cases.split(",") if n] or list(by_name)
    bad = [n for n in names if n not in by_name]
    if bad:
        print(f"bench/breakdown.py: unknown case {','.join(bad)}; valid: "
              f"{', '.join(by_name)}", file=sys.stderr)
        return 2
    rows = []
    for n in names:
        rows.append(run_case(by_name[n], args.rate, args.iters, args.timeout))
        print(f"  {n}: done", file=sys.stderr, flush=True)
    print_rows(rows)
    load = os.getloadavg()
    print(f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} on {os.cpu_count()} cpus")
    os.makedirs(os.path.dirname(args.json), exist_ok=True)
    with open(args.json, "w") as fh:
        json.dump({"load_average": load, "rows": rows}, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
