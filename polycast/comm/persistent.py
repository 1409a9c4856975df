"""Persistent collectives (MPI-4's ``MPI_Allreduce_init`` and kin, as mpi4py's
``Comm.Allreduce_init(...)`` returning a ``Prequest``).

>>> req = comm.Allreduce_init(grad, out, op="sum")
>>> for step in range(1000):
...     req.Start(); ...; req.Wait()        # same buffers, same call, again and again

The arguments are taken once; every ``Start`` posts the call on them (the schedule comes
from the communicator's schedule cache, so it is built on the first Start only; the
arguments are checked again each time, as the buffers' contents and, for a refused call,
the peers' state may have changed). Nothing moves at ``*_init``: like MPI, call it on every
rank in the same order, and Start the requests in the same order on every rank.
"""

from __future__ import annotations

from ..errors import InvalidArgument
from ..runtime.driver.request import Request, _is_null_eq


class Prequest:
    """A persistent request: inactive until :meth:`Start`, active until completed by
    :meth:`Wait` / :meth:`Test`, then ready to Start again; null (equal to
    ``REQUEST_NULL``, falsy) once freed. The multiple-completion calls (``Waitany``,
    ``Waitsome``, ...) take it beside plain requests and skip it while inactive."""

    def __init__(self, start=None, desc: str = "REQUEST_NULL",
                 timeout_seconds: float = 0.0) -> None:
        if start is not None and (not callable(start) or isinstance(start, (Prequest, Request))):
            raise TypeError(f"Prequest({start!r}): polycast requests are not MPI handles to "
                            "copy; Comm.<Call>_init makes one, use it itself")
        self._start = start
        self._active = None
        self.desc = desc
        self.timeout_seconds = timeout_seconds
        self._freed = start is None             # Prequest(): the null request

    def Start(self) -> None:
        if self._freed:
            raise InvalidArgument(f"{self.desc}: the persistent request was freed")
        if self._active is not None:
            raise InvalidArgument(f"{self.desc}: Start of a request that is still active "
                                  "(Wait for it first)")
        self._active = self._start()

    @staticmethod
    def Startall(requests) -> None:
        for r in requests:
            r.Start()

    @property
    def _done(self) -> bool:
        return self._active is None or self._active._done

    @property
    def driver(self):
        return None if self._active is None else self._active.driver

    def Wait(self, status=None, timeout: float | None = None) -> bool:
        """Wait for the current run (at once if none is active); True, as Request.Wait."""
        req = self._active
        if req is None:
            return Request().Wait(status)
        try:
            return req.Wait(status, timeout)
        finally:
            if req._done:
                self._active = None

    def Test(self, status=None) -> bool:
        req = self._active
        if req is None:
            return True
        if not req._done:
            return False
        self._active = None
        req.Test(status)
        return True

    def Free(self) -> None:
        if self._active is not None:
            raise InvalidArgument(f"{self.desc}: Free of an active request (Wait first)")
        self._freed = True

    def Cancel(self) -> None:
        """Cancel the current run, as :meth:`Request.Cancel` (a receive nothing matched)."""
        if self._active is not None:
            self._active.Cancel()

    cancel = Cancel

    def Get_status(self, status=None) -> bool:
        if self._active is None:
            return Request().Get_status(status)
        return self._active.Get_status(status)

    @property
    def result(self):
        return None if self._active is None else self._active.result

    @property
    def _is_null(self) -> bool:
        return self._freed

    @property
    def _inactive(self) -> bool:
        return self._active is None

    def __bool__(self) -> bool:
        return not self._freed

    __eq__ = _is_null_eq
    __hash__ = None

    def __repr__(self) -> str:
        state = "active" if self._active is not None else "inactive"
        return f"<polycast.Prequest {self.desc} ({state})>"


# mpi4py's Prequest is a Request: the class methods over many requests are the same.
for _name in ("Waitall", "Testall", "Waitany", "Testany", "Waitsome", "Testsome", "waitall",
              "testall", "waitany", "testany", "waitsome", "testsome"):
    setattr(Prequest, _name, staticmethod(getattr(Request, _name)))


def _persistent(name: str, nonblocking: str):
    def init(self, *args, **kwargs) -> Prequest:
        if self._freed:
            raise InvalidArgument(f"{self!r} was freed")
        start = getattr(self, nonblocking)
        return Prequest(lambda: start(*args, **kwargs), f"rank {self.rank}: {name}",
                        self.timeout_seconds)
    init.__name__ = init.__qualname__ = name
    init.__doc__ = (f"A persistent :meth:`{nonblocking}`: the same arguments; returns a "
                    ":class:`Prequest` to Start and Wait again and again.")
    return init


class PersistentCollectives:
    """Mixed into :class:`polycast.Comm`: ``<Collective>_init`` for every buffer
    collective that has an ``I``-form, and the point-to-point ``Send_init`` (``Ssend``,
    ``Bsend``, ``Rsend``) and ``Recv_init``."""


for _name in ("Bcast", "Reduce", "Allreduce", "Allgather", "Reduce_scatter_block",
              "Scatter", "Gather", "Alltoall", "Barrier", "Allgatherv", "Gatherv",
              "Scatterv", "Alltoallv", "Reduce_scatter", "Scan", "Exscan",
              "Send", "Ssend", "Bsend", "Rsend", "Recv"):
    setattr(PersistentCollectives, f"{_name}_init",
            _persistent(f"{_name}_init", f"I{_name.lower()}"))
