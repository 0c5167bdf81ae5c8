"""SDPA masks on the CPU reference against the float64 oracle (sdpa_ref.py): random configurations of the pure-mask
subset (causal / bands / windows in both alignments, S_q != S_kv, padding with NaN-poisoned padding, THD with gaps
and zero-length samples, GQA / MQA, layouts and strides, float32 / bf16 / fp16; every output and gradient the library
allocates NaN-poisoned first) and focused cases (the deprecated setters, base-2 stats with a tensor scale and
max_logit, head dims (192, 128), sdpa_backward, the custom ops, lengths changed in place), plus the retired
FLASHSPAN_SDPA_ROUTE=flex switch's error.

(These cases ran the flex route of flashspan.sdpa, the Python lowering of pure-mask calls onto flex mask plans, until
it was retired (issue 24); what they assert is SDPA's semantics, so they run on the CPU reference now. The native
GPU route draws the same random configurations in test_sdpa_native_route.py.)
"""

import math

import pytest
import torch

import sdpa_ref
from sdpa_cases import _poison_padding, assert_close, mask_problem, valid_rows
from test_sdpa_cpu import _run

NUM_RANDOM = 160

pytestmark = pytest.mark.usefixtures("poison_uninitialized")


# ---------------------------------------------------------------------------
# Random configurations of the pure-mask subset against the oracle
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(NUM_RANDOM))
def test_random_masks_against_oracle(fs, seed):
    _run(fs, mask_problem(seed))


@pytest.mark.parametrize("seed", range(12))
def test_random_masks_long_sequences(fs, seed):
    # S up to 150 / 270: several 128-row / 128-key tiles per sample.
    _run(fs, mask_problem(50_000 + seed, big=True))


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
def test_causal_alignments_sq_ne_skv(fs, align, sq, skv):
    q, k, v = _dense(2, 4, 2, sq, skv, 64, 64)
    o, stats = fs.sdpa(q, k, v, attn_scale=0.125, diagonal_band_right_bound=0, diagonal_alignment=align,
                       generate_stats=True)
    _, ref = _oracle(q, k, v, scale=0.125, right=0, bottom_right=align == "BOTTOM_RIGHT")
    assert_close(o, ref["o"], torch.bfloat16, "o")
    assert_close(stats[..., 0], ref["lse"], torch.float32, "stats")  # rows without keys: -inf on both


def test_head_dims_192_128_gqa_mqa(fs):
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


def test_stats_log2_tensor_scale_max_logit(fs):
    q, k, v = _dense(2, 2, 1, 20, 30, 32, 32, dtype=torch.float32)
    ml = torch.full((2,), float("nan"))
    scale = torch.tensor([0.3])
    o, stats = fs.sdpa(q, k, v, attn_scale=scale, generate_stats=True, stats_use_log2=True, max_logit=ml,
                       use_causal_mask_bottom_right=True)
    _, ref = _oracle(q, k, v, scale=0.3, right=0, bottom_right=True)
    assert_close(o, ref["o"], torch.float32, "o")
    assert_close(stats[..., 0], ref["lse"] / math.log(2.0), torch.float32, "stats (log2)")
    assert_close(ml, sdpa_ref.max_logit(ref), torch.float32, "max_logit")


def test_deprecated_setters_and_sliding_window(fs):
    q, k, v = _dense(1, 2, 2, 25, 25, 16, 16, dtype=torch.float32)
    for kw, case in ((dict(use_causal_mask=True), dict(right=0)),
                     (dict(use_causal_mask=True, sliding_window_length=4), dict(right=0, left=4)),
                     (dict(use_causal_mask_bottom_right=True, diagonal_band_right_bound=2),
                      dict(right=2, bottom_right=True)),
                     (dict(sliding_window_length=6), dict(left=6))):
        with pytest.warns(DeprecationWarning):
            o, _ = fs.sdpa(q, k, v, attn_scale=0.25, **kw)
        _, ref = _oracle(q, k, v, scale=0.25, **case)
        assert_close(o, ref["o"], torch.float32, f"o {kw}")


DEPRECATED = [  # (spelling, its replacement as the warning names it, the same call without it)
    (dict(use_causal_mask=True), r"use_causal_mask is deprecated \(as in the seed\): pass diagonal_band_right_bound=0",
     dict(diagonal_band_right_bound=0)),
    (dict(use_causal_mask_bottom_right=True), r"use_causal_mask_bottom_right is deprecated \(as in the seed\): pass "
     r"diagonal_alignment=BOTTOM_RIGHT, diagonal_band_right_bound=0",
     dict(diagonal_alignment="BOTTOM_RIGHT", diagonal_band_right_bound=0)),
    (dict(sliding_window_length=3), r"sliding_window_length is deprecated \(as in the seed\): pass "
     r"diagonal_band_left_bound", dict(diagonal_band_left_bound=3)),
    (dict(is_inference=False), r"is_inference is deprecated \(as in the seed\): pass generate_stats",
     dict(generate_stats=True)),
]


@pytest.mark.parametrize("old, message, new", DEPRECATED, ids=[next(iter(d[0])) for d in DEPRECATED])
def test_deprecated_spellings_warn_naming_the_replacement(fs, old, message, new):
    """use_causal_mask (the seed's DEPRECATED set_causal_mask) and the other deprecated spellings ran silently."""
    import warnings

    q, k, v = _dense(1, 2, 2, 9, 12, 16, 16, dtype=torch.float32)
    with pytest.warns(DeprecationWarning, match=message) as record:
        got = fs.sdpa(q, k, v, attn_scale=0.5, **old)
    assert record[0].filename == __file__  # attributed to the caller
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        want = fs.sdpa(q, k, v, attn_scale=0.5, **new)  # the replacement does not warn
    assert torch.equal(got[0], want[0])
    if "is_inference" not in old:
        stats = torch.zeros(1, 2, 9, 1)
        with pytest.warns(DeprecationWarning, match=message):
            fs.sdpa_backward(q, k, v, got[0], got[0], stats, attn_scale=0.5, **old)
    # flashspan.sdpa_fp8's use_causal_mask is the seed's own FP8 option: no warning there; its is_inference is one
    # of the seed's FP8 "Deprecated Args".
    q8 = q.to(torch.float8_e4m3fn)
    fp8 = (q8, q8, q8, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0)
    if "use_causal_mask" in old:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            fs.sdpa_fp8(*fp8, use_causal_mask=True, generate_stats=False)
    if "is_inference" in old:
        with pytest.warns(DeprecationWarning, match=message) as record:
            fs.sdpa_fp8(*fp8, generate_stats=None, is_inference=True)
        assert record[0].filename == __file__


def test_padding_rows_zero_and_poisoned_inputs_unread(fs):
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


def test_thd_zero_length_samples_and_dense_kv(fs):
    """Packed q with empty samples against dense, padded K/V (one side packed, the other dense)."""
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


def test_sdpa_backward_explicit_and_deterministic(fs):
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


def test_custom_ops_masks_against_oracle(fs):
    """torch.ops.flashspan.sdpa_fwd / sdpa_bwd (sdpa_torch): a causal window, dense and THD, against the oracle."""
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


def test_lengths_changed_in_place_are_read_again(fs):
    """Length tensors are read at every call (no cache of operations or fast-path bindings keeps their values):
    lengths changed in place between two calls of the same signature give the new lengths' result."""
    q, k, v = _dense(2, 2, 2, 24, 24, 16, 16, dtype=torch.float32)
    lq = torch.tensor([24, 10])
    lk = torch.tensor([20, 24])
    kw = dict(use_padding_mask=True, seq_len_q=lq, seq_len_kv=lk, diagonal_band_right_bound=0)
    o1, _ = fs.sdpa(q, k, v, **kw)
    o2, _ = fs.sdpa(q, k, v, **kw)
    assert torch.equal(o1, o2)
    lk[0] = 3  # in place
    o3, _ = fs.sdpa(q, k, v, **kw)
    _, ref = _oracle(q, k, v, [24, 10], [3, 24], right=0)
    assert_close(valid_rows(o3, [24, 10]), valid_rows(ref["o"], [24, 10]), torch.float32, "o after lk changed")


# ---------------------------------------------------------------------------
# The retired flex route's switch
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("value", ["", "native", "reference", "NATIVE"])
def test_route_switch_native_and_reference_change_nothing(fs, monkeypatch, value):
    q, k, v = _dense(1, 2, 2, 9, 9, 16, 16, dtype=torch.float32)
    monkeypatch.delenv("FLASHSPAN_SDPA_ROUTE", raising=False)
    want = fs.sdpa(q, k, v, attn_scale=0.3, diagonal_band_right_bound=0)[0]
    monkeypatch.setenv("FLASHSPAN_SDPA_ROUTE", value)
    assert torch.equal(fs.sdpa(q, k, v, attn_scale=0.3, diagonal_band_right_bound=0)[0], want)


def test_route_switch_flex_is_retired(fs, monkeypatch):
    """FLASHSPAN_SDPA_ROUTE=flex (the retired lowering onto flex) raises a ValueError naming the variable and pointing
    to flex_attn_func, on every entry point and on every call (the fast path too); another value names the values
    allowed."""
    q, k, v = _dense(1, 2, 2, 9, 9, 16, 16, dtype=torch.float32)
    fs.sdpa(q, k, v, attn_scale=0.3)  # remembered by the fast path
    monkeypatch.setenv("FLASHSPAN_SDPA_ROUTE", "flex")
    retired = r"FLASHSPAN_SDPA_ROUTE=flex: the flex route of flashspan.sdpa .* was retired .*flashspan.flex_attn_func"
    with pytest.raises(ValueError, match=f"^{retired}"):
        fs.sdpa(q, k, v, attn_scale=0.3)
    with pytest.raises(ValueError, match=f"^{retired}"):
        fs.sdpa(q.transpose(1, 2).reshape(9, 2, 16), k.transpose(1, 2).reshape(9, 2, 16),
                v.transpose(1, 2).reshape(9, 2, 16), use_padding_mask=True, cu_seq_len_q=torch.tensor([0, 9]),
                cu_seq_len_kv=torch.tensor([0, 9]))  # THD: the full path
    o, stats = torch.zeros_like(q), torch.zeros(1, 2, 9, 1)
    with pytest.raises(ValueError, match=f"^{retired}"):
        fs.sdpa_backward(q, k, v, o, o, stats, attn_scale=0.3)
    with pytest.raises(ValueError, match=f"^sdpa_fwd: {retired}"):
        fs.sdpa_torch(q, k, v, is_causal=True)
    monkeypatch.setenv("FLASHSPAN_SDPA_ROUTE", "lowering")
    with pytest.raises(ValueError, match=r"^FLASHSPAN_SDPA_ROUTE: must be unset, native or reference, got 'lowering'"):
        fs.sdpa(q, k, v, attn_scale=0.3)
