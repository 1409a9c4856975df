"""FSDP (ZeRO-3) training step on the simulated network.

Per transformer layer of N parameter bytes on P ranks, FSDP allgathers the layer's
parameters before its forward and its backward, and reduce-scatters its gradients after its
backward. The collectives overlap compute:

* forward: the allgather of layer i+1 runs while layer i computes (prefetch);
* backward: the allgather of layer i-1 and the reduce-scatter of layer i+1 run together
  while layer i computes (this is the window where point-to-point allgather and
  reduce-scatter fight for the same links; specs/measures.md).

What is simulated, and what is composed. Simulating every layer of a step at 188 nodes
would repeat identical work, so the simulator runs, on the real engines and network model:
(1) one layer's allgather alone, (2) one layer's reduce-scatter alone, and (3) the backward
window: both posted at once on the same engines, sharing the network. The step is then
composed from those times and the compute times, layer by layer::

    forward  = T_ag + (L-1) max(c_f, T_ag) + c_f
    backward = T_ag + max(c_b, T_ag) + (L-2) max(c_b, T_win) + max(c_b, T_rs) + T_rs

(the first allgather and the last reduce-scatter are exposed). Compute does not slow the
network and vice versa; every layer is the same size; no optimizer step, no activation
recomputation, no reshard-after-forward exception for the last layer.

Compute per layer defaults to 2 x params x tokens FLOPs forward and twice that backward
(matmuls only, attention scores ignored) at an effective ``tflops`` per rank.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field

from ..algorithms import build
from ..collectives import Collective, parse_dtype
from ..errors import InvalidArgument, UnknownName
from .driver import SimConfig, Simulation, pacing_gbps_for
from .simulate import count_for, resolve_topology


@dataclass(frozen=True)
class ModelPreset:
    name: str
    layers: int
    params_per_layer: int        # parameters of one transformer block
    note: str


def _llama(h: int, inter: int, kv_dim: int | None = None) -> int:
    kv = h if kv_dim is None else kv_dim
    attn = 2 * h * h + 2 * h * kv          # q, o and k, v projections
    return attn + 3 * h * inter + 2 * h     # SwiGLU MLP, two RMSNorms


MODELS = {
    m.name: m for m in (
        ModelPreset("llama2-7b", 32, _llama(4096, 11008), "h=4096, ffn=11008, 32 layers"),
        ModelPreset("llama2-13b", 40, _llama(5120, 13824), "h=5120, ffn=13824, 40 layers"),
        ModelPreset("llama2-70b", 80, _llama(8192, 28672, 1024),
                    "h=8192, ffn=28672, GQA 8 kv heads, 80 layers"),
        ModelPreset("gpt3-175b", 96, 12 * 12288 * 12288 + 13 * 12288,
                    "h=12288, ffn=4h, 96 layers"),
    )
}


def get_model(name: str) -> ModelPreset:
    m = MODELS.get(name.lower())
    if m is None:
        raise UnknownName("model", name, list(MODELS))
    return m


@dataclass
class FsdpResult:
    model: str
    nodes: int
    ag: str
    rs: str
    roots: int | None              # multicast streams at a time (multicast allgather)
    layers: int
    layer_nbytes: int              # N: parameter (and gradient) bytes of one layer
    compute_fwd_s: float           # per layer
    compute_bwd_s: float
    t_ag_s: float                  # one layer's allgather alone
    t_rs_s: float                  # one layer's reduce-scatter alone
    t_window_s: float              # allgather + reduce-scatter posted together
    t_window_ag_s: float           # ... when the allgather finished in the window
    t_window_rs_s: float
    window_over_n_b: float         # T_win / (N/B)
    sent_per_rank_nbytes: int      # in the window, the busiest rank's uplink bytes
    recv_per_rank_nbytes: int      # ... and downlink bytes
    forward_s: float
    backward_s: float
    step_s: float
    compute_s: float
    bubble_s: float                # step - compute: communication compute waits on
    step_link_bytes: int           # all links, one step (2 allgathers + 1 RS per layer)
    window_link_bytes: int
    window_link_bytes_by_layer: dict = field(default_factory=dict)
    wall_s: float = 0.0
    events: int = 0
    nic: str | None = None         # receivers' NIC model (sim fsdp --nic), None: keep up
    nic_gbps: float | None = None  # ... its sustainable multicast receive rate
    # one step, counted as step_link_bytes (L windows + L forward allgathers):
    step_nic_dropped_nbytes: int = 0    # bytes the receivers' queues dropped
    step_recovered_nbytes: int = 0      # multicast bytes the engines recovered

    def to_json(self) -> dict:
        return asdict(self)


def _rank_link_bytes(topo, link_bytes) -> tuple[int, int]:
    """Max over ranks of the bytes a rank sent (its up links) and received (the reverse
    links; every cable is an up link 2i and a down link 2i+1)."""
    up = max(sum(link_bytes[l] for l in topo.up[r]) for r in range(topo.nranks))
    down = max(sum(link_bytes[l ^ 1] for l in topo.up[r]) for r in range(topo.nranks))
    return int(round(up)), int(round(down))


def _run(topo, scheds, itemsize, engine, seed=0, nic=None):
    link_gbps = float(topo.host_link_bw * 8 / 1e9)
    engine = {"pacing_gbps": pacing_gbps_for(scheds, link_gbps, topo.framing), **engine}
    cfg = SimConfig(seed=seed, engine=engine, nic=nic)
    sim = Simulation(topo, cfg)
    reqs = [sim.post(s, itemsize) for s in scheds]
    sim.run()
    return sim, [sim.completion_time(r) for r in reqs]


def simulate_fsdp(model: str | None = "llama2-7b", nodes: int = 188, *, ag: str = "ring",
                  rs: str = "ring", topology=None, link=None, layers: int | None = None,
                  layer_bytes: int | None = None, compute_per_layer_s: float | None = None,
                  tokens_per_rank: int = 4096, tflops: float = 400.0, dtype: str = "bfloat16",
                  roots: int | None = None, nic=None, cache: dict | None = None
                  ) -> FsdpResult:
    """Simulate one FSDP step (see the module docstring). ``layer_bytes`` / ``layers`` /
    ``compute_per_layer_s`` (forward; backward is twice it) override the model preset.
    ``cache`` (a dict) shares the allgather-alone and reduce-scatter-alone runs between
    calls with the same shape (``compare`` uses it). ``nic`` (a
    :class:`~polycast.models.nic.NicModel` or a ``--nic`` string) puts every receiver behind
    that NIC's rate and receive queue in all three runs (:mod:`polycast.sim.nic`).

    ``roots``: concurrent multicast streams of a multicast allgather. The default here is
    every rank at once (not the algorithm's 2): with an in-network reduce-scatter in the same
    window, the reduction advances at the pace of its slowest contributor, and a few roots
    whose uplinks also carry their multicast stream hold it back (the window measures about
    1.76 N/B with 2 roots at P=16, N/B with P/2 roots or more)."""
    wall = time.perf_counter()
    if dtype == "bfloat16":
        itemsize = 2
    else:
        itemsize = parse_dtype(dtype).itemsize
    preset = get_model(model) if model else None
    if preset is None and (layer_bytes is None or layers is None):
        raise InvalidArgument("without --model, give --layers and --layer-bytes")
    L = layers if layers is not None else preset.layers
    N = layer_bytes if layer_bytes is not None else preset.params_per_layer * itemsize
    if not isinstance(L, int) or L < 2:
        raise InvalidArgument(f"layers must be an integer >= 2, got {L!r}")
    if N <= 0:
        raise InvalidArgument(f"layer bytes must be > 0, got {N}")
    if compute_per_layer_s is None:
        params = N / itemsize
        if not tflops > 0 or tokens_per_rank <= 0:
            raise InvalidArgument("tflops and tokens_per_rank must be > 0")
        compute_per_layer_s = 2.0 * params * tokens_per_rank / (tflops * 1e12)
    if compute_per_layer_s < 0:
        raise InvalidArgument(f"compute per layer must be >= 0 s, got {compute_per_layer_s}")
    c_f, c_b = compute_per_layer_s, 2.0 * compute_per_layer_s
    if isinstance(nic, str):
        from ..models.nic import parse_nic
        nic = parse_nic(nic)
    topo = resolve_topology(topology, nodes, link)
    B = topo.host_link_bw
    engine = {"line_rate_gbps": float(B * 8 / 1e9)}
    count_ag = count_for(Collective.ALLGATHER, nodes, N, itemsize)
    count_rs = count_for(Collective.REDUCE_SCATTER, nodes, N, itemsize)
    from ..algorithms import get
    ag_opts = {}
    if "roots" in get("allgather", ag).options:
        ag_opts["roots"] = roots if roots is not None else nodes
    s_ag = build("allgather", ag, nodes, count_ag, **ag_opts)
    s_rs = build("reduce_scatter", rs, nodes, count_rs)
    cache = {} if cache is None else cache
    events = 0
    key_ag = ("ag", ag, id(topo), N, tuple(ag_opts.items()), nic)
    if key_ag not in cache:
        sim, (t,) = _run(topo, [s_ag], itemsize, engine, nic=nic)
        cache[key_ag] = (t, sim.events, int(round(sim.net.link_bytes.sum())), _nic_bytes(sim))
    t_ag, ev, ag_bytes, ag_nic = cache[key_ag]
    events += ev
    key_rs = ("rs", rs, id(topo), N, nic)
    if key_rs not in cache:
        sim, (t,) = _run(topo, [s_rs], itemsize, engine, nic=nic)
        cache[key_rs] = (t, sim.events)
    t_rs, ev = cache[key_rs]
    events += ev
    sim, (t_wag, t_wrs) = _run(topo, [s_ag, s_rs], itemsize, engine, nic=nic)
    events += sim.events
    win_nic = _nic_bytes(sim)
    t_win = max(t_wag, t_wrs)
    lb = sim.net.link_bytes
    sent, recv = _rank_link_bytes(topo, lb)
    from .topology import LAYERS
    by_layer = {name: int(round(lb[topo.layer_index == i].sum()))
                for i, name in enumerate(LAYERS) if (topo.layer_index == i).any()}
    forward = t_ag + (L - 1) * max(c_f, t_ag) + c_f
    backward = (t_ag + max(c_b, t_ag) + (L - 2) * max(c_b, t_win) + max(c_b, t_rs) + t_rs)
    step = forward + backward
    compute = L * (c_f + c_b)
    win_bytes = int(round(lb.sum()))
    # one step: L backward windows (AG + RS) plus L forward allgathers
    step_bytes = L * win_bytes + L * ag_bytes
    return FsdpResult(
        model=preset.name if preset and layer_bytes is None else (model or "custom"),
        nodes=nodes, ag=ag, rs=rs, roots=ag_opts.get("roots"), layers=L, layer_nbytes=N, compute_fwd_s=c_f,
        compute_bwd_s=c_b, t_ag_s=t_ag, t_rs_s=t_rs, t_window_s=t_win,
        t_window_ag_s=t_wag, t_window_rs_s=t_wrs, window_over_n_b=t_win / (N / B),
        sent_per_rank_nbytes=sent, recv_per_rank_nbytes=recv, forward_s=forward,
        backward_s=backward, step_s=step, compute_s=compute, bubble_s=step - compute,
        step_link_bytes=step_bytes, window_link_bytes=win_bytes,
        window_link_bytes_by_layer=by_layer, wall_s=time.perf_counter() - wall,
        events=events, nic=nic.name if nic is not None else None,
        nic_gbps=nic.bytes_per_s(nic.chunk_nbytes) * 8 / 1e9 if nic is not None else None,
        step_nic_dropped_nbytes=L * (win_nic[0] + ag_nic[0]),
        step_recovered_nbytes=L * (win_nic[1] + ag_nic[1]))


def _nic_bytes(sim) -> tuple[int, int]:
    """(bytes the receivers' NIC queues dropped, multicast bytes recovered) of one run."""
    dropped = sim.nic.dropped_nbytes if sim.nic is not None else 0
    return int(dropped), int(sim.engine_stats().get("recovered_bytes", 0))


COMPARE_ROWS = (("ring", "ring"), ("mcast", "ring"), ("ring", "innet"), ("mcast", "innet"))


def compare_fsdp(model="llama2-7b", nodes=188, **kwargs) -> list[FsdpResult]:
    """The four rows of specs/measures.md's FSDP table, each from simulated runs."""
    cache: dict = {}
    topo = resolve_topology(kwargs.pop("topology", None), nodes, kwargs.pop("link", None))
    return [simulate_fsdp(model, nodes, ag=a, rs=r, topology=topo, cache=cache, **kwargs)
            for a, r in COMPARE_ROWS]
