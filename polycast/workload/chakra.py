"""MLCommons Chakra execution traces in and out (the ``chakra`` extra: ``mlc-chakra``).

Files are named as ASTRA-sim names them: ``PREFIX.0.et``, ``PREFIX.1.et``, ... one per rank,
each a length-prefixed ``GlobalMetadata`` then ``Node`` messages (Chakra's protobuf schema,
``chakra.schema.protobuf.et_def_pb2``). What is read, as ASTRA-sim reads it:

* ``COMP_NODE``: ``duration_micros`` on the rank's compute stream (``is_cpu_op``: the CPU's);
* ``COMM_COLL_NODE``: ``comm_type`` (ALL_REDUCE, ALL_GATHER, REDUCE_SCATTER[_BLOCK],
  ALL_TO_ALL, BROADCAST, REDUCE, GATHER, SCATTER, BARRIER), ``comm_size`` -- each rank's
  input bytes, as ASTRA-sim and Chakra's PyTorch converter use it (an allgather gathers
  ``comm_size x group``) -- and ``pg_name`` (empty or "0": every rank);
* ``COMM_SEND_NODE`` / ``COMM_RECV_NODE``: ``comm_dst`` / ``comm_src``, ``comm_size``,
  ``comm_tag``;
* ``METADATA_NODE``, ``MEM_LOAD_NODE``, ``MEM_STORE_NODE``, ``INVALID_NODE``: no time (a
  metadata node's process-group list, PyTorch's ``[{"pg_name": .., "ranks": [..]}]`` in
  ``inputs.values``, defines communicators, as ASTRA-sim reads it);
* dependencies: ``data_deps`` and ``ctrl_deps`` alike.

Communicator groups come from those metadata nodes or from ASTRA-sim's
``--comm-group-configuration`` JSON (``{"1": [0, 1, 2, 3], ...}``). polycast's own attributes
(``polycast_algorithm``, ``polycast_phase``, ``polycast_stream``, ``polycast_root``, and
``polycast_itemsize`` in the metadata) ride along; other readers ignore them.
:func:`write_chakra` writes a :class:`~.graph.Workload` so that reading it back gives the
same graph, compute rounded to Chakra's whole microseconds.
"""

from __future__ import annotations

import json
import os
import re

from ..errors import InvalidArgument
from .graph import (COLLECTIVE, COMPUTE, NOOP, RECV, SEND, WORLD, Node, Workload,
                    WorkloadError)

# Chakra's CollectiveCommType -> polycast's collective
_COLL = {0: "allreduce", 1: "reduce", 2: "allgather", 3: "gather", 4: "scatter",
         5: "broadcast", 6: "alltoall", 7: "reduce_scatter", 8: "reduce_scatter",
         9: "barrier"}
_COLL_OUT = {"allreduce": 0, "reduce": 1, "allgather": 2, "gather": 3, "scatter": 4,
             "broadcast": 5, "alltoall": 6, "reduce_scatter": 7, "barrier": 9}
MAX_RANKS = 1 << 20


def require_chakra():
    """The protobuf module of ``mlc-chakra``, or a clear error naming the extra."""
    try:
        from chakra.schema.protobuf import et_def_pb2
    except ImportError as e:
        raise InvalidArgument("Chakra traces need the chakra extra: pip install "
                              f"'polycast[chakra]' (mlc-chakra; {e})") from None
    return et_def_pb2


# -- the file format: varint length + message ----------------------------------------------

def _messages(path: str):
    """Yield each message's bytes; raise on a truncated file."""
    with open(path, "rb") as fh:
        data = fh.read()
    i, n, k = 0, len(data), 0
    while i < n:
        size = shift = 0
        while True:
            if i >= n:
                raise WorkloadError(f"{path}: corrupt: message {k} is cut off in its length")
            b = data[i]
            i += 1
            size |= (b & 0x7F) << shift
            if not b & 0x80:
                break
            shift += 7
            if shift > 63:
                raise WorkloadError(f"{path}: corrupt: message {k} has no valid length")
        if i + size > n:
            raise WorkloadError(f"{path}: corrupt: message {k} says {size} bytes, "
                                f"{n - i} are left")
        yield data[i:i + size]
        i += size
        k += 1


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def trace_files(prefix: str) -> list[str]:
    """``PREFIX.0.et``, ``PREFIX.1.et``, ... as long as they exist."""
    out = []
    while len(out) < MAX_RANKS and os.path.exists(f"{prefix}.{len(out)}.et"):
        out.append(f"{prefix}.{len(out)}.et")
    return out


# -- reading ---------------------------------------------------------------------------------

def _attr(a):
    which = a.WhichOneof("value")
    if which is None:
        return None
    v = getattr(a, which)
    return list(v.values) if which.endswith("_list") else v


def _pg_groups(values: str) -> list[tuple[str, list[int]]]:
    """PyTorch's process-group list in a metadata node's inputs.values, leniently: plain
    JSON, or wrapped in two characters each side as ASTRA-sim strips them."""
    for text in (values, values[2:-2]):
        try:
            items = json.loads(text)
        except (ValueError, TypeError):
            continue
        while isinstance(items, list) and len(items) == 1 and isinstance(items[0], (list, str)):
            items = items[0] if isinstance(items[0], list) else json.loads(items[0])
        if isinstance(items, list) and all(isinstance(x, dict) and "pg_name" in x
                                           for x in items):
            return [(str(x["pg_name"]), [int(r) for r in x.get("ranks", [])]) for x in items]
    return []


def read_chakra(prefix: str, nranks: int | None = None,
                comm_groups: str | dict | None = None, itemsize: int | None = None
                ) -> Workload:
    """The workload of ``PREFIX.<rank>.et``. ``nranks`` (the topology's) must equal the
    number of files; ``comm_groups``: ASTRA-sim's communicator JSON (a path or a dict).
    ``itemsize``: element size for the schedules (default the trace's own
    ``polycast_itemsize``, else 1: sizes are bytes)."""
    pb = require_chakra()
    files = trace_files(prefix)
    if not files:
        raise WorkloadError(f"{prefix}: no trace {prefix}.0.et (ASTRA-sim's naming: "
                            "PREFIX.<rank>.et)")
    if nranks is not None and len(files) != nranks:
        raise WorkloadError(f"{prefix}: {len(files)} traces ({files[0]} .. {files[-1]}), the "
                            f"topology has {nranks} ranks")
    P = len(files)
    groups: dict[str, tuple[int, ...]] = {}
    if comm_groups is not None:
        groups.update(_comm_group_file(comm_groups, P))
    programs, sizes = [], set()
    for rank, path in enumerate(files):
        prog, meta, pgs = _read_file(pb, path, rank, P)
        programs.append(prog)
        if meta.get("polycast_itemsize"):
            sizes.add(int(meta["polycast_itemsize"]))
        for name, ranks in pgs:
            g = tuple(ranks) if ranks else tuple(range(P))
            if name in groups and groups[name] != g and comm_groups is None:
                raise WorkloadError(f"{path}: process group {name!r} is {list(g)[:8]} here "
                                    f"but {list(groups[name])[:8]} in another trace")
            groups.setdefault(name, g)
    comms: dict[str, list[tuple[int, ...]]] = {}
    for rank, prog in enumerate(programs):
        for n in prog:
            if n.kind == COLLECTIVE and n.comm != WORLD and n.comm not in comms:
                name = n.comm[len("pg:"):]
                if name not in groups:
                    raise WorkloadError(f"{files[rank]}: node {n.id} ({n.name}) uses process "
                                        f"group {name!r}, which no metadata node nor "
                                        "--comm-groups defines")
                comms[n.comm] = [groups[name]]
    if itemsize is None:
        itemsize = sizes.pop() if len(sizes) == 1 else 1
    return Workload(P, programs, comms, itemsize=itemsize, name=os.path.basename(prefix),
                    sources=files)


def _comm_group_file(spec, P: int) -> dict[str, tuple[int, ...]]:
    where = spec if isinstance(spec, str) else "--comm-groups"
    if isinstance(spec, str):
        try:
            with open(spec) as fh:
                spec = json.load(fh)
        except (OSError, ValueError) as e:
            raise WorkloadError(f"{where}: cannot read communicator groups: {e}") from None
    if not isinstance(spec, dict):
        raise WorkloadError(f"{where}: want {{\"1\": [ranks], ...}}")
    out = {}
    for name, ranks in spec.items():
        if not isinstance(ranks, list) or not all(isinstance(r, int) for r in ranks):
            raise WorkloadError(f"{where}: group {name!r} is not a list of ranks")
        out[str(name)] = tuple(ranks) if ranks else tuple(range(P))
    return out


def _read_file(pb, path: str, rank: int, P: int):
    msgs = _messages(path)
    meta: dict = {}
    try:
        first = next(msgs)
    except StopIteration:
        raise WorkloadError(f"{path}: empty (no GlobalMetadata)") from None
    g = pb.GlobalMetadata()
    try:
        g.ParseFromString(first)
    except Exception as e:          # protobuf's DecodeError
        raise WorkloadError(f"{path}: corrupt GlobalMetadata ({e})") from None
    for a in g.attr:
        meta[a.name] = _attr(a)
    prog: list[Node] = []
    pgs: list = []
    for k, data in enumerate(msgs):
        node = pb.Node()
        try:
            node.ParseFromString(data)
        except Exception as e:
            after = f" (after node {prog[-1].id})" if prog else ""
            raise WorkloadError(f"{path}: corrupt at message {k + 1}{after}: {e}") from None
        prog.append(_node(pb, node, path, rank, P, pgs))
    return prog, meta, pgs


def _node(pb, node, path: str, rank: int, P: int, pgs: list) -> Node:
    attrs = {a.name: _attr(a) for a in node.attr}
    deps = tuple(sorted(set(node.data_deps) | set(node.ctrl_deps)))
    where = f"{path}: node {node.id}" + (f" ({node.name})" if node.name else "")
    base = dict(id=int(node.id), name=node.name, deps=deps,
                phase=str(attrs.get("polycast_phase") or ""),
                stream=str(attrs.get("polycast_stream") or ""))
    t = node.type
    if t == pb.COMP_NODE:
        return Node(kind=COMPUTE, duration_s=node.duration_micros * 1e-6,
                    cpu=bool(attrs.get("is_cpu_op", False)), **base)
    if t == pb.COMM_COLL_NODE:
        ct = attrs.get("comm_type")
        if ct is None or int(ct) not in _COLL:
            raise WorkloadError(f"{where}: unknown collective comm_type {ct!r}")
        pg = str(attrs.get("pg_name") or "")
        return Node(kind=COLLECTIVE, collective=_COLL[int(ct)],
                    nbytes=_size(attrs, where), comm=WORLD if pg in ("", "0") else "pg:" + pg,
                    algorithm=str(attrs.get("polycast_algorithm") or ""),
                    options=_options(attrs.get("polycast_options"), where),
                    root=int(attrs.get("polycast_root") or 0), **base)
    if t in (pb.COMM_SEND_NODE, pb.COMM_RECV_NODE):
        send = t == pb.COMM_SEND_NODE
        me, other = ("comm_src", "comm_dst") if send else ("comm_dst", "comm_src")
        if attrs.get(me) is not None and int(attrs[me]) != rank:
            raise WorkloadError(f"{where}: {me} is {attrs[me]} in rank {rank}'s trace")
        if attrs.get(other) is None:
            raise WorkloadError(f"{where}: a {'send' if send else 'receive'} with no {other}")
        return Node(kind=SEND if send else RECV, nbytes=_size(attrs, where),
                    peer=int(attrs[other]), tag=int(attrs.get("comm_tag") or 0), **base)
    if t == pb.METADATA_NODE:
        if node.inputs.values:
            pgs.extend(_pg_groups(node.inputs.values))
        return Node(kind=NOOP, **base)
    if t in (pb.MEM_LOAD_NODE, pb.MEM_STORE_NODE, pb.INVALID_NODE):
        return Node(kind=NOOP, **base)
    raise WorkloadError(f"{where}: unknown node type {t}")


def _options(text, where: str) -> tuple:
    """``"roots=8,nchunks=2"`` -> (("roots", 8), ("nchunks", 2))."""
    if not text:
        return ()
    out = []
    for item in str(text).split(","):
        k, eq, v = item.partition("=")
        if not eq or not k.strip():
            raise WorkloadError(f"{where}: polycast_options {text!r}: want KEY=VALUE,...")
        v = v.strip()
        out.append((k.strip(), int(v) if v.lstrip("-").isdigit() else v))
    return tuple(out)


def _size(attrs: dict, where: str) -> int:
    v = attrs.get("comm_size")
    if v is None:
        raise WorkloadError(f"{where}: no comm_size")
    v = int(v)
    if v < 0:
        raise WorkloadError(f"{where}: comm_size {v}")
    return v


# -- writing ---------------------------------------------------------------------------------

def write_chakra(w: Workload, directory: str, name: str = "workload") -> str:
    """Write ``w`` as ``DIRECTORY/NAME.<rank>.et`` (and ``NAME.comm_groups.json``, ASTRA-sim's
    communicator file, when it has groups); returns the prefix."""
    pb = require_chakra()
    if not re.fullmatch(r"[A-Za-z0-9_.+-]+", name):
        raise InvalidArgument(f"trace name {name!r}: letters, digits, _ . + - only")
    os.makedirs(directory, exist_ok=True)
    prefix = os.path.join(directory, name)
    # every group gets an integer process-group name (ASTRA-sim wants integers; 0 = all)
    ids: dict[tuple, int] = {}
    for fam in sorted(w.comms):
        for g in w.comms[fam]:
            ids.setdefault((fam, tuple(g)), len(ids) + 1)
    pg_list = [{"pg_name": str(i), "ranks": list(g)} for (fam, g), i in ids.items()]
    if pg_list:
        with open(prefix + ".comm_groups.json", "w") as fh:
            json.dump({str(i): list(g) for (fam, g), i in ids.items()}, fh)
    for rank, prog in enumerate(w.programs):
        with open(f"{prefix}.{rank}.et", "wb") as fh:
            g = pb.GlobalMetadata(version="0.0.4", attr=[
                pb.AttributeProto(name="schema", string_val="1.0.2-chakra.0.0.4"),
                pb.AttributeProto(name="polycast_itemsize", int64_val=w.itemsize),
                pb.AttributeProto(name="polycast_workload", string_val=w.name)])
            _emit(fh, g)
            base = max((n.id for n in prog), default=-1) + 1
            if pg_list:
                meta = pb.Node(id=base, name="process_group:init", type=pb.METADATA_NODE)
                # "[[" + list + "]]": what ASTRA-sim strips (two characters each side)
                meta.inputs.values = "[[" + json.dumps(pg_list) + "]]"
                _emit(fh, meta)
            for n in prog:
                _emit(fh, _to_pb(pb, n, w, rank, ids))
    return prefix


def _emit(fh, msg) -> None:
    data = msg.SerializeToString()
    fh.write(_varint(len(data)))
    fh.write(data)


def _to_pb(pb, n: Node, w: Workload, rank: int, ids: dict):
    A = pb.AttributeProto
    out = pb.Node(id=n.id, name=n.name)
    out.data_deps.extend(n.deps)
    attrs = [A(name="is_cpu_op", bool_val=bool(n.cpu))]
    if n.kind == COMPUTE:
        out.type = pb.COMP_NODE
        out.duration_micros = int(round(n.duration_s * 1e6))
    elif n.kind == COLLECTIVE:
        out.type = pb.COMM_COLL_NODE
        attrs += [A(name="comm_type", int64_val=_COLL_OUT[n.collective]),
                  A(name="comm_size", int64_val=n.nbytes)]
        if n.comm != WORLD:
            g = w.group_of(rank, n.comm)
            attrs.append(A(name="pg_name", string_val=str(ids[(n.comm, tuple(g))])))
        if n.algorithm:
            attrs.append(A(name="polycast_algorithm", string_val=n.algorithm))
        if n.options:
            attrs.append(A(name="polycast_options",
                           string_val=",".join(f"{k}={v}" for k, v in n.options)))
        if n.root:
            attrs.append(A(name="polycast_root", int64_val=n.root))
    elif n.kind in (SEND, RECV):
        out.type = pb.COMM_SEND_NODE if n.kind == SEND else pb.COMM_RECV_NODE
        src, dst = (rank, n.peer) if n.kind == SEND else (n.peer, rank)
        attrs += [A(name="comm_src", int64_val=src), A(name="comm_dst", int64_val=dst),
                  A(name="comm_size", int64_val=n.nbytes), A(name="comm_tag", int64_val=n.tag)]
    else:
        out.type = pb.METADATA_NODE
    if n.phase:
        attrs.append(A(name="polycast_phase", string_val=n.phase))
    if n.stream:
        attrs.append(A(name="polycast_stream", string_val=n.stream))
    out.attr.extend(attrs)
    return out
