"""matplotlib figures of simulations: per-rank timeline, link utilisation by layer over
time, and traffic by layer. matplotlib is optional (the ``plot`` extra), imported lazily.

Utilisation spreads each finished flow's bytes evenly over its lifetime (the flow model
keeps rates piecewise constant, but only start and end are recorded), so it is exact for
uncontended flows and an average otherwise.
"""

from __future__ import annotations

import numpy as np

from ..errors import InvalidArgument
from .topology import LAYERS


def _plt():
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise InvalidArgument("plotting needs matplotlib: pip install 'polycast[plot]'") from None
    return plt


def plot_results(results, path: str, max_ranks: int = 64) -> None:
    """Write one figure (PNG/PDF/SVG by extension): a timeline of the first result's ranks,
    link utilisation by layer, and traffic by layer for every result side by side."""
    if not isinstance(results, (list, tuple)):
        results = [results]
    for r in results:
        if r.simulation is None or not r.simulation.cfg.record:
            raise InvalidArgument("plots need a recorded simulation (record=True)")
    plt = _plt()
    fig, axes = plt.subplots(3, 1, figsize=(11, 11))
    _timeline(axes[0], results[0], max_ranks)
    _utilisation(axes[1], results)
    _traffic(axes[2], results)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _timeline(ax, res, max_ranks: int) -> None:
    colors = {"send": "tab:blue", "mcast": "tab:green", "recv": "tab:orange",
              "mrecv": "tab:red"}
    ranks = range(min(res.nodes, max_ranks))
    for rank in ranks:
        tl = res.timelines[rank]
        for kind, y in (("send", rank - 0.2), ("mcast", rank - 0.2), ("recv", rank + 0.2),
                        ("mrecv", rank + 0.2)):
            spans = [(iv.start * 1e6, (iv.end - iv.start) * 1e6)
                     for iv in tl.intervals if iv.kind == kind]
            if spans:
                ax.broken_barh(spans, (y - 0.18, 0.36), facecolors=colors[kind], alpha=0.6)
        done = [t * 1e6 for t in tl.completed.values()]
        ax.plot(done, [rank] * len(done), "k|", markersize=8)
    for kind, c in colors.items():
        ax.plot([], [], color=c, linewidth=6, label=kind)
    ax.set_xlabel("time (us)")
    ax.set_ylabel("rank")
    more = f" (first {max_ranks} ranks)" if res.nodes > max_ranks else ""
    ax.set_title(f"{res.collective} {res.algorithm}, {res.nodes} ranks: timeline{more}")
    ax.legend(loc="upper right", fontsize=8)


def _utilisation(ax, results) -> None:
    for res in results:
        sim = res.simulation
        topo = sim.topo
        recs = sim.net.records
        if not recs:
            continue
        t_end = res.time_s
        bins = np.linspace(0.0, t_end, 101)
        width = bins[1] - bins[0]
        cap = np.array([topo.bandwidth[topo.layer_index == i].sum() for i in range(len(LAYERS))])
        moved = np.zeros((len(LAYERS), len(bins) - 1))
        for fr in recs:
            dur = max(fr.finish - fr.start, 1e-18)
            lo = np.clip(bins[:-1], fr.start, fr.finish)
            hi = np.clip(bins[1:], fr.start, fr.finish)
            share = (hi - lo) / dur * fr.nbytes
            for i, n in enumerate(fr.layer_links):
                if n:
                    moved[i] += share * n
        for i, name in enumerate(LAYERS):
            if cap[i] > 0 and moved[i].any():
                ax.plot(bins[:-1] * 1e6, moved[i] / width / cap[i] * 100,
                        label=f"{res.algorithm}: {name}")
    ax.set_xlabel("time (us)")
    ax.set_ylabel("utilisation of the layer (%)")
    ax.set_title("link utilisation by layer")
    ax.legend(fontsize=8)


def _traffic(ax, results) -> None:
    names = [f"{r.algorithm}" for r in results]
    bottom = np.zeros(len(results))
    for layer in LAYERS:
        vals = np.array([r.link_bytes_by_layer.get(layer, 0) for r in results]) / 2**30
        if vals.any():
            ax.bar(names, vals, bottom=bottom, label=layer)
            bottom += vals
    ax.set_ylabel("link bytes (GiB, all directions)")
    ax.set_title("traffic by layer")
    ax.legend(fontsize=8)
