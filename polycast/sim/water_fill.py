"""Progressive filling (water filling): the max-min fair rates of a group of flows on what
the other flows leave of each link, and the link that stopped each. The network model's
Python settle (:mod:`polycast.sim.network`) fills its regions with these; the compiled model
(``_network_settle.c``) does the same in C. The flows are the network's ``Flow`` objects
(``lst``/``links``, ``cap``, ``rate``)."""

from __future__ import annotations

import math

import numpy as np

_INF = math.inf


def fill_small(group: list, capl: list, load) -> tuple[list, list]:
    """Progressive filling of a few flows on what the others leave (Python: below numpy's
    call overhead); per flow the link that stopped it (-1: its own limit). A link only one
    flow of the group crosses is part of that flow's own bound; the shared links fill."""
    n = len(group)
    members: dict[int, list[int]] = {}
    for i, f in enumerate(group):
        for l in f.lst:
            m = members.get(l)
            if m is None:
                members[l] = [i]
            else:
                m.append(i)
    bound = [f.cap for f in group]
    by = [-1] * n
    # Shared links, one per set of members: of links the same flows cross, the one with
    # the least left (the first of those) is the only one that can stop them first, as
    # every freeze takes the same from all of them (multicast trees in a region share
    # hundreds of links). Kept at that link's place among the links, so ties between
    # sets resolve as over every link.
    shared = []                              # [left, open members, members, link, place]
    by_set: dict[tuple, list] = {}
    mine: list[list] = [[] for _ in range(n)]
    for pos, (l, m) in enumerate(members.items()):
        r = capl[l] - load[l]
        for i in m:
            r += group[i].rate
        if r < 0.0:
            r = 0.0                          # the others' round-off past the capacity
        if len(m) == 1:
            i = m[0]
            if r < bound[i]:
                bound[i], by[i] = r, l
            continue
        key = tuple(m)
        s = by_set.get(key)
        if s is None:
            s = by_set[key] = [r, len(m), m, l, pos]
            shared.append(s)
            for i in m:
                mine[i].append(s)
        elif r < s[0]:
            s[0], s[3], s[4] = r, l, pos
    shared.sort(key=lambda s: s[4])
    rate = bound[:]
    open_ = [bool(x) for x in mine]
    left = sum(open_)
    while left:
        lam, which = _INF, None
        for s in shared:
            if s[1]:
                v = s[0] / s[1]
                if v < lam:
                    lam, which = v, s
        bmin = min(bound[i] for i in range(n) if open_[i])
        if bmin <= lam * (1 + 1e-12):
            frz = [i for i in range(n) if open_[i] and bound[i] <= bmin * (1 + 1e-12)]
            for i in frz:
                rate[i] = min(bound[i], lam)
        else:
            frz = [i for i in which[2] if open_[i]]
            for i in frz:
                rate[i] = lam
                by[i] = which[3]
        for i in frz:
            open_[i] = False
            left -= 1
            x = rate[i]
            for s in mine[i]:
                s[0] -= x
                s[1] -= 1
    return [x if x > 0 else 0.0 for x in rate], by


def fill_numpy(group: list, cap: np.ndarray, load: np.ndarray, old=None):
    """Progressive filling of ``group`` on what the others leave, over incidences; per flow
    the link that stopped it (-1: its own limit). ``old``: the group's rates in ``load``
    (default: each flow's rate)."""
    n = len(group)
    lens = [len(f.links) for f in group]
    inc_links = np.concatenate([f.links for f in group])
    inc_flow = np.repeat(np.arange(n), lens)
    ulinks, local = np.unique(inc_links, return_inverse=True)
    nl = nl0 = len(ulinks)
    old = np.array([f.rate for f in group]) if old is None else old
    own = np.bincount(local, weights=old[inc_flow], minlength=nl)
    rem = np.maximum(cap[ulinks] - (load[ulinks] - own), 0.0)
    caps = np.array([f.cap for f in group])
    capped = np.flatnonzero(caps < _INF)
    if len(capped):
        # A sender's own limit is a private link of that capacity.
        local = np.concatenate([local, nl + np.arange(len(capped))])
        inc_flow = np.concatenate([inc_flow, capped])
        rem = np.concatenate([rem, caps[capped]])
        nl += len(capped)
    rate = np.zeros(n)
    by = np.full(n, -1, np.int64)
    frozen = np.zeros(n, dtype=bool)
    active = np.ones(len(local), dtype=bool)
    for _ in range(n + 1):          # each round freezes at least one flow
        cnt = np.bincount(local[active], minlength=nl)
        used = cnt > 0
        if not used.any():
            break
        share = np.full(nl, np.inf)
        share[used] = rem[used] / cnt[used]
        m = share.min()
        bottleneck = share <= m * (1 + 1e-12)
        hit = active & bottleneck[local]
        newly = np.zeros(n, dtype=bool)
        newly[inc_flow[hit]] = True
        rate[newly] = m
        # the link that stopped each (its own limit, a private link, wins a tie)
        o = np.argsort(local[hit], kind="stable")
        by[inc_flow[hit][o]] = local[hit][o]
        frozen |= newly
        sel = active & frozen[inc_flow]
        rem -= m * np.bincount(local[sel], minlength=nl)
        np.maximum(rem, 0.0, out=rem)
        active &= ~sel
    by = np.where((by < 0) | (by >= nl0), -1, ulinks[np.clip(by, 0, nl0 - 1)])
    return rate.tolist(), by.tolist()


def water_fill(group: list, cap: np.ndarray) -> np.ndarray:
    """Max-min fair rates of ``group`` alone on the links (progressive filling from
    scratch): the reference ``Network.check_rates`` compares with."""
    rate, _ = fill_numpy(group, cap, np.zeros(len(cap)), old=np.zeros(len(group)))
    return np.asarray(rate)
