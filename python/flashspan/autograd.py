"""FlexAttnFunc, the autograd.Function behind flex_attn_func (out, lse differentiable once; max_logit not)."""

from __future__ import annotations

import torch

from . import _ops  # registers torch.ops.flashspan.*
from .execution import run_backward, run_forward


class _NoDoubleBackward(torch.autograd.Function):
    """Identity on the gradients a flashspan backward returns under ``create_graph=True``, whose own backward
    raises: flashspan's backward kernels are not differentiable, and without this node torch only says "element 0
    of tensors does not require grad" when something differentiates those gradients."""

    @staticmethod
    def forward(ctx, where, anchor, *grads):
        ctx.where = where
        # Copies: an output that is an input (or a view made here) would tie autograd's view rules to these tensors.
        return tuple(None if g is None else g.clone() for g in grads)

    @staticmethod
    def backward(ctx, *_):
        raise RuntimeError(
            f"{ctx.where}: flashspan's backward is not differentiable: the gradients it returned (under "
            "create_graph=True) cannot be differentiated again (double backward: gradient penalties, Hessian-vector "
            "products); compute those terms with a differentiable attention, e.g. torch's scaled_dot_product_attention")


def no_double_backward(where: str, inputs: tuple, grads: tuple) -> tuple:
    """``grads`` as a backward returns them; under ``create_graph=True`` (grad mode on inside the backward) routed
    through a node, hung on one of the saved ``inputs`` that requires grad, that names ``where`` when differentiated."""
    if not torch.is_grad_enabled() or torch.compiler.is_compiling():
        return grads
    anchor = next((t for t in inputs if isinstance(t, torch.Tensor) and t.requires_grad), None)
    if anchor is None:
        return grads
    return _NoDoubleBackward.apply(where, anchor, *grads)


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
            # Eager: the op's body, without the dispatcher round trip (same code path); max_logit is None
            # unless requested (the op returns an empty tensor instead: its schema has no optional output).
            out, lse, max_logit = run_forward(q, k, v, plan, softmax_scale, return_max_logit)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.plan = plan
        ctx.softmax_scale = softmax_scale
        ctx.deterministic = deterministic
        if max_logit is not None:
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
        dq, dk, dv = no_double_backward("flex_attn_func", (q, k, v), (dq, dk, dv))
        return dq, dk, dv, None, None, None, None
