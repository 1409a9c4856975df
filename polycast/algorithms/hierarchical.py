"""Hierarchical algorithms over ``hosts`` x ``ranks_per_host`` ranks, numbered host-major
(rank = host * R + local). Options ``hosts`` and ``ranks_per_host`` (either one is enough
when it divides P; with neither, every rank is its own host, R = 1).

* ``hring`` (allreduce, allgather): one leader per host on the network. A pipelined chain
  inside each host reduces (gathers) to local rank 0, the host leaders run a ring
  allreduce (allgather) among themselves, and a chain inside each host broadcasts the
  result. This is the leader-based "hierarchical ring" (one NIC per host, as Gloo's and
  MVAPICH2's two-level allreduce); the form where every local rank joins a ring across
  hosts is ``ring2d``.
* ``hdbtree`` (allreduce, broadcast, reduce): a chain inside each host and NCCL's double
  binary tree across hosts, ``pattern`` "tree", "split" or "balanced" (NCCL's TREE,
  SPLIT_TREE, BALANCED_TREE) choosing which local rank carries the links to child hosts;
  see :func:`polycast.graph.trees.hierarchical_dbtree`.
* ``hmcast`` (allgather, broadcast, allreduce): gather (reduce) to local rank 0, then
  multicast across hosts. An IR multicast reaches every rank, the host's own ones
  included, so no separate broadcast inside the host is needed.
* ``ring2d`` (allreduce, allgather): the 2D ring / 2D torus, rows = hosts and columns =
  local ranks. Allreduce: ring reduce-scatter along each row, ring allreduce of each
  rank's part along its column, ring allgather along the row. Allgather: ring allgather
  along columns (across hosts) first, then along rows, so each shard crosses the network
  once per host.
"""

from __future__ import annotations

from ..errors import InvalidArgument
from ..graph.trees import hierarchical_dbtree, tree_pattern
from ..schedule.ir import Layout
from .allreduce import dbtree_allreduce
from .phases import (Flow, chain_broadcast, chain_reduce, chunk_blocks, mcast_round,
                     parse_roots, ring_allgather, ring_reduce_scatter, shape, tree_broadcast,
                     tree_reduce, Shape)
from .registry import Spec, register

_GRID = ("hosts", "ranks_per_host")


def grid(spec: Spec) -> tuple[int, int]:
    """``(hosts, ranks_per_host)`` from the options, checked against P."""
    P = spec.nranks
    H, R = spec.opt("hosts"), spec.opt("ranks_per_host")
    for name, v in (("hosts", H), ("ranks_per_host", R)):
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
            raise InvalidArgument(f"{name} must be a positive integer, got {v!r}")
    if H is None and R is None:
        return P, 1
    if H is None:
        if P % R:
            raise InvalidArgument(f"ranks_per_host={R} does not divide {P} ranks")
        return P // R, R
    if R is None:
        if P % H:
            raise InvalidArgument(f"hosts={H} does not divide {P} ranks")
        return H, P // H
    if H * R != P:
        raise InvalidArgument(f"hosts x ranks_per_host = {H}x{R} is not {P} ranks")
    return H, R


def _opts(spec: Spec, H: int, R: int, **more) -> dict:
    return {"hosts": H, "ranks_per_host": R, **more}


def _chains(H: int, R: int) -> list[list[int]]:
    return [[h * R + j for j in range(R)] for h in range(H)]


def _finish(fl: Flow):
    b = fl.b
    for r in range(b.nranks):
        fl.finish(r, b.blocks("recv"))
    return b.build()


# --------------------------------------------------------------------------- hring


def _reduce_to_leaders(fl: Flow, H: int, R: int, k: int) -> None:
    """Every block (part h, piece s) reduced along each host's chain to local rank 0."""
    chains = _chains(H, R)
    for x in range(H * k):
        for chain in chains:
            chain_reduce(fl, chain, (x,))


@register("allreduce", "hring", "chain reduce to each host's first rank, ring allreduce "
          "among host leaders, chain broadcast inside each host",
          hierarchical=True, options=_GRID)
def hring_allreduce(spec: Spec):
    H, R = grid(spec)
    k = spec.nchunks
    lay = Layout(spec.count, H, k)
    b = spec.builder("hring", lay, lay, **_opts(spec, H, R))
    fl = Flow(b, ["recv"] * spec.nranks)
    _reduce_to_leaders(fl, H, R, k)
    leaders = [h * R for h in range(H)]
    seg = lambda i, s: (i * k + s,)  # noqa: E731
    ring_reduce_scatter(fl, leaders, seg, k)
    ring_allgather(fl, leaders, seg, k)
    chains = _chains(H, R)
    for x in range(H * k):
        for chain in chains:
            chain_broadcast(fl, chain, (x,))
    return _finish(fl)


def _ag_layouts(spec: Spec):
    k, P = spec.nchunks, spec.nranks
    return Layout(spec.count, 1, k), Layout(P * spec.count, P, k)


@register("allgather", "hring", "chain gather to each host's first rank, ring allgather of "
          "host blocks among leaders, chain broadcast inside each host",
          hierarchical=True, options=_GRID)
def hring_allgather(spec: Spec):
    H, R = grid(spec)
    P, k = spec.nranks, spec.nchunks
    send, recv = _ag_layouts(spec)
    b = spec.builder("hring", send, recv, **_opts(spec, H, R))
    fl = Flow(b, ["recv"] * P, src=None)
    for r in range(P):
        b.copy(r, "send", b.blocks("send"), "recv", b.blocks("recv", r))
    # Gather: local j passes its shard and those of locals j+1.. on to local j-1.
    for j in range(R - 1, 0, -1):
        for h in range(H):
            for q in range(h * R + j, h * R + R):
                for s in range(k):
                    fl.xfer(h * R + j, h * R + j - 1, (q * k + s,))
    leaders = [h * R for h in range(H)]
    ring_allgather(fl, leaders, lambda i, s: chunk_blocks(range(i * R, i * R + R), k, s), k)
    # Broadcast: local j gets everything but the shards of its own locals j.. (which it
    # gathered), host by host in the order the ring brings them to the leader (its own
    # host's first), so every rank runs one program up to a shift of its host.
    for j in range(1, R):
        for h in range(H):
            for t in range(H):
                h2 = (h - t) % H
                hi = h2 * R + (j if h2 == h else R)
                for s in range(k):
                    fl.xfer(h * R + j - 1, h * R + j, chunk_blocks(range(h2 * R, hi), k, s))
    return b.build()


# --------------------------------------------------------------------------- hdbtree


def _hdbtree_shapes(spec: Spec, H: int, R: int, root: int = 0) -> tuple[list[Shape], str]:
    """The two hierarchical trees, relabelled so that tree 0's root is ``root``: hosts are
    rotated by root's host and each chain by root's local rank."""
    pattern = tree_pattern(spec.opt("pattern", "tree"))
    hr, lr = divmod(root, R)

    def relabel(v: int) -> int:
        h, j = divmod(v, R)
        return ((h + hr) % H) * R + (j + lr) % R

    return [shape(t, relabel) for t in hierarchical_dbtree(H, R, pattern)], pattern


@register("allreduce", "hdbtree", "chain inside each host, NCCL double binary tree across "
          "hosts (pattern tree/split/balanced); each half reduced up and broadcast down one "
          "tree", hierarchical=True, options=_GRID + ("pattern",))
def hdbtree_allreduce(spec: Spec):
    H, R = grid(spec)
    trees, pattern = _hdbtree_shapes(spec, H, R)
    lay = Layout(spec.count, 2, spec.nchunks)
    b = spec.builder("hdbtree", lay, lay, **_opts(spec, H, R, pattern=pattern))
    fl = Flow(b, ["recv"] * spec.nranks)
    dbtree_allreduce(fl, trees, spec.nchunks)
    return _finish(fl)


@register("broadcast", "hdbtree", "chain inside each host, NCCL double binary tree across "
          "hosts (pattern tree/split/balanced); each tree carries half, pipelined",
          hierarchical=True, options=_GRID + ("pattern",))
def hdbtree_broadcast(spec: Spec):
    """Tree 0 is rooted at the root; tree 1's root first gets half 1 from the root (one
    extra hop unless they coincide), and the root, which already holds it, is skipped."""
    H, R = grid(spec)
    k, root = spec.nchunks, spec.root
    trees, pattern = _hdbtree_shapes(spec, H, R, root)
    lay = Layout(spec.count, 2, k)
    b = spec.builder("hdbtree", lay, lay, **_opts(spec, H, R, pattern=pattern))
    fl = Flow(b, ["recv"] * spec.nranks)
    for s in range(k):
        for t, tree in enumerate(trees):
            blocks = (t * k + s,)
            if tree.root != root:
                fl.xfer(root, tree.root, blocks)
            tree_broadcast(fl, tree, blocks, skip=root)
    fl.finish(root, b.blocks("recv"))
    return b.build()


@register("reduce", "hdbtree", "chain inside each host, NCCL double binary tree across "
          "hosts (pattern tree/split/balanced); each tree reduces half, pipelined",
          hierarchical=True, options=_GRID + ("pattern",))
def hdbtree_reduce(spec: Spec):
    """Half t is reduced up tree t; tree 1's root then hands its half to the root. Partial
    sums live in ``tmp`` except at the root (``recv`` exists only there)."""
    H, R = grid(spec)
    k, root = spec.nchunks, spec.root
    trees, pattern = _hdbtree_shapes(spec, H, R, root)
    lay = Layout(spec.count, 2, k)
    b = spec.builder("hdbtree", lay, lay, tmp=lay, **_opts(spec, H, R, pattern=pattern))
    fl = Flow(b, ["recv" if r == root else "tmp" for r in range(spec.nranks)])
    for s in range(k):
        for t, tree in enumerate(trees):
            blocks = (t * k + s,)
            tree_reduce(fl, tree, blocks)
            if tree.root != root:
                fl.xfer(tree.root, root, blocks)
    fl.finish(root, b.blocks("recv"))
    return b.build()


# --------------------------------------------------------------------------- hmcast

_MC = _GRID + ("roots",)


@register("allgather", "hmcast", "gather to each host's first rank, which multicasts the "
          "host's shards once (`roots` hosts at a time, token passing)",
          hierarchical=True, multicast=True, options=_MC)
def hmcast_allgather(spec: Spec):
    H, R = grid(spec)
    P, k = spec.nranks, spec.nchunks
    roots = parse_roots(spec)
    send, recv = _ag_layouts(spec)
    b = spec.builder("hmcast", send, recv, **_opts(spec, H, R, roots=roots))
    for r in range(P):
        b.copy(r, "send", b.blocks("send"), "recv", b.blocks("recv", r))
    for h in range(H):
        for j in range(1, R):
            b.send(h * R + j, h * R, "send", b.blocks("send"))
            b.recv(h * R, h * R + j, "recv", b.blocks("recv", h * R + j))
    mcast_round(b, [h * R for h in range(H)],
                lambda r: b.parts("recv", range(r, r + R)), roots)
    return b.build()


@register("broadcast", "hmcast", "the root multicasts the buffer once; every rank of every "
          "host receives it (the IR's multicast reaches a host's own ranks too)",
          hierarchical=True, multicast=True, options=_GRID)
def hmcast_broadcast(spec: Spec):
    H, R = grid(spec)
    k, root = spec.nchunks, spec.root
    lay = Layout(spec.count, 1, k)
    b = spec.builder("hmcast", lay, lay, **_opts(spec, H, R))
    b.copy(root, "send", b.blocks("send"), "recv", b.blocks("recv"))
    if spec.nranks > 1:
        # One stream per piece, so receivers can place piece s while s+1 is in flight.
        for s in range(k):
            b.mcast(root, "send", (s,))
        for r in range(spec.nranks):
            if r != root:
                for s in range(k):
                    b.mrecv(r, root, "recv", (s,))
    return b.build()


@register("allreduce", "hmcast", "chain reduce to each host's first rank, ring "
          "reduce-scatter among leaders, each leader multicasts its reduced part once "
          "(`roots` at a time)", hierarchical=True, multicast=True, options=_MC)
def hmcast_allreduce(spec: Spec):
    H, R = grid(spec)
    P, k = spec.nranks, spec.nchunks
    roots = parse_roots(spec)
    lay = Layout(spec.count, H, k)
    b = spec.builder("hmcast", lay, lay, **_opts(spec, H, R, roots=roots))
    fl = Flow(b, ["recv"] * P)
    _reduce_to_leaders(fl, H, R, k)
    leaders = [h * R for h in range(H)]
    ring_reduce_scatter(fl, leaders, lambda i, s: (i * k + s,), k)
    mcast_round(b, leaders, lambda r: b.blocks("recv", r // R), roots)
    if P > 1:
        for r in range(P):
            fl.put(r, b.blocks("recv"))
    return _finish(fl)


# --------------------------------------------------------------------------- ring2d


@register("allreduce", "ring2d", "2D ring (torus): ring reduce-scatter along each host, "
          "ring allreduce along each column of local ranks across hosts, ring allgather "
          "along each host", hierarchical=True, options=_GRID)
def ring2d_allreduce(spec: Spec):
    """Parts are indexed j*H + h: local rank j owns row segment j (H parts) after the row
    reduce-scatter, and column rank h of that column owns part j*H + h in between."""
    H, R = grid(spec)
    k = spec.nchunks
    lay = Layout(spec.count, H * R, k)
    b = spec.builder("ring2d", lay, lay, **_opts(spec, H, R))
    fl = Flow(b, ["recv"] * spec.nranks)
    rows = _chains(H, R)
    cols = [[h * R + j for h in range(H)] for j in range(R)]
    row_seg = lambda j, s: chunk_blocks(range(j * H, j * H + H), k, s)  # noqa: E731
    for row in rows:
        ring_reduce_scatter(fl, row, row_seg, k)
    for j, col in enumerate(cols):
        seg = lambda h, s, j=j: ((j * H + h) * k + s,)  # noqa: E731
        ring_reduce_scatter(fl, col, seg, k)
        ring_allgather(fl, col, seg, k)
    for row in rows:
        ring_allgather(fl, row, row_seg, k)
    return _finish(fl)


@register("allgather", "ring2d", "2D ring: ring allgather along each column of local ranks "
          "across hosts, then along each host", hierarchical=True, options=_GRID)
def ring2d_allgather(spec: Spec):
    H, R = grid(spec)
    P, k = spec.nranks, spec.nchunks
    send, recv = _ag_layouts(spec)
    b = spec.builder("ring2d", send, recv, **_opts(spec, H, R))
    fl = Flow(b, ["recv"] * P, src=None)
    for r in range(P):
        b.copy(r, "send", b.blocks("send"), "recv", b.blocks("recv", r))
    for j in range(R):
        col = [h * R + j for h in range(H)]
        ring_allgather(fl, col, lambda i, s, j=j: ((i * R + j) * k + s,), k)
    for h in range(H):
        ring_allgather(fl, _chains(H, R)[h],
                       lambda j, s: chunk_blocks(range(j, P, R), k, s), k)
    return b.build()
