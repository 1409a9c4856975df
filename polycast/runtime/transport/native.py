"""Which implementation of the rings' hot path runs: the compiled helper or pure Python.

``polycast/runtime/transport/_ring.c`` (built by pip at install where a C compiler exists;
setup.py) does the shared-memory rings' per-frame work with real acquire/release ordering,
futex wake-ups and futex_waitv with the GIL released. Without it (or with the ``native=0``
test hook, polycast.config.Hooks) runtime/transport/shm.py and runtime/transport/futex.py run
the same wire layout in Python. Loaded once, at import; ``POLYCAST_DEBUG=INFO`` prints which
(runtime/bootstrap/world.py, at connect).
"""

from __future__ import annotations

import importlib
import sys

ring = None                    # the compiled module, when built and loadable here
why_not: str | None = None     # why not, when not


def load(module: str, layout: str, abi: int | None = None):
    """``(module, None)``, or ``(None, why not)``: a host the shared ``layout`` does not fit
    (it is Linux futexes and little-endian words), not built, or (``abi`` given) built from
    an older interface than its source's: a module whose ``ABI`` is missing or another
    number is not used, since calling into it can crash. One rule for the compiled helpers
    (this one's rings, runtime/symm/_symm.c, runtime/transport/_dgram.c)."""
    if sys.byteorder != "little" or not sys.platform.startswith("linux"):
        return None, f"{layout} is Linux, little-endian"
    try:
        built = importlib.import_module(module)
    except ImportError as exc:
        return None, f"the compiled helper is not built ({exc}); reinstall with a C compiler"
    if abi is not None and getattr(built, "ABI", None) != abi:
        return None, (f"the built helper's interface is {getattr(built, 'ABI', 'unversioned')}"
                      f", its source's is {abi}: built before a change to it (rebuild: "
                      "python setup.py build_ext --inplace)")
    return built, None


ring, why_not = load("polycast.runtime.transport._ring", "the ring layout")
if ring is not None:
    from .layout import LAYOUT
    _built = getattr(ring, "LAYOUT", {})
    if not _built or any(LAYOUT[k] != v for k, v in _built.items()):
        # Built from another ring_layout.h (an in-place build not redone after an update):
        # the Python rings run, which read the header as it is.
        ring, why_not = None, ("the built helper's ring layout differs from ring_layout.h "
                               "(rebuild: python setup.py build_ext --inplace)")


def in_use(hooks) -> bool:
    """Whether a job with these test hooks runs the compiled rings."""
    return ring is not None and hooks.native


def describe(hooks) -> str:
    """One line for POLYCAST_DEBUG=INFO."""
    if in_use(hooks):
        return "shm rings: compiled hot path (polycast.runtime.transport._ring)"
    return f"shm rings: pure Python ({why_not or 'test hook native=0'})"
