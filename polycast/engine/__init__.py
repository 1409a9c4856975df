"""polycast.engine: the sans-I/O per-rank state machine, its wire format and actions.

The driver's side of the contract (the runtime's progress thread and the simulator follow
it; ``tests/world.py`` is a complete small driver):

* One :class:`Engine` per (rank, communicator). Feed it events with your clock's ``now``
  (seconds): ``post``, ``on_message``, ``on_datagram`` (raw bytes) or
  ``on_datagram_header`` (pre-parsed), ``on_send_done``, ``on_timer``, ``on_peer_lost``.
  Carry out the returned actions **in order** (a Deliver must land before a later Send of
  the same memory), and finish one list before carrying out the actions of another engine
  call (an ``on_send_done`` made while executing a list must queue its actions behind the
  rest of that list).
* ``Send``: write ``header.pack(secret, payload)`` then the payload (``payload`` Region
  gathered, or the inline ``data`` bytes when ``payload`` is None) to ``peer`` over the
  reliable channel, in order per peer; call ``on_send_done(token)`` when the memory may be
  reused. ``header.payload_nbytes`` bytes follow the header on the wire.
* Reading: ``parse_header(first header_nbytes(secret) bytes, secret)``, read
  ``payload_nbytes`` more bytes, ``verify_mac(header, payload, secret)``, then
  ``on_message(src, header, payload)``. The engine may keep the payload object until it
  returns it in a ``Deliver``: pass memory you will not overwrite (a copy).
* ``Multicast``: send ``header.pack(secret, payload) + payload`` to the group, not before
  ``not_before``; datagrams may be lost. The engine drops its own looped-back datagrams.
* ``SetTimer``: call ``on_timer(timer)`` at the absolute ``deadline``; a later SetTimer of
  the same id moves it; ``CancelTimer`` removes it.
* ``Complete``/``Fail``: the request is over; its buffers may be reused (for AVG call
  ``polycast.memory.Buffers.finalize`` on Complete).
* ``EngineConfig.external_streams`` (the offload's multicast workers): datagrams go to a
  placer, not to the engine. An MRECV step that starts emits ``OpenStream`` (the placer
  may write the stream's chunks from now on); feed what the placer wrote with
  ``on_stream_progress``; recovered bytes come out as ``StreamData`` for the placer to
  write; ``CloseStream`` means write nothing more (it precedes the request's ``Fail``).
  An MCAST step emits one ``MulticastChunks`` (the whole stream, paced per chunk) instead
  of a ``Multicast`` per chunk: the driver builds the datagrams.
* Large point-to-point payloads (over ``EngineConfig.eager_max_nbytes``, 256 KiB) go by an
  RTS/CTS rendezvous inside the engine: a driver sees only more small Sends (kinds RTS and
  CTS, no payload) and needs no change. ``Engine.set_eager_limits`` raises the limit per
  peer (the runtime: 1 MiB between ranks on shared-memory rings), for point-to-point
  messages and for calls of at most ``max_early_nbytes`` / 8; both ends of a pair must use
  the same value. Drivers that model eager sends with an unbounded
  early buffer (the simulator) set ``eager_max_nbytes`` huge; the runtime honours
  ``POLYCAST_EAGER_MAX_NBYTES`` and ``POLYCAST_MAX_EARLY_NBYTES``.
  ``Engine.set_pull_peers`` skips the RTS/CTS for a collective's large messages to peers
  whose transport lets the receiver hold a payload unread (its ``hold()``; the runtime's
  single-copy descriptors): the DATA goes at once, flagged ``F_PULL``, and the receiver
  treats it as the RTS. The driver then reports such a Send done when the receiver read
  it, and must ``release()`` a held payload whose Deliver it does not carry out.
* ``post(..., dtype=, op=)``: pass the same strings on every rank (``str(array.dtype)``);
  they are part of the call signature that detects mismatched calls.
"""

from .actions import (Action, CancelTimer, CloseStream, Complete, Copy, Deliver, Fail,
                      Multicast, MulticastChunks, OpenStream, Region, Send, SetTimer, StreamData)
from .engine import Engine, EngineConfig, EngineStats
from .wire import (HEADER_NBYTES, MAC_NBYTES, Header, MsgKind, header_nbytes, parse_datagram,
                   parse_header, verify_mac)

__all__ = ["Action", "CancelTimer", "Complete", "Copy", "Deliver", "Fail", "Multicast",
           "MulticastChunks",
           "Region", "Send", "SetTimer", "OpenStream", "StreamData", "CloseStream", "Engine",
           "EngineConfig", "EngineStats",
           "HEADER_NBYTES", "MAC_NBYTES", "Header", "MsgKind", "header_nbytes",
           "parse_datagram", "parse_header", "verify_mac"]
