"""polycast: collective communication for distributed training, with reliable multicast.

One set of collective algorithms (schedules), proven by a verifier, executed by one
sans-I/O engine that drives both a real runtime (shared memory, TCP, UDP multicast) and a
datacenter-network simulator.
"""

from .collectives import Collective, ReduceOp
from .errors import (CollectiveTimeout, InvalidArgument, MismatchError, OffloadLost, PeerLost,
                     PolycastError, ProtocolError, ScheduleError, UnknownName, Unsupported)
from .version import __version__

# Under `polycast run`: report how this rank ends to the launcher (see runtime/bootstrap/report.py).
from .runtime.bootstrap import report as _report  # noqa: E402
_report.install()

__all__ = [
    "Collective", "ReduceOp", "PolycastError", "InvalidArgument", "UnknownName",
    "Unsupported", "ScheduleError", "ProtocolError", "MismatchError", "PeerLost",
    "CollectiveTimeout", "OffloadLost", "__version__",
]

# The runtime's user API (mpi4py style): comm = polycast.init(); comm.Allreduce(...)
from .comm import (ANY_SOURCE, ANY_TAG, IN_PLACE, MESSAGE_NO_PROC, MESSAGE_NULL,  # noqa: E402
                   PROC_NULL, REQUEST_NULL, TAG_UB, UNDEFINED, Comm, Message, Prequest,
                   Status, finalize, init)
from .runtime.driver import Request  # noqa: E402
from .ops import (AVG, BAND, BOR, BXOR, LAND, LOR, LXOR, MAX, MAXLOC, MIN, MINLOC,  # noqa: E402
                  PROD, SUM, Op)
__all__ += ["init", "finalize", "Comm", "Request", "Prequest", "IN_PLACE", "UNDEFINED",
            "Status", "REQUEST_NULL", "Message", "MESSAGE_NULL", "MESSAGE_NO_PROC",
            "ANY_SOURCE", "ANY_TAG", "PROC_NULL", "TAG_UB", "Op", "SUM",
            "PROD", "MIN", "MAX", "AVG", "LAND", "LOR", "LXOR", "BAND", "BOR", "BXOR",
            "MAXLOC", "MINLOC"]
