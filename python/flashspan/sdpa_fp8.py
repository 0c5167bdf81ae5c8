"""flashspan.sdpa_fp8 / sdpa_fp8_backward: FP8 attention with the seed's graph.sdpa_fp8 / sdpa_fp8_backward arguments (eager)."""

from __future__ import annotations

import numbers
from typing import Optional, Union

import torch
from torch import Tensor

from . import _sdpa_lib as L
from ._checks import check_flag, check_float32, dense_grad
from .sdpa import TOP_LEFT, _apply_common, _Call, _check_unsupported, _Layout, _like_layout, _warn_deprecated

__all__ = ["sdpa_fp8", "sdpa_fp8_backward", "FP8_DTYPES"]

FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)
_AMAX_SHAPE = (1, 1, 1, 1)


def _check_fp8(t, name: str) -> None:
    if not isinstance(t, Tensor):
        raise TypeError(f"{name}: must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in FP8_DTYPES:
        raise TypeError(f"{name}: dtype must be torch.float8_e4m3fn or torch.float8_e5m2 (FP8 attention), got {t.dtype}")


def _check_fp8_dtype(dtype, name: str):
    if dtype not in FP8_DTYPES:
        raise TypeError(f"{name}: must be torch.float8_e4m3fn or torch.float8_e5m2, got {dtype!r}")
    return dtype


def _scale(x, name: str, device: torch.device) -> Tensor:
    """A scale factor: a 1-element float32 tensor as given (0-d tensors as (1,)), or a number made one on q's device."""
    if isinstance(x, Tensor):
        return x.reshape(-1) if x.dim() == 0 else x
    if isinstance(x, numbers.Real) and not isinstance(x, bool):
        return torch.full(_AMAX_SHAPE, check_float32(x, name), dtype=torch.float32, device=device)
    raise TypeError(f"{name}: must be a 1-element float32 tensor or a number, got {type(x).__name__}")


def _generate_stats(generate_stats, is_inference) -> bool:
    generate_stats = check_flag("generate_stats", generate_stats, none_ok=True)
    is_inference = check_flag("is_inference", is_inference, none_ok=True)
    if is_inference is None:
        return True if generate_stats is None else generate_stats  # default: the stats
    _warn_deprecated(False, False, None, is_inference, stacklevel=4)  # the seed's FP8 "Deprecated Args"
    if generate_stats is not None and generate_stats == is_inference:
        raise ValueError(f"is_inference, generate_stats: is_inference (deprecated) is the negation of generate_stats, got "
                         f"is_inference={is_inference!r} and generate_stats={generate_stats!r}; pass only generate_stats")
    return not is_inference


def _common(call: _Call, lay: _Layout, q: Tensor, backward: bool, attn_scale, use_causal_mask: bool,
            use_padding_mask: bool = False, seq_len_q=None, seq_len_kv=None, cu_seq_len_q=None, cu_seq_len_kv=None,
            max_total_seq_len_q=None, max_total_seq_len_kv=None) -> None:
    """The options both directions share, through flashspan.sdpa's binding (the others stay unset). An attn_scale
    tensor goes to the C layer as it is, without flashspan.sdpa's _scale_on_host: a host one is read there (the CPU
    reference's and the kernels' scalar), a device one the FP8 kernels read as one of their factors (no host read, no
    device sync; the C layer refuses it with FLASHSPAN_SDPA_FP8_DEVICE_ATTN_SCALE=0)."""
    _apply_common(call, lay, q, attn_scale=attn_scale, bias=None, block_mask=None, use_alibi_mask=False,
                  use_padding_mask=use_padding_mask, seq_len_q=seq_len_q, seq_len_kv=seq_len_kv,
                  cu_seq_len_q=cu_seq_len_q, cu_seq_len_kv=cu_seq_len_kv, diagonal_alignment=TOP_LEFT,
                  diagonal_band_left_bound=None, diagonal_band_right_bound=None, dropout=None, rng_dump=None,
                  max_total_seq_len_q=max_total_seq_len_q, max_total_seq_len_kv=max_total_seq_len_kv, sink_token=None,
                  softcap=None, gate=None, use_causal_mask=use_causal_mask, use_causal_mask_bottom_right=False,
                  sliding_window_length=None, backward=backward)


def _bind_scales(call: _Call, device: torch.device, scales: dict) -> None:
    for slot, (name, value) in scales.items():
        call.set(slot, _scale(value, name, device))


def _amax_outputs(call: _Call, device: torch.device, slots) -> list:
    out = []
    for slot in slots:
        t = torch.empty(_AMAX_SHAPE, dtype=torch.float32, device=device)
        call.set(slot, t)
        out.append(t)
    return out


def sdpa_fp8(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    descale_q: Union[Tensor, float],
    descale_k: Union[Tensor, float],
    descale_v: Union[Tensor, float],
    descale_s: Union[Tensor, float],
    scale_s: Union[Tensor, float],
    scale_o: Union[Tensor, float],
    attn_scale: Optional[Union[float, Tensor]] = None,
    use_causal_mask: bool = False,
    use_padding_mask: bool = False,
    seq_len_q: Optional[Tensor] = None,
    seq_len_kv: Optional[Tensor] = None,
    cu_seq_len_q: Optional[Tensor] = None,
    cu_seq_len_kv: Optional[Tensor] = None,
    compute_data_type=None,
    name: Optional[str] = None,
    generate_stats: Optional[bool] = None,
    *,
    is_inference: Optional[bool] = None,
    o_dtype: Optional[torch.dtype] = None,
    stats_use_log2: bool = False,
    score_max: Optional[Tensor] = None,
    score_sum_exp: Optional[Tensor] = None,
    ragged_offsets: Optional[dict] = None,
    max_seq_len_q: Optional[int] = None,
    max_seq_len_kv: Optional[int] = None,
    max_total_seq_len_q: Optional[int] = None,
    max_total_seq_len_kv: Optional[int] = None,
) -> tuple[Tensor, Optional[Tensor], Tensor, Tensor]:
    """FP8 scaled dot-product attention with the seed's ``graph.sdpa_fp8`` arguments, run eagerly (no autograd:
    the backward is :func:`sdpa_fp8_backward`, called explicitly as in the seed).

    The algorithm is cuDNN's FP8 SDPA forward (the cuDNN frontend's ``sdpa_fp8`` graph; FlashAttention-2 on FP8
    tensors with per-tensor scaling, Transformer Engine's FP8 recipe). With the raw FP8 values of q, k, v and
    ``fp8_f(x)`` = x rounded to the FP8 format of tensor f (round to nearest even, saturating to the largest finite
    value)::

        x     = attn_scale * descale_q * descale_k * q k^T           (+ causal / padding masks)
        S     = softmax(x) (fp32);  stats = logsumexp(x)              (natural log; base 2 with stats_use_log2)
        amax_s = max |S|;  S8 = fp8_q(S * scale_s)
        O     = (S8 v) * descale_s * descale_v;  amax_o = max |O|;  o = fp8_o(O * scale_o)

    amax values are of the tensors before their output scale (Transformer Engine's convention); docs/SDPA.md
    "FP8 SDPA" has every rule and the choices where the seed is silent.

    Args:
        q, k, v: ``(B, H_q, S_q, D_qk)``, ``(B, H_k, S_kv, D_qk)``, ``(B, H_v, S_kv, D_v)`` logical BHSD with any
            strides (last dim contiguous), or packed THD ``(T, H, D)`` with ``cu_seq_len_q`` / ``cu_seq_len_kv`` and
            ``use_padding_mask=True``. One FP8 dtype for the three: ``torch.float8_e4m3fn`` or ``torch.float8_e5m2``.
            H_k and H_v divide H_q; head dims multiples of 16 up to 256.
        descale_q, descale_k, descale_v: factors turning the stored values into real ones (real = stored *
            descale); float32 tensors of one element (the seed's ``(1, 1, 1, 1)``) on q's device or the host, or
            Python numbers (made such tensors).
        descale_s, scale_s: descale / scale factor of the quantized softmax probabilities S (typically scale_s =
            448 for E4M3, descale_s = 1 / scale_s).
        scale_o: scale factor of the stored output (stored = real * scale_o).
        attn_scale: float or 1-element float32 tensor (on the host or q's device: the FP8 kernels read a device
            tensor themselves, no sync; ``FLASHSPAN_SDPA_FP8_DEVICE_ATTN_SCALE=0`` refuses one); None means 1 (the
            seed's default).
        use_causal_mask: top-left causal mask (key j visible to query i iff j <= i).
        use_padding_mask, seq_len_q, seq_len_kv, cu_seq_len_q, cu_seq_len_kv: per-sample lengths, ``(B,)`` /
            ``(B, 1, 1, 1)``, or prefix sums ``(B + 1,)``, int32 / int64; one form per side.
        compute_data_type, name: accepted for parity (float32 compute).
        generate_stats: return the float32 LSE stats ``(B, H_q, S_q, 1)`` (THD: packed ``(T, H_q, 1)``, while
            score_max / score_sum_exp stay padded ``(B, H_q, S_max, 1)``); None (the default)
            is True unless ``is_inference`` is given.
        is_inference: deprecated negation of generate_stats (a DeprecationWarning; giving both with equal values is a
            ValueError).
        o_dtype: FP8 dtype of o (default q's).
        stats_use_log2, score_max, score_sum_exp, ragged_offsets, max_seq_len_q, max_seq_len_kv,
            max_total_seq_len_q, max_total_seq_len_kv: as in :func:`flashspan.sdpa`.

    Returns:
        ``(o, stats, amax_s, amax_o)``: o ``(B, H_q, S_q, D_v)`` of ``o_dtype`` in q's layout (THD: packed), stats
        float32 or None (generate_stats=False), amax_s and amax_o float32 ``(1, 1, 1, 1)`` on q's device.

    Raises:
        TypeError naming the argument for a non-FP8 q / k / v, mixed FP8 formats or a scale that is not float32;
        ValueError naming the argument for a broken rule (head dims, shapes, a scale that is not finite) and for an
        option FP8 attention does not take (``"... not supported with FP8 inputs"``); NotImplementedError for CUDA
        tensors, unless the call is one an FP8 forward runs: CUDA FP8 forwards run on an H100 / H200 (the
        sm90 kernel; padded tensors, head dims multiples of 16 up to 128: docs/SDPA.md "The sm90 FP8
        forward"; ``FLASHSPAN_SM90_SDPA_FP8=0`` turns it off), or else on the sm80 kernels on every GPU from sm_80
        (also head dims (192, 128) and (256, 256), and strides the sm90 one does not take; on by default since its
        GPU tests passed on an H200, ``FLASHSPAN_SDPA_FP8_SM80=0`` turns it off: docs/SDPA.md "The FP8 forward on
        the sm80 kernels"); H_k != H_v on either unless ``FLASHSPAN_SDPA_FP8_HK_NE_HV=0`` (on by default since its
        GPU tests passed on an H100). CPU tensors run every call on the CPU reference.

    Example::

        q, k, v = (torch.randn(1, 2, 64, 64).to(torch.float8_e4m3fn) for _ in range(3))
        o, stats, amax_s, amax_o = flashspan.sdpa_fp8(q, k, v, 1.0, 1.0, 1.0, 1 / 448, 448.0, 1.0,
                                                      attn_scale=0.125, use_causal_mask=True)
    """
    del name
    _check_unsupported(None, compute_data_type)
    use_causal_mask = check_flag("use_causal_mask", use_causal_mask)
    use_padding_mask = check_flag("use_padding_mask", use_padding_mask)
    stats_use_log2 = check_flag("stats_use_log2", stats_use_log2)
    stats_needed = _generate_stats(generate_stats, is_inference)
    for n, t in (("q", q), ("k", k), ("v", v)):
        _check_fp8(t, n)
    o_dtype = _check_fp8_dtype(q.dtype if o_dtype is None else o_dtype, "o_dtype")
    dev = q.device
    lay = _Layout(q, k, v, seq_len_q, seq_len_kv, cu_seq_len_q, cu_seq_len_kv, ragged_offsets, max_seq_len_q,
                  max_seq_len_kv, False)
    call = _Call("fwd")
    lay.bind_seq(call, L.Q, q, "q", lay.thd_q)
    lay.bind_seq(call, L.K, k, "k", lay.thd_kv)
    lay.bind_seq(call, L.V, v, "v", lay.thd_kv)
    dv = v.shape[-1]
    if lay.thd_q:
        o = torch.empty((q.shape[0], q.shape[1], dv), dtype=o_dtype, device=dev)
        stats = torch.empty((q.shape[0], q.shape[1], 1), dtype=torch.float32, device=dev) if stats_needed else None
    else:
        o = _like_layout((q.shape[0], q.shape[1], q.shape[2], dv), q, o_dtype, dev)
        stats = (torch.empty((q.shape[0], q.shape[1], q.shape[2], 1), dtype=torch.float32, device=dev)
                 if stats_needed else None)
    lay.bind_seq(call, L.O, o, "o", lay.thd_q)
    lay.bind_seq(call, L.STATS, stats, "stats", lay.thd_q)
    call.option("generate_stats", 1 if stats_needed else 0)
    if stats_use_log2:
        call.option("stats_use_log2", 1)
    call.set(L.SCORE_MAX, score_max)
    call.set(L.SCORE_SUM_EXP, score_sum_exp)
    _bind_scales(call, dev, {L.DESCALE_Q: ("descale_q", descale_q), L.DESCALE_K: ("descale_k", descale_k),
                             L.DESCALE_V: ("descale_v", descale_v), L.DESCALE_S: ("descale_s", descale_s),
                             L.SCALE_S: ("scale_s", scale_s), L.SCALE_O: ("scale_o", scale_o)})
    amax_s, amax_o = _amax_outputs(call, dev, (L.AMAX_S, L.AMAX_O))
    _common(call, lay, q, False, attn_scale, use_causal_mask, use_padding_mask, seq_len_q, seq_len_kv, cu_seq_len_q,
            cu_seq_len_kv, max_total_seq_len_q, max_total_seq_len_kv)
    call.run()
    return o, stats, amax_s, amax_o


def sdpa_fp8_backward(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    o: Tensor,
    dO: Tensor,
    stats: Tensor,
    descale_q: Union[Tensor, float],
    descale_k: Union[Tensor, float],
    descale_v: Union[Tensor, float],
    descale_o: Union[Tensor, float],
    descale_dO: Union[Tensor, float],
    descale_s: Union[Tensor, float],
    descale_dP: Union[Tensor, float],
    scale_s: Union[Tensor, float],
    scale_dQ: Union[Tensor, float],
    scale_dK: Union[Tensor, float],
    scale_dV: Union[Tensor, float],
    scale_dP: Union[Tensor, float],
    attn_scale: Optional[Union[float, Tensor]] = None,
    use_causal_mask: bool = False,
    compute_data_type=None,
    name: Optional[str] = None,
    *,
    grad_dtype: Optional[torch.dtype] = None,
    use_deterministic_algorithm: bool = False,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """FP8 SDPA backward with the seed's ``graph.sdpa_fp8_backward`` arguments, run eagerly.

    The algorithm is cuDNN's FP8 SDPA backward (the cuDNN frontend's ``sdpa_fp8_backward`` graph; FlashAttention-2's
    backward on FP8 tensors). With the raw FP8 values, S = exp(x - stats) recomputed as in :func:`sdpa_fp8`, and
    ``fp8_f(x)`` as there::

        D   = descale_dO * descale_o * rowsum(dO * o)
        dS  = descale_dO * descale_v * dO v^T                       (the seed's dS: gradient of S)
        dP  = attn_scale * S * (dS - D);  amax_dP = max |dP|       (the gradient of the scores q k^T)
        dP8 = fp8_dO(dP * scale_dP);  S8 = fp8_q(S * scale_s)
        dQ  = (dP8 k) * descale_dP * descale_k;  dK = (dP8^T q) * descale_dP * descale_q
        dV  = (S8^T dO) * descale_s * descale_dO
        amax_dX = max |dX|;  stored dX = fp8_grad(dX * scale_dX)     (X in Q, K, V)

    Args:
        q, k, v, o, dO: ``(B, H, S, D)`` FP8 tensors as in :func:`sdpa_fp8` (o and dO each of either FP8 format,
            e.g. E5M2 gradients of E4M3 activations); packed THD and padding masks are not taken (the seed's FP8
            backward has a causal mask only).
        stats: float32 ``(B, H_q, S_q, 1)``, the forward's natural-log stats.
        descale_*, scale_*: float32 one-element tensors (or numbers) as in :func:`sdpa_fp8`: descale_o / descale_dO
            of the stored o / dO, descale_s / scale_s of S (as in the forward), descale_dP / scale_dP of the
            quantized dP, scale_dQ / scale_dK / scale_dV of the stored gradients.
        attn_scale: float or 1-element float32 tensor (on the host or q's device: the FP8 kernels read a device
            tensor themselves, no sync; ``FLASHSPAN_SDPA_FP8_DEVICE_ATTN_SCALE=0`` refuses one); None means 1. Must
            match the forward.
        use_causal_mask: top-left causal mask; must match the forward.
        compute_data_type, name: accepted for parity.
        grad_dtype: FP8 dtype of dQ, dK, dV (default dO's).
        use_deterministic_algorithm: honoured on CUDA tensors, so the same call gives bitwise the same dQ, dK, dV
            and amaxes: on the sm90 kernel (H100 / H200) dQ's tile additions in a fixed order (a counter per dQ tile,
            the sm90 backward's deterministic mode), on the sm80 kernels dQ from their ordered (deterministic) dQ
            kernel instead of fp32 atomics; accepted on CPU
            tensors, where it has no effect (the CPU reference is deterministic).

    Returns:
        ``(dQ, dK, dV, amax_dQ, amax_dK, amax_dV, amax_dP)``: gradients of ``grad_dtype`` in q / k / v's layouts and
        float32 ``(1, 1, 1, 1)`` amax values on q's device.

    Raises:
        TypeError / ValueError as :func:`sdpa_fp8` (this function has no padding-mask, length or dropout parameters:
        passing one is Python's TypeError; a packed (THD) tensor is a ValueError). NotImplementedError on CUDA
        tensors for what the FP8 backward does not run: with ``FLASHSPAN_SDPA_FP8_BWD=0`` (read when an operation is
        first checked: set it before the first call of a given signature), for head dims that are not multiples of
        16 up to 128, and for H_k != H_v with ``FLASHSPAN_SDPA_FP8_HK_NE_HV=0``.

    Where it runs: CPU tensors run every call on the CPU reference. CUDA tensors run the FP8 backward by default
    (since its GPU tests passed on an H200): on an H100 / H200 on the sm90 backward kernel (docs/SDPA.md "The FP8
    backward on the sm90 kernel"; about 0.6-0.9x our bf16 backward's speed on an H200), for every call the rule
    above takes except H_k != H_v whose query-head groups do not divide one another; ``FLASHSPAN_SM90_SDPA_FP8_BWD=0``
    leaves them to the sm80 kernels. Every other GPU from sm_80 (and those calls) runs the sm80 kernels (docs/SDPA.md
    "The FP8 backward on the sm80 kernels"; head dims above 64 need the shared memory of an A100 / H100 class GPU,
    not sm_86 / sm_89). CUDA FP8 forwards (which give o and stats) run on an H100 / H200 (the sm90 kernel) or on
    every GPU from sm_80 (the sm80 kernels, unless ``FLASHSPAN_SDPA_FP8_SM80=0``; :func:`sdpa_fp8`).
    """
    del name
    _check_unsupported(None, compute_data_type)
    use_causal_mask = check_flag("use_causal_mask", use_causal_mask)
    use_deterministic_algorithm = check_flag("use_deterministic_algorithm", use_deterministic_algorithm)
    for n, t in (("q", q), ("k", k), ("v", v), ("o", o), ("dO", dO)):
        _check_fp8(t, n)
        if t.dim() != 4:
            raise ValueError(f"{n}: must be 4-D (B, H, S, D), got shape {tuple(t.shape)}: the FP8 backward takes no "
                             f"packed (THD) layout (the seed's sdpa_fp8_backward has no padding mask)")
    if dO.numel() == 0:
        dO = dense_grad(dO)  # an empty output's dO (any strides: it has no element)
    grad_dtype = _check_fp8_dtype(dO.dtype if grad_dtype is None else grad_dtype, "grad_dtype")
    dev = q.device
    lay = _Layout(q, k, v, None, None, None, None, None, None, None, False)
    call = _Call("bwd")
    for slot, t, n in ((L.Q, q, "q"), (L.K, k, "k"), (L.V, v, "v"), (L.O, o, "o"), (L.DO, dO, "dO"),
                       (L.STATS, stats, "stats")):
        lay.bind_seq(call, slot, t, n, False)
    dq = _like_layout(tuple(q.shape), q, grad_dtype, dev)
    dk = _like_layout(tuple(k.shape), k, grad_dtype, dev)
    dv = _like_layout(tuple(v.shape), v, grad_dtype, dev)
    for slot, t, n in ((L.DQ, dq, "dQ"), (L.DK, dk, "dK"), (L.DV, dv, "dV")):
        lay.bind_seq(call, slot, t, n, False)
    if use_deterministic_algorithm:
        call.option("deterministic_algorithm", 1)
    _bind_scales(call, dev, {
        L.DESCALE_Q: ("descale_q", descale_q), L.DESCALE_K: ("descale_k", descale_k),
        L.DESCALE_V: ("descale_v", descale_v), L.DESCALE_O: ("descale_o", descale_o),
        L.DESCALE_DO: ("descale_dO", descale_dO), L.DESCALE_S: ("descale_s", descale_s),
        L.DESCALE_DP: ("descale_dP", descale_dP), L.SCALE_S: ("scale_s", scale_s), L.SCALE_DQ: ("scale_dQ", scale_dQ),
        L.SCALE_DK: ("scale_dK", scale_dK), L.SCALE_DV: ("scale_dV", scale_dV), L.SCALE_DP: ("scale_dP", scale_dP)})
    amax = _amax_outputs(call, dev, (L.AMAX_DQ, L.AMAX_DK, L.AMAX_DV, L.AMAX_DP))
    _common(call, lay, q, True, attn_scale, use_causal_mask)
    call.run()
    return (dq, dk, dv, *amax)
