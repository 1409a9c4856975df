"""FSDP and HSDP training steps as workload graphs, layer by layer, ordered as FSDP2 runs them.

One step of a model wrapped per transformer block (``fully_shard`` on each block and on the
root, as torchtitan does), every rank running the same program:

* **forward**: the root unit's allgather (embeddings + output head), then per block i its
  allgather AG(i) and its forward F(i). The allgathers run one after another on their own
  stream; AG(i+1) may start once F(i-1) is done (FSDP2 keeps at most the computing block
  and one prefetched block unsharded), so it overlaps F(i) -- the forward prefetch. F(i)
  waits for AG(i) and F(i-1). Every block but the last reshards after its forward; the
  output head's forward follows the last block.
* **backward**: the head's backward, then blocks L-1 .. 0. The last block kept its
  parameters (no reshard after forward), so it needs no allgather; block i-1 < L-1 is
  allgathered again, AG'(i-1), issued before B(i) (FSDP2's backward prefetch) and free to
  start once B(i+1) released its block. B(i) waits for AG'(i) and B(i+1); its gradients
  are reduce-scattered, RS(i), on the reduce-scatter stream once B(i) is done. So while
  B(i) computes, the allgather of block i-1 and the reduce-scatter of block i+1 are in
  flight together: specs/measures.md's window. The root unit's gradients go last.
* **HSDP** (``shard`` < ranks): parameters are sharded within groups of ``shard``
  consecutive ranks and replicated across the groups; after RS(i), its shard of gradients
  is allreduced across the replicas (the ranks with the same place in every group), AR(i),
  on a stream of its own.
* **optimizer**: once every gradient is reduced, a memory-bound Adam step over the rank's
  shard: ``optimizer_bytes_per_param`` bytes moved per parameter at ``hbm_gbps``.

Collective sizes follow Chakra (each rank's input): an allgather of ``count`` elements per
rank, a reduce-scatter of ``count x shard`` (each shard padded up, as FSDP2 pads), an
allreduce of ``count``. Compute per block from :mod:`.models` at ``tflops`` per rank, or
given per layer (``compute_per_layer_s``: forward; backward is twice it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..errors import InvalidArgument
from .graph import COLLECTIVE, COMPUTE, WORLD, Node, Workload
from .models import get_model

OPTIMIZER_BYTES_PER_PARAM = 32     # Adam: fp32 master, m, v read and written, grad, bf16 copy
HBM_GBPS = 16000.0                 # 2 TB/s effective device memory bandwidth
SHARD, REPLICATE = "shard", "replicate"


@dataclass
class FsdpSpec:
    """What ``polycast sim fsdp`` builds (see the module docstring)."""
    model: str | None = "llama2-7b"
    nodes: int = 64
    shard: int | None = None                 # HSDP shard group size (None: every rank)
    ag: str = "ring"
    rs: str = "ring"
    ar: str = "ring"                         # HSDP's replica allreduce
    ag_options: tuple = ()                   # the allgather algorithm's options
    layers: int | None = None                # override the preset's blocks
    layer_nbytes: int | None = None          # override a block's parameter bytes
    compute_per_layer_s: float | None = None
    tokens_per_rank: int = 4096
    seq: int | None = None                   # attention FLOPs when given
    tflops: float = 400.0
    root_unit: bool | None = None            # embeddings + head (default: with a preset)
    optimizer_s: float | None = None         # default: memory-bound Adam over the shard
    hbm_gbps: float = HBM_GBPS
    itemsize: int = 2                        # bf16 parameters and gradients


@dataclass
class FsdpPlan:
    """The numbers the graph was built from."""
    model: str
    nodes: int
    shard: int
    replicas: int
    layers: int
    layer_nbytes: int              # N: one block's parameter bytes (unpadded)
    layer_count: int               # elements per rank of a block's allgather (padded)
    compute_fwd_s: float           # per block
    compute_bwd_s: float
    root_nbytes: int               # the root unit (0: none)
    root_count: int
    head_fwd_s: float
    head_bwd_s: float
    optimizer_s: float
    params: int                    # all parameters


def plan_fsdp(spec: FsdpSpec) -> FsdpPlan:
    """Check ``spec`` and work out sizes and compute times (no graph yet)."""
    P = spec.nodes
    if not isinstance(P, int) or P < 1:
        raise InvalidArgument(f"nodes must be a positive integer, got {P!r}")
    S = P if spec.shard is None else spec.shard
    if not isinstance(S, int) or S < 1 or P % S:
        raise InvalidArgument(f"--shard {S!r} must divide the {P} ranks (HSDP: shard groups "
                              "of that many ranks, replicated across the groups)")
    isz = spec.itemsize
    preset = get_model(spec.model) if spec.model else None
    if preset is None and (spec.layer_nbytes is None or spec.layers is None):
        raise InvalidArgument("without --model, give --layers and --layer-bytes")
    L = spec.layers if spec.layers is not None else preset.layers
    if not isinstance(L, int) or L < 1:
        raise InvalidArgument(f"layers must be an integer >= 1, got {L!r}")
    if spec.layer_nbytes is not None:
        N = int(spec.layer_nbytes)
        if N <= 0:
            raise InvalidArgument(f"layer bytes must be > 0, got {spec.layer_nbytes}")
        params_block = max(1, N // isz)
    else:
        params_block = preset.block_params
        N = params_block * isz
    root = spec.root_unit if spec.root_unit is not None else (
        preset is not None and spec.layer_nbytes is None)
    if root and preset is None:
        raise InvalidArgument("the root unit (embeddings, head) needs a model preset")
    if not spec.tflops > 0 or spec.tokens_per_rank <= 0:
        raise InvalidArgument("tflops and tokens per rank must be > 0")
    if spec.seq is not None and (not isinstance(spec.seq, int) or spec.seq <= 0):
        raise InvalidArgument(f"sequence length must be a positive integer, got {spec.seq!r}")
    if spec.compute_per_layer_s is not None:
        c_f = float(spec.compute_per_layer_s)
        if not c_f >= 0:
            raise InvalidArgument(f"compute per layer must be >= 0 s, got {c_f}")
    elif preset is not None and spec.layer_nbytes is None:
        c_f = preset.block_flops(spec.tokens_per_rank, spec.seq) / (spec.tflops * 1e12)
    else:
        c_f = 2.0 * params_block * spec.tokens_per_rank / (spec.tflops * 1e12)
    root_params = preset.root_params if root else 0
    head_f = preset.head_flops(spec.tokens_per_rank) / (spec.tflops * 1e12) if root else 0.0
    params = L * params_block + root_params
    if spec.optimizer_s is not None:
        opt = float(spec.optimizer_s)
        if not opt >= 0:
            raise InvalidArgument(f"optimizer time must be >= 0 s, got {opt}")
    else:
        if not spec.hbm_gbps > 0:
            raise InvalidArgument(f"hbm_gbps must be > 0, got {spec.hbm_gbps}")
        opt = math.ceil(params / S) * OPTIMIZER_BYTES_PER_PARAM / (spec.hbm_gbps * 1e9 / 8)
    return FsdpPlan(
        model=preset.name if preset and spec.layer_nbytes is None else "custom", nodes=P, shard=S, replicas=P // S, layers=L,
        layer_nbytes=N, layer_count=math.ceil(params_block / S), compute_fwd_s=c_f,
        compute_bwd_s=2.0 * c_f, root_nbytes=root_params * isz,
        root_count=math.ceil(root_params / S) if root else 0, head_fwd_s=head_f,
        head_bwd_s=2.0 * head_f, optimizer_s=opt, params=params)


def build_fsdp(spec: FsdpSpec) -> tuple[Workload, FsdpPlan]:
    """The FSDP (or HSDP) step as a :class:`Workload`: one program every rank runs."""
    plan = plan_fsdp(spec)
    P, S, L, isz = plan.nodes, plan.shard, plan.layers, spec.itemsize
    hsdp = S < P
    shard_comm = SHARD if hsdp else WORLD
    prog: list[Node] = []

    def add(kind, name, deps, **kw) -> Node:
        n = Node(len(prog), kind, name, tuple(d.id for d in deps if d is not None), **kw)
        prog.append(n)
        return n

    def allgather(name, count, deps, phase):
        return add(COLLECTIVE, name, deps, collective="allgather", nbytes=count * isz,
                   comm=shard_comm, algorithm=spec.ag, options=tuple(spec.ag_options),
                   phase=phase, stream="allgather")

    def reduce(name, count, deps, rs_prev, ar_prev):
        rs = add(COLLECTIVE, "RS " + name, deps + [rs_prev], collective="reduce_scatter",
                 nbytes=count * S * isz, comm=shard_comm, algorithm=spec.rs,
                 phase="backward", stream="reduce_scatter")
        ar = None
        if hsdp and plan.replicas > 1:
            ar = add(COLLECTIVE, "AR " + name, [rs, ar_prev], collective="allreduce",
                     nbytes=count * isz, comm=REPLICATE, algorithm=spec.ar, phase="backward",
                     stream="allreduce")
        return rs, ar

    c_f, c_b = plan.compute_fwd_s, plan.compute_bwd_s
    root = plan.root_count > 0
    # forward
    ag_root = allgather("AG root", plan.root_count, [], "forward") if root else None
    ag_prev, f = ag_root, [None] * L
    for i in range(L):
        ag = allgather(f"AG {i}", plan.layer_count, [ag_prev, f[i - 2] if i >= 2 else None],
                       "forward")
        f[i] = add(COMPUTE, f"F {i}", [ag, f[i - 1] if i else ag_root], duration_s=c_f,
                   phase="forward")
        ag_prev = ag
    last_fwd = f[L - 1]
    if root:
        last_fwd = add(COMPUTE, "F head", [last_fwd, ag_root], duration_s=plan.head_fwd_s,
                       phase="forward")
    # backward
    b_prev = add(COMPUTE, "B head", [last_fwd], duration_s=plan.head_bwd_s,
                 phase="backward") if root else last_fwd
    b: list[Node | None] = [None] * L
    rs_prev = ar_prev = None
    ag_next = None                      # AG'(i), issued before B(i+1) as FSDP2 prefetches
    for i in range(L - 1, -1, -1):
        ag_mine = ag_next
        ag_next = None
        if i >= 1:
            # prefetch of block i-1, issued (in the pre-backward of block i) before B(i) and
            # RS(i); it may start once B(i+1) freed its block
            ag_next = allgather(f"AG' {i - 1}", plan.layer_count,
                                [ag_prev, b[i + 1] if i + 1 < L else last_fwd], "backward")
            ag_prev = ag_next
        b[i] = add(COMPUTE, f"B {i}", [b_prev, ag_mine], duration_s=c_b, phase="backward")
        b_prev = b[i]
        rs_prev, ar2 = reduce(f"{i}", plan.layer_count, [b[i]], rs_prev, ar_prev)
        ar_prev = ar2 or ar_prev
    if root:
        rs_prev, ar2 = reduce("root", plan.root_count, [b[0], b_prev], rs_prev, ar_prev)
        ar_prev = ar2 or ar_prev
    add(COMPUTE, "optimizer", [b_prev, rs_prev, ar_prev], duration_s=plan.optimizer_s,
        phase="optimizer")
    comms = {}
    if hsdp:
        comms[SHARD] = [tuple(range(g * S, (g + 1) * S)) for g in range(P // S)]
        comms[REPLICATE] = [tuple(range(i, P, S)) for i in range(S)]
    w = Workload(P, [prog] * P, comms, itemsize=isz,
                 name=f"{'hsdp' if hsdp else 'fsdp'} {plan.model}",
                 meta={"plan": plan})
    return w, plan
