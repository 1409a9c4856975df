"""``polycast tune --calibrate``: measure this machine, or a modelled fabric, and fit the
planner's parameters to what was measured.

This machine (:func:`calibrate_local`): local ranks run a few engine algorithms at a few
sizes over shared memory and over TCP, multicast broadcast and allgather, and the
symmetric-memory path of each collective (``polycast bench`` does the measuring, every
size repeated, pipelining fixed at one chunk so the model sees the very schedules that
ran). Then:

* per link class (shm, tcp): the one-way latency, the CPU cost per message, the port rate
  and the host's aggregate rate are fitted so the model's times (the schedules' own
  analysis, :mod:`polycast.planner.analyze`) match the measured ones, minimising the
  squared log error over every point (coordinate descent over the four parameters);
* multicast: the share of the port a stream achieves (receivers handle every datagram);
* symmetric memory: ``a + b * S`` per collective (least squares in relative error).

A modelled fabric (:func:`calibrate_modelled`): the same algorithms are simulated at a
small rank count on the topology and the model's latency and bandwidth terms scaled to
match the simulator (which is exact up to the flow model; scales near 1 say the model
reads the fabric right).

The result is written as a profile (:mod:`polycast.planner.profile`).
"""

from __future__ import annotations

import contextlib
import math
import os
import time

from ..algorithms import build, get
from ..collectives import Collective
from ..planner import profile as _profile
from ..planner.analyze import analyze
from ..planner.fabric import TOP, Fabric, Level

#: (collective, algorithms) measured per link class; sizes are S (nccl-tests).
ENGINE_PROBES = (
    ("allgather", ("ring", "recdoubling", "direct")),
    ("allreduce", ("ring", "recdoubling")),
    ("broadcast", ("binomial", "chain")),
    ("reduce_scatter", ("ring",)),
)
TCP_PROBES = (("allgather", ("ring", "recdoubling")), ("allreduce", ("ring",)))
MCAST_PROBES = (("broadcast", ("mcast",)), ("allgather", ("mcast",)))
SYMM_COLLECTIVES = ("allgather", "reduce_scatter", "allreduce", "broadcast")
SIZES = (1 << 10, 64 << 10, 1 << 20, 8 << 20)
PARAMS = ("latency_s", "msg_overhead_s", "port_gbps", "host_gbps")


@contextlib.contextmanager
def _env(**values):
    old = {k: os.environ.get(k) for k in values}
    try:
        for k, v in values.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = str(v)
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _measure(coll: str, algos, nranks: int, sizes, iters: int, transport: str | None,
             log) -> list[dict]:
    from .bench import measure
    t0 = time.perf_counter()
    rows = measure(coll, nranks, list(algos), list(sizes), iters=iters, warmup=2,
                   check=False, transport=transport, timeout_seconds=600)
    log(f"  {coll} {','.join(algos)} over {transport or 'shm'}: {len(rows)} rows in "
        f"{time.perf_counter() - t0:.1f} s")
    return rows


def _fabric(params: dict, cores: int, pacing: float = 1.0, multicast: bool = False) -> Fabric:
    return Fabric("calibrating", params["port_gbps"],
                  (Level("host", TOP, params["latency_s"]),), multicast=multicast,
                  msg_overhead_s=params["msg_overhead_s"], host_gbps=params["host_gbps"],
                  cores=cores, mcast_pacing=pacing)


def _predict(rows: list[dict], fab: Fabric) -> list[float]:
    out = []
    cache: dict = {}
    for r in rows:
        coll = Collective.parse(r["collective"])
        algo = r["algorithm"]
        key = (coll, algo, r["nranks"])
        terms = cache.get(key)
        if terms is None:
            P = r["nranks"]
            s = build(coll, algo, P, P * 64)
            terms = cache[key] = analyze(s, fab, get(coll, algo).innet)
        out.append(terms.time(r["nbytes"], fab))
    return out


def _loss(rows: list[dict], fab: Fabric) -> float:
    pred = _predict(rows, fab)
    return sum(math.log(p / (r["time_us"] * 1e-6)) ** 2 for p, r in zip(pred, rows)
               if p > 0 and r["time_us"] > 0) / max(1, len(rows))


def fit_links(rows: list[dict], start: dict, cores: int, rounds: int = 6) -> tuple[dict, float]:
    """Coordinate descent over the four link parameters in log space."""
    best = dict(start)
    best_loss = _loss(rows, _fabric(best, cores))
    for scale in (2.0, 1.4, 1.15):
        for _ in range(rounds):
            improved = False
            for name in PARAMS:
                for f in (1 / scale, scale):
                    trial = dict(best)
                    trial[name] = best[name] * f
                    loss = _loss(rows, _fabric(trial, cores))
                    if loss < best_loss * 0.999:
                        best, best_loss, improved = trial, loss, True
            if not improved:
                break
    return best, best_loss


def fit_pacing(rows: list[dict], links: dict, cores: int) -> float:
    """The multicast stream's share of the port that best explains ``rows``."""
    best, best_loss = 1.0, math.inf
    for pacing in (1.0, 0.7, 0.5, 0.35, 0.25, 0.18, 0.12, 0.08, 0.05):
        loss = _loss(rows, _fabric(links, cores, pacing, multicast=True))
        if loss < best_loss:
            best, best_loss = pacing, loss
    return best


def fit_line(points: list[tuple[int, float]]) -> list[float]:
    """``[a, b]`` minimising the relative error of ``a + b*S`` over (S, seconds) points."""
    # Weighted least squares with weights 1/t: rows (1/t, S/t) -> 1.
    s11 = s12 = s22 = r1 = r2 = 0.0
    for S, t in points:
        x1, x2 = 1 / t, S / t
        s11 += x1 * x1
        s12 += x1 * x2
        s22 += x2 * x2
        r1 += x1
        r2 += x2
    det = s11 * s22 - s12 * s12
    if abs(det) < 1e-300:
        return [min(t for _, t in points), 0.0]
    a = (r1 * s22 - r2 * s12) / det
    b = (s11 * r2 - s12 * r1) / det
    if a < 0 or b < 0:          # a fit outside the physics: keep the closer extreme
        a = max(a, 0.0)
        b = max(b, 0.0)
    return [a, b]


def calibrate_local(nranks: int = 4, *, iters: int = 8, sizes=SIZES, tcp: bool = True,
                    multicast: bool = True, symm: bool = True, log=print) -> dict:
    """Measure this machine with ``nranks`` local ranks; return a profile (unsaved)."""
    cores = os.cpu_count() or 1
    prof: dict = {"links": {}, "multicast": dict(_profile.BUILTIN_MULTICAST), "symm": {},
                  "measurements": [], "fit": {}}
    # A profile in which symmetric memory costs nothing: auto then takes it at every
    # size, which is how its rows are measured; engine rows run one chunk.
    import tempfile
    tmpdir = tempfile.mkdtemp(prefix="polycast-calibrate-")
    zero = os.path.join(tmpdir, "symm-first.json")
    _profile.save({"links": _profile.BUILTIN_LINKS,
                   "symm": {c: {str(nranks): [0.0, 0.0]} for c in SYMM_COLLECTIVES}}, zero)
    missing = os.path.join(tmpdir, "none.json")
    classes = [("shm", None, ENGINE_PROBES)] + ([("tcp", "tcp", TCP_PROBES)] if tcp else [])
    with _env(POLYCAST_NCHUNKS=1, POLYCAST_PROFILE=missing, POLYCAST_SYMM="0"):
        for kind, transport, probes in classes:
            log(f"{kind}: measuring")
            rows = []
            for coll, algos in probes:
                rows += _measure(coll, algos, nranks, sizes, iters, transport, log)
            links, loss = fit_links(rows, _profile.BUILTIN_LINKS[kind], cores)
            prof["links"][kind] = links
            prof["fit"][kind] = {"rms_log_error": math.sqrt(loss), "points": len(rows)}
            prof["measurements"] += [dict(r, link=kind) for r in rows]
            log(f"{kind}: " + ", ".join(f"{k} {v:.3g}" for k, v in links.items())
                + f" (rms log error {math.sqrt(loss):.2f})")
        if multicast:
            log("multicast: measuring")
            try:
                rows = []
                for coll, algos in MCAST_PROBES:
                    rows += _measure(coll, algos, nranks, sizes[1:], iters, None, log)
                pacing = fit_pacing(rows, prof["links"]["shm"], cores)
                prof["multicast"] = {"pacing": pacing}
                prof["measurements"] += [dict(r, link="multicast") for r in rows]
                log(f"multicast: a stream gets {pacing:.2f} of the port")
            except Exception as exc:      # noqa: BLE001 - no multicast here: keep built-in
                log(f"multicast: not measured ({exc}); built-in model kept")
    if symm:
        log("symmetric memory: measuring")
        with _env(POLYCAST_NCHUNKS=1, POLYCAST_PROFILE=zero, POLYCAST_SYMM=None):
            for coll in SYMM_COLLECTIVES:
                try:
                    rows = _measure(coll, ("auto",), nranks, sizes, iters, None, log)
                except Exception as exc:  # noqa: BLE001 - symm unavailable: say so
                    log(f"symm {coll}: not measured ({exc})")
                    continue
                pts = [(r["nbytes"], r["time_us"] * 1e-6) for r in rows
                       if r["algorithm"] == "auto(symm)"]
                if len(pts) >= 2:
                    prof["symm"][coll] = {str(nranks): fit_line(pts)}
                    prof["measurements"] += [dict(r, link="symm") for r in rows]
                    a, b = prof["symm"][coll][str(nranks)]
                    log(f"symm {coll}: {a * 1e6:.1f} us + S / {1 / b / 1e9 if b else 0:.2f} GB/s")
    for p in (zero, missing):
        with contextlib.suppress(OSError):
            os.unlink(p)
    with contextlib.suppress(OSError):
        os.rmdir(tmpdir)
    for kind in _profile.BUILTIN_LINKS:
        prof["links"].setdefault(kind, dict(_profile.BUILTIN_LINKS[kind]))
    if not prof["symm"]:
        prof["symm"] = dict(_profile.BUILTIN_SYMM)
    prof["calibration"] = {"nranks": nranks, "cores": cores, "iters": iters,
                           "sizes": list(sizes)}
    return prof


#: What a modelled fabric is probed with (allgather and allreduce cover the patterns).
SIM_PROBES = (("allgather", ("ring", "recdoubling", "mcast", "direct")),
              ("allreduce", ("ring", "recdoubling", "dbtree")))
SIM_SIZES = (4 << 10, 16 << 20)


def calibrate_modelled(topology: str, nodes: int, link: str = "400Gbps", log=print) -> dict:
    """Simulate the probes at min(nodes, 32) ranks on ``topology`` and fit the model's
    latency and bandwidth scales to the simulator; returns the profile entry."""
    from ..sim.simulate import count_for, simulate
    from ..sim.topology import parse_topology
    from ..planner.cost import exact_terms
    from ..planner.fabric import from_topology
    P = max(2, min(nodes, 32))
    topo = parse_topology(topology, P, link=link)
    fab = from_topology(topo)
    lat, bw, points = [], [], []
    for coll_name, algos in SIM_PROBES:
        coll = Collective.parse(coll_name)
        for algo in algos:
            if get(coll, algo).unsupported_reason(P):
                continue
            terms = exact_terms(coll, algo, P, 1, {}, fab)
            for size in SIM_SIZES:
                r = simulate(coll, algo, P, size, topo)
                nbytes = coll.total_elements(P, count_for(coll, P, size, 4)) * 4
                a = max(ln[0] for ln in terms.lines)
                model = terms.time(nbytes, fab)
                points.append({"collective": coll_name, "algorithm": algo, "nbytes": nbytes,
                               "sim_s": r.time_s, "model_s": model})
                if size == SIM_SIZES[0]:
                    lat.append(r.time_s / model)
                elif model > a:
                    # The bandwidth part alone: what is left after the latency.
                    bw.append(max(1e-3, (r.time_s - a) / (model - a)))
    scale = {"latency_scale": _median(lat), "bandwidth_scale": _median(bw)}
    log(f"{topology} at {P} ranks: latency x{scale['latency_scale']:.3f}, bandwidth "
        f"x{scale['bandwidth_scale']:.3f} ({len(points)} simulations)")
    return {**scale, "nodes": P, "link": link, "points": points}


def _median(xs: list[float]) -> float:
    if not xs:
        return 1.0
    xs = sorted(xs)
    n = len(xs)
    return xs[n // 2] if n % 2 else 0.5 * (xs[n // 2 - 1] + xs[n // 2])
