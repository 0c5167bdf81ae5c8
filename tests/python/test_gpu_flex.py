"""GPU tests of the PyTorch frontend (skipped without a CUDA device): accuracy vs a float32 math reference,
gradients, torch.compile, CUDA-graph capture of the explicit API, plan reuse across streams, THD.

Error criteria: criteria.py (relative L2 + max-abs for outputs and gradients, 2e-3 absolute for LSE /
max_logit). Every test runs with PyTorch's uninitialized-memory fill on (conftest.py poison_uninitialized):
outputs, gradients and workspaces the library allocates start as NaN / 0xFF, so an element a kernel
forgets to write fails the comparison.
"""

import pytest
import torch
from conftest import cuda_ready
from criteria import check_stat, check_tensor, grad_floor, random_softmax_scale, softmax_scale_of_kind
from flex_ref import make_problem
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytestmark = [
    pytest.mark.skipif(not cuda_ready(),
                       reason="needs a CUDA device and a libflashspan.so built with CUDA (fs_cuda_available() == 1)"),
    pytest.mark.usefixtures("poison_uninitialized"),
]

LOWP = [torch.bfloat16, torch.float16]


def test_poisoning_is_active():
    # The fixture's fill really reaches small CUDA allocations (the caching allocator's small pool).
    assert torch.isnan(torch.empty(7, device="cuda")).all()
    assert torch.isnan(torch.empty(3, 5, dtype=torch.bfloat16, device="cuda")).all()
    assert (torch.empty(9, dtype=torch.uint8, device="cuda") == 255).all()


def _problem(seed, dtype, varlen, **kw):
    base = dict(batch=2, seqlen_q=300, seqlen_k=257, hq=4, hkv=2, hm=1, nfunc=3, dqk=64, dv=64)
    if varlen:
        base.update(batch=3, seqlen_q=[300, 1, 129], seqlen_k=[190, 64, 257])
    base.update(kw)
    return make_problem(seed, varlen=varlen, dtype=dtype, device="cuda", **base)


@pytest.mark.parametrize("dtype", LOWP)
@pytest.mark.parametrize("varlen", [False, True])
@pytest.mark.parametrize("hm,mask", [(1, "random"), (4, "random"), (1, "causal"), (4, "blocks")])
@pytest.mark.parametrize("scale_kind", ["default", "zero", "positive", "negative"])
def test_forward_vs_fp32_reference(fs, dtype, varlen, hm, mask, scale_kind):
    p = _problem(1 + hm, dtype, varlen, hm=hm, mask=mask)
    plan = fs.create_mask_plan(p.mask_func, p.q, p.k, p.v, **p.plan_kwargs())
    assert plan.device.type == "cuda"
    # A negative scale and max_logit exclude each other: max_logit is then not requested.
    want_ml = scale_kind != "negative"
    scale = softmax_scale_of_kind(scale_kind, 1 + hm + 8 * varlen, p.q.shape[-1])
    res = fs.flex_attn_func(p.q, p.k, p.v, mask_plan=plan, softmax_scale=scale, return_lse=True,
                            return_max_logit=want_ml)
    r32 = p.reference(scale=scale, dtype=torch.float32)
    check_tensor(res[0], r32[0], dtype, "out")
    check_stat(res[1], r32[1], "lse")
    if want_ml:
        check_stat(res[2], r32[2], "max_logit")


@pytest.mark.parametrize("dtype", LOWP)
@pytest.mark.parametrize("varlen", [False, True])
@pytest.mark.parametrize("use_lse", [False, True])
@pytest.mark.parametrize("deterministic", [False, True])
def test_backward_vs_fp32_reference(fs, dtype, varlen, use_lse, deterministic):
    p = _problem(7, dtype, varlen, requires_grad=True)
    plan = fs.create_mask_plan(p.mask_func, p.q, p.k, p.v, **p.plan_kwargs())
    assert plan.has_backward
    gen = torch.Generator(device="cuda").manual_seed(3)
    w_out = torch.randn((*p.q.shape[:-1], p.v.shape[-1]), device="cuda", generator=gen)
    w_lse = torch.randn(plan.lse_shape(), device="cuda", generator=gen)
    scale = random_softmax_scale(5 + 2 * use_lse + deterministic + 4 * varlen, p.q.shape[-1], allow_negative=True)

    def grads(fn, leaves):
        # Without use_lse the LSE is not returned at all, so the backward runs without dlse.
        if use_lse:
            out, lse = fn()
            lse = lse.masked_fill(torch.isinf(lse.detach()), 0)
            loss = (out.float() * w_out).sum() + (lse.float() * w_lse).sum()
        else:
            loss = (fn().float() * w_out).sum()
        return torch.autograd.grad(loss, leaves)

    ours = grads(lambda: fs.flex_attn_func(p.q, p.k, p.v, mask_plan=plan, softmax_scale=scale, return_lse=use_lse,
                                           deterministic=deterministic), (p.q, p.k, p.v))
    leaves = [t.detach().float().requires_grad_(True) for t in (p.q, p.k, p.v)]

    def ref():
        o, l_, _ = p.reference(*leaves, scale=scale, dtype=torch.float32)
        return (o, l_) if use_lse else o

    want = grads(ref, leaves)
    for name, g, w in zip("qkv", ours, want):
        assert g.dtype == dtype
        check_tensor(g, w, dtype, f"d{name}")


def test_deterministic_backward_is_bitwise_reproducible(fs):
    p = _problem(9, torch.bfloat16, False, hq=8, hkv=1, requires_grad=True)
    plan = fs.create_mask_plan(p.mask_func, p.q, p.k, p.v)
    runs = []
    for _ in range(3):
        out = fs.flex_attn_func(p.q, p.k, p.v, mask_plan=plan, deterministic=True)
        runs.append(torch.autograd.grad(out.float().sum(), (p.q, p.k, p.v)))
    for r in runs[1:]:
        for a, b in zip(runs[0], r):
            assert torch.equal(a, b)


def test_cuda_plan_equals_host_plan(fs):
    # Host and CUDA planners lay out the same consumer: every array must agree bitwise. The CUDA
    # plan's family may be chosen by the device (sm90 on Hopper); the host plan is asked for the same.
    p = _problem(11, torch.bfloat16, True, hm=4)
    plan_gpu = fs.create_mask_plan(p.mask_func, p.q, p.k, p.v, build_backward=True, **p.plan_kwargs())
    cpu = {n: (t.cpu() if isinstance(t, torch.Tensor) else t) for n, t in p.plan_kwargs().items()}
    plan_cpu = fs.create_mask_plan(p.mask_func.cpu(), p.q.cpu(), p.k.cpu(), p.v.cpu(), build_backward=True,
                                   arch=plan_gpu.arch, **cpu)
    assert plan_cpu.arch == plan_gpu.arch
    g, c = plan_gpu.arrays(), plan_cpu.arrays()
    for name in g:
        assert name in c, name
        assert (g[name] == c[name]).all(), f"{name} differs between the CUDA and the host planner"
    assert plan_gpu.info()["fwd_partial_blocks"] == plan_cpu.info()["fwd_partial_blocks"]


@pytest.mark.no_poison  # compared with the eager call, not a reference; compile under deterministic mode is not the subject
@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_torch_compile(fs, backend):
    torch._dynamo.reset()
    p = _problem(13, torch.bfloat16, False, requires_grad=True)
    plan = fs.create_mask_plan(p.mask_func, p.q, p.k, p.v)

    def f(q, k, v):
        out, lse = fs.flex_attn_func(q, k, v, mask_plan=plan, return_lse=True)
        return out.float().square().sum() + lse.masked_fill(torch.isinf(lse), 0).sum()

    cf = torch.compile(f, backend=backend, fullgraph=True)
    got = torch.autograd.grad(cf(p.q, p.k, p.v), (p.q, p.k, p.v))
    want = torch.autograd.grad(f(p.q, p.k, p.v), (p.q, p.k, p.v))
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, atol=2e-2, rtol=2e-2)


def test_cuda_graph_capture_of_explicit_api(fs):
    p = _problem(15, torch.bfloat16, False, hq=4, hkv=4)
    plan = fs.create_mask_plan(p.mask_func, p.q, p.k, p.v, build_backward=True)
    q, k, v = (t.clone() for t in (p.q, p.k, p.v))  # static inputs of the graph
    out = torch.full(plan.out_shape(), float("nan"), dtype=q.dtype, device="cuda")
    lse = torch.full(plan.lse_shape(), float("nan"), device="cuda")
    ml = torch.full((plan.num_heads_q,), float("nan"), device="cuda")
    do = torch.randn_like(out)
    dq, dk, dv = (torch.full_like(t, float("nan")) for t in (q, k, v))
    fwd = fs.FlexAttentionFwd(q, k, v, out, plan, lse, sample_max_logit=ml)
    bwd = fs.FlexAttentionBwd(q, k, v, out, do, lse, dq, dk, dv, plan)
    for op in (fwd, bwd):
        op.check_support()
        op.compile()
    fws = torch.empty(fwd.workspace_size, dtype=torch.uint8, device="cuda")
    bws = torch.empty(bwd.workspace_size, dtype=torch.uint8, device="cuda")

    def step():
        fwd.execute(q, k, v, out, plan, lse, workspace=fws, max_logit_tensor=ml)
        bwd.execute(q, k, v, out, do, lse, dq, dk, dv, plan, workspace=bws)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()  # warm up outside capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    # New values into the static inputs; poison outputs; replay.
    p2 = _problem(16, torch.bfloat16, False, hq=4, hkv=4)
    p2.mask_func = p.mask_func
    for dst, src in zip((q, k, v), (p2.q, p2.k, p2.v)):
        dst.copy_(src)
    for t in (out, lse, ml, dq, dk, dv):
        t.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    # Eager allocating path on the same inputs gives the reference for the replay.
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    o2, l2, m2 = fs.flex_attn_func(*leaves, mask_plan=plan, return_lse=True, return_max_logit=True)
    g2 = torch.autograd.grad(o2, leaves, do)
    torch.testing.assert_close(out, o2, atol=0, rtol=0)
    torch.testing.assert_close(lse, l2, atol=0, rtol=0)
    torch.testing.assert_close(ml, m2, atol=0, rtol=0)  # reset to -inf by each replay, then reduced
    for a, b in zip((dq, dk, dv), g2):
        torch.testing.assert_close(a, b, atol=2e-2, rtol=2e-2)


def test_plan_reuse_across_two_streams(fs):
    p = _problem(17, torch.float16, True)
    plan = fs.create_mask_plan(p.mask_func, p.q, p.k, p.v, **p.plan_kwargs())
    inputs = [(p.q, p.k, p.v)]
    p2 = _problem(18, torch.float16, True)
    inputs.append((p2.q, p2.k, p2.v))
    streams = [torch.cuda.Stream(), torch.cuda.Stream()]
    outs = []
    torch.cuda.synchronize()
    for s, (q, k, v) in zip(streams, inputs):
        with torch.cuda.stream(s):
            outs.append(fs.flex_attn_func(q, k, v, mask_plan=plan))
    torch.cuda.synchronize()
    for o, (q, k, v) in zip(outs, inputs):
        check_tensor(o, p.reference(q, k, v, dtype=torch.float32)[0], torch.float16, "out")


def test_cuda_errors(fs):
    p = _problem(19, torch.bfloat16, False)
    plan = fs.create_mask_plan(p.mask_func, p.q, p.k, p.v)
    with pytest.raises(ValueError, match="built for cuda"):
        fs.flex_attn_func(p.q.cpu(), p.k.cpu(), p.v.cpu(), mask_plan=plan)
    with pytest.raises(TypeError, match="dtype"):
        fs.create_mask_plan(p.mask_func, p.q.float(), p.k, p.v)
    out = torch.empty(plan.out_shape(), dtype=p.q.dtype, device="cuda")
    fwd = fs.FlexAttentionFwd(p.q, p.k, p.v, out, plan)
    fwd.check_support()
    fwd.compile()
    if fwd.workspace_size > 0:
        with pytest.raises(ValueError, match="workspace"):
            fwd.execute(p.q, p.k, p.v, out, plan, workspace=torch.empty(0, dtype=torch.uint8, device="cuda"))


@pytest.mark.parametrize("dtype", LOWP)
def test_outlier_inputs(fs, dtype):
    # Large logits (|s| up to ~100) stress the online softmax rescaling.
    p = _problem(21, dtype, False)
    gen = torch.Generator(device="cuda").manual_seed(5)
    p.q = (p.q.float() * 6 + torch.randn(p.q.shape, device="cuda", generator=gen).abs() * 4).to(dtype)
    plan = fs.create_mask_plan(p.mask_func, p.q, p.k, p.v)
    out, lse = fs.flex_attn_func(p.q, p.k, p.v, mask_plan=plan, return_lse=True)
    r32 = p.reference(dtype=torch.float32)
    check_tensor(out, r32[0], dtype, "out")
    check_stat(lse, r32[1], "lse")


def test_strided_packed_qkv(fs):
    # q/k/v as views of one packed [B, S, 3, H, D] buffer: only the last dimension is contiguous.
    p = _problem(23, torch.bfloat16, False, seqlen_q=257, seqlen_k=257, hq=4, hkv=4, requires_grad=False)
    qkv = torch.stack([p.q, p.k, p.v], dim=2).requires_grad_(True)
    q, k, v = qkv.unbind(2)
    plan = fs.create_mask_plan(p.mask_func, q, k, v)
    out = fs.flex_attn_func(q, k, v, mask_plan=plan)
    (dqkv,) = torch.autograd.grad(out.float().sum(), (qkv,))
    leaves = [t.detach().float().requires_grad_(True) for t in (p.q, p.k, p.v)]
    ref = p.reference(*leaves, dtype=torch.float32)[0]
    want = torch.autograd.grad(ref.sum(), leaves)
    check_tensor(out, ref, torch.bfloat16, "out")
    for i, w in enumerate(want):
        check_tensor(dqkv[:, :, i], w, torch.bfloat16, f"d{'qkv'[i]}")


@pytest.mark.no_poison
def test_torch_compile_reduce_overhead_cuda_graphs(fs):
    # torch.compile's CUDA-graph mode captures the custom ops (allocation from the graph pool).
    torch._dynamo.reset()
    p = _problem(25, torch.bfloat16, False, requires_grad=True)
    plan = fs.create_mask_plan(p.mask_func, p.q, p.k, p.v)

    def f(q, k, v):
        return fs.flex_attn_func(q, k, v, mask_plan=plan).float().square().sum()

    cf = torch.compile(f, mode="reduce-overhead", fullgraph=True)
    for _ in range(3):  # warm-up, record, replay
        got = torch.autograd.grad(cf(p.q, p.k, p.v), (p.q, p.k, p.v))
    want = torch.autograd.grad(f(p.q, p.k, p.v), (p.q, p.k, p.v))
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, atol=2e-2, rtol=2e-2)


def test_thd_with_empty_sequences(fs):
    p = make_problem(27, varlen=True, batch=4, seqlen_q=[0, 130, 65, 1], seqlen_k=[40, 0, 200, 3], hq=4, hkv=2,
                     hm=4, nfunc=3, dqk=64, dv=64, dtype=torch.bfloat16, device="cuda", requires_grad=True)
    plan = fs.create_mask_plan(p.mask_func, p.q, p.k, p.v, **p.plan_kwargs())
    out, lse = fs.flex_attn_func(p.q, p.k, p.v, mask_plan=plan, return_lse=True)
    leaves = [t.detach().float().requires_grad_(True) for t in (p.q, p.k, p.v)]
    r32 = p.reference(*leaves, dtype=torch.float32)
    check_tensor(out, r32[0], torch.bfloat16, "out")
    check_stat(lse, r32[1], "lse")
    assert torch.all(out[0:130].float() == 0), "queries of a sample with no keys must give 0"
    got = torch.autograd.grad(out.float().sum(), (p.q, p.k, p.v))
    want = torch.autograd.grad(r32[0].sum(), leaves)
    for name, g, w in zip("qkv", got, want):
        check_tensor(g, w, torch.bfloat16, f"d{name}")


@settings(max_examples=12, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 2**31 - 1),
    varlen=st.booleans(),
    batch=st.integers(1, 3),
    sq=st.integers(1, 400),
    sk=st.integers(1, 400),
    hkv=st.integers(1, 2),
    group=st.integers(1, 3),
    per_head_mask=st.booleans(),
    nfunc=st.sampled_from([1, 3, 5]),
    dims=st.sampled_from([(64, 64), (128, 128), (32, 64), (96, 128)]),
    dtype=st.sampled_from(LOWP),
    deterministic=st.booleans(),
    mask=st.sampled_from(["random", "random", "blocks"]),
)
def test_random_geometries_forward_backward(fs, seed, varlen, batch, sq, sk, hkv, group, per_head_mask, nfunc, dims,
                                            dtype, deterministic, mask):
    hq = hkv * group
    p = make_problem(seed, varlen=varlen, batch=batch, seqlen_q=sq, seqlen_k=sk, hq=hq, hkv=hkv,
                     hm=hq if per_head_mask else 1, nfunc=nfunc, dqk=dims[0], dv=dims[1], dtype=dtype, device="cuda",
                     requires_grad=True, mask=mask)
    plan = fs.create_mask_plan(p.mask_func, p.q, p.k, p.v, **p.plan_kwargs())
    scale = random_softmax_scale(seed, dims[0], allow_negative=True)
    out, lse = fs.flex_attn_func(p.q, p.k, p.v, mask_plan=plan, softmax_scale=scale, return_lse=True,
                                 deterministic=deterministic)
    gen = torch.Generator(device="cuda").manual_seed(seed % 1000)
    w = torch.randn(out.shape, device="cuda", generator=gen)
    ours = torch.autograd.grad((out.float() * w).sum(), (p.q, p.k, p.v))
    leaves = [t.detach().float().requires_grad_(True) for t in (p.q, p.k, p.v)]
    o, l_, _ = p.reference(*leaves, scale=scale, dtype=torch.float32)
    check_tensor(out, o, dtype, "out")
    check_stat(lse, l_, "lse")
    # dQ / dK are sums of P (dP - D), which cancel where a row sees one key (S_kv = 1): their floor is the fp32
    # rounding of dP and D (criteria.grad_floor).
    big = [float(t.detach().abs().max()) for t in (p.q, p.k, p.v)]
    fl = grad_floor(dims[0] ** -0.5 if scale is None else scale, dims[1], float(w.abs().max()), big[2],
                    max(big[0], big[1]))
    for name, g, w32 in zip("qkv", ours, torch.autograd.grad((o * w).sum(), leaves)):
        check_tensor(g, w32, dtype, f"d{name}", floor=fl if name != "v" else 0.0)
