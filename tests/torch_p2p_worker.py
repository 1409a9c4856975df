"""One rank of the torch backend's point-to-point checks (tests/test_torch_p2p.py runs it
with `polycast run -n P`): every exchange runs on a polycast group and on gloo in the same
process; results must be equal (and equal the values the senders sent).

* ring: isend to the next rank, irecv from the previous; 6 dtypes, sizes 0/1/1003 and a
  large message (rendezvous), a non-contiguous receive tensor;
* blocking send/recv in pairs; tags matched out of posting order; recv from any source
  (dist.recv returns whose message it took); send to self; batch_isend_irecv with the
  receives listed first;
* a 2-stage pipeline (ranks 0 and 1, GPipe: 4 micro-batches forward, then backward),
  activations and gradients crossing by isend/irecv, and the same with
  torch.distributed.pipelining's ScheduleGPipe (2 ranks): losses and gradients equal
  gloo's;
* bad input raises a polycast error on the calling rank; the group works afterwards.
"""

from __future__ import annotations

import os
import sys
import traceback

import torch
import torch.distributed as dist
import torch.nn as nn

import polycast
import polycast.torch  # noqa: F401  (registers the backend)
from torch_report import report

DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.float16, torch.int32,
          torch.int64]
SIZES = [0, 1, 1003, 300_001]     # the last: 1.2 MB in float32, past the eager size


class P2P:
    def __init__(self, groups: dict) -> None:
        self.groups = groups
        self.rank = dist.get_rank()
        self.P = dist.get_world_size()
        self.checks = 0
        self.failures: list[str] = []

    def data(self, n: int, dtype, src: int, salt: int = 0) -> torch.Tensor:
        v = (torch.arange(n, dtype=torch.int64) * 7 + src * 3 + salt) % 11 - 5
        return v.to(dtype)

    def same(self, what: str, got, want) -> None:
        self.checks += 1
        if not (got.dtype == want.dtype and got.shape == want.shape
                and torch.equal(got, want)):
            self.failures.append(f"rank {self.rank}: {what}: got {got.reshape(-1)[:6]} "
                                 f"{got.dtype}{list(got.shape)}, want {want.reshape(-1)[:6]}")

    def _fail(self, text: str) -> None:
        self.failures.append(text)
        print(text, file=sys.stderr, flush=True)       # seen even if a later step hangs

    def each(self, name: str, fn, want=None) -> None:
        """``fn(group) -> result tensors``; run on gloo and on each polycast group, the
        polycast results must equal gloo's (or ``want``, where gloo cannot run it)."""
        try:
            if want is None:
                want = fn(self.groups["gloo"])
        except Exception as exc:
            self._fail(f"rank {self.rank}: {name} [gloo]: {exc!r}")
            return
        for gname, g in self.groups.items():
            if gname == "gloo":
                continue
            try:
                got = fn(g)
                for i, (a, b) in enumerate(zip(got, want, strict=True)):
                    self.same(f"{name} [{gname}] result {i}", a, b)
            except Exception as exc:
                self._fail(f"rank {self.rank}: {name} [{gname}]: {exc!r}\n"
                           + traceback.format_exc(limit=4))

    # -- exchanges --------------------------------------------------------------------------
    def ring(self) -> None:
        me, P = self.rank, self.P
        nxt, prv = (me + 1) % P, (me - 1) % P
        for dtype in DTYPES:
            for n in SIZES if dtype == torch.float32 else SIZES[:3]:
                def fn(g, n=n, dtype=dtype):
                    out = torch.full((n,), 9, dtype=dtype)
                    reqs = [dist.irecv(out, prv, group=g, tag=3),
                            dist.isend(self.data(n, dtype, me), nxt, group=g, tag=3)]
                    for r in reqs:
                        r.wait()
                    self.same(f"ring {dtype} n={n} sender's values", out,
                              self.data(n, dtype, prv))
                    return [out]
                self.each(f"ring {dtype} n={n}", fn)

        def strided(g):               # a non-contiguous tensor to receive into (gloo refuses)
            out = torch.zeros(6, 8) if g is self.groups["gloo"] else torch.zeros(8, 6).t()
            src = torch.arange(48, dtype=torch.float32).reshape(6, 8) + me
            w = dist.isend(src, nxt, group=g)
            dist.recv(out, prv, group=g)
            w.wait()
            self.same("ring strided sender's values", out,
                      torch.arange(48, dtype=torch.float32).reshape(6, 8) + prv)
            return [out]
        self.each("ring strided", strided)

    def pairs(self) -> None:
        """Blocking send/recv between 0<->1, 2<->3...: the even rank sends first."""
        me, P = self.rank, self.P
        peer = me ^ 1
        if peer >= P:
            return

        def fn(g):
            mine = self.data(517, torch.float64, me, 1)
            got = torch.empty(517, dtype=torch.float64)
            if me % 2 == 0:
                dist.send(mine, peer, group=g)
                dist.recv(got, peer, group=g)
            else:
                dist.recv(got, peer, group=g)
                dist.send(mine, peer, group=g)
            return [got]
        self.each("blocking pairs", fn)

    def tags(self) -> None:
        """Rank 0 sends tags 5 then 3 to rank 1; rank 1 receives tag 3 first."""
        me = self.rank
        if me > 1:
            return

        def fn(g):
            if me == 0:
                ws = [dist.isend(torch.full((4,), 5.0), 1, group=g, tag=5),
                      dist.isend(torch.full((4,), 3.0), 1, group=g, tag=3)]
                for w in ws:
                    w.wait()
                return []
            a, b = torch.empty(4), torch.empty(4)
            dist.recv(a, 0, group=g, tag=3)
            dist.recv(b, 0, group=g, tag=5)
            self.same("tag 3 took the second message", a, torch.full((4,), 3.0))
            return [a, b]
        self.each("tags out of order", fn)

    def any_source(self) -> None:
        """Rank 0 receives one message from every other rank, sources unknown."""
        me, P = self.rank, self.P

        def fn(g):
            if me != 0:
                dist.send(torch.full((3,), float(me)), 0, group=g, tag=7)
                return []
            seen = []
            for _ in range(P - 1):
                t = torch.empty(3)
                src = dist.recv(t, group=g, tag=7)     # any source: returns whose it was
                self.same(f"any source: message of rank {src}", t, torch.full((3,), float(src)))
                seen.append(src)
            self.same("any source: every rank once", torch.tensor(sorted(seen)),
                      torch.arange(1, P))
            return []
        self.each("recv from any source", fn)

    def to_self(self) -> None:
        def fn(g):
            out = torch.empty(5, dtype=torch.int64)
            r = dist.irecv(out, self.rank, group=g, tag=1)
            dist.isend(torch.arange(5) + self.rank, self.rank, group=g, tag=1).wait()
            r.wait()
            return [out]
        self.each("to self", fn, want=[torch.arange(5) + self.rank])     # gloo can't

    def batch(self) -> None:
        me, P = self.rank, self.P
        nxt, prv = (me + 1) % P, (me - 1) % P

        def fn(g):
            a, b = torch.empty(100), torch.empty(100)
            ops = [dist.P2POp(dist.irecv, a, prv, g), dist.P2POp(dist.irecv, b, nxt, g),
                   dist.P2POp(dist.isend, torch.full((100,), me + 0.5), nxt, g),
                   dist.P2POp(dist.isend, torch.full((100,), -me - 0.5), prv, g)]
            for w in dist.batch_isend_irecv(ops):
                w.wait()
            self.same("batch: from the previous rank", a, torch.full((100,), prv + 0.5))
            return [a, b]
        self.each("batch_isend_irecv", fn)

    def pipeline(self) -> None:
        """GPipe over 2 stages (ranks 0, 1): stage 0 sends activations forward, stage 1
        computes the loss and sends the activations' gradients back."""
        me = self.rank
        if me > 1:
            return
        MB, B, D = 4, 8, 32

        def fn(g):
            torch.manual_seed(1234 + me)
            stage = nn.Sequential(nn.Linear(D, D), nn.Tanh(), nn.Linear(D, D))
            torch.manual_seed(99)
            x, y = torch.randn(MB, B, D), torch.randn(MB, B, D)
            outs, ins, losses = [], [], []
            for m in range(MB):                               # forward, all micro-batches
                if me == 0:
                    h = stage(x[m])
                    dist.isend(h.detach(), 1, group=g, tag=m).wait()
                    outs.append(h)
                else:
                    h = torch.empty(B, D)
                    dist.recv(h, 0, group=g, tag=m)
                    h.requires_grad_(True)
                    ins.append(h)
                    outs.append(nn.functional.mse_loss(stage(h), y[m]) / MB)
            for m in range(MB):                               # backward
                if me == 1:
                    outs[m].backward()
                    losses.append(outs[m].detach().reshape(1))
                    dist.send(ins[m].grad, 0, group=g, tag=100 + m)
                else:
                    gh = torch.empty(B, D)
                    dist.recv(gh, 1, group=g, tag=100 + m)
                    outs[m].backward(gh)
            return losses + [p.grad for p in stage.parameters()]
        self.each("2-stage pipeline", fn)

    def pipelining(self) -> None:
        """torch.distributed.pipelining's GPipe schedule over 2 stages (2 ranks): its
        stage exchanges (batch_isend_irecv) on the group."""
        from torch.distributed.pipelining import PipelineStage, ScheduleGPipe
        me = self.rank
        if self.P != 2:
            return

        def fn(g):
            torch.manual_seed(0)
            full = nn.Sequential(nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 16), nn.Tanh())
            part = full[0:2] if me == 0 else full[2:4]
            stage = PipelineStage(part, me, 2, torch.device("cpu"), group=g)
            sched = ScheduleGPipe(stage, n_microbatches=4,
                                  loss_fn=lambda o, t: ((o - t) ** 2).mean())
            torch.manual_seed(1)
            x, y = torch.randn(8, 16), torch.randn(8, 16)
            losses: list = []
            if me == 0:
                sched.step(x)
            else:
                sched.step(target=y, losses=losses)
            grads = [p.grad for p in part.parameters()]
            return ([torch.stack(losses)] if losses else []) + grads
        self.each("pipelining GPipe", fn)

    def bad_input(self) -> None:
        me, P = self.rank, self.P
        for gname, g in self.groups.items():
            if gname == "gloo":
                continue
            backend = g          # the ProcessGroupPolycast itself (torch checks ranks first)
            cases = [
                ("destination out of range",
                 lambda: backend.send([torch.ones(2)], P + 3, 0), "out of range"),
                ("negative tag", lambda: backend.send([torch.ones(2)], (me + 1) % P, -4),
                 "tag"),
                ("two tensors", lambda: backend.recv([torch.ones(2), torch.ones(2)], 0, 0),
                 "one tensor"),
            ]
            for name, call, word in cases:
                self.checks += 1
                try:
                    call()
                except polycast.PolycastError as exc:
                    if word not in str(exc):
                        self.failures.append(f"rank {me}: {name}: {exc} lacks {word!r}")
                except Exception as exc:
                    self.failures.append(f"rank {me}: {name}: not a polycast error: {exc!r}")
                else:
                    self.failures.append(f"rank {me}: {name}: no error")
            # A message shorter than the receiving tensor: an error on the receiver.
            if me < 2:
                self.checks += 1
                try:
                    if me == 0:
                        dist.send(torch.ones(3), 1, group=g, tag=9)
                    else:
                        dist.recv(torch.empty(5), 0, group=g, tag=9)
                        self.failures.append("rank 1: short message: no error")
                except polycast.PolycastError as exc:
                    if "12 bytes" not in str(exc) or "20" not in str(exc):
                        self.failures.append(f"rank {me}: short message: {exc}")
                except Exception as exc:
                    self.failures.append(f"rank {me}: short message: {exc!r}")
            # Nothing spoiled: the next exchange is right.
            out = torch.empty(2)
            reqs = [dist.irecv(out, (me - 1) % P, group=g),
                    dist.isend(torch.full((2,), float(me)), (me + 1) % P, group=g)]
            for r in reqs:
                r.wait()
            self.same(f"after bad input [{gname}]", out, torch.full((2,), float((me - 1) % P)))


def main() -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    groups = {"gloo": dist.group.WORLD, "polycast": dist.new_group(backend="polycast")}
    t = P2P(groups)
    only = os.environ.get("P2P_ONLY")                   # debugging: one step by name
    for step in (t.ring, t.pairs, t.tags, t.any_source, t.to_self, t.batch, t.pipeline,
                 t.pipelining, t.bad_input):
        if only and step.__name__ != only:
            continue
        step()
        dist.barrier()
    report({"rank": t.rank, "checks": t.checks, "failures": t.failures[:20],
            "nfailures": len(t.failures)}, t.rank)
    dist.destroy_process_group()
    sys.exit(1 if t.failures else 0)


if __name__ == "__main__":
    main()
