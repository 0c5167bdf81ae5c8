"""Benchmark workloads of BENCHMARK.md (flex masks and dense SDPA shapes) and their FLOP counts."""

from __future__ import annotations

import dataclasses
from typing import Callable, Optional

import torch

from .. import masks as fm

#: (Dqk, Dv) pairs selectable with --head-dim.
HEAD_DIMS = {128: (128, 128), 192: (192, 128), 256: (256, 256), 64: (64, 64)}
#: The head dims of BENCHMARK.md's mask workloads: what --head-dim all runs ((64, 64) only when asked for).
BENCHMARK_HEAD_DIMS = (128, 192, 256)

PHASES = ("forward", "backward", "combined")


@dataclasses.dataclass
class Workload:
    """One attention problem: geometry, mask and which peers can express it.

    ``mask_func`` is the int32 ``[Hmask, nfunc, B*S]`` endpoint tensor flashspan runs;
    ``natural_mask_mod`` is the FlexAttention mask_mod a PyTorch user would write (None
    when the mask is dense); ``sdpa_causal`` is None when SDPA cannot express the mask,
    else the ``is_causal`` flag to pass.
    """

    name: str                 # e.g. "causal" or "dense B1 H16 S8192 causal"
    kind: str                 # "flex" or "dense"
    batch: int
    heads_q: int
    heads_kv: int
    seqlen: int
    head_dim_qk: int
    head_dim_v: int
    mask_func: torch.Tensor
    mask_name: str            # the BENCHMARK.md mask name, "dense" or "dense_causal"
    natural_mask_mod: Optional[Callable] = None
    sdpa_causal: Optional[bool] = None

    @property
    def visible_pairs(self) -> int:
        """Visible (q, k) pairs summed over all query heads."""
        pairs = fm.visible_pairs(self.mask_func)
        return pairs * (self.heads_q if self.mask_func.shape[0] == 1 else 1)

    @property
    def density(self) -> float:
        return fm.density(self.mask_func, self.seqlen)

    def flops(self, phase: str) -> float:
        """FLOPs over visible pairs: 2*(Dqk+Dv) per pair forward, 2.5x that backward (DESIGN.md)."""
        fwd = 2.0 * (self.head_dim_qk + self.head_dim_v) * self.visible_pairs
        return {"forward": fwd, "backward": 2.5 * fwd, "combined": 3.5 * fwd}[phase]

    def describe(self) -> dict:
        return {
            "workload": self.name,
            "kind": self.kind,
            "mask": self.mask_name,
            "B": self.batch,
            "Hq": self.heads_q,
            "Hkv": self.heads_kv,
            "S": self.seqlen,
            "Dqk": self.head_dim_qk,
            "Dv": self.head_dim_v,
            "nfunc": int(self.mask_func.shape[1]),
            "density": round(self.density, 6),
            "visible_pairs": self.visible_pairs,
        }


def flex_workloads(mask_names, seqlen: int, head_dims, heads: int, batch: int, seed: int,
                   device: torch.device) -> list[Workload]:
    """The BENCHMARK.md flex-mask workloads: every mask x every (Dqk, Dv), Hq = Hkv = heads."""
    out = []
    for hd in head_dims:
        dqk, dv = HEAD_DIMS[hd]
        for name in mask_names:
            mf = fm.benchmark_mask(name, seqlen, seed=seed, batch=batch, device=device)
            mod = fm.benchmark_mask_mod(name, seqlen, seed=seed, device=device)
            out.append(Workload(
                name=f"{name} D{dqk}/{dv}" if len(head_dims) > 1 else name,
                kind="flex", batch=batch, heads_q=heads, heads_kv=heads, seqlen=seqlen,
                head_dim_qk=dqk, head_dim_v=dv, mask_func=mf, mask_name=name,
                natural_mask_mod=mod, sdpa_causal=True if name == "causal" else None))
    return out


# BENCHMARK.md "Dense SDPA shapes": (B, Hq, Hkv, S, Dqk, Dv). GQA (Llama) and DeepSeek at
# S = 4K..32K: we run 8K and 32K.
_DENSE_FULL = [
    (1, 16, 16, 8192, 128, 128),
    (1, 16, 16, 32768, 128, 128),
    (1, 4, 4, 131072, 128, 128),
    (4, 16, 16, 4096, 64, 64),
    (1, 64, 8, 8192, 128, 128),
    (1, 64, 8, 32768, 128, 128),
    (1, 128, 128, 8192, 192, 128),
    (1, 128, 128, 32768, 192, 128),
]
_DENSE_QUICK = [
    (1, 16, 16, 8192, 128, 128),
    (4, 16, 16, 4096, 64, 64),
    (1, 64, 8, 8192, 128, 128),
    (1, 128, 128, 8192, 192, 128),
]


def dense_workloads(quick: bool, cpu_seqlen: Optional[int], device: torch.device) -> list[Workload]:
    """Dense (causal and non-causal) SDPA shapes of BENCHMARK.md.

    On CPU (``cpu_seqlen`` given) the shapes shrink to ``B=1, S=cpu_seqlen`` and at most 4
    heads (keeping the GQA ratio where it fits), so the reference backend finishes quickly.
    """
    shapes = _DENSE_QUICK if quick else _DENSE_FULL
    if cpu_seqlen is not None:
        small = []
        for b, hq, hkv, s, dqk, dv in shapes:
            hkv_small = 1 if hq != hkv else 4
            cand = (1, 4, hkv_small, cpu_seqlen, dqk, dv)
            if cand not in small:
                small.append(cand)
        shapes = small
    out = []
    for b, hq, hkv, s, dqk, dv in shapes:
        for is_causal in (False, True):
            rows = torch.arange(s, dtype=torch.int32)
            ends = rows + 1 if is_causal else torch.full_like(rows, s)
            mf = ends.repeat(b).view(1, 1, b * s).to(device)
            label = f"dense B{b} H{hq}" + (f"/{hkv}" if hkv != hq else "") + f" S{s} D{dqk}" + \
                (f"/{dv}" if dv != dqk else "") + (" causal" if is_causal else "")
            out.append(Workload(
                name=label, kind="dense", batch=b, heads_q=hq, heads_kv=hkv, seqlen=s,
                head_dim_qk=dqk, head_dim_v=dv, mask_func=mf,
                mask_name="dense_causal" if is_causal else "dense",
                natural_mask_mod=(lambda bb, hh, q, kv: q >= kv) if is_causal else None,
                sdpa_causal=is_causal))
    return out


def paged_cache(dense: torch.Tensor, page: int, gen: torch.Generator):
    """A paged K or V cache holding ``dense`` ([B, H, S, D], S a multiple of ``page``): (container
    ``[B * S / page, H, page, D]`` with the pages in a random order drawn from ``gen``, page table
    ``[B, 1, S / page, 1]`` int32), the ``flashspan.sdpa`` paged form (``paged_attention_k_table`` / ``_v_table``)."""
    b, h, s, d = dense.shape
    n = s // page
    perm = torch.randperm(b * n, generator=gen).to(dense.device)
    container = torch.empty(b * n, h, page, d, dtype=dense.dtype, device=dense.device)
    container[perm] = dense.view(b, h, n, page, d).permute(0, 2, 1, 3, 4).reshape(b * n, h, page, d)
    return container, perm.view(b, 1, n, 1).to(torch.int32)
