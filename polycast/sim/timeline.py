"""Timelines of simulated workloads: Perfetto (Chrome-trace JSON) files and figures.

Both read a :class:`~polycast.sim.pipeline.PipelineResult`'s recorded ranks (its
``record_ranks``): every node's start and end on each rank.

* :func:`write_trace` -- one process per (run, rank), a track per stream: ``compute``
  (and ``cpu``), then one per communication stream (``allgather``, ``reduce_scatter``,
  ``allreduce``, ``p2p`` ...); each node a slice with its phase, size and algorithm. Opens
  in ui.perfetto.dev or chrome://tracing.
* :func:`plot_timelines` -- one panel per run, one lane per stream of one rank, runs one
  above the other on a shared time axis, so the bubbles (gaps in the compute lane) of, say,
  ring and multicast allgather stand side by side (compute: forward, then backward a
  shade darker, the optimizer darkest).
"""

from __future__ import annotations

import json

from ..errors import InvalidArgument
from ..workload.graph import COMPUTE, NOOP, RECV, SEND

COLORS = {"compute": "#4c72b0", "cpu": "#8172b2", "allgather": "#dd8452",
          "reduce_scatter": "#55a868", "allreduce": "#c44e52", "p2p": "#937860"}


PHASE_SHADE = {"backward": 0.72, "optimizer": 0.45}    # darker: backward, optimizer


def _color(stream: str, n) -> tuple:
    """The stream's colour; compute a shade darker in backward and the optimizer."""
    from matplotlib.colors import to_rgb
    r, g, b = to_rgb(COLORS.get(stream, "#999999"))
    f = PHASE_SHADE.get(n.phase, 1.0) if n.kind == COMPUTE else 1.0
    return (r * f, g * f, b * f)


def _stream(n) -> str:
    if n.kind == COMPUTE:
        return "cpu" if n.cpu else "compute"
    if n.kind in (SEND, RECV):
        return n.stream or "p2p"
    return n.stream or n.collective or "comm"


def _lanes(res, rank: int) -> dict[str, list[tuple]]:
    """stream -> [(start, end, node)] of ``rank`` (no-time nodes left out)."""
    if res.workload is None or rank not in res.timelines:
        raise InvalidArgument(f"rank {rank} was not recorded (record_ranks)")
    prog = res.workload.programs[rank]
    lanes: dict[str, list[tuple]] = {}
    for pos, s, e in res.timelines[rank]:
        n = prog[pos]
        if n.kind == NOOP:
            continue
        lanes.setdefault(_stream(n), []).append((s, e, n))
    return lanes


def chrome_trace(runs: list[tuple[str, object]]) -> dict:
    """The trace of ``runs`` = [(label, PipelineResult)], each with recorded ranks."""
    events: list[dict] = []
    pid = 0
    for label, res in runs:
        if not res.timelines:
            raise InvalidArgument(f"{label}: no rank was recorded; run with record_ranks "
                                  "(the CLI does so for --trace)")
        for rank in sorted(res.timelines):
            lanes = _lanes(res, rank)
            events.append({"ph": "M", "name": "process_name", "pid": pid,
                           "args": {"name": f"{label}: rank {rank}"}})
            events.append({"ph": "M", "name": "process_sort_index", "pid": pid,
                           "args": {"sort_index": pid}})
            order = sorted(lanes, key=lambda k: (k not in ("compute", "cpu"), k))
            for tid, stream in enumerate(order):
                events.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid,
                               "args": {"name": stream}})
                for s, e, n in lanes[stream]:
                    args = {"phase": n.phase, "node": n.id}
                    if n.kind != COMPUTE:
                        args.update(nbytes=n.nbytes, collective=n.collective or n.kind,
                                    algorithm=n.algorithm, comm=n.comm or "world")
                    events.append({"ph": "X", "name": n.name or f"node {n.id}",
                                   "cat": n.phase or n.kind, "pid": pid, "tid": tid,
                                   "ts": s * 1e6, "dur": max(0.0, e - s) * 1e6,
                                   "args": args})
            pid += 1
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "otherData": {"runs": [{"label": label, **res.to_json()} for label, res in runs]}}


def write_trace(path: str, runs: list[tuple[str, object]]) -> None:
    with open(path, "w") as fh:
        json.dump(chrome_trace(runs), fh)


def plot_timelines(runs: list[tuple[str, object]], path: str, rank: int = 0,
                   title: str | None = None) -> None:
    """One panel per run: ``rank``'s lanes (compute, then each communication stream)."""
    from .plots import _plt
    plt = _plt()
    from matplotlib.patches import Patch
    lanes_of = [(label, res, _lanes(res, rank)) for label, res in runs]
    streams = sorted({s for _, _, lanes in lanes_of for s in lanes},
                     key=lambda k: (k not in ("compute", "cpu"), k))
    fig, axes = plt.subplots(len(runs), 1, figsize=(13, 1.0 + 0.55 * len(streams) * len(runs)),
                             sharex=True, squeeze=False)
    for ax, (label, res, lanes) in zip(axes[:, 0], lanes_of):
        for y, stream in enumerate(reversed(streams)):
            spans = lanes.get(stream, [])
            ax.broken_barh([(s * 1e3, (e - s) * 1e3) for s, e, _ in spans], (y + 0.1, 0.8),
                           facecolors=[_color(stream, n) for _, _, n in spans],
                           edgecolor="white", linewidth=0.3)
        ax.set_yticks([y + 0.5 for y in range(len(streams))])
        ax.set_yticklabels(list(reversed(streams)))
        ax.set_ylim(0, len(streams))
        ax.axvline(res.step_s * 1e3, color="black", linewidth=0.8)
        ax.set_title(f"{label}: step {res.step_s * 1e3:.1f} ms, bubble {res.bubble_pct:.1f} %"
                     f" (compute idle {res.bubble_s * 1e3:.1f} ms)", fontsize=10, loc="left")
        ax.grid(axis="x", alpha=0.3)
    axes[-1, 0].set_xlabel(f"time (ms), rank {rank}")
    fig.legend(handles=[Patch(color=COLORS.get(s, "#999999"), label=s) for s in streams],
               loc="upper right", ncol=len(streams), fontsize=9, frameon=False)
    if title:
        fig.suptitle(title, x=0.01, ha="left", fontsize=11)
    fig.tight_layout(rect=(0, 0, 1, 0.96))
    fig.savefig(path, dpi=110)
    plt.close(fig)
