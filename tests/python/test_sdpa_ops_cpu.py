"""torch.ops.flashspan.sdpa_fwd / sdpa_bwd and flashspan.sdpa_torch on CPU tensors (the CPU reference): the seed's
cudnn::sdpa_fwd / sdpa_bwd schema, opcheck (schema, fake kernels, registered autograd, dynamic AOT dispatch),
torch.compile(fullgraph=True), autograd on the dense, padded and THD paths with the sink gradient, against the
float64 oracle (sdpa_ref.py), and finite differences in float64 (gradcheck) through the registered backward."""

import math

import pytest
import torch

import sdpa_ref
from sdpa_cases import assert_close

pytestmark = pytest.mark.no_poison

# The seed's cudnn::sdpa_fwd / cudnn::sdpa_bwd arguments (names, types, defaults, order) and outputs; the seed's
# text adds window_right next to window_left ("window_left and window_right ... matching diagonal_band_*").
SEED_FWD = [
    ("q", "Tensor", None), ("k", "Tensor", None), ("v", "Tensor", None), ("attn_scale", "float", None),
    ("is_causal", "bool", False), ("causal_bottom_right", "bool", False), ("window_left", "int", -1),
    ("window_right", "int", -1), ("sinks", "Optional[Tensor]", None), ("seq_len_q", "Optional[Tensor]", None),
    ("seq_len_kv", "Optional[Tensor]", None), ("cu_seqlens_q", "Optional[Tensor]", None),
    ("cu_seqlens_kv", "Optional[Tensor]", None), ("max_seqlen_q", "int", 0), ("max_seqlen_kv", "int", 0),
    ("return_lse", "bool", True),
]
SEED_BWD = [
    ("grad_out", "Tensor", None), ("q", "Tensor", None), ("k", "Tensor", None), ("v", "Tensor", None),
    ("o", "Tensor", None), ("lse", "Tensor", None), ("attn_scale", "float", None), ("is_causal", "bool", False),
    ("causal_bottom_right", "bool", False), ("window_left", "int", -1), ("window_right", "int", -1),
    ("sinks", "Optional[Tensor]", None), ("cu_seqlens_q", "Optional[Tensor]", None),
    ("cu_seqlens_kv", "Optional[Tensor]", None), ("max_seqlen_q", "int", 0), ("max_seqlen_kv", "int", 0),
    ("is_deterministic", "bool", False),
]


def _args(schema):
    out = []
    for a in schema.arguments:
        t = str(a.type)
        default = a.default_value if a.has_default_value() else None
        out.append((a.name, t, default))
    return out


def test_schemas_are_the_seeds(fs):
    fwd = torch.ops.flashspan.sdpa_fwd.default._schema
    bwd = torch.ops.flashspan.sdpa_bwd.default._schema
    assert _args(fwd) == SEED_FWD
    assert _args(bwd) == SEED_BWD
    assert [str(r.type) for r in fwd.returns] == ["Tensor", "Tensor"]
    assert [str(r.type) for r in bwd.returns] == ["Tensor", "Tensor", "Tensor"]
    assert not fwd.is_mutable and not bwd.is_mutable


# ---------------------------------------------------------------------------
# Problems
# ---------------------------------------------------------------------------


def _dense(seed, dtype=torch.bfloat16, B=2, Hq=4, Hkv=2, Sq=7, Skv=9, D=16, Dv=8):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, Hq, Sq, D, generator=g).to(dtype)
    k = torch.randn(B, Hkv, Skv, D, generator=g).to(dtype)
    v = torch.randn(B, Hkv, Skv, Dv, generator=g).to(dtype)
    return q, k, v


def _thd(seed, dtype=torch.bfloat16, lens_q=(3, 0, 5), lens_kv=(4, 2, 6), Hq=2, Hkv=1, D=8, Dv=16):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(sum(lens_q), Hq, D, generator=g).to(dtype)
    k = torch.randn(sum(lens_kv), Hkv, D, generator=g).to(dtype)
    v = torch.randn(sum(lens_kv), Hkv, Dv, generator=g).to(dtype)
    cu = lambda lens: torch.tensor([0] + list(torch.tensor(lens).cumsum(0)), dtype=torch.int32)
    return q, k, v, cu(lens_q), cu(lens_kv), max(lens_q), max(lens_kv)


def _pad(x, cu, S):
    """Packed (T, H, D) -> padded [B, H, S, D] (zeros)."""
    B = cu.numel() - 1
    out = torch.zeros(B, x.shape[1], S, x.shape[2], dtype=x.dtype)
    for b in range(B):
        a, e = int(cu[b]), int(cu[b + 1])
        out[b, :, : e - a] = x[a:e].transpose(0, 1)
    return out


def _unpad(x, cu):
    return torch.cat([x[b, :, : int(cu[b + 1] - cu[b])].transpose(0, 1) for b in range(cu.numel() - 1)], 0)


def _case_from_op(q, k, v, scale, *, is_causal=False, bottom_right=False, window_left=-1, window_right=-1,
                  len_q=None, len_kv=None):
    right = window_right if window_right >= 0 else (0 if is_causal else None)
    left = window_left if window_left >= 0 else None
    B, Sq, Skv = q.shape[0], q.shape[2], k.shape[2]
    return sdpa_ref.Case(q=q, k=k, v=v, len_q=list(len_q or [Sq] * B), len_kv=list(len_kv or [Skv] * B), scale=scale,
                         bottom_right=bottom_right, left=left, right=right)


# ---------------------------------------------------------------------------
# opcheck
# ---------------------------------------------------------------------------

OPCHECK_DENSE = [
    dict(),
    dict(is_causal=True),
    dict(is_causal=True, causal_bottom_right=True, window_left=3),
    dict(window_left=2, window_right=1),
    dict(is_causal=True, sinks=True),
    dict(seq_len=True, window_right=0, causal_bottom_right=True),
    dict(return_lse=False),
]


def _dense_kwargs(spec, H):
    kw = {k: v for k, v in spec.items() if k not in ("sinks", "seq_len")}
    if spec.get("sinks"):
        kw["sinks"] = torch.linspace(-1, 1, H)
    if spec.get("seq_len"):
        kw["seq_len_q"] = torch.tensor([7, 3], dtype=torch.int32)
        kw["seq_len_kv"] = torch.tensor([2, 9], dtype=torch.int32)
    return kw


@pytest.mark.parametrize("spec", OPCHECK_DENSE, ids=lambda s: "-".join(s) or "plain")
def test_opcheck_dense(fs, spec):
    q, k, v = _dense(1)
    kw = _dense_kwargs(spec, q.shape[1])
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    if "sinks" in kw:
        kw["sinks"] = kw["sinks"].clone().requires_grad_()
    torch.library.opcheck(torch.ops.flashspan.sdpa_fwd.default, (*leaves, 0.3), kw)
    if not kw.get("return_lse", True):
        return
    o, lse = torch.ops.flashspan.sdpa_fwd(q, k, v, 0.3, **{n: (t.detach() if isinstance(t, torch.Tensor) else t)
                                                         for n, t in kw.items()})
    do = torch.randn_like(o)
    bkw = {n: t for n, t in kw.items() if n not in ("seq_len_q", "seq_len_kv", "return_lse")}
    if "sinks" in bkw:
        bkw["sinks"] = bkw["sinks"].detach()
    if "seq_len_q" not in kw:
        torch.library.opcheck(torch.ops.flashspan.sdpa_bwd.default, (do, q, k, v, o, lse, 0.3), bkw)
    torch.library.opcheck(
        torch.ops.flashspan._sdpa_bwd_full.default,
        (do, q, k, v, o, lse, 0.3, kw.get("is_causal", False), kw.get("causal_bottom_right", False),
         kw.get("window_left", -1), kw.get("window_right", -1), bkw.get("sinks"), kw.get("seq_len_q"),
         kw.get("seq_len_kv"), None, None, 0, 0, False))


@pytest.mark.parametrize("sinks", [False, True])
def test_opcheck_thd(fs, sinks):
    q, k, v, cuq, cuk, mq, mk = _thd(2)
    kw = dict(is_causal=True, causal_bottom_right=True, cu_seqlens_q=cuq, cu_seqlens_kv=cuk, max_seqlen_q=mq,
              max_seqlen_kv=mk)
    if sinks:
        kw["sinks"] = torch.tensor([0.5, -0.25], requires_grad=True)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    torch.library.opcheck(torch.ops.flashspan.sdpa_fwd.default, (*leaves, 0.5), kw)
    fkw = dict(kw, sinks=kw["sinks"].detach()) if sinks else kw
    o, lse = torch.ops.flashspan.sdpa_fwd(q, k, v, 0.5, **fkw)
    assert o.shape == (q.shape[0], q.shape[1], v.shape[2]) and lse.shape == (q.shape[0], q.shape[1], 1)
    do = torch.randn_like(o)
    torch.library.opcheck(torch.ops.flashspan.sdpa_bwd.default, (do, q, k, v, o, lse, 0.5), fkw)


# ---------------------------------------------------------------------------
# Autograd through the registered backward, against the float64 oracle
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("spec", OPCHECK_DENSE[:-1], ids=lambda s: "-".join(s) or "plain")
def test_autograd_dense_vs_oracle(fs, spec):
    q, k, v = _dense(3)
    kw = _dense_kwargs(spec, q.shape[1])
    scale = 0.35
    ours = [t.clone().requires_grad_() for t in (q, k, v)]
    sinks = kw.pop("sinks", None)
    s_ours = sinks.clone().requires_grad_() if sinks is not None else None
    o = fs.sdpa_torch(*ours, scale=scale, sinks=s_ours, **kw)
    lq = kw["seq_len_q"].tolist() if "seq_len_q" in kw else None
    lk = kw["seq_len_kv"].tolist() if "seq_len_kv" in kw else None
    case = _case_from_op(*(t.double() for t in (q, k, v)), scale, is_causal=kw.get("is_causal", False),
                         bottom_right=kw.get("causal_bottom_right", False), window_left=kw.get("window_left", -1),
                         window_right=kw.get("window_right", -1), len_q=lq, len_kv=lk)
    ref_in = [t.double().requires_grad_() for t in (q, k, v)]
    s_ref = sinks.double().requires_grad_() if sinks is not None else None
    out = sdpa_ref.forward(case, *ref_in, sinks=s_ref)
    rows = torch.ones(o.shape[:3] + (1,), dtype=torch.float64)
    if lq:
        for b, n in enumerate(lq):
            rows[b, :, n:] = 0
            assert torch.all(o[b, :, n:] == 0), "o: padding rows must be 0"
    assert_close(o * rows, out["o"] * rows, torch.bfloat16, "o")
    do = torch.randn(o.shape, generator=torch.Generator().manual_seed(9)).to(o.dtype)
    wrt_ours = ours + ([s_ours] if s_ours is not None else [])
    wrt_ref = ref_in + ([s_ref] if s_ref is not None else [])
    got = torch.autograd.grad(o, wrt_ours, do)
    want = torch.autograd.grad(out["o"], wrt_ref, do.double() * rows)
    for name, g, w in zip(["dq", "dk", "dv", "dsinks"], got, want):
        assert g.shape == w.shape, name
        assert_close(g, w, torch.bfloat16, name, terms=q.shape[0] * q.shape[2] if name == "dsinks" else 1)


@pytest.mark.parametrize("sinks", [False, True])
def test_autograd_thd_vs_oracle(fs, sinks):
    lens_q, lens_kv = (3, 0, 5), (4, 2, 6)
    q, k, v, cuq, cuk, mq, mk = _thd(4, lens_q=lens_q, lens_kv=lens_kv)
    s = torch.tensor([0.3, -0.7]) if sinks else None
    ours = [t.clone().requires_grad_() for t in (q, k, v)]
    s_ours = s.clone().requires_grad_() if sinks else None
    o, lse = fs.sdpa_torch(*ours, scale=0.4, is_causal=True, causal_bottom_right=True, sinks=s_ours,
                           cu_seqlens_q=cuq, cu_seqlens_kv=cuk, max_seqlen_q=mq, max_seqlen_kv=mk, return_lse=True)
    pq, pk, pv = (_pad(t.double(), c, m) for t, c, m in ((q, cuq, mq), (k, cuk, mk), (v, cuk, mk)))
    ref_in = [t.requires_grad_() for t in (pq, pk, pv)]
    s_ref = s.double().requires_grad_() if sinks else None
    case = sdpa_ref.Case(q=pq, k=pk, v=pv, len_q=list(lens_q), len_kv=list(lens_kv), scale=0.4, bottom_right=True,
                         right=0)
    out = sdpa_ref.forward(case, *ref_in, sinks=s_ref)
    assert_close(o, _unpad(out["o"], cuq), torch.bfloat16, "o")
    assert_close(lse[..., 0], _unpad(out["lse"].unsqueeze(-1), cuq)[..., 0], torch.float32, "lse")
    do = torch.randn(o.shape, generator=torch.Generator().manual_seed(5)).to(o.dtype)
    wrt_o = ours + ([s_ours] if sinks else [])
    wrt_r = ref_in + ([s_ref] if sinks else [])
    got = torch.autograd.grad(o, wrt_o, do)
    want = torch.autograd.grad(out["o"], wrt_r, _pad(do.double(), cuq, mq))
    assert_close(got[0], _unpad(want[0], cuq), torch.bfloat16, "dq")
    assert_close(got[1], _unpad(want[1], cuk), torch.bfloat16, "dk")
    assert_close(got[2], _unpad(want[2], cuk), torch.bfloat16, "dv")
    if sinks:
        assert_close(got[3], want[3], torch.bfloat16, "dsinks", terms=sum(lens_q))


def test_sdpa_bwd_thd_takes_padded_lse(fs):
    # The seed's THD sdpa_bwd contract: a padded (B, H, max_seqlen_q[, 1]) fp32 LSE; flashspan also takes the packed
    # (T, H, 1) stats its forward returns. Both give the same gradients.
    q, k, v, cuq, cuk, mq, mk = _thd(6)
    kw = dict(is_causal=True, cu_seqlens_q=cuq, cu_seqlens_kv=cuk, max_seqlen_q=mq, max_seqlen_kv=mk)
    o, lse = torch.ops.flashspan.sdpa_fwd(q, k, v, 0.5, **kw)
    do = torch.randn_like(o)
    packed = torch.ops.flashspan.sdpa_bwd(do, q, k, v, o, lse, 0.5, **kw)
    padded_lse = torch.full((3, q.shape[1], mq), float("nan"))
    for b in range(3):
        padded_lse[b, :, : int(cuq[b + 1] - cuq[b])] = lse[int(cuq[b]) : int(cuq[b + 1]), :, 0].t()
    for lse_in in (padded_lse, padded_lse.unsqueeze(-1)):
        padded = torch.ops.flashspan.sdpa_bwd(do, q, k, v, o, lse_in, 0.5, **kw)
        for a, b in zip(packed, padded):
            assert torch.equal(a, b)


def test_sdpa_torch_is_differentiable_without_return_lse(fs):
    q, k, v = _dense(8)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    o = fs.sdpa_torch(*leaves, is_causal=True)
    assert isinstance(o, torch.Tensor)
    o.float().sum().backward()
    ref = [t.clone().requires_grad_() for t in (q, k, v)]
    o2, _ = fs.sdpa_torch(*ref, is_causal=True, return_lse=True)
    o2.float().sum().backward()
    for a, b in zip(leaves, ref):
        assert torch.equal(a.grad, b.grad)
    with torch.no_grad():  # no stats computed without gradients: still one output
        assert isinstance(fs.sdpa_torch(q, k, v), torch.Tensor)


def test_deterministic_backward_is_bitwise_stable(fs):
    q, k, v = _dense(11, Hq=6, Hkv=1)
    o, lse = torch.ops.flashspan.sdpa_fwd(q, k, v, 0.25, window_left=4)
    do = torch.randn_like(o)
    first = torch.ops.flashspan.sdpa_bwd(do, q, k, v, o, lse, 0.25, window_left=4, is_deterministic=True)
    for _ in range(3):
        again = torch.ops.flashspan.sdpa_bwd(do, q, k, v, o, lse, 0.25, window_left=4, is_deterministic=True)
        assert all(torch.equal(a, b) for a, b in zip(first, again))


# ---------------------------------------------------------------------------
# Finite differences in float64 through the registered autograd (tiny shapes)
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("spec", [
    dict(is_causal=True),
    dict(window_left=2, window_right=1, causal_bottom_right=True),
    dict(is_causal=True, sinks=True),
    dict(seq_len=True, sinks=True),
], ids=lambda s: "-".join(s))
def test_gradcheck_dense_float64(fs, spec):
    q, k, v = _dense(12, dtype=torch.float64, B=2, Hq=2, Hkv=1, Sq=7, Skv=9, D=8, Dv=8)
    kw = _dense_kwargs(spec, 2)
    sinks = kw.pop("sinks", None)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    extra = [sinks.double().clone().requires_grad_()] if sinks is not None else []

    def f(q, k, v, *s):
        return fs.sdpa_torch(q, k, v, scale=0.45, sinks=s[0] if s else None, **kw)

    assert torch.autograd.gradcheck(f, (*leaves, *extra), eps=1e-6, atol=1e-6, rtol=1e-5)


def test_gradcheck_thd_float64(fs):
    q, k, v, cuq, cuk, mq, mk = _thd(13, dtype=torch.float64, lens_q=(2, 0, 3), lens_kv=(3, 1, 2))
    sinks = torch.tensor([0.1, -0.4], dtype=torch.float64, requires_grad=True)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]

    def f(q, k, v, s):
        return fs.sdpa_torch(q, k, v, scale=0.7, is_causal=True, causal_bottom_right=True, sinks=s, cu_seqlens_q=cuq,
                             cu_seqlens_kv=cuk, max_seqlen_q=mq, max_seqlen_kv=mk)

    assert torch.autograd.gradcheck(f, (*leaves, sinks), eps=1e-6, atol=1e-6, rtol=1e-5)


def test_cuda_only_dtypes_still_rejected_on_the_op_path(fs):
    q, k, v = _dense(14, dtype=torch.float32)
    with pytest.raises(TypeError, match=r"sdpa_fwd: all io tensors must share one dtype"):
        torch.ops.flashspan.sdpa_fwd(q, k.double(), v, 0.5)
    with pytest.raises(TypeError, match=r"sdpa_fwd: q: unsupported dtype torch.int32"):
        torch.ops.flashspan.sdpa_fwd(q.int(), k.int(), v.int(), 0.5)


# ---------------------------------------------------------------------------
# torch.compile(fullgraph=True)
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("backend", ["eager", "aot_eager", "inductor"])
@pytest.mark.parametrize("varlen", [False, True])
def test_compile_fullgraph_forward_backward(fs, backend, varlen):
    torch._dynamo.reset()
    if varlen:
        q, k, v, cuq, cuk, mq, mk = _thd(15)
        kw = dict(is_causal=True, cu_seqlens_q=cuq, cu_seqlens_kv=cuk, max_seqlen_q=mq, max_seqlen_kv=mk)
    else:
        q, k, v = _dense(15)
        kw = dict(is_causal=True, window_left=3)
    sinks = torch.linspace(-0.5, 0.5, q.shape[1 if varlen else 1])

    def f(q, k, v, s):
        o, lse = fs.sdpa_torch(q, k, v, sinks=s, return_lse=True, **kw)
        return torch.tanh(o.float()) * 2, lse

    def run(fn):
        leaves = [t.clone().requires_grad_() for t in (q, k, v, sinks)]
        o, lse = fn(*leaves)
        loss = o.sum() + lse.masked_fill(torch.isinf(lse), 0).sum()
        return (o.detach(), lse.detach()) + torch.autograd.grad(loss, leaves)

    got = run(torch.compile(f, backend=backend, fullgraph=True))
    want = run(f)
    for name, g, w in zip(["o", "lse", "dq", "dk", "dv", "dsinks"], got, want):
        assert g.shape == w.shape and g.dtype == w.dtype, name
        assert_close(g, w, torch.bfloat16, name)


def test_compile_dynamic_shapes_one_graph(fs):
    # dynamic=True: the fake kernels trace with symbolic B / S, one graph serves every sequence length.
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()

    def f(q, k, v, s):
        o, lse = fs.sdpa_torch(q, k, v, sinks=s, is_causal=True, causal_bottom_right=True, return_lse=True)
        return o.float().sum() + lse.masked_fill(torch.isinf(lse), 0).sum()

    cf = torch.compile(f, backend="aot_eager", fullgraph=True, dynamic=True)
    for S in (7, 10, 13):  # no length equal to another dim (duck sizing would specialize on it)
        q, k, v = _dense(S, Sq=S, Skv=S + 2)
        s = torch.linspace(-1, 1, q.shape[1])
        got_in = [t.clone().requires_grad_() for t in (q, k, v, s)]
        want_in = [t.clone().requires_grad_() for t in (q, k, v, s)]
        got = torch.autograd.grad(cf(*got_in), got_in)
        want = torch.autograd.grad(f(*want_in), want_in)
        for name, g, w in zip(["dq", "dk", "dv", "dsinks"], got, want):
            assert_close(g, w, torch.bfloat16, f"{name} (S={S})")
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == 1
