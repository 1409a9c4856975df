"""Each torch.distributed collective as calls on the group's polycast ``Comm``.

Every function here checks its tensors first (so bad input raises before anything is
sent, on every rank that passes it), hands polycast zero-copy numpy views of them
(:func:`polycast.torch.tensors.raw`), and copies only where the collective needs it:

* a non-contiguous tensor goes through a contiguous copy (and back, for outputs);
* list-of-tensors forms (``all_gather`` into a list, ``reduce_scatter`` from a list,
  ``gather``, ``scatter``, ``all_to_all``) use one flat buffer; when the list's tensors
  already lie back to back in one storage (FSDP1's all-gather does this) that buffer is
  a view of them and nothing is copied;
* an all-gather input that is a view into its own output (FSDP2's ``all_gather_copy_in``)
  is passed as ``IN_PLACE`` when it is exactly this rank's block, and copied first if it
  overlaps the output anywhere else;
* bfloat16 reductions run in float32 (see :mod:`polycast.torch.tensors`);
* ``PREMUL_SUM`` multiplies a copy of the input (or the output, when the collective
  works in place on it) by the factor, then sums.

The function returns a :class:`~polycast.torch.work.Work` that completes when polycast's
requests do; its last step copies staging buffers out.
"""

from __future__ import annotations

import math

import torch

from ..collectives import Collective
from ..comm import IN_PLACE
from ..errors import InvalidArgument, Unsupported
from .tensors import (adjacent, check, check_list, flat_over, overlaps, raw, raw_units,
                      reduce_op, same_storage_block, widened)
from .work import Work


class Call:
    """One torch call being turned into polycast requests: its staging copies, its
    requests and its last step."""

    def __init__(self, group, what: str) -> None:
        self.group = group
        self.comm = group.comm
        self.what = what
        self.requests: list = []
        self._after: list = []

    def algorithm(self, coll: Collective) -> str | None:
        return self.group.options.algorithm(coll)

    # -- staging ------------------------------------------------------------------------
    def inp(self, t: torch.Tensor) -> torch.Tensor:
        """A contiguous tensor with ``t``'s values (``t`` itself when it is one)."""
        return t if t.is_contiguous() else t.contiguous()

    def out(self, t: torch.Tensor, dtype: torch.dtype | None = None,
            keep: bool = False) -> torch.Tensor:
        """A contiguous buffer of ``dtype`` whose values land in ``t`` at the end (``t``
        itself when it already is one). ``keep``: start it with ``t``'s values (in/out
        tensors such as all_reduce's)."""
        dtype = dtype or t.dtype
        if t.is_contiguous() and dtype == t.dtype:
            return t
        if keep:
            buf = t.to(dtype=dtype, memory_format=torch.contiguous_format, copy=True)
        else:
            buf = torch.empty(t.shape, dtype=dtype)
        self.then(lambda: t.copy_(buf))
        return buf

    def then(self, fn) -> None:
        self._after.append(fn)

    def first(self, fn) -> None:
        """A last step that runs before the others (a check before copies out)."""
        self._after.insert(0, fn)

    def post(self, method, *args, **kw) -> None:
        """Call the Comm ``method`` and keep its request. Comm's own argument errors are
        marked: Comm has already refused the call on every rank (see ProcessGroupPolycast)."""
        try:
            self.requests.append(method(*args, **kw))
        except BaseException as exc:
            exc.polycast_comm_refused = True
            raise

    def work(self, result, submit: bool = True, source_rank=-1) -> Work:
        after = self._after

        def finish():
            for fn in after:
                fn()
        w = Work(self.requests, finish if after else None, result, desc=self.what,
                 timeout_seconds=self.comm.timeout_seconds, source_rank=source_rank)
        return w._submit() if submit else w


def _one(tensors, what: str) -> torch.Tensor:
    ts = check_list(tensors, what)
    if len(ts) != 1:
        raise Unsupported(f"{what}: the polycast backend takes one tensor per call, got "
                          f"{len(ts)} (use the *_coalesced forms for several)")
    return ts[0]


def _same_dtype(a: torch.Tensor, b: torch.Tensor, what: str) -> None:
    if a.dtype != b.dtype:
        raise InvalidArgument(f"{what}: input is {a.dtype} but output is {b.dtype}")


def _root(call: Call, root: int) -> int:
    size = call.comm.size
    if not 0 <= root < size:
        raise InvalidArgument(f"{call.what}: root {root} out of range for a group of "
                              f"{size} ranks")
    return root


def _premul(t: torch.Tensor, factor, fresh: bool) -> torch.Tensor:
    """``t`` times the PREMUL_SUM factor; in place on ``t`` when it is the call's own
    buffer (``fresh``), else into a new tensor (a caller's input is never modified)."""
    if factor is None:
        return t
    try:
        return t.mul_(factor) if fresh else t * factor
    except RuntimeError as exc:
        raise InvalidArgument(f"PREMUL_SUM factor {factor!r} cannot scale a {t.dtype} "
                              f"tensor: {exc}") from None


# -- collectives ---------------------------------------------------------------------------
def broadcast(group, tensors, root: int, submit: bool = True) -> Work:
    call = Call(group, "broadcast")
    t = _one(tensors, "broadcast")
    root = _root(call, root)
    buf = call.out(t, keep=True)
    call.post(call.comm.Ibcast, raw(buf), root,
              algorithm=call.algorithm(Collective.BROADCAST))
    return call.work([t], submit)


def _allreduce_into(call: Call, t: torch.Tensor, op_obj) -> None:
    op, factor = reduce_op(op_obj)
    wdt = widened(t.dtype, op)
    buf = call.out(t, wdt, keep=True)
    _premul(buf, factor, fresh=True)
    call.post(call.comm.Iallreduce, IN_PLACE, raw(buf), op,
                                   algorithm=call.algorithm(Collective.ALLREDUCE))


def allreduce(group, tensors, op_obj, submit: bool = True) -> Work:
    call = Call(group, "all_reduce")
    if (isinstance(tensors, (list, tuple)) and len(tensors) == 1
            and isinstance(tensors[0], torch.Tensor) and tensors[0].layout == torch.sparse_coo):
        return _sparse_allreduce(call, tensors[0], op_obj)
    t = _one(tensors, "all_reduce")
    _allreduce_into(call, t, op_obj)
    return call.work([t], submit)


def _sparse_allreduce(call: Call, t: torch.Tensor, op_obj) -> Work:
    """A sparse COO tensor's sum over the ranks, in place (gloo's sparse all_reduce): every
    rank's coalesced indices and values are all-gathered (Comm's object allgather: sizes
    differ per rank), concatenated and coalesced, which sums duplicate indices."""
    op, factor = reduce_op(op_obj)
    if op != "sum" or factor is not None:
        raise Unsupported(f"all_reduce of a sparse tensor: SUM only (as gloo), got "
                          f"{getattr(getattr(op_obj, 'op', op_obj), 'name', op_obj)}")
    if t.device.type != "cpu":
        raise InvalidArgument(f"all_reduce input is on device {t.device}: the polycast "
                              "backend serves CPU tensors")
    c = t.coalesce()
    mine = (tuple(t.shape), str(t.dtype), c.indices(), c.values())
    try:
        parts = call.comm.allgather(mine)
    except BaseException as exc:
        exc.polycast_comm_refused = True        # Comm's own error: raised on every rank
        raise
    kinds = {(shape, dtype) for shape, dtype, _, _ in parts}
    if len(kinds) != 1:
        raise InvalidArgument("all_reduce of a sparse tensor: the ranks' tensors differ in "
                              "shape or dtype: " + ", ".join(
                                  f"rank {r} {d}{list(s)}" for r, (s, d, _, _) in
                                  enumerate(parts)))
    total = torch.sparse_coo_tensor(torch.cat([p[2] for p in parts], dim=1),
                                    torch.cat([p[3] for p in parts]), t.shape).coalesce()
    t.copy_(total)
    return call.work([t])


def allreduce_coalesced(group, tensors, op_obj, submit: bool = True) -> Work:
    call = Call(group, "all_reduce_coalesced")
    ts = check_list(tensors, "all_reduce_coalesced")
    reduce_op(op_obj)                      # an unsupported op raises before any post
    for t in ts:
        widened(t.dtype, reduce_op(op_obj)[0])
    for t in ts:
        _allreduce_into(call, t, op_obj)
    return call.work(list(ts), submit)


def reduce(group, tensors, root: int, op_obj, submit: bool = True) -> Work:
    call = Call(group, "reduce")
    t = _one(tensors, "reduce")
    root = _root(call, root)
    op, factor = reduce_op(op_obj)
    wdt = widened(t.dtype, op)
    algo = call.algorithm(Collective.REDUCE)
    if call.comm.rank == root:
        buf = call.out(t, wdt, keep=True)
        _premul(buf, factor, fresh=True)
        call.post(call.comm.Ireduce, IN_PLACE, raw(buf), op, root, algorithm=algo)
    else:
        send = call.inp(t)
        fresh = send is not t
        if wdt != t.dtype:
            send, fresh = send.to(wdt), True
        send = _premul(send, factor, fresh)
        call.post(call.comm.Ireduce, raw(send), None, op, root, algorithm=algo)
    return call.work([t], submit)


def _gather_buffer(call: Call, outs: list, dtype) -> torch.Tensor:
    """One flat buffer holding ``outs`` back to back, whose blocks end up in them (a view
    of them when they already lie so)."""
    if adjacent(outs):
        return flat_over(outs)
    sizes = [o.numel() for o in outs]
    flat = torch.empty(sum(sizes), dtype=dtype)

    def copy_out():
        at = 0
        for o, n in zip(outs, sizes):
            o.copy_(flat[at:at + n].view(o.shape))
            at += n
    call.then(copy_out)
    return flat


def _scatter_buffer(ins: list) -> torch.Tensor:
    """One flat tensor holding ``ins`` back to back (a view when they already are)."""
    if adjacent(ins):
        return flat_over(ins)
    return torch.cat([t.reshape(-1) for t in ins]) if ins else torch.empty(0)


def _even(ts: list, n: int, what: str) -> None:
    sizes = [t.numel() for t in ts]
    if any(s != n for s in sizes):
        raise Unsupported(f"{what}: tensors of different sizes ({sizes} elements): the "
                          "polycast backend takes them in all_gather (list), all_to_all "
                          "and all_to_all_single only")


def _vector(call: Call, method: str):
    """The Comm's vector collective ``method`` (Iallgatherv, Ialltoallv), or a clear
    error when this polycast has none."""
    fn = getattr(call.comm, method, None)
    if fn is None:
        raise Unsupported(f"{call.what}: uneven sizes need polycast's Comm.{method}, not "
                          "in this polycast version")
    return fn


def _one_list(call: Call, lists, what: str) -> list:
    """The single list of tensors a list-form collective takes (torch passes [list])."""
    if lists is None or len(lists) != 1:
        raise InvalidArgument(f"{call.what}: needs one {what} list, got "
                              f"{0 if lists is None else len(lists)}")
    return check_list(lists[0], f"{call.what} {what}")


def _per_rank(call: Call, ts: list, like: torch.Tensor, what: str,
              even: bool = True) -> list:
    """Check a list of one tensor per rank against ``like`` (dtype; and, if ``even``,
    the same size)."""
    P = call.comm.size
    if len(ts) != P:
        raise InvalidArgument(f"{call.what}: {what} list has {len(ts)} tensors, the group "
                              f"has {P} ranks")
    for t in ts:
        _same_dtype(t, like, call.what)
    if even:
        _even(ts + [like], like.numel(), call.what)
    return ts


def _pairs(call: Call, outs, inps) -> list:
    """(output, input) pairs of a coalesced call, checked."""
    outs = check_list(outs, f"{call.what} outputs")
    inps = check_list(inps, f"{call.what} inputs")
    if len(outs) != len(inps):
        raise InvalidArgument(f"{call.what}: {len(outs)} outputs but {len(inps)} inputs")
    return list(zip(outs, inps))


def _not_root(call: Call, lists, what: str) -> None:
    if lists and any(len(lst) for lst in lists):
        raise InvalidArgument(f"{call.what}: only the root passes {what} tensors")


def _allgather_into(call: Call, out: torch.Tensor, inp: torch.Tensor) -> None:
    """All-gather ``inp`` into the flat, contiguous ``out`` (P x inp elements)."""
    P, me = call.comm.size, call.comm.rank
    n = inp.numel()
    if out.numel() != P * n:
        raise InvalidArgument(f"{call.what}: output has {out.numel()} elements, needs "
                              f"{P} ranks x {n} = {P * n}")
    _same_dtype(inp, out, call.what)
    algo = call.algorithm(Collective.ALLGATHER)
    flat = out.reshape(-1)
    mine = flat[me * n:(me + 1) * n]
    if n and same_storage_block(inp.reshape(-1) if inp.is_contiguous() else inp, mine):
        call.post(call.comm.Iallgather, IN_PLACE, raw(flat), algorithm=algo)
        return
    send = call.inp(inp)
    if send is inp and overlaps(send, out):
        send = send.clone()        # a view into the output elsewhere than our block
    call.post(call.comm.Iallgather, raw(send), raw(flat), algorithm=algo)


def all_gather_single(group, out, inp, submit: bool = True) -> Work:
    call = Call(group, "all_gather_into_tensor")
    check(out, "all_gather_into_tensor output")
    check(inp, "all_gather_into_tensor input")
    buf = call.out(out)
    _allgather_into(call, buf, inp)
    return call.work([out], submit)


def all_gather_single_coalesced(group, outs, inps, submit: bool = True) -> Work:
    call = Call(group, "all_gather_into_tensor_coalesced")
    pairs = _pairs(call, outs, inps)
    for o, i in pairs:
        _allgather_into(call, call.out(o), i)
    return call.work([o for o, _ in pairs], submit)


def _allgather_list(call: Call, outs: list, inp: torch.Tensor) -> None:
    """All-gather into one tensor per rank; outputs of different sizes (rank i's tensor
    has rank i's size, the same list on every rank) go through Allgatherv."""
    _per_rank(call, outs, inp, "output", even=False)
    flat = _gather_buffer(call, outs, inp.dtype)
    sizes = [o.numel() for o in outs]
    if all(n == inp.numel() for n in sizes):
        _allgather_into(call, flat, inp)
        return
    me = call.comm.rank
    if sizes[me] != inp.numel():
        raise InvalidArgument(f"{call.what}: output[{me}] has {sizes[me]} elements, this "
                              f"rank's input {inp.numel()}")
    allgatherv = _vector(call, "Iallgatherv")
    send = call.inp(inp)
    if overlaps(send, flat):
        send = send.clone()
    unit = raw_units(inp.dtype)
    call.post(allgatherv, raw(send), [raw(flat), [n * unit for n in sizes]])


def allgather(group, output_lists, inputs, submit: bool = True) -> Work:
    call = Call(group, "all_gather")
    inp = _one(inputs, "all_gather input")
    outs = _one_list(call, output_lists, "output")
    _allgather_list(call, outs, inp)
    return call.work([outs], submit)


def allgather_coalesced(group, output_lists, inputs, submit: bool = True) -> Work:
    """torch's ``all_gather_coalesced``: ``output_lists[r][k]`` receives rank r's
    ``inputs[k]`` (one list per rank, as gloo reads it). The inputs' bytes travel as one
    all-gather (dtypes may differ), then land in the outputs."""
    call = Call(group, "all_gather_coalesced")
    P = call.comm.size
    inps = check_list(inputs, f"{call.what} inputs")
    if not isinstance(output_lists, (list, tuple)) or len(output_lists) != P:
        n = len(output_lists) if isinstance(output_lists, (list, tuple)) else None
        raise InvalidArgument(f"{call.what}: output_tensor_lists needs one list per rank "
                              f"({P}), got {n if n is not None else type(output_lists).__name__}")
    lists = [check_list(lst, f"{call.what} outputs[{r}]") for r, lst in enumerate(output_lists)]
    for r, outs in enumerate(lists):
        if len(outs) != len(inps):
            raise InvalidArgument(f"{call.what}: outputs[{r}] has {len(outs)} tensors, "
                                  f"there are {len(inps)} inputs")
        for k, (o, i) in enumerate(zip(outs, inps)):
            if o.dtype != i.dtype or o.numel() != i.numel():
                raise InvalidArgument(f"{call.what}: outputs[{r}][{k}] is {o.dtype}"
                                      f"{list(o.shape)}, inputs[{k}] is {i.dtype}"
                                      f"{list(i.shape)}")
    nbytes = [i.numel() * i.element_size() for i in inps]
    total = sum(nbytes)
    send = torch.empty(total, dtype=torch.uint8)
    at = 0
    for i, n in zip(inps, nbytes):
        if n:
            send[at:at + n].copy_(i.contiguous().reshape(-1).view(torch.uint8))
        at += n
    flat = torch.empty(P * total, dtype=torch.uint8)
    call.post(call.comm.Iallgather, raw(send), raw(flat),
              algorithm=call.algorithm(Collective.ALLGATHER))

    def copy_out():
        for r, outs in enumerate(lists):
            at = r * total
            for o, n in zip(outs, nbytes):
                if n:
                    o.copy_(flat[at:at + n].view(o.dtype).view(o.shape))
                at += n
    call.then(copy_out)
    return call.work(lists, submit)


def _reduce_scatter_into(call: Call, out: torch.Tensor, inp: torch.Tensor, op_obj) -> None:
    """Reduce-scatter the flat ``inp`` (P x out elements) into ``out``."""
    P = call.comm.size
    op, factor = reduce_op(op_obj)
    n = out.numel()
    if inp.numel() != P * n:
        raise InvalidArgument(f"{call.what}: input has {inp.numel()} elements, needs "
                              f"{P} ranks x {n} = {P * n}")
    _same_dtype(inp, out, call.what)
    wdt = widened(out.dtype, op)
    send = call.inp(inp)
    fresh = send is not inp
    if wdt != inp.dtype:
        send, fresh = send.to(wdt), True
    elif not fresh and overlaps(send, out):
        send, fresh = send.clone(), True
    send = _premul(send, factor, fresh)
    buf = call.out(out, wdt)
    call.post(call.comm.Ireduce_scatter_block, raw(send), raw(buf), op,
                                              algorithm=call.algorithm(
                                                  Collective.REDUCE_SCATTER))


def reduce_scatter_single(group, out, inp, op_obj, submit: bool = True) -> Work:
    call = Call(group, "reduce_scatter_tensor")
    check(out, "reduce_scatter_tensor output")
    check(inp, "reduce_scatter_tensor input")
    _reduce_scatter_into(call, out, inp, op_obj)
    return call.work([out], submit)


def reduce_scatter_single_coalesced(group, outs, inps, op_obj, submit: bool = True) -> Work:
    call = Call(group, "reduce_scatter_tensor_coalesced")
    pairs = _pairs(call, outs, inps)
    for o, i in pairs:
        _reduce_scatter_into(call, o, i, op_obj)
    return call.work([o for o, _ in pairs], submit)


def reduce_scatter(group, outputs, input_lists, op_obj, submit: bool = True) -> Work:
    call = Call(group, "reduce_scatter")
    out = _one(outputs, "reduce_scatter output")
    ins = _per_rank(call, _one_list(call, input_lists, "input"), out, "input")
    _reduce_scatter_into(call, out, _scatter_buffer(ins), op_obj)
    return call.work([out], submit)


def gather(group, output_lists, inputs, root: int, submit: bool = True) -> Work:
    call = Call(group, "gather")
    inp = _one(inputs, "gather input")
    root = _root(call, root)
    comm = call.comm
    algo = call.algorithm(Collective.GATHER)
    if comm.rank == root:
        outs = _per_rank(call, _one_list(call, output_lists, "output"), inp, "output")
        flat = _gather_buffer(call, outs, inp.dtype)
        send = call.inp(inp)
        if overlaps(send, flat):
            send = send.clone()
        call.post(comm.Igather, raw(send), raw(flat), root, algorithm=algo)
        result = [outs]
    else:
        _not_root(call, output_lists, "output")
        call.post(comm.Igather, raw(call.inp(inp)), None, root, algorithm=algo)
        result = []
    return call.work(result, submit)


def scatter(group, outputs, input_lists, root: int, submit: bool = True) -> Work:
    call = Call(group, "scatter")
    out = _one(outputs, "scatter output")
    root = _root(call, root)
    comm = call.comm
    algo = call.algorithm(Collective.SCATTER)
    buf = call.out(out)
    if comm.rank == root:
        ins = _per_rank(call, _one_list(call, input_lists, "input"), out, "input")
        flat = _scatter_buffer(ins)
        if overlaps(flat, buf):
            flat = flat.clone()
        call.post(comm.Iscatter, raw(flat), raw(buf), root, algorithm=algo)
    else:
        _not_root(call, input_lists, "input")
        call.post(comm.Iscatter, None, raw(buf), root, algorithm=algo)
    return call.work([out], submit)


def _alltoall_flat(call: Call, out: torch.Tensor, inp: torch.Tensor) -> None:
    P = call.comm.size
    if inp.numel() != out.numel() or inp.numel() % P:
        raise InvalidArgument(f"{call.what}: input ({inp.numel()} elements) and output "
                              f"({out.numel()}) must be equal and divisible by {P} ranks "
                              "(or give split sizes)")
    _same_dtype(inp, out, call.what)
    send = call.inp(inp)
    if overlaps(send, out):
        send = send.clone()
    call.post(call.comm.Ialltoall, raw(send), raw(out),
                                  algorithm=call.algorithm(Collective.ALLTOALL))


def all_to_all_single(group, out, inp, out_splits, in_splits, submit: bool = True) -> Work:
    call = Call(group, "all_to_all_single")
    check(out, "all_to_all_single output")
    check(inp, "all_to_all_single input")
    P = call.comm.size
    out_splits, in_splits = list(out_splits or []), list(in_splits or [])
    for name, splits, t in (("output", out_splits, out), ("input", in_splits, inp)):
        if splits:
            if len(splits) != P or any(s < 0 for s in splits):
                raise InvalidArgument(f"all_to_all_single: {name}_split_sizes must be {P} "
                                      f"non-negative sizes, got {splits}")
            if sum(splits) != (t.shape[0] if t.dim() else 1):
                raise InvalidArgument(f"all_to_all_single: {name}_split_sizes {splits} "
                                      f"sum to {sum(splits)}, the {name} has "
                                      f"{t.shape[0] if t.dim() else 1} rows")
    buf = call.out(out)
    even = len(set(in_splits + out_splits)) <= 1
    if not (in_splits or out_splits) or (even and not hasattr(call.comm, "Ialltoallv")):
        _alltoall_flat(call, buf, inp)
    else:
        # Split sizes (even or not) always go through Alltoallv, so that every rank
        # makes the same call whatever its own sizes (with equal sizes, Alltoallv moves
        # the data as Alltoall does, after its count agreement).
        _alltoallv(call, buf, inp, _counts(call, in_splits, inp, "input"),
                   _counts(call, out_splits, out, "output"))
    return call.work([out], submit)


def _counts(call: Call, splits: list, t: torch.Tensor, name: str) -> list:
    """Elements per rank of ``t`` split along its first dimension (evenly without
    ``splits``)."""
    P = call.comm.size
    rows, row = (t.shape[0], math.prod(t.shape[1:])) if t.dim() else (1, 1)
    if not splits:
        if rows % P:
            raise InvalidArgument(f"{call.what}: the {name} has {rows} rows, not divisible "
                                  f"by {P} ranks (give {name}_split_sizes)")
        splits = [rows // P] * P
    return [s * row for s in splits]


def _alltoallv(call: Call, out: torch.Tensor, inp: torch.Tensor, scounts: list,
               rcounts: list) -> None:
    """Alltoallv of flat contiguous tensors, counts in elements per rank."""
    _same_dtype(inp, out, call.what)
    alltoallv = _vector(call, "Ialltoallv")
    send = call.inp(inp)
    if overlaps(send, out):
        send = send.clone()
    unit = raw_units(inp.dtype)
    call.post(alltoallv, [raw(send), [n * unit for n in scounts]],
              [raw(out), [n * unit for n in rcounts]])


def alltoall(group, outs, inps, submit: bool = True) -> Work:
    call = Call(group, "all_to_all")
    outs = check_list(outs, "all_to_all output")
    inps = check_list(inps, "all_to_all input")
    P = call.comm.size
    if len(outs) != P or len(inps) != P:
        raise InvalidArgument(f"all_to_all: {len(inps)} inputs and {len(outs)} outputs, "
                              f"the group has {P} ranks")
    for t in inps + outs:
        _same_dtype(t, inps[0], call.what)
    send = _scatter_buffer(inps)
    flat = _gather_buffer(call, outs, outs[0].dtype)
    if hasattr(call.comm, "Ialltoallv"):
        # Always Alltoallv (a rank's sizes may be even while another's are not: every
        # rank must make the same call); equal sizes move as Alltoall does.
        _alltoallv(call, flat, send, [t.numel() for t in inps], [t.numel() for t in outs])
    else:
        _even(inps + outs, inps[0].numel(), call.what)
        _alltoall_flat(call, flat, send)
    return call.work(list(outs), submit)


def barrier(group, submit: bool = True) -> Work:
    call = Call(group, "barrier")
    call.post(call.comm.Ibarrier, algorithm=call.algorithm(Collective.BARRIER))
    return call.work([], submit)
