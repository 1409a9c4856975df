"""``choose``: the one place an algorithm is picked.

Every candidate the communicator and the fabric allow is estimated
(:func:`polycast.planner.cost.estimate`) and the fastest wins; the :class:`Choice` says
which, with what pipelining, how long it should take, and why -- the other candidates'
estimates and the ones that were left out, with the reason.

A choice is a pure function of (collective, size, communicator shape, fabric): every rank
of a communicator passes the same values, so every rank picks the same algorithm.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..algorithms import algorithms
from ..collectives import Collective
from ..errors import PolycastError
from ..units import format_size
from .cost import Estimate, _fmt_s, algorithm_options, estimate
from .fabric import CommShape, Fabric

#: Collectives the symmetric-memory path serves (runtime/symm.py).
SYMM_COLLECTIVES = (Collective.ALLGATHER, Collective.REDUCE_SCATTER, Collective.ALLREDUCE,
                    Collective.BROADCAST)
SYMM = "symm"
#: Most ranks one rank may send to at once (in one phase of its schedule). Beyond it the
#: costs the model leaves out -- incast at the receivers, a NIC's message rate, a socket or
#: queue pair per peer -- would decide, so such schedules are not candidates (a direct
#: allgather at 1024 ranks keeps 1023 messages in flight per rank).
MAX_FANOUT = 128


def size_label(nbytes: int) -> str:
    """``64MiB`` when exact, else ``63.99 MiB`` (sizes rounded to whole elements per rank)."""
    text = format_size(nbytes)
    if not text.endswith("B") or text[-2] in "KMGTi" or nbytes < 1024:
        return text
    for unit, mult in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= mult:
            return f"{nbytes / mult:.2f} {unit}"
    return text


@dataclass(frozen=True)
class Choice:
    """What ``auto`` runs for one call, and why."""

    collective: Collective
    nbytes: int
    algorithm: str              # an engine algorithm, or "symm" (symmetric memory)
    nchunks: int
    estimate_seconds: float
    reasons: tuple[str, ...]
    candidates: tuple[Estimate, ...] = ()        # every estimate, fastest first
    excluded: tuple[tuple[str, str], ...] = ()   # (algorithm, why it was not a candidate)
    shape: CommShape | None = None
    fabric: str = ""

    @property
    def path(self) -> str:
        return SYMM if self.algorithm == SYMM else "engine"

    def explain(self) -> str:
        """Every candidate's estimate, NCCL_DEBUG-style, one per line."""
        head = (f"{self.collective} {size_label(self.nbytes)} on {self.shape}: "
                f"{self.algorithm}" + (f" nchunks {self.nchunks}" if self.nchunks > 1 else "")
                + f", {_fmt_s(self.estimate_seconds)}")
        lines = [head, *("  " + r for r in self.reasons)]
        for e in self.candidates:
            mark = "*" if (e.algorithm, e.nchunks) == (self.algorithm, self.nchunks) else " "
            lines.append(f" {mark} {e.describe()}")
        for name, why in self.excluded:
            lines.append(f"   {name}: not a candidate ({why})")
        return "\n".join(lines)

    def to_json(self) -> dict:
        return {
            "collective": str(self.collective), "nbytes": self.nbytes,
            "algorithm": self.algorithm, "nchunks": self.nchunks,
            "estimate_s": self.estimate_seconds, "path": self.path,
            "reasons": list(self.reasons),
            "candidates": [{"algorithm": e.algorithm, "nchunks": e.nchunks,
                            "estimate_s": e.seconds, "latency_s": e.latency_s,
                            "gbps": e.gbps if math.isfinite(e.gbps) else None,
                            "bound": e.bound, "how": e.how} for e in self.candidates],
            "excluded": [{"algorithm": a, "why": w} for a, w in self.excluded],
        }


def candidates(coll: Collective, shape: CommShape, fabric: Fabric, *,
               multicast: bool | None = None, symm: bool | None = None
               ) -> tuple[list[str], list[tuple[str, str]]]:
    """The algorithms ``auto`` may run for this communicator on this fabric, and the others
    with the reason they are left out. ``multicast``/``symm`` override the fabric's
    capability (e.g. the multicast group could not be joined)."""
    coll = Collective.parse(coll)
    mc = fabric.multicast if multicast is None else multicast
    sy = fabric.symm if symm is None else symm
    P = shape.nranks
    ok: list[str] = []
    out: list[tuple[str, str]] = []
    for algo in algorithms(coll):
        opts = algorithm_options(coll, algo.name, shape)
        why = algo.unsupported_reason(P, opts)
        if why is None and algo.multicast and not mc:
            why = "needs multicast, which this fabric lacks"
        if why is None and algo.innet and not fabric.innet:
            why = "needs in-network reduction (elsewhere it runs as the direct pattern)"
        if why is None and algo.hierarchical and (shape.hosts < 2 or shape.ranks_per_host < 2):
            why = ("hierarchical: with " + ("one host" if shape.hosts < 2 else
                                            "one rank per host")
                   + " it is its flat form")
        if why is None:
            ok.append(algo.name)
        else:
            out.append((algo.name, why))
    if coll in SYMM_COLLECTIVES and P > 1:
        if sy and shape.single_host and fabric.symm_costs:
            ok.append(SYMM)
        elif sy and shape.single_host:
            out.append((SYMM, "no calibration of symmetric memory"))
    return ok, out


def choose(collective, nbytes: int, shape: CommShape, fabric: Fabric, *, root: int = 0,
           multicast: bool | None = None, symm: bool | None = None,
           only: tuple[str, ...] | None = None) -> Choice:
    """Pick the fastest candidate for one call (see the module docstring). ``only``
    restricts the candidates (e.g. the engine algorithms, when symmetric memory is out)."""
    coll = Collective.parse(collective)
    if not isinstance(nbytes, int) or nbytes < 0:
        raise PolycastError(f"nbytes must be a non-negative integer, got {nbytes!r}")
    names, excluded = candidates(coll, shape, fabric, multicast=multicast, symm=symm)
    if only is not None:
        excluded += [(n, "not asked for") for n in names if n not in only]
        names = [n for n in names if n in only]
    if not names:
        raise PolycastError(f"no {coll} algorithm for {shape} on {fabric.name}: "
                            + "; ".join(f"{a}: {w}" for a, w in excluded))
    ests = []
    for name in names:
        if name == SYMM:
            ests.append(symm_estimate(coll, nbytes, shape, fabric))
        else:
            ests.append(estimate(coll, name, nbytes, shape, fabric, root))
    wide = [e for e in ests if e.fanout > MAX_FANOUT]
    if wide and len(wide) < len(ests):
        ests = [e for e in ests if e.fanout <= MAX_FANOUT]
        excluded = list(excluded) + [
            (e.algorithm, f"sends to {e.fanout} ranks at once, more than {MAX_FANOUT}: "
                          "incast and NIC message rates, which the model leaves out, "
                          "would decide") for e in wide]
    order = sorted(range(len(ests)), key=lambda i: (ests[i].seconds, i))
    ranked = tuple(ests[i] for i in order)
    best = ranked[0]
    reasons = [f"{len(ranked)} candidate(s) on {fabric.name} ({fabric.source})"]
    if len(ranked) > 1:
        nxt = ranked[1]
        ratio = nxt.seconds / best.seconds if best.seconds > 0 else math.inf
        reasons.append(f"{best.algorithm} is {ratio:.2f}x faster than {nxt.algorithm} "
                       f"({_fmt_s(nxt.seconds)})")
    reasons.append("latency-bound" if best.bound == "latency"
                   else f"bandwidth-bound: {best.bound}")
    if best.nchunks > 1:
        reasons.append(f"pipelined in {best.nchunks} chunks per part")
    return Choice(coll, nbytes, best.algorithm, best.nchunks, best.seconds, tuple(reasons),
                  ranked, tuple(excluded), shape, fabric.name)


def symm_estimate(coll: Collective, nbytes: int, shape: CommShape, fabric: Fabric
                  ) -> Estimate:
    """The symmetric-memory path's time from the fabric's calibration: ``a + b * S`` per
    collective, measured at some rank counts; the nearest one is scaled to this P (the
    fixed cost grows with the ranks a barrier waits for; the copies with the ranks that
    share the host's cores)."""
    table = {int(p): ab for p, ab in dict(fabric.symm_costs).get(str(coll), ())}
    P = shape.nranks
    if not table:
        return Estimate(SYMM, 1, math.inf, math.inf, 0.0, "uncalibrated", "no calibration",
                        SYMM)
    near = min(table, key=lambda p: (abs(p - P), p))
    a, b = table[near]
    cores = fabric.cores or P
    a *= P / near
    b *= max(1.0, P / cores) / max(1.0, near / cores)
    secs = a + b * nbytes
    gbps = 8 / b / 1e9 if b > 0 else math.inf
    how = f"calibrated at P={near}" + (f", scaled to P={P}" if near != P else "")
    return Estimate(SYMM, 1, secs, a, gbps, "latency" if a >= b * nbytes else "memory copies",
                    how, SYMM)
