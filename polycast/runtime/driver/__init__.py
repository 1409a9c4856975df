"""The runtime's driver of the sans-I/O engine: one per process.

=========== ===================================================================================
module      what it holds
=========== ===================================================================================
core        :class:`Driver`: the engines of every communicator, events from I/O into them
progress    the progress thread, caller-driven progress (spin, quick and full rounds), the lock
execute     carrying out engine actions (memory, frames, datagrams, timers, requests)
peers       reliable I/O with every peer: shm rings and TCP links, doorbells, lost peers
datagrams   multicast sockets per communicator: send now or paced, read
timers      the engines' timers (one heap, lazy deletion)
request     :class:`Request` (Wait/Test/Waitall) as the user holds it
=========== ===================================================================================
"""

from .core import Driver
from .request import Request

__all__ = ["Driver", "Request"]
