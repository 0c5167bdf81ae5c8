"""torch.library custom ops (flashspan::flex_fwd / flex_bwd) and their fake kernels, so torch.compile traces them."""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from .execution import lse_shape_of, run_backward, run_forward, stats_dtype_of
from .plan import plan_from_id

# The MaskPlan crosses the op boundary as its integer id (MaskPlan.id): an int is a plain
# constant for the tracer and needs no private opaque-object machinery. Real kernels
# resolve it with plan_from_id; fake kernels never need the plan (shapes follow from q, v).


@torch.library.custom_op("flashspan::flex_fwd", mutates_args=())
def flex_fwd(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    plan_id: int,
    softmax_scale: Optional[float],
    return_max_logit: bool,
) -> tuple[Tensor, Tensor, Tensor]:
    """(out, lse, max_logit); max_logit is an empty tensor unless return_max_logit (fp32; fp64 for fp64 q)."""
    return flex_fwd_impl(q, k, v, plan_from_id(plan_id), softmax_scale, return_max_logit)


def flex_fwd_impl(q, k, v, plan, softmax_scale, return_max_logit):
    """The body of flex_fwd with the plan object (eager callers skip the dispatcher with it)."""
    out, lse, max_logit = run_forward(q, k, v, plan, softmax_scale, return_max_logit)
    if max_logit is None:
        max_logit = torch.empty((0,), dtype=stats_dtype_of(q), device=q.device)
    return out, lse, max_logit


@flex_fwd.register_fake
def _flex_fwd_fake(q, k, v, plan_id, softmax_scale, return_max_logit):
    out = q.new_empty((*q.shape[:-1], v.shape[-1]))
    lse = q.new_empty(lse_shape_of(q), dtype=stats_dtype_of(q))
    max_logit = q.new_empty((q.shape[-2] if return_max_logit else 0,), dtype=stats_dtype_of(q))
    return out, lse, max_logit


@torch.library.custom_op("flashspan::flex_bwd", mutates_args=())
def flex_bwd(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    out: Tensor,
    dout: Optional[Tensor],
    lse: Tensor,
    dlse: Optional[Tensor],
    plan_id: int,
    softmax_scale: Optional[float],
    deterministic: bool,
) -> tuple[Tensor, Tensor, Tensor]:
    """(dq, dk, dv); dout None means zero, dlse None means lse gets no gradient."""
    return run_backward(q, k, v, out, dout, lse, dlse, plan_from_id(plan_id), softmax_scale, deterministic)


@flex_bwd.register_fake
def _flex_bwd_fake(q, k, v, out, dout, lse, dlse, plan_id, softmax_scale, deterministic):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
