"""Independent PyTorch math reference for flex attention (dense masks from endpoints) and random test problems."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import torch


def dense_mask(mask_func: torch.Tensor, cu_q: list[int], cu_k: list[int]) -> list[torch.Tensor]:
    """Per sample b: bool [Hmask, Sq_b, Sk_b]; key j visible iff an even number of endpoints is <= j.

    (Endpoints F0 <= F1 <= ... give [0,F0) U [F1,F2) U ...: below F0 none is <= j, in
    [F0,F1) one is, in [F1,F2) two are, and so on.)
    """
    out = []
    for b in range(len(cu_q) - 1):
        f = mask_func[:, :, cu_q[b] : cu_q[b + 1]].long()  # [Hm, nfunc, Sq_b]
        j = torch.arange(cu_k[b + 1] - cu_k[b], device=f.device)
        count = (f.unsqueeze(-1) <= j).sum(dim=1)  # [Hm, Sq_b, Sk_b]
        out.append(count % 2 == 0)
    return out


def attention_thd(q, k, v, masks, cu_q, cu_k, scale):
    """float64 math: q [Tq,Hq,D], k [Tk,Hkv,D], v [Tk,Hkv,Dv], masks from dense_mask.

    Returns (out [Tq,Hq,Dv], lse [Hq,Tq] with -inf on empty rows, max_logit [Hq]), all
    differentiable w.r.t. q/k/v (empty rows contribute no gradient).
    """
    hq, hkv = q.shape[1], k.shape[1]
    group = hq // hkv
    outs, lses = [], []
    max_logit = torch.full((hq,), -math.inf, dtype=torch.float32 if q.dtype != torch.float64 else q.dtype,
                           device=q.device)
    for b in range(len(cu_q) - 1):
        qb = q[cu_q[b] : cu_q[b + 1]].transpose(0, 1)  # [Hq, Sq, D]
        kb = k[cu_k[b] : cu_k[b + 1]].transpose(0, 1).repeat_interleave(group, 0)
        vb = v[cu_k[b] : cu_k[b + 1]].transpose(0, 1).repeat_interleave(group, 0)
        m = masks[b].expand(hq, -1, -1)
        s = scale * qb @ kb.transpose(-1, -2)
        s = s.masked_fill(~m, -math.inf)
        empty = ~m.any(-1, keepdim=True)
        if s.numel():
            max_logit = torch.maximum(max_logit, s.detach().amax(dim=(1, 2)).to(max_logit.dtype))
        if s.shape[-1]:
            rowmax = s.detach().amax(-1, keepdim=True)
        else:
            rowmax = torch.zeros(s.shape[:-1] + (1,), dtype=s.dtype, device=s.device)
        rowmax = torch.where(empty, torch.zeros_like(rowmax), rowmax)
        sumexp = torch.exp(s - rowmax).sum(-1, keepdim=True)
        sumexp = torch.where(empty, torch.ones_like(sumexp), sumexp)
        lse = rowmax + torch.log(sumexp)
        p = torch.exp(s - lse)  # exp(-inf) = 0 on masked and empty rows
        outs.append((p @ vb).transpose(0, 1))
        lses.append(torch.where(empty, torch.full_like(lse, -math.inf), lse).squeeze(-1))
    return torch.cat(outs, 0), torch.cat(lses, 1), max_logit


@dataclass
class Problem:
    """A random flex-attention problem: tensors in the layout the library takes, plus the geometry."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    mask_func: torch.Tensor
    cu_q: list[int]
    cu_k: list[int]
    varlen: bool
    cu_seqlens_q: Optional[torch.Tensor] = None
    cu_seqlens_k: Optional[torch.Tensor] = None

    def plan_kwargs(self) -> dict:
        if not self.varlen:
            return {}
        return dict(
            cu_seqlens_q=self.cu_seqlens_q,
            cu_seqlens_k=self.cu_seqlens_k,
            max_seqlen_q=max(1, max(b - a for a, b in zip(self.cu_q, self.cu_q[1:]))),
            max_seqlen_k=max(1, max(b - a for a, b in zip(self.cu_k, self.cu_k[1:]))),
        )

    def to_thd(self, t: torch.Tensor) -> torch.Tensor:
        return t.reshape(-1, *t.shape[2:]) if not self.varlen else t

    def from_thd(self, t: torch.Tensor) -> torch.Tensor:
        if self.varlen:
            return t
        return t.reshape(self.q.shape[0], -1, *t.shape[1:])

    def lse_from_thd(self, lse: torch.Tensor) -> torch.Tensor:
        """[Hq, Tq] -> [B, Hq, Sq] for BSHD."""
        if self.varlen:
            return lse
        b, sq = self.q.shape[0], self.q.shape[1]
        return lse.reshape(lse.shape[0], b, sq).transpose(0, 1)

    def reference(self, q=None, k=None, v=None, scale=None, dtype=torch.float64):
        """(out, lse, max_logit) computed in `dtype` (float64 by default) on the device of q, in the
        library's layout, from q/k/v (default: the problem's)."""
        q = self.q if q is None else q
        k = self.k if k is None else k
        v = self.v if v is None else v
        if scale is None:
            scale = 1.0 / math.sqrt(q.shape[-1])
        masks = [m.to(q.device) for m in dense_mask(self.mask_func.to(q.device), self.cu_q, self.cu_k)]
        out, lse, ml = attention_thd(
            self.to_thd(q).to(dtype), self.to_thd(k).to(dtype), self.to_thd(v).to(dtype), masks, self.cu_q, self.cu_k,
            scale,
        )
        return self.from_thd(out), self.lse_from_thd(lse), ml


def random_endpoints(gen: torch.Generator, hm: int, nfunc: int, cu_q: list[int], cu_k: list[int], empty_frac=0.1):
    """int32 [hm, nfunc, Tq]: sorted random endpoints in [0, Sk_b] per row; some rows fully empty."""
    rows = []
    for b in range(len(cu_q) - 1):
        sq, sk = cu_q[b + 1] - cu_q[b], cu_k[b + 1] - cu_k[b]
        f = torch.randint(0, sk + 1, (hm, nfunc, sq), generator=gen)
        f, _ = f.sort(dim=1)
        # A share of rows with F0 = 0 and the rest at Sk: the row sees no key.
        empty = torch.rand((hm, 1, sq), generator=gen) < empty_frac
        f = torch.where(empty, torch.full_like(f, sk), f)
        f[:, 0:1, :] = torch.where(empty, torch.zeros_like(f[:, 0:1, :]), f[:, 0:1, :])
        rows.append(f)
    return torch.cat(rows, dim=2).to(torch.int32).contiguous()


def endpoints_from_visibility(vis: torch.Tensor, nfunc: int) -> torch.Tensor:
    """int32 [nfunc, rows] endpoints of a bool [rows, sk] visibility (runs of visible keys; the first run
    is [0, F0) when it starts at key 0, else F0 = 0); `nfunc` must cover the row with the most runs."""
    rows, sk = vis.shape
    out = torch.zeros(nfunc, rows, dtype=torch.int64)
    pad = torch.zeros(rows, 1, dtype=torch.int8)
    d = torch.diff(torch.cat([pad, vis.to(torch.int8), pad], dim=1), dim=1)  # +1 at run starts, -1 at run ends
    for r in range(rows):
        starts = (d[r] == 1).nonzero().flatten().tolist()
        ends = (d[r] == -1).nonzero().flatten().tolist()
        ep = []
        for a, e in zip(starts, ends):
            ep += [e] if (a == 0 and not ep) else ([0, a, e] if not ep else [a, e])
        if not ep:
            ep = [0]
        assert len(ep) <= nfunc, f"row {r} needs {len(ep)} endpoints > nfunc {nfunc}"
        ep += [ep[-1]] * (nfunc - len(ep))
        out[:, r] = torch.tensor(ep)
    return out.to(torch.int32)


def block_visibility(gen: torch.Generator, sq: int, sk: int, tile: int = 128, max_missing: int = 4,
                     p_empty_row: float = 0.0) -> torch.Tensor:
    """bool [sq, sk] on a tile x tile grid: tiles full (35 %), empty (20 %), "full minus n" (30 %: 1..max_missing
    elements hidden, at tile corners or inside) or partial (a random staircase); then a share p_empty_row of
    rows emptied. The Python twin of tests/cpp/mask_gen.h block_visibility: 128 x 128 tiles contain every
    kernel / planner tile, so full blocks sit next to blocks missing a single element."""
    vis = torch.zeros(sq, sk, dtype=torch.bool)
    for q0 in range(0, sq, tile):
        for k0 in range(0, sk, tile):
            q1, k1 = min(sq, q0 + tile), min(sk, k0 + tile)
            x = torch.rand((), generator=gen).item()
            if x < 0.2:
                continue
            if x < 0.85:
                vis[q0:q1, k0:k1] = True
                if x >= 0.55:
                    n = int(torch.randint(1, max_missing + 1, (), generator=gen))
                    for _ in range(n):
                        corner = torch.randint(0, 3, (2,), generator=gen).tolist()
                        qq = [q0, q1 - 1, int(torch.randint(q0, q1, (), generator=gen))][corner[0]]
                        kk = [k0, k1 - 1, int(torch.randint(k0, k1, (), generator=gen))][corner[1]]
                        vis[qq, kk] = False
            else:
                off = int(torch.randint(-(k1 - k0) // 2, (k1 - k0) // 2 + 1, (), generator=gen))
                for q in range(q0, q1):
                    e = min(max(k0 + (q - q0) + 1 + off, k0), k1)
                    vis[q, k0:e] = True
    if p_empty_row > 0:
        vis[torch.rand(sq, generator=gen) < p_empty_row] = False
    return vis


def block_endpoints(gen: torch.Generator, hm: int, cu_q: list[int], cu_k: list[int], tile: int = 128) -> torch.Tensor:
    """int32 [hm, nfunc, Tq] block-structured masks (block_visibility) per (mask head, sample); nfunc is the
    largest any row needs."""
    vis = [[block_visibility(gen, cu_q[b + 1] - cu_q[b], cu_k[b + 1] - cu_k[b], tile) for b in range(len(cu_q) - 1)]
           for _ in range(hm)]

    def runs(v):
        if v.numel() == 0:
            return 0
        d = torch.diff(torch.cat([torch.zeros(v.shape[0], 1, dtype=torch.int8), v.to(torch.int8)], dim=1), dim=1)
        return int((d == 1).sum(1).max())

    nfunc = 2 * max([runs(v) for per in vis for v in per] + [1]) + 1
    return torch.stack([torch.cat([endpoints_from_visibility(v, nfunc) for v in per], dim=1) for per in vis])


def causal_endpoints(cu_q: list[int], cu_k: list[int]) -> torch.Tensor:
    """int32 [1, 1, Tq]: bottom-right aligned causal per sample (row i of Sq sees [0, Sk - Sq + i + 1))."""
    rows = []
    for b in range(len(cu_q) - 1):
        sq, sk = cu_q[b + 1] - cu_q[b], cu_k[b + 1] - cu_k[b]
        rows.append((torch.arange(sq) + sk - sq + 1).clamp(0, sk))
    return torch.cat(rows).to(torch.int32).view(1, 1, -1)


def make_problem(
    seed: int,
    *,
    varlen: bool = False,
    batch: int = 2,
    seqlen_q=37,
    seqlen_k=45,
    hq: int = 4,
    hkv: int = 2,
    hm: int = 1,
    nfunc: int = 3,
    dqk: int = 16,
    dv: int = 16,
    dtype=torch.float32,
    device="cpu",
    requires_grad: bool = False,
    mask: str = "random",
) -> Problem:
    """Random q/k/v (normal) and mask ("random" endpoints, "causal", or "blocks": block_endpoints, whose
    nfunc follows from the mask). THD: seqlen_q/seqlen_k are per-sample length lists (or maxima)."""
    gen = torch.Generator().manual_seed(seed)
    if varlen:
        def lengths(s):
            if isinstance(s, (list, tuple)):
                return list(s)
            return torch.randint(1, s + 1, (batch,), generator=gen).tolist()

        lq, lk = lengths(seqlen_q), lengths(seqlen_k)
        cu_q = [0] + torch.tensor(lq).cumsum(0).tolist()
        cu_k = [0] + torch.tensor(lk).cumsum(0).tolist()
        qs, ks = (cu_q[-1], hq, dqk), (cu_k[-1], hkv, dqk)
        vs = (cu_k[-1], hkv, dv)
    else:
        cu_q = [b * seqlen_q for b in range(batch + 1)]
        cu_k = [b * seqlen_k for b in range(batch + 1)]
        qs, ks, vs = (batch, seqlen_q, hq, dqk), (batch, seqlen_k, hkv, dqk), (batch, seqlen_k, hkv, dv)
    q = torch.randn(qs, generator=gen).to(dtype)
    k = torch.randn(ks, generator=gen).to(dtype)
    v = torch.randn(vs, generator=gen).to(dtype)
    if mask == "random":
        mf = random_endpoints(gen, hm, nfunc, cu_q, cu_k)
    elif mask == "causal":
        mf = causal_endpoints(cu_q, cu_k).expand(hm, 1, -1).contiguous()
    elif mask == "blocks":  # nfunc follows from the mask
        mf = block_endpoints(gen, hm, cu_q, cu_k)
    else:
        raise ValueError(mask)
    q, k, v, mf = (t.to(device) for t in (q, k, v, mf))
    if requires_grad:
        for t in (q, k, v):
            t.requires_grad_(True)
    p = Problem(q, k, v, mf, cu_q, cu_k, varlen)
    if varlen:
        p.cu_seqlens_q = torch.tensor(cu_q, dtype=torch.int32, device=device)
        p.cu_seqlens_k = torch.tensor(cu_k, dtype=torch.int32, device=device)
    return p


def tolerance(dtype) -> float:
    """Absolute tolerance (relative to the reference's magnitude) of one dtype."""
    return {torch.float32: 2e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}[dtype]


def assert_close(actual: torch.Tensor, expected: torch.Tensor, dtype, what: str, factor: float = 1.0):
    """|actual - expected| <= tol * (1 + max|expected|) elementwise, -inf where expected is -inf."""
    a, e = actual.detach().double().cpu(), expected.detach().double().cpu()
    assert a.shape == e.shape, f"{what}: shape {tuple(a.shape)} != {tuple(e.shape)}"
    inf = torch.isinf(e)
    assert torch.equal(torch.isinf(a), inf) and torch.equal(a[inf], e[inf]), f"{what}: infinities differ"
    if (~inf).any():
        tol = factor * tolerance(dtype) * (1.0 + e[~inf].abs().max().item())
        err = (a[~inf] - e[~inf]).abs().max().item()
        assert err <= tol, f"{what}: max abs error {err:.3g} > {tol:.3g}"
