"""Vectorised generators: the columns (:mod:`polycast.schedule.compact`) of algorithms whose
every rank runs one program up to a shift, built with numpy for all ranks at once; the
rings as a :class:`~polycast.schedule.compact.Template` (one row per program position,
its columns built only if asked for).

Each gives exactly the columns of the algorithm's own generator -- steps, peers, message
ordinals, element counts and the dependencies the builder infers -- which
``tests/test_compact.py`` checks for every P up to 33 and several pipelining depths. Only
the uniform call (no vector ``counts``, one channel) has a compact form; anything else is
built by the algorithm's own generator.
"""

from __future__ import annotations

import numpy as np

from ..schedule.compact import Columns, HostRing, Template, TokenMulticast, block_lengths
from ..schedule.ir import Kind, Layout
from .registry import Spec, register_compact

_SEND, _RECV, _COPY, _MCAST, _MRECV = (int(Kind.SEND), int(Kind.RECV), int(Kind.COPY),
                                       int(Kind.MCAST), int(Kind.MRECV))


def _columns(P: int, kind, peer, tag, nelems, deps) -> Columns:
    """Columns from per-rank rows: ``kind``/``tag`` (L,) or (P, L), ``peer``/``nelems``
    (P, L), ``deps`` a list (per template step) of dependency positions, the same on
    every rank."""
    L = kind.shape[-1]
    kind = np.broadcast_to(kind, (P, L)).astype(np.int8).ravel()
    tag = np.broadcast_to(tag, (P, L)).astype(np.int32).ravel()
    local = np.repeat(np.arange(P, dtype=np.int32), L)
    counts = np.array([len(d) for d in deps], dtype=np.int32)
    flat_t = np.array([x for d in deps for x in d], dtype=np.int64)
    dep_counts = np.tile(counts, P)
    base = (np.arange(P, dtype=np.int64) * L)[:, None]
    dep_flat = (base + flat_t[None, :]).ravel()
    return Columns(P, kind, local, np.asarray(peer, np.int32).ravel(), tag,
                   np.asarray(nelems, np.int64).ravel(), dep_counts, dep_flat)


def _template(P: int, kind, delta, tag, tables, table_of, shift, deps, **options) -> Template:
    """A :class:`Template` from per-position lists (``deps``: a tuple of earlier positions
    per position)."""
    counts = np.array([len(d) for d in deps], dtype=np.int32)
    flat = np.fromiter((x for d in deps for x in d), np.int64, int(counts.sum()))
    a = lambda x: np.asarray(x, dtype=np.int64)                        # noqa: E731
    return Template(P, np.asarray(kind, np.int8), a(delta) % P, a(tag),
                    np.asarray(tables, np.int64).reshape(-1, P), a(table_of), a(shift),
                    counts, flat, options)


def _ring_rows(P: int, k: int, blen) -> np.ndarray:
    """Rows of a ring template's element tables: row s is piece s of every part."""
    return np.asarray(blen, np.int64).reshape(P, k).T


@register_compact("allgather", "ring", template=True)
def ring_allgather(spec: Spec) -> Template:
    """copy; then per step i and piece s: send (r-i)%P's piece to r+1, receive (r-i-1)%P's
    from r-1. A send depends on the copy (i = 0) or on the receive of the same piece one
    step earlier; receives write blocks nothing read before (no dependency)."""
    P, k = spec.nranks, spec.nchunks
    rows = _ring_rows(P, k, block_lengths(Layout(P * spec.count, P, k)))
    n = (P - 1) * k
    L = 1 + 2 * n
    j = np.arange(n, dtype=np.int64)
    kind = np.empty(L, np.int64)
    kind[0], kind[1::2], kind[2::2] = _COPY, _SEND, _RECV
    delta = np.zeros(L, np.int64)
    delta[1::2], delta[2::2] = 1, -1
    tag = np.empty(L, np.int64)
    tag[0] = -1
    tag[1::2] = tag[2::2] = j
    table_of = np.empty(L, np.int64)
    table_of[0] = k                                  # the copy: count elements
    table_of[1::2] = table_of[2::2] = j % k
    shift = np.zeros(L, np.int64)
    shift[1::2], shift[2::2] = j // k, j // k + 1
    tables = np.vstack([rows, np.full((1, P), spec.count, np.int64)])
    deps = [()] + [d for jj in range(n)
                   for d in (((0,) if jj < k else (2 + 2 * (jj - k),)), ())]
    return _template(P, kind, delta, tag, tables, table_of, shift, deps)


@register_compact("allgather", "mcast", template=True)
def mcast_allgather(spec: Spec) -> TokenMulticast:
    """copy; the token from r-1 (unless r starts a sequence); the multicast of r's shard
    (after the token); the token to r+1 (unless it starts one); an MRECV from every other
    rank: a :class:`TokenMulticast`, its columns built by :func:`_mcast_columns`."""
    P = spec.nranks
    roots = min(max(1, int(spec.opt("roots", 2))), P)
    firsts = np.zeros(P + 1, bool)
    firsts[[g * P // roots for g in range(roots)]] = True
    firsts[P] = True                                     # no rank P to pass a token to
    part = block_lengths(Layout(P * spec.count, P, 1))
    return TokenMulticast(P, spec.count, part, firsts,
                          lambda: _mcast_columns(spec, roots, firsts, part),
                          {"roots": roots})


def _mcast_columns(spec: Spec, roots: int, firsts, part) -> Columns:
    """The columns of :func:`mcast_allgather`. Programs differ in length by the tokens:
    built per kind of rank."""
    P = spec.nranks
    rows = []
    for r in range(P):
        kinds, peers, tags, nels, deps = [_COPY], [-1], [-1], [spec.count], [()]
        token = ()
        if not firsts[r]:
            kinds.append(_RECV), peers.append(r - 1), tags.append(0), nels.append(0)
            deps.append(())
            token = (len(kinds) - 1,)
        m = len(kinds)
        kinds.append(_MCAST), peers.append(-1), tags.append(0), nels.append(spec.count)
        deps.append(token)
        if not firsts[r + 1]:
            kinds.append(_SEND), peers.append(r + 1), tags.append(0), nels.append(0)
            deps.append((m,))
        rows.append((kinds, peers, tags, nels, deps))
    # every program ends with the MRECVs from every other rank, in rank order
    heads = [len(x[0]) for x in rows]
    L = np.array(heads, np.int64) + (P - 1)
    starts = np.concatenate([[0], np.cumsum(L)[:-1]])
    total = int(L.sum())
    kind = np.full(total, _MRECV, np.int8)
    peer = np.empty(total, np.int32)
    tag = np.zeros(total, np.int32)
    nel = np.empty(total, np.int64)
    dep_counts = np.zeros(total, np.int32)
    dep_flat = []
    others = np.arange(P)
    for r, (kinds, peers, tags, nels, deps) in enumerate(rows):
        b, h = int(starts[r]), heads[r]
        kind[b:b + h] = kinds
        peer[b:b + h] = peers
        tag[b:b + h] = tags
        nel[b:b + h] = nels
        for j, d in enumerate(deps):
            dep_counts[b + j] = len(d)
            dep_flat.extend(b + x for x in d)
        rest = others[others != r]
        peer[b + h:b + h + P - 1] = rest
        nel[b + h:b + h + P - 1] = part[rest]
    local = np.repeat(np.arange(P, dtype=np.int32), L)
    return Columns(P, kind, local, peer, tag, nel, dep_counts,
                   np.array(dep_flat, dtype=np.int64), options={"roots": roots})


@register_compact("allgather", "hmcast", template=True)
def hmcast_allgather(spec: Spec) -> TokenMulticast:
    """Hosts of R ranks (rank = host * R + local): every local sends its shard to its host's
    leader (local 0); the leaders then run :func:`mcast_allgather`'s token ring, each
    multicasting its host's R shards, which every rank receives (its own leader's too):
    a :class:`TokenMulticast` over the H leaders, its columns built by
    :func:`_hmcast_columns`."""
    from .hierarchical import grid
    from .phases import parse_roots
    H, R = grid(spec)
    opts = {"hosts": H, "ranks_per_host": R, "roots": parse_roots(spec)}
    roots = min(opts["roots"], H)
    firsts = np.zeros(H + 1, bool)
    firsts[[g * H // roots for g in range(roots)]] = True
    firsts[H] = True
    part = np.full(H, R * spec.count, np.int64)
    return TokenMulticast(spec.nranks, R * spec.count, part, firsts,
                          lambda: _hmcast_columns(spec, H, R, firsts), opts,
                          ranks_per_host=R, gather_nelems=spec.count)


def _hmcast_columns(spec: Spec, H: int, R: int, firsts) -> Columns:
    """The columns of :func:`hmcast_allgather`: a leader copies, receives its locals'
    shards, takes the token, multicasts (after all of those), passes the token; a local
    copies and sends its shard to the leader; then every rank receives every other
    leader's stream in host order (a local's from its own leader after its copy, which
    wrote one of that stream's blocks)."""
    P, n = spec.nranks, spec.count
    kinds, peers, nels, deps = [], [], [], []
    for r in range(P):
        h, j = divmod(r, R)
        k = [_COPY]
        pe = [-1]
        ne = [n]
        de = [()]
        if j == 0:
            for i in range(1, R):
                k.append(_RECV), pe.append(r + i), ne.append(n), de.append(())
            if not firsts[h]:
                k.append(_RECV), pe.append(r - R), ne.append(0), de.append(())
            k.append(_MCAST), pe.append(-1), ne.append(R * n)
            de.append(tuple(range(len(de))))
            if not firsts[h + 1]:
                k.append(_SEND), pe.append(r + R), ne.append(0), de.append((len(de) - 1,))
        else:
            k.append(_SEND), pe.append(h * R), ne.append(n), de.append(())
        for h2 in range(H):
            if h2 * R != r:
                k.append(_MRECV), pe.append(h2 * R), ne.append(R * n)
                de.append((0,) if h2 == h else ())
        kinds.append(k), peers.append(pe), nels.append(ne), deps.append(de)
    L = np.array([len(k) for k in kinds], np.int64)
    starts = np.concatenate([[0], np.cumsum(L)[:-1]])
    dep_counts = np.array([len(d) for de in deps for d in de], np.int32)
    dep_flat = np.fromiter((int(starts[r]) + x for r, de in enumerate(deps) for d in de
                            for x in d), np.int64, int(dep_counts.sum()))
    kind = np.fromiter((x for k in kinds for x in k), np.int8, int(L.sum()))
    tag = np.where(kind == _COPY, -1, 0).astype(np.int32)
    return Columns(P, kind, np.repeat(np.arange(P, dtype=np.int32), L),
                   np.fromiter((x for p in peers for x in p), np.int32, int(L.sum())), tag,
                   np.fromiter((x for e in nels for x in e), np.int64, int(L.sum())),
                   dep_counts, dep_flat,
                   options={"hosts": H, "ranks_per_host": R, "roots": int(firsts[:H].sum())})


@register_compact("allgather", "hring", template=True)
def hring_allgather(spec: Spec) -> HostRing:
    """The hierarchical ring allgather of one piece as a :class:`HostRing` (several pieces:
    the algorithm's own schedule); its columns built by :func:`_hring_columns`."""
    from .hierarchical import grid
    H, R = grid(spec)
    if spec.nchunks != 1:
        raise NotImplementedError
    return HostRing(spec.nranks, R, spec.count, lambda: _hring_columns(spec, H, R),
                    {"hosts": H, "ranks_per_host": R})


def _rows_to_columns(P: int, rows, options: dict) -> Columns:
    """Columns from per-rank lists of (kind, peer, tag, nelems, deps) in program order."""
    L = np.array([len(x) for x in rows], np.int64)
    starts = np.concatenate([[0], np.cumsum(L)[:-1]])
    steps = [st for x in rows for st in x]
    n = len(steps)
    dep_counts = np.fromiter((len(st[4]) for st in steps), np.int32, n)
    dep_flat = np.fromiter((int(starts[r]) + d for r, x in enumerate(rows) for st in x
                            for d in st[4]), np.int64, int(dep_counts.sum()))
    col = lambda i, dt: np.fromiter((st[i] for st in steps), dt, n)    # noqa: E731
    return Columns(P, col(0, np.int8), np.repeat(np.arange(P, dtype=np.int32), L),
                   col(1, np.int32), col(2, np.int32), col(3, np.int64), dep_counts,
                   dep_flat, options=options)


def _hring_columns(spec: Spec, H: int, R: int) -> Columns:
    """The columns of :func:`hring_allgather`, rank by rank: copy; the gather's receives
    from j+1 (shards j+1..) and sends to j-1 (its own shard after the copy, each other
    after its receive); a leader's ring (send after what it sends was written, receive);
    the broadcast's receives from j-1 and sends to j+1 (its own host's shards first, after
    the copy and that first receive; each block then after its receive)."""
    P, n = spec.nranks, spec.count
    rows = []
    for r in range(P):
        h, j = divmod(r, R)
        x = [(_COPY, -1, -1, n, ())]
        got = {}                                        # shard -> position of its RECV
        for i, q in enumerate(range(j + 1, R)):
            got[q] = len(x)
            x.append((_RECV, r + 1, i, n, ()))
        if j:
            for i, q in enumerate(range(j, R)):
                x.append((_SEND, r - 1, i, n, (0,) if q == j else (got[q],)))
        ring = []                                       # position of each ring RECV
        if j == 0 and H > 1:
            nxt, prv = ((h + 1) % H) * R, ((h - 1) % H) * R
            for t in range(H - 1):
                x.append((_SEND, nxt, t, R * n,
                          (0, *got.values()) if t == 0 else (ring[t - 1],)))
                ring.append(len(x))
                x.append((_RECV, prv, t, R * n, ()))
        bcast = []                                      # position of each broadcast RECV
        if j:
            for t in range(H):
                bcast.append(len(x))
                x.append((_RECV, r - 1, t, (j if t == 0 else R) * n, ()))
        if j < R - 1:
            for t in range(H):
                if t == 0:
                    deps = (0, bcast[0]) if j else (0,)
                else:
                    deps = (bcast[t],) if j else (ring[t - 1],)
                x.append((_SEND, r + 1, t, ((j + 1) if t == 0 else R) * n, deps))
        rows.append(x)
    return _rows_to_columns(P, rows, {"hosts": H, "ranks_per_host": R})


@register_compact("alltoall", "pairwise")
def pairwise_alltoall(spec: Spec) -> Columns:
    """copy of r's own part; then per round i: send part r+i to r+i (after round i-1's
    receive), receive part r-i from r-i."""
    P = spec.nranks
    k = spec.nchunks
    plen = block_lengths(Layout(P * spec.count, P, k)).reshape(P, k).sum(axis=1)
    L = 1 + 2 * (P - 1)
    r = np.arange(P, dtype=np.int64)[:, None]
    i = np.arange(1, P, dtype=np.int64)[None, :]
    kind = np.empty(L, np.int64)
    kind[0], kind[1::2], kind[2::2] = _COPY, _SEND, _RECV
    tag = np.zeros(L, np.int64)
    tag[0] = -1
    peer = np.empty((P, L), np.int64)
    peer[:, 0] = -1
    peer[:, 1::2] = (r + i) % P
    peer[:, 2::2] = (r - i) % P
    nel = np.empty((P, L), np.int64)
    nel[:, 0] = plen[r[:, 0]]
    nel[:, 1::2] = plen[(r + i) % P]
    nel[:, 2::2] = plen[(r - i) % P]
    deps = [()] + [d for j in range(P - 1)
                   for d in ((() if j == 0 else (2 * j,)), ())]
    return _columns(P, kind, peer, tag, nel, deps)


def _ring_rs_positions(P: int, k: int):
    """The ring reduce-scatter's 3 n positions (n = (P-1) k): per round t and piece s,
    send part (r-t-1)%P to r+1 (after the receive that made it, from round 1), copy r's
    own input of part (r-t-2)%P, receive-and-reduce r-1's partial sum of it (after that
    copy). Returns (kind, delta, tag, table_of, shift, deps) as lists of length 3 n."""
    n = (P - 1) * k
    j = np.arange(n, dtype=np.int64)
    t, s = j // k, j % k
    kind = np.tile(np.array([_SEND, _COPY, _RECV], np.int64), n)
    delta = np.zeros(3 * n, np.int64)
    delta[0::3], delta[2::3] = 1, -1
    tag = np.full(3 * n, -1, np.int64)
    tag[0::3] = tag[2::3] = j
    table_of = np.repeat(s, 3)
    shift = np.empty(3 * n, np.int64)
    shift[0::3], shift[1::3], shift[2::3] = t + 1, t + 2, t + 2
    deps = []
    for jj in range(n):
        deps += [() if jj < k else (3 * (jj - k) + 2,), (), (3 * jj + 1,)]
    return kind, delta, tag, table_of, shift, deps


@register_compact("reduce_scatter", "ring", template=True)
def ring_reduce_scatter(spec: Spec) -> Template:
    """The ring rounds (:func:`_ring_rs_positions`); finally copy the reduced part r into
    recv (after the last round's receives)."""
    P, k = spec.nranks, spec.nchunks
    if P < 2:
        raise NotImplementedError
    rows = _ring_rows(P, k, block_lengths(Layout(P * spec.count, P, k)))
    kind, delta, tag, table_of, shift, deps = _ring_rs_positions(P, k)
    tables = np.vstack([rows, rows.sum(axis=0)[None, :]])
    deps.append(tuple(3 * ((P - 2) * k + x) + 2 for x in range(k)))
    return _template(P, np.r_[kind, _COPY], np.r_[delta, 0], np.r_[tag, -1], tables,
                     np.r_[table_of, k], np.r_[shift, 0], deps)


@register_compact("allreduce", "ring", template=True)
def ring_allreduce(spec: Spec) -> Template:
    """The ring reduce-scatter's rounds in place in recv (no final copy), then a ring
    allgather of the reduced parts: per round u and piece s, send part (r-u)%P (after the
    reduce-scatter's last receive of it, or the previous round's receive), receive part
    (r-u-1)%P (after the reduce-scatter wrote it and its next send read it)."""
    P, k = spec.nranks, spec.nchunks
    if P < 2:
        raise NotImplementedError
    rows = _ring_rows(P, k, block_lengths(Layout(spec.count, P, k)))
    kind, delta, tag, table_of, shift, deps = _ring_rs_positions(P, k)
    n = (P - 1) * k
    j = np.arange(n, dtype=np.int64)
    u, s = j // k, j % k
    ag_kind = np.tile(np.array([_SEND, _RECV], np.int64), n)
    ag_delta = np.tile(np.array([1, -1], np.int64), n)
    ag_tag = np.repeat(n + j, 2)
    ag_shift = np.empty(2 * n, np.int64)
    ag_shift[0::2], ag_shift[1::2] = u, u + 1
    for jj in range(n):
        uu, x = divmod(jj, k)
        send = (3 * ((P - 2) * k + x) + 2,) if uu == 0 else (3 * n + 2 * (jj - k) + 1,)
        recv = () if uu == 0 else (3 * ((uu - 1) * k + x) + 2, 3 * (uu * k + x))
        deps += [send, recv]
    return _template(P, np.r_[kind, ag_kind], np.r_[delta, ag_delta], np.r_[tag, ag_tag],
                     rows, np.r_[table_of, np.repeat(s, 2)], np.r_[shift, ag_shift], deps)
