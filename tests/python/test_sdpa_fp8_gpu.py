"""flashspan.sdpa_fp8 on CUDA tensors (the sm90 FP8 forward, kernel_fwd_sm90.cuh sdpa_fp8_fwd_kernel_sm90) against the
same call on CPU copies (the CPU reference, itself checked against the float64 oracle by test_sdpa_fp8_cpu.py): the
Python surface end to end on the GPU -- device and host scale tensors, o in either format, the LSE in both bases,
score_max / score_sum_exp, amax_s / amax_o, causal, padding by seq_len and cu_seq_len on padded tensors with
NaN-poisoned padding, GQA / MQA. Skipped without an sm_90 device (the only FP8 kernel).

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

from conftest import cuda_ready

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2
FP8_MAX = {E4M3: 448.0, E5M2: 57344.0}
UNIT = {E4M3: 2.0**-4, E5M2: 2.0**-3}  # unit roundoff of the format (3 / 2 mantissa bits)


def _sm90() -> bool:
    return cuda_ready() and torch.cuda.get_device_capability(0) == (9, 0)


pytestmark = pytest.mark.skipif(not _sm90(), reason="the FP8 forward runs on an sm_90 device (H100 / H200) only")


@pytest.fixture(autouse=True)
def _fp8_on(monkeypatch):
    # The FP8 kernel's switch (dispatch/sdpa_launch.h sdpa_fp8_sm90_enabled): on by default; not turned off here.
    monkeypatch.delenv("FLASHSPAN_SM90_SDPA_FP8", raising=False)


def _randn(shape, dtype, gen, mag):
    x = torch.randn(shape, generator=gen, dtype=torch.float32) * mag
    return x.clamp(-FP8_MAX[dtype] / 2, FP8_MAX[dtype] / 2).to(dtype)


def _case(seed: int) -> dict:
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    fmt = rng.choice([E4M3, E5M2])
    B, Hk = rng.randint(1, 3), rng.choice([1, 2])
    Hq = Hk * rng.choice([1, 2, 4])
    Sq, Skv = rng.randint(1, 600), rng.randint(1, 700)
    D = rng.choice([64, 128, 32, 96, 112])
    Dv = D if rng.random() < 0.7 else rng.choice([64, 128, 48])
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


@pytest.mark.parametrize("seed", range(40))
def test_gpu_fp8_forward_matches_cpu_reference(fs, seed):
    c = _case(seed)
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
            assert bool(((gz - wz).abs() <= 1e-3 * torch.clamp(wz.abs(), min=1.0)).all()), "score_sum_exp"
    lse_max = max(1.0, float(want["stats"][torch.isfinite(want["stats"])].abs().max())) if torch.isfinite(
        want["stats"]).any() else 1.0
    assert got["amax_s"].item() == pytest.approx(want["amax_s"].item(), rel=1e-3 * lse_max, abs=1e-12)
    u_o = UNIT[c["o_fmt"]]
    assert abs(got["amax_o"].item() - want["amax_o"].item()) <= 2 * u_o * want["amax_o"].item() + 1e-6


def test_gpu_fp8_forward_runs_the_kernel(fs):
    """A CUDA FP8 call reaches the sm90 kernel (not refused), and its O is on the device in o's format."""
    c = _case(7)
    c.update(mode="dense", len_q=None, len_kv=None)
    got = _run(fs, c, "cuda")
    assert got["o"].shape[:3] == c["q"].shape[:3] and got["o"].shape[3] == c["v"].shape[3]
