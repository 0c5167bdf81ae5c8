"""flex_attn_func on CPU tensors (the C reference backend) vs an independent float64 PyTorch math reference."""

import math

import pytest
import torch
from flex_ref import assert_close, make_problem
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def _run(fs, p, **kw):
    plan = fs.create_mask_plan(p.mask_func, p.q, p.k, p.v, **p.plan_kwargs())
    return plan, fs.flex_attn_func(p.q, p.k, p.v, mask_plan=plan, return_lse=True, return_max_logit=True, **kw)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("varlen", [False, True])
@pytest.mark.parametrize("hq,hkv,hm", [(4, 4, 1), (4, 2, 4), (6, 1, 1), (3, 3, 3)])
def test_forward_matches_reference(fs, dtype, varlen, hq, hkv, hm):
    p = make_problem(11 + hq * 7 + hm, varlen=varlen, batch=3, seqlen_q=41, seqlen_k=53, hq=hq, hkv=hkv, hm=hm,
                     nfunc=5, dqk=24, dv=16, dtype=dtype)
    _, (out, lse, ml) = _run(fs, p)
    ro, rl, rm = p.reference()
    assert out.dtype == dtype and lse.dtype == torch.float32 and ml.dtype == torch.float32
    assert_close(out, ro, dtype, "out", factor=2)
    assert_close(lse, rl, torch.float32 if dtype == torch.float32 else dtype, "lse", factor=2)
    assert_close(ml, rm, torch.float32 if dtype == torch.float32 else dtype, "max_logit", factor=2)


def test_empty_rows_give_zero_out_and_minus_inf_lse(fs):
    p = make_problem(3, batch=1, seqlen_q=16, seqlen_k=16, hq=2, hkv=2, nfunc=1)
    mf = p.mask_func.clone()
    mf[..., ::3] = 0  # every third row sees nothing
    p.mask_func = mf
    plan = fs.create_mask_plan(p.mask_func, p.q, p.k, p.v)
    out, lse = fs.flex_attn_func(p.q, p.k, p.v, mask_plan=plan, return_lse=True)
    assert torch.all(out[:, ::3] == 0)
    assert torch.all(torch.isneginf(lse[:, :, ::3]))
    assert_close(out, p.reference()[0], torch.float32, "out")


def test_max_logit_of_head_without_visible_pairs_is_minus_inf(fs):
    p = make_problem(4, batch=1, seqlen_q=8, seqlen_k=8, hq=2, hkv=2, hm=2, nfunc=1)
    mf = p.mask_func.clone()
    mf[1] = 0
    mf[0] = 8
    plan = fs.create_mask_plan(mf, p.q, p.k, p.v)
    _, ml = fs.flex_attn_func(p.q, p.k, p.v, mask_plan=plan, return_max_logit=True)
    assert math.isinf(ml[1].item()) and ml[1].item() < 0
    p.mask_func = mf
    assert_close(ml[0], p.reference()[2][0], torch.float32, "max_logit of head 0")


@pytest.mark.parametrize("scale", [0.0, 0.3, 2.0])
def test_softmax_scale(fs, scale):
    p = make_problem(5, batch=1, seqlen_q=20, seqlen_k=30, hq=2, hkv=1, nfunc=3)
    _, (out, lse, ml) = _run(fs, p, softmax_scale=scale)
    ro, rl, rm = p.reference(scale=scale)
    assert_close(out, ro, torch.float32, "out")
    assert_close(lse, rl, torch.float32, "lse")
    assert_close(ml, rm, torch.float32, "max_logit")


def test_strided_inputs(fs):
    # q/k/v as views of a packed qkv buffer: only the last dimension is contiguous.
    gen = torch.Generator().manual_seed(9)
    qkv = torch.randn(2, 33, 3, 4, 16, generator=gen)
    q, k, v = qkv.unbind(2)
    assert not q.is_contiguous()
    p = make_problem(9, batch=2, seqlen_q=33, seqlen_k=33, hq=4, hkv=4)
    p.q, p.k, p.v = q, k, v
    plan = fs.create_mask_plan(p.mask_func, q, k, v)
    out = fs.flex_attn_func(q, k, v, mask_plan=plan)
    assert_close(out, p.reference()[0], torch.float32, "out")


def _loss_weights(p, out_shape, lse_shape, seed):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(out_shape, generator=gen), torch.randn(lse_shape, generator=gen)


def _grads(fn_out_lse, inputs, w_out, w_lse):
    out, lse = fn_out_lse()
    lse = lse.masked_fill(torch.isinf(lse.detach()), 0)  # empty rows: lse = -inf is a constant
    loss = (out.double() * w_out).sum() + (lse.double() * w_lse).sum()
    return torch.autograd.grad(loss, inputs)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("varlen", [False, True])
@pytest.mark.parametrize("use_lse", [False, True])
@pytest.mark.parametrize("hq,hkv,hm", [(4, 2, 1), (2, 2, 2)])
def test_backward_matches_reference(fs, dtype, varlen, use_lse, hq, hkv, hm):
    p = make_problem(21 + hm, varlen=varlen, batch=2, seqlen_q=29, seqlen_k=38, hq=hq, hkv=hkv, hm=hm, nfunc=3,
                     dqk=16, dv=24, dtype=dtype, requires_grad=True)
    plan = fs.create_mask_plan(p.mask_func, p.q, p.k, p.v, **p.plan_kwargs())
    assert plan.has_backward  # default: autograd on and inputs require grad
    w_out, w_lse = _loss_weights(p, (*p.q.shape[:-1], p.v.shape[-1]), plan.lse_shape(), 5)
    if not use_lse:
        w_lse = torch.zeros_like(w_lse)
    got = _grads(lambda: fs.flex_attn_func(p.q, p.k, p.v, mask_plan=plan, return_lse=True), (p.q, p.k, p.v), w_out, w_lse)
    leaves = [t.detach().double().requires_grad_(True) for t in (p.q, p.k, p.v)]
    want = _grads(lambda: p.reference(*leaves)[:2], leaves, w_out, w_lse)
    for name, g, w in zip("qkv", got, want):
        assert g.dtype == dtype
        assert_close(g, w, dtype, f"d{name}", factor=4)


@pytest.mark.parametrize("varlen", [False, True])
@pytest.mark.parametrize("sq,sk", [(33, 65), (70, 150), (97, 191)])
def test_partial_tail_blocks_of_keys_and_rows(fs, varlen, sq, sk):
    # The CPU backend walks keys in blocks of 64 and rows in blocks of 32: lengths ending in a
    # partial block, every key visible for some rows and only the last keys for others, so a
    # dropped or truncated tail block changes the result.
    p = make_problem(71 + sk, varlen=varlen, batch=2, seqlen_q=[sq, 5] if varlen else sq,
                     seqlen_k=[sk, sk - 64] if varlen else sk, hq=2, hkv=1, nfunc=3, requires_grad=True)
    mf = p.mask_func.clone()
    for b in range(len(p.cu_q) - 1):
        lk = p.cu_k[b + 1] - p.cu_k[b]
        rows = slice(p.cu_q[b], p.cu_q[b + 1])
        mf[:, :, rows] = torch.tensor([lk, lk, lk], dtype=torch.int32).view(1, 3, 1)
        mf[:, :, p.cu_q[b] + 1 : p.cu_q[b + 1] : 2] = torch.tensor([0, max(0, lk - 3), lk],
                                                                  dtype=torch.int32).view(1, 3, 1)
    p.mask_func = mf
    plan = fs.create_mask_plan(p.mask_func, p.q, p.k, p.v, **p.plan_kwargs())
    out, lse = fs.flex_attn_func(p.q, p.k, p.v, mask_plan=plan, return_lse=True)
    ro, rl, _ = p.reference()
    assert_close(out, ro, torch.float32, "out", factor=2)
    assert_close(lse, rl, torch.float32, "lse", factor=2)
    w_out, w_lse = _loss_weights(p, tuple(out.shape), plan.lse_shape(), 3)
    got = _grads(lambda: fs.flex_attn_func(p.q, p.k, p.v, mask_plan=plan, return_lse=True), (p.q, p.k, p.v), w_out, w_lse)
    leaves = [t.detach().double().requires_grad_(True) for t in (p.q, p.k, p.v)]
    want = _grads(lambda: p.reference(*leaves)[:2], leaves, w_out, w_lse)
    for name, g, w in zip("qkv", got, want):
        assert_close(g, w, torch.float32, f"d{name}", factor=4)


def test_lse_only_gradient(fs):
    # Loss depends on lse alone: d(out) is None, the whole gradient is the dS = P * dlse term.
    p = make_problem(31, batch=2, seqlen_q=24, seqlen_k=24, hq=2, hkv=1, requires_grad=True)
    plan = fs.create_mask_plan(p.mask_func, p.q, p.k, p.v)
    _, lse = fs.flex_attn_func(p.q, p.k, p.v, mask_plan=plan, return_lse=True)
    lse.masked_fill(torch.isinf(lse.detach()), 0).sum().backward()
    leaves = [t.detach().double().requires_grad_(True) for t in (p.q, p.k, p.v)]
    rl = p.reference(*leaves)[1]
    rl.masked_fill(torch.isinf(rl.detach()), 0).sum().backward()
    assert_close(p.q.grad, leaves[0].grad, torch.float32, "dq", factor=4)
    assert_close(p.k.grad, leaves[1].grad, torch.float32, "dk", factor=4)
    assert torch.all(p.v.grad == 0)


def test_deterministic_flag_gradients_match_reference(fs):
    # The CPU backend is deterministic either way: both settings must give the reference's gradients.
    p = make_problem(41, batch=2, seqlen_q=30, seqlen_k=30, hq=4, hkv=1, requires_grad=True)
    plan = fs.create_mask_plan(p.mask_func, p.q, p.k, p.v)
    leaves = [t.detach().double().requires_grad_(True) for t in (p.q, p.k, p.v)]
    want = torch.autograd.grad(p.reference(*leaves)[0].sum(), leaves)
    for det in (True, False):
        out = fs.flex_attn_func(p.q, p.k, p.v, mask_plan=plan, deterministic=det)
        got = torch.autograd.grad(out.sum(), (p.q, p.k, p.v))
        for name, g, w in zip("qkv", got, want):
            assert_close(g, w, torch.float32, f"d{name} (deterministic={det})", factor=4)


def test_plan_reuse_with_new_tensors(fs):
    p = make_problem(51, batch=2, seqlen_q=20, seqlen_k=28, hq=2, hkv=2, requires_grad=True)
    plan = fs.create_mask_plan(p.mask_func, p.q, p.k, p.v)
    for seed in range(3):
        p2 = make_problem(100 + seed, batch=2, seqlen_q=20, seqlen_k=28, hq=2, hkv=2, requires_grad=True)
        p2.mask_func = p.mask_func
        out = fs.flex_attn_func(p2.q, p2.k, p2.v, mask_plan=plan)
        assert_close(out, p2.reference()[0], torch.float32, "out")
        got = torch.autograd.grad(out.sum(), (p2.q, p2.k, p2.v))
        leaves = [t.detach().double().requires_grad_(True) for t in (p2.q, p2.k, p2.v)]
        want = torch.autograd.grad(p2.reference(*leaves)[0].sum(), leaves)
        for name, g, w in zip("qkv", got, want):
            assert_close(g, w, torch.float32, f"d{name} (new tensors {seed})", factor=4)


def test_no_grad_call_with_forward_only_plan(fs):
    p = make_problem(61, batch=1, seqlen_q=20, seqlen_k=20, hq=2, hkv=2, requires_grad=True)
    with torch.no_grad():
        plan = fs.create_mask_plan(p.mask_func, p.q, p.k, p.v)
        assert not plan.has_backward
        out = fs.flex_attn_func(p.q, p.k, p.v, mask_plan=plan)
    assert out.grad_fn is None
    assert_close(out, p.reference()[0], torch.float32, "out")


@settings(max_examples=30, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 2**31 - 1),
    varlen=st.booleans(),
    batch=st.integers(1, 3),
    sq=st.integers(1, 70),
    sk=st.integers(1, 70),
    hkv=st.integers(1, 2),
    group=st.integers(1, 3),
    per_head_mask=st.booleans(),
    nfunc=st.sampled_from([1, 3, 5, 7]),
    dqk=st.sampled_from([8, 16, 32]),
    dv=st.sampled_from([8, 16]),
    mask=st.sampled_from(["random", "random", "blocks"]),
)
def test_random_problems_forward_backward(fs, seed, varlen, batch, sq, sk, hkv, group, per_head_mask, nfunc, dqk, dv,
                                          mask):
    hq = hkv * group
    p = make_problem(seed, varlen=varlen, batch=batch, seqlen_q=sq, seqlen_k=sk, hq=hq, hkv=hkv,
                     hm=hq if per_head_mask else 1, nfunc=nfunc, dqk=dqk, dv=dv, requires_grad=True, mask=mask)
    plan = fs.create_mask_plan(p.mask_func, p.q, p.k, p.v, **p.plan_kwargs())
    w_out, w_lse = _loss_weights(p, (*p.q.shape[:-1], dv), plan.lse_shape(), seed)
    out, lse = fs.flex_attn_func(p.q, p.k, p.v, mask_plan=plan, return_lse=True)
    ro, rl, _ = p.reference()
    assert_close(out, ro, torch.float32, "out", factor=2)
    assert_close(lse, rl, torch.float32, "lse", factor=2)
    got = _grads(lambda: fs.flex_attn_func(p.q, p.k, p.v, mask_plan=plan, return_lse=True), (p.q, p.k, p.v), w_out, w_lse)
    leaves = [t.detach().double().requires_grad_(True) for t in (p.q, p.k, p.v)]
    want = _grads(lambda: p.reference(*leaves)[:2], leaves, w_out, w_lse)
    for name, g, w in zip("qkv", got, want):
        assert_close(g, w, torch.float32, f"d{name}", factor=4)


# float64 on CPU tensors: the reference runs in double throughout (inputs, accumulation, LSE and max_logit as
# float64), so its forward matches the float64 math reference to ~1e-12 and torch.autograd.gradcheck passes --
# against finite differences, not against our own reference.
@pytest.mark.parametrize("varlen", [False, True])
def test_float64_forward_matches_reference_to_double_precision(fs, varlen):
    p = make_problem(71, varlen=varlen, batch=2, seqlen_q=21, seqlen_k=33, hq=4, hkv=2, hm=4, nfunc=5, dqk=24,
                     dv=16, dtype=torch.float64)
    # (The softmax scale is a float32 in the C ABI: 0.25 is exact there, the default 1 / sqrt(24) is not.)
    _, (out, lse, ml) = _run(fs, p, softmax_scale=0.25)
    ro, rl, rm = p.reference(scale=0.25)
    assert out.dtype == lse.dtype == ml.dtype == torch.float64
    for name, a, e in (("out", out, ro), ("lse", lse, rl), ("max_logit", ml, rm)):
        inf = torch.isinf(e)
        assert torch.equal(torch.isinf(a), inf) and torch.equal(a[inf], e[inf]), name
        assert (a[~inf] - e[~inf]).abs().max().item() <= 1e-12 * (1 + e[~inf].abs().max().item()), name


@pytest.mark.parametrize("varlen,mask", [(False, "random"), (True, "random"), (False, "causal")])
def test_float64_gradcheck(fs, varlen, mask):
    # GQA (4 query heads on 2 KV heads), a per-head mask, empty rows of the random mask, THD with uneven samples;
    # both outputs (out and lse) differentiated.
    p = make_problem(83, varlen=varlen, batch=2, seqlen_q=9, seqlen_k=13, hq=4, hkv=2, hm=4 if mask == "random" else 1,
                     nfunc=3, dqk=8, dv=8, dtype=torch.float64, requires_grad=True, mask=mask)
    plan = fs.create_mask_plan(p.mask_func, p.q, p.k, p.v, **p.plan_kwargs())

    def f(q, k, v):
        out, lse = fs.flex_attn_func(q, k, v, mask_plan=plan, return_lse=True)
        return out, torch.nan_to_num(lse, neginf=0.0)  # an empty row's LSE is -inf: no finite difference there

    assert torch.autograd.gradcheck(f, (p.q, p.k, p.v), eps=1e-6, atol=1e-8, rtol=1e-6)


def test_float64_stats_of_another_dtype_are_refused(fs):
    p = make_problem(5, batch=1, seqlen_q=8, seqlen_k=8, hq=2, hkv=2, nfunc=1, dtype=torch.float64)
    plan = fs.create_mask_plan(p.mask_func, p.q, p.k, p.v)
    out = torch.empty_like(p.q)
    lse32 = torch.empty(plan.lse_shape(), dtype=torch.float32)
    with pytest.raises(TypeError, match=r"lse: dtype must be float64, got float32 \(lse, dlse and max_logit are float32, float64 for float64 inputs\)$"):
        fs.FlexAttentionFwd(p.q, p.k, p.v, out, plan, lse32)
