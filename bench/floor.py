"""The engine path's per-call floor, piece by piece (issue 9): where a small call's CPU goes,
and how much a goal of "within 3x of MPICH" leaves each rank.

Three parts, each the minimum over repeats (a shared machine inflates time, not work):

* engine - P engines in this process; one call = a post on every rank, then every Send handed
           to its peer (header pack -> parse_header -> on_message) and its token back
           (on_send_done). Per event kind, per rank per call: the protocol's own cost, with no
           driver, memory or I/O.
* entry  - one rank (no messages): a whole Allreduce of 2 float32, and the same with the
           driver's post replaced by one that only finishes the request: the Python API alone.
* ranks  - P local ranks (shared memory or TCP, POLYCAST_SYMM=0): wall and caller-thread CPU
           per call, then the same run with the driver's pieces wrapped (inclusive times,
           wall and thread CPU; each wrapper adds ~0.5-1 us). ``--replay on`` (default, what
           ships): repeated small calls go from the comm layer straight into the compiled
           replay (direct.run: the call's checks and accounting; replay.replay: the helper
           and its glue; runtime/driver/direct.py and replay.py), with its rings' yields and
           the share of calls taken straight there; ``--replay off``: one engine event per
           message (POLYCAST_TEST_HOOKS=replay=0).

The budget column: within 3x of MPICH at P ranks on C cores is 3 x mpich_us a call, i.e.
3 x mpich_us x min(C, P) / P of CPU per rank (``--mpich-us``: MPICH's time for the call in
the same hour, from bench/peers.py).

    python bench/floor.py [--ranks 2,4] [--collective allreduce] [--algo recdoubling]
                          [--realtime] [--mpich-us 11.4] [--replay on|off] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, REPO)
sys.path.insert(0, HERE)

MARKER = "FLOOR"
ENGINE_KINDS = ("post", "on_message", "on_send_done", "pack", "parse_header")


def engine_floor(collective: str, algo: str, nranks: int, count: int, calls: int,
                 repeats: int) -> dict:
    """Per rank per call, microseconds of each engine event kind (see the module doc)."""
    from polycast.algorithms.registry import build
    from polycast.engine import wire
    from polycast.engine.actions import Complete, Send
    from polycast.engine.engine import Engine

    sched = build(collective, algo, nranks, count)
    engines = [Engine(r, nranks) for r in range(nranks)]
    pc = time.perf_counter
    acc: dict[str, float] = {}
    payload = memoryview(bytes(count * 8))
    req = [0]

    def add(kind: str, dt: float) -> None:
        acc[kind] = acc.get(kind, 0.0) + dt

    def carry(rank: int, actions, msgs: list, tokens: list) -> None:
        for a in actions:
            if type(a) is Send:
                t = pc()
                hb = a.header.pack()
                add("pack", pc() - t)
                msgs.append((a.peer, rank, hb, payload[:a.header.length]))
                tokens.append((rank, a.token))
                add("messages", 1)
            elif type(a) is Complete:
                add("completed", 1)

    def one_call() -> None:
        req[0] += 1
        msgs: list = []
        tokens: list = []
        for r, e in enumerate(engines):
            t = pc()
            out = e.post(req[0], sched, 4, 0.0, dtype="float32", op="sum")
            add("post", pc() - t)
            carry(r, out, msgs, tokens)
        while msgs or tokens:
            while tokens:
                r, tok = tokens.pop()
                t = pc()
                out = engines[r].on_send_done(tok, 0.0)
                add("on_send_done", pc() - t)
                carry(r, out, msgs, tokens)
            if msgs:
                dst, src, hb, body = msgs.pop(0)
                t = pc()
                h = wire.parse_header(hb)
                add("parse_header", pc() - t)
                t = pc()
                out = engines[dst].on_message(src, h, body, 0.0)
                add("on_message", pc() - t)
                carry(dst, out, msgs, tokens)

    t0 = pc()
    for _ in range(20000):
        pc()
    timer = (pc() - t0) / 20000                 # one perf_counter call: the timing's cost
    for _ in range(min(300, calls)):
        one_call()
    best: dict[str, float] = {}
    for _ in range(repeats):
        acc.clear()
        for _ in range(calls):
            one_call()
        for k, v in acc.items():
            best[k] = min(best.get(k, v), v)
    assert best.get("completed", 0) == calls * nranks, "every call completes on every rank"
    assert not any(e.busy for e in engines)
    per_call_msgs = best["messages"] / calls
    row = {"collective": collective, "algorithm": algo, "nranks": nranks,
           "messages_per_rank": per_call_msgs / nranks, "us": {}}
    total = 0.0
    for k in ENGINE_KINDS:
        n = nranks if k == "post" else per_call_msgs
        each = max(best.get(k, 0.0) / calls / n - timer, 0.0) if n else 0.0
        row["us"][k] = {"each": round(each * 1e6, 3), "per_rank_call": round(
            each * n / nranks * 1e6, 3)}
        total += each * n / nranks
    row["per_rank_call_us"] = round(total * 1e6, 3)
    return row


# -- the rank side (run in each rank's process) ---------------------------------------------
WRAPPED = (("engine", "post"), ("engine", "on_message"), ("engine", "on_send_done"),
           ("driver", "post"), ("peers", "poll_rings"), ("peers", "flush_all"),
           ("progress", "round"), ("progress", "_quick_round"), ("progress", "_spin"),
           ("progress", "drive"), ("replay", "run"), ("replay", "replay"), ("direct", "run"))


def rank_job(argv: list[str]) -> None:
    """One rank of the `ranks` / `entry` parts: prints rank 0's numbers on a MARKER line."""
    import numpy as np

    import polycast
    part, calls, repeats = argv[0], int(argv[1]), int(argv[2])
    comm = polycast.init()
    d = comm._driver
    x, y = np.ones(2, np.float32), np.empty(2, np.float32)

    def call():
        comm.Allreduce(x, y, algorithm=argv[3] if len(argv) > 3 else None)

    def timed() -> tuple[float, float]:
        best = (1e9, 1e9)
        for _ in range(repeats):
            comm.Barrier()
            w, c = time.perf_counter(), time.thread_time()
            for _ in range(calls):
                call()
            w, c = time.perf_counter() - w, time.thread_time() - c
            best = min(best, (w / calls, c / calls))
        return best

    for _ in range(min(300, calls)):
        call()
    out: dict = {}
    if part == "entry":
        out["whole_cpu_us"] = timed()[1] * 1e6
        real = d.post

        def api_only(comm_id, request, schedule, itemsize, dtype, op):
            d.buffers.unregister(request.req)
            request._finish()
        d.post = api_only
        out["api_cpu_us"] = timed()[1] * 1e6
        d.post = real
    else:
        w, c = timed()
        out["wall_us"], out["cpu_us"] = w * 1e6, c * 1e6
        acc: dict[str, list] = {}
        replay = d._comms[0].replay
        from polycast.runtime.driver.direct import DirectCall
        directs = [dc for key, kept in comm._dispatch.direct.items() for dc in kept
                   if key[0].value == "allreduce"]
        direct_before = sum(dc.whole for dc in directs)
        objs = {"engine": d._comms[0].engine, "driver": d, "peers": d.peers,
                "progress": d.progress, "replay": replay,
                "direct": DirectCall if directs else None}   # (slotted: its class's method)
        looks = 0
        if replay is not None:      # the helper's looks at empty rings (each a yield)
            ents = [h[1] for h in replay._entries.values() if h[1] is not None]
            looks = -sum(e.plan.counts()[2] for e in ents)

        def wrap(obj, name, label):
            fn = getattr(obj, name)
            slot = acc.setdefault(label, [0.0, 0.0, 0])

            def w(*a, **k):
                t, c0 = time.perf_counter(), time.thread_time()
                try:
                    return fn(*a, **k)
                finally:
                    slot[0] += time.perf_counter() - t
                    slot[1] += time.thread_time() - c0
                    slot[2] += 1
            setattr(obj, name, w)
        for o, n in WRAPPED:
            if objs[o] is not None:
                wrap(objs[o], n, f"{o}.{n}")
        comm.Barrier()
        for s in acc.values():
            s[:] = [0.0, 0.0, 0]
        for _ in range(calls):
            call()
        out["pieces"] = {k: {"wall_us": v[0] / calls * 1e6, "cpu_us": v[1] / calls * 1e6,
                             "per_call": v[2] / calls} for k, v in acc.items()}
        if replay is not None:
            looks += sum(e.plan.counts()[2] for e in ents)
            stops = replay.counts()
            out["replay"] = {"yields_per_call": looks / calls,
                             "whole_per_call": stops["done"] / max(1, sum(stops.values())),
                             "direct_per_call": (sum(dc.whole for dc in directs)
                                                 - direct_before) / calls}
    if comm.rank == 0:
        print(MARKER + " " + json.dumps(out), flush=True)
    polycast.finalize()


def run_part(part: str, nranks: int, args) -> dict | None:
    from rank_jobs import run_ranks
    cmd = [sys.executable, os.path.abspath(__file__), "--rank-job", part, str(args.iters),
           str(args.repeats), args.algo]
    if args.realtime:
        cmd = ["chrt", "-r", "1"] + cmd
    env = {"POLYCAST_SYMM": "0", "POLYCAST_TRANSPORT": args.transport,
           "POLYCAST_TEST_HOOKS": "replay=1" if args.replay == "on" else "replay=0"}
    return run_ranks(cmd, nranks, f"floor{os.getpid()}{part}{nranks}", MARKER, args.timeout,
                     REPO, env)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--rank-job":
        rank_job(argv[1:])
        return 0
    if argv and argv[0] == "--engine-job":
        c, a, n, calls, reps = argv[1:6]
        print(MARKER + " " + json.dumps(engine_floor(c, a, int(n), 2, int(calls), int(reps))))
        return 0
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", default="2,4", help="comma-separated rank counts")
    ap.add_argument("--collective", default="allreduce",
                    help="engine part: allreduce, broadcast or allgather (ranks: allreduce)")
    ap.add_argument("--algo", default="recdoubling")
    ap.add_argument("--transport", default="shm", choices=("shm", "tcp"))
    ap.add_argument("--iters", type=int, default=2000, help="calls per repeat")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--realtime", action="store_true",
                    help="ranks at chrt -r 1 (root): a loaded machine measures like a quiet one")
    ap.add_argument("--mpich-us", type=float, default=None,
                    help="MPICH's time for the call (us), for the 3x budget column")
    ap.add_argument("--replay", default="on", choices=("on", "off"),
                    help="ranks part: small calls in the compiled replay (on, what ships) "
                         "or one engine event per message (off: POLYCAST_TEST_HOOKS=replay=0)")
    ap.add_argument("--timeout", type=float, default=180.0)
    ap.add_argument("--json", default=os.path.join(HERE, "results", "floor.json"))
    args = ap.parse_args(argv)
    ranks = [int(n) for n in args.ranks.split(",")]
    cores = os.cpu_count() or 1
    result = {"bench": "floor", "collective": args.collective, "algorithm": args.algo,
              "transport": args.transport, "cores": cores, "realtime": args.realtime,
              "mpich_us": args.mpich_us, "replay": args.replay, "engine": [], "entry": None,
              "ranks": []}
    print(f"engine in-process, 8 B {args.collective} {args.algo} (us per rank per call):")
    for n in ranks:
        if args.realtime:       # in a process of its own at chrt -r 1, like the ranks
            res = subprocess.run(["chrt", "-r", "1", sys.executable, os.path.abspath(__file__),
                                  "--engine-job", args.collective, args.algo, str(n),
                                  str(args.iters), str(args.repeats)], capture_output=True,
                                 text=True, timeout=args.timeout, env=dict(
                                     os.environ, PYTHONPATH=REPO), check=True)
            row = json.loads(next(ln for ln in res.stdout.splitlines()
                                  if ln.startswith(MARKER + " "))[len(MARKER) + 1:])
        else:
            row = engine_floor(args.collective, args.algo, n, 2, args.iters, args.repeats)
        result["engine"].append(row)
        parts = ", ".join(f"{k} {v['each']:.2f} x{(n if k == 'post' else row['messages_per_rank'] * n) / n:.2f}"
                          for k, v in row["us"].items())
        print(f"  P={n}: {row['per_rank_call_us']:.2f} us  ({parts})")
    entry = run_part("entry", 1, args)
    if entry is None:
        print("entry part failed (see above)", file=sys.stderr)
        return 1
    result["entry"] = entry
    print(f"one rank, no messages: whole call {entry['whole_cpu_us']:.2f} us CPU, "
          f"the Python API alone {entry['api_cpu_us']:.2f} us")
    for n in ranks:
        got = run_part("ranks", n, args)
        if got is None:
            print(f"{n}-rank part failed (see above)", file=sys.stderr)
            return 1
        budget = None
        if args.mpich_us:
            budget = 3 * args.mpich_us * min(cores, n) / n
        got.update(nranks=n, budget_cpu_us=budget)
        result["ranks"].append(got)
        line = f"{n} ranks: wall {got['wall_us']:.1f} us, caller CPU {got['cpu_us']:.1f} us a call"
        if budget is not None:
            line += f"; 3x MPICH leaves {budget:.1f} us of CPU per rank"
        print(line)
        if got.get("replay"):
            print(f"    replay: {got['replay']['whole_per_call']:.2f} of calls whole, "
                  f"{got['replay']['direct_per_call']:.2f} straight from the comm layer, "
                  f"{got['replay']['yields_per_call']:.2f} yields a call")
        for k, v in sorted(got["pieces"].items(), key=lambda kv: -kv[1]["cpu_us"]):
            print(f"    {k:24s} cpu {v['cpu_us']:7.2f}  wall {v['wall_us']:7.2f} us  "
                  f"({v['per_call']:.2f} a call)")
    os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
    with open(args.json, "w") as f:
        json.dump(result, f, indent=2)
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
