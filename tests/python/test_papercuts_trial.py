"""A new user's CPU trial (the eleven papercuts of the 'paper' branch): each fixed one has a test here."""

import re

import pytest
import torch
from conftest import cuda_ready

E4M3 = torch.float8_e4m3fn

# The empty-output backwards on both devices: the front end's fix runs before either, and on CUDA the kernels (or
# their skipping) must give the same zero gradients.
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not cuda_ready(), reason="needs a CUDA device and a libflashspan.so built with CUDA (fs_cuda_available() == 1)"))]


def _dt(dev):
    """The inputs' dtype on `dev`: the GPU kernels take 16-bit inputs, the CPU reference float32 too."""
    return torch.bfloat16 if dev == "cuda" else torch.float32


# ---------------------------------------------------------------------------
# 1. The backward of an SDPA call whose output is empty: zero gradients, in every front end
# ---------------------------------------------------------------------------


def _thd_kv(dev="cpu"):
    k = torch.randn(10, 2, 16, device=dev, dtype=_dt(dev), requires_grad=True)
    return (k, torch.zeros(3, dtype=torch.int32, device=dev),
            torch.tensor([0, 4, 10], dtype=torch.int32, device=dev))


def _expect_zero_grads(q, k):
    assert q.grad is not None and q.grad.shape == q.shape
    assert k.grad is not None and k.grad.shape == k.shape
    assert torch.equal(k.grad, torch.zeros_like(k))


@pytest.mark.parametrize("dev", DEVICES)
def test_empty_output_thd_backward_gives_zero_gradients(fs, dev):
    """.sum() of an empty output hands the backward an expanded dO of zero strides, which .contiguous() keeps (an
    empty tensor counts as contiguous): the C layer refused its ragged-offset multiplier 0."""
    for call in (
        lambda q, k, cq, ck: fs.sdpa(q, k, k, use_padding_mask=True, cu_seq_len_q=cq, cu_seq_len_kv=ck)[0],
        lambda q, k, cq, ck: fs.sdpa_torch(q, k, k, cu_seqlens_q=cq, cu_seqlens_kv=ck, max_seqlen_q=1,
                                           max_seqlen_kv=6),
        lambda q, k, cq, ck: fs.sdpa_torch(q, k, k, cu_seqlens_q=cq, cu_seqlens_kv=ck, max_seqlen_q=1,
                                           max_seqlen_kv=6, return_lse=True)[0],
    ):
        k, cq, ck = _thd_kv(dev)
        q = torch.randn(0, 2, 16, device=dev, dtype=_dt(dev), requires_grad=True)
        call(q, k, cq, ck).sum().backward()
        _expect_zero_grads(q, k)


@pytest.mark.parametrize("dev", DEVICES)
def test_empty_output_dense_backward_gives_zero_gradients(fs, dev):
    for call in (lambda q, k: fs.sdpa(q, k, k)[0], lambda q, k: fs.sdpa_torch(q, k, k),
                 lambda q, k: fs.sdpa(q, k, k, sink_token=torch.zeros(2, device=dev))[0]):
        q = torch.randn(2, 2, 0, 16, device=dev, dtype=_dt(dev), requires_grad=True)
        k = torch.randn(2, 2, 5, 16, device=dev, dtype=_dt(dev), requires_grad=True)
        call(q, k).sum().backward()
        _expect_zero_grads(q, k)


@pytest.mark.parametrize("dev", DEVICES)
def test_empty_dO_of_any_strides_in_the_explicit_backwards(fs, dev):
    """sdpa_backward and the sdpa_bwd op take an empty dO whatever its strides (it has no element)."""
    q = torch.randn(2, 2, 0, 16, device=dev, dtype=_dt(dev))
    k = torch.randn(2, 2, 5, 16, device=dev, dtype=_dt(dev))
    o, stats = fs.sdpa(q, k, k, generate_stats=True)
    dO = torch.zeros((), device=dev, dtype=o.dtype).expand(o.shape)
    dq, dk, dv = fs.sdpa_backward(q, k, k, o, dO, stats)
    assert dq.shape == q.shape and torch.equal(dk, torch.zeros_like(k)) and torch.equal(dv, torch.zeros_like(k))
    dq, dk, dv = torch.ops.flashspan.sdpa_bwd(dO, q, k, k, o, stats, 0.25)
    assert dq.shape == q.shape and torch.equal(dk, torch.zeros_like(k)) and torch.equal(dv, torch.zeros_like(k))


def test_expanded_thd_gradient_with_a_zero_token_stride(fs):
    """A non-empty expanded gradient whose last dimension is contiguous (stride 1) but whose token stride is 0, as
    (o.sum(0) * w).sum() gives, was refused the same way (ragged-offset multiplier 0)."""
    k = torch.randn(10, 2, 16)
    cu = torch.tensor([0, 4, 10], dtype=torch.int32)
    w = torch.randn(2, 16)
    grads = []
    for call in (lambda q: fs.sdpa(q, k, k, use_padding_mask=True, cu_seq_len_q=cu, cu_seq_len_kv=cu)[0],
                 lambda q: fs.sdpa_torch(q, k, k, scale=1.0, cu_seqlens_q=cu, cu_seqlens_kv=cu, max_seqlen_q=6,
                                         max_seqlen_kv=6)):
        q = torch.randn(10, 2, 16, generator=torch.Generator().manual_seed(1)).requires_grad_()
        (call(q).sum(0) * w).sum().backward()
        q2 = q.detach().clone().requires_grad_()
        (call(q2) * w).sum().backward()  # the same gradient, materialized
        torch.testing.assert_close(q.grad, q2.grad)
        grads.append(q.grad)
    torch.testing.assert_close(grads[0], grads[1])


def test_empty_output_fp8_backward(fs):
    q = torch.randn(1, 2, 0, 16).to(E4M3)
    k = torch.randn(1, 2, 4, 16).to(E4M3)
    o, stats, _, _ = fs.sdpa_fp8(q, k, k, *(1.0,) * 6)
    dO = torch.zeros((), dtype=torch.float32).to(E4M3).expand(o.shape)
    dq, dk, dv, *amax = fs.sdpa_fp8_backward(q, k, k, o, dO, stats, *(1.0,) * 12)
    assert dq.shape == q.shape
    assert torch.equal(dk.float(), torch.zeros(k.shape)) and torch.equal(dv.float(), torch.zeros(k.shape))
    assert [float(a) for a in amax] == [0.0] * 4


@pytest.mark.parametrize("dev", DEVICES)
def test_empty_output_flex_backward(fs, dev):
    """flex (already fine: its backward accepts the expanded dO): zero dK, dV, with the LSE's gradient too."""
    k, cq, ck = _thd_kv(dev)
    q = torch.randn(0, 2, 16, device=dev, dtype=_dt(dev), requires_grad=True)
    plan = fs.create_mask_plan(torch.zeros(1, 1, 0, dtype=torch.int32, device=dev), q, k, k, cu_seqlens_q=cq,
                               cu_seqlens_k=ck)
    o, lse = fs.flex_attn_func(q, k, k, mask_plan=plan, return_lse=True)
    (o.sum() + lse.sum()).backward()
    _expect_zero_grads(q, k)


# ---------------------------------------------------------------------------
# 2. The SDPA stats / LSE carry no gradient, and the docs say so
# ---------------------------------------------------------------------------


def test_sdpa_stats_and_lse_carry_no_gradient_as_documented(fs):
    import os

    q = torch.randn(1, 2, 4, 16, requires_grad=True)
    _, stats = fs.sdpa(q, q, q, generate_stats=True)
    _, lse = fs.sdpa_torch(q, q, q, return_lse=True)
    assert not stats.requires_grad and not lse.requires_grad
    for doc in (fs.sdpa.__doc__, fs.sdpa_torch.__doc__):
        text = " ".join(doc.split())
        assert "carries no gradient" in text and "flex_attn_func" in text and "silently dropped" in text
    assert "Differentiable with or without" not in " ".join(fs.sdpa_torch.__doc__.split())
    md = open(os.path.join(os.path.dirname(__file__), "..", "..", "docs", "SDPA.md")).read()
    assert "marked non-differentiable" in md and "flex_attn_func(..., return_lse=True)" in md


# ---------------------------------------------------------------------------
# 3. README: a CPU-only install, and how a source checkout finds its library
# ---------------------------------------------------------------------------


def test_readme_gives_a_cpu_only_install_and_the_checkout_finds_build(fs):
    import os

    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    text = " ".join(open(os.path.join(repo, "README.md")).read().split())
    assert "pip install . -C cmake.define.FLASHSPAN_CUDA=OFF" in text
    assert "PYTHONPATH=python" in text and "build/libflashspan.so" in text
    import flashspan._lib as lib

    if os.path.dirname(lib.__file__) == os.path.join(repo, "python", "flashspan"):  # a source checkout
        assert all(p.startswith(os.path.join(repo, "build")) for p in lib.candidate_paths()[1 + bool(
            os.environ.get("FLASHSPAN_LIBRARY")):])


# ---------------------------------------------------------------------------
# 4. create_mask_plan takes the cumulative lengths SDPA takes (int64, a (1, B+1) vector)
# ---------------------------------------------------------------------------


def test_create_mask_plan_takes_the_cu_seqlens_sdpa_takes(fs):
    q = torch.randn(10, 2, 16)
    mask = torch.tensor([1, 2, 3, 4, 1, 2, 3, 4, 5, 6], dtype=torch.int32).view(1, 1, 10)
    cu32 = torch.tensor([0, 4, 10], dtype=torch.int32)
    want = fs.flex_attn_func(q, q, q, mask_plan=fs.create_mask_plan(mask, q, q, q, cu_seqlens_q=cu32,
                                                                     cu_seqlens_k=cu32))
    for cu in (cu32.long(), cu32.view(1, 3), cu32.long().view(1, 3), cu32.view(3, 1, 1, 1)):
        fs.sdpa(q, q, q, use_padding_mask=True, cu_seq_len_q=cu, cu_seq_len_kv=cu)  # valid in SDPA ...
        plan = fs.create_mask_plan(mask, q, q, q, cu_seqlens_q=cu, cu_seqlens_k=cu)  # ... and in flex
        assert torch.equal(plan.debug_snapshot()["cu_seqlens_q"], cu32)
        assert torch.equal(fs.flex_attn_func(q, q, q, mask_plan=plan), want)
    big = torch.tensor([0, 4, 2**31], dtype=torch.int64)
    with pytest.raises(ValueError, match=r"create_mask_plan: cu_seqlens_k: int64 values must fit int32 .*got 2147483648"):
        fs.create_mask_plan(mask, q, q, q, cu_seqlens_q=cu32, cu_seqlens_k=big)
    with pytest.raises(TypeError, match=r"create_mask_plan: cu_seqlens_q: dtype must be int32 or int64, got float32"):
        fs.create_mask_plan(mask, q, q, q, cu_seqlens_q=cu32.float(), cu_seqlens_k=cu32)
    with pytest.raises(ValueError, match=r"create_mask_plan: cu_seqlens_q: must be a 1-D tensor .*got shape \(2, 3\)"):
        fs.create_mask_plan(mask, q, q, q, cu_seqlens_q=torch.zeros(2, 3, dtype=torch.int32), cu_seqlens_k=cu32)


# ---------------------------------------------------------------------------
# 5. sdpa_torch's scale of another type and a dense call's length maxima follow docs/ERRORS.md
# ---------------------------------------------------------------------------


def test_sdpa_torch_scale_of_another_type_is_a_value_error_naming_it(fs):
    q = torch.randn(1, 2, 4, 16)
    for bad, shown in (("x", "str 'x'"), (True, "bool True"), ([0.5], r"list \[0.5\]")):
        with pytest.raises(ValueError, match=rf"^sdpa_torch: scale: must be a finite float or None, got {shown}$"):
            fs.sdpa_torch(q, q, q, scale=bad)
    with pytest.raises(ValueError, match=r"attn_scale: must be finite, got inf"):
        fs.sdpa_torch(q, q, q, scale=float("inf"))
    torch.testing.assert_close(fs.sdpa_torch(q, q, q, scale=2), fs.sdpa(q, q, q, attn_scale=2.0)[0])


def test_dense_length_maxima_are_checked(fs):
    q = torch.randn(1, 2, 4, 16)
    k = torch.randn(1, 2, 6, 16)
    with pytest.raises(TypeError, match=r"^max_seq_len_q: must be an int, got float 3.7$"):
        fs.sdpa(q, k, k, max_seq_len_q=3.7)
    with pytest.raises(TypeError, match=r"^max_seq_len_kv: must be an int, got float 6.0$"):
        fs.sdpa(q, k, k, max_seq_len_kv=6.0)
    with pytest.raises(ValueError, match=r"^max_seq_len_q: must equal S_q = 4 of the dense \(B, H, S, D\) q .*got 100$"):
        fs.sdpa(q, k, k, max_seq_len_q=100)
    with pytest.raises(ValueError, match=r"^max_seq_len_kv: must equal S_kv = 6 of the dense \(B, H, S, D\) k, v"):
        fs.sdpa(q, k, k, max_seq_len_kv=4)
    o, stats = fs.sdpa(q, k, k, max_seq_len_q=4, max_seq_len_kv=6, generate_stats=True)  # the true values pass
    with pytest.raises(TypeError, match=r"^max_seq_len_q: must be an int, got float 3.7$"):
        fs.sdpa_backward(q, k, k, o, torch.ones_like(o), stats, max_seq_len_q=3.7)


# ---------------------------------------------------------------------------
# 6. sdpa_fp8_backward's docstring says where it runs (the sm90 kernel on an H100 / H200 by default)
# ---------------------------------------------------------------------------


def test_fp8_backward_docstring_names_the_sm90_kernel(fs):
    text = " ".join(fs.sdpa_fp8_backward.__doc__.split())
    assert "where the backward runs on the sm80 kernels" not in text
    assert "the ordered (deterministic) dQ kernel of the sm80 backward" not in text
    assert "on an H100 / H200 on the sm90 backward kernel" in text and "FLASHSPAN_SM90_SDPA_FP8_BWD=0" in text
    assert "on the sm90 kernel (H100 / H200) dQ's tile additions in a fixed order" in text


# ---------------------------------------------------------------------------
# 7. sdpa_backward's THD stats errors name the packed form and the shape as given
# ---------------------------------------------------------------------------


def test_thd_backward_stats_error_names_both_forms_and_the_given_shape(fs):
    q = torch.randn(30, 2, 16)
    cu = torch.tensor([0, 15, 30], dtype=torch.int32)
    kw = dict(use_padding_mask=True, cu_seq_len_q=cu, cu_seq_len_kv=cu)
    o, stats = fs.sdpa(q, q, q, generate_stats=True, **kw)
    forms = r"packed \(T, H_q, 1\) = \(30, 2, 1\) or the padded \(B, H_q, S_q, 1\) = \(2, 2, 15, 1\)"
    for bad in ((10, 2, 1), (30, 2), (2, 2, 14, 1)):
        shown = re.escape(str(bad))
        with pytest.raises(ValueError, match=rf"^stats: with packed \(T, H, D\) q it must be the {forms}.*got shape {shown}$"):
            fs.sdpa_backward(q, q, q, o, o, torch.zeros(bad), **kw)
    want = fs.sdpa_backward(q, q, q, o, o, stats, **kw)
    padded = torch.full((2, 2, 15, 1), float("-inf"))
    padded[0, :, :, 0] = stats[:15, :, 0].T
    padded[1, :, :, 0] = stats[15:, :, 0].T
    for good in (padded, padded[..., 0]):
        for a, b in zip(fs.sdpa_backward(q, q, q, o, o, good, **kw), want):
            torch.testing.assert_close(a, b)
    with pytest.raises(ValueError, match=r"^sdpa_bwd: lse: with packed \(T, H, D\) q it must be the packed .*got shape \(10, 2, 1\)$"):
        torch.ops.flashspan.sdpa_bwd(o, q, q, q, o, torch.zeros(10, 2, 1), 1.0, cu_seqlens_q=cu, cu_seqlens_kv=cu,
                                     max_seqlen_q=15, max_seqlen_kv=15)


# ---------------------------------------------------------------------------
# 8. The explicit API's messages name the parameters as its signatures spell them
# ---------------------------------------------------------------------------


def test_explicit_api_messages_use_the_signatures_names(fs):
    S = 8
    q = torch.randn(1, S, 2, 16)
    plan = fs.create_mask_plan(torch.arange(1, S + 1, dtype=torch.int32).view(1, 1, S), q, q, q, build_backward=True)
    o, lse = torch.empty_like(q), torch.empty(1, 2, S)
    with pytest.raises(TypeError, match=r"^FlexAttentionFwd: sample_o: dtype must be float32, got float64 \(the dtype the mask plan was built for\)$"):
        fs.FlexAttentionFwd(q, q, q, o.double(), plan)
    with pytest.raises(TypeError, match=r"^FlexAttentionFwd: sample_mask_plan: must be a flashspan.MaskPlan, got str$"):
        fs.FlexAttentionFwd(q, q, q, o, "plan")
    with pytest.raises(TypeError, match=r"^FlexAttentionBwd: sample_do: dtype must be float32, got float64 \(the dtype the mask plan was built for\)$"):
        fs.FlexAttentionBwd(q, q, q, o, o.double(), lse, o, o, o, plan)
    fwd = fs.FlexAttentionFwd(q, q, q, o, plan, lse)
    fwd.compile()
    pre = r"^FlexAttentionFwd\.execute: "
    with pytest.raises(ValueError, match=pre + r"lse_tensor: is required \(it was given at construction\)$"):
        fwd.execute(q, q, q, o, plan, None, workspace=None)
    with pytest.raises(ValueError, match=pre + r"max_logit_tensor: was not given at construction"):
        fwd.execute(q, q, q, o, plan, lse, workspace=None, max_logit_tensor=torch.empty(2))
    with pytest.raises(ValueError, match=pre + r"o_tensor: dtype torch.float64 differs"):
        fwd.execute(q, q, q, o.double(), plan, lse, workspace=None)
    with pytest.raises(TypeError, match=pre + r"mask_plan: must be a flashspan.MaskPlan, got str$"):
        fwd.execute(q, q, q, o, "p", lse, workspace=None)
    with pytest.raises(TypeError, match=pre + r"k_tensor: must be a torch.Tensor, got str$"):
        fwd.execute(q, "k", q, o, plan, lse, workspace=None)
    bwd = fs.FlexAttentionBwd(q, q, q, o, o, lse, o, o, o, plan, lse)
    bwd.compile()
    with pytest.raises(ValueError, match=r"^FlexAttentionBwd\.execute: dlse_tensor: is required"):
        bwd.execute(q, q, q, o, o, lse, o, o, o, plan, None, workspace=None)


# ---------------------------------------------------------------------------
# 9. flex's softmax_scale=True, a scale tensor that requires grad, and current_stream of another type on the CPU
# ---------------------------------------------------------------------------


def test_scale_and_stream_arguments_are_checked(fs):
    S = 8
    q = torch.randn(1, S, 2, 16)
    plan = fs.create_mask_plan(torch.arange(1, S + 1, dtype=torch.int32).view(1, 1, S), q, q, q)
    with pytest.raises(ValueError, match=r"^flex_attn_func: softmax_scale: must be a finite number or None, got bool True$"):
        fs.flex_attn_func(q, q, q, mask_plan=plan, softmax_scale=True)
    qb = q.transpose(1, 2).contiguous().requires_grad_()
    s = torch.tensor([0.5], requires_grad=True)
    with pytest.raises(ValueError, match=r"^attn_scale: the scale is not differentiated .*pass attn_scale.detach\(\)"):
        fs.sdpa(qb, qb, qb, attn_scale=s)
    with pytest.raises(ValueError, match=r"^sdpa_torch: scale: the scale is not differentiated"):
        fs.sdpa_torch(qb, qb, qb, scale=s)
    with torch.no_grad():
        fs.sdpa(qb, qb, qb, attn_scale=s)  # nothing to differentiate
    fs.sdpa(qb, qb, qb, attn_scale=s.detach())[0].sum().backward()
    o = torch.empty_like(q)
    fwd = fs.FlexAttentionFwd(q, q, q, o, plan)
    fwd.compile()
    for bad in ("s", 1.5, True):
        with pytest.raises(TypeError, match=r"^FlexAttentionFwd\.execute: current_stream: must be None, a torch.cuda.Stream"):
            fwd.execute(q, q, q, o, plan, workspace=None, current_stream=bad)
    fwd.execute(q, q, q, o, plan, workspace=None, current_stream=0)  # a handle: taken (and unused on the CPU)


# ---------------------------------------------------------------------------
# 10. create_mask_plan's arch on CPU tensors and the plan's shape methods, as documented
# ---------------------------------------------------------------------------


def test_cpu_arch90_plan_and_shape_methods_are_documented(fs):
    S = 8
    q = torch.randn(1, S, 2, 16)
    plan = fs.create_mask_plan(torch.arange(1, S + 1, dtype=torch.int32).view(1, 1, S), q, q, q, arch=90)
    assert plan.arch == 90  # taken on CPU tensors, as the docstring now says
    doc = " ".join(fs.create_mask_plan.__doc__.split())
    assert "On CPU tensors ``arch=90`` is taken" in doc and "with None CPU plans are 80" in doc
    for name in ("q_shape", "k_shape", "v_shape", "out_shape", "lse_shape"):
        assert "a method" in getattr(fs.MaskPlan, name).__doc__
    assert plan.q_shape() == tuple(q.shape)


# ---------------------------------------------------------------------------
# 11. flashspan.sdpa's docs send torch.compile users to sdpa_torch
# ---------------------------------------------------------------------------


def test_sdpa_docs_point_compile_users_to_sdpa_torch(fs):
    import os

    doc = " ".join(fs.sdpa.__doc__.split())
    assert "torch.compile(fullgraph=True)" in doc and ":func:`flashspan.sdpa_torch`" in doc
    md = " ".join(open(os.path.join(os.path.dirname(__file__), "..", "..", "docs", "SDPA.md")).read().split())
    assert "**Under `torch.compile` use `sdpa_torch`**" in md
