"""The torch backend's pieces that need no second process: dtype and op mapping, the
zero-copy views, the flat-buffer detection FSDP1 relies on, Work completion."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from torch_helpers import needs_torch

pytestmark = needs_torch

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")


def test_import_registers_the_backend_for_cpu():
    import polycast.torch as pt
    assert "POLYCAST" in dist.Backend._plugins
    assert dist.Backend._plugins["POLYCAST"].extended_api
    assert pt.BACKEND_NAME == "polycast"


def test_raw_is_a_view_and_leaves_the_storage_resizable():
    from polycast.torch.tensors import raw
    t = torch.arange(6, dtype=torch.float32)
    a = raw(t)
    a[2] = 42.0
    assert t[2].item() == 42.0 and a.dtype == np.float32
    t.untyped_storage().resize_(0)          # FSDP1 frees its flat parameters so
    b = torch.zeros(3, dtype=torch.bfloat16)
    v = raw(b)
    assert v.dtype == np.uint8 and v.size == 6
    assert raw(torch.empty(0)).size == 0
    g = torch.ones(3, requires_grad=True)
    assert raw(g).sum() == 3.0


def test_reduce_ops_map_and_unsupported_ones_are_named():
    from polycast.errors import Unsupported
    from polycast.torch.tensors import reduce_op
    R = dist.ReduceOp
    assert reduce_op(R.SUM) == ("sum", None)
    assert reduce_op(R.AVG) == ("avg", None)
    assert reduce_op(R.PRODUCT) == ("prod", None)
    assert reduce_op(dist._make_nccl_premul_sum(0.25)) == ("sum", 0.25)
    assert reduce_op(R.BXOR) == ("bxor", None)
    with pytest.raises(Unsupported, match="median"):
        reduce_op("median")


def test_dtypes_reduce_natively_or_widen():
    from polycast.errors import Unsupported
    from polycast.torch.tensors import widened
    assert widened(torch.float16, "sum") == torch.float16
    assert widened(torch.bfloat16, "sum") == torch.float32
    assert widened(torch.int64, "max") == torch.int64
    with pytest.raises(Unsupported, match="MAX"):
        widened(torch.complex64, "max")
    with pytest.raises(Unsupported, match="float8"):
        widened(torch.float8_e4m3fn, "sum")
    with pytest.raises(Unsupported, match="BAND needs an integer"):
        widened(torch.float32, "band")
    assert widened(torch.int16, "bor") == torch.int16


def test_checks_name_the_tensor_property():
    from polycast.errors import InvalidArgument
    from polycast.torch.tensors import check
    with pytest.raises(InvalidArgument, match="sparse"):
        check(torch.ones(3).to_sparse(), "x")
    with pytest.raises(InvalidArgument, match="meta"):
        check(torch.ones(3, device="meta"), "x")
    with pytest.raises(InvalidArgument, match="torch.Tensor"):
        check(np.ones(3), "x")


def test_adjacent_tensors_are_one_flat_buffer():
    from polycast.torch.tensors import adjacent, flat_over, overlaps
    flat = torch.arange(12.0)
    parts = list(flat.chunk(4))
    assert adjacent(parts)
    view = flat_over(parts)
    assert view.data_ptr() == flat.data_ptr() and view.numel() == 12
    assert not adjacent([parts[1], parts[0]])                      # out of order
    assert not adjacent([torch.zeros(3), torch.zeros(3)])          # separate storages
    assert overlaps(flat[2:5], flat[4:8]) and not overlaps(flat[2:4], flat[4:8])


class _Req:
    """A stand-in for a polycast Request finished by another thread."""

    def __init__(self, error=None, delay=0.0):
        self.error, self._done = error, threading.Event()
        self._callbacks = []
        self._lock = threading.Lock()
        threading.Timer(delay, self._finish).start()

    def _finish(self):
        with self._lock:
            self._done.set()
            callbacks, self._callbacks = self._callbacks, []
        for fn in callbacks:
            fn(self)

    def add_done_callback(self, fn):
        with self._lock:
            if not self._done.is_set():
                self._callbacks.append(fn)
                return
        fn(self)

    def Wait(self, timeout=None):
        assert self._done.wait(timeout)
        if self.error:
            raise self.error

    def Test(self):
        if self._done.is_set() and self.error:
            raise self.error
        return self._done.is_set()


def test_future_completes_without_wait_and_runs_the_last_step_once():
    from polycast.torch.work import Work
    calls = []
    t = torch.zeros(2)
    w = Work([_Req(delay=0.05)], lambda: calls.append(1), [t])
    fut = w.get_future()                      # asynchronous: handed to the completer
    assert fut.wait() == [t]                  # completed by the completer, nobody waited
    assert w.is_completed() and w.is_success() and calls == [1]
    assert w.wait() and calls == [1]


def test_a_failed_request_fails_the_future_and_wait():
    from polycast.errors import PeerLost
    from polycast.torch.work import Work
    w = Work([_Req(PeerLost(3, "gone"), delay=0.01), _Req(delay=0.02)], None, [])
    fut = w.get_future()
    with pytest.raises(Exception, match="lost rank 3"):
        fut.wait()
    with pytest.raises(PeerLost):
        w.wait()
    assert w.is_completed() and not w.is_success()
    deadline = time.monotonic() + 1
    while w.exception() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert isinstance(w.exception(), PeerLost)
