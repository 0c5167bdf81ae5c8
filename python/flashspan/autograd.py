"""FlexAttnFunc: the autograd.Function behind flex_attn_func (out and lse differentiable, max_logit not)."""

from __future__ import annotations

import torch

from . import _ops  # registers torch.ops.flashspan.*
from .execution import run_backward


class FlexAttnFunc(torch.autograd.Function):
    """forward(q, k, v, plan, softmax_scale, deterministic, return_max_logit) -> (out, lse, max_logit).

    Saves q, k, v, out, lse; the backward adds the gradient of lse (dS += dlse * P).
    The plan object is kept on ctx so it outlives the backward.
    """

    @staticmethod
    def forward(ctx, q, k, v, plan, softmax_scale, deterministic, return_max_logit):
        if torch.compiler.is_compiling():
            out, lse, max_logit = torch.ops.flashspan.flex_fwd(q, k, v, plan.id, softmax_scale, return_max_logit)
        else:
            # Eager: the op's own body, without the dispatcher round trip (same code path).
            out, lse, max_logit = _ops.flex_fwd_impl(q, k, v, plan, softmax_scale, return_max_logit)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.plan = plan
        ctx.softmax_scale = softmax_scale
        ctx.deterministic = deterministic
        ctx.mark_non_differentiable(max_logit)
        ctx.set_materialize_grads(False)
        return out, lse, max_logit

    @staticmethod
    def backward(ctx, dout, dlse, _dmax_logit):
        q, k, v, out, lse = ctx.saved_tensors
        if dout is None and dlse is None:
            return None, None, None, None, None, None, None
        if torch.compiler.is_compiling():
            dq, dk, dv = torch.ops.flashspan.flex_bwd(
                q, k, v, out, dout, lse, dlse, ctx.plan.id, ctx.softmax_scale, ctx.deterministic
            )
        else:
            dq, dk, dv = run_backward(q, k, v, out, dout, lse, dlse, ctx.plan, ctx.softmax_scale, ctx.deterministic)
        return dq, dk, dv, None, None, None, None
