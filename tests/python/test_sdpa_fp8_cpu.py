"""flashspan.sdpa_fp8 / sdpa_fp8_backward on CPU tensors (the CPU reference) against the independent float64 oracle
(sdpa_fp8_ref.py): random configurations (formats, scales, GQA, causal, padding, THD), the FP8 conversions against
torch's float8 casts (every code, hypothesis-drawn scales), the oracle's own formulas against autograd, and bad input;
and, on CUDA descriptors without a GPU, the C layer's rules for the FP8 backward on CUDA tensors (on by default,
NotImplementedError with FLASHSPAN_SDPA_FP8_BWD=0; its rule's refusals) and for the FP8 forward on the sm80 kernels
(on by default, FLASHSPAN_SDPA_FP8_SM80=0 leaves FP8 forwards to the sm90 one's rules).
"""

import itertools
import math
import random

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import sdpa_fp8_ref as ref

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2
FWD_SCALES = ("descale_q", "descale_k", "descale_v", "descale_s", "scale_s", "scale_o")
BWD_SCALES = ("descale_q", "descale_k", "descale_v", "descale_o", "descale_dO", "descale_s", "descale_dP", "scale_s",
              "scale_dQ", "scale_dK", "scale_dV", "scale_dP")


def f32(x: float) -> float:
    """x as the float32 the C layer reads."""
    return float(torch.tensor(x, dtype=torch.float32))


def fp8_randn(shape, dtype, gen, mag=1.0):
    x = torch.randn(shape, generator=gen, dtype=torch.float64) * mag
    return x.clamp(-ref.FP8_MAX[dtype] / 2, ref.FP8_MAX[dtype] / 2).to(dtype)


def scale_tensors(s: dict) -> dict:
    """The seed's (1, 1, 1, 1) float32 tensors."""
    return {n: torch.full((1, 1, 1, 1), v, dtype=torch.float32) for n, v in s.items()}


def assert_fp8_close(got: torch.Tensor, want: torch.Tensor, dtype, what: str):
    """Stored FP8 values within one step of the format of the oracle's (the two round float64 sums that differ in
    the last bits, so a value next to a rounding boundary may land on the other side), nearly all equal."""
    g = got.to(torch.float64)
    assert torch.equal(torch.isnan(g), torch.isnan(want)), f"{what}: NaN positions differ"
    diff = (g - want).abs()
    tol = ref.ulp(torch.maximum(g.abs(), want.abs()), dtype)
    bad = diff > tol
    assert not bad.any(), (f"{what}: {int(bad.sum())} elements more than one FP8 step off, e.g. got "
                           f"{g[bad][:4].tolist()} want {want[bad][:4].tolist()}")
    if diff.numel():
        assert (diff == 0).double().mean() >= 0.99, f"{what}: {float((diff != 0).double().mean()):.3%} differ"


def random_scales(rng: random.Random, names, p_dtype) -> dict:
    s = {}
    for n in names:
        s[n] = f32(rng.choice([1.0, 0.5, 2.0, 0.25]) if rng.random() < 0.5 else rng.uniform(0.2, 3.0))
    # S = softmax in [0, 1]: scale it into the format's range as a recipe would, descale by the reciprocal.
    s["scale_s"] = f32(ref.FP8_MAX[p_dtype] * rng.choice([1.0, 0.5, 0.3]))
    s["descale_s"] = f32(1.0 / s["scale_s"])
    return s


# ---------------------------------------------------------------------------
# Forward
# ---------------------------------------------------------------------------


def _forward_case(seed: int):
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    fmt = rng.choice([E4M3, E5M2])
    o_fmt = rng.choice([fmt, E4M3, E5M2])
    B, Hk = rng.randint(1, 3), rng.choice([1, 2])
    Hq = Hk * rng.choice([1, 2, 3])
    Hv = rng.choice([Hk, Hq]) if Hq % Hk == 0 else Hk
    Sq, Skv = rng.randint(1, 20), rng.randint(1, 24)
    D, Dv = rng.choice([16, 32, 48, 64]), rng.choice([16, 32])
    q = fp8_randn((B, Hq, Sq, D), fmt, gen, rng.choice([0.5, 1.0, 3.0]))
    k = fp8_randn((B, Hk, Skv, D), fmt, gen, rng.choice([0.5, 1.0, 3.0]))
    v = fp8_randn((B, Hv, Skv, Dv), fmt, gen, rng.choice([0.5, 1.0, 3.0]))
    s = random_scales(rng, FWD_SCALES, fmt)
    s["scale_o"] = f32(rng.choice([1.0, 4.0, 0.5, 7.3]))
    mode = rng.choice(["dense", "dense", "padded", "cu", "thd"])
    len_q = [rng.randint(0, Sq) for _ in range(B)] if mode != "dense" else None
    len_kv = [rng.randint(0, Skv) for _ in range(B)] if mode != "dense" else None
    return dict(q=q, k=k, v=v, s=s, fmt=fmt, o_fmt=o_fmt, causal=rng.random() < 0.5, mode=mode, len_q=len_q,
                len_kv=len_kv, attn_scale=f32(rng.choice([1.0, 1 / math.sqrt(D), 0.3])), log2=rng.random() < 0.2)


def _pack(x: torch.Tensor, lens) -> torch.Tensor:
    """[B, H, S, D] -> packed (T, H, D) of each sample's first lens[b] rows."""
    return torch.cat([x[b, :, :n].transpose(0, 1) for b, n in enumerate(lens)], 0)


def _unpack(x: torch.Tensor, lens, S: int) -> torch.Tensor:
    out = torch.zeros((len(lens), x.shape[1], S, x.shape[2]), dtype=torch.float64)
    start = 0
    for b, n in enumerate(lens):
        out[b, :, :n] = x[start:start + n].transpose(0, 1).to(torch.float64)
        start += n
    return out


@pytest.mark.parametrize("seed", range(60))
def test_forward_matches_oracle(fs, seed):
    c = _forward_case(seed)
    q, k, v, s, mode = c["q"], c["k"], c["v"], c["s"], c["mode"]
    B, Sq, Skv = q.shape[0], q.shape[2], k.shape[2]
    kw = dict(attn_scale=c["attn_scale"], use_causal_mask=c["causal"], o_dtype=c["o_fmt"], stats_use_log2=c["log2"])
    if mode in ("padded", "cu"):
        kw["use_padding_mask"] = True
        # Padding rows hold NaN: the reference must never read them.
        q, k, v = q.clone(), k.clone(), v.clone()
        for b in range(B):
            q.view(torch.uint8)[b, :, c["len_q"][b]:] = 0x7F
            k.view(torch.uint8)[b, :, c["len_kv"][b]:] = 0x7F
            v.view(torch.uint8)[b, :, c["len_kv"][b]:] = 0x7F
    if mode == "padded":
        kw["seq_len_q"] = torch.tensor(c["len_q"], dtype=torch.int32).view(B, 1, 1, 1)
        kw["seq_len_kv"] = torch.tensor(c["len_kv"], dtype=torch.int64)
    if mode in ("cu", "thd"):
        kw["use_padding_mask"] = True
        kw["cu_seq_len_q"] = torch.tensor([0, *itertools.accumulate(c["len_q"])], dtype=torch.int32)
        kw["cu_seq_len_kv"] = torch.tensor([0, *itertools.accumulate(c["len_kv"])], dtype=torch.int64)
    args = (q, k, v)
    if mode == "thd":
        args = (_pack(q, c["len_q"]), _pack(k, c["len_kv"]), _pack(v, c["len_kv"]))
        kw["max_seq_len_q"], kw["max_seq_len_kv"] = Sq, Skv
    o, stats, amax_s, amax_o = fs.sdpa_fp8(*args, *scale_tensors(s).values(), **kw)

    want = ref.forward(c["q"].double(), c["k"].double(), c["v"].double(), s, attn_scale=c["attn_scale"],
                       causal=c["causal"], len_q=c["len_q"], len_kv=c["len_kv"], p_dtype=c["fmt"], o_dtype=c["o_fmt"])
    assert o.dtype == c["o_fmt"] and stats.dtype == torch.float32
    assert amax_s.shape == (1, 1, 1, 1) and amax_o.shape == (1, 1, 1, 1)
    assert amax_s.item() == pytest.approx(float(want["amax_s"]), rel=1e-6, abs=0)
    assert amax_o.item() == pytest.approx(float(want["amax_o"]), rel=1e-6, abs=0)
    lens = c["len_q"] or [Sq] * B
    if mode == "thd":
        o = _unpack(o, c["len_q"], Sq)
        stats = _unpack(stats, c["len_q"], Sq)
    got_o, got_stats = o.to(torch.float64), stats[..., 0].to(torch.float64)
    want_stats = want["stats"] * (math.log2(math.e) if c["log2"] else 1.0)
    assert_fp8_close(torch.cat([got_o[b, :, :n].reshape(-1) for b, n in enumerate(lens)]),
                     torch.cat([want["o_stored"][b, :, :n].reshape(-1) for b, n in enumerate(lens)]), c["o_fmt"], "o")
    for b, n in enumerate(lens):
        torch.testing.assert_close(got_stats[b, :, :n], want_stats[b, :, :n].to(torch.float32).double(), rtol=1e-6,
                                   atol=1e-6)
        if mode in ("padded", "cu"):  # padded outputs: O rows 0, stats -inf
            assert torch.all(got_o[b, :, n:] == 0)
            assert torch.all(got_stats[b, :, n:] == -math.inf)


def test_score_max_and_sum_exp(fs):
    gen = torch.Generator().manual_seed(3)
    q, k, v = (fp8_randn((1, 2, 8, 32), E4M3, gen) for _ in range(3))
    s = dict(descale_q=1.0, descale_k=1.0, descale_v=1.0, descale_s=1 / 448, scale_s=448.0, scale_o=1.0)
    m = torch.empty(1, 2, 8, 1)
    z = torch.empty(1, 2, 8, 1)
    o, stats, amax_s, _ = fs.sdpa_fp8(q, k, v, *scale_tensors(s).values(), attn_scale=0.25, score_max=m,
                                      score_sum_exp=z)
    torch.testing.assert_close(m + torch.log(z), stats)
    # The largest probability of a row is exp(row max - LSE).
    assert amax_s.item() == pytest.approx(float(torch.exp(m - stats).max()), rel=1e-6)


# ---------------------------------------------------------------------------
# Backward
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(40))
def test_backward_matches_oracle(fs, seed):
    rng = random.Random(1000 + seed)
    gen = torch.Generator().manual_seed(1000 + seed)
    fmt, o_fmt, do_fmt = rng.choice([E4M3, E5M2]), rng.choice([E4M3, E5M2]), rng.choice([E4M3, E5M2])
    grad_fmt = rng.choice([do_fmt, E4M3, E5M2])
    B, Hk = rng.randint(1, 2), rng.choice([1, 2])
    Hq = Hk * rng.choice([1, 2])
    Hv = rng.choice([Hk, Hq])
    Sq, Skv, D, Dv = rng.randint(1, 16), rng.randint(1, 20), rng.choice([16, 32]), rng.choice([16, 32, 48])
    causal = rng.random() < 0.5
    attn_scale = f32(rng.choice([1 / math.sqrt(D), 0.5]))
    q = fp8_randn((B, Hq, Sq, D), fmt, gen)
    k = fp8_randn((B, Hk, Skv, D), fmt, gen)
    v = fp8_randn((B, Hv, Skv, Dv), fmt, gen)
    fwd_s = dict(descale_q=1.0, descale_k=1.0, descale_v=1.0, descale_s=f32(1 / 448), scale_s=448.0, scale_o=2.0)
    o, stats, _, _ = fs.sdpa_fp8(q, k, v, *scale_tensors(fwd_s).values(), attn_scale=attn_scale,
                                 use_causal_mask=causal, o_dtype=o_fmt)
    dO = fp8_randn((B, Hq, Sq, Dv), do_fmt, gen, rng.choice([0.5, 2.0]))
    s = random_scales(rng, BWD_SCALES, fmt)
    s["scale_dP"] = f32(rng.choice([256.0, 1000.0, 64.0]))
    s["descale_dP"] = f32(1 / s["scale_dP"])
    for n in ("scale_dQ", "scale_dK", "scale_dV"):
        s[n] = f32(rng.choice([1.0, 8.0, 30.0]))
    got = fs.sdpa_fp8_backward(q, k, v, o, dO, stats, *scale_tensors(s).values(), attn_scale=attn_scale,
                               use_causal_mask=causal, grad_dtype=grad_fmt)
    want = ref.backward(q.double(), k.double(), v.double(), o.double(), dO.double(), stats[..., 0].double(), s,
                        attn_scale=attn_scale, causal=causal, p_dtype=fmt, dp_dtype=do_fmt, grad_dtype=grad_fmt)
    for t, name in zip(got[:3], ("dq", "dk", "dv")):
        assert t.dtype == grad_fmt
        assert_fp8_close(t, want[f"{name}_stored"], grad_fmt, name)
    for t, name in zip(got[3:], ("amax_dq", "amax_dk", "amax_dv", "amax_dp")):
        assert t.shape == (1, 1, 1, 1) and t.dtype == torch.float32
        assert t.item() == pytest.approx(float(want[name]), rel=1e-6, abs=1e-30), name


@pytest.mark.parametrize("causal", [False, True])
def test_oracle_formulas_are_the_gradients(causal):
    """Without its quantization the oracle's backward is the float64 autograd gradient of its forward (so its
    formulas, attn_scale in dP and D from O included, are those of the gradient)."""
    gen = torch.Generator().manual_seed(5)
    B, Hq, Hk, Sq, Skv, D, Dv = 2, 4, 2, 6, 9, 16, 8
    q = torch.randn(B, Hq, Sq, D, generator=gen, dtype=torch.float64, requires_grad=True)
    k = torch.randn(B, Hk, Skv, D, generator=gen, dtype=torch.float64, requires_grad=True)
    v = torch.randn(B, Hk, Skv, Dv, generator=gen, dtype=torch.float64, requires_grad=True)
    s = {n: 1.0 for n in BWD_SCALES + ("scale_o",)}
    fwd = ref.forward(q, k, v, s, attn_scale=0.3, causal=causal)
    dO = torch.randn(B, Hq, Sq, Dv, generator=gen, dtype=torch.float64)
    dq, dk, dv = torch.autograd.grad(fwd["o"], (q, k, v), dO)
    got = ref.backward(q.detach(), k.detach(), v.detach(), fwd["o"].detach(), dO, fwd["stats"].detach(), s,
                       attn_scale=0.3, causal=causal)
    torch.testing.assert_close(got["dq"], dq)
    torch.testing.assert_close(got["dk"], dk)
    torch.testing.assert_close(got["dv"], dv)


# ---------------------------------------------------------------------------
# The conversions, against torch's float8 casts
# ---------------------------------------------------------------------------


def _one_key_output(fs, v: torch.Tensor, scale_o: float, o_fmt) -> torch.Tensor:
    """o of a call with one key and scale_s = descale_s = descale_v = 1: S = 1 exactly, so o = fp8(v * scale_o)."""
    q = torch.zeros(1, 1, 1, 16, dtype=v.dtype)
    s = dict(descale_q=1.0, descale_k=1.0, descale_v=1.0, descale_s=1.0, scale_s=1.0, scale_o=scale_o)
    o, _, _, _ = fs.sdpa_fp8(q, q, v, *scale_tensors(s).values(), o_dtype=o_fmt, generate_stats=False)
    return o


def _torch_quantize(v: torch.Tensor, scale: float, fmt) -> torch.Tensor:
    m = ref.FP8_MAX[fmt]
    return (v.to(torch.float32) * scale).clamp(-m, m).to(fmt)


def _same_bytes(got: torch.Tensor, want: torch.Tensor) -> bool:
    """Equal codes; NaN codes compared as NaN (either sign or payload) and zeros as zeros (the output is a sum that
    starts at +0, so a -0 input comes out +0, as it does from the kernels' accumulators)."""
    g, w = got.to(torch.float32), want.to(torch.float32)
    same = (got.view(torch.uint8) == want.view(torch.uint8)) | (torch.isnan(g) & torch.isnan(w)) | ((g == 0) & (w == 0))
    return bool(same.all())


@pytest.mark.parametrize("fmt", [E4M3, E5M2])
@pytest.mark.parametrize("o_fmt", [E4M3, E5M2])
def test_every_code_converts_as_torch(fs, fmt, o_fmt):
    """All 256 codes of fmt decoded and re-encoded in o_fmt (saturating: E5M2's inf and values past E4M3's 448)."""
    v = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(fmt).view(1, 1, 1, 256)
    o = _one_key_output(fs, v, 1.0, o_fmt)
    assert _same_bytes(o, _torch_quantize(v, 1.0, o_fmt))
    if fmt == o_fmt:  # finite nonzero codes round-trip unchanged (-0 comes out +0: see _same_bytes)
        keep = torch.isfinite(v.to(torch.float32)) & (v.to(torch.float32) != 0)
        assert torch.equal(o.view(torch.uint8)[keep], v.view(torch.uint8)[keep])
        assert int(keep.sum()) == (252 if fmt == E4M3 else 246)


@settings(max_examples=40, deadline=None, database=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(scale=st.floats(min_value=2.0**-24, max_value=2.0**24, width=32), fmt=st.sampled_from([E4M3, E5M2]),
       o_fmt=st.sampled_from([E4M3, E5M2]))
def test_scaled_codes_round_as_torch(fs, scale, fmt, o_fmt):
    """Every code times a float32 scale_o, rounded to o_fmt: nearest even with saturation, as torch (clamped)."""
    v = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(fmt).view(1, 1, 1, 256)
    assert _same_bytes(_one_key_output(fs, v, scale, o_fmt), _torch_quantize(v, scale, o_fmt))


# ---------------------------------------------------------------------------
# Bad input
# ---------------------------------------------------------------------------


def _inputs(fmt=E4M3, D=16):
    gen = torch.Generator().manual_seed(0)
    return [fp8_randn((1, 2, 4, D), fmt, gen) for _ in range(3)]


ONES = (1.0,) * 6


def test_bad_input_is_named(fs):
    q, k, v = _inputs()
    with pytest.raises(TypeError, match=r"q: dtype must be torch.float8_e4m3fn or torch.float8_e5m2"):
        fs.sdpa_fp8(q.to(torch.bfloat16), k, v, *ONES)
    with pytest.raises(TypeError, match=r"k: dtype float8_e5m2 differs from q's float8_e4m3fn"):
        fs.sdpa_fp8(q, k.to(torch.float32).to(E5M2), v, *ONES)
    with pytest.raises(ValueError, match=r"q: head dim D_qk = 24 must be a multiple of 16 with FP8 inputs"):
        fs.sdpa_fp8(*_inputs(D=24), *ONES)
    with pytest.raises(TypeError, match=r"descale_k: dtype must be float32"):
        fs.sdpa_fp8(q, k, v, 1.0, torch.ones(1, dtype=torch.float16), 1.0, 1.0, 1.0, 1.0)
    with pytest.raises(ValueError, match=r"scale_s: must have 1 element"):
        fs.sdpa_fp8(q, k, v, 1.0, 1.0, 1.0, 1.0, torch.ones(2), 1.0)
    with pytest.raises(ValueError, match=r"descale_v: must be finite, got inf"):
        fs.sdpa_fp8(q, k, v, 1.0, 1.0, math.inf, 1.0, 1.0, 1.0)
    with pytest.raises(TypeError, match=r"o_dtype: must be torch.float8_e4m3fn or torch.float8_e5m2"):
        fs.sdpa_fp8(q, k, v, *ONES, o_dtype=torch.bfloat16)
    with pytest.raises(TypeError, match=r"descale_q: must be a 1-element float32 tensor or a number"):
        fs.sdpa_fp8(q, k, v, "1", *ONES[1:])
    o, stats, _, _ = fs.sdpa_fp8(q, k, v, *ONES)
    with pytest.raises(ValueError, match=r"q: must be 4-D \(B, H, S, D\).*no packed \(THD\) layout"):
        fs.sdpa_fp8_backward(q[0], k[0], v[0], o[0], o[0], stats[0], *(1.0,) * 12)
    with pytest.raises(TypeError, match=r"grad_dtype: must be torch.float8_e4m3fn"):
        fs.sdpa_fp8_backward(q, k, v, o, o, stats, *(1.0,) * 12, grad_dtype=torch.float16)
    with pytest.raises(TypeError, match=r"dO: dtype must be torch.float8"):
        fs.sdpa_fp8_backward(q, k, v, o, o.to(torch.float32), stats, *(1.0,) * 12)


def test_flashspan_sdpa_with_fp8_tensors_names_what_fp8_needs(fs):
    """The 16-bit entry point with FP8 tensors: the C layer names the missing scale factor, or the option FP8 does
    not take (checked first)."""
    q, k, v = _inputs()
    with torch.no_grad():
        with pytest.raises(ValueError, match=r"descale_q: is required with FP8 inputs"):
            fs.sdpa(q, k, v)
        with pytest.raises(ValueError, match=r"bias: not supported with FP8 inputs \(the seed's sdpa_fp8 takes causal "
                                             r"and padding masks only\)"):
            fs.sdpa(q, k, v, bias=torch.zeros(1, 1, 4, 4))
        with pytest.raises(ValueError, match=r"softcap: not supported with FP8 inputs"):
            fs.sdpa(q, k, v, softcap=10.0)
        with pytest.raises(ValueError, match=r"diagonal_alignment: not supported with FP8 inputs"):
            fs.sdpa(q, k, v, diagonal_alignment="BOTTOM_RIGHT", diagonal_band_right_bound=0)


def test_generate_stats_and_is_inference(fs):
    q, k, v = _inputs()
    o, stats, amax_s, amax_o = fs.sdpa_fp8(q, k, v, *ONES, generate_stats=False)
    assert stats is None and o.shape == (1, 2, 4, 16)
    assert fs.sdpa_fp8(q, k, v, *ONES, generate_stats=None, is_inference=False)[1].shape == (1, 2, 4, 1)
    with pytest.raises(ValueError, match="is_inference, generate_stats"):
        fs.sdpa_fp8(q, k, v, *ONES, generate_stats=True, is_inference=True)
    # The deprecated flag alone (a new user's first try; generate_stats left at its default) works, with a warning.
    with pytest.warns(DeprecationWarning):
        assert fs.sdpa_fp8(q, k, v, *ONES, is_inference=True)[1] is None
    with pytest.warns(DeprecationWarning):
        assert fs.sdpa_fp8(q, k, v, *ONES, is_inference=False)[1].shape == (1, 2, 4, 1)
    assert fs.sdpa_fp8(q, k, v, *ONES)[1].shape == (1, 2, 4, 1)  # default: the stats


def test_exports(fs):
    assert "sdpa_fp8" in fs.__all__ and "sdpa_fp8_backward" in fs.__all__
    assert fs.sdpa_fp8.__doc__ and "amax_s" in fs.sdpa_fp8.__doc__


# ---------------------------------------------------------------------------
# The FP8 backward and the sm80 FP8 forward on CUDA tensors, on descriptors: no GPU needed
# ---------------------------------------------------------------------------


def _cuda_fp8_bwd_op(Hv=2, D=64, Dv=128, deterministic=False, attn_scale_tensor=None):
    """Creates an FP8 backward operation on CUDA descriptors (B = 2, H_q = 4, H_k = 2, S_q = 100, S_kv = 130, causal;
    E4M3 inputs, E5M2 dO and gradients) through the library's Python binding (its NotImplementedError on
    check_support's NOT_SUPPORTED). attn_scale_tensor: None (a float), "cpu" or "cuda"."""
    from flashspan import _lib as lib
    from flashspan import _sdpa_lib as L

    dev = torch.device("cuda", 0)

    def d(shape, dtype, device=dev):
        stride = [1] * len(shape)
        for i in range(len(shape) - 2, -1, -1):
            stride[i] = stride[i + 1] * shape[i + 1]
        return lib.TensorDesc.from_spec(shape, stride, dtype, device, "t")

    B, Hq, Hk, Sq, Skv = 2, 4, 2, 100, 130
    attrs = L.Attributes(True)
    attrs.set("causal_mask", 1)
    if deterministic:
        attrs.set("deterministic_algorithm", 1)
    if attn_scale_tensor is None:
        attrs.set("attn_scale", 0.125)
    else:
        attrs.set("attn_scale_tensor", d((1,), torch.float32, torch.device(attn_scale_tensor, 0)
                                         if attn_scale_tensor == "cuda" else torch.device("cpu")))
    for name in ("descale_q", "descale_k", "descale_v", "descale_o", "descale_do", "descale_s", "descale_dp",
                 "scale_s", "scale_dq", "scale_dk", "scale_dv", "scale_dp", "amax_dq", "amax_dk", "amax_dv", "amax_dp"):
        attrs.set(name, d((1, 1, 1, 1), torch.float32))
    descs = [d((B, Hq, Sq, D), E4M3), d((B, Hk, Skv, D), E4M3), d((B, Hv, Skv, Dv), E4M3), d((B, Hq, Sq, Dv), E4M3),
             d((B, Hq, Sq, Dv), E5M2), d((B, Hq, Sq, 1), torch.float32), d((B, Hq, Sq, D), E5M2),
             d((B, Hk, Skv, D), E5M2), d((B, Hv, Skv, Dv), E5M2)]
    return L.Op("bwd", descs, attrs)


BWD_ENV, SM80_ENV, EXPERIMENTAL_ENV = "FLASHSPAN_SDPA_FP8_BWD", "FLASHSPAN_SDPA_FP8_SM80", "FLASHSPAN_EXPERIMENTAL"
HK_NE_HV_ENV = "FLASHSPAN_SDPA_FP8_HK_NE_HV"
DEVICE_SCALE_ENV = "FLASHSPAN_SDPA_FP8_DEVICE_ATTN_SCALE"
THD_ENV = "FLASHSPAN_SDPA_FP8_THD"
BWD_OFF = (r"^dQ, dK, dV: the FP8 backward on CUDA tensors is turned off \(FLASHSPAN_SDPA_FP8_BWD=0\); CPU tensors run "
           r"sdpa_fp8_backward on the CPU reference$")


def _set_env(monkeypatch, name, value):
    """name set to value for the test (None: unset)."""
    if value is None:
        monkeypatch.delenv(name, raising=False)
    else:
        monkeypatch.setenv(name, value)


def _passes_host_rules(build):
    """Whether build() gets past the C layer's host rules: no NotImplementedError (without a GPU check_support then
    fails at the device with another error, which is not a refusal)."""
    try:
        build()
    except NotImplementedError:
        return False
    except Exception:  # noqa: BLE001 (no device here)
        pass
    return True


def _expect_switch(monkeypatch, name, value, experimental, builds, off):
    """A switch on by default (only "0" turns it off) set to value and FLASHSPAN_EXPERIMENTAL to experimental (None:
    unset): each of builds passes the host rules, unless value is "0": then it is refused with a message matching
    the regular expression off."""
    _set_env(monkeypatch, name, value)
    _set_env(monkeypatch, EXPERIMENTAL_ENV, experimental)
    for build in builds:
        if value == "0":
            with pytest.raises(NotImplementedError, match=off):
                build()
        else:
            assert _passes_host_rules(build), (name, value, experimental)


@pytest.mark.parametrize("experimental", [None, "0", "1"])
def test_cuda_fp8_backward_switch_off_refuses(fs, monkeypatch, experimental):
    """With FLASHSPAN_SDPA_FP8_BWD=0 (read per check_support) every FP8 backward on CUDA tensors is refused, before the
    rule's own refusals, naming the variable; FLASHSPAN_EXPERIMENTAL (its switch before) does not bring it back."""
    monkeypatch.setenv(BWD_ENV, "0")
    _set_env(monkeypatch, EXPERIMENTAL_ENV, experimental)
    for kw in ({}, dict(D=144), dict(Hv=4), dict(deterministic=True)):
        with pytest.raises(NotImplementedError, match=BWD_OFF):
            _cuda_fp8_bwd_op(**kw)


@pytest.mark.parametrize("value,experimental", [(None, None), (None, "0"), (None, "1"), ("1", None), ("", None),
                                                ("00", None), ("off", None)])
def test_cuda_fp8_backward_on_by_default(fs, monkeypatch, value, experimental):
    """The FP8 backward on CUDA tensors is on by default (since its GPU tests passed on an H200) and with
    FLASHSPAN_SDPA_FP8_BWD anything but "0", whatever FLASHSPAN_EXPERIMENTAL says: a covered call passes the host
    rules (deterministic too)."""
    _set_env(monkeypatch, BWD_ENV, value)
    _set_env(monkeypatch, EXPERIMENTAL_ENV, experimental)
    for det in (False, True):
        assert _passes_host_rules(lambda: _cuda_fp8_bwd_op(deterministic=det)), (value, experimental, det)


def test_cuda_fp8_backward_rule_is_named(fs, monkeypatch):
    """By default (FLASHSPAN_SDPA_FP8_BWD unset): what the FP8 backward does not run is named (sdpa_fp8_bwd_refusal)
    with the rule's message, deterministic or not (H_k != H_v with FLASHSPAN_SDPA_FP8_HK_NE_HV=0, set here); a
    covered call, deterministic too (the ordered dQ kernel with the FP8 steps), passes the host rules (without a GPU
    check_support then stops at the device, not on an FP8 rule)."""
    monkeypatch.delenv(BWD_ENV, raising=False)
    monkeypatch.delenv(EXPERIMENTAL_ENV, raising=False)
    monkeypatch.setenv(HK_NE_HV_ENV, "0")
    tail = (r": not supported by the FP8 backward on CUDA tensors yet \(it runs each head dim a multiple of 16 up to "
            r"128; H_k != H_v unless FLASHSPAN_SDPA_FP8_HK_NE_HV=0\); CPU tensors run it on the CPU reference$")
    dims = r"head dims \(multiples of 16 up to 128\)"
    heads = r"H_k != H_v \(FLASHSPAN_SDPA_FP8_HK_NE_HV=0\)"
    for kw, what in ((dict(D=144), dims), (dict(Dv=256), dims), (dict(D=192), dims), (dict(Hv=4), heads),
                     (dict(D=144, Hv=4), dims)):
        for det in (False, True):
            with pytest.raises(NotImplementedError, match=f"^{what}{tail}"):
                _cuda_fp8_bwd_op(**kw, deterministic=det)
    # attn_scale as a device tensor too (the FP8 kernels' factor; test_cuda_fp8_device_attn_scale_switch: its switch).
    monkeypatch.delenv(DEVICE_SCALE_ENV, raising=False)
    for kw in ({}, dict(attn_scale_tensor="cpu"), dict(attn_scale_tensor="cuda"), dict(D=16, Dv=16),
               dict(D=128, Dv=128)):
        for det in (False, True):
            try:
                _cuda_fp8_bwd_op(**kw, deterministic=det)
            except NotImplementedError as e:  # the FP8 rules: a failure; the device's (no GPU here, an old one): not
                msg = str(e)
                assert "FP8" not in msg and "attn_scale" not in msg and "deterministic" not in msg, (kw, det, msg)
            except Exception:  # noqa: BLE001 (no device here)
                pass


def _cuda_fp8_fwd_op(D=256, Dv=256, Hv=2, attn_scale_tensor=False):
    """Creates an FP8 forward operation on CUDA descriptors (B = 2, H_q = 4, H_k = 2, H_v = Hv, S_q = 100,
    S_kv = 130, E4M3; by default head dims (256, 256), which only the FP8 forward on the sm80 kernels runs; attn_scale
    a float, or with attn_scale_tensor a CUDA tensor) through the library's Python binding (its NotImplementedError on
    check_support's NOT_SUPPORTED)."""
    from flashspan import _lib as lib
    from flashspan import _sdpa_lib as L

    dev = torch.device("cuda", 0)

    def d(shape, dtype):
        stride = [1] * len(shape)
        for i in range(len(shape) - 2, -1, -1):
            stride[i] = stride[i + 1] * shape[i + 1]
        return lib.TensorDesc.from_spec(shape, stride, dtype, dev, "t")

    B, Hq, Hk, Sq, Skv = 2, 4, 2, 100, 130
    attrs = L.Attributes(False)
    if attn_scale_tensor:
        attrs.set("attn_scale_tensor", d((1,), torch.float32))
    else:
        attrs.set("attn_scale", 0.125)
    attrs.set("generate_stats", 1)
    for name in ("descale_q", "descale_k", "descale_v", "descale_s", "scale_s", "scale_o", "amax_s", "amax_o"):
        attrs.set(name, d((1, 1, 1, 1), torch.float32))
    descs = [d((B, Hq, Sq, D), E4M3), d((B, Hk, Skv, D), E4M3), d((B, Hv, Skv, Dv), E4M3), d((B, Hq, Sq, Dv), E4M3),
             d((B, Hq, Sq, 1), torch.float32)]
    return L.Op("fwd", descs, attrs)


@pytest.mark.parametrize("value,experimental", [(None, None), (None, "0"), (None, "1"), ("1", None), ("", None),
                                                ("off", None), ("0", None), ("0", "1")])
def test_cuda_fp8_forward_on_sm80_switch(fs, monkeypatch, value, experimental):
    """The FP8 forward on the sm80 kernels is on by default (since its GPU tests passed on an H200): an FP8 forward
    with head dims (256, 256), which the sm90 FP8 forward does not run, passes the host rules; with
    FLASHSPAN_SDPA_FP8_SM80=0 (read per check_support; only "0") it is refused by the sm90 one's head-dim rule,
    whatever FLASHSPAN_EXPERIMENTAL says. FLASHSPAN_SM90_SDPA_FP8 unset (the sm90 one on)."""
    monkeypatch.delenv("FLASHSPAN_SM90_SDPA_FP8", raising=False)
    _set_env(monkeypatch, SM80_ENV, value)
    _set_env(monkeypatch, EXPERIMENTAL_ENV, experimental)
    if value == "0":
        with pytest.raises(NotImplementedError, match=r"^head dims \(multiples of 16 up to 128\): not supported with "
                                                      r"FP8 inputs on CUDA tensors yet"):
            _cuda_fp8_fwd_op()
    else:
        assert _passes_host_rules(_cuda_fp8_fwd_op), (value, experimental)
    # Head dims neither FP8 forward runs are refused either way (not a device failure).
    with pytest.raises(NotImplementedError, match=r"^head dims"):
        _cuda_fp8_fwd_op(144, 144)


@pytest.mark.parametrize("value,experimental", [(None, None), (None, "0"), (None, "1"), ("1", None), ("", None),
                                                ("off", None), ("0", None), ("0", "1")])
def test_cuda_fp8_hk_ne_hv_switch(fs, monkeypatch, value, experimental):
    """H_k != H_v in CUDA FP8 calls is on by default (since its GPU tests passed on an H100): an FP8 forward (both
    forwards' head dims) and backward with H_k 2, H_v 4 pass the host rules; with FLASHSPAN_SDPA_FP8_HK_NE_HV=0 (read
    per check_support; only "0") both are refused, naming the variable, whatever FLASHSPAN_EXPERIMENTAL says (its
    switch before)."""
    for name in ("FLASHSPAN_SM90_SDPA_FP8", SM80_ENV, BWD_ENV):
        monkeypatch.delenv(name, raising=False)
    builds = (lambda: _cuda_fp8_fwd_op(64, 64, Hv=4), lambda: _cuda_fp8_fwd_op(Hv=4), lambda: _cuda_fp8_bwd_op(Hv=4))
    _expect_switch(monkeypatch, HK_NE_HV_ENV, value, experimental, builds,
                   r"^H_k != H_v \(FLASHSPAN_SDPA_FP8_HK_NE_HV=0\): not supported")


def _cuda_fp8_thd_fwd_op(D=64):
    """Creates a packed (THD) FP8 forward operation on CUDA descriptors (B = 2, H_q = 4, H_k = H_v = 2, S_q = 100,
    S_kv = 130, head dims (D, D), E4M3): packed [B, S, H, D] storage (row stride H D) behind the [B, H, S, D]
    descriptors, ragged offsets of q, k, v, o, stats in tokens times that stride, the padding mask with seq_len; as
    _cuda_fp8_fwd_op (its NotImplementedError on check_support's NOT_SUPPORTED)."""
    from flashspan import _lib as lib
    from flashspan import _sdpa_lib as L

    dev = torch.device("cuda", 0)
    B, Hq, Hk, Sq, Skv = 2, 4, 2, 100, 130

    def d(shape, dtype, stride=None):
        if stride is None:
            stride = [1] * len(shape)
            for i in range(len(shape) - 2, -1, -1):
                stride[i] = stride[i + 1] * shape[i + 1]
        return lib.TensorDesc.from_spec(shape, stride, dtype, dev, "t")

    def packed(H, S, dd, dtype):
        return d((B, H, S, dd), dtype, (S * H * dd, dd, H * dd, 1))

    attrs = L.Attributes(False)
    attrs.set("attn_scale", 0.125)
    attrs.set("generate_stats", 1)
    attrs.set("padding_mask", 1)
    attrs.set("seq_len_q", d((B, 1, 1, 1), torch.int32))
    attrs.set("seq_len_kv", d((B, 1, 1, 1), torch.int32))
    for name in ("descale_q", "descale_k", "descale_v", "descale_s", "scale_s", "scale_o", "amax_s", "amax_o"):
        attrs.set(name, d((1, 1, 1, 1), torch.float32))
    for slot, mult in ((L.Q, Hq * D), (L.K, Hk * D), (L.V, Hk * D), (L.O, Hq * D), (L.STATS, Hq)):
        attrs.set_ragged_offset(slot, d((B + 1, 1, 1, 1), torch.int32), mult)
    descs = [packed(Hq, Sq, D, E4M3), packed(Hk, Skv, D, E4M3), packed(Hk, Skv, D, E4M3), packed(Hq, Sq, D, E4M3),
             packed(Hq, Sq, 1, torch.float32)]
    return L.Op("fwd", descs, attrs)


@pytest.mark.parametrize("value,experimental", [(None, None), (None, "0"), (None, "1"), ("1", None), ("", None),
                                                ("off", None), ("0", None), ("0", "1")])
def test_cuda_fp8_thd_switch(fs, monkeypatch, value, experimental):
    """Packed (THD) tensors on the sm80 FP8 forward are on by default (since its GPU tests passed on an H200): packed
    FP8 forwards (head dims 64, and 256, which only the sm80 one runs) pass the host rules; with
    FLASHSPAN_SDPA_FP8_THD=0 (read per check_support; only "0") both are refused, naming the variable, whatever
    FLASHSPAN_EXPERIMENTAL says (its switch before). FLASHSPAN_SM90_SDPA_FP8=0 here: the sm90 FP8 forward's packed
    tensors are its own switch's."""
    for name in (SM80_ENV, HK_NE_HV_ENV):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("FLASHSPAN_SM90_SDPA_FP8", "0")
    builds = (lambda: _cuda_fp8_thd_fwd_op(64), lambda: _cuda_fp8_thd_fwd_op(256))
    _expect_switch(monkeypatch, THD_ENV, value, experimental, builds,
                   r"^ragged \(packed THD\) q, k, v, o or stats \(FLASHSPAN_SDPA_FP8_THD=0\): not supported with FP8 "
                   r"inputs on CUDA tensors yet")


def test_attn_scale_tensor_goes_to_the_c_layer(fs, monkeypatch):
    """Both FP8 directions hand an attn_scale tensor to the C layer as it is, bound to its slot (no host read: the
    FP8 kernels read a device one as one of their factors, without a device sync; flashspan.sdpa's _scale_on_host,
    which reads one on the host for the 16-bit kernels, is not called), and a float as the scalar option. On CPU
    tensors: a host attn_scale tensor (1-element or 0-d) gives the float's results bitwise, and its value is what runs
    (twice the value, the float's results at twice the scale)."""
    import importlib

    from flashspan import _sdpa_lib as L

    sdpa_mod = importlib.import_module("flashspan.sdpa")

    def no_host_read(call):
        raise AssertionError("an FP8 call went through _scale_on_host")

    monkeypatch.setattr(sdpa_mod, "_scale_on_host", no_host_read)
    real_run = sdpa_mod._Call.run
    seen = []

    def spy(call):
        bound = call.slots.get(L.ATTN_SCALE)
        seen.append((call.direction, None if bound is None else float(bound.tensor.reshape(-1)[0]),
                     dict(call.options).get("attn_scale")))
        return real_run(call)

    monkeypatch.setattr(sdpa_mod._Call, "run", spy)
    gen = torch.Generator().manual_seed(11)
    q, k, v = (fp8_randn((1, 2, 9, 32), E4M3, gen) for _ in range(3))
    fwd_s = (1.0, 1.0, 1.0, 1 / 448, 448.0, 2.0)
    o, stats, *amax = fs.sdpa_fp8(q, k, v, *fwd_s, attn_scale=0.3, use_causal_mask=True)
    o_t, stats_t, *amax_t = fs.sdpa_fp8(q, k, v, *fwd_s, attn_scale=torch.tensor([0.3]), use_causal_mask=True)
    assert seen == [("fwd", None, 0.3), ("fwd", f32(0.3), None)]
    assert torch.equal(o.view(torch.uint8), o_t.view(torch.uint8)) and torch.equal(stats, stats_t)
    assert all(torch.equal(a, b) for a, b in zip(amax, amax_t))
    dO = fp8_randn((1, 2, 9, 32), E5M2, gen)
    bwd_s = (1.0, 1.0, 1.0, 0.5, 1.0, 1 / 448, 1 / 256, 448.0, 4.0, 4.0, 4.0, 256.0)
    seen.clear()
    want = fs.sdpa_fp8_backward(q, k, v, o, dO, stats, *bwd_s, attn_scale=0.3, use_causal_mask=True)
    got = fs.sdpa_fp8_backward(q, k, v, o, dO, stats, *bwd_s, attn_scale=torch.tensor(0.3), use_causal_mask=True,
                               use_deterministic_algorithm=True)
    assert seen == [("bwd", None, 0.3), ("bwd", f32(0.3), None)]
    for g, w in zip(got, want):
        assert torch.equal(g.view(torch.uint8), w.view(torch.uint8))
    o6 = fs.sdpa_fp8(q, k, v, *fwd_s, attn_scale=0.6, use_causal_mask=True)[0]
    o6_t = fs.sdpa_fp8(q, k, v, *fwd_s, attn_scale=torch.tensor([0.6]), use_causal_mask=True)[0]
    assert torch.equal(o6_t.view(torch.uint8), o6.view(torch.uint8))
    assert not torch.equal(o6_t.view(torch.uint8), o.view(torch.uint8))
    g6 = fs.sdpa_fp8_backward(q, k, v, o, dO, stats, *bwd_s, attn_scale=torch.tensor([0.6]), use_causal_mask=True)
    assert not torch.equal(g6[0].view(torch.uint8), want[0].view(torch.uint8))


@pytest.mark.parametrize("value,experimental", [(None, None), (None, "0"), (None, "1"), ("1", None), ("", None),
                                                ("off", None), ("0", None), ("0", "1")])
def test_cuda_fp8_device_attn_scale_switch(fs, monkeypatch, value, experimental):
    """attn_scale as a device tensor in CUDA FP8 calls is on by default (since its GPU test passed on an H100): an FP8
    forward (both forwards' head dims) and backward with one pass the host rules; with
    FLASHSPAN_SDPA_FP8_DEVICE_ATTN_SCALE=0 (read per check_support; only "0") each is refused, naming the variable,
    whatever FLASHSPAN_EXPERIMENTAL says (its switch before). A host attn_scale tensor passes either way."""
    for name in ("FLASHSPAN_SM90_SDPA_FP8", SM80_ENV, BWD_ENV, HK_NE_HV_ENV):
        monkeypatch.delenv(name, raising=False)
    builds = (lambda: _cuda_fp8_fwd_op(64, 64, attn_scale_tensor=True),
              lambda: _cuda_fp8_fwd_op(attn_scale_tensor=True), lambda: _cuda_fp8_bwd_op(attn_scale_tensor="cuda"))
    _expect_switch(monkeypatch, DEVICE_SCALE_ENV, value, experimental, builds,
                   r"^attn_scale as a device tensor: turned off in FP8 calls on CUDA tensors by "
                   r"FLASHSPAN_SDPA_FP8_DEVICE_ATTN_SCALE=0: pass it as a float or a host tensor, or unset the "
                   r"variable$")
    assert _passes_host_rules(lambda: _cuda_fp8_bwd_op(attn_scale_tensor="cpu")), (value, experimental)
