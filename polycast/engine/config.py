"""The engine's configuration (validated once, at construction) and its counters.

Units are in the names: ``_nbytes`` bytes, ``_s`` seconds, ``_gbps`` Gbit/s. Counters in
:class:`EngineStats` only ever describe what this engine did or dropped; nothing reads them
to decide protocol behaviour except ``early_nbytes`` (the early buffer's budget).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..errors import InvalidArgument

MIB = 1 << 20


@dataclass
class EngineConfig:
    mtu_nbytes: int = 8192                  # max datagram payload
    pacing_gbps: float | None = None        # multicast pacing rate (None: no pacing)
    eos_repeats: int = 3
    recovery_timeout_s: float = 0.05        # coarse-timeout floor when EOS is lost ...
    line_rate_gbps: float = 10.0            # ... plus 2x the multicast bytes at this rate
    op_timeout_s: float = 60.0              # every request fails after this
    max_early_nbytes: int = 64 * MIB        # bound on held messages and datagrams
    secret: bytes | None = None             # keyed BLAKE2 MAC on every message
    pacing_min_fraction: float = 0.1        # loss adaptation never slows below this share
    # Larger SEND payloads go by rendezvous (RTS/CTS), so a late receiver holds headers, not
    # payloads. Below the runtime's ~1 MiB blocks, so every block of a large call is
    # covered; measured (4 local ranks, ring allgather 1-16 MiB, shm and tcp) within run-to-
    # run noise of all-eager, since a RECV that starts first clears its sender unasked.
    # 256 KiB, not 64: a 64-256 KiB payload crosses the shm ring byte by byte anyway, and its
    # RTS/CTS round trip was most of its cost (4 local ranks, 1 MiB allgather and allreduce,
    # 256 KiB blocks: 9-15 % more busbw, 10-20 % less CPU a rank; TCP alike). Payloads that go
    # single-copy (runtime/transport/cma.py, from 512 KiB) stay rendezvous: sent eagerly, 14-43 % of
    # them reached a 4-rank allgather's receiver before its call and were copied twice.
    eager_max_nbytes: int = 256 * 1024
    # Multicast chunks are placed by someone else (the offload's receive workers): MRECV
    # steps emit OpenStream and take on_stream_progress; recovered data goes out as
    # StreamData; see polycast.engine.mcast.
    external_streams: bool = False

    def validate(self) -> None:
        def bad(name: str, why: str):
            raise InvalidArgument(f"EngineConfig.{name}={getattr(self, name)!r}: {why}")
        if not isinstance(self.mtu_nbytes, int) or not 64 <= self.mtu_nbytes <= 65000:
            bad("mtu_nbytes", "must be an integer in 64..65000 (a UDP payload)")
        if self.pacing_gbps is not None and not self.pacing_gbps > 0:
            bad("pacing_gbps", "must be > 0 or None")
        if not isinstance(self.eos_repeats, int) or not 1 <= self.eos_repeats <= 64:
            bad("eos_repeats", "must be an integer in 1..64")
        for name in ("recovery_timeout_s", "op_timeout_s", "line_rate_gbps"):
            if not getattr(self, name) > 0:
                bad(name, "must be > 0")
        if not isinstance(self.max_early_nbytes, int) or self.max_early_nbytes < 0:
            bad("max_early_nbytes", "must be a non-negative integer")
        if self.secret is not None and not isinstance(self.secret, (bytes, bytearray)):
            bad("secret", "must be bytes or None")
        if self.secret is not None and not 1 <= len(self.secret) <= 64:
            bad("secret", "BLAKE2b keys are 1..64 bytes")
        if not isinstance(self.eager_max_nbytes, int) or self.eager_max_nbytes < 0:
            bad("eager_max_nbytes", "must be a non-negative integer (bytes; larger SEND "
                "payloads use the RTS/CTS rendezvous)")
        if not 0 < self.pacing_min_fraction <= 1:
            bad("pacing_min_fraction", "must be in (0, 1]")
        if not isinstance(self.external_streams, bool):
            bad("external_streams", "must be True or False")


@dataclass
class EngineStats:
    messages_in: int = 0
    messages_out: int = 0
    message_bytes_in: int = 0
    message_bytes_out: int = 0
    datagrams_in: int = 0
    datagrams_out: int = 0
    datagram_bytes_in: int = 0
    datagram_bytes_out: int = 0
    control_messages_out: int = 0           # FIN, RECOVER_REQ, ABORT, RTS, CTS
    rts_out: int = 0                        # rendezvous SENDs announced
    pull_out: int = 0                       # rendezvous SENDs sent for the peer to pull
    pull_held: int = 0                      # pulled DATAs held unread (RECV not started)
    cts_out: int = 0                        # RTS answered
    cts_granted_early: int = 0              # ... before their RECV started (bytes reserved)
    cts_ahead_out: int = 0                  # CTS sent unasked as a large RECV started
    rts_crossed: int = 0                    # RTS that crossed our unasked CTS (expected)
    fins_out: int = 0
    drops: dict[str, int] = field(default_factory=dict)   # reason -> count
    recovery_requests: int = 0              # RECOVER_REQ sent
    recovery_served: int = 0                # RECOVER_DATA sent
    recovery_deferred: int = 0              # requests answered only after own recovery
    recovered_bytes: int = 0                # multicast bytes that came by recovery
    timeouts: int = 0
    aborts_out: int = 0
    completed: int = 0
    failed: int = 0
    replayed: int = 0                       # calls run whole by the compiled replay
    replay_adopted: int = 0                 # ... begun there, finished by the engine
    early_nbytes: int = 0                   # held now
    early_peak_nbytes: int = 0
    pacing_gbps: float | None = None        # current (adapted) pacing rate

    def drop(self, reason: str) -> None:
        self.drops[reason] = self.drops.get(reason, 0) + 1

    @property
    def dropped(self) -> int:
        return sum(self.drops.values())
