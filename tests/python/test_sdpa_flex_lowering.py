"""SDPA lowered onto the flex engine (python/flashspan/sdpa_lowering.py), the path CUDA tensors take.

FLASHSPAN_SDPA_ROUTE=flex forces the lowering on CPU tensors, where the flex calls run flex's CPU backend, so the
very code that runs on CUDA is checked here without a GPU: against the independent float64 oracle (sdpa_ref.py,
through test_sdpa_cpu._run) and against the SDPA CPU reference (the default route) on random configurations of the
pure-mask subset, with every output and gradient the library allocates NaN-poisoned first. The GPU tests at the end
run the same comparisons on CUDA tensors (skipped without a GPU).
"""

import math
import random

import pytest
import torch

import sdpa_ref
from conftest import cuda_ready
from sdpa_cases import _poison_padding, assert_close, random_problem, valid_rows
from test_sdpa_cpu import _run

NUM_RANDOM = 160
LOWP = (torch.float32, torch.bfloat16, torch.float16)

pytestmark = pytest.mark.usefixtures("poison_uninitialized")


@pytest.fixture
def flex_route(monkeypatch):
    from flashspan import sdpa_lowering

    monkeypatch.setenv(sdpa_lowering.ROUTE_ENV, "flex")
    yield sdpa_lowering
    sdpa_lowering.clear_plan_cache()


def mask_problem(seed: int, dtype=None, big=False):
    """random_problem restricted to the pure-mask subset (H_k = H_v, no score modifier, dropout or block mask) in a
    flex dtype; packed V moved to K's token offsets (flex has one key layout)."""
    rng = random.Random(seed)
    dtype = dtype or rng.choice(LOWP)
    for attempt in range(100):
        p = random_problem(seed * 101 + attempt, dtype=dtype, allow_dropout=False, big=big)
        if p.case.v.shape[1] == p.case.k.shape[1]:
            break
    c = p.case
    c.bias, c.alibi, c.softcap, c.sinks, c.gate, c.block_mask = None, False, None, None, None, None
    for name in ("bias", "use_alibi_mask", "softcap", "sink_token", "gate", "block_mask"):
        p.args.pop(name, None)
    p.grad_inputs = {}
    ragged = p.args.get("ragged_offsets")
    if ragged is not None:
        ragged.pop("gate", None)
        if "k" in ragged:  # V packed at K's offsets
            v = torch.full((p.k.shape[0], p.v.shape[1], p.v.shape[2]), float("nan"), dtype=dtype)
            for b, n in enumerate(c.len_kv):
                v[p.offsets_kv[b] : p.offsets_kv[b] + n] = c.v[b, :, :n].transpose(0, 1).to(dtype)
            p.v = v
            ragged["v"] = ragged["k"]
        if not ragged:
            p.args.pop("ragged_offsets")
    return p


# ---------------------------------------------------------------------------
# Random configurations: the lowered route against the oracle and the CPU reference
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(NUM_RANDOM))
def test_random_lowered_against_oracle(fs, flex_route, seed):
    _run(fs, mask_problem(seed))


@pytest.mark.parametrize("seed", range(12))
def test_random_lowered_long_sequences(fs, flex_route, seed):
    # S up to 150 / 270: several flex blocks per sample (partial and full blocks of the plan).
    _run(fs, mask_problem(50_000 + seed, big=True))


def _rows(offsets, lens) -> torch.Tensor:
    """Token indices of the samples of a packed tensor."""
    return torch.cat([torch.arange(offsets[b], offsets[b] + n) for b, n in enumerate(lens)] + [torch.arange(0)])


def _both_routes(fs, monkeypatch, p, grads=True, **extra):
    """(o, stats, grads) of the reference route and of the flex route on the same inputs."""
    from flashspan import sdpa_lowering

    results = []
    g = torch.Generator().manual_seed(7)
    for route in ("reference", "flex"):
        monkeypatch.setenv(sdpa_lowering.ROUTE_ENV, route)
        ins = [t.detach().clone().requires_grad_(grads) for t in (p.q, p.k, p.v)]
        o, stats = fs.sdpa(*ins, generate_stats=True, **p.args, **extra)
        gr = None
        if grads:
            if not results:
                do = torch.randn(o.shape, generator=g).to(o.dtype)
            gr = torch.autograd.grad(o, ins, do)
        results.append((o.detach(), stats, gr))
    return results


@pytest.mark.parametrize("seed", range(60))
def test_random_lowered_against_reference(fs, monkeypatch, seed):
    """The lowered route and the SDPA CPU reference agree on every valid element (same inputs, same dtype)."""
    p = mask_problem(10_000 + seed)
    (o1, s1, g1), (o2, s2, g2) = _both_routes(fs, monkeypatch, p)
    lq, lk = p.case.len_q, p.case.len_kv
    if not p.thd_q:
        o1, o2 = valid_rows(o1.double(), lq), valid_rows(o2.double(), lq)
        s1, s2 = valid_rows(s1, lq), valid_rows(s2, lq)
    else:  # packed outputs: compare the tokens of the samples only (gap tokens are not part of the output)
        rows = _rows(p.offsets_q, lq)
        o1, o2, s1, s2 = o1[rows], o2[rows], s1[rows], s2[rows]
    assert_close(o2, o1, p.dtype, "o")
    assert_close(s2, s1, torch.float32, "stats")
    for name, a, b, lens, thd, offs in (("dq", g1[0], g2[0], lq, p.thd_q, p.offsets_q),
                                        ("dk", g1[1], g2[1], lk, p.thd_kv, p.offsets_kv),
                                        ("dv", g1[2], g2[2], lk, p.thd_kv, p.offsets_kv)):
        if thd:
            rows = _rows(offs, lens)
            a, b = a[rows], b[rows]
        else:
            a, b = valid_rows(a.double(), lens), valid_rows(b.double(), lens)
            # padding rows of the gradients are written as 0 on both routes
        assert_close(b, a, p.dtype, name)


# ---------------------------------------------------------------------------
# Focused cases
# ---------------------------------------------------------------------------


def _dense(B, Hq, Hk, Sq, Skv, Dqk, Dv, dtype=torch.bfloat16, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, Hq, Sq, Dqk, generator=g).to(dtype)
    k = torch.randn(B, Hk, Skv, Dqk, generator=g).to(dtype)
    v = torch.randn(B, Hk, Skv, Dv, generator=g).to(dtype)
    return q, k, v


def _oracle(q, k, v, lq=None, lk=None, **case):
    c = sdpa_ref.Case(q=q.double(), k=k.double(), v=v.double(), len_q=lq or [q.shape[2]] * q.shape[0],
                      len_kv=lk or [k.shape[2]] * q.shape[0], **case)
    return c, sdpa_ref.forward(c, c.q, c.k, c.v)


@pytest.mark.parametrize("align", ["TOP_LEFT", "BOTTOM_RIGHT"])
@pytest.mark.parametrize("sq,skv", [(37, 70), (70, 37), (1, 50), (64, 64)])
def test_causal_alignments_sq_ne_skv(fs, flex_route, align, sq, skv):
    q, k, v = _dense(2, 4, 2, sq, skv, 64, 64)
    o, stats = fs.sdpa(q, k, v, attn_scale=0.125, diagonal_band_right_bound=0, diagonal_alignment=align,
                       generate_stats=True)
    _, ref = _oracle(q, k, v, scale=0.125, right=0, bottom_right=align == "BOTTOM_RIGHT")
    assert_close(o, ref["o"], torch.bfloat16, "o")
    assert_close(stats[..., 0], ref["lse"], torch.float32, "stats")  # rows without keys: -inf on both


def test_head_dims_192_128_gqa_mqa(fs, flex_route):
    for hk in (1, 2):  # MQA, GQA
        q, k, v = _dense(1, 4, hk, 33, 40, 192, 128, dtype=torch.float16)
        q, k, v = (t.requires_grad_() for t in (q, k, v))
        o, _ = fs.sdpa(q, k, v, attn_scale=0.07, diagonal_band_left_bound=9, diagonal_band_right_bound=3)
        c, ref = _oracle(q.detach(), k.detach(), v.detach(), scale=0.07, left=9, right=3)
        assert_close(o, ref["o"], torch.float16, "o")
        do = torch.randn_like(o)
        got = torch.autograd.grad(o, (q, k, v), do)
        ins = [t.detach().double().requires_grad_() for t in (q, k, v)]
        want = torch.autograd.grad(sdpa_ref.forward(c, *ins)["o"], ins, do.double())
        for n, a, b in zip(("dq", "dk", "dv"), got, want):
            assert_close(a, b, torch.float16, n)


def test_stats_log2_tensor_scale_max_logit(fs, flex_route):
    q, k, v = _dense(2, 2, 1, 20, 30, 32, 32, dtype=torch.float32)
    ml = torch.full((2,), float("nan"))
    scale = torch.tensor([0.3])
    o, stats = fs.sdpa(q, k, v, attn_scale=scale, generate_stats=True, stats_use_log2=True, max_logit=ml,
                       use_causal_mask_bottom_right=True)
    _, ref = _oracle(q, k, v, scale=0.3, right=0, bottom_right=True)
    assert_close(o, ref["o"], torch.float32, "o")
    assert_close(stats[..., 0], ref["lse"] / math.log(2.0), torch.float32, "stats (log2)")
    assert_close(ml, sdpa_ref.max_logit(ref), torch.float32, "max_logit")


def test_deprecated_setters_and_sliding_window(fs, flex_route):
    q, k, v = _dense(1, 2, 2, 25, 25, 16, 16, dtype=torch.float32)
    for kw, case in ((dict(use_causal_mask=True), dict(right=0)),
                     (dict(use_causal_mask=True, sliding_window_length=4), dict(right=0, left=4)),
                     (dict(use_causal_mask_bottom_right=True, diagonal_band_right_bound=2),
                      dict(right=2, bottom_right=True)),
                     (dict(sliding_window_length=6), dict(left=6))):
        o, _ = fs.sdpa(q, k, v, attn_scale=0.25, **kw)
        _, ref = _oracle(q, k, v, scale=0.25, **case)
        assert_close(o, ref["o"], torch.float32, f"o {kw}")


def test_padding_rows_zero_and_poisoned_inputs_unread(fs, flex_route):
    B, Sq, Skv = 3, 19, 23
    q, k, v = _dense(B, 2, 1, Sq, Skv, 32, 32, dtype=torch.float32)
    lq, lk = [19, 0, 7], [5, 23, 0]
    qp, kp, vp = (_poison_padding(t.double(), n).float() for t, n in ((q, lq), (k, lk), (v, lk)))
    qp, kp, vp = (t.requires_grad_() for t in (qp, kp, vp))
    args = dict(use_padding_mask=True, seq_len_q=torch.tensor(lq, dtype=torch.int32),
                seq_len_kv=torch.tensor(lk, dtype=torch.int64).view(B, 1, 1, 1), diagonal_band_right_bound=0,
                diagonal_alignment="BOTTOM_RIGHT")
    o, stats = fs.sdpa(qp, kp, vp, attn_scale=0.2, generate_stats=True, **args)
    _, ref = _oracle(q, k, v, lq, lk, scale=0.2, right=0, bottom_right=True)
    assert_close(valid_rows(o, lq), valid_rows(ref["o"], lq), torch.float32, "o")
    for b, n in enumerate(lq):
        assert torch.all(o[b, :, n:] == 0) and torch.all(stats[b, :, n:] == -math.inf)
    do = torch.randn_like(o)
    for b, n in enumerate(lq):
        do[b, :, n:] = float("nan")  # padding rows of dO are never read
    dq, dk, dv = torch.autograd.grad(o, (qp, kp, vp), do)
    for t, lens in ((dq, lq), (dk, lk), (dv, lk)):
        assert not torch.isnan(t).any()
        for b, n in enumerate(lens):
            assert torch.all(t[b, :, n:] == 0)


def test_thd_zero_length_samples_and_dense_kv(fs, flex_route):
    """Packed q with empty samples against dense, padded K/V (flex THD with a reshaped dense side)."""
    lq, lk = [0, 5, 9, 0], [3, 0, 12, 7]
    B, H, D, Skv = 4, 2, 16, 12
    g = torch.Generator().manual_seed(3)
    qd = torch.randn(B, H, max(lq), D, generator=g)
    k = torch.randn(B, H, Skv, D, generator=g)
    v = torch.randn(B, H, Skv, D, generator=g)
    cu = [0]
    for n in lq:
        cu.append(cu[-1] + n)
    qp = torch.cat([qd[b, :, :n].transpose(0, 1) for b, n in enumerate(lq)])
    o, stats = fs.sdpa(qp, _poison_padding(k.double(), lk).float(), _poison_padding(v.double(), lk).float(),
                       attn_scale=0.3, use_padding_mask=True, cu_seq_len_q=torch.tensor(cu, dtype=torch.int32),
                       seq_len_kv=torch.tensor(lk), max_seq_len_q=max(lq), diagonal_band_right_bound=1,
                       generate_stats=True)
    _, ref = _oracle(qd, k, v, lq, lk, scale=0.3, right=1)
    for b, n in enumerate(lq):
        assert_close(o[cu[b] : cu[b] + n].transpose(0, 1), ref["o"][b, :, :n], torch.float32, f"o[{b}]")
        assert_close(stats[cu[b] : cu[b] + n, :, 0].transpose(0, 1), ref["lse"][b, :, :n], torch.float32, "stats")


def test_sdpa_backward_explicit_and_deterministic(fs, flex_route):
    q, k, v = _dense(2, 4, 2, 30, 41, 32, 32, dtype=torch.bfloat16)
    kw = dict(attn_scale=0.15, diagonal_band_right_bound=0, diagonal_band_left_bound=12,
              diagonal_alignment="BOTTOM_RIGHT")
    o, stats = fs.sdpa(q, k, v, generate_stats=True, **kw)
    do = torch.randn_like(o)
    first = fs.sdpa_backward(q, k, v, o, do, stats, use_deterministic_algorithm=True, **kw)
    second = fs.sdpa_backward(q, k, v, o, do, stats, use_deterministic_algorithm=True, **kw)
    for a, b in zip(first, second):
        assert torch.equal(a, b)
    c, _ = _oracle(q, k, v, scale=0.15, right=0, left=12, bottom_right=True)
    ins = [t.double().requires_grad_() for t in (q, k, v)]
    want = torch.autograd.grad(sdpa_ref.forward(c, *ins)["o"], ins, do.double())
    for n, a, b in zip(("dq", "dk", "dv"), first, want):
        assert_close(a, b, torch.bfloat16, n)


def test_custom_ops_take_the_lowering(fs, flex_route):
    """torch.ops.flashspan.sdpa_fwd / sdpa_bwd (sdpa_torch) run the same lowering, dense and THD."""
    q, k, v = _dense(2, 2, 2, 16, 16, 32, 32, dtype=torch.float16)
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    o, lse = fs.sdpa_torch(q, k, v, is_causal=True, window_left=5, return_lse=True)
    _, ref = _oracle(q.detach(), k.detach(), v.detach(), scale=1 / math.sqrt(32), right=0, left=5)
    assert_close(o, ref["o"], torch.float16, "o")
    o.float().sum().backward()
    assert all(t.grad is not None and torch.isfinite(t.grad).all() for t in (q, k, v))
    cu = torch.tensor([0, 7, 16], dtype=torch.int32)
    qt = torch.randn(16, 2, 32).half()
    ot = fs.sdpa_torch(qt, qt, qt, is_causal=True, cu_seqlens_q=cu, cu_seqlens_kv=cu, max_seqlen_q=9,
                       max_seqlen_kv=9)
    for b, (s, e) in enumerate(((0, 7), (7, 16))):
        x = qt[s:e].transpose(0, 1).unsqueeze(0)
        _, r = _oracle(x, x, x, scale=1 / math.sqrt(32), right=0)
        assert_close(ot[s:e].transpose(0, 1).unsqueeze(0), r["o"], torch.float16, f"thd o[{b}]")


@pytest.mark.no_poison
@pytest.mark.parametrize("varlen", [False, True])
def test_compiled_custom_ops_take_the_lowering(fs, flex_route, monkeypatch, varlen):
    """torch.compile(fullgraph=True) over sdpa_torch: forward and backward through the lowering equal eager on the
    reference route."""
    torch._dynamo.reset()
    g = torch.Generator().manual_seed(5)
    if varlen:
        cu = torch.tensor([0, 6, 6, 17], dtype=torch.int32)
        q, k, v = (torch.randn(17, 2, 16, generator=g).half() for _ in range(3))
        kw = dict(is_causal=True, cu_seqlens_q=cu, cu_seqlens_kv=cu, max_seqlen_q=11, max_seqlen_kv=11)
    else:
        q, k, v = (torch.randn(2, 2, 13, 16, generator=g).half() for _ in range(3))
        kw = dict(is_causal=True, window_left=4, causal_bottom_right=True)

    def f(q, k, v):
        o, lse = fs.sdpa_torch(q, k, v, return_lse=True, **kw)
        return o.float() * 2, lse

    def run(fn):
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        o, lse = fn(*leaves)
        loss = o.sum() + lse.masked_fill(torch.isinf(lse), 0).sum()
        return (o.detach(), lse.detach()) + torch.autograd.grad(loss, leaves)

    got = run(torch.compile(f, backend="aot_eager", fullgraph=True))
    flex_route.clear_plan_cache()
    monkeypatch.setenv(flex_route.ROUTE_ENV, "reference")
    want = run(f)
    for name, a, b in zip(("o", "lse", "dq", "dk", "dv"), got, want):
        assert_close(a, b, torch.float16 if name != "lse" else torch.float32, name)


def test_plan_cache_reuse_and_invalidation(fs, flex_route):
    q, k, v = _dense(2, 2, 2, 24, 24, 16, 16, dtype=torch.float32)
    lq = torch.tensor([24, 10])
    lk = torch.tensor([20, 24])
    kw = dict(use_padding_mask=True, seq_len_q=lq, seq_len_kv=lk, diagonal_band_right_bound=0)
    flex_route.clear_plan_cache()
    o1, _ = fs.sdpa(q, k, v, **kw)
    o2, _ = fs.sdpa(q, k, v, **kw)
    assert flex_route.plan_cache_size() == 1
    assert torch.equal(o1, o2)
    lk[0] = 3  # in place: the cached plan must not be reused (its entry is replaced)
    o3, _ = fs.sdpa(q, k, v, **kw)
    assert flex_route.plan_cache_size() == 1
    _, ref = _oracle(q, k, v, [24, 10], [3, 24], right=0)
    assert_close(valid_rows(o3, [24, 10]), valid_rows(ref["o"], [24, 10]), torch.float32, "o after lk changed")
    fs.sdpa(q, k, v, **dict(kw, diagonal_band_right_bound=1))  # other mask parameters: another plan
    assert flex_route.plan_cache_size() == 2


@pytest.mark.parametrize("bound", [2**31, 2**62, 2**63 - 1])
def test_huge_band_bounds_mask_nothing(fs, flex_route, bound):
    """Bounds past every length (up to INT64_MAX) behave as no bound: no int64 overflow in the endpoints."""
    q, k, v = _dense(2, 2, 2, 9, 13, 16, 16, dtype=torch.float32)
    want, _ = fs.sdpa(q, k, v, attn_scale=0.3)
    for kw in (dict(diagonal_band_left_bound=bound), dict(diagonal_band_right_bound=bound),
               dict(diagonal_band_left_bound=bound, diagonal_band_right_bound=bound, diagonal_alignment="BOTTOM_RIGHT")):
        got, _ = fs.sdpa(q, k, v, attn_scale=0.3, **kw)
        assert_close(got, want, torch.float32, f"o {kw}")


@pytest.mark.parametrize("thd", [False, True])
def test_length_values_rejected_like_the_reference(fs, monkeypatch, thd):
    """Out-of-range lengths: the lowering (host-readable lengths) raises the CPU reference's ValueError message."""
    from flashspan import sdpa_lowering

    q, k, v = _dense(2, 2, 2, 8, 8, 16, 16, dtype=torch.float32)
    if thd:
        q, k, v = (t.transpose(1, 2).reshape(16, 2, 16) for t in (q, k, v))
    cases = [dict(cu_seq_len_q=torch.tensor([0, 5, 3]), cu_seq_len_kv=torch.tensor([0, 8, 16])),
             dict(cu_seq_len_q=torch.tensor([1, 5, 9]), cu_seq_len_kv=torch.tensor([0, 8, 16]))]
    if not thd:
        cases += [dict(seq_len_q=torch.tensor([9, 1]), seq_len_kv=torch.tensor([8, 8])),
                  dict(seq_len_q=torch.tensor([2, 1]), seq_len_kv=torch.tensor([8, -1])),
                  dict(cu_seq_len_q=torch.tensor([0, 9, 10]), seq_len_kv=torch.tensor([8, 8]))]
    else:
        for c in cases:
            c.update(max_seq_len_q=8, max_seq_len_kv=8)
    for kw in cases:
        messages = []
        for route in ("reference", "flex"):
            monkeypatch.setenv(sdpa_lowering.ROUTE_ENV, route)
            with pytest.raises(ValueError) as e:
                fs.sdpa(q, k, v, use_padding_mask=True, **kw)
            messages.append(str(e.value))
        assert messages[0] == messages[1], kw


# ---------------------------------------------------------------------------
# What the lowering does not express: named errors (and bad input keeps its ValueError)
# ---------------------------------------------------------------------------

UNSUPPORTED = {
    "bias": lambda q: dict(bias=torch.zeros(1, 1, q.shape[2], q.shape[2], dtype=q.dtype)),
    "use_alibi_mask": lambda q: dict(use_alibi_mask=True, diagonal_band_right_bound=0),
    "softcap": lambda q: dict(softcap=5.0),
    "sink_token": lambda q: dict(sink_token=torch.zeros(q.shape[1])),
    "dropout": lambda q: dict(dropout=(0.1, torch.tensor([1]), torch.tensor([0]))),
    "dropout ": lambda q: dict(dropout=(torch.ones(1, 1, 1, 1, dtype=torch.uint8), torch.tensor([1.0]))),
    "block_mask": lambda q: dict(block_mask=torch.ones(1, 1, 1, 1, dtype=torch.uint8)),
    "gate": lambda q: dict(gate=torch.zeros_like(q)),
    "score_max": lambda q: dict(score_max=torch.empty(*q.shape[:3], 1)),
    "score_sum_exp": lambda q: dict(score_sum_exp=torch.empty(*q.shape[:3], 1)),
}


@pytest.mark.parametrize("feature", sorted(UNSUPPORTED))
def test_unsupported_feature_named(fs, flex_route, feature):
    q, k, v = _dense(1, 2, 2, 16, 16, 16, 16)
    with pytest.raises(NotImplementedError, match=feature.strip()):
        fs.sdpa(q, k, v, **UNSUPPORTED[feature](q))


def test_unsupported_in_backward_named(fs, flex_route):
    """sdpa_backward with a feature the lowering lacks: the same named error (no silent drop of the feature)."""
    q, k, v = _dense(1, 2, 2, 16, 16, 16, 16)
    o, stats = fs.sdpa(q, k, v, generate_stats=True)
    with pytest.raises(NotImplementedError, match="softcap"):
        fs.sdpa_backward(q, k, v, o, torch.ones_like(o), stats, softcap=3.0)
    with pytest.raises(NotImplementedError, match="bias"):
        bias = torch.zeros(1, 1, 16, 16, dtype=q.dtype)
        fs.sdpa_backward(q, k, v, o, torch.ones_like(o), stats, bias=bias, dBias=torch.empty_like(bias))


def test_default_route(fs, monkeypatch):
    from flashspan import sdpa_lowering

    monkeypatch.delenv(sdpa_lowering.ROUTE_ENV, raising=False)
    assert sdpa_lowering.route(torch.empty(1)) == "reference"
    monkeypatch.setenv(sdpa_lowering.ROUTE_ENV, "flex")
    assert sdpa_lowering.route(torch.empty(1)) == "flex"
    monkeypatch.setenv(sdpa_lowering.ROUTE_ENV, "reference")
    assert sdpa_lowering.route(torch.empty(1)) == "reference"


def test_unsupported_layouts_named(fs, flex_route):
    q, k, v = _dense(1, 4, 2, 16, 16, 16, 16)
    with pytest.raises(NotImplementedError, match="H_k = 2 != H_v = 1"):
        fs.sdpa(q, k, v[:, :1])
    with pytest.raises(NotImplementedError, match="float64"):
        fs.sdpa(q.double(), k.double(), v.double())
    with pytest.raises(NotImplementedError, match="paged"):
        table = torch.zeros(1, 1, 1, 1, dtype=torch.int32)
        fs.sdpa(q, k, v, paged_attention_k_table=table, paged_attention_v_table=table, use_padding_mask=True,
                seq_len_q=torch.tensor([16]), seq_len_kv=torch.tensor([16]))
    T = 10
    qt, kt = torch.randn(T, 2, 16).bfloat16(), torch.randn(T, 2, 16).bfloat16()
    cu = torch.tensor([0, 4, 10])
    with pytest.raises(NotImplementedError, match=r"ragged_offsets\['v'\]"):
        fs.sdpa(qt, kt, kt, use_padding_mask=True, cu_seq_len_q=cu, cu_seq_len_kv=cu,
                ragged_offsets={"k": cu, "v": torch.tensor([0, 3, 9])})


def test_bad_input_still_value_error(fs, flex_route):
    q, k, v = _dense(1, 2, 2, 16, 16, 16, 16)
    with pytest.raises(ValueError, match="use_alibi_mask"):  # a broken rule, before the feature check
        fs.sdpa(q, k, v, use_alibi_mask=True)
    with pytest.raises(ValueError, match="diagonal_band_right_bound"):
        fs.sdpa(q, k, v, diagonal_band_right_bound=-1)
    with pytest.raises(ValueError, match="seq_len_q"):
        fs.sdpa(q, k, v, use_padding_mask=True, seq_len_q=torch.tensor([17]), seq_len_kv=torch.tensor([3]))


# ---------------------------------------------------------------------------
# GPU: the same comparisons on CUDA tensors (skipped without a GPU)
# ---------------------------------------------------------------------------

gpu = pytest.mark.skipif(not cuda_ready(),
                         reason="needs a CUDA device and a libflashspan.so built with CUDA (fs_cuda_available() == 1)")


def _to_cuda(x):
    if isinstance(x, torch.Tensor):
        return x.cuda()
    if isinstance(x, dict):
        return {n: _to_cuda(t) for n, t in x.items()}
    if isinstance(x, tuple):
        return tuple(_to_cuda(t) for t in x)
    return x


@gpu
@pytest.mark.parametrize("seed", range(200))
def test_gpu_random_lowered_against_cpu_reference(fs, monkeypatch, seed):
    """CUDA tensors on the flex route (FLASHSPAN_SDPA_ROUTE=flex: the lowering onto the flex kernels) against the
    SDPA CPU reference on the same inputs: outputs, stats, gradients. (The native route, the CUDA default, runs the
    same comparison in test_sdpa_native_route.py.)"""
    gpu_case_against_cpu_reference(fs, monkeypatch, seed, "flex")


def gpu_case_against_cpu_reference(fs, monkeypatch, seed, route):
    """mask_problem(20_000 + seed) on the CPU reference, then on CUDA tensors with FLASHSPAN_SDPA_ROUTE=route
    ("flex": the lowering; "native": the C layer's SDPA kernels): outputs, stats and gradients compared."""
    from flashspan import sdpa_lowering

    monkeypatch.delenv(sdpa_lowering.ROUTE_ENV, raising=False)
    p = mask_problem(20_000 + seed, dtype=random.Random(seed).choice([torch.bfloat16, torch.float16]))
    ok_dims = sdpa_lowering._gpu_head_dims_ok(p.q.shape[-1], p.v.shape[-1])
    if not ok_dims:
        pytest.skip("head dims no GPU kernel runs (flex or native)")
    ins = [t.detach().clone().requires_grad_() for t in (p.q, p.k, p.v)]
    o, stats = fs.sdpa(*ins, generate_stats=True, **p.args)
    g = torch.Generator().manual_seed(seed)
    do = torch.randn(o.shape, generator=g).to(o.dtype)
    grads = torch.autograd.grad(o, ins, do)
    monkeypatch.setenv(sdpa_lowering.ROUTE_ENV, route)
    gins = [t.detach().cuda().requires_grad_() for t in (p.q, p.k, p.v)]
    og, sg = fs.sdpa(*gins, generate_stats=True, **_to_cuda(p.args))
    ggrads = torch.autograd.grad(og, gins, do.cuda())
    lq, lk = p.case.len_q, p.case.len_kv

    def sel(t, lens, thd, offs):
        t = t.detach().cpu()
        if thd:
            return t[_rows(offs, lens)]
        return valid_rows(t.double(), lens)

    assert_close(sel(og, lq, p.thd_q, p.offsets_q), sel(o, lq, p.thd_q, p.offsets_q), p.dtype, "o")
    assert_close(sel(sg, lq, p.thd_q, p.offsets_q), sel(stats, lq, p.thd_q, p.offsets_q), torch.float32, "stats")
    for n, a, b, lens, thd, offs in (("dq", grads[0], ggrads[0], lq, p.thd_q, p.offsets_q),
                                     ("dk", grads[1], ggrads[1], lk, p.thd_kv, p.offsets_kv),
                                     ("dv", grads[2], ggrads[2], lk, p.thd_kv, p.offsets_kv)):
        assert_close(sel(b, lens, thd, offs), sel(a, lens, thd, offs), p.dtype, n)


@gpu
@pytest.mark.parametrize("dims", [(64, 64), (128, 128), (192, 128), (256, 256)])
@pytest.mark.parametrize("align", ["TOP_LEFT", "BOTTOM_RIGHT"])
@pytest.mark.parametrize("route", ["flex", "native"])
def test_gpu_dense_causal_dims(fs, monkeypatch, dims, align, route):
    from flashspan import sdpa_lowering

    q, k, v = _dense(2, 8, 2, 300, 517, dims[0], dims[1], dtype=torch.bfloat16)
    kw = dict(attn_scale=1 / math.sqrt(dims[0]), diagonal_band_right_bound=0, diagonal_alignment=align,
              generate_stats=True)
    monkeypatch.delenv(sdpa_lowering.ROUTE_ENV, raising=False)
    o_ref, s_ref = fs.sdpa(q, k, v, **kw)
    if route == "flex":
        monkeypatch.setenv(sdpa_lowering.ROUTE_ENV, "flex")
    o, stats = fs.sdpa(q.cuda().transpose(1, 2).contiguous().transpose(1, 2), k.cuda(), v.cuda(), **kw)
    assert_close(o.cpu(), o_ref, torch.bfloat16, "o")
    assert_close(stats.cpu(), s_ref, torch.float32, "stats")


@gpu
@pytest.mark.parametrize("route", ["flex", "native"])
def test_gpu_unsupported_head_dims_named(fs, monkeypatch, route):
    """Head dims no GPU kernel runs: NotImplementedError naming them, on either route."""
    from flashspan import sdpa_lowering

    monkeypatch.setenv(sdpa_lowering.ROUTE_ENV, route)
    with pytest.raises(NotImplementedError, match="head dims"):
        fs.sdpa(*(t.cuda() for t in _dense(1, 2, 2, 16, 16, 136, 136)))


@gpu
@pytest.mark.parametrize("varlen", [False, True])
def test_gpu_custom_ops_deterministic_backward(fs, monkeypatch, varlen):
    """sdpa_torch (the custom ops) on CUDA against the CPU reference, and the deterministic backward bitwise
    reproducible."""
    from flashspan import sdpa_lowering

    monkeypatch.delenv(sdpa_lowering.ROUTE_ENV, raising=False)
    g = torch.Generator().manual_seed(11)
    if varlen:
        cu = torch.tensor([0, 100, 100, 333], dtype=torch.int32)
        q, k, v = (torch.randn(333, 4, 64, generator=g).bfloat16() for _ in range(3))
        kw = dict(is_causal=True, cu_seqlens_q=cu, cu_seqlens_kv=cu, max_seqlen_q=233, max_seqlen_kv=233)
    else:
        q, k, v = (torch.randn(2, 4, 200, 64, generator=g).bfloat16() for _ in range(3))
        kw = dict(is_causal=True, window_left=50, causal_bottom_right=True)

    def run(dev):
        leaves = [t.to(dev).requires_grad_() for t in (q, k, v)]
        kwd = {n: (t.to(dev) if isinstance(t, torch.Tensor) else t) for n, t in kw.items()}
        o, lse = fs.sdpa_torch(*leaves, return_lse=True, **kwd)
        do = torch.randn(o.shape, generator=torch.Generator().manual_seed(1)).to(o.dtype).to(dev)
        grads = torch.autograd.grad(o, leaves, do)
        return [t.detach().cpu() for t in (o, lse) + grads]

    want = run("cpu")
    got = run("cuda")
    for name, a, b in zip(("o", "lse", "dq", "dk", "dv"), got, want):
        assert_close(a, b, torch.bfloat16 if name != "lse" else torch.float32, name)
    prev = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled())
    torch.use_deterministic_algorithms(True, warn_only=True)  # sdpa_bwd's is_deterministic follows it
    try:
        first, second = run("cuda"), run("cuda")
    finally:
        torch.use_deterministic_algorithms(prev[0], warn_only=prev[1])
    for a, b in zip(first, second):
        assert torch.equal(a, b)
