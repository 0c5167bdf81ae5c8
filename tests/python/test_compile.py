"""torch.compile(fullgraph=True) over flex_attn_func on CPU, and opcheck of the custom ops' fake kernels."""

import pytest
import torch
from flex_ref import assert_close, make_problem

BACKENDS = ["eager", "aot_eager", "inductor"]


def _attn(fs):
    def f(q, k, v, plan):
        out, lse = fs.flex_attn_func(q, k, v, mask_plan=plan, return_lse=True)
        return torch.tanh(out) * 2, lse + 1

    return f


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("varlen", [False, True])
def test_compile_fullgraph_forward_backward(fs, backend, varlen):
    torch._dynamo.reset()
    p = make_problem(1, varlen=varlen, batch=2, seqlen_q=24, seqlen_k=20, hq=4, hkv=2, nfunc=3, requires_grad=True)
    plan = fs.create_mask_plan(p.mask_func, p.q, p.k, p.v, **p.plan_kwargs())
    f = _attn(fs)
    cf = torch.compile(f, backend=backend, fullgraph=True)
    o, lse = cf(p.q, p.k, p.v, plan)
    lse = lse.masked_fill(torch.isinf(lse.detach()), 0)
    got = torch.autograd.grad(o.sum() + lse.sum(), (p.q, p.k, p.v))
    o2, l2 = f(p.q, p.k, p.v, plan)
    l2 = l2.masked_fill(torch.isinf(l2.detach()), 0)
    want = torch.autograd.grad(o2.sum() + l2.sum(), (p.q, p.k, p.v))
    assert_close(o, o2, torch.float32, "out")
    for name, g, w in zip("qkv", got, want):
        assert_close(g, w, torch.float32, f"d{name}")


def test_compiled_function_with_second_plan(fs):
    torch._dynamo.reset()
    p = make_problem(2, batch=1, seqlen_q=16, seqlen_k=16, hq=2, hkv=2)
    plans = []
    for seed in (3, 4):
        pp = make_problem(seed, batch=1, seqlen_q=16, seqlen_k=16, hq=2, hkv=2)
        plans.append((pp, fs.create_mask_plan(pp.mask_func, p.q, p.k, p.v)))
    cf = torch.compile(lambda q, k, v, plan: fs.flex_attn_func(q, k, v, mask_plan=plan), backend="aot_eager", fullgraph=True)
    for pp, plan in plans:
        pp.q, pp.k, pp.v = p.q, p.k, p.v
        assert_close(cf(p.q, p.k, p.v, plan), pp.reference()[0], torch.float32, "out")


def test_compile_no_grad_with_max_logit(fs):
    torch._dynamo.reset()
    p = make_problem(5, batch=2, seqlen_q=16, seqlen_k=16, hq=2, hkv=1)
    plan = fs.create_mask_plan(p.mask_func, p.q, p.k, p.v)
    cf = torch.compile(
        lambda q, k, v: fs.flex_attn_func(q, k, v, mask_plan=plan, return_max_logit=True), backend="aot_eager", fullgraph=True
    )
    with torch.no_grad():
        out, ml = cf(p.q, p.k, p.v)
    ro, _, rm = p.reference()
    assert_close(out, ro, torch.float32, "out")
    assert_close(ml, rm, torch.float32, "max_logit")


def test_opcheck_custom_ops(fs):
    p = make_problem(6, batch=1, seqlen_q=12, seqlen_k=10, hq=2, hkv=1, dqk=16, dv=8)
    plan = fs.create_mask_plan(p.mask_func, p.q, p.k, p.v, build_backward=True)
    for ml in (False, True):
        torch.library.opcheck(torch.ops.flashspan.flex_fwd.default, (p.q, p.k, p.v, plan.id, None, ml))
    out, lse, _ = torch.ops.flashspan.flex_fwd(p.q, p.k, p.v, plan.id, 0.5, False)
    do = torch.randn_like(out)
    dlse = torch.randn_like(lse)
    for dl in (None, dlse):
        torch.library.opcheck(
            torch.ops.flashspan.flex_bwd.default, (p.q, p.k, p.v, out, do, lse, dl, plan.id, 0.5, False)
        )
