"""Run a benchmark and keep its result for the docs.

    python bench/keep.py NAME [--json PATH] [--plot PATH] -- python bench/X.py ARGS...

Runs the command (from the repository root, output shown as it comes), then keeps the JSON
it wrote as ``docs/benchmarks/NAME.json``, wrapped with what a reader needs to trust a
figure: the exact command, the date, the commit it ran on, the machine's load average before,
during (the highest) and after, the number of cores and the wall time. ``--plot`` keeps a
figure the command drew as ``docs/benchmarks/NAME.png``. ``python bench/page.py`` then
regenerates docs/benchmarks.md from every kept file.

``--json`` defaults to ``bench/results/<script>.json``, where most benches write. A command
that fails keeps nothing. Write the command as anyone would type it (``python bench/...``):
it is printed in the docs as the way to reproduce the figure.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import pathlib
import platform
import shlex
import shutil
import subprocess
import sys
import threading
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
KEPT = ROOT / "docs" / "benchmarks"


def _git(*args: str) -> str:
    try:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True,
                              timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def _load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def default_json(cmd: list[str]) -> pathlib.Path:
    script = next((a for a in cmd if a.endswith(".py")), None)
    if script is None:
        raise SystemExit("keep: cannot tell where the command writes its JSON: pass --json")
    return ROOT / "bench" / "results" / (pathlib.Path(script).stem + ".json")


def run(name: str, cmd: list[str], json_path: pathlib.Path, plot: pathlib.Path | None) -> dict:
    """Run ``cmd`` and return the kept document (not written)."""
    if json_path.exists():
        json_path.unlink()                  # never keep a stale file from an earlier run
    peak = [0.0]
    done = threading.Event()

    def sample() -> None:                   # the load's 1-minute average, every 5 s
        while not done.wait(5.0):
            peak[0] = max(peak[0], os.getloadavg()[0])

    before = _load()
    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    t0 = time.monotonic()
    proc = subprocess.run(cmd, cwd=ROOT)
    wall = time.monotonic() - t0
    done.set()
    after = _load()
    if proc.returncode != 0:
        raise SystemExit(f"keep: the command exited {proc.returncode}; nothing kept")
    if not json_path.exists():
        raise SystemExit(f"keep: the command wrote no {json_path.relative_to(ROOT)}; "
                         "pass --json where it writes")
    shown = ["python" if a == sys.executable else a for a in cmd]
    dirty = bool(_git("status", "--porcelain", "--untracked-files=no"))
    return {
        "name": name,
        "command": shlex.join(shown),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "commit": _git("rev-parse", "--short=10", "HEAD") + ("+changes" if dirty else ""),
        "load_before": before,
        "load_peak_1min": round(max(peak[0], before[0], after[0]), 2),
        "load_after": after,
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "wall_s": round(wall, 1),
        "plot": f"{name}.png" if plot else None,
        "result": json.loads(json_path.read_text()),
    }


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if "--" not in argv:
        print("usage: python bench/keep.py NAME [--json PATH] [--plot PATH] -- COMMAND...",
              file=sys.stderr)
        return 2
    i = argv.index("--")
    p = argparse.ArgumentParser(prog="bench/keep.py")
    p.add_argument("name", help="the kept file's name (docs/benchmarks/NAME.json)")
    p.add_argument("--json", help="where the command writes its JSON")
    p.add_argument("--plot", help="a figure the command writes, kept as NAME.png")
    a = p.parse_args(argv[:i])
    cmd = argv[i + 1:]
    if not cmd or not a.name.replace("-", "").replace("_", "").isalnum():
        print("keep: give a NAME of letters, digits, - and _, and a command after --",
              file=sys.stderr)
        return 2
    json_path = pathlib.Path(a.json).resolve() if a.json else default_json(cmd)
    plot = pathlib.Path(a.plot).resolve() if a.plot else None
    doc = run(a.name, cmd, json_path, plot)
    KEPT.mkdir(parents=True, exist_ok=True)
    if plot:
        if not plot.exists():
            raise SystemExit(f"keep: the command drew no {a.plot}; nothing kept")
        shutil.copyfile(plot, KEPT / f"{a.name}.png")
    out = KEPT / f"{a.name}.json"
    out.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"kept {out.relative_to(ROOT)} (load {doc['load_before'][0]} before, "
          f"{doc['load_peak_1min']} at most, {doc['wall_s']} s); now: python bench/page.py")
    return 0


if __name__ == "__main__":
    sys.exit(main())
