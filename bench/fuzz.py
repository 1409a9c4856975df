"""Fuzz the wire parser, the rendezvous store's protocol, the engine's message handling and
the compiled datagram helper's parser and placement (``dgram``; ``dgram-asan``: the same
with the helper built with AddressSanitizer at bench time, so a read or write outside a
buffer aborts the run) with N random and mutated inputs each (issues 14 and 29; CI runs a
reduced, hypothesis-driven form in tests/test_fuzz.py and tests/test_dgram.py with the same
invariants, tests/fuzz_targets.py).

    python bench/fuzz.py                 # 100,000 inputs per target
    python bench/fuzz.py --inputs 2000   # quick

A seeded mutation fuzzer (not hypothesis: it would spend most of the time shrinking and
bookkeeping): byte flips, interesting values, truncation, extension, splicing and
field-level mutations of genuine messages. Any exception other than the expected refusal,
or a broken invariant (a hang, a changed send buffer, a write outside a receive buffer, an
accepted forgery), stops the run and is printed with the seed that reproduces it.
Prints a table and writes bench/results/fuzz.json.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import platform
import random
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))

import fuzz_targets as ft  # noqa: E402


def fuzz_wire(n: int, seed: int) -> dict:
    rng = random.Random(seed)
    corpus = ft.wire_corpus(rng)
    outcomes: collections.Counter = collections.Counter()
    for i in range(n):
        r = rng.random()
        if r < 0.1:
            data = rng.randbytes(rng.randint(0, 120))
        else:
            data = ft.mutate(rng, rng.choice(corpus), corpus)
        outcomes[ft.check_wire(data).split("/")[0]] += 1
    return {"inputs": n, "outcomes (no secret, header parser)": dict(outcomes.most_common())}


def fuzz_store(n: int, seed: int) -> dict:
    rng = random.Random(seed)
    target = ft.StoreTarget()
    try:
        done = 0
        while target.inputs < n:
            m = rng.random()
            if m < 0.4:         # a client without the secret
                target.handshake(rng.randbytes(rng.choice((0, 8, 31, 32, 33, 48, 100))))
            else:               # an insider's frames, then forged / altered / replayed bytes
                s, session = target.session()
                s.close()
                frames = [(rng.choice(ft.STORE_OPS), rng.randbytes(rng.randrange(10)),
                           rng.choice((b"", b"1", b"-3", b"x", rng.randbytes(rng.randrange(20)))))
                          for _ in range(rng.randint(0, 8))]
                genuine = ft.genuine_frames(session, frames or [(ft.OP_SET, b"a", b"1")])
                tamper = [ft.mutate(rng, rng.choice(genuine), genuine)
                          for _ in range(rng.randint(1, 3))]
                target.frames(frames, tamper)
            done += 1
            if done % 500 == 0:
                target.healthy()
        target.healthy()
        return {"inputs": target.inputs, "connections": done,
                "refused (no secret)": target.server.refused,
                "answers judged": target.answers,
                "bad frames (connection ended)": target.server.bad_frames}
    finally:
        target.close()


def fuzz_engine(n: int, seed: int) -> dict:
    rng = random.Random(seed)
    inputs, outcomes = 0, collections.Counter()
    drops: collections.Counter = collections.Counter()
    case_no = 0
    while inputs < n:
        case_no += 1
        secret = case_no % 3 == 0
        case = ft.EngineCase(case_no, secret=secret, seed=case_no)
        k = rng.randint(5, 40)
        for j in range(k):
            h, payload = case.mutate_fields(rng, *case.genuine(rng))
            if secret:
                data = case.datagram_from(h, payload or b"", forge_mac=True)
                case.datagram(ft.mutate(rng, data) if rng.random() < 0.3 else data)
            elif rng.random() < 0.5:
                case.message(h, payload)
            else:
                case.datagram(ft.mutate(rng, case.datagram_from(h, payload or b"", False)))
            if j == k // 2:
                case.advance(rng.choice((0.0, 1e-5, 1e-3)))
        inputs += k
        outcomes[case.finish(exact=secret)] += 1
        drops.update(case.world.engines[case.victim].stats.drops)
    return {"inputs": inputs, "calls": case_no, "call outcomes": dict(outcomes),
            "drops at the victim": dict(drops.most_common(12))}


def fuzz_dgram(n: int, seed: int) -> dict:
    """The compiled datagram helper's parser and placement against the Python reference
    (tests/fuzz_targets.py DgramTarget), half the inputs under a secret."""
    from polycast.runtime.transport import dgram
    if not dgram.available():
        return {"inputs": 0, "skipped": f"the datagram helper is not built: {dgram.why_not}"}
    rng = random.Random(seed)
    outcomes: collections.Counter = collections.Counter()
    for secret in (None, ft.SECRET):
        target = ft.DgramTarget(secret)
        corpus = target.corpus(rng)
        for i in range(n // 2):
            if i % 500 == 0:
                target.reset()
            r = rng.random()
            if r < 0.05:
                data = rng.randbytes(rng.randint(0, 120))
            elif r < 0.25:
                data = rng.choice(corpus)       # genuine: placed, then duplicates
            else:
                data = ft.mutate(rng, rng.choice(corpus), corpus)
            outcomes[("secret " if secret else "") + target.check(data)] += 1
    # Landing (datagrams read straight into their predicted place) over a real socket:
    # streams shuffled, duplicated and corrupted, every buffer exact.
    landed = runs = 0
    for k in range(max(2, n // 5000)):
        secret = ft.SECRET if k % 2 else None
        order, gso, streams = (("shuffle", False, 1), ("shuffle", True, 2), ("dups", False, 1),
                               ("dups", True, 2), ("inorder", False, 1))[k % 5]
        exact, c = ft.landing_run(secret, order, gso, streams, seed=seed + k)
        if not exact:
            raise AssertionError(f"landing run {k} ({order}, gso={gso}, streams={streams}, "
                                 f"secret={bool(secret)}, seed {seed + k}) not exact: {c}")
        landed += c["landed"]
        runs += 1
    return {"inputs": n // 2 * 2, "outcomes": dict(outcomes.most_common()),
            "landing runs (socket, exact)": runs, "landed": landed}


def fuzz_dgram_asan(n: int, seed: int) -> dict:
    """The same target with the helper built with AddressSanitizer (cc at bench time), in a
    child process with libasan preloaded: any out-of-bounds read or write aborts it."""
    import shutil
    import subprocess
    import sysconfig
    import tempfile
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        return {"inputs": 0, "skipped": "no C compiler"}
    lib = subprocess.run([cc, "-print-file-name=libasan.so"], capture_output=True,
                         text=True).stdout.strip()
    if not lib or not os.path.isabs(lib) or not os.path.exists(lib):
        return {"inputs": 0, "skipped": "no libasan for this compiler"}
    root = os.path.dirname(HERE)
    base = os.path.join(root, "polycast", "runtime", "transport", "_dgram")
    srcs = [f"{base}{part}.c" for part in ("", "_blake2b", "_place", "_read", "_send")]
    with tempfile.TemporaryDirectory(prefix="polycast-asan-") as tmp:
        pkg = os.path.join(tmp, "asan")
        os.makedirs(pkg)
        so = os.path.join(pkg, "_dgram" + sysconfig.get_config_var("EXT_SUFFIX"))
        build = subprocess.run([cc, "-shared", "-fPIC", "-O1", "-g", "-std=gnu11",
                                "-fsanitize=address", "-fno-omit-frame-pointer",
                                f"-I{sysconfig.get_paths()['include']}", *srcs, "-o", so],
                               capture_output=True, text=True)
        if build.returncode != 0:
            return {"inputs": 0, "skipped": f"the ASan build failed: {build.stderr[-300:]}"}
        code = ("import sys; sys.path.insert(0, %r); import _dgram; "
                "from polycast.runtime.transport import dgram; dgram._dgram = _dgram; "
                "sys.path.insert(0, %r); import fuzz; import json; "
                "print('ASAN ' + json.dumps(fuzz.fuzz_dgram(%d, %d)))"
                % (pkg, HERE, n, seed))
        env = dict(os.environ, LD_PRELOAD=lib, ASAN_OPTIONS="detect_leaks=0:abort_on_error=1",
                   PYTHONPATH=os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]))
        p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           env=env, timeout=3600)
        if p.returncode != 0 or "ASAN " not in p.stdout:
            raise RuntimeError(f"the ASan run failed (status {p.returncode}): "
                               f"{(p.stderr or p.stdout)[-1500:]}")
        res = json.loads(p.stdout.split("ASAN ", 1)[1])
        res["build"] = "-fsanitize=address -O1"
        return res


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--inputs", type=int, default=100_000, help="per target")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--targets", default="wire,store,engine,dgram,dgram-asan")
    ap.add_argument("--out", default=os.path.join(HERE, "results", "fuzz.json"))
    args = ap.parse_args(argv)
    if args.inputs < 1:
        ap.error("--inputs must be >= 1")
    targets = {"wire": fuzz_wire, "store": fuzz_store, "engine": fuzz_engine,
               "dgram": fuzz_dgram, "dgram-asan": fuzz_dgram_asan}
    chosen = [t.strip() for t in args.targets.split(",")]
    for t in chosen:
        if t not in targets:
            ap.error(f"--targets: {t!r} is not one of {', '.join(targets)}")
    load = os.getloadavg()
    results = {}
    print(f"{'target':10s} {'inputs':>9s} {'seconds':>8s} {'inputs/s':>9s}  result")
    for t in chosen:
        t0 = time.perf_counter()
        try:
            res = targets[t](args.inputs, args.seed)
            status = "ok: no crash, hang or broken invariant"
        except Exception as exc:            # the point of the run: report, with the seed
            res = {"inputs": None, "error": f"{type(exc).__name__}: {exc}"}
            status = f"FAILED (seed {args.seed}): {type(exc).__name__}: {str(exc)[:200]}"
        dt = time.perf_counter() - t0
        res.update(seconds=round(dt, 2), status=status)
        results[t] = res
        n = res["inputs"] or 0
        if res.get("skipped"):
            status = f"skipped: {res['skipped']}"
        print(f"{t:10s} {n:9d} {dt:8.1f} {n / dt:9.0f}  {status}")
    for t, res in results.items():
        extra = {k: v for k, v in res.items() if k not in ("inputs", "seconds", "status")}
        print(f"  {t}: {json.dumps(extra)}")
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump({"bench": "fuzz", "inputs_per_target": args.inputs, "seed": args.seed,
                   "load_before": load, "load_after": os.getloadavg(),
                   "python": platform.python_version(), "results": results}, f, indent=1)
    print(f"wrote {args.out}; load {load[0]:.1f} -> {os.getloadavg()[0]:.1f}")
    return 0 if all("error" not in r for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
