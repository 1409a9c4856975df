"""Tensors as the numpy arrays polycast moves, torch's reduce ops as polycast's, and the
checks a tensor passes before anything is sent.

Data movement is zero-copy: a contiguous CPU tensor is handed over as a numpy view of its
memory (:func:`raw`); dtypes numpy lacks (bfloat16, float8...) as a ``uint8`` view of
their bytes. Reductions run in numpy on the tensor's own memory for every dtype numpy
has, float16 included (numpy adds halves as torch and gloo do: convert, add, round to
half). bfloat16 has no numpy dtype: its reductions convert to float32, reduce, and
convert back once. That costs a copy each way and twice the bytes on the wire, but it is
exact for sums of up to 2^16 ranks' bf16 values and rounds once (gloo rounds to bf16 at
every step), and it needs no bf16 arithmetic in the engine.
"""

from __future__ import annotations

import ctypes
import functools

import numpy as np
import torch
import torch.distributed as dist

from ..errors import InvalidArgument, Unsupported

_NUMPY = {torch.float32: np.float32, torch.float64: np.float64, torch.float16: np.float16,
          torch.int8: np.int8, torch.int16: np.int16, torch.int32: np.int32,
          torch.int64: np.int64, torch.uint8: np.uint8, torch.bool: np.bool_,
          torch.complex64: np.complex64, torch.complex128: np.complex128}
# Reduced in float32 (see the module docstring).
_WIDENED = {torch.bfloat16: torch.float32}

_RED = dist.ReduceOp.RedOpType
_OPS = {_RED.SUM: "sum", _RED.AVG: "avg", _RED.PREMUL_SUM: "sum", _RED.MAX: "max",
        _RED.MIN: "min", _RED.PRODUCT: "prod", _RED.BAND: "band", _RED.BOR: "bor",
        _RED.BXOR: "bxor"}
_BITWISE = ("band", "bor", "bxor")
SUPPORTED_OPS = "SUM, AVG, PREMUL_SUM, MAX, MIN, PRODUCT, BAND, BOR, BXOR"


def check(t, what: str) -> torch.Tensor:
    """Raise InvalidArgument naming the property of ``t`` the backend cannot serve."""
    if not isinstance(t, torch.Tensor):
        raise InvalidArgument(f"{what} must be a torch.Tensor, got {type(t).__name__}")
    if t.layout != torch.strided:
        raise InvalidArgument(f"{what} is a {t.layout} tensor: the polycast backend serves "
                              "dense (strided) tensors; call .to_dense() first")
    if t.device.type != "cpu":
        raise InvalidArgument(f"{what} is on device {t.device}: the polycast backend serves "
                              "CPU tensors (register another backend for "
                              f"{t.device.type}, e.g. init_process_group('cpu:polycast,"
                              f"{t.device.type}:nccl'))")
    if t.is_quantized:
        raise InvalidArgument(f"{what} is quantized ({t.dtype}): not supported")
    return t


def check_list(ts, what: str) -> list:
    if not isinstance(ts, (list, tuple)):
        raise InvalidArgument(f"{what} must be a list of tensors, got {type(ts).__name__}")
    return [check(t, f"{what}[{i}]") for i, t in enumerate(ts)]


@functools.lru_cache(maxsize=None)
def _bytes_type(nbytes_class: int):
    return ctypes.c_char * nbytes_class


def _size_class(nbytes: int) -> int:
    """The power of two at or above ``nbytes``: one ctypes array type per class (at most
    ~48), where one per size made thousands of ~3 KiB types in a job with many sizes."""
    return 1 << (nbytes - 1).bit_length()


def raw(t: torch.Tensor) -> np.ndarray:
    """A flat numpy view of a contiguous tensor's elements (its bytes for dtypes numpy
    lacks). Never copies.

    Not ``tensor.numpy()``: that marks the tensor's storage as never resizable again, and
    FSDP1 frees its flat parameters' storage (``resize_(0)``) after the all-gather. The
    array keeps the tensor alive (through its base) for as long as polycast holds it:
    a queued job or a request still using it after the caller dropped the tensor (a
    failed DDP step) reads live memory."""
    if t.is_conj() or t.is_neg():
        raise InvalidArgument("tensor has a lazy conjugate/negative bit: call "
                              ".resolve_conj()/.resolve_neg() first")
    if not t.is_contiguous():
        raise InvalidArgument("internal: raw() needs a contiguous tensor")
    dtype = _NUMPY.get(t.dtype, np.uint8)
    nbytes = t.numel() * t.element_size()
    if nbytes == 0:
        return np.empty(0, dtype)
    # The class may reach past the tensor's end: nothing reads there, the array is cut to
    # the tensor's elements (count).
    view = _bytes_type(_size_class(nbytes)).from_address(t.data_ptr())
    view.tensor = t
    return np.frombuffer(view, dtype, count=nbytes // np.dtype(dtype).itemsize)


def raw_units(dtype: torch.dtype) -> int:
    """Elements of :func:`raw`'s array per tensor element (bytes, for dtypes numpy
    lacks): what counts given to polycast's vector collectives are multiplied by."""
    return 1 if dtype in _NUMPY else torch.empty(0, dtype=dtype).element_size()


def reducible(dtype: torch.dtype) -> bool:
    """Whether numpy reduces this dtype in place (else :func:`widened` says in what)."""
    return dtype in _NUMPY


def widened(dtype: torch.dtype, op: str) -> torch.dtype:
    """The dtype a reduction of ``dtype`` runs in; raises for dtypes nobody reduces."""
    if op in _BITWISE and (dtype.is_floating_point or dtype.is_complex):
        raise Unsupported(f"reduction op {op.upper()} needs an integer or bool tensor, got "
                          f"{dtype}")
    if dtype in _NUMPY:
        if dtype.is_complex and op in ("max", "min"):
            raise Unsupported(f"reduction op {op.upper()} is not defined for {dtype}")
        return dtype
    if dtype in _WIDENED:
        return _WIDENED[dtype]
    raise Unsupported(f"reductions of {dtype} are not supported by the polycast backend "
                      "(data movement is: broadcast, all_gather, scatter, all_to_all...)")


def reduce_op(op) -> tuple[str, object]:
    """torch's ReduceOp -> (polycast op name, pre-multiplication factor or None)."""
    kind = getattr(op, "op", op)
    name = _OPS.get(kind)
    if name is None:
        raise Unsupported(f"reduction op {getattr(kind, 'name', kind)} is not supported by "
                          f"the polycast backend (supported: {SUPPORTED_OPS})")
    factor = op.factor if kind == _RED.PREMUL_SUM else None
    return name, factor


def same_storage_block(a: torch.Tensor, b: torch.Tensor) -> bool:
    """True if ``a`` is exactly the memory of ``b`` (same start, dtype and size)."""
    return (a.dtype == b.dtype and a.numel() == b.numel() and a.is_contiguous()
            and b.is_contiguous() and a.data_ptr() == b.data_ptr())


def overlaps(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether the bytes of two contiguous tensors overlap."""
    if a.numel() == 0 or b.numel() == 0:
        return False
    a0, b0 = a.data_ptr(), b.data_ptr()
    return a0 < b0 + b.numel() * b.element_size() and b0 < a0 + a.numel() * a.element_size()


def adjacent(ts: list) -> bool:
    """Whether contiguous tensors of one dtype lie back to back in one storage, in order
    (then they are one flat buffer: FSDP1 passes its all-gather outputs so)."""
    if not ts:
        return False
    first = ts[0]
    base = first.untyped_storage().data_ptr()
    end = first.data_ptr()
    for t in ts:
        if (t.dtype != first.dtype or not t.is_contiguous()
                or t.untyped_storage().data_ptr() != base):
            return False
        if t.numel() == 0:
            continue
        if t.data_ptr() != end:
            return False
        end += t.numel() * t.element_size()
    return True


def flat_over(ts: list) -> torch.Tensor:
    """One flat tensor viewing adjacent tensors ``ts`` (see :func:`adjacent`)."""
    first = ts[0]
    n = sum(t.numel() for t in ts)
    return first.new_empty(0).set_(first.untyped_storage(), first.storage_offset(), (n,))
