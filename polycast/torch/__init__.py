"""polycast as a torch.distributed backend (CPU tensors).

>>> import polycast.torch                      # registers the backend "polycast"
>>> dist.init_process_group("polycast")        # the one-line switch (torchrun, polycast run)

=================== =====================================================================
module              what it holds
=================== =====================================================================
process_group       ``ProcessGroupPolycast`` (torch's interface), ``Options``, the creator
ops                 each collective as calls on the group's polycast ``Comm``
p2p                 send/recv/isend/irecv (and so batch_isend_irecv) as Comm.Isend/Irecv
work                ``Work`` and its future, completed when polycast's requests complete
tensors             tensors as zero-copy numpy views; dtype and reduce-op mapping; checks
rendezvous          the group's ``Comm``, connected through the store torch hands us
fused               ``allgather_matmul`` / ``matmul_reduce_scatter`` (micro-pipelined TP)
=================== =====================================================================
"""

from __future__ import annotations

try:
    import torch.distributed as dist
except ImportError as exc:          # pragma: no cover - depends on the environment
    raise ImportError("polycast.torch needs PyTorch: pip install 'polycast[torch]' "
                      f"(torch==2.13.0, CPU build) ({exc})") from None

from .fused import allgather_matmul, matmul_reduce_scatter
from .process_group import BACKEND_NAME, Options, ProcessGroupPolycast, create
from .rendezvous import bound_store_wait
from .work import Work


def _register() -> None:
    if BACKEND_NAME.upper() in dist.Backend._plugins:
        return
    dist.Backend.register_backend(BACKEND_NAME, create, extended_api=True, devices=["cpu"])


_register()
bound_store_wait()

__all__ = ["BACKEND_NAME", "Options", "ProcessGroupPolycast", "Work", "allgather_matmul",
           "matmul_reduce_scatter"]
