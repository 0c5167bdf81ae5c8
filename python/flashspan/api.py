"""flex_attn_func: the functional entry point (validate cheaply, then run the autograd Function)."""

from __future__ import annotations

from typing import Optional, Union

import torch

from .autograd import FlexAttnFunc
from .plan import MaskPlan


def flex_attn_func(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask_plan: MaskPlan,
    softmax_scale: Optional[float] = None,
    deterministic: bool = False,
    return_lse: bool = False,
    return_max_logit: bool = False,
) -> Union[torch.Tensor, tuple[torch.Tensor, ...]]:
    """Interval-masked attention ``softmax(scale * Q K^T + mask) V`` with a prebuilt plan.

    Args:
        q, k, v: BSHD ``[B,Sq,Hq,Dqk]``, ``[B,Sk,Hkv,Dqk]``, ``[B,Sk,Hkv,Dv]`` or THD
            ``[Tq,Hq,Dqk]``, ``[Tk,Hkv,Dqk]``, ``[Tk,Hkv,Dv]``; the geometry, dtype and
            device the plan was built for; last dimension contiguous.
        mask_plan: from :func:`create_mask_plan`; built with backward metadata when
            gradients are needed.
        softmax_scale: default ``1/sqrt(Dqk)``.
        deterministic: bitwise reproducible backward.
        return_lse: also return fp32 LSE (``[B,Hq,Sq]`` or ``[Hq,Tq]``, natural log,
            -inf for rows that see no key); differentiable.
        return_max_logit: also return fp32 ``[Hq]``, the signed maximum of
            ``scale * q.k`` over visible pairs (-inf for none); needs scale >= 0; not
            differentiable.

    Returns:
        ``out`` (``[..., Hq, Dv]``, dtype of q), or a tuple in the order
        ``(out, lse)``, ``(out, max_logit)``, ``(out, lse, max_logit)``.

    Raises ValueError / TypeError naming the broken rule (shape, dtype, device,
    plan without backward for a call that needs gradients), RuntimeError for an
    unsupported configuration or a CUDA failure.

    Example::

        S = 256
        q = torch.randn(1, S, 4, 64, requires_grad=True); k = torch.randn_like(q); v = torch.randn_like(q)
        plan = create_mask_plan(torch.arange(1, S + 1, dtype=torch.int32).view(1, 1, S), q, k, v)
        out, lse = flex_attn_func(q, k, v, mask_plan=plan, return_lse=True)
        out.sum().backward()
    """
    if not isinstance(mask_plan, MaskPlan):
        raise TypeError(f"flex_attn_func: mask_plan must be a flashspan.MaskPlan, got {type(mask_plan).__name__}")
    needs_grad = torch.is_grad_enabled() and any(
        isinstance(t, torch.Tensor) and t.requires_grad for t in (q, k, v)
    )
    mask_plan.check_compatible(q, k, v, need_backward=needs_grad, where="flex_attn_func")
    out, lse, max_logit = FlexAttnFunc.apply(
        q, k, v, mask_plan, softmax_scale, bool(deterministic), bool(return_max_logit)
    )
    if return_lse and return_max_logit:
        return out, lse, max_logit
    if return_lse:
        return out, lse
    if return_max_logit:
        return out, max_logit
    return out
