"""``polycast nic``: how many chunks per second a NIC (or a host) puts through the multicast
receive path, and how much NIC a link needs (the model: :mod:`polycast.models.nic`).

    polycast nic --link 1.6Tbps --chunk 4KiB --cycles-per-chunk 590 --clock 1.8GHz \\
                 --cores 16 --threads-per-core 16
    polycast nic --preset bf3-dpa [--json] [--plot rate.png]
    polycast nic --preset host-python --link 100Gbps --cores 4
"""

from __future__ import annotations

import argparse
import json

from ..errors import InvalidArgument

#: Link rates marked on the plot, bit/s.
MARKED_LINKS = (100e9, 200e9, 400e9, 800e9, 1.6e12)
#: The SC24 paper's thread count for 1.6 Tbit/s of 4 KiB chunks on the BlueField-3 DPA.
PAPER_DPA_THREADS = 128


def add_parser(sub) -> None:
    p = sub.add_parser(
        "nic", help="size a SmartNIC (or a host) for a link: chunk rate, cores, threads",
        description="The SmartNIC chunk-rate model: cores x hardware threads at a clock, "
                    "cycles per chunk -> sustainable chunk and bit rates, and the cores and "
                    "threads a link needs. Start from --preset (bf3-dpa, host-python, "
                    "host-native) or give "
                    "--clock, --cores and --cycles-per-chunk; any flag changes the preset.")
    p.add_argument("--preset", default=None, help="bf3-dpa | host-python | host-native")
    p.add_argument("--link", default="1.6Tbps",
                   help="link rate with its unit (default 1.6Tbps)")
    p.add_argument("--chunk", default=None,
                   help="chunk (datagram payload) size with its unit (default: the preset's, "
                        "else 4KiB)")
    p.add_argument("--clock", default=None, help="core clock with its unit, e.g. 1.8GHz")
    p.add_argument("--cores", default=None, help="cores running the receive path")
    p.add_argument("--threads-per-core", default=None, help="hardware threads per core")
    p.add_argument("--cycles-per-chunk", default=None,
                   help="core cycles issued per chunk (fixed part)")
    p.add_argument("--cycles-per-byte", default=None,
                   help="core cycles issued per payload byte (a copy by the core; default 0)")
    p.add_argument("--stall-cycles", default=None,
                   help="cycles a thread waits per chunk that other hardware threads of its "
                        "core can fill (memory, DMA; default 0)")
    p.add_argument("--json", action="store_true",
                   help="print JSON (keys include chunks_per_s, gbps, threads_needed)")
    p.add_argument("--plot", metavar="FILE", default=None,
                   help="write rate vs threads with the link rates marked (png/pdf/svg)")
    p.set_defaults(func=run)


def model_from_args(args: argparse.Namespace):
    """The model the flags describe: every value checked (unit, > 0) before any work."""
    from ..models.nic import (NicModel, nic_preset, parse_chunk, parse_count, parse_cycles,
                              DPA_CHUNK_NBYTES)
    from ..units import parse_frequency
    changes = {}
    if args.clock is not None:
        changes["clock_hz"] = parse_frequency(args.clock)
    if args.cores is not None:
        changes["cores"] = parse_count(args.cores, "--cores")
    if args.threads_per_core is not None:
        changes["threads_per_core"] = parse_count(args.threads_per_core, "--threads-per-core")
    if args.cycles_per_chunk is not None:
        changes["cycles_per_chunk"] = parse_cycles(args.cycles_per_chunk, "--cycles-per-chunk")
    if args.cycles_per_byte is not None:
        changes["cycles_per_byte"] = parse_cycles(args.cycles_per_byte, "--cycles-per-byte",
                                                  allow_zero=True)
    if args.stall_cycles is not None:
        changes["stall_cycles_per_chunk"] = parse_cycles(args.stall_cycles, "--stall-cycles",
                                                         allow_zero=True)
    if args.chunk is not None:
        changes["chunk_nbytes"] = parse_chunk(args.chunk)
    if args.preset is not None:
        base = nic_preset(args.preset)
        return base.with_overrides(**changes)
    missing = [flag for flag, key in (("--clock", "clock_hz"), ("--cores", "cores"),
                                      ("--cycles-per-chunk", "cycles_per_chunk"))
               if key not in changes]
    if missing:
        raise InvalidArgument(f"missing {', '.join(missing)} (or start from --preset "
                              "bf3-dpa | host-python | host-native)")
    changes.setdefault("threads_per_core", 1)
    changes.setdefault("chunk_nbytes", DPA_CHUNK_NBYTES)
    return NicModel(name="custom", source="command-line parameters", **changes)


def run(args: argparse.Namespace) -> int:
    from ..units import parse_rate
    link = str(args.link).strip()
    if link and link[-1].isdigit():
        raise InvalidArgument(f"--link {link!r} needs a unit, e.g. 400Gbps or 1.6Tbps")
    link_bps = parse_rate(link)
    model = model_from_args(args)
    from . import checks
    checks.output_path(args.plot, "--plot", (".png", ".pdf", ".svg"))
    sizing = model.size_for(link_bps)
    if args.plot:
        plot_rate_vs_threads(model, args.plot, link_bps)
    if args.json:
        out = sizing.to_json()
        out["model"] = model.to_json()
        print(json.dumps(out, indent=1))
        return 0
    print_sizing(model, sizing)
    if args.plot:
        print(f"wrote {args.plot}")
    return 0


def _rate(x: float) -> str:
    return f"{x / 1e6:.2f} M" if x >= 1e5 else f"{x / 1e3:.1f} k"


def print_sizing(model, s) -> None:
    from ..units import format_size
    from .table import print_table
    c = s.chunk_nbytes
    print(f"NIC model {model.name}: {model.source}")
    print(f"  {model.cores} cores x {model.threads_per_core} threads at "
          f"{model.clock_hz / 1e9:.3g} GHz; per {format_size(c)} chunk: {s.work_cycles:.1f} "
          f"cycles issued by the core, {s.latency_cycles:.1f} cycles of one thread's time "
          f"({s.threads_to_saturate_core} thread(s) saturate a core)")
    rows = [["one thread", _rate(s.thread_chunks_per_s), s.thread_chunks_per_s * c * 8 / 1e9],
            ["one core (every thread)", _rate(s.core_chunks_per_s),
             s.core_chunks_per_s * c * 8 / 1e9],
            [f"this NIC ({s.threads} threads)", _rate(s.chunks_per_s), s.gbps],
            [f"the link ({s.link_gbps:g} Gbit/s)", _rate(s.link_chunks_per_s), s.link_gbps]]
    print_table(f"sustainable rates, {format_size(c)} chunks", ["", "chunks/s", "Gbit/s"],
                rows, right={"chunks/s", "Gbit/s"})
    verdict = "yes" if s.keeps_up else "NO"
    print(f"keeps up with the link: {verdict} ({100 * s.link_fraction:.2f}% of its chunk "
          f"rate); the link leaves {s.cycle_budget_per_core:.1f} cycles per chunk per core "
          f"on {model.cores} cores")
    used = min(s.threads_needed, max(s.cores, s.cores_needed))
    per_core = -(-s.threads_needed // used)
    where = "" if s.keeps_up else f" (this NIC has {s.cores})"
    print(f"needed for the link: {s.cores_needed} cores{where}, {s.threads_needed} threads "
          f"(up to {per_core} per core)")


def plot_rate_vs_threads(model, path: str, link_bps: float) -> None:
    """Sustainable Gbit/s vs threads (spread over the cores), link rates marked."""
    from ..sim.plots import _plt
    import numpy as np
    plt = _plt()
    c = model.chunk_nbytes
    tmax = model.cores * model.threads_per_core
    ts = np.unique(np.geomspace(1, tmax, num=min(tmax, 200)).round().astype(int))
    gbps = [model.chunks_per_s(c, int(t)) * c * 8 / 1e9 for t in ts]
    fig, ax = plt.subplots(figsize=(8, 5))
    ax.plot(ts, gbps, "o-", markersize=3, label=f"{model.name}, {c} B chunks")
    links = sorted(set(MARKED_LINKS) | {link_bps})
    for L in links:
        ax.axhline(L / 1e9, color="tab:red" if L == link_bps else "grey",
                   linestyle="--", linewidth=0.8)
        ax.annotate(f"{L / 1e9:g} Gbit/s", (ts[0], L / 1e9), fontsize=8,
                    textcoords="offset points", xytext=(2, 2))
    s = model.size_for(link_bps, c)
    if s.keeps_up:
        ax.axvline(s.threads_needed, color="tab:red", linestyle=":", linewidth=1)
        ax.annotate(f"{s.threads_needed} threads for {link_bps / 1e9:g} Gbit/s",
                    (s.threads_needed, s.gbps), fontsize=8, textcoords="offset points",
                    xytext=(4, -12))
    if model.name.startswith("bf3-dpa") and tmax >= PAPER_DPA_THREADS:
        ax.axvline(PAPER_DPA_THREADS, color="grey", linestyle="-.", linewidth=0.8)
        ax.annotate("paper: at most 128 threads for 1.6 Tbit/s", (PAPER_DPA_THREADS, gbps[0]),
                    fontsize=8, textcoords="offset points", xytext=(-4, 30), ha="right")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel(f"threads (spread over {model.cores} cores of {model.threads_per_core})")
    ax.set_ylabel("sustainable payload rate (Gbit/s)")
    ax.set_title(f"NIC model {model.name}: receive rate vs threads")
    ax.legend(loc="center right")
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
