"""What a communicator accepts as a buffer, and the per-call names it hands the driver."""

from __future__ import annotations

import numpy as np

from ..collectives import ReduceOp
from ..errors import InvalidArgument


class _InPlace:
    def __repr__(self) -> str:
        return "polycast.IN_PLACE"


IN_PLACE = _InPlace()


# Per-call constants, computed once (str(dtype) alone measured ~5 us, a third of the
# comm layer's cost of an 8-byte allreduce).
_DTYPE_NAMES: dict = {}
_OP_NAMES: dict = {}


def dtype_name(dt: np.dtype) -> str:
    name = _DTYPE_NAMES.get(dt)
    if name is None:
        name = _DTYPE_NAMES[dt] = str(dt)
    return name


def op_name(op) -> str:
    try:
        name = _OP_NAMES.get(op)
    except TypeError:                   # unhashable: let parse name the problem
        return ReduceOp.parse(op).value
    if name is None:
        name = ReduceOp.parse(op).value
        if len(_OP_NAMES) < 64:
            _OP_NAMES[op] = name
    return name


def as_array(buf, what: str) -> np.ndarray:
    """``buf`` as a flat view, or InvalidArgument naming ``what`` is wrong with it."""
    if not isinstance(buf, np.ndarray):
        raise InvalidArgument(f"{what} must be a numpy array (or polycast.IN_PLACE where "
                              f"allowed), got {type(buf).__name__}")
    if not buf.flags.c_contiguous:
        raise InvalidArgument(f"{what} must be C-contiguous (use np.ascontiguousarray)")
    return buf.reshape(-1)
