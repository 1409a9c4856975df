"""``polycast sim fsdp``: an FSDP or HSDP training step, simulated layer by layer.

The step is the workload graph of :mod:`polycast.workload.fsdp` (FSDP2's order: forward
prefetch, backward allgather beside the next block's reduce-scatter, reshard after forward
but for the last block, the root unit, HSDP's replica allreduce, the optimizer), run by
:mod:`polycast.sim.pipeline` on the real engines: every layer's collectives and compute are
nodes of one simulation, sharing the network. Step time, bubble and exposed communication
per phase are measured in that run.

**Memo of repeated layers** (``memo=True``, the default). The blocks in the middle of the
model are identical, and after the first ones the pipeline settles into a period of one
block or two (ring allgather beside an in-network reduce-scatter alternates a long and a
short block). So the step is simulated in full at b, b+2 and b+4 blocks (b = 2 or 3, of
L's parity; then 4-5, 8-9, ... until the check holds), and every result -- each rank's end,
compute and exposed time per phase, link bytes per layer -- must be affine over the three
runs: each time's second difference within 1e-4 of the step or 10 us (``MEMO_RTOL``,
``MEMO_ATOL_S``), each byte count's within 1e-9. On one switch it is exact; on a fat tree a
rank's times may wobble by a microsecond from block to block (latencies differ by switch
hops), which is why times get a tolerance, and the extrapolation is off by about that
wobble per block it adds (tests/test_sim_pipeline.py measures it). Then the L-block step is
the b+4 run plus (L-b-4)/2 two-block steps. When no b < L-4 passes, the L-block step is
simulated in full. ``memo=False`` always simulates all L blocks.

**The composed formula** (``formula=True``, always with ``compare_fsdp``): what this
command printed before the pipeline existed, kept as a comparison column. It runs, alone,
one block's allgather, one reduce-scatter, and both posted together (the backward window,
T_win), and composes::

    forward  = T_ag + (L-1) max(c_f, T_ag) + c_f
    backward = T_ag + max(c_b, T_ag) + (L-2) max(c_b, T_win) + max(c_b, T_rs) + T_rs

It leaves out the root unit (embeddings and head: their allgather, reduce-scatter and
compute), the optimizer, the last block's reshard exception, the forward prefetch's limit,
the skew between ranks, and any interaction of a window with the next one
(docs/pipeline.md explains each difference over 2 %).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field, replace

from ..algorithms import build, get
from ..errors import InvalidArgument
from ..workload.fsdp import FsdpSpec, build_fsdp, plan_fsdp
from ..workload.models import MODELS, get_model
from .driver import SimConfig, Simulation, pacing_gbps_for
from .pipeline import PipelineResult, run_workload
from .simulate import resolve_topology
from .topology import LAYERS

MEMO_BASE = 2                 # first memo try: blocks b, b+2, b+4 (b of L's parity)
MEMO_RTOL = 1e-4              # affinity check: a time's second difference / the step,
MEMO_ATOL_S = 1e-5            # ... or this many seconds if more (a few path latencies)
MEMO_BYTES_RTOL = 1e-9        # ... a byte count's / its value

__all__ = ["MODELS", "get_model", "FsdpResult", "simulate_fsdp", "compare_fsdp",
           "COMPARE_ROWS", "fsdp_spec"]


@dataclass
class FsdpResult:
    model: str
    nodes: int
    shard: int                     # ranks a block is sharded over (nodes: FSDP)
    replicas: int                  # HSDP replica groups (1: FSDP)
    ag: str
    rs: str
    ar: str | None                 # HSDP's replica allreduce (None: FSDP)
    roots: int | None              # concurrent multicast streams (multicast allgather)
    layers: int
    layer_nbytes: int              # N: one block's parameter (and gradient) bytes
    compute_fwd_s: float           # per block
    compute_bwd_s: float
    head_fwd_s: float              # the output head (root unit; 0: none)
    optimizer_s: float
    # measured in the simulated pipeline
    step_s: float
    compute_s: float               # the last rank's compute-busy time
    bubble_s: float                # step - compute: its compute stream idle
    exposed_s: dict                # ... waiting on communication, per phase
    rank_classes: list             # ranks with the same times (RankClass dicts)
    step_link_bytes: int           # every link direction, one step
    link_bytes_by_layer: dict
    backward_block_s: float | None    # backward time per middle block (rank 0)
    window_over_n_b: float | None     # ... / (N/B): the measured backward window
    collectives: int
    events: int
    flows: int
    wall_s: float
    memo: dict | None = None       # blocks simulated, period, check (None: all simulated)
    # the composed formula (formula=True), for comparison
    formula_step_s: float | None = None
    formula_bubble_s: float | None = None
    t_ag_s: float | None = None    # one block's allgather alone
    t_rs_s: float | None = None
    t_window_s: float | None = None
    formula_window_over_n_b: float | None = None   # max(c_b, T_win) / (N/B)
    sent_per_rank_nbytes: int | None = None    # in the formula's window run, busiest rank
    recv_per_rank_nbytes: int | None = None
    nic: str | None = None         # receivers' NIC model (sim fsdp --nic), None: keep up
    nic_gbps: float | None = None
    step_nic_dropped_nbytes: int = 0    # bytes the receivers' queues dropped, one step
    step_recovered_nbytes: int = 0      # multicast bytes the engines recovered
    pipeline: PipelineResult | None = field(default=None, repr=False, compare=False)
    spec: FsdpSpec | None = field(default=None, repr=False, compare=False)   # its graph's

    @property
    def bubble_pct(self) -> float:
        return 100.0 * self.bubble_s / self.step_s if self.step_s > 0 else 0.0

    @property
    def formula_diff_pct(self) -> float | None:
        """(simulated - formula) / formula, percent."""
        if self.formula_step_s is None or not self.formula_step_s > 0:
            return None
        return 100.0 * (self.step_s - self.formula_step_s) / self.formula_step_s

    def to_json(self) -> dict:
        # (the pipeline holds its simulation: not deep-copied; simulate.SimResult's)
        out = {k: v for k, v in asdict(replace(self, pipeline=None)).items()
               if k not in ("pipeline", "spec")}
        out["bubble_pct"] = self.bubble_pct
        out["formula_diff_pct"] = self.formula_diff_pct
        return out


COMPARE_ROWS = (("ring", "ring"), ("mcast", "ring"), ("ring", "innet"), ("mcast", "innet"))


def fsdp_spec(model, nodes, ag="ring", rs="ring", *, shard=None, ar="ring", layers=None,
              layer_bytes=None, compute_per_layer_s=None, tokens_per_rank=4096, seq=None,
              tflops=400.0, root_unit=None, optimizer_s=None, dtype="bfloat16",
              **_simulation) -> FsdpSpec:
    """The :class:`FsdpSpec` that :func:`simulate_fsdp` builds from the same arguments
    (those only the simulation takes are ignored): its graph, e.g. to write as Chakra."""
    from ..collectives import parse_dtype
    itemsize = 2 if dtype == "bfloat16" else parse_dtype(dtype).itemsize
    return FsdpSpec(model=model, nodes=nodes, shard=shard, ag=ag, rs=rs, ar=ar,
                    layers=layers, layer_nbytes=layer_bytes,
                    compute_per_layer_s=compute_per_layer_s, tokens_per_rank=tokens_per_rank,
                    seq=seq, tflops=tflops, root_unit=root_unit, optimizer_s=optimizer_s,
                    itemsize=itemsize)


def simulate_fsdp(model: str | None = "llama2-7b", nodes: int = 64, *, ag: str = "ring",
                  rs: str = "ring", ar: str = "ring", shard: int | None = None,
                  topology=None, link=None, layers: int | None = None,
                  layer_bytes: int | None = None, compute_per_layer_s: float | None = None,
                  tokens_per_rank: int = 4096, seq: int | None = None, tflops: float = 400.0,
                  root_unit: bool | None = None, optimizer_s: float | None = None,
                  dtype: str = "bfloat16", roots: int | None = None, nic=None,
                  memo: bool = True, formula: bool = False, record_ranks=None,
                  cache: dict | None = None) -> FsdpResult:
    """Simulate one FSDP (``shard`` None) or HSDP step; see the module docstring.

    ``roots``: concurrent multicast streams of a multicast allgather (default: every rank
    of the shard group at once: beside an in-network reduce-scatter, the reduction goes at
    the pace of its slowest contributor, and a few roots whose uplinks also carry their
    stream hold it back). ``nic``: receivers behind that NIC's rate and queue
    (:mod:`polycast.sim.nic`; the world communicator only, so not with HSDP's multicast).
    ``record_ranks``: keep those ranks' node times (timelines; no memo then)."""
    wall = time.perf_counter()
    spec = fsdp_spec(model, nodes, ag, rs, shard=shard, ar=ar, layers=layers,
                 layer_bytes=layer_bytes, compute_per_layer_s=compute_per_layer_s,
                 tokens_per_rank=tokens_per_rank, seq=seq, tflops=tflops,
                 root_unit=root_unit, optimizer_s=optimizer_s, dtype=dtype)
    plan = plan_fsdp(spec)
    topo = resolve_topology(topology, nodes, link)
    S = plan.shard
    ag_roots = None
    if "roots" in get("allgather", ag).options:
        ag_roots = min(roots if roots is not None else S, S)
        spec = replace(spec, ag_options=(("roots", ag_roots),))
    for coll, algo in (("allgather", ag), ("reduce_scatter", rs)) + (
            (("allreduce", ar),) if plan.replicas > 1 else ()):
        reason = get(coll, algo).unsupported_reason(S if coll != "allreduce" else
                                                    plan.replicas)
        if reason is not None:
            raise InvalidArgument(f"{coll} {algo}: {reason}")
    if isinstance(nic, str):
        from ..models.nic import parse_nic
        nic = parse_nic(nic)
    cfg = SimConfig(nic=nic)
    record = list(record_ranks or ())
    use_memo = memo and not record and plan.layers > MEMO_BASE + 2
    if use_memo:
        res, memo_info = _memoised(spec, plan.layers, topo, cfg)
    else:
        w, _ = build_fsdp(spec)
        res = run_workload(w, topo, config=cfg,
                           record_ranks=sorted(set(record) | {0}))
        memo_info = None
    window = memo_info.pop("window") if memo_info and "window" in memo_info else \
        _backward_block(res, plan)
    B = topo.host_link_bw
    N = plan.layer_nbytes
    out = FsdpResult(
        model=plan.model, nodes=nodes, shard=S, replicas=plan.replicas, ag=ag, rs=rs,
        ar=ar if plan.replicas > 1 else None, roots=ag_roots, layers=plan.layers,
        layer_nbytes=N, compute_fwd_s=plan.compute_fwd_s, compute_bwd_s=plan.compute_bwd_s,
        head_fwd_s=plan.head_fwd_s, optimizer_s=plan.optimizer_s, step_s=res.step_s,
        compute_s=res.compute_s, bubble_s=res.bubble_s, exposed_s=res.exposed_s,
        rank_classes=[asdict(c) for c in res.rank_classes], step_link_bytes=res.link_bytes,
        link_bytes_by_layer=res.link_bytes_by_layer, backward_block_s=window,
        window_over_n_b=None if window is None else window / (N / B),
        collectives=res.collectives, events=res.events, flows=res.flows, wall_s=0.0,
        memo=memo_info, nic=nic.name if nic is not None else None,
        nic_gbps=nic.bytes_per_s(nic.chunk_nbytes) * 8 / 1e9 if nic is not None else None,
        step_nic_dropped_nbytes=res.nic_dropped_nbytes,
        step_recovered_nbytes=res.recovered_nbytes, pipeline=res, spec=spec)
    if formula:
        _formula(out, spec, plan, topo, nic, {} if cache is None else cache)
    out.wall_s = time.perf_counter() - wall
    return out


def compare_fsdp(model="llama2-7b", nodes=64, **kwargs) -> list[FsdpResult]:
    """The four rows of specs/measures.md's FSDP table (allgather ring/mcast x
    reduce-scatter ring/innet), each a simulated pipeline with the composed formula's
    figure beside it."""
    cache: dict = {}
    topo = resolve_topology(kwargs.pop("topology", None), nodes, kwargs.pop("link", None))
    kwargs.setdefault("formula", True)
    return [simulate_fsdp(model, nodes, ag=a, rs=r, topology=topo, cache=cache, **kwargs)
            for a, r in COMPARE_ROWS]


# -- the memo ---------------------------------------------------------------------------

def _memoised(spec: FsdpSpec, L: int, topo, cfg: SimConfig):
    # blocks b, b+2, b+4 with b of L's parity: a pipeline whose blocks alternate between two
    # timings (period 2: ring allgather beside in-network reduce-scatter does) is as
    # affine over steps of two blocks as one of period 1, and L is reached in whole steps
    b = MEMO_BASE + (L - MEMO_BASE) % 2
    runs: dict[int, PipelineResult] = {}
    wall = events = 0
    tries = []
    while b + 4 < L:
        # a pipeline that is not affine at b (seen: ring/innet at 188 ranks) would have the
        # doubling simulate b = 2, 4, 8, 16 (128 blocks for L = 32) before falling back to
        # the L blocks of the full run: after the first try, the memo tries again only
        # while the blocks it simulated stay within the full run's
        if tries and sum(runs) + sum(n for n in (b, b + 2, b + 4) if n not in runs) > L:
            break
        for n in (b, b + 2, b + 4):
            if n not in runs:
                w, _ = build_fsdp(replace(spec, layers=n))
                runs[n] = run_workload(w, topo, config=replace(cfg),
                                       record_ranks=[0])
                wall += runs[n].wall_s
                events += runs[n].events
        worst = _second_difference(runs[b], runs[b + 2], runs[b + 4])
        tries.append({"blocks": [b, b + 2, b + 4], "second_difference": worst})
        if worst <= 1.0:
            res = _extrapolate(runs[b], runs[b + 4], (L - b - 4) // 2)
            res.events, res.wall_s = events, wall
            period = (runs[b + 4].step_s - runs[b].step_s) / 4
            plan = plan_fsdp(replace(spec, layers=b + 4))
            return res, {"blocks_simulated": sorted(runs), "period_s": period,
                         "tries": tries, "window": _backward_block(runs[b + 4], plan)}
        b *= 2
    w, _ = build_fsdp(spec)
    res = run_workload(w, topo, config=replace(cfg), record_ranks=[0])
    res.events += events
    return res, {"blocks_simulated": sorted(runs) + [L], "period_s": None, "tries": tries,
                 "fell_back": True}


def _values(r: PipelineResult) -> list[float]:
    phases = sorted({p for e in r.rank_exposed_s for p in e})
    out = list(r.rank_end_s) + list(r.rank_compute_s)
    out += [e.get(p, 0.0) for e in r.rank_exposed_s for p in phases]
    out += [float(r.link_bytes_by_layer.get(l, 0)) for l in LAYERS]
    out += [float(r.nic_dropped_nbytes), float(r.recovered_nbytes), float(r.collectives)]
    return out


def _second_difference(a: PipelineResult, b: PipelineResult, c: PipelineResult) -> float:
    """max over every result of |c - 2b + a|, times over the larger of MEMO_RTOL x the
    step and MEMO_ATOL_S, byte counts over MEMO_BYTES_RTOL x their value: <= 1 passes (0
    when exactly affine)."""
    va, vb, vc = _values(a), _values(b), _values(c)
    if not len(va) == len(vb) == len(vc):
        return float("inf")
    scale_t = max(MEMO_RTOL * c.step_s, MEMO_ATOL_S)
    worst = 0.0
    n_times = len(c.rank_end_s) * 2 + len(c.rank_exposed_s) * len(
        {p for e in c.rank_exposed_s for p in e})
    for i, (x, y, z) in enumerate(zip(va, vb, vc)):
        scale = scale_t if i < n_times else MEMO_BYTES_RTOL * max(abs(z), 1.0)
        worst = max(worst, abs(z - 2 * y + x) / scale)
    return worst


def _extrapolate(a: PipelineResult, c: PipelineResult, k: int) -> PipelineResult:
    """``c`` plus ``k`` more two-block steps, a step being half of ``c - a`` (four blocks
    apart: what does not repeat exactly, a microsecond here or there, weighs half), for
    every per-rank and per-link value."""
    def ext(x, y):
        return y + k * (y - x) / 2
    phases = sorted({p for e in c.rank_exposed_s for p in e})
    end = [ext(x, y) for x, y in zip(a.rank_end_s, c.rank_end_s)]
    busy = [ext(x, y) for x, y in zip(a.rank_compute_s, c.rank_compute_s)]
    exposed = [{p: ext(ea.get(p, 0.0), ec.get(p, 0.0)) for p in phases}
               for ea, ec in zip(a.rank_exposed_s, c.rank_exposed_s)]
    by_layer = {l: int(round(ext(a.link_bytes_by_layer.get(l, 0), v)))
                for l, v in c.link_bytes_by_layer.items()}
    return PipelineResult.from_ranks(
        end, busy, exposed, name=c.name, link_bytes=sum(by_layer.values()),
        link_bytes_by_layer=by_layer, collectives=int(round(ext(a.collectives, c.collectives))),
        algorithms=c.algorithms, events=0, flows=int(round(ext(a.flows, c.flows))), wall_s=0.0,
        nic_dropped_nbytes=int(round(ext(a.nic_dropped_nbytes, c.nic_dropped_nbytes))),
        recovered_nbytes=int(round(ext(a.recovered_nbytes, c.recovered_nbytes))))


def _backward_block(res: PipelineResult, plan) -> float | None:
    """Rank 0's backward time per block in the middle of the model, over two blocks (from
    B(i+1)'s start to B(i-1)'s, halved: blocks may alternate), i the middle block, away from
    both ends. While B(i+1) computes, AG'(i) and RS(i+2) are in flight: this is max(c_b,
    their window) when nothing else holds them back, the formula's per-block term."""
    tl = res.timelines.get(0)
    if not tl or res.workload is None or plan.layers < 3:
        return None
    prog = res.workload.programs[0]
    starts = {prog[p].name: s for p, s, e in tl}
    i = plan.layers // 2
    a, b = starts.get(f"B {i + 1}"), starts.get(f"B {i - 1}")
    return None if a is None or b is None else (b - a) / 2


# -- the composed formula ----------------------------------------------------------------

def _formula(out: FsdpResult, spec: FsdpSpec, plan, topo, nic, cache: dict):
    if plan.replicas > 1:
        return                        # the formula is FSDP's (no replica allreduce)
    P, isz = plan.nodes, spec.itemsize
    N, L = plan.layer_nbytes, plan.layers
    link_gbps = float(topo.host_link_bw * 8 / 1e9)
    opts = dict(spec.ag_options)
    s_ag = build("allgather", spec.ag, P, plan.layer_count, **opts)
    s_rs = build("reduce_scatter", spec.rs, P, plan.layer_count)

    def run(scheds):
        engine = {"line_rate_gbps": link_gbps,
                  "pacing_gbps": pacing_gbps_for(scheds, link_gbps, topo.framing)}
        sim = Simulation(topo, SimConfig(engine=engine, nic=nic))
        reqs = [sim.post(s, isz) for s in scheds]
        sim.run()
        return sim, [sim.completion_time(r) for r in reqs]

    key_ag = ("ag", spec.ag, id(topo), plan.layer_count, tuple(opts.items()), nic)
    if key_ag not in cache:
        cache[key_ag] = run([s_ag])[1][0]
    key_rs = ("rs", spec.rs, id(topo), plan.layer_count, nic)
    if key_rs not in cache:
        cache[key_rs] = run([s_rs])[1][0]
    t_ag, t_rs = cache[key_ag], cache[key_rs]
    sim, (t_wag, t_wrs) = run([s_ag, s_rs])
    t_win = max(t_wag, t_wrs)
    c_f, c_b = plan.compute_fwd_s, plan.compute_bwd_s
    if L == 1:
        step = t_ag + c_f + c_b + t_rs
    else:
        forward = t_ag + (L - 1) * max(c_f, t_ag) + c_f
        backward = (t_ag + max(c_b, t_ag) + (L - 2) * max(c_b, t_win) + max(c_b, t_rs)
                    + t_rs)
        step = forward + backward
    lb = sim.net.link_bytes
    up = max(sum(lb[l] for l in topo.up[r]) for r in range(topo.nranks))
    down = max(sum(lb[l ^ 1] for l in topo.up[r]) for r in range(topo.nranks))
    out.formula_step_s = step
    out.formula_bubble_s = step - L * (c_f + c_b)
    out.t_ag_s, out.t_rs_s, out.t_window_s = t_ag, t_rs, t_win
    out.formula_window_over_n_b = max(c_b, t_win) / (N / topo.host_link_bw)
    out.sent_per_rank_nbytes, out.recv_per_rank_nbytes = int(round(up)), int(round(down))
