"""FlexAttentionFwd / FlexAttentionBwd on CPU tensors: lifecycle, caller buffers, descriptor and plan checks."""

import pytest
import torch
from flex_ref import assert_close, make_problem


def _buffers(p, plan):
    out = torch.full(plan.out_shape(), float("nan"), dtype=p.q.dtype)
    lse = torch.full(plan.lse_shape(), float("nan"), dtype=torch.float32)
    ml = torch.full((plan.num_heads_q,), float("nan"), dtype=torch.float32)
    return out, lse, ml


@pytest.mark.parametrize("varlen", [False, True])
def test_forward_backward_lifecycle(fs, varlen):
    p = make_problem(1, varlen=varlen, batch=2, seqlen_q=31, seqlen_k=27, hq=4, hkv=2, hm=4, nfunc=3, dqk=16, dv=8)
    plan = fs.create_mask_plan(p.mask_func, p.q, p.k, p.v, build_backward=True, **p.plan_kwargs())
    out, lse, ml = _buffers(p, plan)
    fwd = fs.FlexAttentionFwd(p.q, p.k, p.v, out, plan, lse, sample_max_logit=ml)
    assert fwd.check_support() is True
    fwd.compile()
    ws = torch.empty(fwd.workspace_size, dtype=torch.uint8)
    fwd.execute(p.q, p.k, p.v, out, plan, lse, workspace=ws, max_logit_tensor=ml)
    ro, rl, rm = p.reference()
    assert_close(out, ro, torch.float32, "out")
    assert_close(lse, rl, torch.float32, "lse")
    assert_close(ml, rm, torch.float32, "max_logit")

    gen = torch.Generator().manual_seed(3)
    do = torch.randn(out.shape, generator=gen)
    dq, dk, dv = (torch.full_like(t, float("nan")) for t in (p.q, p.k, p.v))
    bwd = fs.FlexAttentionBwd(p.q, p.k, p.v, out, do, lse, dq, dk, dv, plan)
    bwd.check_support()
    bwd.compile()
    bws = torch.empty(bwd.workspace_size, dtype=torch.uint8)
    bwd.execute(p.q, p.k, p.v, out, do, lse, dq, dk, dv, plan, workspace=bws)
    leaves = [t.detach().double().requires_grad_(True) for t in (p.q, p.k, p.v)]
    ref_out = p.reference(*leaves)[0]
    want = torch.autograd.grad((ref_out * do.double()).sum(), leaves)
    for name, g, w in zip("qkv", (dq, dk, dv), want):
        assert_close(g, w, torch.float32, f"d{name}", factor=4)


def test_execute_with_new_tensors_and_another_compatible_plan(fs):
    p = make_problem(2, batch=2, seqlen_q=20, seqlen_k=24, hq=2, hkv=2, nfunc=3)
    plan = fs.create_mask_plan(p.mask_func, p.q, p.k, p.v)
    out, lse, _ = _buffers(p, plan)
    fwd = fs.FlexAttentionFwd(p.q, p.k, p.v, out, plan, lse)
    fwd.check_support()
    fwd.compile()
    ws = torch.empty(fwd.workspace_size, dtype=torch.uint8)
    # Same geometry, other values and another mask: a second plan is compatible.
    p2 = make_problem(3, batch=2, seqlen_q=20, seqlen_k=24, hq=2, hkv=2, nfunc=3)
    plan2 = fs.create_mask_plan(p2.mask_func, p2.q, p2.k, p2.v)
    fwd.execute(p2.q, p2.k, p2.v, out, plan2, lse, workspace=ws)
    assert_close(out, p2.reference()[0], torch.float32, "out")
    assert_close(lse, p2.reference()[1], torch.float32, "lse")
    # The sample plan may be gone: execute takes the plan it is given.
    del plan
    fwd.execute(p.q, p.k, p.v, out, plan2, lse, workspace=ws)


def test_execute_descriptor_mismatch(fs):
    p = make_problem(4, batch=2, seqlen_q=16, seqlen_k=16, hq=2, hkv=2)
    plan = fs.create_mask_plan(p.mask_func, p.q, p.k, p.v)
    out, lse, ml = _buffers(p, plan)
    fwd = fs.FlexAttentionFwd(p.q, p.k, p.v, out, plan, lse)
    with pytest.raises(RuntimeError, match="compile\\(\\) must be called before execute\\(\\)"):
        fwd.execute(p.q, p.k, p.v, out, plan, lse)
    fwd.check_support()
    fwd.compile()
    with pytest.raises(ValueError, match="lse_tensor: is required"):
        fwd.execute(p.q, p.k, p.v, out, plan, None)
    with pytest.raises(ValueError, match="max_logit_tensor: was not given at construction"):
        fwd.execute(p.q, p.k, p.v, out, plan, lse, max_logit_tensor=ml)
    qt = p.q.transpose(0, 1).contiguous().transpose(0, 1)  # same shape, other strides
    with pytest.raises(ValueError, match=r"q_tensor: strides \(\d+, \d+, \d+, 1\) differ from the compiled .* \(same shape"):
        fwd.execute(qt, p.k, p.v, out, plan, lse)
    with pytest.raises(ValueError, match="o_tensor: dtype"):
        fwd.execute(p.q, p.k, p.v, out.half(), plan, lse)
    other = make_problem(5, batch=2, seqlen_q=16, seqlen_k=16, hq=2, hkv=1)
    plan_other = fs.create_mask_plan(other.mask_func, other.q, other.k, other.v)
    with pytest.raises(ValueError, match="mask_plan: geometry .* differs"):
        fwd.execute(p.q, p.k, p.v, out, plan_other, lse)
    with pytest.raises(TypeError, match="mask_plan: must be a flashspan.MaskPlan"):
        fwd.execute(p.q, p.k, p.v, out, None, lse)
    with pytest.raises(TypeError, match="workspace must be a torch.Tensor"):
        fwd.execute(p.q, p.k, p.v, out, plan, lse, workspace="ws")
    fwd.execute(p.q, p.k, p.v, out, plan, lse, workspace=torch.empty(4))  # any dtype: used as bytes


def test_execute_errors_name_the_call(fs):
    """Every execute() error, host-side or from the C layer, starts with the method that failed."""
    p = make_problem(4, batch=2, seqlen_q=16, seqlen_k=16, hq=2, hkv=2)
    plan = fs.create_mask_plan(p.mask_func, p.q, p.k, p.v, build_backward=True)
    out, lse, _ = _buffers(p, plan)
    fwd = fs.FlexAttentionFwd(p.q, p.k, p.v, out, plan, lse)
    fwd.compile()
    other = make_problem(5, batch=2, seqlen_q=16, seqlen_k=16, hq=2, hkv=1)
    plan_other = fs.create_mask_plan(other.mask_func, other.q, other.k, other.v, build_backward=True)
    pre = r"^FlexAttentionFwd\.execute: "
    with pytest.raises(ValueError, match=pre + r"mask_plan: geometry .* differs"):  # from the C layer
        fwd.execute(p.q, p.k, p.v, out, plan_other, lse)
    with pytest.raises(ValueError, match=pre + r"q_tensor: shape \(2, 8, 2, \d+\) differs from the compiled \(2, 16, 2, \d+\)"):
        fwd.execute(p.q[:, :8], p.k, p.v, out, plan, lse)
    with pytest.raises(ValueError, match=pre + r"o_tensor: dtype"):
        fwd.execute(p.q, p.k, p.v, out.half(), plan, lse)
    with pytest.raises(ValueError, match=pre + r"lse_tensor: is required"):
        fwd.execute(p.q, p.k, p.v, out, plan, None)
    with pytest.raises(TypeError, match=pre + r"mask_plan: must be a flashspan.MaskPlan"):
        fwd.execute(p.q, p.k, p.v, out, None, lse)
    with pytest.raises(TypeError, match=pre + r"workspace must be a torch.Tensor"):
        fwd.execute(p.q, p.k, p.v, out, plan, lse, workspace=[0])
    with pytest.raises(ValueError, match=pre + r"softmax_scale: must be a finite number"):
        fwd.execute(p.q, p.k, p.v, out, plan, lse, softmax_scale=float("nan"))
    with pytest.raises(TypeError, match=pre + r"q_tensor: must be a torch.Tensor"):
        fwd.execute(None, p.k, p.v, out, plan, lse)
    fwd.execute(p.q, p.k, p.v, out, plan, lse)

    do = torch.randn(out.shape)
    dq, dk, dv = (torch.empty_like(t) for t in (p.q, p.k, p.v))
    bwd = fs.FlexAttentionBwd(p.q, p.k, p.v, out, do, lse, dq, dk, dv, plan)
    bwd.compile()
    ws = torch.empty(bwd.workspace_size, dtype=torch.uint8)
    pre = r"^FlexAttentionBwd\.execute: "
    with pytest.raises(ValueError, match=pre + r"mask_plan: geometry .* differs"):  # from the C layer
        bwd.execute(p.q, p.k, p.v, out, do, lse, dq, dk, dv, plan_other, workspace=ws)
    with pytest.raises(ValueError, match=pre + r"dk_tensor: dtype"):
        bwd.execute(p.q, p.k, p.v, out, do, lse, dq, dk.double(), dv, plan, workspace=ws)
    with pytest.raises(TypeError, match=pre + r"mask_plan: must be a flashspan.MaskPlan"):
        bwd.execute(p.q, p.k, p.v, out, do, lse, dq, dk, dv, "plan", workspace=ws)
    plan_closed = fs.create_mask_plan(p.mask_func, p.q, p.k, p.v, build_backward=True)
    plan_closed.close()
    with pytest.raises(ValueError, match=pre + r"mask_plan: this MaskPlan was closed"):
        bwd.execute(p.q, p.k, p.v, out, do, lse, dq, dk, dv, plan_closed, workspace=ws)
    if bwd.workspace_size:
        with pytest.raises(ValueError, match=pre + r"workspace"):
            bwd.execute(p.q, p.k, p.v, out, do, lse, dq, dk, dv, plan, workspace=None)
    bwd.execute(p.q, p.k, p.v, out, do, lse, dq, dk, dv, plan, workspace=ws)
    with pytest.raises(ValueError, match=r"^FlexAttentionBwd: sample_mask_plan: needs a plan built with backward"):
        fs.FlexAttentionBwd(p.q, p.k, p.v, out, do, lse, dq, dk, dv,
                            fs.create_mask_plan(p.mask_func, p.q, p.k, p.v, build_backward=False))


def test_constructor_checks(fs):
    p = make_problem(6, batch=2, seqlen_q=16, seqlen_k=16, hq=2, hkv=2)
    plan = fs.create_mask_plan(p.mask_func, p.q, p.k, p.v, build_backward=False)
    out, lse, ml = _buffers(p, plan)
    with pytest.raises(ValueError, match="sample_o: "):
        fs.FlexAttentionFwd(p.q, p.k, p.v, out[:, :8], plan, lse)
    with pytest.raises(TypeError, match="sample_lse: dtype must be float32"):
        fs.FlexAttentionFwd(p.q, p.k, p.v, out, plan, lse.half())
    with pytest.raises(ValueError, match="sample_max_logit: "):
        fs.FlexAttentionFwd(p.q, p.k, p.v, out, plan, lse, sample_max_logit=ml[:1])
    with pytest.raises(ValueError, match="softmax_scale: must be non-negative"), pytest.warns(DeprecationWarning):
        fs.FlexAttentionFwd(p.q, p.k, p.v, out, plan, lse, sample_max_logit=ml, softmax_scale=-1.0)
    fwd = fs.FlexAttentionFwd(p.q, p.k, p.v, out, plan, lse, sample_max_logit=ml)
    fwd.compile()
    with pytest.raises(ValueError, match="softmax_scale: must be non-negative"):
        fwd.execute(p.q, p.k, p.v, out, plan, lse, softmax_scale=-1.0, max_logit_tensor=ml)
    dq, dk, dv = torch.empty_like(p.q), torch.empty_like(p.k), torch.empty_like(p.v)
    with pytest.raises(ValueError, match="built with backward metadata"):
        fs.FlexAttentionBwd(p.q, p.k, p.v, out, out, lse, dq, dk, dv, plan)
    plan_b = fs.create_mask_plan(p.mask_func, p.q, p.k, p.v, build_backward=True)
    with pytest.raises(ValueError, match="dk: "):
        fs.FlexAttentionBwd(p.q, p.k, p.v, out, out, lse, dq, dk[:1], dv, plan_b)


def test_backward_execute_needs_plan_with_backward(fs):
    p = make_problem(7, batch=1, seqlen_q=16, seqlen_k=16, hq=2, hkv=2)
    plan_b = fs.create_mask_plan(p.mask_func, p.q, p.k, p.v, build_backward=True)
    plan_f = fs.create_mask_plan(p.mask_func, p.q, p.k, p.v, build_backward=False)
    out, lse, _ = _buffers(p, plan_b)
    fwd = fs.FlexAttentionFwd(p.q, p.k, p.v, out, plan_f, lse)  # forward accepts either
    fwd.check_support()
    fwd.compile()
    fwd.execute(p.q, p.k, p.v, out, plan_b, lse)
    dq, dk, dv = torch.empty_like(p.q), torch.empty_like(p.k), torch.empty_like(p.v)
    bwd = fs.FlexAttentionBwd(p.q, p.k, p.v, out, out, lse, dq, dk, dv, plan_b, deterministic=True)
    bwd.check_support()
    bwd.compile()
    with pytest.raises(ValueError, match="without backward metadata"):
        bwd.execute(p.q, p.k, p.v, out, out, lse, dq, dk, dv, plan_f, workspace=None)


def test_softmax_scale_at_execute(fs):
    """The seed takes the scale at execute(): one compiled object serves every scale."""
    p = make_problem(8, batch=1, seqlen_q=12, seqlen_k=12, hq=1, hkv=1)
    plan = fs.create_mask_plan(p.mask_func, p.q, p.k, p.v, build_backward=True)
    out, lse, _ = _buffers(p, plan)
    fwd = fs.FlexAttentionFwd(p.q, p.k, p.v, out, plan, lse)
    fwd.check_support()
    fwd.compile()
    assert fwd.workspace_size == 0  # CPU: no workspace needed
    for scale in (0.7, None, 0.0, -0.3):
        out.fill_(float("nan"))
        fwd.execute(p.q, p.k, p.v, out, plan, lse, softmax_scale=scale)
        assert_close(out, p.reference(scale=scale)[0], torch.float32, f"out at scale {scale}")
    # Backward with the scale at execute equals autograd of the reference at that scale.
    do = torch.randn(out.shape, generator=torch.Generator().manual_seed(1))
    dq, dk, dv = (torch.full_like(t, float("nan")) for t in (p.q, p.k, p.v))
    bwd = fs.FlexAttentionBwd(p.q, p.k, p.v, out, do, lse, dq, dk, dv, plan)
    bwd.compile()
    for scale in (0.7, None):
        fwd.execute(p.q, p.k, p.v, out, plan, lse, softmax_scale=scale)
        bwd.execute(p.q, p.k, p.v, out, do, lse, dq, dk, dv, plan, workspace=None, softmax_scale=scale)
        leaves = [t.detach().double().requires_grad_(True) for t in (p.q, p.k, p.v)]
        want = torch.autograd.grad((p.reference(*leaves, scale=scale)[0] * do.double()).sum(), leaves)
        for name, g, w in zip("qkv", (dq, dk, dv), want):
            assert_close(g, w, torch.float32, f"d{name} at scale {scale}", factor=4)


def test_deprecated_construction_scale_is_the_execute_default(fs):
    p = make_problem(8, batch=1, seqlen_q=12, seqlen_k=12, hq=1, hkv=1)
    plan = fs.create_mask_plan(p.mask_func, p.q, p.k, p.v)
    out, lse, _ = _buffers(p, plan)
    with pytest.warns(DeprecationWarning, match="softmax_scale"):
        fwd = fs.FlexAttentionFwd(p.q, p.k, p.v, out, plan, lse, softmax_scale=0.7)
    fwd.compile()
    fwd.execute(p.q, p.k, p.v, out, plan, lse)
    assert_close(out, p.reference(scale=0.7)[0], torch.float32, "out")
    fwd.execute(p.q, p.k, p.v, out, plan, lse, softmax_scale=0.2)  # the call's own scale wins
    assert_close(out, p.reference(scale=0.2)[0], torch.float32, "out")


def test_one_op_shared_by_threads(fs):
    # Compiled objects may be shared by concurrent callers, each with its own outputs.
    import threading

    p = make_problem(9, batch=2, seqlen_q=40, seqlen_k=40, hq=2, hkv=2, nfunc=3)
    plan = fs.create_mask_plan(p.mask_func, p.q, p.k, p.v)
    out0, lse0, _ = _buffers(p, plan)
    fwd = fs.FlexAttentionFwd(p.q, p.k, p.v, out0, plan, lse0)
    fwd.check_support()
    fwd.compile()
    problems = [make_problem(200 + i, batch=2, seqlen_q=40, seqlen_k=40, hq=2, hkv=2, nfunc=3) for i in range(4)]
    results, errors = {}, []

    def worker(i):
        try:
            pp = problems[i]
            out, lse, _ = _buffers(pp, plan)
            for _ in range(5):
                fwd.execute(pp.q, pp.k, pp.v, out, plan, lse)
            results[i] = out
        except Exception as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    for i, pp in enumerate(problems):
        pp.mask_func = p.mask_func
        assert_close(results[i], pp.reference()[0], torch.float32, f"out of thread {i}")


def test_compile_runs_check_support(fs):
    p = make_problem(10, batch=1, seqlen_q=12, seqlen_k=12, hq=1, hkv=1)
    plan = fs.create_mask_plan(p.mask_func, p.q, p.k, p.v)
    out, lse, _ = _buffers(p, plan)
    fwd = fs.FlexAttentionFwd(p.q, p.k, p.v, out, plan, lse)
    fwd.compile()  # check_support() implied
    fwd.execute(p.q, p.k, p.v, out, plan, lse)
    assert_close(out, p.reference()[0], torch.float32, "out")


def test_backward_with_dlse(fs):
    """dlse (gradient w.r.t. the forward's LSE) through the explicit API matches autograd of the
    reference; its presence is part of the compiled descriptors."""
    p = make_problem(6, batch=2, seqlen_q=19, seqlen_k=23, hq=4, hkv=2, hm=1, nfunc=3, dqk=16, dv=16)
    plan = fs.create_mask_plan(p.mask_func, p.q, p.k, p.v, build_backward=True)
    out, lse, _ = _buffers(p, plan)
    fwd = fs.FlexAttentionFwd(p.q, p.k, p.v, out, plan, lse)
    fwd.compile()
    fwd.execute(p.q, p.k, p.v, out, plan, lse)
    gen = torch.Generator().manual_seed(5)
    do = torch.randn(out.shape, generator=gen)
    dlse = torch.randn(lse.shape, generator=gen)
    dq, dk, dv = (torch.full_like(t, float("nan")) for t in (p.q, p.k, p.v))
    bwd = fs.FlexAttentionBwd(p.q, p.k, p.v, out, do, lse, dq, dk, dv, plan, dlse)
    assert bwd.has_dlse
    bwd.compile()
    bwd.execute(p.q, p.k, p.v, out, do, lse, dq, dk, dv, plan, dlse, workspace=None)
    leaves = [t.detach().double().requires_grad_(True) for t in (p.q, p.k, p.v)]
    ref_out, ref_lse = p.reference(*leaves)[:2]
    fin = torch.isfinite(ref_lse)
    loss = (ref_out * do.double()).sum() + (ref_lse[fin] * dlse.double()[fin]).sum()
    want = torch.autograd.grad(loss, leaves)
    for name, g, w in zip("qkv", (dq, dk, dv), want):
        assert_close(g, w, torch.float32, f"d{name}", factor=4)
    with pytest.raises(ValueError, match="dlse"):
        bwd.execute(p.q, p.k, p.v, out, do, lse, dq, dk, dv, plan, workspace=None)
    plain = fs.FlexAttentionBwd(p.q, p.k, p.v, out, do, lse, dq, dk, dv, plan)
    plain.compile()
    with pytest.raises(ValueError, match="dlse"):
        plain.execute(p.q, p.k, p.v, out, do, lse, dq, dk, dv, plan, dlse_tensor=dlse, workspace=None)
    with pytest.warns(DeprecationWarning, match="'dlse'"):
        old = fs.FlexAttentionBwd(p.q, p.k, p.v, out, do, lse, dq, dk, dv, plan, dlse=dlse)
    assert old.has_dlse
