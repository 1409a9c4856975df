"""One rank of the torch-backend matrix (tests/test_torch_collectives.py runs it with
`polycast run -n P`): every collective, dtype, size and mode on polycast groups, each
result compared with gloo's in the same process.

The default group is gloo (the reference); two polycast groups join the same ranks:
``auto`` (symmetric memory on this host where Comm takes it) and ``engine`` (explicit
engine schedules: ring, binomial, pairwise...). Inputs are small integers so that sums,
products and averages are exact in every dtype whatever the order of reduction: results
must be equal, not close. Prints one JSON line: the number of checks and the failures.
"""

from __future__ import annotations

import math
import os
import re
import sys
import traceback

import torch
import torch.distributed as dist

import polycast
import polycast.torch as pt
from torch_report import report

DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.float16, torch.int32,
          torch.int64]
SIZES = [0, 1, 7, 1003]
LARGE = 70001                # float32 only: several pipelined chunks, symm growth
R = dist.ReduceOp


class Matrix:
    def __init__(self, gloo, groups: dict) -> None:
        self.gloo = gloo
        self.groups = groups
        self.rank = dist.get_rank()
        self.P = dist.get_world_size()
        self.checks = 0
        self.failures: list[str] = []

    def data(self, n: int, dtype, salt: int, rank: int | None = None) -> torch.Tensor:
        r = self.rank if rank is None else rank
        v = (torch.arange(n, dtype=torch.int64) * 7 + r * 3 + salt) % 5 - 2
        return v.to(dtype)

    def same(self, what: str, got, want) -> None:
        self.checks += 1
        if isinstance(got, (list, tuple)):
            ok = len(got) == len(want) and all(
                g.dtype == w.dtype and g.shape == w.shape and torch.equal(g, w)
                for g, w in zip(got, want))
        else:
            ok = got.dtype == want.dtype and got.shape == want.shape and torch.equal(got, want)
        if not ok:
            self.failures.append(f"rank {self.rank}: {what}: got {_short(got)} want "
                                 f"{_short(want)}")

    # -- one case --------------------------------------------------------------------------
    def case(self, name: str, fn) -> None:
        """Run ``fn(group, async_op)`` on every polycast group in both modes; ``fn``
        returns (work or None, checker): the checker compares after completion."""
        for gname, g in self.groups.items():
            for mode in ("sync", "async"):
                what = f"{name} [{gname}, {mode}]"
                try:
                    work, check = fn(g, mode == "async")
                    if mode == "async":
                        assert work is not None, "async_op=True returned no work"
                        if self.checks % 2 and hasattr(work, "get_future"):
                            work.get_future().wait()
                        else:
                            work.wait()
                    check(what)
                except Exception as exc:
                    self.failures.append(f"rank {self.rank}: {what}: {exc!r}\n"
                                         + traceback.format_exc(limit=4))

    # -- the collectives -----------------------------------------------------------------
    def run(self) -> None:
        for dtype in DTYPES:
            fl = dtype.is_floating_point
            sizes = SIZES + ([LARGE] if dtype == torch.float32 else [])
            for n in sizes:
                tag = f"{dtype} n={n}"
                ops = [R.SUM, R.MAX, R.MIN, R.PRODUCT] + ([R.AVG] if fl else
                                                          [R.BAND, R.BOR, R.BXOR])
                for op in ops:
                    self.all_reduce(tag, dtype, n, op)
                if fl:
                    self.premul(tag, dtype, n)
                self.broadcast(tag, dtype, n)
                self.reduce(tag, dtype, n)
                self.all_gather(tag, dtype, n)
                self.reduce_scatter(tag, dtype, n, R.SUM)
                if fl:
                    self.reduce_scatter(tag, dtype, n, R.AVG)
                self.gather_scatter(tag, dtype, n)
                self.all_to_all(tag, dtype, n)
            self.coalesced(dtype)
        self.non_contiguous()
        self.sparse()
        self.fused()
        self.case("barrier", lambda g, a: (dist.barrier(group=g, async_op=a),
                                           lambda what: None))

    def all_reduce(self, tag, dtype, n, op) -> None:
        want = self.data(n, dtype, 1)
        if op == R.AVG:
            dist.all_reduce(want, R.SUM, group=self.gloo)
            want = (want.double() / self.P).to(dtype)
        else:
            dist.all_reduce(want, op, group=self.gloo)

        def fn(g, a):
            t = self.data(n, dtype, 1)
            return dist.all_reduce(t, op, group=g, async_op=a), \
                lambda what: self.same(what, t, want)
        self.case(f"all_reduce {op} {tag}", fn)

    def premul(self, tag, dtype, n) -> None:
        want = self.data(n, dtype, 2) * 0.5
        dist.all_reduce(want, R.SUM, group=self.gloo)
        for factor in (0.5, torch.tensor([0.5], dtype=dtype)):
            def fn(g, a, factor=factor):
                t = self.data(n, dtype, 2)
                op = dist._make_nccl_premul_sum(factor)
                return dist.all_reduce(t, op, group=g, async_op=a), \
                    lambda what: self.same(what, t, want)
            self.case(f"all_reduce PREMUL_SUM({type(factor).__name__}) {tag}", fn)

    def broadcast(self, tag, dtype, n) -> None:
        root = self.P - 1
        want = self.data(n, dtype, 3)
        dist.broadcast(want, root, group=self.gloo)

        def fn(g, a):
            t = self.data(n, dtype, 3)
            return dist.broadcast(t, root, group=g, async_op=a), \
                lambda what: self.same(what, t, want)
        self.case(f"broadcast {tag}", fn)

    def reduce(self, tag, dtype, n) -> None:
        root = 1 % self.P
        for op in (R.SUM, R.MAX):
            want = self.data(n, dtype, 4)
            dist.all_reduce(want, op, group=self.gloo)

            def fn(g, a, op=op, want=want):
                t = self.data(n, dtype, 4)
                mine = t.clone()
                w = dist.reduce(t, root, op, group=g, async_op=a)
                # Non-roots keep their input (the backend never writes it).
                return w, lambda what: self.same(what, t, want if self.rank == root else mine)
            self.case(f"reduce {op} {tag}", fn)

    def all_gather(self, tag, dtype, n) -> None:
        P, me = self.P, self.rank
        want = [torch.empty(n, dtype=dtype) for _ in range(P)]
        dist.all_gather(want, self.data(n, dtype, 5), group=self.gloo)
        flat_want = torch.cat(want)

        def as_list(g, a):
            out = [torch.full((n,), 9, dtype=dtype) for _ in range(P)]
            return dist.all_gather(out, self.data(n, dtype, 5), group=g, async_op=a), \
                lambda what: self.same(what, out, want)
        self.case(f"all_gather list {tag}", as_list)

        def adjacent(g, a):          # FSDP1's form: the list is chunks of one flat tensor
            flat = torch.full((P * n,), 9, dtype=dtype)
            out = list(flat.chunk(P)) if n else [flat[:0] for _ in range(P)]
            return dist.all_gather(out, self.data(n, dtype, 5), group=g, async_op=a), \
                lambda what: self.same(what, flat, flat_want)
        self.case(f"all_gather adjacent list {tag}", adjacent)

        def single(g, a):
            out = torch.full((P * n,), 9, dtype=dtype)
            w = dist.all_gather_into_tensor(out, self.data(n, dtype, 5), group=g, async_op=a)
            return w, lambda what: self.same(what, out, flat_want)
        self.case(f"all_gather_into_tensor {tag}", single)

        def aliased(g, a):           # FSDP2's form: the input is our block of the output
            out = torch.full((P * n,), 9, dtype=dtype)
            inp = out[me * n:(me + 1) * n]
            inp.copy_(self.data(n, dtype, 5))
            w = dist.all_gather_into_tensor(out, inp, group=g, async_op=a)
            return w, lambda what: self.same(what, out, flat_want)
        self.case(f"all_gather_into_tensor aliased {tag}", aliased)

    def reduce_scatter(self, tag, dtype, n, op) -> None:
        P, me = self.P, self.rank
        full = self.data(P * n, dtype, 6)
        dist.all_reduce(full, R.SUM, group=self.gloo)
        if op == R.AVG:
            full = (full.double() / P).to(dtype)
        want = full[me * n:(me + 1) * n].clone()

        def single(g, a):
            out = torch.full((n,), 9, dtype=dtype)
            w = dist.reduce_scatter_tensor(out, self.data(P * n, dtype, 6), op, group=g,
                                           async_op=a)
            return w, lambda what: self.same(what, out, want)
        self.case(f"reduce_scatter_tensor {op} {tag}", single)

        def as_list(g, a):
            out = torch.full((n,), 9, dtype=dtype)
            ins = [x.clone() for x in self.data(P * n, dtype, 6).split(n)] if n else \
                [torch.empty(0, dtype=dtype) for _ in range(P)]
            w = dist.reduce_scatter(out, ins, op, group=g, async_op=a)
            return w, lambda what: self.same(what, out, want)
        self.case(f"reduce_scatter list {op} {tag}", as_list)

    def gather_scatter(self, tag, dtype, n) -> None:
        P, me = self.P, self.rank
        root = 0
        want = [torch.empty(n, dtype=dtype) for _ in range(P)]
        dist.all_gather(want, self.data(n, dtype, 7), group=self.gloo)

        def gather(g, a):
            out = [torch.full((n,), 9, dtype=dtype) for _ in range(P)] if me == root else None
            w = dist.gather(self.data(n, dtype, 7), out, root, group=g, async_op=a)
            return w, lambda what: self.same(what, out, want) if me == root else None
        self.case(f"gather {tag}", gather)

        src = [self.data(n, dtype, 8, rank=p) for p in range(P)]
        want_s = torch.empty(n, dtype=dtype)
        dist.scatter(want_s, src if me == root else None, root, group=self.gloo)

        def scatter(g, a):
            out = torch.full((n,), 9, dtype=dtype)
            w = dist.scatter(out, [s.clone() for s in src] if me == root else None, root,
                             group=g, async_op=a)
            return w, lambda what: self.same(what, out, want_s)
        self.case(f"scatter {tag}", scatter)

    def all_to_all(self, tag, dtype, n) -> None:
        P = self.P
        inp = self.data(P * n, dtype, 9)
        want = torch.empty(P * n, dtype=dtype)
        dist.all_to_all_single(want, inp, group=self.gloo)

        def single(g, a):
            out = torch.full((P * n,), 9, dtype=dtype)
            w = dist.all_to_all_single(out, inp.clone(), group=g, async_op=a)
            return w, lambda what: self.same(what, out, want)
        self.case(f"all_to_all_single {tag}", single)

        want_l = list(want.split(n)) if n else [torch.empty(0, dtype=dtype)] * P

        def as_list(g, a):
            out = [torch.full((n,), 9, dtype=dtype) for _ in range(P)]
            ins = list(inp.clone().split(n)) if n else \
                [torch.empty(0, dtype=dtype) for _ in range(P)]
            w = dist.all_to_all(out, ins, group=g, async_op=a)
            return w, lambda what: self.same(what, out, want_l)
        self.case(f"all_to_all list {tag}", as_list)

    def uneven(self) -> None:
        """Split sizes and tensors of different sizes per rank: all_to_all_single with
        split sizes (against gloo), all_to_all and all_gather with one size per rank
        (gloo refuses those: against the values the senders hold)."""
        me, P = self.rank, self.P

        def rows(src, dst):            # rows of 2 elements rank src sends rank dst (0 too)
            return (2 * src + dst) % 3
        for dtype in (torch.float32, torch.bfloat16, torch.int64):
            in_splits = [rows(me, j) for j in range(P)]
            out_splits = [rows(j, me) for j in range(P)]
            inp = self.data(2 * sum(in_splits), dtype, 21).reshape(-1, 2)
            want = torch.empty(sum(out_splits), 2, dtype=dtype)
            dist.all_to_all_single(want, inp, out_splits, in_splits, group=self.gloo)

            def single(g, a, inp=inp, want=want, ins=in_splits, outs=out_splits):
                out = torch.full(want.shape, 9, dtype=want.dtype)
                w = dist.all_to_all_single(out, inp.clone(), outs, ins, group=g, async_op=a)
                return w, lambda what: self.same(what, out, want)
            self.case(f"all_to_all_single split sizes {dtype}", single)

            even = self.data(3 * P, dtype, 4)
            want_e = torch.empty(3 * P, dtype=dtype)
            dist.all_to_all_single(want_e, even, [3] * P, [3] * P, group=self.gloo)

            def equal_splits(g, a, even=even, want=want_e):
                out = torch.full((3 * P,), 9, dtype=want.dtype)
                w = dist.all_to_all_single(out, even.clone(), [3] * P, [3] * P, group=g,
                                           async_op=a)
                return w, lambda what: self.same(what, out, want)
            self.case(f"all_to_all_single equal split sizes {dtype}", equal_splits)

            ins_l = [self.data(rows(me, j) + 1, dtype, 5 + j) for j in range(P)]
            want_l = [self.data(rows(j, me) + 1, dtype, 5 + me, rank=j) for j in range(P)]

            def as_list(g, a, ins_l=ins_l, want_l=want_l, dtype=dtype):
                out = [torch.full((rows(j, me) + 1,), 9, dtype=dtype) for j in range(P)]
                w = dist.all_to_all(out, [t.clone() for t in ins_l], group=g, async_op=a)
                return w, lambda what: self.same(what, out, want_l)
            self.case(f"all_to_all list, sizes per rank {dtype}", as_list)

            mine = self.data(me + 1, dtype, 13)
            want_g = [self.data(j + 1, dtype, 13, rank=j) for j in range(P)]

            def gather_list(g, a, mine=mine, want_g=want_g, dtype=dtype):
                out = [torch.full((j + 1,), 9, dtype=dtype) for j in range(P)]
                w = dist.all_gather(out, mine.clone(), group=g, async_op=a)
                return w, lambda what: self.same(what, out, want_g)
            self.case(f"all_gather list, sizes per rank {dtype}", gather_list)

    def coalesced(self, dtype) -> None:
        P, me = self.P, self.rank
        shapes = [5, 0, 33]
        want = [self.data(k, dtype, 10 + i) for i, k in enumerate(shapes)]
        for w in want:
            dist.all_reduce(w, group=self.gloo)

        def allreduce(g, a):
            ts = [self.data(k, dtype, 10 + i) for i, k in enumerate(shapes)]
            w = g.allreduce_coalesced(ts, dist.AllreduceCoalescedOptions())
            if not a:
                w.wait()
            return w, lambda what: self.same(what, ts, want)
        self.case(f"allreduce_coalesced {dtype}", allreduce)

        gw = []
        for i, k in enumerate(shapes):
            o = torch.empty(P * k, dtype=dtype)
            dist.all_gather_into_tensor(o, self.data(k, dtype, 20 + i), group=self.gloo)
            gw.append(o)

        def allgather(g, a):
            outs = [torch.full((P * k,), 9, dtype=dtype) for k in shapes]
            with dist._coalescing_manager(group=g, async_ops=a) as cm:
                for i, k in enumerate(shapes):
                    dist.all_gather_into_tensor(outs[i], self.data(k, dtype, 20 + i), group=g)
            return (cm if a else None), lambda what: self.same(what, outs, gw)
        self.case(f"all_gather_into_tensor coalesced {dtype}", allgather)

        # dist.all_gather_coalesced: one output list per rank, each with one tensor per
        # input (2-D and empty inputs too), as gloo reads it.
        cshapes = [(2, 3), (0,), (7,)]
        cw = [[torch.full(s, 9, dtype=dtype) for s in cshapes] for _ in range(P)]
        dist.all_gather_coalesced(cw, [self.data(math.prod(s), dtype, 50 + i).reshape(s)
                                       for i, s in enumerate(cshapes)], group=self.gloo)

        def gather_coalesced(g, a):
            outs = [[torch.full(s, 9, dtype=dtype) for s in cshapes] for _ in range(P)]
            ins = [self.data(math.prod(s), dtype, 50 + i).reshape(s)
                   for i, s in enumerate(cshapes)]
            w = dist.all_gather_coalesced(outs, ins, group=g, async_op=a)
            return w, lambda what: self.same(what, sum(outs, []), sum(cw, []))
        self.case(f"all_gather_coalesced {dtype}", gather_coalesced)

        rw = []
        for i, k in enumerate(shapes):
            full = self.data(P * k, dtype, 30 + i)
            dist.all_reduce(full, group=self.gloo)
            rw.append(full[me * k:(me + 1) * k].clone())

        def reduce_scatter(g, a):
            outs = [torch.full((k,), 9, dtype=dtype) for k in shapes]
            with dist._coalescing_manager(group=g, async_ops=a) as cm:
                for i, k in enumerate(shapes):
                    dist.reduce_scatter_tensor(outs[i], self.data(P * k, dtype, 30 + i),
                                               group=g)
            return (cm if a else None), lambda what: self.same(what, outs, rw)
        self.case(f"reduce_scatter_tensor coalesced {dtype}", reduce_scatter)

    def sparse(self) -> None:
        """Sparse COO all_reduce SUM (gloo's): rank r holds rows 0..r, with a dense tail."""
        me = self.rank

        def make():
            idx = torch.arange(me + 1).reshape(1, -1)
            return torch.sparse_coo_tensor(idx, torch.full((me + 1, 2), float(me + 1)),
                                           (self.P + 1, 2))
        want = make()
        dist.all_reduce(want, group=self.gloo)

        def fn(g, a):
            t = make()
            return dist.all_reduce(t, group=g, async_op=a), \
                lambda what: self.same(what, t.to_dense(), want.to_dense())
        self.case("all_reduce sparse", fn)

    def non_contiguous(self) -> None:
        """Strided tensors are staged through contiguous copies, in and out."""
        P = self.P
        base = self.data(40, torch.float32, 11).reshape(8, 5)
        want = base.t().contiguous()
        dist.all_reduce(want, group=self.gloo)

        def allreduce(g, a):
            t = self.data(40, torch.float32, 11).reshape(8, 5).t()     # not contiguous
            return dist.all_reduce(t, group=g, async_op=a), \
                lambda what: self.same(what, t.contiguous(), want)
        self.case("all_reduce non-contiguous", allreduce)

        gw = torch.empty(P * 6, dtype=torch.float32)
        dist.all_gather_into_tensor(gw, self.data(12, torch.float32, 12)[::2].contiguous(),
                                    group=self.gloo)

        def allgather(g, a):
            out = torch.full((P * 6, 2), 9.0)[:, 0]                       # strided output
            inp = self.data(12, torch.float32, 12)[::2]                  # strided input
            w = dist.all_gather_into_tensor(out, inp, group=g, async_op=a)
            return w, lambda what: self.same(what, out.contiguous(), gw)
        self.case("all_gather_into_tensor non-contiguous", allgather)

    def fused(self) -> None:
        """allgather_matmul / matmul_reduce_scatter equal the unfused pair (gloo's)."""
        P = self.P
        for dtype in (torch.float32, torch.float64):
            for m, k, n in ((5, 3, 4), (8, 16, 6), (0, 3, 2)):
                x = self.data(m * k, dtype, 13).reshape(m, k)
                w = self.data(k * n, dtype, 14, rank=0).reshape(k, n)     # same everywhere
                full = torch.empty(P * m, k, dtype=dtype)
                dist.all_gather_into_tensor(full, x, group=self.gloo)
                want = full @ w
                xs = self.data(P * m * k, dtype, 15).reshape(P * m, k)
                part = xs @ w
                rs_want = torch.empty(m, n, dtype=dtype)
                dist.reduce_scatter_tensor(rs_want, part, group=self.gloo)
                for gname, g in self.groups.items():
                    for nchunks in (1, 3, None):
                        what = f"fused {dtype} m={m} k={k} n={n} nchunks={nchunks} [{gname}]"
                        try:
                            self.same(f"allgather_matmul {what}",
                                      pt.allgather_matmul(x, w, g, nchunks=nchunks), want)
                            self.same(f"matmul_reduce_scatter {what}",
                                      pt.matmul_reduce_scatter(xs, w, g, nchunks=nchunks),
                                      rs_want)
                        except Exception as exc:
                            self.failures.append(f"rank {self.rank}: {what}: {exc!r}")

    # -- bad input: a clear error on every rank, and the group still works after ----------
    def bad_input(self, only_uneven: bool = False) -> None:
        P, me = self.P, self.rank
        cases = [
            ("sparse", lambda g: dist.broadcast(torch.ones(4).to_sparse(), 0, group=g),
             ("sparse",)),
            ("sparse MAX", lambda g: dist.all_reduce(torch.ones(4).to_sparse(), R.MAX,
                                                     group=g), ("sparse", "SUM only")),
            ("device", lambda g: dist.all_reduce(torch.empty(4, device="meta"), group=g),
             ("meta", "CPU tensors")),
            ("unsupported op", lambda g: dist.all_reduce(torch.ones(4), R.BAND, group=g),
             ("BAND", "float32")),
            ("mismatched shapes", lambda g: dist.all_reduce(torch.ones(5 + me), group=g),
             (_MISMATCH,)),
            ("mismatched all_gather", lambda g: dist.all_gather_into_tensor(
                torch.empty(P * (3 + me)), torch.ones(3 + me), group=g), (_MISMATCH,)),
            ("wrong output size", lambda g: dist.all_gather_into_tensor(
                torch.empty(P * 3 + 1), torch.ones(3), group=g), ("elements",)),
            ("split sizes that do not add up", lambda g: dist.all_to_all_single(
                torch.empty(P), torch.ones(P), [1] * P, [2] * P, group=g),
             ("input_split_sizes",)),
            ("all_gather_coalesced with one list too few", lambda g: dist.all_gather_coalesced(
                [[torch.empty(2)] for _ in range(P - 1)], [torch.ones(2)], group=g),
             ("one list per rank",)),
        ]
        # Bad on one rank only: that rank names the property, the others name that rank;
        # nobody waits for the timeout, and the calls after it pair up right.
        one = "meta" if me == 0 else _RANK0
        cases += [
            ("one rank's device", lambda g: dist.all_reduce(
                torch.empty(4, device="meta") if me == 0 else torch.ones(4), group=g), (one,)),
            ("one rank's all_gather", lambda g: dist.all_gather_into_tensor(
                torch.empty(P * 2), torch.ones(2).to_sparse() if me == 0 else torch.ones(2),
                group=g), ("sparse" if me == 0 else _RANK0,)),
            ("one rank's gather", lambda g: dist.gather(
                torch.ones(2, device="meta") if me == 0 else torch.ones(2),
                [torch.empty(2) for _ in range(P)] if me == 1 else None, 1, group=g),
             (one,)),
        ]
        if only_uneven:
            # Every rank sends 1 row to each; every rank expects 2 from rank 0 (and none
            # from rank 1): the counts agreement refuses it on every rank.
            cases = [("split sizes the ranks disagree on", lambda g: dist.all_to_all_single(
                torch.empty(P), torch.ones(P), [2, 0] + [1] * (P - 2), [1] * P, group=g),
                ("counts",))]
        for gname, g in self.groups.items():
            for name, call, words in cases:
                what = f"bad input {name} [{gname}]"
                self.checks += 1
                try:
                    call(g)
                except polycast.PolycastError as exc:
                    text = str(exc)
                    if not all((w.search(text) if hasattr(w, "search") else w in text)
                               for w in words):
                        self.failures.append(f"rank {me}: {what}: message {text!r} does "
                                             f"not name {words}")
                except Exception as exc:
                    self.failures.append(f"rank {me}: {what}: not a polycast error: {exc!r}")
                else:
                    self.failures.append(f"rank {me}: {what}: no error")
                # Nothing spoiled: the next call on the group is right.
                t = torch.full((3,), float(me))
                dist.all_reduce(t, group=g)
                self.same(f"{what}: the group afterwards", t,
                          torch.full((3,), float(sum(range(P)))))


# The rank that finds the mismatch says "called collectives differently"; a rank that
# learns it from that rank's abort quotes the other call and its signature.
_MISMATCH = re.compile(r"differently|call signature")
_RANK0 = re.compile(r"\branks? \[?0\b")      # "rank 0" (engine), "ranks [0]" (symm)


def _short(x) -> str:
    if isinstance(x, (list, tuple)):
        return "[" + ", ".join(_short(t) for t in x) + "]"
    if x is None:
        return "None"
    flat = x.reshape(-1)
    return f"{x.dtype}{list(x.shape)}{flat[:8].tolist()}"


def main() -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    gloo = dist.group.WORLD
    groups = {
        "auto": dist.new_group(backend="polycast"),
        "engine": dist.new_group(backend="polycast", pg_options=pt.Options(
            broadcast="binomial", reduce="binomial", allreduce="ring", allgather="ring",
            reduce_scatter="ring", scatter="linear", gather="linear", alltoall="pairwise")),
    }
    m = Matrix(gloo, groups)
    if os.environ.get("MATRIX_UNEVEN") == "1":          # needs Comm's vector collectives
        m.uneven()
        m.bad_input(only_uneven=True)
    else:
        m.run()
        if os.environ.get("MATRIX_BAD_INPUT") == "1":
            m.bad_input()
    report({"rank": m.rank, "checks": m.checks, "failures": m.failures[:20],
            "nfailures": len(m.failures)}, m.rank)
    dist.destroy_process_group()
    sys.exit(1 if m.failures else 0)


if __name__ == "__main__":
    main()
