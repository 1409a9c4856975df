"""NCCL's binary / double binary trees, binomial and hierarchical trees, and `polycast tree`.

The expected tables are copied from specs/dbtree.md; they are the contract with NCCL.
"""

from __future__ import annotations

import json
import math

import pytest

from polycast.cli.main import main
from polycast.errors import InvalidArgument, UnknownName
from polycast.graph.trees import (KaryTree, Tree, TreeNode, binary_tree, binomial_tree,
                                  hierarchical_dbtree, nccl_dbtree, nccl_tree0, nccl_tree1,
                                  tree_pattern)

_ = None   # "-" in the spec's tables

# rank: (tree0 (parent, child0, child1), tree1 (parent, child0, child1))
SPEC_6 = {
    0: ((_, _, 4), (1, _, _)),
    1: ((2, _, _), (5, 3, 0)),
    2: ((4, 1, 3), (3, _, _)),
    3: ((2, _, _), (1, 4, 2)),
    4: ((0, 2, 5), (3, _, _)),
    5: ((4, _, _), (_, _, 1)),
}
SPEC_7 = {
    0: ((_, _, 4), (5, 6, _)),
    1: ((2, _, _), (_, _, 5)),
    2: ((4, 1, 3), (3, _, _)),
    3: ((2, _, _), (5, 2, 4)),
    4: ((0, 2, 6), (3, _, _)),
    5: ((6, _, _), (1, 3, 0)),
    6: ((4, 5, _), (0, _, _)),
}
SPECS = {6: SPEC_6, 7: SPEC_7}


def _dash(triple):
    return tuple(-1 if x is None else x for x in triple)


def _edges(tree) -> set[tuple[int, int]]:
    return {(r, c) for r in range(tree.nranks) for c in tree.children(r)}


# --------------------------------------------------------------------------- spec tables


@pytest.mark.parametrize("n", [6, 7])
def test_spec_tables_rank_functions(n):
    for rank, (t0, t1) in SPECS[n].items():
        assert nccl_tree0(rank, n) == _dash(t0), f"tree0 rank {rank}"
        assert nccl_tree1(rank, n) == _dash(t1), f"tree1 rank {rank}"


@pytest.mark.parametrize("n, roots", [(6, (0, 5)), (7, (0, 1))])
def test_spec_tables_trees(n, roots):
    trees = nccl_dbtree(n)
    assert tuple(t.root for t in trees) == roots
    for i, tree in enumerate(trees):
        assert tree.nodes == [TreeNode(r, *_dash(SPECS[n][r][i])) for r in range(n)]
    assert binary_tree(n) == trees[0]


def test_spec_larger_shapes():
    t0 = nccl_dbtree(14)[0]
    assert t0.root == 0
    assert _edges(t0) == {(0, 8), (8, 4), (8, 12), (4, 2), (4, 6), (12, 10), (12, 13),
                          (2, 1), (2, 3), (6, 5), (6, 7), (10, 9), (10, 11)}
    t1 = nccl_dbtree(12)[1]
    assert t1.root == 11
    assert t1.children(11) == [3]
    assert t1.children(3) == [7, 1] and t1.children(7) == [9, 5] and t1.children(1) == [2, 0]
    t1 = nccl_dbtree(13)[1]
    assert t1.root == 1
    assert t1.children(1) == [9]
    assert t1.children(9) == [5, 0] and t1.children(5) == [3, 7]
    assert t1.children(0) == [11] and t1.children(11) == [10, 12]


def test_small_n():
    t0, t1 = nccl_dbtree(1)
    assert t0 == t1 == Tree(0, [TreeNode(0)])
    assert t0.depth() == 0 and t0.bfs_order() == [0] and t0.children(0) == []
    t0, t1 = nccl_dbtree(2)
    assert t0.nodes == [TreeNode(0, -1, -1, 1), TreeNode(1, 0, -1, -1)]
    assert t1.root == 1 and t1.nodes == [TreeNode(0, 1, -1, -1), TreeNode(1, -1, -1, 0)]


def test_root_child_is_in_slot1():
    for n, child in [(2, 1), (8, 4), (9, 8), (16, 8), (17, 16), (32, 16)]:
        assert nccl_tree0(0, n) == (-1, -1, child)


# --------------------------------------------------------------------------- properties


def _check_spanning(tree, n):
    """One root, every rank reaches it via parents, parent/child links agree both ways."""
    assert tree.nranks == n
    roots = [r for r in range(n) if tree.parent(r) == -1]
    assert roots == [tree.root]
    for r in range(n):
        seen, x = set(), r
        while x != tree.root:
            assert x not in seen, f"cycle through {r}"
            seen.add(x)
            x = tree.parent(x)
            assert 0 <= x < n
        for c in tree.children(r):
            assert tree.parent(c) == r
        if r != tree.root:
            assert r in tree.children(tree.parent(r))
    assert sorted(tree.bfs_order()) == list(range(n))


def test_dbtree_properties_up_to_200():
    for n in range(1, 201):
        trees = nccl_dbtree(n)
        for tree in trees:
            _check_spanning(tree, n)
            for node in tree.nodes:
                assert node.child0 != node.child1 or node.child0 == -1
                # the slot a rank occupies is its "child type"; it must name a real slot
                if node.parent != -1:
                    p = tree.nodes[node.parent]
                    slot = tree.child_slot(node.rank)
                    assert (p.child0, p.child1)[slot] == node.rank
            assert tree.depth() <= max(0, math.ceil(math.log2(n)))
        both = set(trees[0].interior()) & set(trees[1].interior())
        if n % 2 == 0:
            assert not both, n
        else:
            assert both <= {0}, n
        # tree 0: odd ranks are leaves (the premise of the complementary tree)
        assert all(trees[0].is_leaf(r) for r in range(1, n, 2))


def test_bfs_order_parents_first():
    tree = nccl_dbtree(37)[1]
    order = tree.bfs_order()
    where = {r: i for i, r in enumerate(order)}
    assert order[0] == tree.root
    assert all(where[tree.parent(r)] < where[r] for r in order[1:])
    levels = tree.levels()
    assert levels[tree.root] == 0 and max(levels) == tree.depth()


def test_as_kary_keeps_shape():
    tree = nccl_dbtree(11)[1]
    kary = tree.as_kary()
    assert isinstance(kary, KaryTree)
    assert kary.root == tree.root
    assert all(kary.children(r) == tree.children(r) and kary.parent(r) == tree.parent(r)
               for r in range(11))


# --------------------------------------------------------------------------- binomial


def test_binomial_small():
    t = binomial_tree(8)
    assert t.root == 0
    assert t.children(0) == [4, 2, 1]          # largest subtree first
    assert t.children(4) == [6, 5] and t.children(6) == [7] and t.children(2) == [3]
    assert t.depth() == 3
    t = binomial_tree(5, root=2)
    assert t.root == 2 and t.children(2) == [1, 4, 3] and t.children(4) == [0]


def test_binomial_properties():
    for n in range(1, 70):
        for root in {0, n // 2, n - 1}:
            t = binomial_tree(n, root)
            _check_spanning(t, n)
            assert t.depth() == n.bit_length() - 1       # floor(log2 n)


# --------------------------------------------------------------------------- hierarchical

# (local rank carrying the child0 host link, ... child1); balanced is NCCL's ncclTopoPreset:
# child0Index = 1, child1Index = 0 (specs/dbtree.md).
PATTERN_LINKS = {"tree": (0, 0), "split": (1, 1), "balanced": (1, 0)}


@pytest.mark.parametrize("pattern", ["tree", "split", "balanced"])
@pytest.mark.parametrize("H, R", [(1, 1), (1, 4), (2, 1), (2, 3), (5, 2), (6, 4), (7, 3),
                                  (13, 8)])
def test_hierarchical(H, R, pattern):
    trees = hierarchical_dbtree(H, R, pattern)
    host_trees = nccl_dbtree(H)
    for tree, host_tree in zip(trees, host_trees):
        _check_spanning(tree, H * R)
        assert tree.root == host_tree.root * R
        for r in range(H * R):
            host, local = divmod(r, R)
            assert len(tree.children(r)) <= 3
            p = tree.parent(r)
            if local > 0:
                assert p == r - 1                     # the chain inside the host
            elif p != -1:
                # a host is entered at its local 0, from the parent host's designated rank
                phost, plocal = divmod(p, R)
                assert phost == host_tree.parent(host)
                slot = host_tree.child_slot(host)
                assert plocal == min(PATTERN_LINKS[pattern][slot], R - 1)
            for c in tree.children(r):
                chost, clocal = divmod(c, R)
                if chost != host:
                    assert clocal == 0
                    assert local in {min(x, R - 1) for x in PATTERN_LINKS[pattern]}
                else:
                    assert c == r + 1
            # NCCL's down[] order: the chain successor first
            if local + 1 < R:
                assert tree.children(r)[0] == r + 1


@pytest.mark.parametrize("pattern", ["tree", "split", "balanced"])
def test_hierarchical_one_rank_per_host_is_flat(pattern):
    for H in (1, 2, 6, 7, 12):
        assert hierarchical_dbtree(H, 1, pattern) == tuple(t.as_kary() for t in nccl_dbtree(H))


def test_hierarchical_balanced_example():
    t0, t1 = hierarchical_dbtree(3, 3, "balanced_tree")
    # hosts: tree 0 is 0 -> (child1) 2 -> (child0) 1. The child1 link leaves from local 0
    # (rank 0 -> host 2's rank 6), the child0 link from local 1 (rank 7 -> host 1's rank 3).
    assert t0.children(0) == [1, 6] and t0.children(1) == [2]
    assert t0.children(6) == [7] and t0.children(7) == [8, 3]
    assert t0.parent(3) == 7 and t0.depth() == 5


def test_pattern_names():
    assert tree_pattern("SPLIT_TREE") == "split"
    assert tree_pattern("balanced-tree") == "balanced"
    assert tree_pattern("tree") == "tree"
    with pytest.raises(UnknownName, match="bogus"):
        tree_pattern("bogus")
    with pytest.raises(UnknownName):
        hierarchical_dbtree(2, 2, "bogus")


@pytest.mark.parametrize("call", [
    lambda: nccl_dbtree(0), lambda: binary_tree(-3), lambda: nccl_tree0(0, 0),
    lambda: nccl_tree0(5, 5), lambda: nccl_tree1(-1, 4), lambda: binomial_tree(0),
    lambda: binomial_tree(4, root=4), lambda: hierarchical_dbtree(0, 2),
    lambda: hierarchical_dbtree(2, 0), lambda: nccl_dbtree(2.5),
])
def test_invalid_arguments(call):
    with pytest.raises(InvalidArgument):
        call()


# --------------------------------------------------------------------------- CLI


def _run(capsys, *argv):
    code = main(["tree", *argv])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("n", [6, 7])
def test_cli_json_matches_spec(capsys, n):
    code, out, _ = _run(capsys, "--ranks", str(n), "--json")
    assert code == 0
    data = json.loads(out)
    assert data["nranks"] == n
    assert [t["root"] for t in data["trees"]] == [t.root for t in nccl_dbtree(n)]
    for i, t in enumerate(data["trees"]):
        assert t["nodes"] == [
            dict(zip(("rank", "parent", "child0", "child1"), (r, *_dash(SPECS[n][r][i]))))
            for r in range(n)]


def test_cli_text(capsys):
    code, out, _ = _run(capsys, "--ranks", "6")
    assert code == 0
    assert "tree 0: root 0, depth 3" in out and "tree 1: root 5, depth 3" in out
    assert "rank  tree0 (parent, child0, child1)  tree1 (parent, child0, child1)" in out
    rows = {line.split()[0]: line for line in out.splitlines()
            if line.strip()[:1].isdigit() and "(" in line and "child" not in line}
    assert rows["1"].split(None, 1)[1].split() == ["(2,", "-,", "-)", "(5,", "3,", "0)"]
    assert rows["5"].split(None, 1)[1].split() == ["(4,", "-,", "-)", "(-,", "-,", "1)"]


def test_cli_hierarchical(capsys):
    code, out, _ = _run(capsys, "--hosts", "3", "--ranks-per-host", "4", "--pattern",
                        "split", "--json")
    assert code == 0
    data = json.loads(out)
    assert (data["nranks"], data["hosts"], data["ranks_per_host"]) == (12, 3, 4)
    assert data["pattern"] == "split"
    trees = hierarchical_dbtree(3, 4, "split")
    for t, tree in zip(data["trees"], trees):
        assert t["root"] == tree.root
        assert [(n["rank"], n["host"], n["local"], n["parent"], n["children"])
                for n in t["nodes"]] == [(r, r // 4, r % 4, tree.parent(r), tree.children(r))
                                          for r in range(12)]
    code, out, _ = _run(capsys, "--ranks", "8", "--hosts", "4", "--pattern", "balanced")
    assert code == 0 and "4 hosts x 2 ranks = 8" in out and "tree 1: root" in out


@pytest.mark.parametrize("argv, words", [
    (["--ranks", "0"], "--ranks"),
    (["--ranks", "6", "--pattern", "bogus"], "bogus"),
    (["--hosts", "0", "--ranks-per-host", "2"], "--hosts"),
    (["--ranks", "7", "--hosts", "2", "--ranks-per-host", "4"], "does not match"),
    (["--ranks", "7", "--hosts", "2"], "multiple"),
    ([], "--ranks"),
])
def test_cli_errors(capsys, argv, words):
    code, out, err = _run(capsys, *argv)
    assert code == 2
    assert out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("polycast tree: error:") and words in lines[0]


def test_cli_png(capsys, tmp_path):
    pytest.importorskip("matplotlib")
    path = tmp_path / "trees.png"
    code, _, _ = _run(capsys, "--ranks", "14", "--png", str(path))
    assert code == 0
    data = path.read_bytes()
    assert len(data) > 1000 and data.startswith(b"\x89PNG\r\n\x1a\n")
    path = tmp_path / "hier.png"
    assert _run(capsys, "--hosts", "3", "--ranks-per-host", "2", "--png", str(path))[0] == 0
    assert path.read_bytes().startswith(b"\x89PNG")


def test_cli_png_without_matplotlib(capsys, tmp_path, monkeypatch):
    import builtins
    real_import = builtins.__import__

    def no_matplotlib(name, *args, **kwargs):
        if name.startswith("matplotlib"):
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_matplotlib)
    code, _, err = _run(capsys, "--ranks", "4", "--png", str(tmp_path / "x.png"))
    assert code == 2 and "pip install 'polycast[plot]'" in err
