"""polycast beside its peers: the same collectives and sizes with polycast, MPICH (mpi4py)
and torch.distributed's gloo, in one invocation, on local ranks.

    python bench/peers.py [-n 4] [--collectives allgather,allreduce,broadcast]
                          [--sizes 8B,64KiB,16MiB] [--iters N] [--warmup N] [--json FILE]

prints busbw (GB/s, 1e9 bytes/s) per collective and size for each peer, polycast's best
algorithm and the ratios polycast/MPICH and polycast/gloo, then the latency of the smallest
allreduce, and writes the same data as JSON (default bench/results/peers.json).

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
ranks of each rank's mean over ``iters`` back-to-back calls after ``warmup`` calls (``iters``
auto-sized to about 0.25 s per case unless given); algbw = S / time; busbw = algbw x
``Collective.busbw_factor(P)``. Every peer's output is checked against numpy on every rank.
polycast's rows are timed by ``polycast bench`` itself.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import peers_common as pc  # noqa: E402
from polycast.collectives import Collective, count_for_nbytes  # noqa: E402
from polycast.errors import InvalidArgument, PolycastError  # noqa: E402
from polycast.units import format_size, parse_size  # noqa: E402

PEERS = ("polycast", "mpich", "gloo")
LABELS = {"polycast": "polycast", "mpich": "MPICH", "gloo": "gloo"}
DEFAULT_SIZES = "8B,64KiB,16MiB"
DEFAULT_JSON = HERE / "results" / "peers.json"
KILL_GRACE_SECONDS = 3.0


@dataclass
class Finished:
    """How one bounded subprocess ended."""
    returncode: int | None   # None when it was killed on timeout
    stdout: str
    stderr: str
    seconds: float
    timed_out: bool

    def why(self, what: str, timeout_seconds: float) -> str:
        if self.timed_out:
            return f"{what} timed out after {timeout_seconds:g}s"
        tail = ([ln for ln in self.stderr.splitlines() if ln.strip()]
                or [ln for ln in self.stdout.splitlines() if ln.strip()])
        last = tail[-1].strip()[:200] if tail else "no output"
        return f"{what} failed (exit {self.returncode}): {last}"


@dataclass
class PeerRun:
    """One peer's outcome: ``rows`` by (collective, nbytes); ``unavailable`` is the reason
    the peer did not run at all, ``missing`` the reason shown for cases it did not finish
    (``missing_by`` per case where known)."""
    name: str
    rows: dict[tuple[str, int], dict] = field(default_factory=dict)
    unavailable: str = ""
    missing: str = ""
    missing_by: dict[tuple[str, int], str] = field(default_factory=dict)
    library: str = ""
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)

    def reason(self, key: tuple[str, int] | None = None) -> str:
        return (self.unavailable or self.missing_by.get(key) or self.missing
                or "no result")


def run_bounded(cmd: list[str], timeout_seconds: float, env: dict | None = None) -> Finished:
    """Run ``cmd`` in its own process group; on timeout kill that group (by the child's
    pid), first with SIGTERM, then SIGKILL."""
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env, start_new_session=True, cwd=str(HERE.parent))
    try:
        out, err = proc.communicate(timeout=timeout_seconds)
        return Finished(proc.returncode, out, err, time.monotonic() - t0, False)
    except subprocess.TimeoutExpired:
        out, err = _kill_group(proc)
        return Finished(None, out, err, time.monotonic() - t0, True)
    except BaseException:
        _kill_group(proc)
        raise


def _kill_group(proc: subprocess.Popen) -> tuple[str, str]:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            out, err = proc.communicate(timeout=KILL_GRACE_SECONDS)
            return out or "", err or ""
        except subprocess.TimeoutExpired:
            continue
    try:
        out, err = proc.communicate(timeout=KILL_GRACE_SECONDS)
    except subprocess.TimeoutExpired:
        out, err = "", ""
    return out or "", err or ""


# ---------------------------------------------------------------------------- the plan


def plan_cases(collectives: list[str], sizes: list[int], nranks: int) -> list[pc.Case]:
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
                                 nbytes))
    return cases


def with_bandwidth(row: dict, nranks: int) -> dict:
    """``row`` plus algbw and busbw (GB/s) from its nbytes and time_us."""
    t = float(row["time_us"])
    algbw = row["nbytes"] / (t * 1e3) if t > 0 else 0.0
    busbw = algbw * Collective.parse(row["collective"]).busbw_factor(nranks)
    return {**row, "algbw": algbw, "busbw": busbw}


def _read_rows(path: Path, nranks: int) -> dict[tuple[str, int], dict]:
    rows = {}
    if path.exists():
        for line in path.read_text().splitlines():
            if line.strip():
                r = with_bandwidth(json.loads(line), nranks)
                rows[(r["collective"], r["nbytes"])] = r
    return rows


# ---------------------------------------------------------------------------- the peers


def find_mpiexec() -> str | None:
    """The mpich wheel puts mpiexec beside the interpreter; prefer it to one on PATH."""
    beside = Path(sys.executable).parent / "mpiexec"
    return str(beside) if beside.exists() else shutil.which("mpiexec")


def run_mpich(cases, nranks, warmup, iters, timeout_seconds, workdir: Path) -> PeerRun:
    run = PeerRun("mpich")
    if importlib.util.find_spec("mpi4py") is None:
        run.unavailable = "mpi4py not installed: pip install mpich mpi4py"
        return run
    mpiexec = find_mpiexec()
    if mpiexec is None:
        run.unavailable = "no mpiexec: pip install mpich"
        return run
    out = workdir / "mpich.jsonl"
    cmd = [mpiexec, "-n", str(nranks), sys.executable, str(HERE / "peers_mpi_worker.py"),
           pc.dump_plan(cases, warmup, iters), str(out)]
    return _finish(run, run_bounded(cmd, timeout_seconds), out, nranks, "mpiexec",
                   timeout_seconds)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_gloo(cases, nranks, warmup, iters, timeout_seconds, workdir: Path) -> PeerRun:
    run = PeerRun("gloo")
    if importlib.util.find_spec("torch") is None:
        run.unavailable = "torch not installed: pip install torch==2.13.0 (CPU build)"
        return run
    out = workdir / "gloo.jsonl"
    env = {**os.environ, "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1",
           "PYTHONWARNINGS": "ignore::FutureWarning"}
    cmd = [sys.executable, str(HERE / "peers_gloo_worker.py"), str(nranks), str(free_port()),
           pc.dump_plan(cases, warmup, iters), str(out)]
    return _finish(run, run_bounded(cmd, timeout_seconds, env), out, nranks, "gloo ranks",
                   timeout_seconds)


def _finish(run: PeerRun, done: Finished, out: Path, nranks: int, what: str,
            timeout_seconds: float) -> PeerRun:
    run.seconds = done.seconds
    run.rows = _read_rows(out, nranks)
    if run.rows:
        run.library = next(iter(run.rows.values())).get("library", "")
    if done.timed_out or done.returncode != 0:
        reason = done.why(what, timeout_seconds)
        run.notes.append(reason)
        if run.rows:
            run.missing = reason
        else:
            run.unavailable = reason
    return run


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
    nbytes and time_us as for the other peers), else the best incorrect one."""
    best: dict[tuple[str, int], dict] = {}
    for raw in rows:
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


_BENCH_ERROR = re.compile(r"^polycast bench: (\S+) at \S+: (.*)$", re.M)


def run_polycast(cases, nranks, warmup, iters, timeout_seconds, algo: str | None) -> PeerRun:
    """``polycast bench --json`` once per case with every algorithm; an algorithm that
    raises ends that launch, so the case is launched again with the ones not yet run."""
    run = PeerRun("polycast")
    t0 = time.monotonic()
    helptext = polycast_bench_help()
    if helptext is None:
        run.unavailable = "polycast bench not available"
        return run
    opts = []
    if iters > 0 and "--iters" in helptext:
        opts += ["--iters", str(iters)]
    if "--warmup" in helptext:
        opts += ["--warmup", str(warmup)]
    if "--timeout" in helptext:    # let it end its own ranks first
        opts += ["--timeout", f"{max(1.0, timeout_seconds - 10):g}"]
    run.library = "polycast bench"
    for case in cases:
        todo = polycast_algorithms(case.collective, nranks, algo)
        found: list[dict] = []
        label = f"{case.collective} {format_size(case.nbytes)}"
        timed_out = False
        for _ in range(len(todo)):           # at most one launch per algorithm
            size = str(case.nbytes)
            cmd = polycast_command() + ["bench", "-n", str(nranks), case.collective,
                                        "--algo", ",".join(todo), "--min", size,
                                        "--max", size, *opts, "--json"]
            done = run_bounded(cmd, timeout_seconds)
            timed_out = done.timed_out
            try:
                rows = parse_json_rows(done.stdout) if done.stdout.strip() else []
            except ValueError as exc:
                rows = []
                run.notes.append(f"{label}: unreadable polycast bench output: {exc}")
            found += rows
            ran = {r.get("requested", r.get("algorithm")) for r in rows}
            if not done.timed_out and done.returncode == 0:
                break
            left = [a for a in todo if a not in ran]
            if not left and not done.timed_out:
                break                            # exit 1 for a wrong result: rows say it
            reason = done.why("polycast bench", timeout_seconds)
            # bench runs the algorithms in order: the first one without a row failed
            failed = dict(_BENCH_ERROR.findall(done.stderr)) or (
                {left[0]: reason} if left and not done.timed_out else {})
            for name, err in failed.items():
                run.notes.append(f"{label}: algorithm {name} failed: {err[:200]}")
            if not failed:
                run.notes.append(f"{label}: {reason}")
            todo = [a for a in left if a not in failed]
            if done.timed_out or not failed or not todo:
                run.missing_by[(case.collective, case.nbytes)] = reason
                break
        best = best_rows(found, nranks).get((case.collective, case.nbytes))
        if best is None:
            sizes = sorted({int(r["nbytes"]) for r in found})
            run.missing_by.setdefault(
                (case.collective, case.nbytes),
                f"polycast bench gave no row for {case.nbytes} B"
                + (f" (got {sizes})" if sizes else ""))
            if timed_out:
                run.missing = "skipped after a polycast bench timeout"
                run.notes.append("later polycast cases skipped after the timeout")
                break
            continue
        auto = [r for r in found if r.get("requested") == "auto"]
        if auto:
            a = with_bandwidth({**auto[0], "collective": case.collective,
                                "nbytes": int(auto[0]["nbytes"])}, nranks)
            best["auto"] = {"algorithm": a.get("algorithm"), "busbw": a["busbw"],
                            "time_us": a["time_us"], "correct": a.get("correct")}
        best["all"] = [{k: r.get(k) for k in ("algorithm", "requested", "time_us", "busbw",
                                               "correct", "transport", "iters")}
                       for r in found]
        run.rows[(case.collective, case.nbytes)] = best
        if timed_out:
            run.missing = "skipped after a polycast bench timeout"
            run.notes.append("later polycast cases skipped after the timeout")
            break
    run.seconds = time.monotonic() - t0
    if not run.rows and run.missing_by:
        run.unavailable = next(iter(run.missing_by.values()))
    return run


# ---------------------------------------------------------------------------- the table


def _bw_cell(run: PeerRun, key) -> object:
    row = run.rows.get(key)
    if row is None:
        return f"n/a ({run.reason(key)})"
    return _gbps(row["busbw"]) + ("" if row["correct"] else " WRONG")


def _auto_cell(row: dict | None) -> str:
    """busbw of the tuner's own choice ("auto"), when it was measured, and what it chose
    when that is not the best algorithm."""
    auto = (row or {}).get("auto")
    if not auto:
        return ""
    cell = _gbps(auto["busbw"]) + ("" if auto.get("correct", True) else " WRONG")
    return cell if auto.get("algorithm") == row.get("algorithm") else \
        f"{cell} ({auto.get('algorithm')})"


def _gbps(x: float) -> str:
    """Three significant digits, without exponents down to 1 kB/s (8-byte cases)."""
    return f"{x:.3g}" if x >= 1 else f"{x:.{max(3, 2 - int(np.floor(np.log10(max(x, 1e-6)))))}f}"


def _ratio(a: dict | None, b: dict | None) -> float | str:
    if a is None or b is None or not (a["correct"] and b["correct"]) or b["busbw"] <= 0:
        return "n/a"
    return round(a["busbw"] / b["busbw"], 2)


def comparison(cases: list[pc.Case], runs: dict[str, PeerRun]):
    """(table columns, table rows, JSON records) of busbw per collective and size."""
    columns = ["collective", "size", "polycast busbw GB/s", "polycast algo", "auto GB/s",
               "MPICH busbw GB/s", "gloo busbw GB/s", "polycast/MPICH", "polycast/gloo"]
    rows, records = [], []
    for case in cases:
        key = (case.collective, case.nbytes)
        got = {name: run.rows.get(key) for name, run in runs.items()}
        pcast = got["polycast"]
        rows.append([case.collective, format_size(case.nbytes),
                     _bw_cell(runs["polycast"], key),
                     pcast.get("algorithm", "?") if pcast else "", _auto_cell(pcast),
                     _bw_cell(runs["mpich"], key), _bw_cell(runs["gloo"], key),
                     _ratio(pcast, got["mpich"]), _ratio(pcast, got["gloo"])])
        rec = {"collective": case.collective, "nbytes": case.nbytes, "count": case.count,
               "dtype": np.dtype(pc.DTYPE).name,
               "polycast_algorithm": pcast.get("algorithm") if pcast else None,
               "polycast_auto": pcast.get("auto") if pcast else None,
               "polycast_vs_mpich": _ratio(pcast, got["mpich"]),
               "polycast_vs_gloo": _ratio(pcast, got["gloo"])}
        for name, run in runs.items():
            r = got[name]
            rec[name] = ({k: r[k] for k in ("time_us", "algbw", "busbw", "correct")}
                         if r else {"na": run.reason(key)})
        records.append(rec)
    return columns, rows, records


def latency(cases: list[pc.Case], runs: dict[str, PeerRun]):
    """(title, columns, rows, JSON record) for the smallest allreduce, or None."""
    small = [c for c in cases if c.collective == "allreduce"]
    if not small:
        return None
    case = min(small, key=lambda c: c.nbytes)
    key = (case.collective, case.nbytes)
    columns = ["peer", "algorithm", "time us", "correct"]
    rows, record = [], {"collective": case.collective, "nbytes": case.nbytes}
    for name, run in runs.items():
        r = run.rows.get(key)
        if r is None:
            rows.append([LABELS[name], "", f"n/a ({run.reason(key)})", ""])
            record[name] = {"na": run.reason(key)}
        else:
            rows.append([LABELS[name], r.get("algorithm", ""), f"{r['time_us']:.1f}",
                         "yes" if r["correct"] else "WRONG"])
            record[name] = {"time_us": r["time_us"], "correct": r["correct"],
                            "algorithm": r.get("algorithm")}
    title = f"{format_size(case.nbytes)} allreduce latency"
    return title, columns, rows, record


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
                   help="timed calls per case; 0 (default) sizes each loop to ~0.25 s")
    p.add_argument("--warmup", type=int, default=5, help="untimed calls first (default 5)")
    p.add_argument("--peers", default=",".join(PEERS),
                   help="which to run, from: " + ", ".join(PEERS) + " (default all)")
    p.add_argument("--algo", default=None,
                   help="passed to polycast bench --algo (default: its own choice)")
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
        cases = plan_cases(colls, sizes, args.nranks)
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
                runs[name] = run_polycast(cases, args.nranks, args.warmup, args.iters,
                                          args.timeout, args.algo)
            elif name == "mpich":
                runs[name] = run_mpich(cases, args.nranks, args.warmup, args.iters,
                                       args.timeout, workdir)
            else:
                runs[name] = run_gloo(cases, args.nranks, args.warmup, args.iters,
                                      args.timeout, workdir)

    from polycast.cli.table import print_table
    columns, rows, records = comparison(cases, runs)
    print_table(f"busbw, {args.nranks} local ranks, float32 (GB/s = 1e9 B/s)", columns, rows,
                right=set(columns[2:3] + columns[4:]))
    print("polycast: the best of the algorithms run (--algo, default all it supports); "
          "auto: polycast's own choice (named when it differs)")
    lat = latency(cases, runs)
    if lat:
        print_table(lat[0], lat[1], lat[2], right={"time us"})
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
        "iters": args.iters or "auto",
        "timing": "max over ranks of each rank's mean over iters back-to-back calls "
                  "after warmup (polycast: as polycast bench times it)",
        "cpus": os.cpu_count(),
        # Other work on a small machine skews every peer (busy-polling MPI most): keep the
        # load next to the numbers.
        "loadavg_before": load_before, "loadavg_after": list(os.getloadavg()),
        "peers": {name: {"status": "ok" if run.rows else f"n/a: {run.reason()}",
                         "library": run.library, "seconds": round(run.seconds, 2),
                         "notes": run.notes, "rows": list(run.rows.values())}
                  for name, run in runs.items()},
        "busbw": records,
        "latency": lat[3] if lat else None,
    }
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
