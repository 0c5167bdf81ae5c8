"""flashspan.sdpa_fp8 on CUDA tensors (the sm90 FP8 forward, kernel_fwd_sm90.cuh sdpa_fp8_fwd_kernel_sm90) against the
same call on CPU copies (the CPU reference, itself checked against the float64 oracle by test_sdpa_fp8_cpu.py): the
Python surface end to end on the GPU -- device and host scale tensors, o in either format, the LSE in both bases,
score_max / score_sum_exp, amax_s / amax_o, causal, padding by seq_len and cu_seq_len on padded tensors with
NaN-poisoned padding, GQA / MQA. Skipped without an sm_90 device. With the sm90 one off, the FP8 forward on the sm80
kernels (every GPU from sm_80; on by default since these tests passed on an H200, FLASHSPAN_SDPA_FP8_SM80=0 turns it
off: test_gpu_fp8_forward_on_sm80_kernels, test_gpu_fp8_forward_sm80_switch_off).

flashspan.sdpa_fp8_backward on CUDA tensors (the FP8 backward on the sm80 kernels, every GPU from sm_80; on by
default since these tests passed on an H200, run here in the default environment) against the same call on CPU copies
and both against a float64 model of the kernel's arithmetic (_bwd_model: the criterion of
tests/cpp/test_sdpa_fp8_gpu.cpp, whose file comment derives it): GQA, both formats, causal or not, factors and attn_scale as numbers, host or device
tensors, BHSD, BSHD and odd row strides (sliced views), deterministic every third case (run twice: bitwise the same
results); with FLASHSPAN_SDPA_FP8_BWD=0 the call raises NotImplementedError naming it. Skipped without a CUDA device of
compute capability 8.0 or newer. A CUDA attn_scale tensor works in both directions (read on the host).

Criteria: FP8 wgmma accumulates the scores with reduced precision (DeepSeek-V3, arXiv 2412.19437 s. 3.3.2), so the GPU
and the CPU reference may round P and O to neighbouring FP8 values: O within two steps of the format (relative to
max |O|) elementwise and 2 unit roundoffs in relative L2 (tests/cpp/test_sdpa_fp8_gpu.cpp has the kernel's exact
bounds); the statistics within 1e-3 relative to max(1, |LSE|), amax_s within that relative, amax_o within two steps.
"""

import itertools
import math
import random

import pytest
import torch

import sdpa_fp8_ref as ref
from conftest import cuda_ready

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2
FP8_MAX = {E4M3: 448.0, E5M2: 57344.0}
UNIT = {E4M3: 2.0**-4, E5M2: 2.0**-3}  # unit roundoff of the format (3 / 2 mantissa bits)


def _sm90() -> bool:
    return cuda_ready() and torch.cuda.get_device_capability(0) == (9, 0)


def _sm80() -> bool:
    return cuda_ready() and torch.cuda.get_device_capability(0) >= (8, 0)


sm90 = pytest.mark.skipif(not _sm90(), reason="the FP8 forward runs on an sm_90 device (H100 / H200) only")
sm80 = pytest.mark.skipif(not _sm80(), reason="the FP8 backward runs on a CUDA device of compute capability 8.0+")


@pytest.fixture(autouse=True)
def _fp8_on(monkeypatch):
    # The FP8 kernels' switches (dispatch/sdpa_launch.h sdpa_fp8_sm90_enabled, sdpa_fp8_fwd_sm80_enabled,
    # sdpa_fp8_bwd_enabled): on by default; the tests start from the default environment and turn one off where they
    # say so.
    for name in ("FLASHSPAN_SM90_SDPA_FP8", "FLASHSPAN_SDPA_FP8_SM80", "FLASHSPAN_SDPA_FP8_BWD", "FLASHSPAN_SM90_SDPA_FP8_BWD"):
        monkeypatch.delenv(name, raising=False)


def _randn(shape, dtype, gen, mag):
    x = torch.randn(shape, generator=gen, dtype=torch.float32) * mag
    return x.clamp(-FP8_MAX[dtype] / 2, FP8_MAX[dtype] / 2).to(dtype)


def _case(seed: int, dims=None) -> dict:
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    fmt = rng.choice([E4M3, E5M2])
    B, Hk = rng.randint(1, 3), rng.choice([1, 2])
    Hq = Hk * rng.choice([1, 2, 4])
    Sq, Skv = rng.randint(1, 600), rng.randint(1, 700)
    D = rng.choice([64, 128, 32, 96, 112])
    Dv = D if rng.random() < 0.7 else rng.choice([64, 128, 48])
    if dims is not None:
        D, Dv = dims
    mag = rng.choice([0.5, 1.0, 2.0])
    q = _randn((B, Hq, Sq, D), fmt, gen, mag)
    k = _randn((B, Hk, Skv, D), fmt, gen, mag)
    v = _randn((B, Hk, Skv, Dv), fmt, gen, mag)
    scale_s = FP8_MAX[fmt] * rng.choice([1.0, 0.5])
    s = dict(descale_q=rng.uniform(0.5, 2.0), descale_k=rng.uniform(0.5, 2.0), descale_v=rng.uniform(0.5, 2.0),
             descale_s=1.0 / scale_s, scale_s=scale_s, scale_o=rng.choice([1.0, 4.0, 0.5]))
    mode = rng.choice(["dense", "padded", "cu"])
    len_q = [rng.randint(0, Sq) for _ in range(B)] if mode != "dense" else None
    len_kv = [rng.randint(0, Skv) for _ in range(B)] if mode != "dense" else None
    return dict(q=q, k=k, v=v, s=s, fmt=fmt, o_fmt=rng.choice([fmt, E4M3, E5M2]), causal=rng.random() < 0.5,
                mode=mode, len_q=len_q, len_kv=len_kv, attn_scale=1.0 / math.sqrt(D), log2=rng.random() < 0.3,
                device_scales=rng.random() < 0.5, stats_out=rng.random() < 0.5)


def _run(fs, c: dict, device: str):
    q, k, v = (c[n].to(device) for n in ("q", "k", "v"))
    B, Hq, Sq = q.shape[0], q.shape[1], q.shape[2]
    if c["mode"] != "dense":
        # Padding holds NaN (0x7F in both formats): neither side may read it.
        q, k, v = q.clone(), k.clone(), v.clone()
        for b in range(B):
            q.view(torch.uint8)[b, :, c["len_q"][b]:] = 0x7F
            k.view(torch.uint8)[b, :, c["len_kv"][b]:] = 0x7F
            v.view(torch.uint8)[b, :, c["len_kv"][b]:] = 0x7F
    scale_dev = device if c["device_scales"] else "cpu"
    scales = [torch.full((1, 1, 1, 1), c["s"][n], dtype=torch.float32, device=scale_dev)
              for n in ("descale_q", "descale_k", "descale_v", "descale_s", "scale_s", "scale_o")]
    kw = dict(attn_scale=c["attn_scale"], use_causal_mask=c["causal"], o_dtype=c["o_fmt"], stats_use_log2=c["log2"])
    if c["mode"] == "padded":
        kw.update(use_padding_mask=True,
                  seq_len_q=torch.tensor(c["len_q"], dtype=torch.int32, device=device).view(B, 1, 1, 1),
                  seq_len_kv=torch.tensor(c["len_kv"], dtype=torch.int64, device=device))
    elif c["mode"] == "cu":
        kw.update(use_padding_mask=True,
                  cu_seq_len_q=torch.tensor([0, *itertools.accumulate(c["len_q"])], dtype=torch.int32, device=device),
                  cu_seq_len_kv=torch.tensor([0, *itertools.accumulate(c["len_kv"])], dtype=torch.int32,
                                             device=device))
    extra = {}
    if c["stats_out"]:
        extra = dict(score_max=torch.full((B, Hq, Sq, 1), math.nan, device=device),
                     score_sum_exp=torch.full((B, Hq, Sq, 1), math.nan, device=device))
    o, stats, amax_s, amax_o = fs.sdpa_fp8(q, k, v, *scales, **kw, **extra)
    out = dict(o=o, stats=stats, amax_s=amax_s, amax_o=amax_o, **extra)
    return {n: t.cpu() for n, t in out.items()}


@sm90
@pytest.mark.parametrize("seed", range(40))
def test_gpu_fp8_forward_matches_cpu_reference(fs, seed):
    _check_forward(fs, _case(seed))


@sm80
@pytest.mark.parametrize("seed", range(100, 116))
def test_gpu_fp8_forward_on_sm80_kernels(fs, seed, monkeypatch):
    """The FP8 forward on the sm80 kernels (on by default; passed on an H200 on 2026-12-05) with the sm90 one off
    (FLASHSPAN_SM90_SDPA_FP8=0, set before the signature's first call: Python keeps one operation per signature), the
    head dims the sm90 one does not run too ((192, 128), (256, 256))."""
    monkeypatch.setenv("FLASHSPAN_SM90_SDPA_FP8", "0")
    dims = [(48, 48), (64, 64), (192, 128), (16, 32), (128, 128), (256, 256), (96, 64), (112, 112)][seed % 8]
    _check_forward(fs, _case(seed, dims))


@sm80
def test_gpu_fp8_forward_sm80_switch_off(fs, monkeypatch):
    """FLASHSPAN_SDPA_FP8_SM80=0 (read when an operation is first checked) leaves FP8 forwards to the sm90 one: head
    dims (256, 256), which only the sm80 kernels run, are refused by its rule (before any device check); unset (the
    default), the same call runs. A signature no other test here uses (the operation cache keeps a call checked
    once; a refused call is not kept)."""
    gen = torch.Generator().manual_seed(5)
    q, k, v = (_randn((1, 1, 5, 256), E4M3, gen, 8.0).to("cuda") for _ in range(3))
    args = (q, k, v, 1.0, 1.0, 1.0, 1 / 448, 448.0, 1.0)
    for experimental in (None, "1"):  # FLASHSPAN_EXPERIMENTAL (its switch before) does not bring it back
        if experimental is None:
            monkeypatch.delenv("FLASHSPAN_EXPERIMENTAL", raising=False)
        else:
            monkeypatch.setenv("FLASHSPAN_EXPERIMENTAL", experimental)
        monkeypatch.setenv("FLASHSPAN_SDPA_FP8_SM80", "0")
        with pytest.raises(NotImplementedError, match=r"^head dims \(multiples of 16 up to 128\): not supported with "
                                                      r"FP8 inputs on CUDA tensors yet"):
            fs.sdpa_fp8(*args, attn_scale=0.0625)
    monkeypatch.delenv("FLASHSPAN_SDPA_FP8_SM80")
    o = fs.sdpa_fp8(*args, attn_scale=0.0625)[0]
    assert o.device.type == "cuda" and o.shape == (1, 1, 5, 256) and o.dtype == E4M3
    assert not torch.isnan(o.to(torch.float32)).any()


def _check_forward(fs, c: dict):
    got = _run(fs, c, "cuda")
    want = _run(fs, c, "cpu")
    B, Sq = c["q"].shape[0], c["q"].shape[2]
    lens = c["len_q"] or [Sq] * B
    assert got["o"].dtype == c["o_fmt"] and got["stats"].dtype == torch.float32
    go, wo = got["o"].to(torch.float64), want["o"].to(torch.float64)
    assert not torch.isnan(go).any(), "NaN in O (padding read?)"
    rows = lambda t: torch.cat([t[b, :, :n].reshape(-1) for b, n in enumerate(lens)])  # noqa: E731
    g, w = rows(go), rows(wo)
    if g.numel():
        top = float(w.abs().max())
        u = max(UNIT[c["fmt"]], UNIT[c["o_fmt"]])
        assert float((g - w).abs().max()) <= 2 * u * top + 1e-6, "O: an element more than two FP8 steps off"
        assert float((g - w).norm()) <= 2 * u * float(w.norm()) + 1e-6, "O: relative L2 error"
    for b, n in enumerate(lens):
        gs, ws = got["stats"][b, :, :n, 0].double(), want["stats"][b, :, :n, 0].double()
        fin = torch.isfinite(ws)
        assert torch.equal(fin, torch.isfinite(gs)), "stats: -inf rows differ"
        tol = 1e-3 * torch.clamp(ws[fin].abs(), min=1.0)
        assert bool(((gs[fin] - ws[fin]).abs() <= tol).all()), "stats"
        if c["mode"] != "dense":  # rows past the sample: O = 0, stats -inf
            assert torch.all(go[b, :, n:] == 0) and torch.all(got["stats"][b, :, n:] == -math.inf)
        if c["stats_out"]:
            gm, wm = got["score_max"][b, :, :n, 0].double(), want["score_max"][b, :, :n, 0].double()
            fin_m = torch.isfinite(wm)
            assert torch.equal(fin_m, torch.isfinite(gm)), "score_max: -inf rows differ"
            assert bool(((gm[fin_m] - wm[fin_m]).abs() <= 1e-3 * torch.clamp(wm[fin_m].abs(), min=1.0)).all())
            gz, wz = got["score_sum_exp"][b, :, :n, 0].double(), want["score_sum_exp"][b, :, :n, 0].double()
            # sum_exp = exp(LSE - score_max): its relative error is the LSE's absolute one (the C++ tests' rule). FP8
            # wgmma keeps about 14 bits in its accumulation (DeepSeek-V3, arXiv 2412.19437 s. 3.3.2): over 1e-3 relative
            # in a row seen on an H100 (seed 4 of test_gpu_fp8_forward_hk_ne_hv), the old bound.
            rel_se = torch.where(fin, 1e-3 * torch.clamp(ws.abs(), min=1.0), torch.zeros_like(ws))
            assert bool(((gz - wz).abs() <= rel_se * wz.abs() + 1e-12).all()), "score_sum_exp"
    lse_max = max(1.0, float(want["stats"][torch.isfinite(want["stats"])].abs().max())) if torch.isfinite(
        want["stats"]).any() else 1.0
    assert got["amax_s"].item() == pytest.approx(want["amax_s"].item(), rel=1e-3 * lse_max, abs=1e-12)
    u_o = UNIT[c["o_fmt"]]
    assert abs(got["amax_o"].item() - want["amax_o"].item()) <= 2 * u_o * want["amax_o"].item() + 1e-6


@sm90
def test_gpu_fp8_forward_runs_the_kernel(fs):
    """A CUDA FP8 call reaches the sm90 kernel (not refused), and its O is on the device in o's format."""
    c = _case(7)
    c.update(mode="dense", len_q=None, len_kv=None)
    got = _run(fs, c, "cuda")
    assert got["o"].shape[:3] == c["q"].shape[:3] and got["o"].shape[3] == c["v"].shape[3]


# ---------------------------------------------------------------------------
# The FP8 backward (every GPU from sm_80; on by default since these tests passed on an H200, FLASHSPAN_SDPA_FP8_BWD=0
# turns it off)
# ---------------------------------------------------------------------------
#
# Criterion (tests/cpp/test_sdpa_fp8_gpu.cpp derives it): the kernel computes P, dS, D, dP in fp32 where the model
# computes them in float64, so S8 = fp8_q(P scale_s) and dP8 = fp8_dO(dP scale_dP) may round to a neighbouring code
# where the value lies within the kernel's error of a rounding boundary. _bwd_model bounds that error (products of
# FP8 values exact; an fp32 sum of n terms within (n + 16) 2^-22 sum |terms|; exp2 and its argument within
# (|x| + |LSE|) 2^-21 + 2^-20 relative; everything times 2), takes the span of the codes each S8 / dP8 term may take
# (0 away from the boundaries) and carries it through the sums: a = unit (sum span |operand| + gamma(n) sum |terms|).
# Each stored gradient is within a + one step of its format of y = dX scale_dX, and all but 1 % (+ 2) are the
# rounding of a value within a of y; the fp32 amaxes lie in [max(|x| - a), max(|x| + a)]. A factor off by 2x, a
# zeroed row or an amax taken after the FP8 rounding fails (test_bwd_criterion_rejects_a_wrong_factor here, the C++
# SdpaFp8Loop.BackwardCriterionRejectsWrongResults: on the CPU reference).

BWD_SCALES = ("descale_q", "descale_k", "descale_v", "descale_o", "descale_dO", "descale_s", "descale_dP", "scale_s",
              "scale_dQ", "scale_dK", "scale_dV", "scale_dP")
K_SAFETY = 2.0
BWD_ENV, EXPERIMENTAL = "FLASHSPAN_SDPA_FP8_BWD", "FLASHSPAN_EXPERIMENTAL"


def _f32(x: float) -> float:
    return float(torch.tensor(x, dtype=torch.float32))


def _gamma(n: int) -> float:
    """Bound of an fp32 sum of n terms (any order), relative to the sum of their magnitudes, with room to spare."""
    return (n + 16) * 2.0**-22


def _heads(x: torch.Tensor, H: int) -> torch.Tensor:
    return x.repeat_interleave(H // x.shape[1], dim=1)


def _group_sum(x: torch.Tensor, Hk: int) -> torch.Tensor:
    """[B, H_q, ...] summed over the query heads of each key head: [B, H_k, ...]."""
    B, H = x.shape[:2]
    return x.reshape(B, Hk, H // Hk, *x.shape[2:]).sum(2)


def _span(x: torch.Tensor, e: torch.Tensor, dtype) -> torch.Tensor:
    """The distance between the lowest and highest code a value within e of x rounds to."""
    return ref.quantize(x + e, dtype) - ref.quantize(x - e, dtype)


def _bwd_model(q, k, v, o, dO, stats, s: dict, attn_scale: float, causal: bool, fmt, do_fmt) -> dict:
    """The backward's formulas on float64 raw values (stats: [B, H_q, S_q] the fp32 LSE) with the bounds of the kernel's
    fp32 values. Returns dq, dk, dv (real) and a_dq, a_dk, a_dv (their bounds before the output rounding), amax_dp
    and [amax_dp_lo, amax_dp_hi]."""
    B, H, Sq, Dqk = q.shape
    Hk, Hv, Skv, Dv = k.shape[1], v.shape[1], k.shape[2], v.shape[3]
    vis = ref.visibility(B, H, Sq, Skv, causal)
    kh, vh = _heads(k, H), _heads(v, H)
    c_s = attn_scale * s["descale_q"] * s["descale_k"]
    x = c_s * (q @ kh.transpose(-1, -2))
    es = abs(c_s) * _gamma(Dqk) * (q.abs() @ kh.abs().transpose(-1, -2))
    lse = stats.unsqueeze(-1)
    p = torch.where(vis, torch.exp(torch.where(vis, x - lse, 0)), 0)
    dx = es + (x.abs() + lse.abs()) * 2.0**-21 + 2.0**-20
    c_ds, c_d = s["descale_dO"] * s["descale_v"], s["descale_dO"] * s["descale_o"]
    ds = c_ds * (dO @ vh.transpose(-1, -2))
    eds = abs(c_ds) * _gamma(Dv) * (dO.abs() @ vh.abs().transpose(-1, -2)) + ds.abs() * 2.0**-22
    d = c_d * (dO * o).sum(-1, keepdim=True)
    ed = abs(c_d) * _gamma(Dv) * (dO * o).abs().sum(-1, keepdim=True) + d.abs() * 2.0**-22
    dp = torch.where(vis, attn_scale * p * (ds - d), 0)
    ep = K_SAFETY * p * dx
    edp = K_SAFETY * (abs(attn_scale) * (p * dx * (ds - d).abs() + p * (eds + ed)) + dp.abs() * 2.0**-22)
    edp = torch.where(vis, edp, 0)
    out = dict(amax_dp=dp.abs().max(), amax_dp_lo=(dp.abs() - edp).max(), amax_dp_hi=(dp.abs() + edp).max())
    sv = p * s["scale_s"]
    esv = ep * s["scale_s"] + sv.abs() * 2.0**-21
    s8, span_s = ref.quantize(sv, fmt), _span(sv, esv, fmt)
    pv = dp * s["scale_dP"]
    epv = edp * abs(s["scale_dP"]) + pv.abs() * 2.0**-21
    dp8, span_dp = ref.quantize(pv, do_fmt), _span(pv, epv, do_fmt)
    u_dq, u_dk, u_dv = (s["descale_dP"] * s["descale_k"], s["descale_dP"] * s["descale_q"],
                        s["descale_s"] * s["descale_dO"])
    G, Gv = H // Hk, H // Hv
    out["dq"] = u_dq * (dp8 @ kh)
    out["a_dq"] = abs(u_dq) * (span_dp @ kh.abs() + _gamma(Skv) * (dp8.abs() @ kh.abs()))
    t = lambda m: m.transpose(-1, -2)  # noqa: E731
    out["dk"] = u_dk * _group_sum(t(dp8) @ q, Hk)
    out["a_dk"] = abs(u_dk) * (_group_sum(t(span_dp) @ q.abs(), Hk) +
                               _gamma(G * Sq) * _group_sum(t(dp8.abs()) @ q.abs(), Hk))
    out["dv"] = u_dv * _group_sum(t(s8) @ dO, Hv)
    out["a_dv"] = abs(u_dv) * (_group_sum(t(span_s) @ dO.abs(), Hv) +
                               _gamma(Gv * Sq) * _group_sum(t(s8.abs()) @ dO.abs(), Hv))
    return out


def _recipe_scale(fmax: float, amax: float, recipe: int, over: float) -> float:
    """A scale factor from an amax: Transformer Engine's (fmax / amax rounded down to a power of two), 0.7 fmax / amax,
    or over-scaled (the largest values saturate)."""
    if not amax > 0:
        return 1.0
    x = fmax / amax
    return _f32(2.0 ** math.floor(math.log2(x)) if recipe == 0 else 0.7 * x if recipe == 1 else over * x)


def _bwd_case(seed: int, max_s: int = 300, heads=None) -> dict:
    """Random FP8 backward: GQA (H_k = H_v dividing H_q; heads = (H_q, H_k, H_v) instead: H_k != H_v too), S_q and
    S_kv in 1..max_s, head dims multiples of 16 up to
    128, causal or no mask, E4M3 inputs (E5M2 every fifth seed) with both dO / gradient formats, factors powers of two
    or not; o and stats from the oracle's forward (sdpa_fp8_ref.forward); scale_dP and scale_dQ / dK / dV from the
    model's amaxes by a recipe."""
    rng = random.Random(7000 + seed)
    gen = torch.Generator().manual_seed(7000 + seed)
    fmt = E5M2 if seed % 5 == 4 else E4M3
    o_fmt = rng.choice([E4M3, E5M2])
    do_fmt = (E4M3, E5M2)[seed % 2]
    grad_fmt = (E4M3, E5M2)[(seed // 2) % 2]
    B, Hq = rng.randint(1, 2), rng.choice([1, 2, 4, 8])
    Hk = rng.choice([h for h in (1, 2, 4, 8) if Hq % h == 0])
    Hv = Hk
    if heads is not None:
        Hq, Hk, Hv = heads
    Sq, Skv = rng.randint(1, max_s), rng.randint(1, max_s)
    D, Dv = rng.choice([(64, 64), (128, 128), (32, 64), (128, 64), (16, 16), (48, 112)])
    causal = (seed // 4) % 2 == 1
    pow2 = rng.random() < 0.5
    # Raw values ~ N(0, (fmax / 8)^2) (_randn); descales to real amplitudes ~0.6, powers of two or not.

    def desc(dtype, m):
        d = 8 / FP8_MAX[dtype] * m
        return _f32(2.0 ** round(math.log2(d)) if pow2 else d)

    q = _randn((B, Hq, Sq, D), fmt, gen, FP8_MAX[fmt] / 8)
    k = _randn((B, Hk, Skv, D), fmt, gen, FP8_MAX[fmt] / 8)
    v = _randn((B, Hv, Skv, Dv), fmt, gen, FP8_MAX[fmt] / 8)
    dO = _randn((B, Hq, Sq, Dv), do_fmt, gen, FP8_MAX[do_fmt] / 8)
    scale_s = _f32(FP8_MAX[fmt] * rng.choice([1.0, 0.75, 0.5]))
    scale_o = _f32(FP8_MAX[o_fmt] / 8 * rng.choice([1.0, 0.9]))
    s = dict(descale_q=desc(fmt, 0.6), descale_k=desc(fmt, 0.55), descale_v=desc(fmt, 0.6), descale_s=_f32(1 / scale_s),
             scale_s=scale_s, scale_o=scale_o)
    attn_scale = _f32(2.5 / math.sqrt(D))
    fwd = ref.forward(q.double(), k.double(), v.double(), s, attn_scale=attn_scale, causal=causal, p_dtype=fmt,
                      o_dtype=o_fmt)
    o = fwd["o_stored"].to(o_fmt)
    stats = fwd["stats"].to(torch.float32).unsqueeze(-1)
    s.update(descale_o=_f32(1 / scale_o), descale_dO=desc(do_fmt, 0.7))
    del s["scale_o"]
    recipe = seed % 3
    args = (q.double(), k.double(), v.double(), o.double(), dO.double(), stats[..., 0].double())
    s.update(scale_dP=1.0, descale_dP=1.0)
    first = _bwd_model(*args, s, attn_scale, causal, fmt, do_fmt)
    s["scale_dP"] = _recipe_scale(FP8_MAX[do_fmt], float(first["amax_dp"]), recipe, 1.5)
    s["descale_dP"] = _f32(1 / s["scale_dP"])
    model = _bwd_model(*args, s, attn_scale, causal, fmt, do_fmt)
    for name, scale in (("dq", "scale_dQ"), ("dk", "scale_dK"), ("dv", "scale_dV")):
        s[scale] = _recipe_scale(FP8_MAX[grad_fmt], float(model[name].abs().max()), recipe, 2.0)
    return dict(q=q, k=k, v=v, o=o, dO=dO, stats=stats, s=s, fmt=fmt, do_fmt=do_fmt, grad_fmt=grad_fmt, causal=causal,
                attn_scale=attn_scale, model=model, scale_where=rng.choice(["device", "host", "number"]),
                # attn_scale a float, a host tensor or a tensor on the call's device (read by the FP8 kernels as a
                # factor, no host read); q, k, v, o, dO contiguous, BSHD views or sliced views with odd row
                # strides from one byte into their storage (rows at unaligned addresses); deterministic every third
                # seed, across the recipes (seed % 3).
                attn_where=("number", "host", "device")[(seed // 3) % 3],
                layout=("bhsd", "odd", "bshd")[(seed // 2) % 3],
                deterministic=(seed + seed // 3) % 3 == 0)


def _placed(t: torch.Tensor, device: str, layout: str) -> torch.Tensor:
    """t on device as a BHSD tensor, a BSHD view, or a view [..., 1:] of a (B, H, S, D + 1) buffer of NaN codes (0x7F
    in both formats: read, they poison the results): row stride D + 1, its first element one byte into the storage."""
    if layout == "bshd":
        return t.transpose(1, 2).contiguous().to(device).transpose(1, 2)
    if layout == "odd":
        B, H, S, D = t.shape
        buf = torch.full((B, H, S, D + 1), 0x7F, dtype=torch.uint8, device=device)
        buf[..., 1:] = t.view(torch.uint8).to(device)
        view = buf.view(t.dtype)[..., 1:]
        assert view.stride() == (H * S * (D + 1), S * (D + 1), D + 1, 1) and view.storage_offset() == 1
        return view
    return t.to(device)


def _run_bwd(fs, c: dict, device: str):
    q, k, v, o, dO = (_placed(c[n], device, c["layout"]) for n in ("q", "k", "v", "o", "dO"))
    stats = c["stats"].to(device)
    if c["scale_where"] == "number":
        scales = [c["s"][n] for n in BWD_SCALES]
    else:
        where = device if c["scale_where"] == "device" else "cpu"
        scales = [torch.full((1, 1, 1, 1), c["s"][n], dtype=torch.float32, device=where) for n in BWD_SCALES]
    attn = c["attn_scale"]
    if c["attn_where"] != "number":  # "host", "device" or "device 0-d"
        attn = torch.tensor([attn], dtype=torch.float32, device="cpu" if c["attn_where"] == "host" else device)
        attn = attn.reshape(()) if c["attn_where"] == "device 0-d" else attn
    got = fs.sdpa_fp8_backward(q, k, v, o, dO, stats, *scales, attn_scale=attn, use_causal_mask=c["causal"],
                               grad_dtype=c["grad_fmt"], use_deterministic_algorithm=c["deterministic"])
    for t, like in zip(got[:3], (q, k, v)):
        assert t.dtype == c["grad_fmt"] and t.shape == like.shape and t.device == q.device
    for t in got[3:]:
        assert t.dtype == torch.float32 and t.shape == (1, 1, 1, 1) and t.device == q.device
    return [t.cpu() for t in got]


def _check_bwd(got, c: dict, who: str) -> None:
    """The criterion (above) of one run's gradients and amaxes against the model."""
    m, s, gfmt = c["model"], c["s"], c["grad_fmt"]
    fmax = FP8_MAX[gfmt]
    for t, name, scale in zip(got[:3], ("dq", "dk", "dv"), ("scale_dQ", "scale_dK", "scale_dV")):
        g = t.to(torch.float64)
        assert not torch.isnan(g).any(), f"{who} {name}: NaN (an element never written?)"
        y = m[name] * s[scale]
        a = m[f"a_{name}"] * abs(s[scale]) + y.abs() * 2.0**-22
        yc = y.clamp(-fmax, fmax)
        tol = 1.01 * (a + ref.ulp(yc.abs() + a, gfmt))
        bad = (g - yc).abs() > tol
        assert not bad.any(), (f"{who} {name}: {int(bad.sum())} of {g.numel()} elements out of bounds, e.g. got "
                               f"{g[bad][:4].tolist()} want {y[bad][:4].tolist()}")
        outside = int(((g < ref.quantize(y - a, gfmt)) | (g > ref.quantize(y + a, gfmt))).sum())
        assert outside <= g.numel() // 100 + 2, (f"{who} {name}: {outside} of {g.numel()} codes off the reference's "
                                                 f"rounding")
    for t, name in zip(got[3:6], ("dq", "dk", "dv")):
        x, a = m[name].abs(), m[f"a_{name}"]
        lo, hi = float((x - a).max()) * (1 - 2.0**-20), float((x + a).max()) * (1 + 2.0**-20)
        assert lo <= t.item() <= hi, f"{who} amax_{name} = {t.item()}, model {float(x.max())} in [{lo}, {hi}]"
    lo, hi = float(m["amax_dp_lo"]) * (1 - 2.0**-20), float(m["amax_dp_hi"]) * (1 + 2.0**-20)
    assert lo <= got[6].item() <= hi, f"{who} amax_dP = {got[6].item()}, model {float(m['amax_dp'])} in [{lo}, {hi}]"


@sm80
@pytest.mark.usefixtures("poison_uninitialized")
@pytest.mark.parametrize("seed", range(12))
def test_gpu_fp8_backward_matches_cpu_reference(fs, seed):
    """The GPU and the CPU reference against the model; a deterministic case runs twice on the GPU and must give
    bitwise the same dQ, dK, dV codes and amaxes (the deterministic path's promise). The default environment (the
    FP8 backward on by default: the autouse fixture unsets FLASHSPAN_SDPA_FP8_BWD)."""
    c = _bwd_case(seed)
    got = _run_bwd(fs, c, "cuda")
    want = _run_bwd(fs, c, "cpu")
    _check_bwd(want, c, "CPU reference")
    _check_bwd(got, c, "GPU")
    for g, w, name in zip(got[:3], want[:3], ("dQ", "dK", "dV")):
        differ = int((g.view(torch.uint8) != w.view(torch.uint8)).sum())
        assert differ <= g.numel() // 50 + 2, f"{name}: {differ} of {g.numel()} codes differ from the CPU reference's"
    if c["deterministic"]:
        _assert_same_bits(got, _run_bwd(fs, c, "cuda"), "deterministic GPU, two runs")


@sm90
@pytest.mark.usefixtures("poison_uninitialized")
@pytest.mark.parametrize("seed", range(12))
def test_gpu_fp8_backward_on_sm80_kernels_too(fs, monkeypatch, seed):
    """On an H100 / H200 the default runs the sm90 backward kernel (the test above); the same cases on the sm80 kernels
    there (FLASHSPAN_SM90_SDPA_FP8_BWD=0; the operation cache emptied first, since an operation keeps the kernel family
    its check_support chose): against the model and the CPU reference, deterministic cases bitwise the same twice."""
    import importlib

    L = importlib.import_module("flashspan._sdpa_lib")
    S = importlib.import_module("flashspan.sdpa")  # (the module: the package's `sdpa` is the function)
    monkeypatch.setenv("FLASHSPAN_SM90_SDPA_FP8_BWD", "0")
    monkeypatch.setattr(S, "_CACHE", L.OpCache())
    c = _bwd_case(seed)
    got = _run_bwd(fs, c, "cuda")
    want = _run_bwd(fs, c, "cpu")
    _check_bwd(got, c, "GPU (sm80 kernels)")
    for g, w, name in zip(got[:3], want[:3], ("dQ", "dK", "dV")):
        differ = int((g.view(torch.uint8) != w.view(torch.uint8)).sum())
        assert differ <= g.numel() // 50 + 2, f"{name}: {differ} of {g.numel()} codes differ from the CPU reference's"
    if c["deterministic"]:
        _assert_same_bits(got, _run_bwd(fs, c, "cuda"), "deterministic GPU (sm80 kernels), two runs")


def _assert_same_bits(x, y, what: str) -> None:
    """Two backward results (dQ, dK, dV, then the four amaxes) bitwise the same."""
    for a, b, name in zip(x, y, ("dQ", "dK", "dV", "amax_dQ", "amax_dK", "amax_dV", "amax_dP")):
        a8, b8 = a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8)
        differ = int((a8 != b8).sum())
        assert differ == 0, f"{what}: {name}: {differ} of {a8.numel()} bytes differ"


def _small_bwd_args(device: str, D: int = 48, Dv: int = 80, Hq: int = 3, Hk: int = 3, Hv: int = 3):
    """An FP8 backward of a shape no other test here uses (the operation cache keeps a call checked once)."""
    gen = torch.Generator().manual_seed(3)
    q = _randn((1, Hq, 37, D), E4M3, gen, 8.0).to(device)
    k = _randn((1, Hk, 41, D), E4M3, gen, 8.0).to(device)
    v = _randn((1, Hv, 41, Dv), E4M3, gen, 8.0).to(device)
    o = _randn((1, Hq, 37, Dv), E4M3, gen, 8.0).to(device)
    dO = _randn((1, Hq, 37, Dv), E5M2, gen, 8.0).to(device)
    stats = torch.full((1, Hq, 37, 1), 3.0, device=device)
    return (q, k, v, o, dO, stats, *(1.0,) * 12)


@pytest.mark.skipif(not cuda_ready(), reason="needs a CUDA device")
@pytest.mark.parametrize("experimental", [None, "1"])
def test_gpu_fp8_backward_switch_off(fs, monkeypatch, experimental):
    """With FLASHSPAN_SDPA_FP8_BWD=0 an FP8 backward on CUDA tensors is refused by the C layer's check_support
    (NotImplementedError naming the variable; python/flashspan/sdpa_fp8.py has no rule of its own), whatever
    FLASHSPAN_EXPERIMENTAL says (its switch before). The call's signature is used by no test that runs it (a refused
    call is not kept by the operation cache)."""
    monkeypatch.setenv(BWD_ENV, "0")
    if experimental is None:
        monkeypatch.delenv(EXPERIMENTAL, raising=False)
    else:
        monkeypatch.setenv(EXPERIMENTAL, experimental)
    with pytest.raises(NotImplementedError, match=r"^dQ, dK, dV: the FP8 backward on CUDA tensors is turned off "
                                                  r"\(FLASHSPAN_SDPA_FP8_BWD=0\); CPU tensors run sdpa_fp8_backward on "
                                                  r"the CPU reference$"):
        fs.sdpa_fp8_backward(*_small_bwd_args("cuda"), attn_scale=0.25, use_causal_mask=True)


@pytest.mark.skipif(not cuda_ready(), reason="needs a CUDA device")
def test_gpu_fp8_backward_refusals_name_the_rule(fs, monkeypatch):
    """What the FP8 backward does not run is named (sdpa_fp8_bwd_refusal) with the rule's message, deterministic or
    not (H_k != H_v with FLASHSPAN_SDPA_FP8_HK_NE_HV=0, set here: a signature no test that runs H_k != H_v uses; the
    deterministic algorithm itself is covered: test_gpu_fp8_backward_deterministic_and_device_attn_scale)."""
    monkeypatch.setenv("FLASHSPAN_SDPA_FP8_HK_NE_HV", "0")
    tail = (r": not supported by the FP8 backward on CUDA tensors yet \(it runs each head dim a multiple of 16 up to "
            r"128; H_k != H_v unless FLASHSPAN_SDPA_FP8_HK_NE_HV=0\); CPU tensors run it on the CPU reference")
    for det in (False, True):
        with pytest.raises(NotImplementedError, match=r"^H_k != H_v \(FLASHSPAN_SDPA_FP8_HK_NE_HV=0\)" + tail):
            fs.sdpa_fp8_backward(*_small_bwd_args("cuda", Hq=6, Hk=3, Hv=6), use_deterministic_algorithm=det)
        with pytest.raises(NotImplementedError, match=r"^head dims \(multiples of 16 up to 128\)" + tail):
            fs.sdpa_fp8_backward(*_small_bwd_args("cuda", D=144), use_deterministic_algorithm=det)


@sm80
@pytest.mark.usefixtures("poison_uninitialized")
def test_gpu_fp8_backward_deterministic_and_device_attn_scale(fs):
    """use_deterministic_algorithm=True runs (no refusal), meets the criterion and gives bitwise the same results twice;
    attn_scale as a CUDA tensor (1-element or 0-d; read by the FP8 kernels as one of their factors, by default since
    its C++ GPU test passed on an H100), as a host tensor and as a float give bitwise the same results, and another value in the CUDA tensor other ones; the atomic
    (non-deterministic) dQ path meets the criterion and lands on the same codes but for rounding-boundary cases."""
    c = dict(_bwd_case(4, max_s=150), layout="odd", deterministic=True, scale_where="device")
    runs = {w: _run_bwd(fs, dict(c, attn_where=w), "cuda") for w in ("number", "device", "device 0-d", "host")}
    _check_bwd(runs["number"], c, "GPU (deterministic)")
    _assert_same_bits(runs["number"], _run_bwd(fs, dict(c, attn_where="number"), "cuda"), "deterministic, two runs")
    for w in ("device", "device 0-d", "host"):
        _assert_same_bits(runs["number"], runs[w], f"attn_scale as a {w} tensor against the float")
    # The tensor's value is what runs (not a default of 1, nor a stale one).
    other = _run_bwd(fs, dict(c, attn_where="device", attn_scale=2 * c["attn_scale"]), "cuda")
    assert not torch.equal(other[0].view(torch.uint8), runs["number"][0].view(torch.uint8))
    atomic = _run_bwd(fs, dict(c, deterministic=False, attn_where="device"), "cuda")
    _check_bwd(atomic, c, "GPU (atomic dQ)")
    for g, w, name in zip(atomic[:3], runs["number"][:3], ("dQ", "dK", "dV")):
        differ = int((g.view(torch.uint8) != w.view(torch.uint8)).sum())
        assert differ <= g.numel() // 100 + 2, f"{name}: {differ} of {g.numel()} codes differ (atomic vs ordered dQ)"


@sm90
def test_gpu_fp8_forward_takes_a_device_attn_scale(fs):
    """sdpa_fp8 with attn_scale as a CUDA tensor (1-element or 0-d; handed to the C layer as it is, the FP8 kernels
    read it as one of their factors, no host read) gives bitwise the results of the float, and another value in it
    other results."""
    c = _case(3)
    c.update(mode="dense", len_q=None, len_kv=None, stats_out=False)
    want = _run(fs, c, "cuda")
    for attn in (torch.tensor([c["attn_scale"]], device="cuda"), torch.tensor(c["attn_scale"], device="cuda")):
        got = _run(fs, dict(c, attn_scale=attn), "cuda")
        for n in ("o", "stats", "amax_s", "amax_o"):
            assert torch.equal(got[n].view(torch.uint8), want[n].view(torch.uint8)), n
    other = _run(fs, dict(c, attn_scale=torch.tensor([2 * c["attn_scale"]], device="cuda")), "cuda")
    assert not torch.equal(other["stats"], want["stats"])


HK_NE_HV = [(4, 2, 4), (4, 4, 2), (8, 1, 4), (6, 3, 1), (8, 2, 8), (4, 1, 2)]


@sm80
@pytest.mark.parametrize("seed", range(6))
def test_gpu_fp8_forward_hk_ne_hv(fs, monkeypatch, seed):
    """H_k != H_v on the FP8 forwards (on by default since its GPU tests passed on an H100;
    FLASHSPAN_SDPA_FP8_HK_NE_HV unset here): the sm90 FP8 forward on an H100 / H200, the sm80 one elsewhere (and with
    FLASHSPAN_SM90_SDPA_FP8=0 on odd seeds), against the same call on CPU copies."""
    monkeypatch.delenv("FLASHSPAN_SDPA_FP8_HK_NE_HV", raising=False)
    if seed % 2 or not _sm90():
        monkeypatch.setenv("FLASHSPAN_SM90_SDPA_FP8", "0")
    c = _case(300 + seed, dims=[(64, 64), (128, 128), (48, 80)][seed % 3])
    Hq, Hk, Hv = HK_NE_HV[seed]
    gen = torch.Generator().manual_seed(300 + seed)
    B, Sq, D = c["q"].shape[0], c["q"].shape[2], c["q"].shape[3]
    Skv, Dv = c["k"].shape[2], c["v"].shape[3]
    c["q"] = _randn((B, Hq, Sq, D), c["fmt"], gen, 1.0)
    c["k"] = _randn((B, Hk, Skv, D), c["fmt"], gen, 1.0)
    c["v"] = _randn((B, Hv, Skv, Dv), c["fmt"], gen, 1.0)
    _check_forward(fs, c)


@sm80
@pytest.mark.usefixtures("poison_uninitialized")
@pytest.mark.parametrize("seed", range(6))
def test_gpu_fp8_backward_hk_ne_hv(fs, monkeypatch, seed):
    """H_k != H_v on the FP8 backward (on by default since its GPU tests passed on an H100;
    FLASHSPAN_SDPA_FP8_HK_NE_HV unset here): the sm80 kernels' two dK / dV passes, and on an H100 / H200 the sm90
    kernel's items (odd seeds: the sm90 one off), against the float64 model and the CPU reference."""
    monkeypatch.delenv("FLASHSPAN_SDPA_FP8_HK_NE_HV", raising=False)
    if seed % 2:
        monkeypatch.setenv("FLASHSPAN_SM90_SDPA_FP8_BWD", "0")
    c = _bwd_case(400 + seed, max_s=200, heads=HK_NE_HV[seed])
    _check_bwd(_run_bwd(fs, c, "cuda"), c, "GPU")
    _check_bwd(_run_bwd(fs, c, "cpu"), c, "CPU reference")


@sm80
@pytest.mark.parametrize("seed", range(6))
def test_gpu_fp8_forward_thd(fs, monkeypatch, seed):
    """Packed (THD) q, k, v, o, stats on the FP8 forwards, both on by default since this test passed on an H200,
    2026-12-05 (FLASHSPAN_SDPA_FP8_THD and FLASHSPAN_SM90_SDPA_FP8_THD unset; with the first "0" and the sm90 FP8
    forward off, refused, naming the variable): the sm90 FP8 forward on an H100 / H200 (q and k through per-sample tensor maps), the
    sm80 one elsewhere and with FLASHSPAN_SM90_SDPA_FP8=0 on odd seeds, against the same call on CPU copies: samples of
    random lengths (an empty one on some seeds), GQA, causal or not, both formats, o in either."""
    if seed % 2:
        monkeypatch.setenv("FLASHSPAN_SM90_SDPA_FP8", "0")
    rng = random.Random(500 + seed)
    gen = torch.Generator().manual_seed(500 + seed)
    fmt = (E4M3, E5M2)[seed % 2]
    o_fmt = rng.choice([E4M3, E5M2])
    B, Hk = rng.randint(2, 4), rng.choice([1, 2])
    Hq = Hk * rng.choice([1, 2, 4])
    D = rng.choice([32, 64, 128])
    lq = [rng.randint(0, 200) for _ in range(B)]
    lk = [rng.randint(1, 260) for _ in range(B)]
    if seed % 3 == 0:
        lq[0] = 0
    lq[-1] = max(lq[-1], 1)
    Tq, Tk = sum(lq), sum(lk)
    q, k, v = (_randn((T, H, D), fmt, gen, 1.0) for T, H in ((Tq, Hq), (Tk, Hk), (Tk, Hk)))
    cu_q = torch.tensor([0, *itertools.accumulate(lq)], dtype=torch.int32)
    cu_k = torch.tensor([0, *itertools.accumulate(lk)], dtype=torch.int32)
    causal = rng.random() < 0.5
    scales = (1.0, 1.0, 1.0, 1 / FP8_MAX[fmt], FP8_MAX[fmt], 1.0)

    def run(dev):
        return fs.sdpa_fp8(q.to(dev), k.to(dev), v.to(dev), *scales, attn_scale=1.0 / math.sqrt(D), o_dtype=o_fmt,
                           use_causal_mask=causal, use_padding_mask=True, cu_seq_len_q=cu_q.to(dev),
                           cu_seq_len_kv=cu_k.to(dev), max_total_seq_len_q=Tq, max_total_seq_len_kv=Tk)

    monkeypatch.delenv("FLASHSPAN_EXPERIMENTAL", raising=False)
    monkeypatch.setenv("FLASHSPAN_SDPA_FP8_THD", "0")
    monkeypatch.setenv("FLASHSPAN_SM90_SDPA_FP8", "0")
    with pytest.raises(NotImplementedError,
                       match=r"^ragged \(packed THD\) q, k, v, o or stats \(FLASHSPAN_SDPA_FP8_THD=0\)"):
        run("cuda")
    monkeypatch.delenv("FLASHSPAN_SDPA_FP8_THD")
    monkeypatch.delenv("FLASHSPAN_SM90_SDPA_FP8_THD", raising=False)
    if seed % 2 == 0:  # (odd seeds: the sm80 one in the default environment but FLASHSPAN_SM90_SDPA_FP8=0)
        monkeypatch.delenv("FLASHSPAN_SM90_SDPA_FP8")
    got, want = [t.cpu() for t in run("cuda")], list(run("cpu"))
    go, wo = got[0].to(torch.float64), want[0].to(torch.float64)
    assert go.shape == (Tq, Hq, D) and got[0].dtype == o_fmt and not torch.isnan(go).any()
    u = max(UNIT[fmt], UNIT[o_fmt])
    top = float(wo.abs().max())
    assert float((go - wo).abs().max()) <= 2 * u * top + 1e-6, "O: an element more than two FP8 steps off"
    gs, ws = got[1].double(), want[1].double()
    fin = torch.isfinite(ws)
    assert torch.equal(fin, torch.isfinite(gs)), "stats: -inf rows differ"
    assert bool(((gs[fin] - ws[fin]).abs() <= 1e-3 * torch.clamp(ws[fin].abs(), min=1.0)).all()), "stats"
    assert abs(got[3].item() - want[3].item()) <= 2 * UNIT[o_fmt] * want[3].item() + 1e-6, "amax_o"


def test_bwd_model_hk_ne_hv_matches_the_cpu_reference(fs):
    """The float64 model with H_k != H_v (dV summed over each V head's query heads) against the CPU reference, on the
    shapes of the GPU test above (no GPU needed)."""
    for seed in range(3):
        c = _bwd_case(400 + seed, max_s=60, heads=HK_NE_HV[seed])
        _check_bwd(_run_bwd(fs, c, "cpu"), c, "CPU reference")


def test_bwd_model_matches_the_cpu_reference(fs):
    """The GPU tests' model and criterion, checked without a GPU: the CPU reference satisfies them (small cases)."""
    for seed in range(6):
        c = _bwd_case(seed, max_s=40)
        _check_bwd(_run_bwd(fs, c, "cpu"), c, "CPU reference")


def test_bwd_criterion_rejects_a_wrong_factor(fs):
    """The criterion can fail: scale_dQ 2x, or an amax_dP taken after the FP8 rounding, is rejected."""
    c = _bwd_case(1, max_s=40)  # recipe 1: amax_dP scale_dP = 0.7 fmax, not an FP8 value
    good = _run_bwd(fs, c, "cpu")
    _check_bwd(good, c, "CPU reference")
    wrong = dict(c, s=dict(c["s"], scale_dQ=2 * c["s"]["scale_dQ"]))
    with pytest.raises(AssertionError, match="dq: .* out of bounds"):
        _check_bwd(_run_bwd(fs, wrong, "cpu"), c, "mutant")
    sdp = c["s"]["scale_dP"]
    quantized = ref.quantize(c["model"]["amax_dp"] * sdp, c["do_fmt"]) / sdp
    with pytest.raises(AssertionError, match="amax_dP"):
        _check_bwd([*good[:6], torch.full((1, 1, 1, 1), float(quantized))], c, "mutant")
