"""torch.ops.flashspan.sdpa_fwd / sdpa_bwd: the seed's cudnn::sdpa_fwd / sdpa_bwd schema, fake kernels, autograd, sdpa_torch."""

from __future__ import annotations

import contextlib
import math
import numbers
import re
from typing import Optional

import torch
from torch import Tensor

from ._checks import _short_repr, check_flag, dense_grad
from .autograd import no_double_backward
from .sdpa import (_FAST, _FAST_CAPACITY, BOTTOM_RIGHT, TOP_LEFT, _backward_kw, _fast_key, _forward_kw,
                   _like_layout, _route, _scale_not_differentiated)

__all__ = ["sdpa_torch"]

# The schemas are exactly those of the seed's cudnn::sdpa_fwd / cudnn::sdpa_bwd (same argument names,
# types, defaults and outputs). _sdpa_bwd_full is flashspan's internal backward for what the seed's
# sdpa_bwd schema cannot carry (per-sample lengths and the sink gradient); autograd uses it there.
_SDPA_FWD = (
    "sdpa_fwd(Tensor q, Tensor k, Tensor v, float attn_scale, "
    "bool is_causal=False, bool causal_bottom_right=False, int window_left=-1, int window_right=-1, "
    "Tensor? sinks=None, "
    "Tensor? seq_len_q=None, Tensor? seq_len_kv=None, "
    "Tensor? cu_seqlens_q=None, Tensor? cu_seqlens_kv=None, "
    "int max_seqlen_q=0, int max_seqlen_kv=0, "
    "bool return_lse=True) -> (Tensor, Tensor)"
)
_SDPA_BWD = (
    "sdpa_bwd(Tensor grad_out, Tensor q, Tensor k, Tensor v, Tensor o, Tensor lse, float attn_scale, "
    "bool is_causal=False, bool causal_bottom_right=False, int window_left=-1, int window_right=-1, "
    "Tensor? sinks=None, "
    "Tensor? cu_seqlens_q=None, Tensor? cu_seqlens_kv=None, "
    "int max_seqlen_q=0, int max_seqlen_kv=0, "
    "bool is_deterministic=False) -> (Tensor, Tensor, Tensor)"
)
_SDPA_BWD_FULL = (
    "_sdpa_bwd_full(Tensor grad_out, Tensor q, Tensor k, Tensor v, Tensor o, Tensor lse, float attn_scale, "
    "bool is_causal, bool causal_bottom_right, int window_left, int window_right, Tensor? sinks, "
    "Tensor? seq_len_q, Tensor? seq_len_kv, Tensor? cu_seqlens_q, Tensor? cu_seqlens_kv, "
    "int max_seqlen_q, int max_seqlen_kv, bool is_deterministic) -> (Tensor, Tensor, Tensor, Tensor)"
)

_lib = torch.library.Library("flashspan", "FRAGMENT")
_lib.define(_SDPA_FWD)
_lib.define(_SDPA_BWD)
_lib.define(_SDPA_BWD_FULL)

_IO_DTYPES = (torch.float16, torch.bfloat16)
# CPU tensors run the CPU reference, which also takes float32 and float64 (as flashspan.sdpa does): the
# float64 path is what torch.autograd.gradcheck checks the registered backward against.
_CPU_DTYPES = _IO_DTYPES + (torch.float32, torch.float64)
_IO_DTYPE_SET, _CPU_DTYPE_SET = frozenset(_IO_DTYPES), frozenset(_CPU_DTYPES)


# The shared engine (flashspan.sdpa, the C layer) names graph.sdpa's arguments; the ops' callers wrote these.
_OP_NAMES = (("cu_seq_len_q", "cu_seqlens_q"), ("cu_seq_len_kv", "cu_seqlens_kv"), ("sink_token", "sinks"),
             ("dO", "grad_out"), ("stats", "lse"), ("diagonal_band_left_bound", "window_left"),
             ("diagonal_band_right_bound", "window_right"))
_OP_DIMS = {True: (("S_q", "max_seqlen_q"), ("S_kv", "max_seqlen_kv")),  # THD: the given maxima
            False: (("S_q", "q.shape[2]"), ("S_kv", "k.shape[2]"))}      # BHSD: the tensors' dims


class _op_names:
    """Re-raises a broken rule of the shared engine under the op's argument names, prefixed with the op.

    A class rather than a contextlib generator: it is entered on every call of the ops."""

    __slots__ = ("op", "thd")

    def __init__(self, op: str, thd: bool):
        self.op, self.thd = op, thd

    def __enter__(self):
        return self

    def __exit__(self, exc_type, e, tb):
        if exc_type is None or not issubclass(exc_type, (ValueError, TypeError, NotImplementedError)):
            return False
        op = self.op
        msg = str(e)
        for graph, own in _OP_NAMES + _OP_DIMS[self.thd]:
            msg = re.sub(rf"(?<![\w.]){re.escape(graph)}\b", own, msg)
        raise type(e)(msg if msg.startswith(f"{op}: ") else f"{op}: {msg}") from None


def _check_io(op: str, **tensors: Tensor) -> None:
    try:
        dtypes = {t.dtype for t in tensors.values()}
    except AttributeError:
        dtypes = None  # something not a tensor: named below
    if dtypes is not None and len(dtypes) == 1 and dtypes <= (
            _CPU_DTYPE_SET if next(iter(tensors.values())).device.type == "cpu" else _IO_DTYPE_SET):
        return  # one supported dtype (the rules below name what is wrong otherwise)
    for name, t in tensors.items():
        if not isinstance(t, Tensor):
            raise TypeError(f"{op}: {name}: must be a torch.Tensor, got {type(t).__name__}")
    first = next(iter(tensors.values()))
    ref = first.dtype
    allowed = _CPU_DTYPES if first.device.type == "cpu" else _IO_DTYPES
    # TypeError, as flex and graph.sdpa raise for a dtype (docs/ERRORS.md).
    if ref not in allowed:
        name = next(iter(tensors))
        raise TypeError(f"{op}: {name}: unsupported dtype {ref}; supported: torch.float16, torch.bfloat16"
                        + (" (CPU tensors: also torch.float32, torch.float64)" if first.device.type == "cpu" else ""))
    mixed = {n: str(t.dtype) for n, t in tensors.items() if t.dtype != ref}
    if mixed:
        raise TypeError(f"{op}: all io tensors must share one dtype ({ref}); got {mixed}")


def _band(op: str, is_causal: bool, causal_bottom_right: bool, window_left: int, window_right: int):
    """(diagonal_alignment, left_bound, right_bound) of the op's arguments (docs/SDPA.md, "torch ops").

    window_left counts the visible tokens including the diagonal (FlashAttention's (w, 0) is
    window_left = w + 1) and maps to diagonal_band_left_bound as is; window_right is the last visible
    column past the diagonal (diagonal_band_right_bound); is_causal is window_right = 0.
    """
    if is_causal and window_right > 0:
        raise ValueError(f"{op}: is_causal masks every future column but window_right={window_right} admits some; "
                         "pass one or the other")
    if causal_bottom_right and not (is_causal or window_left >= 0 or window_right >= 0):
        raise ValueError(f"{op}: causal_bottom_right only re-anchors an active diagonal band; set is_causal, "
                         "window_left or window_right too")
    if window_left == 0 or window_left < -1:
        raise ValueError(f"{op}: window_left counts the visible tokens including the diagonal: -1 (unbounded) or "
                         f">= 1, got {window_left}")
    if window_right < -1:
        raise ValueError(f"{op}: window_right must be -1 (unbounded) or >= 0, got {window_right}")
    right = window_right if window_right >= 0 else (0 if is_causal else None)
    left = window_left if window_left >= 0 else None
    return (BOTTOM_RIGHT if causal_bottom_right else TOP_LEFT), left, right


def _sink_logits(sinks: Optional[Tensor], q: Tensor) -> Optional[Tensor]:
    """The engine's sink_token of the ops' sinks: float32 logits (float64 for a float64 CPU call, so finite
    differences see them exactly), contiguous, 1-D."""
    if sinks is None:
        return None
    return sinks.to(torch.float64 if q.dtype == torch.float64 else torch.float32).contiguous().reshape(-1)


# ---------------------------------------------------------------------------
# Per-signature fast path of the ops (docs/ARCHITECTURE.md, "Host cost per call")
# ---------------------------------------------------------------------------
#
# The engine (sdpa.py, _fast_key / _remember) remembers a binding per signature of its own arguments, but an op call
# reached it only after _check_io, _band and _common_kwargs had built its 25-entry keyword dict and _fast_key had
# walked it: per call, and all of it a function of the op's own signature. So the ops remember too: the signature of
# an op call (its tensors' shapes, strides, dtypes and devices, the values of its other arguments; dense calls
# only: THD and tensor subclasses always take the full path) maps to the engine's entry that its full path used.
# A later call of that signature derives what the engine binds per call (the sink logits, an empty LSE, the
# backward's (B, H, S, 1) LSE view, a contiguous grad_out, dSink), checks FLASHSPAN_SDPA_ROUTE (read per call)
# and executes the entry; errors are renamed as on the full path. An op signature is remembered only after its
# full path ran and the engine remembered its binding (a failing call, or one the engine keeps on the full path,
# is not), in the engine's table (_FAST: emptying it forgets both), under keys that start with the op's name.

# The signature of a dense op call, or None (a tensor subclass) when the call takes the full path: the engine's
# _fast_key itself (one loop over the tensors for both), called as _op_key(op, tensors, scalars, None): the op's name,
# its tensors (None where not given; of any rank: the sinks and lengths are 1-D, a backward's LSE may be 3-D) and its
# other arguments' values (their types are the schema's), without the engine's keyword part (kw None).
# Another name for the same function, so that the ops' fast path is told from the full path's engine key.
_op_key = _fast_key


def _op_remember(key, engine_key) -> None:
    """Remembers the engine entry of ``engine_key`` (if the engine remembered one) for the op signature ``key``."""
    if key is None or engine_key is None:
        return
    entry = _FAST.get(engine_key)
    if entry is None:
        return
    if len(_FAST) >= _FAST_CAPACITY:
        _FAST.clear()
    _FAST[key] = entry


def _common_kwargs(op, q, k, v, attn_scale, is_causal, causal_bottom_right, window_left, window_right, sinks,
                   seq_len_q, seq_len_kv, cu_seqlens_q, cu_seqlens_kv, max_seqlen_q, max_seqlen_kv):
    _check_io(op, q=q, k=k, v=v)
    alignment, left, right = _band(op, is_causal, causal_bottom_right, window_left, window_right)
    thd = cu_seqlens_q is not None
    if thd:
        if cu_seqlens_kv is None or max_seqlen_q <= 0 or max_seqlen_kv <= 0:
            raise ValueError(f"{op}: the varlen path needs cu_seqlens_q, cu_seqlens_kv, max_seqlen_q > 0 and "
                             "max_seqlen_kv > 0")
        if q.dim() != 3:
            raise ValueError(f"{op}: the varlen path expects packed (T, H, D) tensors, got q.ndim={q.dim()}")
        if seq_len_q is not None or seq_len_kv is not None:
            raise ValueError(f"{op}: the varlen path derives lengths from cu_seqlens; do not pass seq_len_q/kv")
    else:
        if cu_seqlens_kv is not None:
            raise ValueError(f"{op}: cu_seqlens_kv without cu_seqlens_q; pass both for the varlen path")
        if q.dim() != 4:
            raise ValueError(f"{op}: the dense path expects BHSD (B, H, S, D) tensors, got q.ndim={q.dim()}")
        if (seq_len_q is None) != (seq_len_kv is None):
            raise ValueError(f"{op}: the padded path needs both seq_len_q and seq_len_kv")
    padded = thd or seq_len_q is not None
    sink = _sink_logits(sinks, q)
    return dict(
        attn_scale=float(attn_scale), use_padding_mask=padded, seq_len_q=seq_len_q, seq_len_kv=seq_len_kv,
        cu_seq_len_q=cu_seqlens_q, cu_seq_len_kv=cu_seqlens_kv, diagonal_alignment=alignment,
        diagonal_band_left_bound=left, diagonal_band_right_bound=right, sink_token=sink,
        max_seq_len_q=max_seqlen_q if thd else None, max_seq_len_kv=max_seqlen_kv if thd else None,
        bias=None, block_mask=None, use_alibi_mask=False, dropout=None, rng_dump=None, max_total_seq_len_q=None,
        max_total_seq_len_kv=None, softcap=None, gate=None, use_causal_mask=False, use_causal_mask_bottom_right=False,
        sliding_window_length=None, ragged_offsets=None,
    ), thd


# ---------------------------------------------------------------------------
# sdpa_fwd
# ---------------------------------------------------------------------------


def _sdpa_fwd_impl(q, k, v, attn_scale, is_causal=False, causal_bottom_right=False, window_left=-1, window_right=-1,
                   sinks=None, seq_len_q=None, seq_len_kv=None, cu_seqlens_q=None, cu_seqlens_kv=None, max_seqlen_q=0,
                   max_seqlen_kv=0, return_lse=True):
    key = entry = None
    if cu_seqlens_q is None and cu_seqlens_kv is None:
        key = _op_key("sdpa_fwd", (q, k, v, sinks, seq_len_q, seq_len_kv),
                      (attn_scale, is_causal, causal_bottom_right, window_left, window_right, max_seqlen_q,
                       max_seqlen_kv, return_lse), None)
        if key is not None:
            entry = _FAST.get(key)
    if entry is not None:
        kw = {"seq_len_q": seq_len_q, "seq_len_kv": seq_len_kv,
              "sink_token": None if sinks is None else _sink_logits(sinks, q)}
        with _op_names("sdpa_fwd", False):
            _route(q)  # FLASHSPAN_SDPA_ROUTE's check (per call), as the full path
            bound = entry.run((q, k, v, None, None), kw)
        o, stats = bound[3], bound[4]
    else:
        kw, thd = _common_kwargs("sdpa_fwd", q, k, v, attn_scale, is_causal, causal_bottom_right, window_left,
                                 window_right, sinks, seq_len_q, seq_len_kv, cu_seqlens_q, cu_seqlens_kv, max_seqlen_q,
                                 max_seqlen_kv)
        kw.update(generate_stats=None, paged_attention_k_table=None, paged_attention_v_table=None,
                  paged_attention_max_seq_len_kv=None, stats_use_log2=False, score_max=None, score_sum_exp=None,
                  max_logit=None)
        with _op_names("sdpa_fwd", thd):
            engine_key = _fast_key("fwd", (q, k, v, None, None), return_lse, kw) if key is not None else None
            o, stats = _forward_kw(q, k, v, return_lse, kw)
        _op_remember(key, engine_key)
    if stats is None:  # return_lse=False: the schema's LSE output, empty (both paths)
        stats = torch.empty(0, dtype=torch.float32, device=q.device)
    return o, stats


def _sdpa_fwd_fake(q, k, v, attn_scale, is_causal=False, causal_bottom_right=False, window_left=-1, window_right=-1,
                   sinks=None, seq_len_q=None, seq_len_kv=None, cu_seqlens_q=None, cu_seqlens_kv=None, max_seqlen_q=0,
                   max_seqlen_kv=0, return_lse=True):
    dv = v.shape[-1]
    if cu_seqlens_q is not None:  # THD: packed (T, H, D_v), stats (T, H, 1)
        o = q.new_empty((q.shape[0], q.shape[1], dv))
        stats_shape = (q.shape[0], q.shape[1], 1)
    else:
        o = _like_layout((q.shape[0], q.shape[1], q.shape[2], dv), q, q.dtype, q.device)
        stats_shape = (q.shape[0], q.shape[1], q.shape[2], 1)
    stats = q.new_empty(stats_shape if return_lse else (0,), dtype=torch.float32)
    return o, stats


# ---------------------------------------------------------------------------
# sdpa_bwd and the internal full backward
# ---------------------------------------------------------------------------


def _bwd(grad_out, q, k, v, o, lse, attn_scale, is_causal, causal_bottom_right, window_left, window_right, sinks,
         seq_len_q, seq_len_kv, cu_seqlens_q, cu_seqlens_kv, max_seqlen_q, max_seqlen_kv, is_deterministic, op,
         caller):
    """The backward ops' shared body (``op``: the name errors carry; ``caller``: the registered op, which keys
    its fast path)."""
    key = None
    if cu_seqlens_q is None and cu_seqlens_kv is None:
        key = _op_key(caller, (grad_out, q, k, v, o, lse, sinks, seq_len_q, seq_len_kv),
                      (attn_scale, is_causal, causal_bottom_right, window_left, window_right, max_seqlen_q,
                       max_seqlen_kv, is_deterministic), None)
        entry = _FAST.get(key) if key is not None else None
        if entry is not None:
            # What the full path below derives per call (its checks passed for this signature).
            if lse.dim() == 3:
                lse = lse.unsqueeze(-1)
            dsink = None if sinks is None else _dsink(sinks, q)
            grad_out = dense_grad(grad_out)
            kw = {"seq_len_q": seq_len_q, "seq_len_kv": seq_len_kv,
                  "sink_token": None if sinks is None else _sink_logits(sinks, q), "dSink_token": dsink}
            with _op_names(op, False):
                _route(q)  # FLASHSPAN_SDPA_ROUTE's check (per call), as the full path
                bound = entry.run((q, k, v, o, grad_out, lse, None, None, None), kw)
            return bound[6], bound[7], bound[8], dsink
    _check_io(op, grad_out=grad_out, q=q, k=k, v=v, o=o)
    if lse.dtype != torch.float32:
        raise TypeError(f"{op}: lse: dtype must be float32, got {lse.dtype}")
    kw, thd = _common_kwargs(op, q, k, v, attn_scale, is_causal, causal_bottom_right, window_left, window_right,
                             sinks, seq_len_q, seq_len_kv, cu_seqlens_q, cu_seqlens_kv, max_seqlen_q, max_seqlen_kv)
    if not thd and lse.dim() == 3:
        lse = lse.unsqueeze(-1)  # (B, H, S) -> (B, H, S, 1)
    dsink = _dsink(sinks, q)
    grad_out = dense_grad(grad_out)  # autograd's expanded (stride-0) grad_out, an empty one included
    kw.update(dBias=None, dSink_token=dsink, dgate=None, use_deterministic_algorithm=is_deterministic)
    given = (q, k, v, o, grad_out, lse, None, None, None)
    with _op_names(op, thd):
        engine_key = _fast_key("bwd", given, False, kw) if key is not None else None
        dq, dk, dv = _backward_kw(q, k, v, o, grad_out, lse, kw)
    _op_remember(key, engine_key)
    return dq, dk, dv, dsink


def _dsink(sinks: Optional[Tensor], q: Tensor) -> Optional[Tensor]:
    """The backward's sink gradient output (the engine's dSink_token), None without sinks."""
    if sinks is None:
        return None
    return torch.empty(q.shape[1], dtype=torch.float64 if q.dtype == torch.float64 else torch.float32, device=q.device)


def _sdpa_bwd_impl(grad_out, q, k, v, o, lse, attn_scale, is_causal=False, causal_bottom_right=False, window_left=-1,
                   window_right=-1, sinks=None, cu_seqlens_q=None, cu_seqlens_kv=None, max_seqlen_q=0,
                   max_seqlen_kv=0, is_deterministic=False):
    dq, dk, dv, _ = _bwd(grad_out, q, k, v, o, lse, attn_scale, is_causal, causal_bottom_right, window_left,
                         window_right, sinks, None, None, cu_seqlens_q, cu_seqlens_kv, max_seqlen_q, max_seqlen_kv,
                         is_deterministic, "sdpa_bwd", "sdpa_bwd")
    return dq, dk, dv


def _grads_fake(q, k, v, thd):
    if thd:  # packed gradients
        return q.new_empty(q.shape), q.new_empty(k.shape, dtype=q.dtype), q.new_empty(v.shape, dtype=q.dtype)
    return (_like_layout(tuple(q.shape), q, q.dtype, q.device), _like_layout(tuple(k.shape), k, q.dtype, q.device),
            _like_layout(tuple(v.shape), v, q.dtype, q.device))


def _sdpa_bwd_fake(grad_out, q, k, v, o, lse, attn_scale, is_causal=False, causal_bottom_right=False, window_left=-1,
                   window_right=-1, sinks=None, cu_seqlens_q=None, cu_seqlens_kv=None, max_seqlen_q=0,
                   max_seqlen_kv=0, is_deterministic=False):
    return _grads_fake(q, k, v, cu_seqlens_q is not None)


def _sdpa_bwd_full_impl(grad_out, q, k, v, o, lse, attn_scale, is_causal, causal_bottom_right, window_left,
                        window_right, sinks, seq_len_q, seq_len_kv, cu_seqlens_q, cu_seqlens_kv, max_seqlen_q,
                        max_seqlen_kv, is_deterministic):
    dq, dk, dv, dsink = _bwd(grad_out, q, k, v, o, lse, attn_scale, is_causal, causal_bottom_right, window_left,
                             window_right, sinks, seq_len_q, seq_len_kv, cu_seqlens_q, cu_seqlens_kv, max_seqlen_q,
                             max_seqlen_kv, is_deterministic, "sdpa_bwd", "_sdpa_bwd_full")
    if dsink is None:
        dsink = torch.empty(0, dtype=torch.float32, device=q.device)
    return dq, dk, dv, dsink


def _sdpa_bwd_full_fake(grad_out, q, k, v, o, lse, attn_scale, is_causal, causal_bottom_right, window_left,
                        window_right, sinks, seq_len_q, seq_len_kv, cu_seqlens_q, cu_seqlens_kv, max_seqlen_q,
                        max_seqlen_kv, is_deterministic):
    dq, dk, dv = _grads_fake(q, k, v, cu_seqlens_q is not None)
    dsink = q.new_empty((q.shape[1],) if sinks is not None else (0,),
                        dtype=torch.float64 if q.dtype == torch.float64 and sinks is not None else torch.float32)
    return dq, dk, dv, dsink


for _name, _impl, _fake in (
    ("sdpa_fwd", _sdpa_fwd_impl, _sdpa_fwd_fake),
    ("sdpa_bwd", _sdpa_bwd_impl, _sdpa_bwd_fake),
    ("_sdpa_bwd_full", _sdpa_bwd_full_impl, _sdpa_bwd_full_fake),
):
    # flashspan.sdpa's engine: CPU tensors run the C layer's SDPA CPU reference, CUDA tensors its SDPA GPU kernels
    # (the native route); what those do not run raises NotImplementedError naming it (docs/SDPA.md).
    _lib.impl(_name, _impl, "CPU")
    _lib.impl(_name, _impl, "CUDA")
    torch.library.register_fake(f"flashspan::{_name}", _fake, lib=_lib)


# ---------------------------------------------------------------------------
# Autograd (dense, padded and THD; sinks get their gradient)
# ---------------------------------------------------------------------------


def _setup_context(ctx, inputs, output):
    (q, k, v, attn_scale, is_causal, causal_bottom_right, window_left, window_right, sinks, seq_len_q, seq_len_kv,
     cu_seqlens_q, cu_seqlens_kv, max_seqlen_q, max_seqlen_kv, return_lse) = inputs
    o, lse = output
    ctx.save_for_backward(q, k, v, o, lse, sinks, seq_len_q, seq_len_kv, cu_seqlens_q, cu_seqlens_kv)
    ctx.attn_scale = attn_scale
    ctx.is_causal = is_causal
    ctx.causal_bottom_right = causal_bottom_right
    ctx.window_left = window_left
    ctx.window_right = window_right
    ctx.max_seqlen_q = max_seqlen_q
    ctx.max_seqlen_kv = max_seqlen_kv
    ctx.return_lse = return_lse
    # The backward consumes lse; it does not differentiate through it.
    ctx.mark_non_differentiable(lse)
    ctx.set_materialize_grads(False)


def _sdpa_backward(ctx, grad_o, _grad_lse):
    q, k, v, o, lse, sinks, seq_len_q, seq_len_kv, cu_q, cu_kv = ctx.saved_tensors
    nones = (None,) * 16
    if grad_o is None:
        return nones
    if not ctx.return_lse:
        # The forward did not keep its stats (the seed's op raises here): recompute them, one more forward.
        _, lse = torch.ops.flashspan.sdpa_fwd(
            q, k, v, ctx.attn_scale, is_causal=ctx.is_causal, causal_bottom_right=ctx.causal_bottom_right,
            window_left=ctx.window_left, window_right=ctx.window_right, sinks=sinks, seq_len_q=seq_len_q,
            seq_len_kv=seq_len_kv, cu_seqlens_q=cu_q, cu_seqlens_kv=cu_kv, max_seqlen_q=ctx.max_seqlen_q,
            max_seqlen_kv=ctx.max_seqlen_kv, return_lse=True)
    # Under create_graph=True grad mode is on here; the backward ops have no autograd kernel of their own (they are
    # not differentiable), so they run without it and no_double_backward names the op if their results are
    # differentiated again (torch's fallback would warn and go on).
    create_graph = torch.is_grad_enabled() and not torch.compiler.is_compiling()
    with torch.no_grad() if create_graph else contextlib.nullcontext():
        dq, dk, dv, dsinks = _run_backward(ctx, grad_o, q, k, v, o, lse, sinks, seq_len_q, seq_len_kv, cu_q, cu_kv)
    dq, dk, dv, dsinks = no_double_backward("sdpa_fwd", (q, k, v, sinks), (dq, dk, dv, dsinks))
    # One gradient slot per op input.
    return (dq, dk, dv, None, None, None, None, None, dsinks) + (None,) * 7


def _run_backward(ctx, grad_o, q, k, v, o, lse, sinks, seq_len_q, seq_len_kv, cu_q, cu_kv):
    deterministic = torch.are_deterministic_algorithms_enabled()
    dsinks = None
    if sinks is None and seq_len_q is None:
        dq, dk, dv = torch.ops.flashspan.sdpa_bwd(
            grad_o, q, k, v, o, lse, ctx.attn_scale, is_causal=ctx.is_causal,
            causal_bottom_right=ctx.causal_bottom_right, window_left=ctx.window_left, window_right=ctx.window_right,
            cu_seqlens_q=cu_q, cu_seqlens_kv=cu_kv, max_seqlen_q=ctx.max_seqlen_q, max_seqlen_kv=ctx.max_seqlen_kv,
            is_deterministic=deterministic)
    else:
        dq, dk, dv, dsink = torch.ops.flashspan._sdpa_bwd_full(
            grad_o, q, k, v, o, lse, ctx.attn_scale, ctx.is_causal, ctx.causal_bottom_right, ctx.window_left,
            ctx.window_right, sinks, seq_len_q, seq_len_kv, cu_q, cu_kv, ctx.max_seqlen_q, ctx.max_seqlen_kv,
            deterministic)
        if sinks is not None:
            dsinks = dsink.to(sinks.dtype).reshape(sinks.shape)
    return dq, dk, dv, dsinks


def _register_autograd() -> None:
    """sdpa_fwd's autograd: torch.library.register_autograd's kernel (torch._library.autograd.make_autograd_impl),
    registered behind a shortcut that saves a second pass through PyTorch's dispatcher (docs/ARCHITECTURE.md,
    "Host cost per call").

    torch's kernel, when no gradient can flow, re-enters the dispatcher below autograd (``op.redispatch``), which
    boxes the arguments again and calls the CPU or CUDA kernel: _sdpa_fwd_impl. The shortcut calls _sdpa_fwd_impl
    itself, only where that redispatch would call nothing else first: grad mode off or no argument requiring grad
    (torch's own test), and a dispatch key set of exactly one dense backend (CPU or CUDA) and its autograd key (no
    Python key: fake tensors, torch.compile's tracing, TorchDispatchModes and tensor subclasses; no functionalization,
    no conjugate / negative views, no mixed devices; anything else takes torch's kernel). Where torch does not have
    make_autograd_impl (it is private), torch.library.register_autograd as before."""
    qualname = "flashspan::sdpa_fwd"
    autograd_mod = getattr(torch._library, "autograd", None)
    make = getattr(autograd_mod, "make_autograd_impl", None)
    info = getattr(autograd_mod, "Info", None)
    keyset_cls = getattr(torch._C, "DispatchKeySet", None)
    if make is None or info is None or keyset_cls is None:
        torch.library.register_autograd(qualname, _sdpa_backward, setup_context=_setup_context, lib=_lib)
        return
    try:
        torch_kernel = make(torch.ops.flashspan.sdpa_fwd.default, info(_sdpa_backward, _setup_context))
        key = torch._C.DispatchKey
        direct = frozenset(keyset_cls(backend).add(autograd).raw_repr()
                           for backend, autograd in ((key.CPU, key.AutogradCPU), (key.CUDA, key.AutogradCUDA)))
    except Exception:  # another torch's private API: its public registration
        torch.library.register_autograd(qualname, _sdpa_backward, setup_context=_setup_context, lib=_lib)
        return
    is_grad_enabled, any_requires_grad = torch._C.is_grad_enabled, torch._C._any_requires_grad

    def autograd_kernel(keyset, *args, **keyword_only_args):
        if (keyset.raw_repr() in direct and not keyword_only_args
                and not (is_grad_enabled() and any_requires_grad(*args))):
            return _sdpa_fwd_impl(*args)
        return torch_kernel(keyset, *args, **keyword_only_args)

    _lib.impl("sdpa_fwd", autograd_kernel, "Autograd", with_keyset=True)


_register_autograd()


def sdpa_torch(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    *,
    scale: Optional[float] = None,
    is_causal: bool = False,
    causal_bottom_right: bool = False,
    window_left: int = -1,
    window_right: int = -1,
    sinks: Optional[Tensor] = None,
    seq_len_q: Optional[Tensor] = None,
    seq_len_kv: Optional[Tensor] = None,
    cu_seqlens_q: Optional[Tensor] = None,
    cu_seqlens_kv: Optional[Tensor] = None,
    max_seqlen_q: int = 0,
    max_seqlen_kv: int = 0,
    return_lse: bool = False,
):
    """SDPA through ``torch.ops.flashspan.sdpa_fwd`` (differentiable, torch.compile-able).

    Not a drop-in for ``torch.nn.functional.scaled_dot_product_attention``: the arguments are those of the
    seed's ``cudnn::sdpa_fwd`` op, so torch's ``attn_mask``, ``dropout_p`` and ``enable_gqa`` are not taken
    (a TypeError). An additive or boolean mask is :func:`flashspan.sdpa`'s ``bias`` (a boolean mask converted
    to 0 / -inf), dropout its ``dropout=(probability, seed, offset)``; GQA / MQA need no flag here (``H_q`` a
    multiple of ``H_k``).

    Dense tensors are BHSD ``(B, H, S, D)`` (any strides); varlen tensors are packed ``(T, H, D)`` with
    ``cu_seqlens_q/kv`` (``(B+1,)`` int32 prefix sums) and ``max_seqlen_q/kv``. ``scale`` defaults to
    ``1/sqrt(D_qk)``; it is not differentiated (a tensor that requires grad is a ValueError). ``window_left`` counts visible tokens including self (FlashAttention's ``(w, 0)`` is
    ``window_left=w+1``); ``window_right`` is the last visible column past the diagonal (0 = causal, and it
    may not be > 0 together with ``is_causal``). ``sinks``: ``(H_q,)`` per-head sink logits, differentiable.
    ``seq_len_q/kv``: ``(B,)`` per-sample lengths of a padded dense batch.

    Returns ``o`` (q's layout; THD packed ``(T, H_q, D_v)``), or ``(o, lse)`` with ``return_lse=True``
    (fp32 ``(B, H_q, S_q, 1)``; THD ``(T, H_q, 1)``). ``o`` is differentiable (query, key, value and sinks get
    gradients) with or without ``return_lse``: the stats are computed whenever an input requires grad. ``lse``
    itself carries no gradient (it is marked non-differentiable, as cuDNN's stats): a loss term on it is silently
    dropped (with a term on ``o`` too) or leaves nothing to differentiate (alone); for a differentiable LSE use
    :func:`flashspan.flex_attn_func` with ``return_lse=True``. CPU tensors may also be float32 / float64.

    Example::

        q = torch.randn(2, 4, 64, 32, dtype=torch.bfloat16, requires_grad=True)
        o, lse = flashspan.sdpa_torch(q, q, q, is_causal=True, window_left=16, return_lse=True)
        o.float().sum().backward()
    """
    if is_causal.__class__ is not bool or causal_bottom_right.__class__ is not bool or return_lse.__class__ is not bool:
        # The op's schema would convert them (torch takes 1.5 or None for a bool): checked here, as flashspan.sdpa.
        is_causal = check_flag("is_causal", is_causal, "sdpa_torch")
        causal_bottom_right = check_flag("causal_bottom_right", causal_bottom_right, "sdpa_torch")
        return_lse = check_flag("return_lse", return_lse, "sdpa_torch")
    if scale is not None and scale.__class__ is not float and (
            isinstance(scale, bool) or not isinstance(scale, (numbers.Real, Tensor))):
        # The op's schema would refuse a string with torch's RuntimeError (and take True as 1.0): a scale that is not
        # a finite number is a ValueError naming it, as flashspan.sdpa's attn_scale and flex's softmax_scale.
        raise ValueError(f"sdpa_torch: scale: must be a finite float or None, got {type(scale).__name__} "
                         f"{_short_repr(scale)}")
    if scale.__class__ is not float and isinstance(scale, Tensor) and scale.requires_grad and torch.is_grad_enabled():
        _scale_not_differentiated("scale", "sdpa_torch: ")
    if scale is None:
        if not isinstance(query, Tensor):  # (the op names the others; query's D is read here)
            raise TypeError(f"sdpa_torch: query: must be a torch.Tensor, got {type(query).__name__}")
        attn_scale = 1.0 / math.sqrt(query.shape[-1])
    else:
        attn_scale = scale
    # Autograd needs the forward's stats: ask for them whenever a gradient can flow (the seed's wrapper
    # leaves that to the caller and its backward then fails), and return them only when requested.
    needs_grad = torch.is_grad_enabled() and any(
        isinstance(t, Tensor) and t.requires_grad for t in (query, key, value, sinks))
    o, lse = torch.ops.flashspan.sdpa_fwd(
        query, key, value, attn_scale, is_causal=is_causal, causal_bottom_right=causal_bottom_right,
        window_left=window_left, window_right=window_right, sinks=sinks, seq_len_q=seq_len_q, seq_len_kv=seq_len_kv,
        cu_seqlens_q=cu_seqlens_q, cu_seqlens_kv=cu_seqlens_kv, max_seqlen_q=max_seqlen_q,
        max_seqlen_kv=max_seqlen_kv, return_lse=return_lse or needs_grad)
    return (o, lse) if return_lse else o
