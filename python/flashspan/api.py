"""flex_attn_func: the functional entry point (validate cheaply, then run the autograd Function)."""

from __future__ import annotations

import inspect
import warnings
from typing import Optional, Union

import torch
import torch.autograd.forward_ad as _forward_ad

from ._checks import check_flag, check_softmax_scale
from .autograd import FlexAttnFunc
from .execution import run_forward
from .plan import MaskPlan


_MISSING = object()  # mask_plan not given (None is given, and rejected as not a MaskPlan)
_LEGACY_POSITIONAL = ("mask_plan", "softmax_scale", "deterministic", "return_lse", "return_max_logit")


def flex_attn_func(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *legacy_positional,
    mask_plan: Optional[MaskPlan] = _MISSING,
    softmax_scale: Optional[float] = None,
    deterministic: bool = False,
    return_lse: bool = False,
    return_max_logit: bool = False,
) -> Union[torch.Tensor, tuple[torch.Tensor, ...]]:
    """Interval-masked attention ``softmax(scale * Q K^T + mask) V`` with a prebuilt plan.

    Signature (the seed's): ``flex_attn_func(q, k, v, *, mask_plan, softmax_scale=None,
    deterministic=False, return_lse=False, return_max_logit=False)``. Passing the plan (and
    the options) positionally, as earlier flashspan versions allowed, still works with a
    DeprecationWarning.

    Args:
        q, k, v: BSHD ``[B,Sq,Hq,Dqk]``, ``[B,Sk,Hkv,Dqk]``, ``[B,Sk,Hkv,Dv]`` or THD
            ``[Tq,Hq,Dqk]``, ``[Tk,Hkv,Dqk]``, ``[Tk,Hkv,Dv]``; the geometry, dtype and
            device the plan was built for; last dimension contiguous. float16 / bfloat16 (GPU and
            CPU), float32 (CPU), float64 (CPU: computed in double throughout, LSE and max_logit float64,
            for ``torch.autograd.gradcheck``; the softmax scale is still a float32).
        mask_plan: from :func:`create_mask_plan` (keyword-only, required); built with
            backward metadata when gradients are needed.
        softmax_scale: finite number, default ``1/sqrt(Dqk)``.
        deterministic: bool; bitwise reproducible backward.
        return_lse: bool; also return fp32 (fp64 for fp64 q) LSE (``[B,Hq,Sq]`` or ``[Hq,Tq]``, natural log,
            -inf for rows that see no key); differentiable.
        return_max_logit: bool; also return fp32 (fp64 for fp64 q) ``[Hq]``, the signed maximum of
            ``scale * q.k`` over visible pairs (-inf for none); needs scale >= 0; not
            differentiable.

    Returns:
        ``out`` (``[..., Hq, Dv]``, dtype of q), or a tuple in the order
        ``(out, lse)``, ``(out, max_logit)``, ``(out, lse, max_logit)``.

    Raises ValueError (shape, device, scale, plan without backward for a call that needs
    gradients), TypeError (not a tensor or MaskPlan, dtype, a flag that is not a bool), each
    naming the argument and the rule; RuntimeError for an unsupported configuration or a
    CUDA failure. Gradients are first order: differentiating the gradients again (double
    backward after ``create_graph=True``) raises RuntimeError naming ``flex_attn_func``; forward-mode AD
    (``jvp``, ``check_forward_ad``) and ``torch.func`` transforms (``grad``, ``vmap``, ``jacrev``) are not
    supported (they fail with PyTorch's own errors).

    gradcheck (float64 CPU tensors)::

        q, k, v = (torch.randn(1, 16, 2, 8, dtype=torch.float64, requires_grad=True) for _ in range(3))
        plan = flashspan.create_mask_plan(flashspan.masks.causal(16), q, k, v)
        def f(q, k, v):
            out, lse = flashspan.flex_attn_func(q, k, v, mask_plan=plan, return_lse=True)
            return out, torch.nan_to_num(lse, neginf=0.0)  # a row that sees no key has LSE -inf
        torch.autograd.gradcheck(f, (q, k, v))

    (The scale is rounded to float32, also for float64 inputs: against a float64 reference, use a scale
    exact in float32, e.g. 0.25, or the float32-rounded default.)

    Example::

        S = 256
        q = torch.randn(1, S, 4, 64, requires_grad=True)
        k = torch.randn_like(q).requires_grad_()
        v = torch.randn_like(q).requires_grad_()
        plan = create_mask_plan(torch.arange(1, S + 1, dtype=torch.int32).view(1, 1, S), q, k, v)
        out, lse = flex_attn_func(q, k, v, mask_plan=plan, return_lse=True)
        out.sum().backward()
    """
    if legacy_positional:
        if len(legacy_positional) > len(_LEGACY_POSITIONAL):
            raise TypeError(
                f"flex_attn_func() takes 3 positional arguments (q, k, v) but {3 + len(legacy_positional)} were given"
            )
        given = dict(zip(_LEGACY_POSITIONAL, legacy_positional))
        defaults = {"mask_plan": mask_plan, "softmax_scale": softmax_scale, "deterministic": deterministic,
                    "return_lse": return_lse, "return_max_logit": return_max_logit}
        for name in given:
            if defaults[name] is not _DEFAULTS[name]:
                raise TypeError(f"flex_attn_func() got multiple values for argument {name!r}")
        warnings.warn(
            "flex_attn_func: passing " + ", ".join(given) + " positionally is deprecated; pass them by keyword "
            "(flex_attn_func(q, k, v, mask_plan=plan, ...)), as the seed API requires",
            DeprecationWarning,
            stacklevel=2,
        )
        mask_plan = given.get("mask_plan", mask_plan)
        softmax_scale = given.get("softmax_scale", softmax_scale)
        deterministic = given.get("deterministic", deterministic)
        return_lse = given.get("return_lse", return_lse)
        return_max_logit = given.get("return_max_logit", return_max_logit)
    if mask_plan is _MISSING:
        raise TypeError("flex_attn_func() missing 1 required keyword-only argument: 'mask_plan'")
    if not isinstance(mask_plan, MaskPlan):
        raise TypeError(f"flex_attn_func: mask_plan must be a flashspan.MaskPlan, got {type(mask_plan).__name__}")
    if type(deterministic) is not bool or type(return_lse) is not bool or type(return_max_logit) is not bool:
        deterministic = check_flag("deterministic", deterministic, "flex_attn_func")
        return_lse = check_flag("return_lse", return_lse, "flex_attn_func")
        return_max_logit = check_flag("return_max_logit", return_max_logit, "flex_attn_func")
    softmax_scale = check_softmax_scale(softmax_scale, "flex_attn_func", return_max_logit)
    Tensor = torch.Tensor
    needs_grad = torch.is_grad_enabled() and (
        (isinstance(q, Tensor) and q.requires_grad) or (isinstance(k, Tensor) and k.requires_grad)
        or (isinstance(v, Tensor) and v.requires_grad)
    )
    mask_plan.check_compatible(q, k, v, need_backward=needs_grad, where="flex_attn_func")
    if needs_grad or _traced():
        out, lse, max_logit = FlexAttnFunc.apply(q, k, v, mask_plan, softmax_scale, deterministic, return_max_logit)
    else:
        # Nothing to differentiate: the forward without the autograd.Function (whose apply costs more than the
        # rest of the call), and without the LSE unless it is returned.
        out, lse, max_logit = run_forward(q, k, v, mask_plan, softmax_scale, return_max_logit, want_lse=return_lse)
    if return_lse and return_max_logit:
        return out, lse, max_logit
    if return_lse:
        return out, lse
    if return_max_logit:
        return out, max_logit
    return out


def _traced() -> bool:
    """A call that must go through FlexAttnFunc whatever the gradients: torch.compile traces it (the custom op),
    functorch transforms (vmap, grad, ...) or forward-mode AD (dual tensors) see it (autograd.Function's rules)."""
    return (torch.compiler.is_compiling() or torch._C._are_functorch_transforms_active()
            or _forward_ad._current_level >= 0)


_DEFAULTS = {"mask_plan": _MISSING, "softmax_scale": None, "deterministic": False, "return_lse": False,
             "return_max_logit": False}


def _seed_signature(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    mask_plan: MaskPlan,
    softmax_scale: Optional[float] = None,
    deterministic: bool = False,
    return_lse: bool = False,
    return_max_logit: bool = False,
):  # pragma: no cover - signature only
    pass


# Introspection shows the seed's signature; the deprecated positional form is accepted on top.
flex_attn_func.__signature__ = inspect.signature(_seed_signature)
