"""``polycast tree``: show NCCL's double binary tree, flat or hierarchical.

The point is to let a user compare polycast's trees with NCCL's ``Trees [c]
down0/down1/down2->rank->up`` log lines, and to see what the hierarchical patterns do,
without running anything.
"""

from __future__ import annotations

import argparse
import json

from ..errors import InvalidArgument, PolycastError
from ..graph.trees import (NONE, TREE_PATTERNS, KaryTree, Tree, hierarchical_dbtree,
                           host_local, nccl_dbtree, tree_pattern)

_JSON_HELP = """\
JSON output (--json), one line:
  flat:          {"nranks": N, "trees": [{"root": R, "nodes": [{"rank": r, "parent": p,
                   "child0": c0, "child1": c1}, ...]}, {...tree 1...}]}
  hierarchical:  {"nranks": N, "hosts": H, "ranks_per_host": R, "pattern": P,
                   "trees": [{"root": R, "nodes": [{"rank": r, "host": h, "local": l,
                   "parent": p, "children": [c, ...]}, ...]}, {...tree 1...}]}
  One node per rank in rank order; -1 means none. Flat slots are in NCCL's order;
  hierarchical children are in NCCL's down[] order: the next rank on the host's chain,
  then the child0 host, then the child1 host.
"""


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "tree", help="show NCCL's double binary tree (flat or across hosts)",
        description="Print the two trees of NCCL's double binary tree: a drawing of each\n"
                    "and an NCCL-like table (parent, child0, child1) per rank. With --hosts,\n"
                    "the hierarchical form: a chain inside each host and the double binary\n"
                    "tree across hosts.",
        epilog=_JSON_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ranks", "-n", type=int, metavar="N",
                   help="number of ranks (optional with --hosts: N = H*R)")
    p.add_argument("--hosts", type=int, metavar="H",
                   help="build the hierarchical form over H hosts")
    p.add_argument("--ranks-per-host", type=int, metavar="R",
                   help="ranks per host in the hierarchical form (default N/H, or 1)")
    p.add_argument("--pattern", metavar="P", default=None,
                   help="which local ranks carry the links to child hosts: "
                        f"{', '.join(TREE_PATTERNS)} (NCCL's TREE, SPLIT_TREE, BALANCED_TREE; "
                        "default tree); implies the hierarchical form")
    p.add_argument("--json", action="store_true", help="print JSON instead of text")
    p.add_argument("--png", metavar="FILE", help="also draw both trees into FILE (matplotlib)")
    p.set_defaults(func=run)


def run(args) -> int:
    hierarchical = any(v is not None for v in (args.hosts, args.ranks_per_host, args.pattern))
    title = None
    if hierarchical:
        pattern = tree_pattern(args.pattern or "tree")   # an unknown name fails first
        hosts, per_host = _host_shape(args.ranks, args.hosts, args.ranks_per_host)
        trees = hierarchical_dbtree(hosts, per_host, pattern)
        title = (f"hierarchical double binary tree, {hosts} hosts x {per_host} ranks, "
                 f"pattern {pattern}")
        if args.json:
            print(json.dumps(_hier_json(trees, hosts, per_host, pattern)))
        else:
            print(_hier_text(trees, hosts, per_host, pattern))
    else:
        if args.ranks is None:
            raise InvalidArgument("give --ranks N (or --hosts H for the hierarchical form)")
        if args.ranks < 1:
            raise InvalidArgument(f"--ranks must be at least 1, got {args.ranks}")
        trees = nccl_dbtree(args.ranks)
        if args.json:
            print(json.dumps(_flat_json(trees)))
        else:
            print(_flat_text(trees))
    if args.png:
        draw_png(trees, args.png, title)
    return 0


def _host_shape(ranks: int | None, hosts: int | None, per_host: int | None) -> tuple[int, int]:
    """Resolve (hosts, ranks per host) from whichever two of N, H, R were given."""
    if hosts is None and per_host is None:
        raise InvalidArgument("the hierarchical form needs --hosts or --ranks-per-host")
    for name, value in (("--ranks", ranks), ("--hosts", hosts),
                        ("--ranks-per-host", per_host)):
        if value is not None and value < 1:
            raise InvalidArgument(f"{name} must be at least 1, got {value}")
    if hosts is None:
        if ranks is None:
            raise InvalidArgument("give --hosts (or --ranks) with --ranks-per-host")
        if ranks % per_host:
            raise InvalidArgument(f"--ranks {ranks} is not a multiple of "
                                  f"--ranks-per-host {per_host}")
        return ranks // per_host, per_host
    if per_host is None:
        if ranks is None:
            return hosts, 1
        if ranks % hosts:
            raise InvalidArgument(f"--ranks {ranks} is not a multiple of --hosts {hosts}")
        return hosts, ranks // hosts
    if ranks is not None and ranks != hosts * per_host:
        raise InvalidArgument(f"--ranks {ranks} does not match --hosts {hosts} x "
                              f"--ranks-per-host {per_host} = {hosts * per_host}")
    return hosts, per_host


# --------------------------------------------------------------------------- JSON


def _flat_json(trees: tuple[Tree, Tree]) -> dict:
    return {"nranks": trees[0].nranks,
            "trees": [{"root": t.root,
                       "nodes": [{"rank": n.rank, "parent": n.parent,
                                  "child0": n.child0, "child1": n.child1} for n in t.nodes]}
                      for t in trees]}


def _hier_json(trees: tuple[KaryTree, KaryTree], hosts: int, per_host: int,
               pattern: str) -> dict:
    def node(n):
        host, local = host_local(n.rank, per_host)
        return {"rank": n.rank, "host": host, "local": local, "parent": n.parent,
                "children": list(n.children)}
    return {"nranks": hosts * per_host, "hosts": hosts, "ranks_per_host": per_host,
            "pattern": pattern,
            "trees": [{"root": t.root, "nodes": [node(n) for n in t.nodes]} for t in trees]}


# --------------------------------------------------------------------------- text


def _slot(x: int) -> str:
    return "-" if x == NONE else str(x)


def _drawing(tree, label) -> list[str]:
    """An indented ASCII drawing, root first, children in stored order.

    Iterative (not recursive) because a long host chain can be deeper than Python's
    recursion limit. ASCII so it survives any terminal encoding.
    """
    lines = [label(tree.root)]
    stack = _kids_for_stack(tree, tree.root, "")
    while stack:
        rank, prefix, last = stack.pop()
        lines.append(f"{prefix}{'`- ' if last else '|- '}{label(rank)}")
        stack += _kids_for_stack(tree, rank, prefix + ("   " if last else "|  "))
    return ["  " + line for line in lines]


def _kids_for_stack(tree, rank: int, prefix: str) -> list[tuple[int, str, bool]]:
    """(child, prefix, is last child) entries, reversed so that popping yields them in order."""
    kids = tree.children(rank)
    return [(c, prefix, i == len(kids) - 1) for i, c in enumerate(kids)][::-1]


def _flat_text(trees: tuple[Tree, Tree]) -> str:
    n = trees[0].nranks
    kind = "mirror" if n % 2 == 0 else "shift by one"
    out = [f"double binary tree over {n} rank{'s' if n != 1 else ''} "
           f"(NCCL 2.8.3+; tree 1 is the {kind} of tree 0)", ""]
    for i, t in enumerate(trees):
        # The slot tag lets the drawing be read against NCCL's down0/down1 columns.
        out.append(f"tree {i}: root {t.root}, depth {t.depth()}")
        out += _drawing(t, lambda r, t=t: str(r) if r == t.root
                        else f"{r} (child{t.child_slot(r)})")
        out.append("")
    cols = [[_triple(t.nodes[r]) for t in trees] for r in range(n)]
    w = max(len("tree0 (parent, child0, child1)"), *(len(c[0]) for c in cols))
    rw = max(4, len(str(n - 1)))
    out.append(f"{'rank':>{rw}}  {'tree0 (parent, child0, child1)':<{w}}  "
               "tree1 (parent, child0, child1)")
    out += [f"{r:>{rw}}  {c0:<{w}}  {c1}" for r, (c0, c1) in enumerate(cols)]
    return "\n".join(out)


def _triple(node) -> str:
    return f"({_slot(node.parent)}, {_slot(node.child0)}, {_slot(node.child1)})"


def _hier_text(trees: tuple[KaryTree, KaryTree], hosts: int, per_host: int,
               pattern: str) -> str:
    n = hosts * per_host
    out = [f"hierarchical double binary tree: {hosts} host{'s' if hosts != 1 else ''} x "
           f"{per_host} rank{'s' if per_host != 1 else ''} = {n}, pattern {pattern} "
           f"(chain inside each host, dbtree across hosts)", ""]

    def label(r):
        host, local = host_local(r, per_host)
        return f"{r} [host {host}.{local}]"

    for i, t in enumerate(trees):
        out.append(f"tree {i}: root {t.root}, depth {t.depth()}")
        out += _drawing(t, label)
        out.append("")
    cells = [[f"{_slot(t.parent(r))} -> {','.join(map(str, t.children(r))) or '-'}"
              for t in trees] for r in range(n)]
    w = max(len("tree0 (parent -> children)"), *(len(c[0]) for c in cells))
    rw = max(4, len(str(n - 1)))
    hw = max(4, len(str(hosts - 1)))
    lw = max(5, len(str(per_host - 1)))
    out.append(f"{'rank':>{rw}}  {'host':>{hw}}  {'local':>{lw}}  "
               f"{'tree0 (parent -> children)':<{w}}  tree1 (parent -> children)")
    for r, (c0, c1) in enumerate(cells):
        host, local = host_local(r, per_host)
        out.append(f"{r:>{rw}}  {host:>{hw}}  {local:>{lw}}  {c0:<{w}}  {c1}")
    return "\n".join(out)


# --------------------------------------------------------------------------- PNG


def _slots(tree, rank: int) -> tuple[list[int], list[int]]:
    """Children drawn left and right of ``rank``.

    For an NCCL binary tree the slot decides (child0 left, child1 right), so the root of
    tree 0, whose lone child is in child1, has it on its right. For other trees the first
    half of the children go left.
    """
    if isinstance(tree, Tree):
        node = tree.nodes[rank]
        return ([node.child0] if node.child0 != NONE else [],
                [node.child1] if node.child1 != NONE else [])
    kids = tree.children(rank)
    half = len(kids) // 2
    return kids[:half], kids[half:]


def layout(tree) -> dict[int, tuple[int, int]]:
    """rank -> (in-order position, level): x from an in-order walk, y from the depth."""
    level = tree.levels()
    pos: dict[int, tuple[int, int]] = {}
    stack: list[tuple[int, bool]] = [(tree.root, False)]   # iterative in-order walk
    while stack:
        rank, expanded = stack.pop()
        if expanded:
            pos[rank] = (len(pos), level[rank])
            continue
        left, right = _slots(tree, rank)
        stack += [(c, False) for c in reversed(right)]
        stack.append((rank, True))
        stack += [(c, False) for c in reversed(left)]
    return pos


def draw_png(trees, path: str, title: str | None = None) -> None:
    """Draw both trees side by side into ``path``: interior ranks in one colour, leaves in
    another, the root outlined. Uses the Agg canvas directly, so no GUI and no global
    pyplot state."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        raise PolycastError("--png needs matplotlib: pip install 'polycast[plot]'") from None
    n = trees[0].nranks
    depth = max(t.depth() for t in trees)
    per_tree = min(30.0, max(4.0, 0.4 * n))           # inches; huge trees get small nodes
    height = min(30.0, max(2.5, 0.9 * (depth + 1)))
    fig = Figure(figsize=(2 * per_tree, height))
    FigureCanvasAgg(fig)
    spacing = per_tree * 72.0 / (n + 1)               # points between in-order neighbours
    marker = max(3.0, min(22.0, 0.8 * spacing))
    font = max(2.0, min(10.0, 0.45 * marker))
    for i, t in enumerate(trees):
        ax = fig.add_subplot(1, 2, i + 1)
        pos = layout(t)
        for r in range(t.nranks):
            for c in t.children(r):
                (x0, y0), (x1, y1) = pos[r], pos[c]
                ax.plot([x0, x1], [-y0, -y1], color="0.6", lw=0.8, zorder=1)
        for r, (x, y) in pos.items():
            colour = "#f4a261" if t.is_leaf(r) else "#2a9d8f"
            edge = "black" if r == t.root else "none"
            ax.plot(x, -y, "o", ms=marker, color=colour, mec=edge, mew=1.5, zorder=2)
            ax.annotate(str(r), (x, -y), ha="center", va="center", fontsize=font, zorder=3)
        ax.set_title(f"tree {i}: root {t.root}, depth {t.depth()}")
        ax.set_xlim(-1, max(len(pos), 1))
        ax.set_ylim(-depth - 0.6, 0.6)
        ax.axis("off")
    title = title or f"double binary tree, {n} ranks"
    fig.suptitle(f"{title}  (green: interior, orange: leaf)")
    fig.tight_layout()
    try:
        fig.savefig(path, dpi=100)
    except (OSError, ValueError) as exc:     # bad directory, unknown file extension
        raise PolycastError(f"cannot write {path}: {exc}") from None
