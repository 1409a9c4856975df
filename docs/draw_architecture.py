"""Draw docs/architecture.png: polycast's layers and the path of one call through them.

    python docs/draw_architecture.py [--out docs/architecture.png]

The layers are read from the import-linter contract in pyproject.toml (the one CI enforces:
imports only go down), so the picture is the code's layering by construction. The call's
steps are data (``CALL``), each naming the module that carries it out; tests/test_docs.py
checks that each module exists and sits in a layer of the contract, and that the png is
what this script draws. Needs matplotlib (the ``plot`` extra).
"""

from __future__ import annotations

import argparse
import pathlib
import sys
import tomllib
from dataclasses import dataclass

ROOT = pathlib.Path(__file__).resolve().parent.parent

# One line per top-level package, for the picture (a package missing here is drawn by name).
WHAT = {
    "cli": "the polycast command", "lab": "network namespaces as hosts",
    "tools": "launcher, doctor, selftest, calibration", "torch": "torch.distributed backend",
    "comm": "Comm: mpi4py's methods", "dispatch": "the path that runs a call",
    "sim": "simulator: event clock + network model",
    "runtime": "runtime: bootstrap, transport, driver, symm, offload",
    "planner": "auto: algorithm + pipelining depth", "algorithms": "schedule generators",
    "engine": "sans-I/O engine, reliable multicast", "reference": "reference results",
    "memory": "memory ops", "graph": "trees", "models": "topology, NIC and host models",
    "workload": "workload graphs", "schedule": "IR, builder, verifier", "ops": "reduction ops",
    "debug": "POLYCAST_DEBUG", "buffers": "buffer specs", "collectives": "names",
    "units": "units", "version": "version", "errors": "exceptions",
    "config": "configuration",
}


@dataclass(frozen=True)
class Step:
    text: str                    # what happens
    module: str                  # the module that does it (dotted)


# One blocking ``comm.Allgather(send, recv)`` between processes on one host.
CALL: tuple[Step, ...] = (
    Step("Comm.Allgather hands its call over", "polycast.comm.collectives"),
    Step("which path runs it: kept call, symm, engine", "polycast.dispatch.call"),
    Step("auto: cheapest algorithm for this size", "polycast.planner.choose"),
    Step("build (once) the schedule", "polycast.algorithms.registry"),
    Step("post: the steps become actions", "polycast.engine.engine"),
    Step("progress: execute the actions", "polycast.runtime.driver.progress"),
    Step("shm ring / TCP / UDP multicast", "polycast.runtime.transport.shm"),
    Step("bytes arrive: events in, completion out", "polycast.engine.engine"),
    Step("the request completes; Allgather returns", "polycast.runtime.driver.request"),
)


def layers() -> list[list[str]]:
    """The top-level layers of polycast, top first: the contract's ``layers`` whose
    container is ``polycast``, each a list of the packages that share it."""
    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())
    for c in cfg["tool"]["importlinter"]["contracts"]:
        if c.get("type") == "layers" and c.get("containers") == ["polycast"]:
            return [[p.strip() for p in layer.split("|")] for layer in c["layers"]]
    raise SystemExit("pyproject.toml has no import-linter layers contract for polycast")


def layer_of(module: str, stack: list[list[str]]) -> int:
    top = module.split(".")[1]
    for i, names in enumerate(stack):
        if top in names:
            return i
    raise ValueError(f"{module}: package {top} is in no layer of the contract")


def draw(out: pathlib.Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import FancyArrowPatch, FancyBboxPatch

    stack = layers()
    n = len(stack)
    h = 0.62                                            # a row's height
    legend_rows = len(CALL)
    fig_h = n * h + 1.2 + 0.17 * legend_rows
    fig, ax = plt.subplots(figsize=(13, fig_h), dpi=110)
    ax.set_xlim(0, 13)
    ax.set_ylim(-0.25 - 0.17 * legend_rows, n * h + 0.8)
    ax.axis("off")
    y = lambda i: (n - 1 - i) * h + 0.05                # noqa: E731 (row i's bottom)
    colors = ["#dbe8f5", "#e6f2e0", "#fbe9d7", "#efe3f3", "#fdf3c4", "#e0eef0", "#eeeeee"]
    for i, names in enumerate(stack):
        c = colors[i % len(colors)]
        ax.add_patch(FancyBboxPatch((0.1, y(i)), 6.0, h - 0.1, boxstyle="round,pad=0.02",
                                    fc=c, ec="#555555", lw=0.8))
        ax.text(0.25, y(i) + 0.37, " | ".join(names), fontsize=9, weight="bold",
                va="center", family="monospace")
        ax.text(0.25, y(i) + 0.14, "; ".join(WHAT.get(p, p) for p in names),
                fontsize=7.2, va="center", color="#333333")
        ax.add_patch(FancyBboxPatch((6.3, y(i)), 6.6, h - 0.1, boxstyle="round,pad=0.02",
                                    fc=c, ec="none", alpha=0.35))
    ax.text(3.1, n * h + 0.4, "layers of pyproject's import-linter contract (imports go down)",
            ha="center", fontsize=10.5, weight="bold")
    ax.text(9.6, n * h + 0.4, "one blocking Allgather, step by step", ha="center",
            fontsize=10.5, weight="bold")
    xs = [6.45 + k * (6.3 / len(CALL)) for k in range(len(CALL))]
    prev = None
    for k, (s, x) in enumerate(zip(CALL, xs)):
        yy = y(layer_of(s.module, stack)) + (h - 0.1) / 2
        ax.text(x + 0.3, yy, f"{k + 1}", fontsize=9, weight="bold", ha="center", va="center",
                bbox=dict(boxstyle="circle,pad=0.2", fc="white", ec="#aa3311"))
        if prev is not None:
            ax.add_patch(FancyArrowPatch(prev, (x + 0.3, yy), arrowstyle="-|>",
                                         mutation_scale=10, color="#aa3311", lw=1.1,
                                         shrinkA=8, shrinkB=8))
        prev = (x + 0.3, yy)
    legend = "\n".join(f"{k + 1}. {s.text}  ({s.module})" for k, s in enumerate(CALL))
    ax.text(0.1, -0.15, legend, fontsize=7.5, va="top", family="monospace")
    fig.subplots_adjust(left=0.01, right=0.99, top=0.99, bottom=0.01)
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
