"""Replaying a memoized call in the compiled helper (runtime/driver/_replay.c).

On the engine path a small collective costs one engine event per message, in Python, on
every rank (bench/floor.py measures it against MPICH's small-call latency on 2 cores).
When the engine has exported this rank's program of the
call (engine/replay.py) and every peer of it is on a compiled shm ring, :meth:`Replayer.run`
hands the helper the call's sequence number and arrays: it writes the SENDs' frames, waits
for and delivers (or reduces) the RECVs' frames, makes the COPYs, with the GIL released and
the progress lock held (so the progress thread cannot poll the same rings). Whatever it did
not expect it leaves unconsumed and stops; the engine then adopts the call in exactly the
state the helper left it (``Engine.post(..., replayed=mask)``) and the ordinary path goes
on: errors, mismatches, timeouts and lost peers are the engine's, on every rank.

Large calls too, when every message over the eager limit is a pulled DATA (between ranks
that read each other single-copy, engine/rendezvous.py): the helper writes the descriptors,
reads the peers' with process_vm_readv and acknowledges them, so a repeated 16 MiB allgather
runs its reads and copies with no Python between them (the replay=0 test hook runs the
same calls without it, for comparison). Python keeps
the single-copy seqs (``PeerIO._cma_seq``, passed in and advanced), takes over the
acknowledgements a full ring could not take, and maps a stopped run's written SENDs to their
engine tokens (``PeerIO.await_ack``). Such a run waits longer without input before it stops:
its peers may be reading its memory (``PULL_GBPS``).

Blocking and non-blocking calls alike run here, inside ``Driver.post`` (the inline post
of a small call; a large one's, on the progress thread): a call whose peers are there
completes before post returns (Wait finds it done); one whose peers are not stops after
the ``replay_wait_us`` test hook (2000) without input and is adopted. Waiting, the helper
follows the one wait policy (runtime/transport/wait.py): it looks at the rings, then yields
the core between looks (4 ranks on 2 cores: the peer it waits for may need it), then sleeps
on the rings' futex counters, woken by the peer's frame.
Off with the ``replay=0`` test hook (or the ``native=0`` test hook, or no compiler).
"""

from __future__ import annotations

import operator
import time

from ...config import Hooks
from ...engine.early import holding
from ...errors import PolycastError
from ...schedule.ir import Kind
from ..transport import native
from ..transport.shm import SLEEP_SELECT
from ..transport.wait import policy as wait_policy

# Why a replay stopped (runtime/driver/_replay.c's reasons, in order).
REASONS = ("done", "wait", "frame", "full", "doorbell", "overlap", "limit")
_DONE = 0
_READ_POS = operator.attrgetter("_read_pos")
FRAME_OVERHEAD_NBYTES = 12 + 44 + 16   # a ring frame's prefix, header and padding at most
# The slowest read of a pulled message a replay waits through without input (GB/s): a
# 4 MiB read takes ~1 ms on a quiet core, several with 4 ranks on 2.
PULL_GBPS = 0.5

_BUF = {"send": 0, "recv": 1, "tmp": 2}
_KIND = {Kind.SEND: 0, Kind.RECV: 1, Kind.COPY: 2}
# What the helper folds exactly as numpy does (dtype -> op -> code). Float min/max are left
# to numpy (its NaN rules); avg divides at the end (Buffers.finalize).
_DTYPES = {"float32": 0, "float64": 1, "int32": 2, "int64": 3}
_FLOAT_OPS = {"sum": 0, "prod": 1}
_INT_OPS = {"sum": 0, "prod": 1, "min": 2, "max": 3}


def _waits(cfg) -> tuple[float, tuple]:
    """(no input for this long: stop and let the engine adopt the call (the
    replay_wait_us test hook); how to wait meanwhile: the wait policy, as the helper takes
    it)."""
    return (max(0.0, cfg.hooks.replay_wait_us) * 1e-6, wait_policy(cfg).c_args)


def _held_payloads(held: list) -> list:
    """[(step, payload)] for the helper: a zero-length frame is held with no payload (None),
    which the helper takes as b"" (a barrier's frames, the entry barrier of rooted calls);
    a pulled DATA held unread as (address, nbytes, seq) in its sender's memory, which the
    helper reads and acknowledges."""
    out = []
    for h in held:
        payload = h[3]
        if payload is None:
            payload = b""
        elif holding(payload):
            payload = (payload.addr, payload.nbytes, payload.seq)
        out.append((h[0], payload))
    return out


def unavailable_reason(hooks=None) -> str | None:
    """Why calls are not replayed in a job with these test hooks (default: none set), or
    None."""
    if hooks is None:
        hooks = Hooks()
    if not hooks.replay:
        return "the replay=0 test hook"
    if not hooks.native:
        return "the native=0 test hook (the replay is the compiled rings')"
    if native.ring is None:
        return f"the compiled ring helper is not in use ({native.why_not})"
    if not hasattr(native.ring, "ReplayPlan"):
        return "the compiled ring helper predates the replay: rebuild it"
    return None


class _Entry:
    """One memoized call's replay: the helper's plan and the rings it reads and writes."""

    __slots__ = ("plan", "prog", "ins", "outs", "pairs", "world", "schedule", "pull_sends",
                 "waits")

    def __init__(self, plan, prog, ins, outs, world, schedule, waits) -> None:
        self.plan, self.prog, self.ins, self.outs, self.world = plan, prog, ins, outs, world
        self.pairs = tuple(zip(ins, outs))
        self.schedule = schedule
        # pulled SENDs (a bit per step): their descriptors go single-copy (peers.cma_sent)
        self.pull_sends = sum(1 << i for i, st in enumerate(prog.steps)
                              if st.pull and st.kind is Kind.SEND)
        self.waits = waits


class Replayer:
    """The replays of one communicator (a driver's CommState)."""

    def __init__(self, driver, cs) -> None:
        self.d, self.cs = driver, cs
        hooks = driver.config.hooks
        self.waits = _waits(driver.config)
        self.step_limit = hooks.replay_step_limit     # >= 0: stop after that many steps
        self._entries: dict[tuple, tuple] = {}     # key -> (schedule, _Entry or None)
        self._stops = [0] * len(REASONS)            # runs by how they ended

    def run(self, request, schedule, itemsize: int, dtype: str, op: str) -> bool:
        """Replay this call if it can be (call with the progress lock held); False when
        it was not touched (post it as usual)."""
        ent = self.entry(schedule, itemsize, dtype, op)
        if ent is None:
            return False
        arrays = self.d.buffers.arrays_of(request.req)
        if arrays is None:
            return False
        got = self.replay(ent, arrays.get("send"), arrays.get("recv"), arrays.get("tmp"))
        if got is None:
            return False
        reason, done, sent_nb, nrecv, recv_nb, written = got
        eng = self.cs.engine
        if reason == _DONE:
            eng.replayed(schedule, ent.prog, itemsize, dtype, op, request.req, sent_nb,
                         nrecv, recv_nb)
            request.replay = (schedule, itemsize, dtype, op)
            self.d.runner.complete(request.req)
            return True
        self.adopt(request.req, schedule, itemsize, dtype, op, done, written)
        return True

    def entry(self, schedule, itemsize: int, dtype: str, op: str):
        """The replay of this call's shape (made once), or None when it has none."""
        key = (id(schedule), itemsize, dtype, op)
        hit = self._entries.get(key)
        if hit is None or hit[0] is not schedule:      # ids are reused after GC: check
            hit = self._remember(key, schedule, self._make(schedule, itemsize, dtype, op))
        return hit[1]

    def replay(self, ent, send, recv, tmp, disjoint: bool = False):
        """One call's replay over ``ent`` with these arrays (progress lock held): None when
        nothing was done (something else is going on, or the helper refused the arrays:
        ``disjoint``, send and recv sharing memory), else (reason, done steps, bytes sent,
        frames taken from the rings, their bytes, written: [(step, seq)] of pulled SENDs
        out and not yet acknowledged, or None). A run that stopped part-way must be
        adopted (:meth:`adopt`) before anything else happens in the engine."""
        d = self.d
        eng = self.cs.engine
        peers = d.peers
        if peers.lost or peers.gone or peers._dirty or peers._want_bell:
            return None
        for rin, rout in ent.pairs:     # nothing pinned, in pieces or queued on its rings
            if rin._handed or rin._frag is not None or rout._out:
                return None
        held = eng.replay_begin(ent.schedule, ent.prog)
        if held is None:
            return None
        pos = list(map(_READ_POS, ent.ins))
        world = ent.world
        cseqs = [peers._cma_seq.get(w, 0) for w in world] if ent.pull_sends else None
        try:
            done, reason, doorbell, blocked, _, sent_nb, nrecv, recv_nb, written, owed, \
                nread = ent.plan.run(eng.next_seq & 0xFFFFFFFF, send, recv, tmp, pos,
                                     ent.waits or self.waits, peers.futex, self.step_limit,
                                     _held_payloads(held) if held else None, disjoint, cseqs)
        except (ValueError, TypeError, BufferError):
            eng.replay_give_back(held)
            return None             # arrays it cannot use: nothing was done
        for ring, p in zip(ent.ins, pos):
            ring._read_pos = p
        if cseqs is not None:
            for w, c in zip(world, cseqs):
                if w in peers._cma_seq:
                    peers._cma_seq[w] = c
            wmask = sum(1 << i for i, _ in written) if written else 0
            peers.cma_sent += ((done | wmask) & ent.pull_sends).bit_count()
        if nread:
            peers.cma_read += nread
        if owed:                    # acknowledgements its full rings could not take
            for s, sq in owed:
                peers.acknowledge(world[s], sq)
        while blocked:              # we freed ring space a writer waits for
            s = (blocked & -blocked).bit_length() - 1
            blocked &= blocked - 1
            peers._want_bell.add(world[s])
        while doorbell:             # a reader that sleeps in select needs a doorbell frame
            s = (doorbell & -doorbell).bit_length() - 1
            doorbell &= doorbell - 1
            peers._wake_reader(world[s], d.world.peers[world[s]], SLEEP_SELECT)
        self._stops[reason] += 1
        if held:
            used = [h for h in held if done >> h[0] & 1]
            for h in used:
                if holding(h[3]):
                    h[3].read_elsewhere()       # read and acknowledged by the helper
            if reason != _DONE:
                eng.replay_give_back([h for h in held if not done >> h[0] & 1])
                # counted as they came: the adopting post counts its replayed RECVs again
                eng.stats.messages_in -= len(used)
                eng.stats.message_bytes_in -= sum(h[2].length for h in used)
        if not done and not written:
            return None             # nothing done (a frame or a wait at once)
        return reason, done, sent_nb, nrecv, recv_nb, written

    def adopt(self, req: int, schedule, itemsize: int, dtype: str, op: str, done: int,
              written=None) -> None:
        """The engine takes over a call the helper stopped part-way, in exactly the state
        the ``done`` steps left it, with the ``written`` pulled SENDs ([(step, seq)]) out
        and waiting for their acknowledgement (request ``req``'s arrays registered, progress
        lock held)."""
        cs = self.cs
        d = self.d
        wmask = sum(1 << i for i, _ in written) if written else 0
        try:
            actions = cs.engine.post(req, schedule, itemsize, time.monotonic(), dtype=dtype,
                                     op=op, replayed=done, written=wmask)
        except PolycastError as exc:
            d.runner.fail_request(req, exc)
            return
        if written:
            # Their acknowledgements complete them as the driver's own single-copy sends'
            # do (peers._single_copy_done); the arrays stay registered until then.
            tokens = cs.engine.replay_tokens(req)
            arrays = d.buffers.arrays_of(req) or {}
            steps = self._steps_of(schedule, itemsize, dtype, op)
            for i, sq in written:
                st = steps[i]
                d.peers.await_ack(cs.members[st.peer], sq, (cs.id, tokens[i]),
                                  arrays.get(st.buf))
        d._run(cs, actions)

    def _steps_of(self, schedule, itemsize: int, dtype: str, op: str):
        ent = self.entry(schedule, itemsize, dtype, op)
        return ent.prog.steps

    def _remember(self, key, schedule, entry) -> tuple:
        if len(self._entries) >= 64:
            self._entries.pop(next(iter(self._entries)))
        hit = self._entries[key] = (schedule, entry)
        return hit

    def _make(self, schedule, itemsize: int, dtype: str, op: str):
        """The helper's plan of this call on this rank, or None when it cannot be one."""
        has_reduce = False
        ring = native.ring
        eng = self.cs.engine
        wpeers = self.d.world.peers
        # The smallest max piece of the rings involved bounds a message (frames above it
        # go in pieces, which only the Python reader reassembles).
        prog = eng.replay_program(schedule, itemsize, dtype, op, 1 << 62)
        if prog is None:
            return None
        ins, outs, world, slots = [], [], [], []
        slot_of = {}
        limit = 1 << 62
        pulls = {st.peer for st in prog.steps if st.pull}
        pull_nbytes = sum(st.nbytes for st in prog.steps if st.pull)
        for p in prog.peers:
            w = self.cs.members[p]
            peer = wpeers.get(w)
            if peer is None or peer.ring_in is None or peer.ring_out is None \
                    or peer.ring_in._nat is None or peer.ring_out._nat is None:
                return None
            pid = 0
            if p in pulls:          # we read it (process_vm_readv) and it reads us
                if not self.d.peers.pulls_to(w) or not peer.pid:
                    return None
                pid = peer.pid
            slot_of[p] = len(slots)
            slots.append((peer.ring_in._nat, peer.ring_out._nat, p, pid))
            ins.append(peer.ring_in)
            outs.append(peer.ring_out)
            world.append(w)
            limit = min(limit, peer.ring_in.max_piece, peer.ring_out.max_piece)
        steps = []
        for st in prog.steps:
            # a whole frame (prefix, header, payload, padding) within one ring piece (a
            # pulled DATA's frame is its descriptor)
            if st.kind is not Kind.COPY and not st.pull \
                    and st.nbytes + FRAME_OVERHEAD_NBYTES > limit:
                return None
            has_reduce |= st.reduce
            steps.append((_KIND[st.kind], slot_of.get(st.peer, 0), st.tag, _BUF.get(st.buf, 0),
                          st.offset, st.nbytes, _BUF.get(st.dst, 0), st.dst_offset,
                          st.reduce, st.ndeps, sum(1 << s for s in st.successors), st.pull))
        dt = op_code = -1
        if has_reduce:
            dt = _DTYPES.get(dtype, -1)
            op_code = (_FLOAT_OPS if dt in (0, 1) else _INT_OPS).get(op, -1)
            if dt < 0 or op_code < 0:
                return None
        plan = ring.ReplayPlan(self.cs.id, eng.rank, prog.sig, dt, op_code, slots, steps)
        waits = None
        if pull_nbytes:
            # Pulled messages are read by their receivers while we wait: no frame may come
            # for as long as the peers' reads take (PULL_GBPS each way), which is not a
            # stop. A late peer is still the engine's once this passes.
            w = self.waits
            waits = (w[0] + pull_nbytes / (PULL_GBPS * 1e9), w[1])
        return _Entry(plan, prog, ins, outs, world, schedule, waits)

    def counts(self) -> dict[str, int]:
        """Calls that went to the helper, by how they ended (tests and benchmarks)."""
        return dict(zip(REASONS, self._stops))
