"""Tests of flashspan.masks: every builder against a brute-force dense definition."""

import importlib.util
import pathlib
import random
import sys

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

_PY = pathlib.Path(__file__).resolve().parents[2] / "python"
if str(_PY) not in sys.path:
    sys.path.insert(0, str(_PY))
try:
    from flashspan import masks as fm
except Exception:  # the package __init__ may need the native library; masks itself does not
    _spec = importlib.util.spec_from_file_location("flashspan_masks_standalone", _PY / "flashspan" / "masks.py")
    fm = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(fm)


# ---------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------


def brute(sq, sk, pred):
    """bool [Sq, Sk] with pred(q, k) evaluated one element at a time (the slow, obvious way)."""
    return torch.tensor([[bool(pred(q, k)) for k in range(sk)] for q in range(sq)], dtype=torch.bool)


def assert_valid(mask_func, sk, nfunc=None):
    assert mask_func.dtype == torch.int32
    assert mask_func.dim() == 3
    assert mask_func.shape[1] % 2 == 1
    if nfunc is not None:
        assert mask_func.shape[1] == nfunc
    v = mask_func.long()
    assert bool((v[:, 1:] >= v[:, :-1]).all()), "endpoints must be nondecreasing"
    if v.numel():
        assert int(v.min()) >= 0 and int(v.max()) <= sk


def assert_mask(mask_func, expected, sk):
    """mask_func [H, n, R] must describe expected bool [R, Sk] on every head."""
    assert_valid(mask_func, sk)
    dense = fm.to_dense(mask_func, seqlen_k=sk)
    for h in range(dense.shape[0]):
        diff = (dense[h] != expected).nonzero()
        assert diff.numel() == 0, f"head {h}: first mismatch at (row, key) {diff[0].tolist()}"
    assert fm.visible_pairs(mask_func) == int(expected.sum()) * mask_func.shape[0]


def runs(row):
    """Minimal odd endpoint count of one dense row, counted by hand."""
    state, toggles = True, 0
    for x in list(row) + [False]:
        if bool(x) != state:
            toggles += 1
            state = bool(x)
    return toggles


SHAPES = [(7, 7), (5, 9), (9, 5), (1, 4), (4, 1), (6, 0)]


# ---------------------------------------------------------------------------
# Dense-shape builders
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("sq,sk", SHAPES)
@pytest.mark.parametrize("bottom_right", [False, True])
def test_causal(sq, sk, bottom_right):
    off = sk - sq if bottom_right else 0
    m = fm.causal(sq, sk, bottom_right=bottom_right, batch=2, heads=3)
    assert m.shape == (3, 1, 2 * sq)
    expected = brute(sq, sk, lambda q, k: k <= q + off)
    assert_mask(m, torch.cat([expected, expected]), sk)


@pytest.mark.parametrize("sq,sk", SHAPES)
@pytest.mark.parametrize("before,after", [(None, 0), (2, 0), (0, 0), (1, 2), (3, None), (None, None), (20, 1)])
@pytest.mark.parametrize("bottom_right", [False, True])
def test_sliding_window(sq, sk, before, after, bottom_right):
    off = sk - sq if bottom_right else 0

    def pred(q, k):
        p = q + off
        return (before is None or k >= p - before) and (after is None or k <= p + after)

    m = fm.sliding_window(sq, sk, before=before, after=after, bottom_right=bottom_right)
    assert m.shape[1] == 3
    assert_mask(m, brute(sq, sk, pred), sk)


@pytest.mark.parametrize("sq,sk", SHAPES + [(20, 20), (12, 30)])
@pytest.mark.parametrize("sink,window", [(4, 5), (0, 3), (2, 0), (10, 2), (1, 100)])
@pytest.mark.parametrize("bottom_right", [False, True])
def test_sink_window(sq, sk, sink, window, bottom_right):
    off = sk - sq if bottom_right else 0
    m = fm.sink_window(sq, sk, sink=sink, window=window, bottom_right=bottom_right)
    expected = brute(sq, sk, lambda q, k: k <= q + off and (k < sink or k >= q + off - window))
    assert_mask(m, expected, sk)


def test_prefix_lm():
    m = fm.prefix_lm(8, [0, 3, 8], heads=2)
    assert m.shape == (2, 1, 24)
    expected = torch.cat([brute(8, 8, lambda q, k, p=p: k < p or k <= q) for p in (0, 3, 8)])
    assert_mask(m, expected, 8)
    with pytest.raises(ValueError, match="exceeds"):
        fm.prefix_lm(4, 5)


# ---------------------------------------------------------------------------
# Structured builders
# ---------------------------------------------------------------------------


def doc_of(lengths):
    return [i for i, n in enumerate(lengths) for _ in range(n)]


@pytest.mark.parametrize("lengths", [[5], [2, 3, 4], [1, 1, 1], [0, 3, 0, 2], [6, 1]])
@pytest.mark.parametrize("is_causal", [True, False])
def test_document(lengths, is_causal):
    d = doc_of(lengths)
    s = len(d)
    expected = brute(s, s, lambda q, k: d[q] == d[k] and (k <= q or not is_causal))
    assert_mask(fm.document_causal(lengths, causal=is_causal), expected, s)


def test_document_batch_per_sample():
    per = [[2, 3], [5], [1, 4]]
    m = fm.document_causal(per)
    assert m.shape == (1, 3, 15)
    expected = torch.cat([brute(5, 5, lambda q, k, d=doc_of(l): d[q] == d[k] and k <= q) for l in per])
    assert_mask(m, expected, 5)
    with pytest.raises(ValueError, match="sum to"):
        fm.document_causal([[2, 3], [4]])


def tree_brute(parent, lengths):
    node = doc_of(lengths)
    s = len(node)

    def ancestors(n):
        out = set()
        while parent[n] != -1:
            n = parent[n]
            out.add(n)
        return out

    anc = [ancestors(n) for n in range(len(parent))]
    return brute(s, s, lambda q, k: node[k] in anc[node[q]] or (node[k] == node[q] and k <= q))


@pytest.mark.parametrize("parent,lengths", [
    ([-1], [5]),
    ([-1, 0, 0], [1, 1, 1]),
    ([-1, 0, 1, 0], [2, 1, 3, 2]),
    ([1, -1, 1], [2, 2, 2]),            # parent laid out after its child
    ([-1, -1, 0, 1], [2, 1, 2, 3]),     # forest
    ([-1, 0, 0, 1], [0, 2, 0, 3]),      # empty nodes
    ([2, 2, -1], [1, 2, 3]),            # root last: leftmost span does not start at 0
])
def test_tree_examples(parent, lengths):
    assert_mask(fm.tree(parent, lengths, heads=2), tree_brute(parent, lengths), sum(lengths))


@settings(max_examples=40, deadline=None)
@given(st.data())
def test_tree_random(data):
    n = data.draw(st.integers(1, 9))
    # Random parents on a random permutation, so parents may come after children.
    perm = data.draw(st.permutations(list(range(n))))
    parent = [-1] * n
    for i in range(1, n):
        if data.draw(st.booleans()) or i == 1:
            parent[perm[i]] = perm[data.draw(st.integers(0, i - 1))]
    lengths = data.draw(st.lists(st.integers(0, 4), min_size=n, max_size=n))
    if sum(lengths) == 0:  # no query rows: a mask of nothing is rejected (module docstring)
        with pytest.raises(ValueError, match="node_lengths must sum to a sequence length >= 1"):
            fm.tree(parent, lengths)
        return
    m = fm.tree(parent, lengths)
    depth = 0
    for i in range(n):
        d, j = 0, i
        while parent[j] != -1:
            j, d = parent[j], d + 1
        depth = max(depth, d)
    assert m.shape[1] <= 2 * (depth + 1) + 1
    assert_mask(m, tree_brute(parent, lengths), sum(lengths))


def test_tree_errors():
    with pytest.raises(ValueError, match="cycle"):
        fm.tree([1, 0], [1, 1])
    with pytest.raises(ValueError, match="parent"):
        fm.tree([-1, 5], [1, 1])
    with pytest.raises(ValueError, match="equal length"):
        fm.tree([-1, 0], [1])
    with pytest.raises(ValueError, match="non-negative"):
        fm.tree([-1, 0], [1, -1])


@pytest.mark.parametrize("order", ["dfs", "bfs"])
def test_binary_tree_layout(order):
    s = 32768
    parent, lengths = fm.binary_tree_layout(s, depth=7, order=order, jitter=0.2, seed=3)
    assert len(parent) == 127 and sum(lengths) == s
    assert parent[0] == -1 and all(p != -1 for p in parent[1:])
    assert all(parent[i] < i for i in range(1, 127)), "parents precede children in both orders"
    children = [[] for _ in range(127)]
    for i, p in enumerate(parent[1:], 1):
        children[p].append(i)
    assert sorted(len(c) for c in children) == [0] * 64 + [2] * 63
    if order == "dfs":
        for i, c in enumerate(children):
            if c:
                assert c[0] == i + 1, "preorder: the first child follows its parent"
    else:
        for i, c in enumerate(children):
            if c:
                assert c == [2 * i + 1, 2 * i + 2]
    mean = s / 127
    assert all(0.8 * mean - 2 <= n <= 1.2 * mean + 2 for n in lengths)
    assert fm.binary_tree_layout(s, order=order, seed=3) == (parent, lengths)  # deterministic
    assert fm.binary_tree_layout(s, order=order, seed=4)[1] != lengths


@pytest.mark.parametrize("order", ["dfs", "bfs"])
def test_binary_tree_small(order):
    parent, lengths = fm.binary_tree_layout(300, depth=4, order=order, seed=1)
    m = fm.binary_tree(300, depth=4, order=order, seed=1)
    assert m.shape == (1, 7, 300)
    assert_mask(m, tree_brute(parent, lengths), 300)


@pytest.mark.parametrize("s,radius,globals_", [(20, 2, [3, 10]), (16, 0, [0, 15]), (9, 3, []), (12, 1, [5, 6, 7])])
def test_longformer(s, radius, globals_):
    g = set(globals_)
    m = fm.longformer(s, radius=radius, global_tokens=globals_, batch=2)
    assert m.shape == (1, 2 * len(globals_) + 3, 2 * s)
    expected = brute(s, s, lambda q, k: abs(q - k) <= radius or k in g or q in g)
    assert_mask(m, torch.cat([expected, expected]), s)


def test_longformer_default_globals():
    m = fm.longformer(64, radius=2)
    g = {int((i + 0.5) * 64 / 8) for i in range(8)}
    assert g == {4, 12, 20, 28, 36, 44, 52, 60}
    assert_mask(m, brute(64, 64, lambda q, k: abs(q - k) <= 2 or k in g or q in g), 64)


@pytest.mark.parametrize("lengths", [[8], [5, 6], [1, 2, 3], [4, 0, 7]])
@pytest.mark.parametrize("fraction", [0.5, 0.0, 1.0, 0.3])
def test_hstu(lengths, fraction):
    d = doc_of(lengths)
    starts = [sum(lengths[:i]) for i in range(len(lengths))]
    ctx_end = [starts[i] + int(lengths[i] * fraction) for i in range(len(lengths))]

    def pred(q, k):
        if d[q] != d[k]:
            return False
        if q < ctx_end[d[q]]:
            return k <= q
        return k < ctx_end[d[q]] or k == q

    m = fm.hstu(lengths, context_fraction=fraction)
    assert m.shape[1] == 5
    assert_mask(m, brute(len(d), len(d), pred), len(d))


def test_random_document_lengths():
    a = fm.random_document_lengths(100000, 4096, 16384, seed=5)
    assert sum(a) == 100000
    assert all(4096 <= n <= 16384 for n in a[:-1]) and 1 <= a[-1] <= 16384
    assert a == fm.random_document_lengths(100000, 4096, 16384, seed=5)
    with pytest.raises(ValueError):
        fm.random_document_lengths(10, 5, 4)


# ---------------------------------------------------------------------------
# Benchmark masks
# ---------------------------------------------------------------------------

# BENCHMARK.md's densities at S=32768. The document lengths of document_causal and hstu
# are a random draw, so those two get a wider tolerance (their seed-to-seed spread at
# S=32768 is about +-0.06); the other six are deterministic up to the tree jitter.
DENSITY = {
    "causal": (0.50, 0.005), "document_causal": (0.19, 0.06), "local": (0.016, 0.001),
    "sink_local": (0.016, 0.001), "tree_dfs": (0.043, 0.003), "tree_bfs": (0.043, 0.003),
    "longformer": (0.016, 0.001), "hstu": (0.13, 0.04),
}


@pytest.mark.parametrize("name", fm.BENCHMARK_MASKS)
def test_benchmark_density_32k(name):
    m = fm.benchmark_mask(name, 32768)
    assert_valid(m, 32768, fm.BENCHMARK_NFUNC[name])
    assert m.shape == (1, fm.BENCHMARK_NFUNC[name], 32768)
    target, tol = DENSITY[name]
    assert abs(fm.density(m, 32768) - target) <= tol, fm.density(m, 32768)


@pytest.mark.parametrize("name", ["document_causal", "hstu"])
def test_benchmark_density_mean_over_seeds(name):
    """The generator, not one lucky seed, is near BENCHMARK.md's figure (itself one draw of
    an unknown generator): mean over 12 seeds (document_causal ~0.15, hstu ~0.13)."""
    target, tol = DENSITY[name]
    mean = sum(fm.density(fm.benchmark_mask(name, 32768, seed=s), 32768) for s in range(12)) / 12
    assert abs(mean - target) <= tol, mean


@pytest.mark.parametrize("name", fm.BENCHMARK_MASKS)
def test_benchmark_mask_128k_is_valid(name):
    """Every benchmark mask builds at the benchmark's length and obeys the endpoint rules
    (build speed is the benchmark's business, not a test's)."""
    m = fm.benchmark_mask(name, 131072)
    assert m.shape == (1, fm.BENCHMARK_NFUNC[name], 131072)
    assert_valid(m, 131072)


def test_benchmark_definitions_small():
    """benchmark_mask at S >= 32768 is exactly BENCHMARK.md's formula (checked on a
    row sample), and at small S the scaled version of it (checked densely)."""
    s = 32768
    rows = torch.tensor(sorted(random.Random(0).sample(range(s), 64)) + [0, 1, 3, 4, 511, 512, 513, s - 1])
    keys = torch.arange(s)
    q = rows.view(-1, 1)
    defs = {
        "causal": keys <= q,
        "local": (keys >= q - 512) & (keys <= q),
        "sink_local": (keys <= q) & ((keys < 4) | (keys >= q - 512)),
    }
    g = torch.tensor([int((i + 0.5) * s / 8) for i in range(8)])
    is_g = (q.view(-1, 1) == g.view(1, -1)).any(1, keepdim=True)
    defs["longformer"] = ((keys - q).abs() <= 256) | (keys.view(1, -1, 1) == g.view(1, 1, -1)).any(-1) | is_g
    for name, expected in defs.items():
        dense = fm.to_dense(fm.benchmark_mask(name, s)[:, :, rows], seqlen_k=s)[0]
        assert torch.equal(dense, expected), name
    # Small S: the scaled definitions (window 512 -> 8 at S=512, radius 256 -> 4).
    s = 512
    g = {int((i + 0.5) * s / 8) for i in range(8)}
    small = {
        "causal": lambda q, k: k <= q,
        "local": lambda q, k: q - 8 <= k <= q,
        "sink_local": lambda q, k: k <= q and (k < 4 or k >= q - 8),
        "longformer": lambda q, k: abs(q - k) <= 4 or k in g or q in g,
    }
    for name, pred in small.items():
        assert_mask(fm.benchmark_mask(name, s), brute(s, s, pred), s)


def test_benchmark_document_hstu_structure():
    s = 32768
    lengths = fm.random_document_lengths(s, 4096, 16384, seed=0)
    assert torch.equal(fm.benchmark_mask("document_causal", s), fm.document_causal(lengths))
    lengths = fm.random_document_lengths(s, 8192, 16384, seed=0)
    assert torch.equal(fm.benchmark_mask("hstu", s), fm.hstu(lengths))
    parent, lengths = fm.binary_tree_layout(s, depth=7, order="bfs", seed=0)
    assert torch.equal(fm.benchmark_mask("tree_bfs", s), fm.tree(parent, lengths))


@pytest.mark.parametrize("name", fm.BENCHMARK_MASKS)
@pytest.mark.parametrize("s", [512, 2048])
def test_benchmark_mask_mod_matches_endpoints(name, s):
    """The natural mask_mod (the FlexAttention peer's) is the same mask as the endpoints."""
    mod = fm.benchmark_mask_mod(name, s, seed=2)
    natural = fm.to_dense(fm.from_mask_mod(mod, s), seqlen_k=s)
    assert torch.equal(natural, fm.to_dense(fm.benchmark_mask(name, s, seed=2), seqlen_k=s))
    # Scalar index tensors, as flex_attention calls it.
    q, kv = torch.tensor(s - 1), torch.tensor(0)
    assert bool(mod(torch.tensor(0), torch.tensor(0), q, kv)) == bool(natural[0, s - 1, 0])


def test_benchmark_mask_batch_device_and_errors():
    m = fm.benchmark_mask("local", 64, batch=3, device="cpu")
    assert m.shape == (1, 3, 192)
    assert torch.equal(m[:, :, 64:128], m[:, :, :64])
    with pytest.raises(ValueError, match="unknown benchmark mask"):
        fm.benchmark_mask("nope", 64)
    with pytest.raises(ValueError, match="unknown benchmark mask"):
        fm.benchmark_mask_mod("nope", 64)


# ---------------------------------------------------------------------------
# Conversions
# ---------------------------------------------------------------------------


@settings(max_examples=80, deadline=None)
@given(st.data())
def test_from_dense_roundtrip(data):
    h = data.draw(st.integers(1, 3))
    rows = data.draw(st.integers(1, 12))
    sk = data.draw(st.integers(0, 24))
    p = data.draw(st.floats(0.0, 1.0))
    gen = torch.Generator().manual_seed(data.draw(st.integers(0, 2**31 - 1)))
    dense = torch.rand(h, rows, sk, generator=gen) < p
    m = fm.from_dense(dense)
    assert_valid(m, sk)
    assert m.shape[:1] == (h,) and m.shape[2] == rows
    assert torch.equal(fm.to_dense(m, seqlen_k=sk), dense)
    need = max(runs(dense[i, r].tolist()) for i in range(h) for r in range(rows))
    assert m.shape[1] == need, "nfunc must be the smallest odd count that fits"
    # A wider nfunc pads with the last endpoint; same visible set.
    wide = fm.from_dense(dense, nfunc=need + 4)
    assert wide.shape[1] == need + 4
    assert torch.equal(wide[:, need:], wide[:, need - 1:need].expand(-1, 4, -1))
    assert torch.equal(fm.to_dense(wide, seqlen_k=sk), dense)
    # And compact() undoes the padding.
    assert torch.equal(fm.compact(wide), m)


def test_from_dense_too_small_names_row():
    dense = torch.zeros(2, 6, 10, dtype=torch.bool)
    dense[:, :, :3] = True
    dense[1, 4, 5] = True  # head 1, row 4 = batch 1, query 1 when Sq = 3
    assert fm.from_dense(dense).shape[1] == 3
    with pytest.raises(ValueError, match=r"head 1, batch 1, query 1 \(row 4\) needs 3 endpoints.*nfunc=1"):
        fm.from_dense(dense, nfunc=1, seqlen_q=3)
    with pytest.raises(ValueError, match="odd"):
        fm.from_dense(dense, nfunc=4)
    with pytest.raises(ValueError, match=r"\[rows, Sk\]"):
        fm.from_dense(torch.zeros(2, 2, 2, 2, dtype=torch.bool))
    with pytest.raises(TypeError):
        fm.from_dense([[True]])


def test_from_dense_empty_and_full_rows():
    dense = torch.tensor([[False] * 5, [True] * 5, [False, True, False, True, False]])
    m = fm.from_dense(dense)
    assert m[0, :, 0].tolist() == [0, 0, 0, 0, 0]
    assert m[0, :, 1].tolist() == [5, 5, 5, 5, 5]
    assert m[0, :, 2].tolist() == [0, 1, 2, 3, 4]


def test_from_mask_mod_natural_masks():
    assert torch.equal(fm.from_mask_mod(lambda b, h, q, kv: q >= kv, 9), fm.causal(9))
    # Chunking (one row at a time) gives the same result.
    assert torch.equal(fm.from_mask_mod(lambda b, h, q, kv: q >= kv, 9, chunk_elements=1), fm.causal(9))
    sw = fm.from_mask_mod(lambda b, h, q, kv: (kv <= q) & (kv >= q - 2), 7, 7, nfunc=3)
    assert sw.shape[1] == 3  # canonical endpoints: same visible set, not the same numbers
    assert torch.equal(fm.to_dense(sw, seqlen_k=7), fm.to_dense(fm.sliding_window(7, before=2), seqlen_k=7))
    br = fm.from_mask_mod(lambda b, h, q, kv: kv <= q + 4, 3, 7)
    assert torch.equal(br, fm.causal(3, 7, bottom_right=True))


def test_from_mask_mod_batch_and_heads():
    def mod(b, h, q, kv):
        return (kv <= q + b) & (kv != h)

    sq, sk, batch, heads = 5, 8, 2, 3
    m = fm.from_mask_mod(mod, sq, sk, batch=batch, heads=heads, chunk_elements=16)
    assert m.shape[0] == heads and m.shape[2] == batch * sq
    for h in range(heads):
        expected = torch.cat([brute(sq, sk, lambda q, k, b=b: k <= q + b and k != h) for b in range(batch)])
        assert torch.equal(fm.to_dense(m, seqlen_k=sk)[h], expected)


def test_from_mask_mod_errors():
    with pytest.raises(ValueError, match=r"mask_mod: head 0, batch 1, query 2 \(row 6\) needs .* nfunc=3"):
        fm.from_mask_mod(lambda b, h, q, kv: (kv % 2 == 0) | (b == 0) | (q != 2), 4, 8, nfunc=3, batch=2)
    with pytest.raises(ValueError, match="odd"):
        fm.from_mask_mod(lambda b, h, q, kv: q >= kv, 4, nfunc=2)
    with pytest.raises(ValueError):
        fm.from_mask_mod(lambda b, h, q, kv: q >= kv, -1)


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_compact_random_endpoints(data):
    sk = data.draw(st.integers(0, 12))
    n = data.draw(st.sampled_from([1, 3, 5, 7]))
    rows = data.draw(st.integers(1, 6))
    vals = [sorted(data.draw(st.lists(st.integers(0, sk), min_size=n, max_size=n))) for _ in range(rows)]
    m = torch.tensor(vals, dtype=torch.int32).t().unsqueeze(0).contiguous()
    c = fm.compact(m)
    assert_valid(c, sk)
    assert c.shape[1] <= n
    dense = fm.to_dense(m, seqlen_k=sk)
    assert torch.equal(fm.to_dense(c, seqlen_k=sk), dense)
    assert torch.equal(c, fm.from_dense(dense))
    assert fm.visible_pairs(m) == int(dense.sum()) == fm.visible_pairs(c)


def test_compact_and_pad_errors():
    with pytest.raises(ValueError, match="nondecreasing"):
        fm.compact(torch.tensor([[[3], [1], [4]]], dtype=torch.int32))
    with pytest.raises(ValueError, match="odd"):
        fm.pad_nfunc(fm.causal(4), 2)
    with pytest.raises(ValueError, match="needs 5 endpoints"):
        fm.pad_nfunc(fm.from_dense(torch.tensor([[True, False, True, False, True]])), 3)
    with pytest.raises(ValueError, match="odd"):
        fm.to_dense(torch.zeros(1, 2, 3, dtype=torch.int32))
    with pytest.raises(TypeError, match="integer"):
        fm.visible_pairs(torch.zeros(1, 1, 3))
    with pytest.raises(TypeError, match="int"):
        fm.causal(4.0)
    with pytest.raises(ValueError, match=">= 0"):
        fm.sliding_window(4, before=-1)


def test_visible_pairs_and_density():
    m = fm.causal(6, heads=2)
    assert fm.visible_pairs(m) == 42
    assert fm.visible_pairs(m, per_head=True).tolist() == [21, 21]
    assert fm.density(m, 6) == pytest.approx(21 / 36)
    # No int32 overflow at long sequences: causal at S=131072 has ~8.6e9 pairs.
    assert fm.visible_pairs(fm.causal(131072)) == 131072 * 131073 // 2


def test_to_dense_batched_shape():
    m = fm.causal(4, batch=3)
    d = fm.to_dense(m, 4, 4)
    assert d.shape == (1, 3, 4, 4)
    with pytest.raises(ValueError, match="multiple"):
        fm.to_dense(m, 5, 4)


# ---------------------------------------------------------------------------
# Argument rules (module docstring, "Argument rules")
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.uint8, torch.float32])
def test_from_dense_requires_bool(dtype):
    """An int/float mask is ambiguous (0/1 visibility or an additive bias); it must not be cast silently."""
    with pytest.raises(TypeError, match=r"mask must be a bool tensor .*" + str(dtype)):
        fm.from_dense(torch.tensor([[1, 0, 1]], dtype=dtype))
    assert fm.from_dense(torch.tensor([[1, 0, 1]], dtype=dtype) != 0).tolist() == [[[1], [2], [3]]]


# (builder call, builder and argument the error must name): a mask without query rows is rejected.
_NO_ROWS = [
    (lambda n: fm.causal(n), "causal", "seqlen_q"),
    (lambda n: fm.causal(n, 4), "causal", "seqlen_q"),
    (lambda n: fm.sliding_window(n, before=2), "sliding_window", "seqlen_q"),
    (lambda n: fm.sink_window(n, sink=1, window=2), "sink_window", "seqlen_q"),
    (lambda n: fm.prefix_lm(n, 0), "prefix_lm", "seqlen"),
    (lambda n: fm.longformer(n, radius=1, num_global=0), "longformer", "seqlen"),
    (lambda n: fm.binary_tree(n, depth=2), "binary_tree", "seqlen"),
    (lambda n: fm.binary_tree_layout(n, depth=2), "binary_tree_layout", "seqlen"),
    (lambda n: fm.random_document_lengths(n, 1, 2), "random_document_lengths", "total"),
    (lambda n: fm.from_mask_mod(lambda b, h, q, kv: kv <= q, n), "from_mask_mod", "seqlen_q"),
    (lambda n: fm.benchmark_mask("causal", n), "benchmark_mask", "seqlen"),
]


@pytest.mark.parametrize("n", [0, -3])
@pytest.mark.parametrize("build,name,arg", _NO_ROWS)
def test_builders_reject_empty_or_negative_query_length(build, name, arg, n):
    # The message names the builder first (masks._name_errors), then the argument and the rule.
    with pytest.raises(ValueError, match=rf"^masks\.{name}: {arg} must be >= 1, got {n}$"):
        build(n)


def test_builder_errors_keep_their_type_and_name_the_call():
    """A builder calling another (binary_tree -> binary_tree_layout) is named once, as the call the user made; wrong
    types stay TypeErrors; the signature seen by help() is the builder's."""
    with pytest.raises(TypeError, match=r"^masks\.sliding_window: before must be an int, got float 1\.5$"):
        fm.sliding_window(8, before=1.5)
    with pytest.raises(ValueError, match=r"^masks\.binary_tree: (?!masks)"):
        fm.binary_tree(64, depth=2, order="xyz")
    with pytest.raises(ValueError, match=r"^masks\.benchmark_mask: (?!masks)"):
        fm.benchmark_mask("tree_dfs", 0)
    import inspect
    assert list(inspect.signature(fm.causal).parameters)[:2] == ["seqlen_q", "seqlen_k"]


@pytest.mark.parametrize("build", [
    lambda: fm.document_causal([0, 0]),
    lambda: fm.document_causal([]),
    lambda: fm.hstu([0]),
    lambda: fm.tree([-1, 0], [0, 0]),
])
def test_structured_builders_reject_no_rows(build):
    with pytest.raises(ValueError, match=r"(document_lengths|node_lengths)"):
        build()


def test_zero_sizes_that_mean_something_are_accepted():
    """Sk = 0 (rows see nothing), zero windows/sinks/prefix/globals and empty documents are meaningful."""
    assert fm.causal(3, 0).tolist() == [[[0, 0, 0]]]
    assert fm.to_dense(fm.sliding_window(4, before=0), seqlen_k=4)[0].equal(torch.eye(4, dtype=torch.bool))
    assert fm.sink_window(3, sink=0, window=0).shape == (1, 3, 3)
    assert fm.prefix_lm(3, 0).tolist() == fm.causal(3).tolist()
    assert fm.longformer(4, radius=0, num_global=0).shape[2] == 4
    assert fm.document_causal([0, 2, 0, 1]).shape == (1, 3, 3)
    assert fm.tree([-1, 0], [0, 2]).shape[2] == 2


@pytest.mark.parametrize("build,arg", [
    (lambda: fm.causal(4.0), "seqlen_q"),
    (lambda: fm.causal(True), "seqlen_q"),
    (lambda: fm.causal(4, 2.5), "seqlen_k"),
    (lambda: fm.sliding_window(4, before=1.5), "before"),
    (lambda: fm.sink_window(4, sink=1.0), "sink"),
    (lambda: fm.document_causal([2.5, 1.5]), r"document_lengths\[0\]"),
    (lambda: fm.document_causal(torch.tensor([2.0, 2.0])), "document_lengths"),
    (lambda: fm.hstu([[2, 2.5]]), r"document_lengths\[0\]\[1\]"),
    (lambda: fm.tree([-1, 0], [1, 1.5]), r"node_lengths\[1\]"),
    (lambda: fm.tree([-1, 0.0], [1, 1]), r"parent\[1\]"),
])
def test_non_integer_lengths_raise_type_error(build, arg):
    """Floats used to be truncated silently by torch.as_tensor(..., dtype=int64)."""
    with pytest.raises(TypeError, match=arg):
        build()
