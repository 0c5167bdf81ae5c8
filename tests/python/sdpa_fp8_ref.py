"""Independent dense float64 oracle of FP8 SDPA for the tests (written from docs/SDPA.md "FP8 SDPA", apart from
src/reference): cuDNN's sdpa_fp8 / sdpa_fp8_backward graphs on padded float64 tensors of the raw FP8 values, with
the FP8 roundings done by torch's own float8 conversions (after a clamp to the format's largest finite value:
the saturating conversion of the kernels, which torch's cast does not do by itself).
"""

from __future__ import annotations

import math
from typing import Optional

import torch

FP8_MAX = {torch.float8_e4m3fn: 448.0, torch.float8_e5m2: 57344.0}
# Exponent of the smallest normal and mantissa bits of each format (for the spacing of its values).
_EMIN_MBITS = {torch.float8_e4m3fn: (-6, 3), torch.float8_e5m2: (-14, 2)}


def quantize(x: torch.Tensor, dtype: Optional[torch.dtype]) -> torch.Tensor:
    """x (float64) rounded to FP8 ``dtype`` as the kernels store an fp32 value (through float32, nearest even,
    saturating), back as float64; ``dtype`` None: x unchanged (the oracle without quantization)."""
    if dtype is None:
        return x
    m = FP8_MAX[dtype]
    return x.to(torch.float32).clamp(-m, m).to(dtype).to(torch.float64)


def ulp(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Spacing of the FP8 format's values at |x| (the subnormal spacing below the smallest normal)."""
    emin, mbits = _EMIN_MBITS[dtype]
    a = x.abs().to(torch.float64).clamp(min=2.0**emin)
    return torch.exp2(torch.floor(torch.log2(a)) - mbits)


def visibility(B: int, H: int, Sq: int, Skv: int, causal: bool, len_q=None, len_kv=None) -> torch.Tensor:
    """bool [B, H, Sq, Skv]: the top-left causal mask and the padding masks."""
    i = torch.arange(Sq).view(1, 1, Sq, 1)
    j = torch.arange(Skv).view(1, 1, 1, Skv)
    lq = torch.tensor(len_q if len_q is not None else [Sq] * B).view(B, 1, 1, 1)
    lk = torch.tensor(len_kv if len_kv is not None else [Skv] * B).view(B, 1, 1, 1)
    vis = (i < lq) & (j < lk)
    if causal:
        vis = vis & (j <= i)
    return vis.expand(B, H, Sq, Skv)


def _heads(x: torch.Tensor, H: int) -> torch.Tensor:
    return x.repeat_interleave(H // x.shape[1], dim=1)


def _scores(q, k, s: dict, attn_scale: float, vis):
    """x = attn_scale descale_q descale_k q k^T on the visible pairs."""
    H = q.shape[1]
    x = (q @ _heads(k, H).transpose(-1, -2)) * (attn_scale * s["descale_q"] * s["descale_k"])
    return torch.where(vis, x, torch.full_like(x, -math.inf))


def forward(q, k, v, s: dict, *, attn_scale: float = 1.0, causal: bool = False, len_q=None, len_kv=None,
            p_dtype: Optional[torch.dtype] = None, o_dtype: Optional[torch.dtype] = None) -> dict:
    """q, k, v: float64 [B, H, S, D] raw (stored) values; s: the scale factors by their seed names (floats).
    p_dtype: the format S is quantized to (q's), o_dtype: o's (None: no quantization).
    Returns o (real, float64), o_stored (the stored values, float64), stats, amax_s, amax_o, vis."""
    B, H, Sq, _ = q.shape
    Skv = k.shape[2]
    vis = visibility(B, H, Sq, Skv, causal, len_q, len_kv)
    x = _scores(q, k, s, attn_scale, vis)
    lse = torch.logsumexp(x, dim=-1)  # -inf for rows that see nothing
    has = torch.isfinite(lse)
    p = torch.where(vis & has.unsqueeze(-1), torch.exp(x - torch.where(has, lse, 0).unsqueeze(-1)), 0)
    s8 = quantize(p * s["scale_s"], p_dtype) * s["descale_s"]
    o = (s8 @ _heads(v, H)) * s["descale_v"]
    return dict(o=o, o_stored=quantize(o * s["scale_o"], o_dtype), stats=lse, amax_s=p.abs().max(),
                amax_o=o.abs().max(), vis=vis)


def backward(q, k, v, o, dO, stats, s: dict, *, attn_scale: float = 1.0, causal: bool = False,
             p_dtype: Optional[torch.dtype] = None, dp_dtype: Optional[torch.dtype] = None,
             grad_dtype: Optional[torch.dtype] = None) -> dict:
    """The FP8 backward on float64 raw values (stats: the forward's LSE as given). p_dtype: S's format (q's),
    dp_dtype: dP's (dO's), grad_dtype: dQ / dK / dV's (None: no quantization).
    Returns dq, dk, dv (real), their stored values, amax_dq, amax_dk, amax_dv, amax_dp."""
    B, H, Sq, _ = q.shape
    Hk, Hv, Skv = k.shape[1], v.shape[1], k.shape[2]
    vis = visibility(B, H, Sq, Skv, causal)
    x = _scores(q, k, s, attn_scale, vis)
    has = torch.isfinite(stats)
    p = torch.where(vis & has.unsqueeze(-1), torch.exp(x - torch.where(has, stats, 0).unsqueeze(-1)), 0)
    delta = (dO * o).sum(-1) * (s["descale_dO"] * s["descale_o"])
    ds = (dO @ _heads(v, H).transpose(-1, -2)) * (s["descale_dO"] * s["descale_v"])
    dp = torch.where(vis, attn_scale * p * (ds - delta.unsqueeze(-1)), 0)
    dp8 = quantize(dp * s["scale_dP"], dp_dtype) * s["descale_dP"]
    s8 = quantize(p * s["scale_s"], p_dtype) * s["descale_s"]
    dq = (dp8 @ _heads(k, H)) * s["descale_k"]
    dk = (dp8.transpose(-1, -2) @ q).view(B, Hk, H // Hk, Skv, -1).sum(2) * s["descale_q"]
    dv = (s8.transpose(-1, -2) @ dO).view(B, Hv, H // Hv, Skv, -1).sum(2) * s["descale_dO"]
    out = dict(dq=dq, dk=dk, dv=dv, amax_dp=dp.abs().max())
    for name, scale in (("dq", "scale_dQ"), ("dk", "scale_dK"), ("dv", "scale_dV")):
        out[f"amax_{name}"] = out[name].abs().max()
        out[f"{name}_stored"] = quantize(out[name] * s[scale], grad_dtype)
    return out
