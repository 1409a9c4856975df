"""Chrome-trace JSON (opens in Perfetto / chrome://tracing) from a recorded simulation.

One process per rank (``pid`` = rank), with a "send" track (point-to-point sends and
multicast streams, from first to last byte out) and a "recv" track (each incoming message
from its first byte out at the sender to its arrival), plus the collective itself on a
"collective" track from post to completion. Times are in microseconds, as the format wants.
"""

from __future__ import annotations

import json

from ..errors import InvalidArgument

_TIDS = {"collective": 0, "send": 1, "mcast": 1, "recv": 2, "mrecv": 2}


def chrome_trace(results, max_events: int = 2_000_000) -> dict:
    """The trace of one or more :class:`~polycast.sim.simulate.SimResult` (recorded with
    ``record=True``); several results go one after another on the time axis."""
    if not isinstance(results, (list, tuple)):
        results = [results]
    events: list[dict] = []
    offset_us = 0.0
    named: set[int] = set()
    for res in results:
        if res.simulation is None or not res.simulation.cfg.record:
            raise InvalidArgument("this result has no timelines; simulate with record=True "
                                  "(the CLI does so for --trace/--plot)")
        label = f"{res.collective} {res.algorithm}"
        for rank, tl in enumerate(res.timelines):
            if rank not in named:
                named.add(rank)
                events.append({"ph": "M", "name": "process_name", "pid": rank,
                               "args": {"name": f"rank {rank}"}})
                for name, tid in (("collective", 0), ("send", 1), ("recv", 2)):
                    events.append({"ph": "M", "name": "thread_name", "pid": rank,
                                   "tid": tid, "args": {"name": name}})
            for req, t0 in tl.posted.items():
                t1 = tl.completed.get(req, t0)
                events.append({"ph": "X", "name": label, "cat": "collective", "pid": rank,
                               "tid": 0, "ts": offset_us + t0 * 1e6,
                               "dur": (t1 - t0) * 1e6, "args": {"request": req}})
            for iv in tl.intervals:
                if iv.kind in ("send", "mcast"):
                    name = (f"mcast {iv.nbytes}B" if iv.kind == "mcast"
                            else f"send {iv.nbytes}B -> {iv.peer}")
                else:
                    name = f"{'mrecv' if iv.kind == 'mrecv' else 'recv'} {iv.nbytes}B <- {iv.peer}"
                events.append({"ph": "X", "name": name, "cat": iv.kind, "pid": rank,
                               "tid": _TIDS[iv.kind], "ts": offset_us + iv.start * 1e6,
                               "dur": max(0.0, iv.end - iv.start) * 1e6,
                               "args": {"peer": iv.peer, "nbytes": iv.nbytes}})
                if len(events) > max_events:
                    raise InvalidArgument(f"trace would exceed {max_events} events; trace a "
                                          "smaller run (fewer nodes or chunks)")
        offset_us += res.time_s * 1e6 * 1.05
    return {"traceEvents": events, "displayTimeUnit": "ns",
            "otherData": {"results": [r.to_json() for r in results]}}


def write_chrome_trace(path: str, results) -> None:
    with open(path, "w") as fh:
        json.dump(chrome_trace(results), fh)
