"""float32 math reference on sampled rows and key columns, for spot-checking every result.

Exact attention of a 128K sequence costs as much as the kernels being measured, but a
spot-check needs only a sample: out, LSE and dQ of a row depend on that row alone, and
dK, dV of a key column need every row's LSE and ``D_i = dO_i . O_i`` (one streaming pass
over all rows). So one pass over row chunks computes, in float32 from the same bf16
inputs: out, LSE and dQ for the sampled rows and dK, dV for the sampled columns
(FlashAttention-2 backward, Dao 2023: P = exp(S - LSE), dS = P * (dP - D)). Each chunk
only touches the key range its rows can see, so local masks cost little.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Optional

import torch


@dataclasses.dataclass
class Sample:
    """Row and column indices (per sample, shared by every batch sample and head)."""

    rows: torch.Tensor   # int64 [R], sorted
    cols: torch.Tensor   # int64 [J], sorted


def make_sample(seqlen: int, num_rows: int, num_cols: int, seed: int, device: torch.device,
                mask_func: Optional[torch.Tensor] = None) -> Sample:
    """Random rows/columns plus the edges (0, S-1) and, when given, a few rows whose
    visible sets are unusual (the most and the fewest visible keys)."""
    g = torch.Generator().manual_seed(seed)
    rows = set(torch.randperm(seqlen, generator=g)[:num_rows].tolist()) | {0, seqlen - 1}
    cols = set(torch.randperm(seqlen, generator=g)[:num_cols].tolist()) | {0, seqlen - 1}
    if mask_func is not None and mask_func.shape[2] >= seqlen:
        e = mask_func[0, :, :seqlen].to(torch.int64).cpu()
        sign = torch.ones(e.shape[0], dtype=torch.int64)
        sign[1::2] = -1
        count = (e * sign.view(-1, 1)).sum(0)
        rows |= {int(count.argmax()), int(count.argmin())}
    return Sample(torch.tensor(sorted(rows), device=device), torch.tensor(sorted(cols), device=device))


def _visible(ep: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """ep int64 [n, C] endpoints of C rows, keys int64 [K] -> bool [C, K]:
    visible iff an even number of the row's endpoints are <= key."""
    count = torch.zeros(ep.shape[1], keys.numel(), dtype=torch.int32, device=ep.device)
    for j in range(ep.shape[0]):
        count += (ep[j].view(-1, 1) <= keys.view(1, -1)).to(torch.int32)
    return (count % 2) == 0


def _key_range(ep: torch.Tensor, seqlen: int) -> tuple[int, int]:
    """A key range [lo, hi) that holds every visible key of these rows."""
    hi = int(ep[-1].max())
    lo = 0 if bool((ep[0] > 0).any()) or ep.shape[0] == 1 else int(ep[1].min())
    return min(lo, hi), min(hi, seqlen)


@torch.no_grad()
def reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, do: Optional[torch.Tensor],
              mask_func: torch.Tensor, sample: Sample, scale: Optional[float] = None,
              chunk_elements: int = 1 << 26) -> dict:
    """float32 reference on the sample.

    Args:
        q, k, v, do: BSHD ``[B,S,Hq,Dqk]``, ``[B,S,Hkv,Dqk]``, ``[B,S,Hkv,Dv]``, ``[B,S,Hq,Dv]``
            (``do`` None: forward only).
        mask_func: int32 ``[Hmask, nfunc, B*S]``.
        sample: rows and columns to produce.
        scale: softmax scale (default ``1/sqrt(Dqk)``).

    Returns:
        dict of float32 tensors: ``out [B,R,Hq,Dv]``, ``lse [B,Hq,R]`` (-inf for empty
        rows), and with ``do``: ``dq [B,R,Hq,Dqk]``, ``dk [B,J,Hkv,Dqk]``, ``dv [B,J,Hkv,Dv]``.
    """
    b_, s_, hq, dqk = q.shape
    hkv, dv = k.shape[2], v.shape[3]
    group = hq // hkv
    scale = 1.0 / math.sqrt(dqk) if scale is None else float(scale)
    dev = q.device
    rows, cols = sample.rows.to(dev), sample.cols.to(dev)
    nr, nc = rows.numel(), cols.numel()
    out = torch.zeros(b_, nr, hq, dv, dtype=torch.float32, device=dev)
    lse_out = torch.full((b_, hq, nr), float("-inf"), dtype=torch.float32, device=dev)
    with_grad = do is not None
    if with_grad:
        dq = torch.zeros(b_, nr, hq, dqk, dtype=torch.float32, device=dev)
        dk = torch.zeros(b_, nc, hkv, dqk, dtype=torch.float32, device=dev)
        dvv = torch.zeros(b_, nc, hkv, dv, dtype=torch.float32, device=dev)
    chunk = max(1, min(s_, chunk_elements // max(s_, 1)))
    row_pos = torch.full((s_,), -1, dtype=torch.int64, device=dev)
    row_pos[rows] = torch.arange(nr, device=dev)
    prev_tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False  # a float32 reference, not TF32
    try:
        for b in range(b_):
            for h in range(hq):
                hk = h // group
                hm = h if mask_func.shape[0] > 1 else 0
                ep_all = mask_func[hm, :, b * s_:(b + 1) * s_].to(torch.int64)
                qf = q[b, :, h].float()
                kf = k[b, :, hk].float()
                vf = v[b, :, hk].float()
                dof = do[b, :, h].float() if with_grad else None
                for r0 in range(0, s_, chunk):
                    r1 = min(s_, r0 + chunk)
                    in_chunk = (rows >= r0) & (rows < r1)
                    if not with_grad and not bool(in_chunk.any()):
                        continue
                    ep = ep_all[:, r0:r1]
                    lo, hi = _key_range(ep, s_)
                    if hi <= lo:
                        continue
                    keys = torch.arange(lo, hi, device=dev)
                    s = (qf[r0:r1] @ kf[lo:hi].T) * scale
                    vis = _visible(ep, keys)
                    s.masked_fill_(~vis, float("-inf"))
                    m = s.amax(dim=1, keepdim=True)
                    m_safe = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
                    p = torch.exp(s - m_safe)
                    denom = p.sum(dim=1, keepdim=True)
                    lse = (m_safe + torch.log(denom)).squeeze(1)          # -inf for empty rows
                    p = torch.where(denom > 0, p / denom.clamp(min=1e-30), torch.zeros_like(p))
                    o = p @ vf[lo:hi]
                    sel = rows[in_chunk]
                    if sel.numel():
                        local = sel - r0
                        out[b, row_pos[sel], h] = o[local]
                        lse_out[b, h, row_pos[sel]] = lse[local]
                    if not with_grad:
                        continue
                    d = (dof[r0:r1] * o).sum(dim=1)
                    if sel.numel():
                        local = sel - r0
                        dp = dof[sel] @ vf[lo:hi].T
                        ds = p[local] * (dp - d[local].unsqueeze(1))
                        dq[b, row_pos[sel], h] = (ds @ kf[lo:hi]) * scale
                    cin = (cols >= lo) & (cols < hi)
                    if bool(cin.any()):
                        cj = cols[cin]
                        pj = p[:, cj - lo]                                # [C, J']
                        dvv[b, cin.nonzero().squeeze(1), hk] += pj.T @ dof[r0:r1]
                        dpj = dof[r0:r1] @ vf[cj].T
                        dsj = pj * (dpj - d.unsqueeze(1))
                        dk[b, cin.nonzero().squeeze(1), hk] += (dsj.T @ qf[r0:r1]) * scale
    finally:
        torch.backends.cuda.matmul.allow_tf32 = prev_tf32
    res = {"out": out, "lse": lse_out}
    if with_grad:
        res.update(dq=dq, dk=dk, dv=dvv)
    return res


def rel_error(got: torch.Tensor, ref: torch.Tensor) -> float:
    """||got - ref||_F / ||ref||_F in float64 (inf when got has NaN/inf where ref is finite)."""
    g = got.double()
    r = ref.double()
    if not bool(torch.isfinite(g).all()):
        return float("inf")
    den = float(r.norm())
    num = float((g - r).norm())
    return num / den if den > 0 else num


def lse_error(got: torch.Tensor, ref: torch.Tensor) -> float:
    """Max |got - ref| over rows; inf if the empty-row (-inf) pattern differs or got has NaN."""
    g, r = got.double(), ref.double()
    if bool(torch.isnan(g).any()):
        return float("inf")
    gi, ri = torch.isinf(g), torch.isinf(r)
    if not torch.equal(gi, ri) or not torch.equal(g[gi], r[ri]):
        return float("inf")
    fin = ~ri
    return float((g[fin] - r[fin]).abs().max()) if bool(fin.any()) else 0.0


def tolerances(dtype: torch.dtype) -> dict:
    """Spot-check limits: relative Frobenius error for out/dq/dk/dv, absolute for LSE.

    bf16/fp16 inputs with fp32 accumulation typically give 3e-3..1e-2 relative error;
    the limits leave room for long sequences without letting a wrong mask through (a
    wrong visible set gives errors of order 1e-1..1).
    """
    if dtype == torch.float32:
        return {"out": 1e-4, "lse": 1e-4, "dq": 1e-3, "dk": 1e-3, "dv": 1e-3}
    return {"out": 2e-2, "lse": 2e-2, "dq": 5e-2, "dk": 5e-2, "dv": 5e-2}
