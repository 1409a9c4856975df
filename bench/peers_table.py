"""bench/peers.py's tables: busbw per collective and size for every peer with the ratios
between them, the smallest allreduce's latency, and the engine path's CPU breakdown; each
as printed rows and as JSON records."""

from __future__ import annotations

import subprocess
import sys

import numpy as np

import peers_common as pc
from peers_launch import PeerRun
from polycast.units import format_size

LABELS = {"polycast": "polycast engine", "mpich": "MPICH", "gloo": "gloo"}


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


def _auto_row(row: dict | None) -> dict | None:
    auto = (row or {}).get("auto")
    if not auto:
        return None
    return {"busbw": auto["busbw"], "correct": auto.get("correct", True)}


def comparison(cases: list[pc.Case], runs: dict[str, PeerRun]):
    """(table columns, table rows, JSON records) of busbw per collective and size.
    ``engine``: polycast's best explicit algorithm (the engine path); ``auto``: its
    default, the symm path on one host."""
    columns = ["collective", "size", "engine busbw GB/s", "engine algo", "auto GB/s",
               "MPICH busbw GB/s", "gloo busbw GB/s", "engine/MPICH", "auto/MPICH",
               "engine/gloo"]
    rows, records = [], []
    for case in cases:
        key = (case.collective, case.nbytes)
        got = {name: run.rows.get(key) for name, run in runs.items()}
        pcast = got["polycast"]
        rows.append([case.collective, format_size(case.nbytes),
                     _bw_cell(runs["polycast"], key),
                     pcast.get("algorithm", "?") if pcast else "", _auto_cell(pcast),
                     _bw_cell(runs["mpich"], key), _bw_cell(runs["gloo"], key),
                     _ratio(pcast, got["mpich"]), _ratio(_auto_row(pcast), got["mpich"]),
                     _ratio(pcast, got["gloo"])])
        rec = {"collective": case.collective, "nbytes": case.nbytes, "count": case.count,
               "dtype": np.dtype(pc.DTYPE).name,
               "polycast_algorithm": pcast.get("algorithm") if pcast else None,
               "polycast_auto": pcast.get("auto") if pcast else None,
               "polycast_vs_mpich": _ratio(pcast, got["mpich"]),
               "auto_vs_mpich": _ratio(_auto_row(pcast), got["mpich"]),
               "polycast_vs_gloo": _ratio(pcast, got["gloo"])}
        for name, run in runs.items():
            r = got[name]
            rec[name] = ({k: r[k] for k in ("time_us", "algbw", "busbw", "correct")}
                         if r else {"na": run.reason(key)})
            if r and r.get("cpu_us") is not None:
                rec[name]["cpu_us"] = r["cpu_us"]
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
        auto = (r or {}).get("auto")
        if name == "polycast" and auto:
            rows.append(["polycast auto", auto.get("algorithm", ""),
                         f"{auto['time_us']:.1f}", "yes" if auto.get("correct") else "WRONG"])
            record["polycast_auto"] = dict(auto)
    title = f"{format_size(case.nbytes)} allreduce latency"
    return title, columns, rows, record


def breakdown(cases: list[pc.Case], runs: dict[str, PeerRun], args) -> list[dict]:
    """Per case, the engine path's best algorithm profiled by bench/breakdown.py: CPU
    per call and rank split by engine, driver, transport, copies, waiting."""
    import breakdown as bd
    got = []
    for case in cases:
        row = runs["polycast"].rows.get((case.collective, case.nbytes))
        if not row or row.get("algorithm", "").startswith("auto"):
            continue
        spec = bd.Case(f"{case.collective}-{format_size(case.nbytes)}-{args.nranks}",
                       case.collective, str(case.nbytes), row["algorithm"], args.nranks,
                       args.transport, iters=max(case.iters * 5, 50))
        print(f"profiling {spec.name} ({row['algorithm']}) ...", file=sys.stderr, flush=True)
        try:
            got.append(bd.run_case(spec, 250, None, args.timeout))
        except (RuntimeError, subprocess.TimeoutExpired, SystemExit) as exc:
            print(f"note: breakdown of {spec.name} failed: {exc}", file=sys.stderr)
    if got:
        bd.print_rows(got)
    return got
