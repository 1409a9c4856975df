"""Point-to-point messages with mpi4py's signatures, through the engine's matching
(:mod:`polycast.engine.p2p`: source and tag, ANY_SOURCE / ANY_TAG, non-overtaking, large
messages by rendezvous) on every transport.

>>> comm.Send(x, dest=1, tag=7)                     # buffers, as the collectives take
>>> st = polycast.Status()
>>> comm.Recv(y, source=polycast.ANY_SOURCE, tag=7, status=st); st.Get_source()
>>> req = comm.Isend(x, 1); req.Wait()
>>> comm.send({"a": 1}, dest=1); obj = comm.recv(source=0)    # any picklable object

A receive's buffer must have room for the message (a longer one is MPI's truncation error,
InvalidArgument on the receiver and, for a large message, on the sender); its bytes are
taken as the receive buffer's dtype. ``PROC_NULL`` as a peer makes a call that completes at
once and moves nothing. Every request is bounded by the communicator's timeout.
"""

from __future__ import annotations

import pickle
import warnings

import numpy as np

from ..engine.p2p import ANY_SOURCE, ANY_TAG
from ..errors import CollectiveTimeout, InvalidArgument
from ..runtime.driver.request import PROC_NULL, Request, Status  # noqa: F401  (comm's API)
from ..buffers import message
from .message import MESSAGE_NO_PROC, Message

TAG_UB = 0x7FFFFFFF
_EMPTY = np.empty(0, np.uint8)


def _dumps(obj) -> np.ndarray:
    return np.frombuffer(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL), np.uint8)


def _loads(data: np.ndarray):
    """An object message's object: a pickle (any pickle protocol, so a buffer message
    holding ``pickle.dumps(obj)`` is received as ``obj``); None for an empty message."""
    return pickle.loads(data.tobytes()) if data is not None and data.nbytes else None


class PointToPointMethods:
    """Mixed into :class:`polycast.Comm`; uses its ``_driver``, ``id``, ``rank``, ``size``."""

    def _peer(self, peer, what: str, wildcard: bool) -> int:
        if isinstance(peer, (bool, np.bool_)) or not isinstance(peer, (int, np.integer)):
            raise InvalidArgument(f"{what} must be a rank (int), got {peer!r}")
        peer = int(peer)
        if 0 <= peer < self.size or peer == PROC_NULL or (wildcard and peer == ANY_SOURCE):
            return peer
        raise InvalidArgument(f"{what} {peer} out of range: valid ranks are 0..{self.size - 1}"
                              + (", ANY_SOURCE" if wildcard else "") + " or PROC_NULL")

    def _tag(self, tag, wildcard: bool) -> int:
        if isinstance(tag, (bool, np.bool_)) or not isinstance(tag, (int, np.integer)):
            raise InvalidArgument(f"tag must be an int, got {tag!r}")
        tag = int(tag)
        if 0 <= tag <= TAG_UB or (wildcard and tag == ANY_TAG):
            return tag
        raise InvalidArgument(f"tag {tag} out of range: 0..{TAG_UB}"
                              + (" or ANY_TAG" if wildcard else ""))

    def _p2p_request(self, what: str) -> Request:
        if self._freed:
            raise InvalidArgument(f"{self!r} was freed")
        rank = self.rank
        return Request(self._driver.new_request_id(), self.id, lambda: f"rank {rank}: {what}",
                       self.timeout_seconds)

    def _null(self, what: str) -> Request:
        req = Request(0, self.id, f"rank {self.rank}: {what} (PROC_NULL)",
                      self.timeout_seconds)
        req.status = (PROC_NULL, ANY_TAG, 0)
        req._finish()
        return req

    # -- buffers ---------------------------------------------------------------------------
    def Isend(self, buf, dest: int, tag: int = 0) -> Request:
        return self._isend(buf, dest, tag, False)

    def Issend(self, buf, dest: int, tag: int = 0) -> Request:
        """Synchronous send: completes only once a receive has matched the message."""
        return self._isend(buf, dest, tag, True)

    def Ibsend(self, buf, dest: int, tag: int = 0) -> Request:
        """Buffered send: the message is copied and the request completes at once (the
        copy is sent as the receiver takes it; polycast keeps the copy itself, so
        ``Attach_buffer`` is not needed)."""
        if dest == PROC_NULL:
            return self._null("Bsend")
        data = message(buf, "Send buf").copy()
        self._isend(data, dest, tag, False)
        req = self._p2p_request(f"Bsend to rank {dest}, tag {tag}")
        req._finish()
        return req

    def _isend(self, buf, dest, tag, sync: bool) -> Request:
        dest, tag = self._peer(dest, "dest", False), self._tag(tag, False)
        if dest == PROC_NULL:
            return self._null("Send")           # any buffer, None too (as mpi4py)
        data = _EMPTY if buf is None else message(buf, "Send buf")   # None: empty message
        req = self._p2p_request(f"{'Ssend' if sync else 'Send'} of {data.nbytes} bytes to "
                                f"rank {dest}, tag {tag}")
        if sync:
            self._driver.post_send(self.id, req, dest, tag, data, sync=True)
            return req
        if dest == self.rank and data.nbytes <= self._driver.engine_config.eager_max_nbytes:
            # To itself, small: buffered, as MPI implementations do, so a Send to self
            # returns before its Recv is posted.
            inner = self._p2p_request(f"Send to self, tag {tag}")
            self._driver.post_send(self.id, inner, dest, tag, data.copy())
            req._finish()
            return req
        self._driver.post_send(self.id, req, dest, tag, data)
        return req

    def Irecv(self, buf, source: int = ANY_SOURCE, tag: int = ANY_TAG) -> Request:
        source, tag = self._peer(source, "source", True), self._tag(tag, True)
        if source == PROC_NULL:
            return self._null("Recv")
        data = message(buf, "Recv buf", writable=True) if buf is not None else None
        src = "ANY_SOURCE" if source == ANY_SOURCE else f"rank {source}"
        req = self._p2p_request(f"Recv from {src}, tag "
                                f"{'ANY_TAG' if tag == ANY_TAG else tag}")
        self._driver.post_recv(self.id, req, source, tag, data)
        return req

    def Send(self, buf, dest: int, tag: int = 0) -> None:
        self.Isend(buf, dest, tag).Wait()

    def Ssend(self, buf, dest: int, tag: int = 0) -> None:
        self.Issend(buf, dest, tag).Wait()

    def Bsend(self, buf, dest: int, tag: int = 0) -> None:
        self.Ibsend(buf, dest, tag).Wait()

    # Ready mode: the receive is known to be posted; a standard send is a valid one.
    Rsend, Irsend = Send, Isend

    def Recv(self, buf, source: int = ANY_SOURCE, tag: int = ANY_TAG, status=None) -> None:
        self.Irecv(buf, source, tag).Wait(status)

    def Sendrecv(self, sendbuf, dest: int, sendtag: int = 0, recvbuf=None,
                 source: int = ANY_SOURCE, recvtag: int = ANY_TAG, status=None) -> None:
        self.Isendrecv(sendbuf, dest, sendtag, recvbuf, source, recvtag).Wait(status)

    def Isendrecv(self, sendbuf, dest: int, sendtag: int = 0, recvbuf=None,
                  source: int = ANY_SOURCE, recvtag: int = ANY_TAG) -> Request:
        """Non-blocking Sendrecv: one request, done when both halves are (its status is
        the receive's)."""
        rreq = self.Irecv(recvbuf, source, recvtag)
        sreq = self.Isend(sendbuf, dest, sendtag)
        return self._both(sreq, rreq, "Isendrecv")

    def Isendrecv_replace(self, buf, dest: int, sendtag: int = 0, source: int = ANY_SOURCE,
                          recvtag: int = ANY_TAG) -> Request:
        data = _EMPTY if buf is None else message(buf, "buf", writable=True)
        tmp = np.empty_like(data)
        rreq = self.Irecv(tmp, source, recvtag)
        sreq = self.Isend(data.copy(), dest, sendtag)
        req = self._both(sreq, rreq, "Isendrecv_replace")
        prev = req.on_done

        def place():
            prev()
            n = req.status[2] // max(data.itemsize, 1) if req.status else data.size
            data[:n] = tmp[:n]
        req.on_done = place
        return req

    def _both(self, sreq: Request, rreq: Request, what: str) -> Request:
        req = self._p2p_request(what)
        pending = [2]

        def one_done(_r):
            pending[0] -= 1
            if pending[0] == 0:
                req.status = rreq.status
                req._finish(sreq.error or rreq.error)
        for r in (sreq, rreq):
            r.add_done_callback(one_done)

        def finish_parts():
            sreq.Wait()
            rreq.Wait()
            req.status = rreq.status
        req.on_done = finish_parts
        req.driver = sreq.driver or rreq.driver
        return req

    def Sendrecv_replace(self, buf, dest: int, sendtag: int = 0, source: int = ANY_SOURCE,
                         recvtag: int = ANY_TAG, status=None) -> None:
        self.Isendrecv_replace(buf, dest, sendtag, source, recvtag).Wait(status)

    def Iprobe(self, source: int = ANY_SOURCE, tag: int = ANY_TAG, status=None) -> bool:
        return self._probe(source, tag, status, False) is not None

    def _probe(self, source, tag, status, take: bool):
        """(source, tag, nbytes[, handle]) of the first message a receive would take (out
        of matching when ``take``: a matched probe), PROC_NULL's empty one, or None."""
        source, tag = self._peer(source, "source", True), self._tag(tag, True)
        if source == PROC_NULL:
            found = (PROC_NULL, ANY_TAG, 0, None)
        else:
            if self._freed:
                raise InvalidArgument(f"{self!r} was freed")
            found = self._driver.iprobe(self.id, source, tag, take=take)
        if found is not None and status is not None:
            status._fill(*found[:3])
        return found

    def Probe(self, source: int = ANY_SOURCE, tag: int = ANY_TAG, status=None) -> bool:
        """Wait (at most the communicator's timeout) for a message a receive would take."""
        return self._poll(self.Iprobe, "Probe", source, tag, status)

    def Improbe(self, source: int = ANY_SOURCE, tag: int = ANY_TAG,
                status=None) -> Message | None:
        """A matched probe (MPI_Improbe): the first message a receive would take, taken
        out of matching as a :class:`~polycast.comm.message.Message` to ``Recv``; None
        when there is none now."""
        found = self._probe(source, tag, status, True)
        if found is None:
            return None
        return MESSAGE_NO_PROC if found[0] == PROC_NULL else Message._taken(self, found[3])

    def Mprobe(self, source: int = ANY_SOURCE, tag: int = ANY_TAG, status=None) -> Message:
        """:meth:`Improbe`, waiting (at most the communicator's timeout) for a message."""
        return self._poll(self.Improbe, "Mprobe", source, tag, status)

    # objects: the Message's recv()/irecv() give the object
    improbe, mprobe = Improbe, Mprobe

    def _poll(self, probe, what: str, source, tag, status):
        import time
        deadline = time.monotonic() + self.timeout_seconds
        nap = 20e-6
        while not (found := probe(source, tag, status)):
            if time.monotonic() > deadline:
                raise CollectiveTimeout(f"rank {self.rank}: {what}(source={source}, tag={tag}) "
                                        f"found no message in {self.timeout_seconds:g} s")
            time.sleep(nap)
            nap = min(nap * 2, 0.002)
        return found

    def _mrecv(self, handle, buf, objects: bool) -> Request:
        """Receive a probed message (``Message.Irecv``/``irecv``)."""
        data = None if objects or buf is None else message(buf, "Recv buf", writable=True)
        req = self._p2p_request("Mrecv of a probed message")
        if objects:
            req.on_done = lambda: _loads(req.result)
        self._driver.post_recv(self.id, req, -1, -1, data, message=handle)
        return req

    # -- objects (pickle) ------------------------------------------------------------------
    def isend(self, obj, dest: int, tag: int = 0) -> Request:
        return self.Isend(_dumps(obj), dest, tag)

    def send(self, obj, dest: int, tag: int = 0) -> None:
        self.isend(obj, dest, tag).Wait()

    def issend(self, obj, dest: int, tag: int = 0) -> Request:
        return self.Issend(_dumps(obj), dest, tag)

    def ibsend(self, obj, dest: int, tag: int = 0) -> Request:
        return self.Ibsend(_dumps(obj), dest, tag)

    def ssend(self, obj, dest: int, tag: int = 0) -> None:
        self.issend(obj, dest, tag).Wait()

    def bsend(self, obj, dest: int, tag: int = 0) -> None:
        self.ibsend(obj, dest, tag).Wait()

    def irecv(self, buf=None, source: int = ANY_SOURCE, tag: int = ANY_TAG) -> Request:
        """A request whose ``wait()`` returns the object (``buf`` is accepted for
        mpi4py's signature; the message is received into a buffer of its own size)."""
        source, tag = self._peer(source, "source", True), self._tag(tag, True)
        if source == PROC_NULL:
            req = self._null("recv")
            req.result = None
            return req
        req = self._p2p_request(f"recv of an object from "
                                f"{'ANY_SOURCE' if source == ANY_SOURCE else source}")
        req.on_done = lambda: None if req.cancelled else _loads(req.result)
        self._driver.post_recv(self.id, req, source, tag, None)
        return req

    def recv(self, buf=None, source: int = ANY_SOURCE, tag: int = ANY_TAG, status=None):
        """The next object from ``source`` with ``tag`` (None for an empty message).
        ``buf`` is ignored, with a UserWarning (as mpi4py, which deprecates it): the
        message is received into a buffer of its own size."""
        if buf is not None:
            warnings.warn("recv: the 'buf' argument is ignored (polycast receives an object "
                          "into a buffer of its size; mpi4py deprecates it)", UserWarning,
                          stacklevel=2)
        return self.irecv(None, source, tag).wait(status)

    def sendrecv(self, sendobj, dest: int, sendtag: int = 0, recvbuf=None,
                 source: int = ANY_SOURCE, recvtag: int = ANY_TAG, status=None):
        rreq = self.irecv(recvbuf, source, recvtag)
        sreq = self.isend(sendobj, dest, sendtag)
        try:
            sreq.Wait()
        finally:
            obj = rreq.wait(status)
        return obj

    def probe(self, source: int = ANY_SOURCE, tag: int = ANY_TAG, status=None) -> bool:
        return self.Probe(source, tag, status)

    def iprobe(self, source: int = ANY_SOURCE, tag: int = ANY_TAG, status=None) -> bool:
        return self.Iprobe(source, tag, status)

