"""What the ``polycast sim`` subcommands share: the network arguments, KEY=VALUE options,
the progress spinner, and the figures --stats prints about the simulating process."""

from __future__ import annotations

import argparse
import sys
import time

from ...errors import InvalidArgument
from ...units import format_size

# --stats' wall clock starts when the CLI builds its parser (polycast is loaded by then).
T0 = time.perf_counter()


def add_common(p: argparse.ArgumentParser) -> None:
    """The network every subcommand but sweep simulates on, --json and --stats."""
    p.add_argument("--nodes", "-n", type=int, default=8, help="ranks P (default 8)")
    p.add_argument("--topology", "-t", default="fattree:radix=32",
                   help="switch | leafspine:hosts_per_leaf=16,oversub=2 | fattree:radix=32, "
                        "each with optional ,ranks_per_host=8,nvlink=3600Gbps,nics=8,"
                        "latency=250ns,switch_latency=300ns (default fattree:radix=32)")
    p.add_argument("--link", default="400Gbps", help="host link rate (default 400Gbps)")
    p.add_argument("--framing", default=None, metavar="tcp|udp|ib|none",
                   help="per-packet headers on every link (default tcp: Ethernet+IPv4+TCP "
                        "messages and UDP datagrams, MTU 9000; none: the ideal link); "
                        "the topology's framing= and mtu= override it")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.add_argument("--stats", action="store_true",
                   help="print the simulation's wall and CPU time and peak memory")


def key_values(items: list[str]) -> dict:
    """--opt KEY=VALUE items as a dict (integers where they parse)."""
    out = {}
    for item in items:
        k, eq, v = item.partition("=")
        if not eq or not k:
            raise InvalidArgument(f"--opt wants KEY=VALUE, got {item!r}")
        try:
            out[k] = int(v)
        except ValueError:
            out[k] = v
    return out


def process_stats(cpu0: float) -> dict:
    """Wall (since the process started), CPU and peak resident memory of this process."""
    import resource
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return {"wall_s": time.perf_counter() - T0, "cpu_s": time.process_time(),
            "cpu_s_simulating": time.process_time() - cpu0,
            "peak_rss_bytes": ru.ru_maxrss * 1024}


def print_stats(stats: dict) -> None:
    """--stats' last line (the figures of :func:`process_stats`)."""
    print(f"stats: {stats['wall_s']:.2f} s wall, {stats['cpu_s']:.2f} s CPU, "
          f"peak memory {stats['peak_rss_bytes'] / 2**20:.0f} MiB")


class progress:
    """A spinner with the elapsed time on stderr (rich), shown only when the work takes
    longer than ``after_s`` and stderr is a terminal; silent with --json."""

    def __init__(self, what: str, quiet: bool = False, after_s: float = 2.0) -> None:
        self.what, self.quiet, self.after_s = what, quiet, after_s
        self._timer = self._live = None

    def __enter__(self):
        if self.quiet or not sys.stderr.isatty():
            return self
        import threading
        self._timer = threading.Timer(self.after_s, self._show)
        self._timer.daemon = True
        self._timer.start()
        return self

    def _show(self) -> None:
        try:
            from rich.console import Console
            from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
        except ImportError:
            return
        p = Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(),
                     console=Console(stderr=True), transient=True)
        p.add_task(self.what, total=None)
        p.start()
        self._live = p

    def __exit__(self, *exc) -> None:
        if self._timer is not None:
            self._timer.cancel()
        if self._live is not None:
            self._live.stop()


def size_text(nbytes: int) -> str:
    """Exact units when they divide, else MiB to two decimals (sizes round to elements)."""
    text = format_size(nbytes)
    return text if not text.endswith("B") or text[-2] == "i" or nbytes < 1024 \
        else f"{nbytes / 2**20:.2f}MiB"


def gib(n: int) -> float:
    return round(n / 2**30, 3)
