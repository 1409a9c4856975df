"""Draw docs/architecture.png: polycast's layers and the path of one call through them.

    python docs/draw_architecture.py [--out docs/architecture.png]

The layers and the call's steps are data (``LAYERS``, ``CALL``); every step names the module
that carries it out, and tests/test_docs.py checks each named module and folder exists, so
the picture cannot silently drift from the code. Needs matplotlib (the ``plot`` extra).
"""

from __future__ import annotations

import argparse
import pathlib
import sys
from dataclasses import dataclass

ROOT = pathlib.Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Layer:
    name: str
    folders: tuple[str, ...]     # where it lives (paths under the repository root)
    owns: str                    # one line


@dataclass(frozen=True)
class Step:
    layer: str                   # the Layer.name it happens in
    text: str                    # what happens
    module: str                  # the module that does it (dotted)


# Top to bottom: a layer imports only from the layers below it.
LAYERS: tuple[Layer, ...] = (
    Layer("API", ("polycast/comm", "polycast/torch", "polycast/cli"),
          "Comm (mpi4py's methods), the torch backend, the CLI"),
    Layer("planner", ("polycast/planner",),
          "collective + size + fabric -> algorithm and pipelining depth"),
    Layer("schedules", ("polycast/algorithms", "polycast/schedule", "polycast/graph"),
          "per-rank programs of steps over chunks: pure data; the verifier proves them"),
    Layer("engine", ("polycast/engine",),
          "sans-I/O state machine per rank: events in, actions out; reliable multicast"),
    Layer("drivers", ("polycast/runtime", "polycast/sim", "polycast/lab"),
          "runtime (transports, driver, symmetric memory, offload), simulator, lab"),
    Layer("models", ("polycast/models", "polycast/workload"),
          "topologies, NIC and host models, workload graphs"),
)

# One blocking ``comm.Allgather(send, recv)`` between processes on one host.
CALL: tuple[Step, ...] = (
    Step("API", "Comm.Allgather checks its arguments", "polycast.comm.collectives"),
    Step("drivers", "symmetric memory takes it, or not", "polycast.dispatch.routing"),
    Step("planner", "auto: cheapest algorithm for this size", "polycast.planner.choose"),
    Step("schedules", "build (once) the schedule", "polycast.algorithms.registry"),
    Step("engine", "post: the steps become actions", "polycast.engine.engine"),
    Step("drivers", "progress: execute the actions", "polycast.runtime.driver.progress"),
    Step("drivers", "shm ring / TCP / UDP multicast", "polycast.runtime.transport.shm"),
    Step("engine", "bytes arrive: events in, completion out", "polycast.engine.engine"),
    Step("API", "the request completes; Allgather returns", "polycast.runtime.driver.request"),
)

def draw(out: pathlib.Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import FancyArrowPatch, FancyBboxPatch

    n = len(LAYERS)
    row = {l.name: i for i, l in enumerate(LAYERS)}
    fig, ax = plt.subplots(figsize=(13, 0.95 * n + 1.6), dpi=110)
    ax.set_xlim(0, 13)
    ax.set_ylim(-0.2, n + 1.0)
    ax.axis("off")
    y = lambda i: n - 1 - i + 0.1                     # noqa: E731 (row i's bottom)
    colors = ["#dbe8f5", "#e6f2e0", "#fbe9d7", "#efe3f3", "#fdf3c4", "#e0eef0", "#eeeeee"]
    for i, l in enumerate(LAYERS):
        ax.add_patch(FancyBboxPatch((0.1, y(i)), 6.0, 0.78, boxstyle="round,pad=0.02",
                                    fc=colors[i % len(colors)], ec="#555555", lw=0.8))
        ax.text(0.25, y(i) + 0.52, l.name, fontsize=11, weight="bold", va="center")
        ax.text(1.45, y(i) + 0.52, "  ".join(f.removeprefix("polycast/") + "/"
                                              for f in l.folders),
                fontsize=8.5, family="monospace", va="center")
        ax.text(0.25, y(i) + 0.2, l.owns, fontsize=8, va="center", color="#333333")
        ax.add_patch(FancyBboxPatch((6.3, y(i)), 6.6, 0.78, boxstyle="round,pad=0.02",
                                    fc=colors[i % len(colors)], ec="none", alpha=0.35))
    ax.text(3.1, n + 0.55, "layers (imports only go down)", ha="center", fontsize=12,
            weight="bold")
    ax.text(9.6, n + 0.55, "one blocking Allgather, step by step", ha="center", fontsize=12,
            weight="bold")
    # the call: a zig-zag across the right half, one box per step at its layer's row
    xs = [6.45 + k * (6.3 / len(CALL)) for k in range(len(CALL))]
    prev = None
    for k, (s, x) in enumerate(zip(CALL, xs)):
        yy = y(row[s.layer]) + 0.39
        ax.text(x + 0.3, yy, f"{k + 1}", fontsize=10, weight="bold", ha="center", va="center",
                bbox=dict(boxstyle="circle,pad=0.25", fc="white", ec="#aa3311"))
        if prev is not None:
            ax.add_patch(FancyArrowPatch(prev, (x + 0.16, yy), arrowstyle="-|>",
                                         mutation_scale=11, color="#aa3311", lw=1.2,
                                         shrinkA=9, shrinkB=9))
        prev = (x + 0.3, yy)
    legend = "\n".join(f"{k + 1}. {s.text}  ({s.module})" for k, s in enumerate(CALL))
    ax.text(0.1, -0.15, legend, fontsize=7.5, va="top", family="monospace")
    fig.subplots_adjust(left=0.01, right=0.99, top=0.98, bottom=0.02)
    fig.set_size_inches(13, 0.95 * n + 1.6 + 0.16 * len(CALL))
    ax.set_ylim(-0.25 - 0.17 * len(CALL), n + 1.0)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, metadata={"Software": None})
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=str(ROOT / "docs" / "architecture.png"))
    a = p.parse_args(argv)
    draw(pathlib.Path(a.out))
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
