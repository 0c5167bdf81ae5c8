"""Argument rules shared by the front ends (flex, SDPA, FP8 SDPA, the mask builders; the seed's exception types)."""

from __future__ import annotations

import math
import numbers
from typing import Optional

import torch


def check_flag(name: str, value, where: Optional[str] = None, none_ok: bool = False):
    """``value`` as a Python bool (or None, with ``none_ok``: a flag whose default is None); TypeError naming the
    argument otherwise. The one place of the flag rule of every front end (flex, SDPA, FP8 SDPA, the mask builders):
    a bool or a NumPy bool (``numpy.bool_``, what a NumPy comparison gives), nothing converted with ``bool()``: a
    string ``"false"`` is truthy, an int or a float is a number (as the number arguments refuse a bool, _int_arg /
    _float_arg), a tensor would be read on the host. Messages are ``[where: ]name: must be a bool ...``.

    Callers on a hot path test ``type(value) is bool`` (or identity with True / False) first and call this only
    otherwise; they use its result (a NumPy bool becomes a Python bool)."""
    tp = type(value)
    if tp is bool:
        return value
    if value is None and none_ok:
        return None
    if tp.__module__ == "numpy" and tp.__name__ in ("bool_", "bool"):  # NumPy 1 / NumPy 2, without importing numpy
        return bool(value)
    prefix = f"{where}: " if where else ""
    rule = "a bool (True or False)" + (" or None" if none_ok else "")
    raise TypeError(f"{prefix}{name}: must be {rule}, got {tp.__name__} {_short_repr(value)}")


def _short_repr(value, limit: int = 80) -> str:
    """``repr(value)`` cut to ``limit`` characters (a tensor given as a flag is not printed in full)."""
    try:
        text = repr(value)
    except Exception:  # pragma: no cover - a broken __repr__
        return "<unprintable>"
    return text if len(text) <= limit else text[: limit - 3] + "..."


# The smallest magnitude that float32 rounding takes to infinity (FLT_MAX plus half its last unit: a tie rounds to
# the even significand, which is 2**128); a finite float below it in magnitude rounds to a finite float32.
_FLOAT32_OVERFLOW = 2.0**128 - 2.0**103


def check_float32(x, name: str, where: Optional[str] = None) -> float:
    """``float(x)`` for a real number ``x`` (its type already checked) that the C ABI takes as a float32 (flex's
    softmax_scale, SDPA's attn_scale, softcap, the dropout probability, scale factors given as numbers). ctypes and
    torch round a finite value past float32's range to inf, which the C layer then refused as "must be finite, got
    inf" for a value the caller gave as finite: ValueError ``[where: ]name: <x> does not fit float32 (must be
    finite as float32)`` instead. inf and NaN themselves pass (the caller's or the C layer's rule names them)."""
    try:
        value = float(x)
    except OverflowError:  # an int past float64's range
        value = None
    if value is not None and (-_FLOAT32_OVERFLOW < value < _FLOAT32_OVERFLOW or not math.isfinite(value)):
        return value
    prefix = f"{where}: " if where else ""
    shown = _short_repr(x) if value is None else repr(value)
    raise ValueError(f"{prefix}{name}: {shown} does not fit float32 (must be finite as float32)")


def check_softmax_scale(softmax_scale, where: str, return_max_logit: bool = False) -> Optional[float]:
    """None, or ``softmax_scale`` as a float; ValueError unless it is a finite real number (not a tensor) that fits
    float32 (the C ABI's type, check_float32), and unless it is >= 0 when the max logit is requested (the seed's
    rules)."""
    if softmax_scale is None:
        return None
    if type(softmax_scale) is float:  # the common case, without the numbers.Real (ABC) check
        if -_FLOAT32_OVERFLOW < softmax_scale < _FLOAT32_OVERFLOW and (softmax_scale >= 0 or not return_max_logit):
            return softmax_scale
    elif isinstance(softmax_scale, (torch.Tensor, bool)) or not isinstance(softmax_scale, numbers.Real):
        # A bool is an int to Python (True would run as a scale of 1): refused, as SDPA's attn_scale=True is; the
        # class of a scale that is not a finite number (the seed's for softmax_scale), docs/ERRORS.md.
        raise ValueError(
            f"{where}: softmax_scale: must be a finite number or None, got {type(softmax_scale).__name__}"
            + (f" {softmax_scale!r}" if isinstance(softmax_scale, bool) else "")
        )
    value = check_float32(softmax_scale, "softmax_scale", where)
    if not math.isfinite(value):
        raise ValueError(f"{where}: softmax_scale: must be a finite number or None, got {value}")
    if return_max_logit and value < 0:
        raise ValueError(f"{where}: softmax_scale: must be non-negative when max_logit is requested, got {value}")
    return value


def dense_grad(g: torch.Tensor) -> torch.Tensor:
    """An upstream gradient (dO) as the backward kernels read it: a last dimension of stride 1 and no zero stride.

    Autograd hands expanded (stride-0) gradients, e.g. dO of ``o.sum()``. ``.contiguous()`` does not fix an empty
    one: an empty tensor counts as contiguous whatever its strides, so the empty dO of an empty output kept its zero
    strides, which the C layer refused (the last dimension's stride must be 1; a packed (T, H, D) tensor's token
    stride is its ragged-offset multiplier, which must be >= 1). Returns ``g`` when it has none of these, else a
    fresh compact tensor of its shape: a copy, or for an empty ``g`` a new empty tensor (there is nothing to copy)."""
    st = g.stride()
    if st and st[-1] == 1 and 0 not in st:
        return g
    if g.numel() == 0:
        return g.new_empty(g.shape)
    return g.clone(memory_format=torch.contiguous_format)
