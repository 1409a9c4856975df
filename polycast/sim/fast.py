"""The fast path: a simulation's timing without stepping the engines, checked exact.

The engine-driven simulation (:class:`~polycast.sim.driver.Simulation` stepping one
:class:`~polycast.engine.engine.Engine` per rank) is the reference. Without loss, NIC
queues, timeouts or failures, what the engines do with a schedule is fixed: a step starts
when its dependencies are done; a SEND goes on its channel (FIFO per sender and peer),
drains at its flow's rate and is done then, its message arriving one path latency later;
a RECV is done when its step has started and its message has arrived; a COPY at once; an
MCAST paces its datagrams (the engine's pacer) and goes as one flow on the root's tree
when its channel is free, an MRECV is done when its stream has arrived; a multicast
collective then sends FIN to the ring successor and completes once it has FIN from its
predecessor. That makes the run a graph — steps, and the channels', pacers' and matches'
edges between them — whose times are one longest-path walk, done here level by level over
numpy arrays (every rank's ring step at once) instead of one Python event per message.

The walk assumes two things the event loop decides on the fly, and then checks both:

* **Channel order.** The messages of a channel leave in the order their steps started;
  the walk assumes an order (program order at first), computes the start times, and if
  they order a channel otherwise walks again in that order (until it settles).
* **No binding contention.** Every flow is assumed to move at its solo rate (its path's
  slowest link, or its pacing cap). Max-min fair sharing gives every flow its solo rate
  exactly when, on every link, the solo rates of the flows in flight at once fit the
  link's capacity: that is checked for every link that more than one channel uses.

When a check fails (a rank sending to two peers through one port, an alltoall colliding
on uplinks, in-network reduction) the fast path refuses with the reason and the
simulation runs on the engines: one protocol, one answer. ``tests/test_sim_fast.py``
compares both on every registered algorithm (the equality grid).

Where it lives: this module decides (refusals, then the modes in turn: :mod:`.fast_stream`,
the walk, :mod:`.fast_events`); :mod:`.fast_plan` builds the graph and its routes, flows
and edges; :mod:`.fast_walk` walks it, settles the channel order and runs the checks.
"""

from __future__ import annotations

from .errors import SimulationError
from . import fast_stream
from .fast_events import run_events
from .fast_kinds import Refused
from .fast_plan import _Graph, _Plan

__all__ = ["Refused", "refusal", "run", "static_refusal"]


def static_refusal(loss: float = 0.0, nic=None, record: bool = False) -> str | None:
    """What of a run's configuration alone sends it to the engines (known before any work;
    a NIC model is not: the fast path runs it until its queue drops a datagram)."""
    if loss:
        return "loss injection runs the engines' recovery"
    if record:
        return "recording per-message timelines runs the engines"
    return None


def refusal(sim) -> str | None:
    """Why ``sim`` (posted, not run) must run on the engines, or None."""
    cfg = sim.cfg
    why = static_refusal(cfg.loss, cfg.nic, cfg.record)
    if why:
        return why
    if sim.on_complete is not None or sim._calls:
        return "callbacks (on_complete, call_at) run the engines"
    if sim._unposted:
        return "requests not posted by every member run the engines"
    if any(ev[2] != 5 for ev in sim._heap):           # engine_loop._POST
        return "the simulation already ran"
    for q in sim._innet:
        if sim._reqs[q][2]:
            return "in-network reduction on a sub-communicator runs the engines"
    if cfg.nic is not None and any(comm for _, _, comm in sim._reqs):
        return "the NIC model on a sub-communicator runs the engines"
    for sched, _, comm in sim._reqs:
        if sched.nranks < 2:
            return "a one-rank collective runs the engines"
    return None


def _check_post_order(sim) -> None:
    """Members of a communicator post its requests in one order (the engines number them
    by order): the same error as the engines give, before anything runs."""
    order: dict[int, list] = {}
    for ev in sorted(sim._heap):                    # (t, seq, _POST, endpoint, req, _)
        order.setdefault(ev[3], []).append(ev[4])
    for comm, eps in enumerate(sim._comm_eps):
        seqs = {tuple(order.get(e, ())) for e in eps}
        if len(seqs) > 1:
            raise SimulationError(f"members of communicator {comm} post its requests in "
                                  "different orders (members must post a communicator's "
                                  "requests in the same order)")


def run(sim) -> str:
    """Time ``sim``'s posted requests without engines; fill its timelines, link bytes and
    counters as :meth:`Simulation.run` would. Returns the mode that ran: ``stream`` (one
    template request timed position by position, :mod:`.fast_stream`), ``walk`` (the
    graph walk, its checks passed) or ``events`` (the flows' events, for runs whose flows
    contend). Raises :class:`Refused` before changing anything when neither covers the
    run."""
    why = refusal(sim)
    if why:
        raise Refused(why)
    _check_post_order(sim)
    t = fast_stream.form_of(sim)
    if t is not None:
        try:
            return fast_stream.run(sim, t)
        except Refused as e:
            sim.fast_stream_refused = str(e)
            fast_stream.walk_fits(sim, str(e))
    g = _Graph(sim)
    if g.nsteps > sim.cfg.max_events:
        raise SimulationError(f"more than {sim.cfg.max_events} events; raise "
                              "SimConfig.max_events for a bigger run")
    plan = _Plan(sim, g)
    try:
        if sim._innet:
            raise Refused("in-network reduction combines flows in the switches")
        if sim.cfg.nic is not None:
            raise Refused("the NIC model's queues change with every flow")
        times = plan.settled_walk()
        plan.check_contention(times)
        plan.check_recovery(times)
    except Refused as e:
        sim.fast_walk_refused = str(e)
    else:
        plan.commit(times)
        return "walk"
    # (out of the except block: its traceback would keep the last walk's rows alive)
    plan._bufs = times = None               # the walk's rows (times are views of them)
    plan.drop_walk_edges()
    run_events(sim, plan)
    return "events"
