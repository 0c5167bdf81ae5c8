"""The seed's usage examples (seeds/flex_attention.txt) with `import flashspan`: CPU-sized versions always, the
original sizes on a GPU."""

import flashspan
import pytest
import torch
from conftest import cuda_ready
from criteria import check_tensor
from flashspan import FlexAttentionBwd, FlexAttentionFwd, create_mask_plan, flex_attn_func
from flex_ref import assert_close

DEVICES = ["cpu"] + (["cuda"] if cuda_ready() else [])
# Outputs, gradients and workspaces allocated during the tests start as NaN (conftest.py).
pytestmark = pytest.mark.usefixtures("poison_uninitialized")


def _causal_sdpa_grads(q, k, v, do):
    """fp32 SDPA (causal, BSHD) output and gradients w.r.t. q, k, v for the upstream gradient `do`."""
    leaves = [t.detach().float().requires_grad_(True) for t in (q, k, v)]
    ref = torch.nn.functional.scaled_dot_product_attention(*(t.transpose(1, 2) for t in leaves),
                                                           is_causal=True).transpose(1, 2)
    return ref, torch.autograd.grad(ref, leaves, do.float())


def _check_grads(got, want, dtype, what):
    for name, g, w in zip("qkv", got, want):
        if dtype == torch.float32:
            assert_close(g, w, torch.float32, f"{what} d{name}", factor=4)
        else:
            check_tensor(g, w, dtype, f"{what} d{name}")


def _sizes(device):
    # The seed's sizes on a GPU; small ones for the CPU reference backend.
    return (4096, 8, 128, torch.bfloat16) if device == "cuda" else (96, 2, 32, torch.float32)


@pytest.mark.parametrize("device", DEVICES)
def test_fixed_length_bshd_example(device):
    S, H, D, dtype = _sizes(device)
    B = 1
    q = torch.randn(B, S, H, D, device=device, dtype=dtype, requires_grad=True)
    k = torch.randn_like(q)
    v = torch.randn_like(q)
    # Causal row q sees local key indices [0, q + 1).
    mask_func = torch.arange(1, S + 1, device=device, dtype=torch.int32).view(1, 1, S)
    plan = create_mask_plan(mask_func, q, k, v)
    out, lse = flex_attn_func(q, k, v, mask_plan=plan, return_lse=True)
    do = torch.randn_like(out)
    out.backward(do)
    ref, want = _causal_sdpa_grads(q, k, v, do)
    torch.testing.assert_close(out.float(), ref, atol=2e-2 if dtype == torch.bfloat16 else 1e-4, rtol=0)
    _check_grads((q.grad,), want, dtype, "causal BSHD")  # k, v (randn_like) do not require grad

    out, lse, max_logit = flex_attn_func(q, k, v, mask_plan=plan, return_lse=True, return_max_logit=True)
    assert max_logit.shape == (H,) and lse.shape == (B, H, S)


@pytest.mark.parametrize("device", DEVICES)
def test_variable_length_thd_example(device):
    q_lengths = (192, 128)
    k_lengths = (160, 96)
    cu_q = torch.tensor((0, 192, 320), device=device, dtype=torch.int32)
    cu_k = torch.tensor((0, 160, 256), device=device, dtype=torch.int32)
    Hq, Hkv, D = 8, 2, 128
    dtype = torch.float16 if device == "cuda" else torch.float32
    q = torch.randn(320, Hq, D, device=device, dtype=dtype, requires_grad=True)
    k = torch.randn(256, Hkv, D, device=device, dtype=dtype, requires_grad=True)
    v = torch.randn(256, Hkv, D, device=device, dtype=dtype, requires_grad=True)
    # Each query sees its whole sample-local K sequence.
    endpoints = torch.cat(
        [torch.full((q_length,), k_length, device=device, dtype=torch.int32)
         for q_length, k_length in zip(q_lengths, k_lengths)]
    )
    mask_func = endpoints.view(1, 1, -1)
    plan = create_mask_plan(
        mask_func, q, k, v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=max(q_lengths),
        max_seqlen_k=max(k_lengths),
    )
    out, lse = flex_attn_func(q, k, v, mask_plan=plan, return_lse=True)
    assert out.shape == (320, Hq, D) and lse.shape == (Hq, 320)
    # Sample 0 vs dense attention over its own keys.
    ref = torch.nn.functional.scaled_dot_product_attention(
        q[:192].detach().transpose(0, 1).float(),
        k[:160].detach().transpose(0, 1).float().repeat_interleave(4, 0),
        v[:160].detach().transpose(0, 1).float().repeat_interleave(4, 0),
    ).transpose(0, 1)
    torch.testing.assert_close(out[:192].float(), ref, atol=2e-3 if dtype == torch.float16 else 1e-4, rtol=0)


@pytest.mark.parametrize("device", DEVICES)
def test_plan_reuse_loop_example(device):
    S, H, D, dtype = _sizes(device)
    S = min(S, 1024)
    q_sample = torch.randn(1, S, H, D, device=device, dtype=dtype)
    mask_func = torch.arange(1, S + 1, device=device, dtype=torch.int32).view(1, 1, S)
    plan = create_mask_plan(mask_func, q_sample, q_sample, q_sample, build_backward=True)
    inputs_with_the_same_geometry = [
        tuple(torch.randn_like(q_sample).requires_grad_(True) for _ in range(3)) for _ in range(2)
    ]
    for i, (q, k, v) in enumerate(inputs_with_the_same_geometry):
        out = flex_attn_func(q, k, v, mask_plan=plan)
        do = torch.randn_like(out)
        out.backward(do)
        _, want = _causal_sdpa_grads(q, k, v, do)
        _check_grads((q.grad, k.grad, v.grad), want, dtype, f"input set {i}")


@pytest.mark.parametrize("device", DEVICES)
def test_explicit_compile_execute_example(device):
    S, H, D, dtype = _sizes(device)
    q = torch.randn(1, S, H, D, device=device, dtype=dtype)
    k, v = torch.randn_like(q), torch.randn_like(q)
    mask_func = torch.arange(1, S + 1, device=device, dtype=torch.int32).view(1, 1, S)
    plan = create_mask_plan(mask_func, q, k, v, build_backward=True)
    out = torch.empty((*q.shape[:-1], v.shape[-1]), dtype=q.dtype, device=q.device)
    lse = torch.empty((q.shape[0], q.shape[2], q.shape[1]), dtype=torch.float32, device=q.device)
    fwd = FlexAttentionFwd(q, k, v, out, plan, lse)
    fwd.check_support()
    fwd.compile()
    fwd_workspace = torch.empty(fwd.workspace_size, device=q.device, dtype=torch.uint8)
    fwd.execute(q, k, v, out, plan, lse, workspace=fwd_workspace)
    do = torch.randn_like(out)
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    bwd = FlexAttentionBwd(q, k, v, out, do, lse, dq, dk, dv, plan)
    bwd.check_support()
    bwd.compile()
    bwd_workspace = torch.empty(bwd.workspace_size, device=q.device, dtype=torch.uint8)
    bwd.execute(q, k, v, out, do, lse, dq, dk, dv, plan, workspace=bwd_workspace)
    # Same results as the autograd path.
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    o2 = flashspan.flex_attn_func(*leaves, mask_plan=plan)
    g2 = torch.autograd.grad(o2, leaves, do)
    torch.testing.assert_close(out, o2, atol=0, rtol=0)
    for a, b in zip((dq, dk, dv), g2):
        torch.testing.assert_close(a, b, atol=1e-2, rtol=1e-2)


@pytest.mark.parametrize("device", DEVICES)
def test_explicit_api_with_max_logit_example(device):
    """The seed's "enable the maximum statistic in the explicit API" paragraph: a contiguous fp32 [Hq]
    sample buffer at construction, max_logit_tensor=... on every execute(), reset to -inf by each call."""
    S, H, D, dtype = _sizes(device)
    q = torch.randn(1, S, H, D, device=device, dtype=dtype)
    k, v = torch.randn_like(q), torch.randn_like(q)
    mask_func = torch.arange(1, S + 1, device=device, dtype=torch.int32).view(1, 1, S)
    plan = create_mask_plan(mask_func, q, k, v)
    out = torch.empty((*q.shape[:-1], v.shape[-1]), dtype=q.dtype, device=q.device)
    lse = torch.empty((q.shape[0], q.shape[2], q.shape[1]), dtype=torch.float32, device=q.device)
    max_logit = torch.full((H,), float("nan"), dtype=torch.float32, device=q.device)
    fwd = FlexAttentionFwd(q, k, v, out, plan, lse, sample_max_logit=max_logit)
    fwd.check_support()
    fwd.compile()
    workspace = torch.empty(fwd.workspace_size, device=q.device, dtype=torch.uint8)
    for scale in (None, 0.25):
        max_logit.fill_(float("inf"))  # stale contents: every call resets the buffer first
        fwd.execute(q, k, v, out, plan, lse, workspace=workspace, softmax_scale=scale, max_logit_tensor=max_logit)
        want_out, want_lse, want_ml = flex_attn_func(
            q, k, v, mask_plan=plan, softmax_scale=scale, return_lse=True, return_max_logit=True
        )
        torch.testing.assert_close(out, want_out, atol=0, rtol=0)
        torch.testing.assert_close(max_logit, want_ml, atol=0, rtol=0)
        s = (D ** -0.5) if scale is None else scale
        logits = s * torch.einsum("bqhd,bkhd->bhqk", q.float(), k.float())
        causal = torch.ones(S, S, dtype=torch.bool, device=device).tril()
        ref = logits.masked_fill(~causal, float("-inf")).amax(dim=(0, 2, 3))
        torch.testing.assert_close(max_logit, ref, atol=2e-2, rtol=1e-2)
