"""The rings' layout and framing, read from ``ring_layout.h``: the one definition the
compiled rings (``_ring.c``, the compiled replay) and the Python ones (:mod:`.shm`,
:mod:`.frames`) share, so the two sides cannot disagree about an offset. Read once, at
import; the header ships with the package whether or not a compiler built the helpers.
(:func:`read_defines` reads the datagram helper's ``_dgram_abi.h`` the same way.)"""

from __future__ import annotations

import os
import re

_HEADER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "ring_layout.h")
_DEFINE = re.compile(r"^#define\s+([A-Z_][A-Z0-9_]*)\s+([^/]+?)\s*(?:/\*.*)?$")
_EXPR = re.compile(r"^[\sA-Z0-9_x()+\-*<>|&]+$")


def read_defines(path: str = _HEADER) -> dict[str, int]:
    """NAME -> value of every ``#define NAME <integer expression>`` line (the expression
    may use integers and names defined above it)."""
    values: dict[str, int] = {}
    with open(path) as fh:
        for line in fh:
            m = _DEFINE.match(line.strip())
            if not m:
                continue
            name, expr = m.groups()
            if not _EXPR.match(expr):
                raise ValueError(f"{path}: {name}: not an integer expression: {expr!r}")
            values[name] = int(eval(expr, {"__builtins__": {}}, dict(values)))  # noqa: S307
    return values


LAYOUT = read_defines()
globals().update(LAYOUT)
__all__ = sorted(LAYOUT)
