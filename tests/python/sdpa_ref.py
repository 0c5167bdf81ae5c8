"""Independent dense float64 SDPA oracle for the tests (written apart from src/reference).

Everything is materialised: the [B, H_q, S_q, S_kv] visibility, bias, ALiBi and dropout matrices, on padded
float64 tensors, and gradients come from torch autograd (not from hand-derived formulas). Philox4x32-10 is
re-implemented here in numpy from the Random123 description, vectorised over all elements.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Optional

import numpy as np
import torch

# ---------------------------------------------------------------------------
# Philox4x32-10 and the dropout mapping of docs/SDPA.md
# ---------------------------------------------------------------------------

_M0, _M1 = np.uint64(0xD2511F53), np.uint64(0xCD9E8D57)
_W0, _W1 = 0x9E3779B9, 0xBB67AE85
_MASK32 = np.uint64(0xFFFFFFFF)


def philox4x32_10(c0, c1, c2, c3, k0, k1):
    """Vectorised Philox4x32-10 over uint64 arrays holding 32-bit values; k0, k1 are Python ints."""
    c = [np.asarray(x, dtype=np.uint64) & _MASK32 for x in (c0, c1, c2, c3)]
    key0, key1 = k0 & 0xFFFFFFFF, k1 & 0xFFFFFFFF
    for r in range(10):
        if r:
            key0 = (key0 + _W0) & 0xFFFFFFFF
            key1 = (key1 + _W1) & 0xFFFFFFFF
        p0 = _M0 * c[0]
        p1 = _M1 * c[2]
        hi0, lo0 = p0 >> np.uint64(32), p0 & _MASK32
        hi1, lo1 = p1 >> np.uint64(32), p1 & _MASK32
        c = [hi1 ^ c[1] ^ np.uint64(key0), lo1, hi0 ^ c[3] ^ np.uint64(key1), lo0]
    return c


def dropout_keep(seed: int, offset: int, B: int, H: int, Sq: int, Skv: int, p: float) -> torch.Tensor:
    """bool [B, H, Sq, Skv]: which elements survive Philox dropout (rows / columns sample-local)."""
    seed &= (1 << 64) - 1
    offset &= (1 << 64) - 1
    b, h, i, j = np.meshgrid(np.arange(B), np.arange(H), np.arange(Sq), np.arange(Skv), indexing="ij")
    b, h, i, j = (x.astype(np.uint64) for x in (b, h, i, j))
    ctr = np.uint64(offset) + ((j >> np.uint64(4)) << np.uint64(2)) + ((j >> np.uint64(1)) & np.uint64(3))  # wraps
    c2 = (i >> np.uint64(4)) * np.uint64(8) + (i & np.uint64(7))
    c3 = b * np.uint64(H) + h
    words = philox4x32_10(ctr & _MASK32, ctr >> np.uint64(32), c2, c3, seed & 0xFFFFFFFF, seed >> 32)
    widx = ((i >> np.uint64(3)) & np.uint64(1)) * np.uint64(2) + (j & np.uint64(1))
    w = np.choose(widx.astype(np.int64), words)
    w = (w >> (((j >> np.uint64(3)) & np.uint64(1)) * np.uint64(16))) & np.uint64(0xFFFF)  # the 16-bit number
    threshold = min(math.floor(p * 2.0**16), 2**16 - 1) if p > 0 else 0
    return torch.from_numpy(w >= np.uint64(threshold))


def alibi_slopes(H: int) -> torch.Tensor:
    """ALiBi slopes as in the paper's reference code: a geometric sequence for the closest power of two,
    then every other slope of the sequence for twice that many heads."""

    def pow2(n):
        start = 2 ** (-(2 ** -(math.log2(n) - 3)))
        return [start * start**i for i in range(n)]

    if math.log2(H).is_integer():
        s = pow2(H)
    else:
        n = 2 ** math.floor(math.log2(H))
        s = pow2(n) + pow2(2 * n)[0::2][: H - n]
    return torch.tensor(s, dtype=torch.float64)


# ---------------------------------------------------------------------------
# The dense oracle
# ---------------------------------------------------------------------------


@dataclass
class Case:
    """A problem on padded float64 tensors q [B,Hq,Sq,Dqk], k [B,Hk,Skv,Dqk], v [B,Hv,Skv,Dv]."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    len_q: list
    len_kv: list
    scale: float = 1.0
    bottom_right: bool = False
    left: Optional[int] = None
    right: Optional[int] = None
    bias: Optional[torch.Tensor] = None  # broadcastable [1|B, 1|Hq, 1|Sq, 1|Skv]
    alibi: bool = False
    softcap: Optional[float] = None
    block_mask: Optional[torch.Tensor] = None  # uint8 [1|B, 1|Hq, nq, nk8]
    sinks: Optional[torch.Tensor] = None  # [Hq]
    dropout_p: Optional[float] = None
    seed: int = 0
    offset: int = 0
    dropout_mask: Optional[torch.Tensor] = None  # broadcastable, multiplies P
    dropout_scale: float = 1.0
    gate: Optional[torch.Tensor] = None  # [B, Hq, Sq, Dv]
    extra: dict = field(default_factory=dict)


def visibility(c: Case) -> torch.Tensor:
    """bool [B, Hq, Sq, Skv]: which (row, column) pairs take part in the softmax."""
    B, Hq, Sq = c.q.shape[:3]
    Skv = c.k.shape[2]
    i = torch.arange(Sq).view(1, 1, Sq, 1)
    j = torch.arange(Skv).view(1, 1, 1, Skv)
    lq = torch.tensor(c.len_q).view(B, 1, 1, 1)
    lk = torch.tensor(c.len_kv).view(B, 1, 1, 1)
    vis = (i < lq) & (j < lk)
    diag = i + ((lk - lq) if c.bottom_right else 0)
    if c.right is not None:
        vis = vis & ~(j > diag + c.right)
    if c.left is not None:
        vis = vis & ~(j <= diag - c.left)
    vis = vis.expand(B, Hq, Sq, Skv)
    if c.block_mask is not None:
        bm = c.block_mask.to(torch.int64)
        kb = torch.arange(Skv) // 128
        qb = torch.arange(Sq) // 128
        bytes_ = bm[:, :, qb][:, :, :, kb // 8]  # [1|B, 1|H, Sq, Skv]
        bits = (bytes_ >> (kb % 8)) & 1
        vis = vis & bits.bool().expand(B, Hq, Sq, Skv)
    return vis


def forward(c: Case, q, k, v, bias=None, sinks=None, gate=None):
    """Differentiable float64 forward: returns dict(o, lse, row_max, sum_exp, logits, vis)."""
    B, Hq, Sq, _ = q.shape
    Skv = k.shape[2]
    kk = k.repeat_interleave(Hq // k.shape[1], dim=1)
    vv = v.repeat_interleave(Hq // v.shape[1], dim=1)
    x = c.scale * q @ kk.transpose(-1, -2)
    if c.softcap is not None:
        x = c.softcap * torch.tanh(x / c.softcap)
    if bias is not None:
        x = x + bias
    lq = torch.tensor(c.len_q, dtype=torch.float64).view(B, 1, 1, 1)
    lk = torch.tensor(c.len_kv, dtype=torch.float64).view(B, 1, 1, 1)
    if c.alibi:
        i = torch.arange(Sq, dtype=torch.float64).view(1, 1, Sq, 1)
        j = torch.arange(Skv, dtype=torch.float64).view(1, 1, 1, Skv)
        shift = (lk - lq) if c.bottom_right else 0.0
        x = x + alibi_slopes(Hq).view(1, Hq, 1, 1) * (j - i - shift)
    vis = visibility(c)
    neg = torch.tensor(-math.inf, dtype=torch.float64)
    xm = torch.where(vis, x, neg)
    row_max = xm.amax(-1)
    if sinks is not None:
        row_max = torch.maximum(row_max, sinks.view(1, Hq, 1).expand(B, Hq, Sq))
    has = torch.isfinite(row_max)
    m = torch.where(has, row_max, torch.zeros_like(row_max)).detach()
    xs = torch.where(vis, x, torch.zeros_like(x))
    e = torch.where(vis, torch.exp(xs - m.unsqueeze(-1)), torch.zeros_like(x))
    sum_exp = e.sum(-1)
    if sinks is not None:
        sum_exp = sum_exp + torch.exp(sinks.view(1, Hq, 1) - m)
    lse = torch.where(has, m + torch.log(torch.where(has, sum_exp, torch.ones_like(sum_exp))), neg.expand_as(m))
    lse_safe = torch.where(has, lse, torch.zeros_like(lse))
    p = torch.where(vis, torch.exp(xs - lse_safe.unsqueeze(-1)), torch.zeros_like(x))
    mult = torch.ones_like(x)
    if c.dropout_p is not None:
        keep = dropout_keep(c.seed, c.offset, B, Hq, Sq, Skv, c.dropout_p)
        mult = keep.to(torch.float64) / (1.0 - c.dropout_p)
    elif c.dropout_mask is not None:
        mult = (c.dropout_mask.to(torch.float64) * c.dropout_scale).expand(B, Hq, Sq, Skv)
    o = (p * mult) @ vv
    if gate is not None:
        o = o * torch.sigmoid(gate)
    return dict(o=o, lse=lse, row_max=row_max, sum_exp=torch.where(has, sum_exp, torch.zeros_like(sum_exp)),
                logits=torch.where(vis, x, neg), vis=vis)


def max_logit(out: dict) -> torch.Tensor:
    """Per-head max of the visible logits, [Hq] (-inf when none)."""
    return out["logits"].amax(dim=(0, 2, 3))
