"""The user-facing communicator: mpi4py-style collectives on numpy arrays.

>>> import numpy as np, polycast
>>> comm = polycast.init()                        # from polycast run / torchrun / mpiexec / srun
>>> x = np.full(4, comm.rank, np.float32)
>>> comm.Allreduce(polycast.IN_PLACE, x, op="sum")
>>> req = comm.Iallgather(x, out)                 # non-blocking; req.Wait()

Every call builds the schedule of the chosen algorithm (``algorithm=`` keyword, else the
communicator's ``POLYCAST_<COLLECTIVE>_ALGO``, else ``auto``: see
:mod:`polycast.dispatch.choice`), registers the arrays (bad sizes or dtypes raise
InvalidArgument before anything is sent) and posts it to the progress thread. Every wait is
bounded by the communicator's timeout (POLYCAST_TIMEOUT, default 60 s). A communicator's
settings (``comm.config``, :mod:`polycast.config`) are read once, when it is made.

Modules: :mod:`.core` (identity, posting, Split/Dup/Free), :mod:`.collectives` (buffer
methods), :mod:`.vector` (vector and scan collectives), :mod:`.persistent`,
:mod:`.objects` (object methods), :mod:`.p2p` (point-to-point), :mod:`.message` (matched
probes), :mod:`.ordered` (non-commutative ops), :mod:`.communicator` (``Comm``),
:mod:`.lifecycle` (``init``, ``finalize``, ``world``). What a buffer may be is
:mod:`polycast.buffers`'; which path and algorithm a call takes, :mod:`polycast.dispatch`'s.
"""

from ..errors import UnknownName
from ..runtime.driver.request import REQUEST_NULL, Request
from ..buffers import IN_PLACE
from .communicator import Comm
from .core import UNDEFINED
from .lifecycle import finalize, init, world
from .message import MESSAGE_NO_PROC, MESSAGE_NULL, Message
from .p2p import ANY_SOURCE, ANY_TAG, PROC_NULL, TAG_UB, Status
from .persistent import Prequest

__all__ = ["Comm", "Request", "IN_PLACE", "UNDEFINED", "init", "finalize", "world",
           "UnknownName", "Status", "ANY_SOURCE", "ANY_TAG", "PROC_NULL", "TAG_UB", "Prequest",
           "REQUEST_NULL", "Message", "MESSAGE_NULL", "MESSAGE_NO_PROC"]
