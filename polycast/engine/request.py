"""Per-request state: one posted collective as this rank's engine progresses it."""

from __future__ import annotations

from collections import deque

# A step's state: not started (waiting on dependencies, or ready), started, done.
PENDING, STARTED, DONE = 0, 1, 2


class Request:
    """One posted collective's progress on this rank: step states, what is held for its
    steps, its multicast streams, timers and outstanding sends. Plain state: the engine's
    modules (engine, rendezvous, mcast, failure) read and write it."""

    __slots__ = ("req", "seq", "sched", "prog", "plan", "itemsize", "sig", "_desc", "state",
                 "ndeps", "ndone", "ready", "held", "held_nbytes", "streams", "mrecv_left",
                 "multicast", "fin_sent", "fin_received", "outstanding", "deadline",
                 "rec_timer", "pace_timers", "eos_timers", "rto", "mcast_bytes_in",
                 "recovered_nbytes", "mcast_bytes_out", "served_own_nbytes", "tokens",
                 "mismatch", "mis_timer", "rts_wait", "rdv", "granted", "cts_early",
                 "cts_ahead", "replayed", "written", "eager")

    def __init__(self, req, seq, sched, plan, itemsize, sig, desc):
        self.req, self.seq, self.sched, self.plan = req, seq, sched, plan
        self.prog = None
        self.itemsize, self.sig, self._desc = itemsize, sig, desc
        self.eager = None               # per peer, the largest message sent eager
        self.state = [PENDING] * len(plan.ndeps)
        self.ndeps = list(plan.ndeps)
        self.ndone = 0
        self.ready = deque()
        self.held = {}                  # (src, tag) -> (header, payload): RECV not started
        self.held_nbytes = 0
        self.streams = {}               # (root, ordinal) -> mcast.Stream
        self.mrecv_left = plan.n_mrecv
        self.multicast = plan.multicast
        self.fin_sent = self.fin_received = False
        self.outstanding = 0            # Sends not yet reported done
        self.deadline = 0.0             # when it times out (the engine's watchdog)
        self.rec_timer = None
        self.pace_timers = {}           # timer -> step index (paced MCAST completions)
        self.eos_timers = []            # our streams' spaced EOS repeats still to send
        self.rto = 0.0
        self.mcast_bytes_in = 0
        self.recovered_nbytes = 0
        self.mcast_bytes_out = 0        # our own streams' bytes, multicast
        self.served_own_nbytes = 0      # ... and re-sent by unicast: the loss others saw
        self.tokens = set()
        self.mismatch = None            # our MismatchError text, while awaiting the other call
        self.mis_timer = None
        self.rts_wait = None            # (peer, tag) -> SEND step index awaiting its CTS
        self.rdv = None                 # (src, tag) of RECVs whose RTS was accepted
        self.granted = None             # (src, tag) -> bytes reserved by an early CTS
        self.cts_early = None           # (peer, tag): CTS that came before the SEND started
        self.cts_ahead = None           # (src, tag): CTS sent unasked as the RECV started
        self.replayed = 0               # steps a compiled replay did (a bit per step)
        self.written = None             # step -> token: pulled SENDs it wrote, not yet read

    @property
    def desc(self) -> str:
        """The call, for error messages: formatted on first use, not on every post (where it
        was a visible share of a small collective's engine time). ``_desc`` holds (dtype, op)
        until then."""
        d = self._desc
        if isinstance(d, tuple):
            d = self._desc = describe(self.sched, self.req, self.seq, *d)
        return d


def describe(sched, req: int, seq: int, dtype: str, op: str) -> str:
    """A posted call, as errors name it."""
    return (f"{sched.collective} {sched.algorithm} (request {req}, seq {seq}, "
            f"P={sched.nranks}, count={sched.count}, root={sched.root}"
            + (f", {dtype}" if dtype else "") + (f", op={op}" if op else "") + ")")
