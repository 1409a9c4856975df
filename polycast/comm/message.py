"""Matched probes (MPI-3's ``MPI_Mprobe`` / ``MPI_Improbe`` and ``MPI_Mrecv``, mpi4py's
``Message``): a probe that also takes the message out of matching, so that no other receive
(another thread's, say) can take it before this one's ``Recv``.

>>> st = polycast.Status()
>>> m = comm.Mprobe(polycast.ANY_SOURCE, 3, st)        # waits (bounded) for a message
>>> buf = np.empty(st.Get_count(np.float32), np.float32)
>>> m.Recv(buf)                                         # exactly the probed message
>>> obj = comm.mprobe(source=0).recv()                  # objects

A probed message must be received (``Recv``/``Irecv``/``recv``/``irecv``), once; until
then it holds its place in the engine's early buffer. ``MESSAGE_NO_PROC`` is what a probe of
``PROC_NULL`` gives (receiving it completes at once, empty); ``MESSAGE_NULL`` is the null
message (falsy), what a Message becomes once received.
"""

from __future__ import annotations

from ..errors import InvalidArgument
from ..runtime.driver.request import ANY_TAG, PROC_NULL, Request

_NULL, _NO_PROC, _TAKEN = "null", "no_proc", "taken"


class Message:
    """A message taken by :meth:`Comm.Mprobe` / :meth:`Comm.Improbe`; see the module."""

    __slots__ = ("_kind", "_comm", "_handle")

    def __init__(self, message: "Message | None" = None) -> None:
        """``Message()``: the null message; ``Message(MESSAGE_NO_PROC)``: a copy of it."""
        if message is not None and (not isinstance(message, Message)
                                    or message._kind == _TAKEN):
            raise TypeError(f"Message({message!r}): only MESSAGE_NULL / MESSAGE_NO_PROC can "
                            "be copied (a probed message is received once, by itself)")
        self._kind = _NULL if message is None else message._kind
        self._comm = self._handle = None

    @classmethod
    def _taken(cls, comm, handle) -> "Message":
        m = cls()
        m._kind, m._comm, m._handle = _TAKEN, comm, handle
        return m

    def __bool__(self) -> bool:
        return self._kind != _NULL

    def __eq__(self, other) -> bool:
        return self is other or (isinstance(other, Message) and self._kind != _TAKEN
                                 and self._kind == other._kind)

    __hash__ = None

    def __reduce__(self):
        if self is MESSAGE_NULL or self is MESSAGE_NO_PROC:
            return "MESSAGE_NULL" if self is MESSAGE_NULL else "MESSAGE_NO_PROC"
        if self._kind != _TAKEN:
            return Message, (MESSAGE_NULL if self._kind == _NULL else MESSAGE_NO_PROC,)
        raise ValueError("a probed Message cannot be pickled: it is this process's, "
                         "receive it with Recv")

    def __repr__(self) -> str:
        return f"<polycast.Message {self._kind}>"

    # -- receiving ---------------------------------------------------------------------------
    def _take(self, buf, objects: bool) -> Request:
        kind, comm, handle = self._kind, self._comm, self._handle
        if kind == _NULL:
            raise InvalidArgument("receive of MESSAGE_NULL (a Message already received, or "
                                  "none was probed)")
        if self is not MESSAGE_NO_PROC:
            self._kind, self._comm, self._handle = _NULL, None, None
        if kind == _NO_PROC:
            req = Request(0, -1, "Mrecv of MESSAGE_NO_PROC", 0.0)
            req.status = (PROC_NULL, ANY_TAG, 0)
            req._finish()
            return req
        return comm._mrecv(handle, buf, objects)

    def Irecv(self, buf) -> Request:
        """Receive the probed message into ``buf`` (MPI_Imrecv)."""
        return self._take(buf, False)

    def Recv(self, buf, status=None) -> None:
        self.Irecv(buf).Wait(status)

    def irecv(self) -> Request:
        """Receive the probed object; ``wait()`` returns it."""
        return self._take(None, True)

    def recv(self, status=None):
        return self.irecv().wait(status)

    # mpi4py's Message.Probe(comm, ...) / Iprobe(comm, ...)
    @classmethod
    def Probe(cls, comm, source: int = -2, tag: int = ANY_TAG, status=None) -> "Message":
        return comm.Mprobe(source, tag, status)

    @classmethod
    def Iprobe(cls, comm, source: int = -2, tag: int = ANY_TAG, status=None):
        return comm.Improbe(source, tag, status)

    probe, iprobe = Probe, Iprobe


MESSAGE_NULL = Message()
MESSAGE_NO_PROC = Message()
MESSAGE_NO_PROC._kind = _NO_PROC
