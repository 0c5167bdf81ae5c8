"""Issue 24's papercut: flashspan.sdpa with an empty batch (B = 0). torch.nn.functional.scaled_dot_product_attention
returns empty outputs there; flashspan.sdpa raised "q: batch size must be positive, got 0" (the C layer's validation).
Now B = 0 is a valid call of the C layer (core/sdpa_problem.h empty_batch_fills, docs/SDPA.md "An empty batch"):
outputs with a batch dimension are empty, forward and backward, and the outputs reduced over the batch get the
identity of their reduction (max_logit -inf per head, dSink 0, a dBias broadcast over the batch 0, FP8 amax 0). The
Python front ends pass the call through. Every output the library allocates starts NaN (poison_uninitialized), and
the caller's outputs are pre-filled with other values, so each value checked here is the library's."""

import pytest
import torch
import torch.nn.functional as F

from conftest import cuda_ready

pytestmark = pytest.mark.usefixtures("poison_uninitialized")

# The same calls on CUDA tensors (skipped without a GPU): the dispatch's early return (no kernel, no workspace, the
# identity fills on the stream) must give the CPU reference's answer.
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not cuda_ready(), reason="needs a CUDA device and a libflashspan.so built with CUDA (fs_cuda_available() == 1)"))]

HQ, HK, SQ, SKV, D = 4, 2, 5, 7, 16
NEG_INF = float("-inf")


def _dt(dev):
    """The inputs' dtype on `dev`: the GPU kernels take 16-bit inputs, the CPU reference float32 too."""
    return torch.bfloat16 if dev == "cuda" else torch.float32


def _qkv(dev, layout="bhsd", grad=False, dtype=None):
    """q, k, v of B = 0 (H_q = 4, H_k = 2: GQA) in BHSD memory, or BSHD memory seen as BHSD (x.transpose(1, 2))."""
    dtype = dtype or _dt(dev)

    def make(h, s):
        t = torch.randn(0, h, s, D, device=dev, dtype=dtype) if layout == "bhsd" else \
            torch.randn(0, s, h, D, device=dev, dtype=dtype).transpose(1, 2)
        return t.requires_grad_(grad)

    return make(HQ, SQ), make(HK, SKV), make(HK, SKV)


@pytest.mark.parametrize("dev", DEVICES)
@pytest.mark.parametrize("layout", ["bhsd", "bshd"])
@pytest.mark.parametrize("causal", [False, True])
def test_empty_batch_forward_gives_torchs_empty_outputs(fs, dev, layout, causal):
    q, k, v = _qkv(dev, layout)
    kw = dict(diagonal_band_right_bound=0) if causal else {}
    o, stats = fs.sdpa(q, k, v, generate_stats=True, **kw)
    # PyTorch's answer on the CPU (on an H100, torch 2.11's CUDA SDPA returned None for this empty batch).
    cpu = [t.detach().cpu().float() for t in (q, k, v)]
    want = F.scaled_dot_product_attention(cpu[0], cpu[1].repeat_interleave(2, 1), cpu[2].repeat_interleave(2, 1),
                                          is_causal=causal)
    assert o.shape == want.shape == (0, HQ, SQ, D) and o.dtype == q.dtype and o.device == q.device
    assert stats.shape == (0, HQ, SQ, 1) and stats.dtype == torch.float32 and stats.device == q.device
    o, stats = fs.sdpa(q, k, v, **kw)
    assert o.shape == (0, HQ, SQ, D) and stats is None
    # The custom op / sdpa_torch: the same shapes.
    o, lse = fs.sdpa_torch(q, k, v, is_causal=causal, return_lse=True)
    assert o.shape == (0, HQ, SQ, D) and lse.shape == (0, HQ, SQ, 1) and lse.dtype == torch.float32


@pytest.mark.parametrize("dev", DEVICES)
def test_empty_batch_forward_optional_outputs(fs, dev):
    """score_max / score_sum_exp (batch dim: empty), max_logit (per head, over the batch: -inf, the value of a head that
    sees no key), with sinks, a bias broadcast over the batch and the output gate."""
    q, k, v = _qkv(dev)
    ml = torch.full((HQ,), 5.0, device=dev)
    score_max = torch.empty(0, HQ, SQ, 1, device=dev)
    score_sum_exp = torch.empty(0, HQ, SQ, 1, device=dev)
    bias = torch.randn(1, HQ, SQ, SKV, device=dev, dtype=q.dtype)
    gate = torch.randn(0, HQ, SQ, D, device=dev, dtype=q.dtype)
    o, stats = fs.sdpa(q, k, v, generate_stats=True, max_logit=ml, score_max=score_max, score_sum_exp=score_sum_exp,
                       sink_token=torch.zeros(HQ, device=dev), bias=bias, gate=gate, diagonal_band_right_bound=0)
    assert o.shape == (0, HQ, SQ, D) and stats.shape == (0, HQ, SQ, 1)
    assert torch.equal(ml, torch.full((HQ,), NEG_INF, device=dev))


@pytest.mark.parametrize("dev", DEVICES)
@pytest.mark.parametrize("layout", ["bhsd", "bshd"])
def test_empty_batch_backward_through_autograd(fs, dev, layout):
    """Gradients of q, k, v, the gate and a bias of batch dim 0: empty, of their inputs' shapes; a bias broadcast over
    the batch (dim 0 of size 1) and the sinks: zeros (sums over no sample)."""
    q, k, v = _qkv(dev, layout, grad=True)
    sink = torch.randn(HQ, device=dev, requires_grad=True)
    bias1 = torch.randn(1, HQ, SQ, SKV, device=dev, dtype=q.dtype, requires_grad=True)
    gate = torch.randn(0, HQ, SQ, D, device=dev, dtype=q.dtype, requires_grad=True)
    o, _ = fs.sdpa(q, k, v, sink_token=sink, bias=bias1, gate=gate, diagonal_band_right_bound=0)
    o.sum().backward()
    for t in (q, k, v, gate):
        assert t.grad is not None and t.grad.shape == t.shape and t.grad.dtype == t.dtype
    assert torch.equal(sink.grad, torch.zeros_like(sink))
    assert torch.equal(bias1.grad, torch.zeros_like(bias1))

    q, k, v = _qkv(dev, layout, grad=True)
    bias0 = torch.randn(0, 1, SQ, SKV, device=dev, dtype=q.dtype, requires_grad=True)
    fs.sdpa(q, k, v, bias=bias0)[0].sum().backward()
    assert bias0.grad.shape == bias0.shape
    # The custom ops' autograd (sdpa_fwd / sdpa_bwd), sinks included.
    q, k, v = _qkv(dev, layout, grad=True)
    sink = torch.randn(HQ, device=dev, requires_grad=True)
    fs.sdpa_torch(q, k, v, is_causal=True, sinks=sink).sum().backward()
    assert q.grad.shape == q.shape and k.grad.shape == k.shape and v.grad.shape == v.shape
    assert torch.equal(sink.grad, torch.zeros_like(sink))


@pytest.mark.parametrize("dev", DEVICES)
@pytest.mark.parametrize("deterministic", [False, True])
def test_empty_batch_explicit_backward_fills_the_per_head_reductions(fs, dev, deterministic):
    """sdpa_backward with caller-given dBias (broadcast over the batch, padded rows) and dSink_token pre-filled with
    NaN: zeros at every element, the padding between the rows untouched."""
    q, k, v = _qkv(dev)
    sink = torch.randn(HQ, device=dev)
    bias = torch.randn(1, HQ, SQ, SKV, device=dev)
    o, stats = fs.sdpa(q, k, v, generate_stats=True, sink_token=sink, bias=bias)
    store = torch.full((1, HQ, SQ, SKV + 3), float("nan"), device=dev)
    dbias = store[..., :SKV]
    dsink = torch.full((HQ,), float("nan"), device=dev)
    dq, dk, dv = fs.sdpa_backward(q, k, v, o, torch.zeros_like(o), stats, sink_token=sink, dSink_token=dsink,
                                  bias=bias, dBias=dbias, use_deterministic_algorithm=deterministic)
    assert (dq.shape, dk.shape, dv.shape) == (q.shape, k.shape, v.shape)
    assert torch.equal(dsink, torch.zeros(HQ, device=dev))
    assert torch.equal(dbias, torch.zeros_like(dbias))
    assert torch.isnan(store[..., SKV:]).all()


@pytest.mark.parametrize("dev", DEVICES)
def test_empty_batch_packed_thd_and_padded(fs, dev):
    """Packed THD with zero samples (cu_seq_len = [0], T = 0) and a padded batch of B = 0 (seq_len of 0 elements)."""
    cu = torch.zeros(1, dtype=torch.int32, device=dev)
    q = torch.randn(0, HQ, D, device=dev, dtype=_dt(dev), requires_grad=True)
    k = torch.randn(0, HK, D, device=dev, dtype=_dt(dev), requires_grad=True)
    o, stats = fs.sdpa(q, k, k, use_padding_mask=True, cu_seq_len_q=cu, cu_seq_len_kv=cu, generate_stats=True)
    assert o.shape == (0, HQ, D) and stats.shape == (0, HQ, 1)
    o.sum().backward()
    assert q.grad.shape == q.shape and k.grad.shape == k.shape
    # The custom op's varlen form (the seed's rule asks for max_seqlen_q / max_seqlen_kv > 0).
    o = fs.sdpa_torch(q, k, k, cu_seqlens_q=cu, cu_seqlens_kv=cu, max_seqlen_q=1, max_seqlen_kv=1)
    assert o.shape == (0, HQ, D)

    q, k, v = _qkv(dev, grad=True)
    lens = torch.zeros(0, dtype=torch.int32, device=dev)
    o, _ = fs.sdpa(q, k, v, use_padding_mask=True, seq_len_q=lens, seq_len_kv=lens)
    assert o.shape == (0, HQ, SQ, D)
    o.sum().backward()
    assert q.grad.shape == q.shape and k.grad.shape == k.shape


@pytest.mark.parametrize("dev", DEVICES)
def test_empty_batch_paged_kv(fs, dev):
    """Paged K/V with B = 0: page tables and lengths of 0 rows, containers of 8 pages (whose contents no sample reads);
    empty O and stats, max_logit -inf. (Both variants passed on an H100, 2026-12-06.)"""
    q = torch.randn(0, HQ, 1, D, device=dev, dtype=_dt(dev))
    kc = torch.randn(8, HK, 8, D, device=dev, dtype=_dt(dev))
    table = torch.zeros(0, 1, 4, 1, dtype=torch.int32, device=dev)
    lens = torch.zeros(0, dtype=torch.int32, device=dev)
    ml = torch.full((HQ,), 5.0, device=dev)
    o, stats = fs.sdpa(q, kc, kc, generate_stats=True, use_padding_mask=True, seq_len_q=lens, seq_len_kv=lens,
                       paged_attention_k_table=table, paged_attention_v_table=table,
                       paged_attention_max_seq_len_kv=32, max_logit=ml)
    assert o.shape == (0, HQ, 1, D) and stats.shape == (0, HQ, 1, 1)
    assert torch.equal(ml, torch.full((HQ,), NEG_INF, device=dev))


def test_empty_batch_fp8_amax_is_zero(fs):
    """FP8 (CPU reference): empty outputs; every amax, a max of |x| over no element, is 0."""
    e4m3 = torch.float8_e4m3fn
    q = torch.randn(0, HQ, SQ, D).to(e4m3)
    k = torch.randn(0, HK, SKV, D).to(e4m3)
    o, stats, amax_s, amax_o = fs.sdpa_fp8(q, k, k, *(1.0,) * 6)
    assert o.shape == (0, HQ, SQ, D) and stats.shape == (0, HQ, SQ, 1)
    assert float(amax_s) == 0.0 and float(amax_o) == 0.0
    dO = torch.zeros(o.shape).to(e4m3)
    dq, dk, dv, *amax = fs.sdpa_fp8_backward(q, k, k, o, dO, stats, *(1.0,) * 12)
    assert (dq.shape, dk.shape, dv.shape) == (q.shape, k.shape, k.shape)
    assert [float(a) for a in amax] == [0.0] * 4


def test_empty_batch_through_the_c_abi(fs):
    """The C ABI directly (the ctypes binding, explicit descriptors): B = 0 creates, needs no workspace and runs with
    NULL pointers for its empty tensors; max_logit, pre-filled with 5, comes back -inf."""
    from flashspan import _lib
    from flashspan import _sdpa_lib as L

    q, o = torch.randn(0, HQ, SQ, D), torch.empty(0, HQ, SQ, D)
    k = torch.randn(0, HK, SKV, D)
    stats = torch.empty(0, HQ, SQ, 1)
    ml = torch.full((HQ,), 5.0)
    attrs = L.Attributes(False)
    attrs.set("max_logit", _lib.TensorDesc(ml, "max_logit"))
    attrs.set("generate_stats", 1)
    op = L.Op("fwd", [_lib.TensorDesc(t, n) for t, n in ((q, "q"), (k, "k"), (k, "v"), (o, "o"), (stats, "stats"))],
              attrs)
    assert op.workspace_bytes == 0
    op.execute({L.MAX_LOGIT: ml.data_ptr()}, None, None)
    assert torch.equal(ml, torch.full((HQ,), NEG_INF))
