"""Which implementation of the rings' hot path runs: the compiled helper or pure Python.

``polycast/runtime/_ring.c`` (built by pip at install where a C compiler exists; setup.py)
does the shared-memory rings' per-frame work with real acquire/release ordering, futex
wake-ups and futex_waitv with the GIL released. Without it, or with ``POLYCAST_NATIVE=0``,
runtime/shm.py and runtime/futex.py run the same wire layout in Python. Chosen once, at
import; ``POLYCAST_DEBUG=INFO`` prints which (runtime/world.py, at connect).
"""

from __future__ import annotations

import os
import sys

ring = None                    # the compiled module, when in use
why_not: str | None = None     # why not, when not


def _load():
    if os.environ.get("POLYCAST_NATIVE", "1").strip().lower() in ("0", "false", "no", "off"):
        return None, "POLYCAST_NATIVE=0"
    if sys.byteorder != "little":
        return None, "the ring layout is little-endian"
    try:
        from . import _ring
    except ImportError as exc:
        return None, f"the compiled helper is not built ({exc}); reinstall with a C compiler"
    return _ring, None


ring, why_not = _load()


def describe() -> str:
    """One line for POLYCAST_DEBUG=INFO."""
    if ring is not None:
        return "shm rings: compiled hot path (polycast.runtime._ring)"
    return f"shm rings: pure Python ({why_not})"
