"""Error criteria for kernel results against a reference: the one definition the Python GPU tests use.

The C++ twin is tests/cpp/error_criteria.h (same numbers). The reference runs the softmax in fp32 (or
float64) on the same 16-bit inputs the kernel gets.

Outputs and gradients (16-bit tensors, compared in float64):
  * relative L2:   ||got - ref||_2 <= REL_L2[dtype] * ||ref||_2 + FLOOR * sqrt(n)
  * max-abs bound: |got - ref| <= MAX_ABS[dtype] * (max|ref| + |ref|) + FLOOR   (every element)
  The relative L2 catches errors spread over many elements (a dQ scaled by 1.01, a key column dropped
  in every block); the elementwise bound catches errors confined to a few elements (a zeroed row).
LSE and max_logit (fp32): |got - ref| <= STAT_ATOL (2e-3, absolute: a 1 % loss of softmax mass moves
  LSE by 1e-2), and -inf exactly where the reference has -inf.
NaN anywhere the reference is finite fails (outputs are NaN-poisoned before the call: an element the
kernel never wrote stays NaN).
"""

from __future__ import annotations

import math

import torch

REL_L2 = {torch.bfloat16: 1e-2, torch.float16: 3e-3, torch.float32: 1e-5}
MAX_ABS = {torch.bfloat16: 2.5e-2, torch.float16: 6e-3, torch.float32: 2e-5}
STAT_ATOL = 2e-3
FLOOR = 1e-6


def _prep(got: torch.Tensor, ref: torch.Tensor, what: str):
    g, r = got.detach().double().cpu(), ref.detach().double().cpu()
    assert g.shape == r.shape, f"{what}: shape {tuple(g.shape)} != reference {tuple(r.shape)}"
    inf = torch.isinf(r)
    nan = torch.isnan(g) & ~torch.isnan(r)
    assert not nan.any(), f"{what}: {int(nan.sum())} NaN elements where the reference is finite (unwritten output?)"
    bad_inf = (torch.isinf(g) != inf) | (inf & (g != r))
    assert not bad_inf.any(), f"{what}: infinities differ from the reference at {int(bad_inf.sum())} elements"
    fin = ~inf
    return g[fin], r[fin]


def grad_floor(scale: float, dv: int, max_do: float, max_v: float, max_other: float) -> float:
    """The floor of dQ (dK) where dP - D cancels (error_criteria.h grad_floor, same formula): the fp32 rounding of
    dP and D, 2^-20 of sqrt(D_v) max|dO| max|V|, times |scale| max|K| (max|Q|)."""
    return 2.0 ** -20 * abs(scale) * math.sqrt(dv) * max_do * max_v * max_other


def check_tensor(got: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype, what: str, floor: float = FLOOR) -> None:
    """Output / gradient criterion (relative L2 plus elementwise max-abs bound) for a `dtype` kernel result;
    `floor` raises the absolute floor (grad_floor)."""
    floor = max(floor, FLOOR)
    g, r = _prep(got, ref, what)
    if r.numel() == 0:
        return
    err = g - r
    e2, r2 = err.norm().item(), r.norm().item()
    l2_bound = REL_L2[dtype] * r2 + floor * math.sqrt(r.numel())
    assert e2 <= l2_bound, (f"{what}: relative L2 error {e2 / max(r2, 1e-300):.3g} > {REL_L2[dtype]:.3g} "
                            f"(||err|| {e2:.3g}, ||ref|| {r2:.3g})")
    bound = MAX_ABS[dtype] * (r.abs().max() + r.abs()) + floor
    over = err.abs() > bound
    if over.any():
        i = int((err.abs() - bound).argmax())
        raise AssertionError(f"{what}: {int(over.sum())} elements over the max-abs bound; worst at flat index {i}: "
                             f"got {g[i].item():.6g}, ref {r[i].item():.6g}, bound {bound[i].item():.3g}")


def check_reduced_grad(got: torch.Tensor, ref: torch.Tensor, mass: torch.Tensor, dtype: torch.dtype, what: str) -> None:
    """Criterion of a gradient that is a sum of terms over broadcast dims (dBias: dS summed over the dims the bias
    broadcasts), for `dtype` kernel inputs. Such a sum can cancel (over keys, sum_j dS_ij = D_i P_sink, 0 without a
    sink), so the error is bounded by the terms' magnitude: `mass` (the reference's sum of |term| over the same
    dims, shaped like `ref`) replaces |ref| in both bounds:
      relative L2:   ||got - ref||_2 <= REL_L2[dtype] * ||mass||_2 + FLOOR * sqrt(n)
      max-abs bound: |got - ref| <= MAX_ABS[dtype] * (max mass + mass) + FLOOR   (every element)
    Where the sum does not cancel (mass ~ |ref|) this is check_tensor's criterion."""
    g, r = _prep(got, ref, what)
    m = mass.detach().double().cpu().expand(ref.shape)[~torch.isinf(ref.detach().double().cpu())]
    if r.numel() == 0:
        return
    err = g - r
    e2, m2 = err.norm().item(), m.norm().item()
    assert e2 <= REL_L2[dtype] * m2 + FLOOR * math.sqrt(r.numel()), (
        f"{what}: L2 error {e2:.3g} > {REL_L2[dtype]:.3g} x ||sum of |terms|||_2 {m2:.3g}")
    bound = MAX_ABS[dtype] * (m.max() + m) + FLOOR
    over = err.abs() > bound
    if over.any():
        i = int((err.abs() - bound).argmax())
        raise AssertionError(f"{what}: {int(over.sum())} elements over the max-abs bound; worst at flat index {i}: "
                             f"got {g[i].item():.6g}, ref {r[i].item():.6g}, bound {bound[i].item():.3g}")


def check_stat(got: torch.Tensor, ref: torch.Tensor, what: str) -> None:
    """LSE / max_logit criterion: absolute STAT_ATOL, -inf matching exactly."""
    g, r = _prep(got, ref, what)
    if r.numel() == 0:
        return
    err = (g - r).abs()
    worst = err.max().item()
    assert worst <= STAT_ATOL, f"{what}: max abs error {worst:.3g} > {STAT_ATOL} (at flat index {int(err.argmax())})"


def softmax_scale_of_kind(kind: str, seed: int, head_dim: int) -> float | None:
    """"default" (None: the library's 1/sqrt(D)), "zero", "positive" (random in [0.25, 2] / sqrt(D)) or
    "negative" (minus that; only without max_logit)."""
    if kind == "default":
        return None
    if kind == "zero":
        return 0.0
    u = ((seed * 2654435761) % 1000003) / 1000003.0  # deterministic in [0, 1)
    s = (0.25 + 1.75 * u) / math.sqrt(head_dim)
    return s if kind == "positive" else -s


def random_softmax_scale(seed: int, head_dim: int, allow_negative: bool) -> float | None:
    """A softmax_scale drawn by `seed` (as tests/cpp/error_criteria.h does): the default 1/sqrt(D) 40 %,
    zero 10 %, a random positive scale the rest; negative instead for a share when `allow_negative`
    (max_logit not requested: a negative scale and max_logit exclude each other)."""
    bucket = ((seed * 2654435761) >> 7) % 10
    if bucket == 0:
        return softmax_scale_of_kind("zero", seed, head_dim)
    if bucket <= 4:
        return softmax_scale_of_kind("default", seed, head_dim)
    return softmax_scale_of_kind("negative" if allow_negative and bucket >= 8 else "positive", seed, head_dim)
