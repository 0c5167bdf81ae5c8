"""SDPA on the flex engine: the configurations of ``flashspan.sdpa`` whose semantics are a pure mask, lowered onto a
MaskPlan and the flex forward / backward kernels (docs/SDPA.md, "What runs where").

Without score modifiers, every SDPA mask (causal top-left / bottom-right, ``diagonal_band_left_bound`` /
``diagonal_band_right_bound``, sliding windows and the deprecated setters, padding with ``seq_len_q`` /
``seq_len_kv``, ragged THD with ``cu_seq_len_q`` / ``cu_seq_len_kv`` and ragged offsets) shows query row ``i`` of
sample ``b`` one interval of keys ``[lo, hi)`` (or none)::

    shift = len_kv[b] - len_q[b] (BOTTOM_RIGHT) or 0 (TOP_LEFT)
    hi = min(len_kv[b], i + shift + right + 1)      (len_kv[b] without a right bound)
    lo = max(0, i + shift - left + 1)               (0 without a left bound)
    empty when i >= len_q[b] or hi <= lo

which is exactly flex's ``mask_func`` (endpoints ``[0, 0) U [lo, hi)``, or ``[0, hi)`` when lo is always 0). The
endpoints are computed with torch arithmetic on the tensors' device; the plan is built by ``create_mask_plan`` (the
CUDA planner for CUDA tensors) and run by the flex kernels, forward and backward.

Layout mapping:
    * q, k, v dense (4-D ``[B, H, S, D]``, any strides): flex BSHD on ``x.transpose(1, 2)`` views (no copy).
    * either side packed (3-D ``(T, H, D)``): flex THD. A dense side is reshaped to ``(B * S, H, D)`` (a copy unless
      its memory already is BSHD) with ``cu_seqlens = b * S``. A packed side keeps its tokens: flex sample ``b`` spans
      from the sample's first token to the next sample's first token (the last one to ``T``), so gaps of ragged
      offsets and trailing tokens belong to a sample and are masked.
    * Rows and keys outside the samples' lengths (padding, gaps) are zeroed on a copy of the input before the
      kernels see them (``torch.where``; only when the call has lengths), so NaN or garbage there is never read;
      outputs and gradients there are written as 0 and the LSE as -inf.

Host reads: none for dense tensors with device lengths (the endpoints and the plan are built on the device);
packed (THD) calls read the B+1 offsets / lengths once per plan (the flex planner reads ``cu_seqlens`` on the host
anyway); a tensor ``attn_scale`` is read once per call (the flex kernels take the scale as a float).

Plan reuse: plans (with their endpoints and layout indices) are kept in an LRU of ``PLAN_CACHE_SIZE`` entries keyed
by the tensor geometry, dtype, device, mask parameters and the identity and version (``Tensor._version``) of every
length / offset tensor. A training loop that passes the same length tensors (or none) builds its plan once; new
length tensors, or lengths changed in place, build a new plan. The backward reuses the forward's plan when that one
was built with backward metadata (``sdpa()`` asks for it when gradients are needed), else builds one.

The switch ``FLASHSPAN_SDPA_ROUTE`` (environment, read per call) chooses where a call runs (:func:`route`). CUDA
tensors take the SDPA operation of the C layer itself (the native route: its GPU kernels with the analytic mask,
issue 24), the default on every GPU since 2026-12-03, which names the features it does not run; with
``FLASHSPAN_SDPA_ROUTE=flex`` they take this lowering instead (a comparison route), unless the call has a feature
this lowering cannot express (:func:`unsupported`), which keeps the native route. ``FLASHSPAN_SDPA_ROUTE=flex``
also runs this lowering on CPU tensors, where the flex calls run flex's CPU backend: that is how CI tests this code
path without a GPU; unset (or ``reference``), CPU tensors run the SDPA CPU reference.
"""

from __future__ import annotations

import math
import os
import threading
import weakref
from collections import OrderedDict
from typing import Optional

import torch
from torch import Tensor

from ._sdpa_lib import BOTTOM_RIGHT, alignment_code, check_packed_end

ROUTE_ENV = "FLASHSPAN_SDPA_ROUTE"
NOT_COMPUTED = object()  # default of the unsupported_error arguments: unsupported() not computed by the caller
EXPERIMENTAL_ENV = "FLASHSPAN_EXPERIMENTAL"
PLAN_CACHE_SIZE = 32
LOG2E = 1.4426950408889634

# Head dims the GPU flex kernels run (src/dispatch/family.cpp, check_head_dims_sm80).
_GPU_DIMS_DOC = "each of (D_qk, D_v) in {8, 16, ..., 128}, or (192, 128), or (256, 256)"


def _gpu_head_dims_ok(dqk: int, dv: int) -> bool:
    small = lambda d: 0 < d <= 128 and d % 8 == 0  # noqa: E731
    return (small(dqk) and small(dv)) or (dqk, dv) in ((192, 128), (256, 256))


def route(q: Tensor, k: Optional[Tensor] = None, v: Optional[Tensor] = None, a: Optional[dict] = None,
          unsupported_error=NOT_COMPUTED) -> str:
    """Where a call on q runs: ``"flex"`` (this lowering), ``"reference"`` (the SDPA CPU reference of the C layer,
    CPU tensors) or ``"native"`` (the C layer's SDPA operation on the GPU kernels). Non-CPU tensors take
    ``"native"``, unless :func:`prefers_flex` and the call (k, v and the arguments ``a``, when given) has no feature
    this lowering cannot express (:func:`unsupported`: score modifiers, sinks, dropout, the block mask, the gate,
    the score_max / score_sum_exp outputs, paged K/V, H_k != H_v, ...): then ``"flex"`` (the lowering onto flex
    plans). CPU tensors take ``"reference"``, or ``"flex"`` with ``FLASHSPAN_SDPA_ROUTE=flex`` (the lowering onto
    flex's CPU backend). ``unsupported_error``: the caller's ``unsupported(q, k, v, a)`` of this call (None or the
    error), when it has it, so that it is not computed twice (default: computed here when needed)."""
    if q.device.type != "cpu":
        if prefers_flex(q) and not (k is not None and v is not None and a is not None
                                    and _unsupported_of(q, k, v, a, unsupported_error) is not None):
            return "flex"
        return "native"
    return "flex" if _route_env() == "flex" else "reference"


def _route_env() -> str:
    return os.environ.get(ROUTE_ENV, "").strip().lower()


def prefers_flex(q: Tensor) -> bool:
    """Whether a call on the (non-CPU) device of q that this lowering can express takes it rather than the native
    route (environment read per call): only with ``FLASHSPAN_SDPA_ROUTE=flex`` (a comparison route). The native
    route is the default on every GPU since 2026-12-03: on sm90 its kernels run every GPU head dim at par with the
    flex route's (PERF_LOG v2.10, v2.12), and the sm80 kernels' mask-only instantiations run 1.02-1.07x the flex
    route's on the sm80 kernels (PERF_LOG v2.13; before them the native sm80 backward was 0.69-0.74x)."""
    return _route_env() == "flex"


def _unsupported(feature: str, why: str) -> NotImplementedError:
    return NotImplementedError(
        f"{feature}: not supported by the flex route (FLASHSPAN_SDPA_ROUTE=flex lowers pure-mask configurations "
        f"onto the flex kernels), and {why}; the native route (the default) runs it (docs/SDPA.md)"
    )


def check_supported(q: Tensor, k: Tensor, v: Tensor, a: dict, backward: bool,
                    unsupported_error=NOT_COMPUTED) -> None:
    """Raises NotImplementedError naming the first feature of the call (arguments ``a``) the flex lowering cannot
    express (:func:`unsupported`; ``unsupported_error``: its result for this call when the caller has it)."""
    err = _unsupported_of(q, k, v, a, unsupported_error)
    if err is not None:
        raise err


def _unsupported_of(q: Tensor, k: Tensor, v: Tensor, a: dict, given) -> Optional[NotImplementedError]:
    """``given`` (a caller's :func:`unsupported` of this call) unless it is NOT_COMPUTED, else computed now."""
    return unsupported(q, k, v, a) if given is NOT_COMPUTED else given


_MODIFIER = "flex has no score modifiers (it adds nothing to the scores, it only masks them)"
# The features unsupported() names, in its order: (name in the error, the arguments that carry it, why the flex
# lowering cannot express it). An argument counts when it is not None (use_alibi_mask: when true).
_FEATURES = (
    ("bias", ("bias",), _MODIFIER),
    ("dBias", ("dBias",), _MODIFIER),
    ("use_alibi_mask (ALiBi)", ("use_alibi_mask",), _MODIFIER),
    ("softcap", ("softcap",), _MODIFIER),
    ("sink_token (attention sinks)", ("sink_token",), "flex's softmax has no sink term"),
    ("dSink_token", ("dSink_token",), "flex's softmax has no sink term"),
    ("dropout", ("dropout",), "flex has no dropout"),
    ("rng_dump", ("rng_dump",), "flex has no dropout"),
    ("block_mask", ("block_mask",), "a 128x128 block mask combined with the band is not one interval per row"),
    ("gate", ("gate",), "flex has no output gate"),
    ("dgate", ("dgate",), "flex has no output gate"),
    ("paged_attention_k_table, paged_attention_v_table (paged K/V)",
     ("paged_attention_k_table", "paged_attention_v_table"), "flex reads contiguous K/V only"),
    ("score_max (logit_max output)", ("score_max",),
     "flex returns the LSE only, from which the row max cannot be separated"),
    ("score_sum_exp", ("score_sum_exp",),
     "flex returns the LSE only, from which the sum of exponentials cannot be separated"),
)


def unsupported(q: Tensor, k: Tensor, v: Tensor, a: dict) -> Optional[NotImplementedError]:
    """The NotImplementedError naming the first feature of the call (arguments ``a``) the flex lowering cannot
    express, or None when it expresses the whole call."""
    get = a.get
    for name, args, why in _FEATURES:
        for arg in args:
            x = get(arg)
            if x is not None and (arg != "use_alibi_mask" or x):
                return _unsupported(name, why)
    return _unsupported_shapes(q, k, v)


def _unsupported_shapes(q: Tensor, k: Tensor, v: Tensor) -> Optional[NotImplementedError]:
    """unsupported()'s rules on head counts, dtype and head dims."""
    if k.shape[1] != v.shape[1]:  # the head dim is dim 1 of both (B, H, S, D) and (T, H, D)
        return _unsupported(f"k, v: H_k = {k.shape[1]} != H_v = {v.shape[1]}", "flex shares one head count for K and V")
    if q.dtype not in (torch.float16, torch.bfloat16) and not (q.device.type == "cpu" and q.dtype == torch.float32):
        return _unsupported(f"q: dtype {q.dtype}", "the flex kernels take float16 / bfloat16 (CPU: also float32)")
    dqk, dv = q.shape[-1], v.shape[-1]
    if q.device.type == "cuda" and not _gpu_head_dims_ok(dqk, dv):
        return _unsupported(f"q, v: head dims (D_qk, D_v) = ({dqk}, {dv})", f"the flex GPU kernels run {_GPU_DIMS_DOC}")
    return None


# ---------------------------------------------------------------------------
# Mask parameters
# ---------------------------------------------------------------------------


def mask_params(a: dict) -> tuple[Optional[int], Optional[int], bool]:
    """(left, right, bottom_right) after the seed's precedence: alignment, then the deprecated setters (alignment and
    a right bound of 0 unless one is set), then sliding_window_length, then the explicit bounds (as the C layer)."""
    bottom_right = alignment_code(a.get("diagonal_alignment")) == BOTTOM_RIGHT
    left = right = None
    if a.get("use_causal_mask"):
        bottom_right = False
        right = 0
    if a.get("use_causal_mask_bottom_right"):
        bottom_right = True
        right = 0
    if a.get("sliding_window_length") is not None:
        left = int(a["sliding_window_length"])
    if a.get("diagonal_band_left_bound") is not None:
        left = int(a["diagonal_band_left_bound"])
    if a.get("diagonal_band_right_bound") is not None:
        right = int(a["diagonal_band_right_bound"])
    # A bound past every sequence length masks nothing more: clamped so the int64 endpoint arithmetic cannot
    # overflow (lengths are below 2^31).
    if left is not None:
        left = min(left, _BOUND_CLAMP)
    if right is not None:
        right = min(right, _BOUND_CLAMP)
    return left, right, bottom_right


_BOUND_CLAMP = 1 << 40


def scale_of(attn_scale) -> float:
    """The float scale: None -> 1 (the seed's default), a tensor is read on the host (one sync on CUDA)."""
    if attn_scale is None:
        return 1.0
    if isinstance(attn_scale, Tensor):
        return float(attn_scale.reshape(-1)[0].item())
    return float(attn_scale)


# ---------------------------------------------------------------------------
# Geometry: how the SDPA tensors map onto one flex call
# ---------------------------------------------------------------------------


def _host_ints(t: Tensor) -> list:
    return [int(x) for x in t.reshape(-1).tolist()]


def host_lengths(seq: Optional[Tensor], cu: Optional[Tensor], B: int, S: int, side: str,
                 max_total: Optional[int] = None) -> list:
    """Sample lengths of one side as host ints, checked with the CPU reference's rules and messages
    (src/core/sdpa_problem.cpp, read_lengths): ``side`` is "q" or "kv", ``S`` the side's S_max."""
    max_name = f"S_{side}"
    if seq is not None:
        lens = _host_ints(seq)[:B]
        for b, n in enumerate(lens):
            if not 0 <= n <= S:
                raise ValueError(f"seq_len_{side}: sample {b} has length {n}, outside [0, {max_name} = {S}]")
    elif cu is not None:
        c = _host_ints(cu)
        name = f"cu_seq_len_{side}"
        if c[0] != 0:
            raise ValueError(f"{name}: must start at 0 (prefix sums), got {c[0]}")
        lens = []
        for b in range(B):
            n = c[b + 1] - c[b]
            if n < 0 or n >= 1 << 63:
                raise ValueError(f"{name}: must be nondecreasing, but [{b + 1}] = {c[b + 1]} < [{b}] = {c[b]}")
            if n > S:
                raise ValueError(f"{name}: sample {b} has length {n}, longer than {max_name} = {S}")
            lens.append(n)
    else:
        lens = [S] * B
    if max_total is not None and sum(lens) > max_total:
        raise ValueError(f"max_total_seq_len_{side}: the samples hold {sum(lens)} tokens, more than the declared "
                         f"{max_total}")
    return lens


class _Geometry:
    """The flex layout of one SDPA call and the per-row quantities the endpoints need.

    Attributes:
        varlen: flex THD (True) or BSHD (False).
        B, Sq, Skv: batch and the dense (or S_max) sequence lengths.
        thd_q, thd_kv: the SDPA q-side / kv-side tensors are packed (T, H, D).
        len_q, len_kv: int64 [B] sample lengths on the device.
        row_b, row_i: int64 [Rq]: sample and sample-local query index of every flex row (row_i < 0 or >= len_q:
            a padding or gap row).
        key_shift: int64 [B] or None: flex-local index of the sample's first key (THD leading gaps).
        valid_q, valid_k: bool [Rq] / [Rk] or None (every row / key belongs to a sample).
        cu_q, cu_k, max_q, max_k: flex THD cumulative lengths (int32, device) and maxima.
        empty: no query row or no key anywhere: outputs are 0 / -inf without a kernel.
    """

    def __init__(self, q: Tensor, k: Tensor, a: dict):
        dev = q.device
        self.thd_q, self.thd_kv = q.dim() == 3, k.dim() == 3
        self.varlen = self.thd_q or self.thd_kv
        ragged = dict(a.get("ragged_offsets") or {})
        self.Hq = q.shape[-2] if self.thd_q else q.shape[1]
        seq_q, seq_kv = a.get("seq_len_q"), a.get("seq_len_kv")
        cu_q, cu_kv = a.get("cu_seq_len_q"), a.get("cu_seq_len_kv")
        padded = a.get("use_padding_mask") and any(t is not None for t in (seq_q, seq_kv, cu_q, cu_kv))
        if self.thd_q:
            self.B = (cu_q.numel() - 1) if cu_q is not None else seq_q.numel()
        else:
            self.B = q.shape[0]
        B = self.B
        self.Sq = None if self.thd_q else q.shape[2]
        self.Skv = None if self.thd_kv else k.shape[2]
        self.key_shift = None
        self.valid_q = self.valid_k = None
        self.cu_q = self.cu_k = None
        self.max_q = self.max_k = 0
        self.nfunc_left = False  # some row's interval may start after key 0 of its flex sample

        if not self.varlen:
            Sq, Skv = self.Sq, self.Skv
            self.len_q = self._dense_lengths(seq_q, cu_q, B, Sq, dev, padded, "q", a.get("max_total_seq_len_q"))
            self.len_kv = self._dense_lengths(seq_kv, cu_kv, B, Skv, dev, padded, "kv", a.get("max_total_seq_len_kv"))
            r = torch.arange(B * Sq, device=dev, dtype=torch.int64)
            self.row_b, self.row_i = r // max(Sq, 1), r % max(Sq, 1)
            if padded:
                self.valid_q = self.row_i < self.len_q[self.row_b]
                kr = torch.arange(B * Skv, device=dev, dtype=torch.int64)
                self.valid_k = (kr % max(Skv, 1)) < self.len_kv[kr // max(Skv, 1)]
            self.empty = B * Sq == 0 or B * Skv == 0
            return

        # Flex THD: host geometry (B+1 offsets per side, read once per plan).
        q_starts, q_lens, Tq, q_all = self._side_host(q, self.thd_q, seq_q, cu_q, ragged, "q", a.get("max_seq_len_q"),
                                                      a.get("max_total_seq_len_q"))
        k_starts, k_lens, Tk, k_all = self._side_host(k, self.thd_kv, seq_kv, cu_kv, ragged, "k",
                                                      a.get("max_seq_len_kv"), a.get("max_total_seq_len_kv"))
        if self.thd_kv:
            self._same_offsets(ragged, "v", "k", k_starts)
        if self.thd_q:
            for name in ("o", "stats", "dO", "dQ"):
                self._same_offsets(ragged, name, "q", q_starts)
        if self.thd_kv:
            for name in ("dK", "dV"):
                self._same_offsets(ragged, name, "k", k_starts)
        cu_q_host = [0] + q_starts[1:] + [Tq]
        cu_k_host = [0] + k_starts[1:] + [Tk]
        self.max_q = max(b - a_ for a_, b in zip(cu_q_host[:-1], cu_q_host[1:]))
        self.max_k = max(b - a_ for a_, b in zip(cu_k_host[:-1], cu_k_host[1:]))
        self.empty = sum(q_lens) == 0 or sum(k_lens) == 0 or Tq == 0 or Tk == 0
        to_dev = lambda xs: torch.tensor(xs, dtype=torch.int64, device=dev)  # noqa: E731
        self.cu_q = to_dev(cu_q_host).to(torch.int32)
        self.cu_k = to_dev(cu_k_host).to(torch.int32)
        self.len_q, self.len_kv = to_dev(q_lens), to_dev(k_lens)
        starts_q, starts_k = to_dev(q_starts), to_dev(k_starts)
        r = torch.arange(Tq, device=dev, dtype=torch.int64)
        self.row_b = torch.searchsorted(self.cu_q[1:].to(torch.int64), r, right=True)
        self.row_i = r - starts_q[self.row_b]
        if not q_all:
            self.valid_q = (self.row_i >= 0) & (self.row_i < self.len_q[self.row_b])
        shifts = [s - c for s, c in zip(k_starts, cu_k_host[:-1])]
        if any(shifts):
            self.key_shift = to_dev(shifts)
            self.nfunc_left = True
        if not k_all:
            kr = torch.arange(Tk, device=dev, dtype=torch.int64)
            kb = torch.searchsorted(self.cu_k[1:].to(torch.int64), kr, right=True)
            ki = kr - starts_k[kb]
            self.valid_k = (ki >= 0) & (ki < self.len_kv[kb])

    @staticmethod
    def _dense_lengths(seq, cu, B, S, dev, padded, side, max_total) -> Tensor:
        if not padded:
            return torch.full((B,), S, dtype=torch.int64, device=dev)
        t = seq if seq is not None else cu
        if t.device.type == "cpu":  # the reference's value rules, where they cost no device sync
            return torch.tensor(host_lengths(seq, cu, B, S, side, max_total), dtype=torch.int64, device=dev)
        if seq is not None:
            lens = seq.reshape(-1).to(device=dev, dtype=torch.int64)
        else:
            c = cu.reshape(-1).to(device=dev, dtype=torch.int64)
            lens = c[1:] - c[:-1]
        # Device lengths are clamped into [0, S] (no sync to check them): the endpoints stay valid flex input.
        return lens.clamp(0, S)

    def _side_host(self, t: Tensor, thd: bool, seq, cu, ragged: dict, name: str, s_max, max_total):
        """(starts, lengths, T, all_valid) of one side in the flex THD layout, as host lists."""
        B = self.B
        side = "q" if name == "q" else "kv"
        if not thd:  # a dense side: sample b is rows [b*S, (b+1)*S)
            S = t.shape[2]
            lens = host_lengths(seq, cu, B, S, side, max_total)
            return [b * S for b in range(B)], lens, B * S, all(n == S for n in lens)
        T = t.shape[0]
        if s_max is None:  # as sdpa._Layout: the longest sample
            s_max = max(host_lengths(seq, cu, B, 1 << 62, side), default=0)
        lens = host_lengths(seq, cu, B, int(s_max), side, max_total)
        offsets = ragged.get(name)
        if offsets is None:
            check_packed_end(_host_ints(cu), T, side, name)
        starts = _host_ints(offsets)[:B] if offsets is not None else _host_ints(cu)[:B]
        for b in range(B):
            end = starts[b + 1] if b + 1 < B else T
            if starts[b] < 0 or starts[b] + lens[b] > end:
                raise _unsupported(
                    f"ragged_offsets / cu_seq_len_{side}: sample {b} (tokens {starts[b]}..{starts[b] + lens[b]})",
                    f"flex needs packed samples in order, each ending before the next one starts (within T = {T})")
        return starts, lens, T, sum(lens) == T

    def _same_offsets(self, ragged: dict, name: str, mirror: str, mirror_starts: list) -> None:
        """A tensor with its own ragged offsets must sit at its mirror's token offsets (flex has one layout per side)."""
        own = ragged.get(name)
        if own is None or own is ragged.get(mirror):
            return
        if _host_ints(own)[: self.B] != mirror_starts:
            raise _unsupported(f"ragged_offsets[{name!r}]: offsets that differ from {mirror!r}'s",
                               f"flex lays out {name} like {mirror}")

    # -- endpoints --------------------------------------------------------------------------------

    def mask_func(self, left: Optional[int], right: Optional[int], bottom_right: bool) -> Tensor:
        """int32 [1, nfunc, Rq]: flex endpoints of every row's interval (nfunc 1: [0, hi); 3: [0, 0) U [lo, hi))."""
        b, i = self.row_b, self.row_i
        lq, lk = self.len_q[b], self.len_kv[b]
        shift = (lk - lq) if bottom_right else torch.zeros_like(lk)
        hi = lk
        if right is not None:
            hi = torch.minimum(hi, i + shift + (right + 1))
        lo = torch.zeros_like(lk)
        if left is not None:
            lo = torch.clamp(i + shift - (left - 1), min=0)
        lo = torch.minimum(lo, lk)
        hi = torch.maximum(hi, lo)
        valid = (i >= 0) & (i < lq)
        lo = torch.where(valid, lo, torch.zeros_like(lo))
        hi = torch.where(valid, hi, lo)
        if self.key_shift is not None:
            ks = self.key_shift[b]
            lo, hi = lo + ks, hi + ks
        if left is None and not self.nfunc_left:
            return hi.to(torch.int32).view(1, 1, -1).contiguous()
        return torch.stack((torch.zeros_like(lo), lo, hi)).to(torch.int32).unsqueeze(0).contiguous()

    # -- tensors into / out of the flex layout ----------------------------------------------------

    def to_flex_q(self, t: Tensor) -> Tensor:
        """A q-side SDPA tensor (q, o, dO) in the flex layout, padding / gap rows zeroed."""
        return self._to_flex(t, self.thd_q, self.Sq, self.valid_q)

    def to_flex_k(self, t: Tensor) -> Tensor:
        """A kv-side SDPA tensor (k, v) in the flex layout, padding / gap keys zeroed."""
        return self._to_flex(t, self.thd_kv, self.Skv, self.valid_k)

    def _to_flex(self, t: Tensor, thd: bool, S: Optional[int], valid: Optional[Tensor]) -> Tensor:
        """One side's tensor (packed ``(T, H, D)`` when ``thd``, else ``(B, H, S, D)``) as flex THD / BSHD, rows where
        ``valid`` is False zeroed."""
        if thd:
            f = t
        elif not self.varlen:
            f = t.transpose(1, 2)
        else:
            f = t.transpose(1, 2).reshape(self.B * S, t.shape[1], t.shape[3])
        if valid is not None:
            f = torch.where(self._rows(valid, f), f, torch.zeros((), dtype=f.dtype, device=f.device))
        return f

    def _rows(self, valid: Tensor, f: Tensor) -> Tensor:
        """valid [R] broadcast over a flex tensor's heads and dims ([B, S, H, D] or [T, H, D])."""
        if f.dim() == 4:
            return valid.view(f.shape[0], f.shape[1], 1, 1)
        return valid.view(-1, 1, 1)

    def flex_out_view(self, out: Tensor) -> Optional[Tensor]:
        """The flex q-side view of the SDPA output ``out`` for the forward kernel to write in place, or None when it
        has none: rows to zero (padding, gaps), a dense q in a THD call (a reshape), or memory the kernels cannot
        address (last dim not contiguous; CUDA: see :func:`_kernel_ready`)."""
        if self.valid_q is not None:
            return None
        if self.thd_q:
            f = out
        elif not self.varlen:
            f = out.transpose(1, 2)
        else:
            return None
        if f.stride(-1) != 1 or _kernel_ready(f) is not f:
            return None
        return f

    def from_flex_q(self, f: Tensor, out: Tensor) -> None:
        """Writes a flex q-side tensor (o, dQ) into the SDPA tensor ``out`` (padding rows 0)."""
        self._from_flex(f, out, self.valid_q, self.thd_q, self.Sq)

    def from_flex_k(self, f: Tensor, out: Tensor) -> None:
        self._from_flex(f, out, self.valid_k, self.thd_kv, self.Skv)

    def _from_flex(self, f: Tensor, out: Tensor, valid: Optional[Tensor], thd: bool, S) -> None:
        if valid is not None:
            f = torch.where(self._rows(valid, f), f, torch.zeros((), dtype=f.dtype, device=f.device))
        if thd:
            out.copy_(f)
        elif not self.varlen:
            out.copy_(f.transpose(1, 2))
        else:
            out.copy_(f.view(self.B, S, f.shape[1], f.shape[2]).transpose(1, 2))

    def lse_to_stats(self, lse: Tensor, stats: Tensor, log2: bool) -> None:
        """flex LSE (BSHD [B, Hq, Sq]; THD [Hq, Tq]) -> SDPA stats ((B, Hq, Sq, 1); packed (T, Hq, 1))."""
        if self.valid_q is not None:
            lse = torch.where(self._lse_rows(self.valid_q), lse, torch.full((), -math.inf, device=lse.device))
        if log2:
            lse = lse * LOG2E
        if not self.varlen:
            stats.copy_(lse.unsqueeze(-1))
        elif self.thd_q:
            stats.copy_(lse.t().unsqueeze(-1))
        else:
            stats.copy_(lse.view(self.Hq, self.B, self.Sq).permute(1, 0, 2).unsqueeze(-1))

    def _lse_rows(self, valid: Tensor) -> Tensor:
        if not self.varlen:
            return valid.view(self.B, 1, self.Sq)
        return valid.view(1, -1)

    def stats_to_lse(self, stats: Tensor, Tq: int) -> Tensor:
        """SDPA stats (natural log: (B, Hq, Sq[, 1]); packed q: (T, Hq, 1) or padded (B, Hq, S_max[, 1]))
        -> the flex LSE layout, contiguous fp32. ``Tq``: q.shape[0]."""
        packed_stats = self.thd_q and stats.dim() == 3 and stats.shape[-1] == 1 and stats.shape[0] == Tq
        if packed_stats:
            lse = stats[..., 0].t()
        else:
            s = stats.reshape(stats.shape[0], stats.shape[1], stats.shape[2])
            if not self.varlen:
                lse = s
            elif self.thd_q:  # padded stats for packed q: row r reads (sample, local index)
                i = self.row_i.clamp(0, max(s.shape[2] - 1, 0))
                lse = s[self.row_b, :, i].t()  # [Hq, Tq]
            else:
                lse = s.permute(1, 0, 2).reshape(self.Hq, self.B * self.Sq)
        lse = lse.to(torch.float32)
        if self.valid_q is not None:
            lse = torch.where(self._lse_rows(self.valid_q), lse, torch.full((), -math.inf, device=lse.device))
        return lse.contiguous()


# ---------------------------------------------------------------------------
# Plan cache
# ---------------------------------------------------------------------------


class _Entry:
    __slots__ = ("refs", "versions", "geometry", "mask", "plan")

    def __init__(self, tensors, geometry, mask, plan):
        self.refs = [weakref.ref(t) for t in tensors]
        self.versions = [_version(t) for t in tensors]
        self.geometry, self.mask, self.plan = geometry, mask, plan

    def alive(self, tensors) -> bool:
        return all(r() is t and ver is not None and _version(t) == ver
                   for r, t, ver in zip(self.refs, tensors, self.versions))


def _version(t: Tensor) -> Optional[int]:
    """The tensor's in-place version counter (None for inference tensors, which have none: never reused)."""
    try:
        return t._version
    except RuntimeError:
        return None


_plans: OrderedDict = OrderedDict()
_plans_lock = threading.Lock()


def clear_plan_cache() -> None:
    """Drops every cached plan (tests; or to free plan memory now)."""
    with _plans_lock:
        _plans.clear()


def plan_cache_size() -> int:
    return len(_plans)


_LENGTH_ARGS = ("seq_len_q", "seq_len_kv", "cu_seq_len_q", "cu_seq_len_kv")


def _length_tensors(a: dict) -> list:
    ts = [a.get(n) for n in _LENGTH_ARGS]
    ragged = a.get("ragged_offsets")
    if ragged:
        ts += [t for _, t in sorted(ragged.items())]
    return [t for t in ts if isinstance(t, Tensor)]


def _cache_key(q: Tensor, k: Tensor, v: Tensor, a: dict, mask: tuple, tensors: list) -> tuple:
    get = a.get
    ragged = get("ragged_offsets")
    return (
        q.device, q.dtype, tuple(q.shape), tuple(k.shape), tuple(v.shape), mask, bool(get("use_padding_mask")),
        tuple(sorted(ragged.keys())) if ragged else (),
        get("max_seq_len_q"), get("max_seq_len_kv"),
        (id(get("seq_len_q")), id(get("seq_len_kv")), id(get("cu_seq_len_q")), id(get("cu_seq_len_kv"))),
        tuple([id(t) for t in tensors]),
    )


def _prepare(q: Tensor, k: Tensor, v: Tensor, a: dict, need_backward: bool):
    """(geometry, plan or None when the call is empty), from the cache or built now."""
    mask = mask_params(a)
    tensors = _length_tensors(a)
    key = _cache_key(q, k, v, a, mask, tensors)
    with _plans_lock:
        e = _plans.get(key)
        if e is not None and e.alive(tensors) and (e.plan is None or e.plan.has_backward or not need_backward):
            _plans.move_to_end(key)
            return e.geometry, e.plan
    from .plan import create_mask_plan

    geo = _Geometry(q, k, a)
    plan = None
    mf = None
    if not geo.empty:
        mf = geo.mask_func(*mask)
        qf, kf, vf = _flex_shaped(geo, q), _flex_shaped(geo, k, kv=True), _flex_shaped(geo, v, kv=True)
        kwargs = {}
        if geo.varlen:
            kwargs = dict(cu_seqlens_q=geo.cu_q, cu_seqlens_k=geo.cu_k, max_seqlen_q=geo.max_q, max_seqlen_k=geo.max_k)
        plan = create_mask_plan(mf, qf, kf, vf, build_backward=need_backward, **kwargs)
    with _plans_lock:
        _plans[key] = _Entry(tensors, geo, mf, plan)
        _plans.move_to_end(key)
        while len(_plans) > PLAN_CACHE_SIZE:
            _plans.popitem(last=False)
    return geo, plan


def _flex_shaped(geo: _Geometry, t: Tensor, kv: bool = False) -> Tensor:
    """A stand-in of t's flex shape for create_mask_plan, which reads shape, dtype and device only: one row of
    storage expanded (stride 0 but the last dim), so no tensor of the full size is allocated."""
    thd = geo.thd_kv if kv else geo.thd_q
    if thd:
        shape = tuple(t.shape)
    elif not geo.varlen:
        shape = (t.shape[0], t.shape[2], t.shape[1], t.shape[3])
    else:
        shape = (t.shape[0] * t.shape[2], t.shape[1], t.shape[3])
    return torch.zeros((shape[-1],), dtype=t.dtype, device=t.device).expand(shape)


def _kernel_ready(t: Tensor) -> Tensor:
    """CUDA tensors the flex kernels can load (16-byte aligned start, strides multiples of 8 elements), else a copy."""
    if t.device.type != "cuda":
        return t
    if t.data_ptr() % 16 == 0 and all(s % 8 == 0 or n <= 1 for s, n in zip(t.stride()[:-1], t.shape[:-1])):
        return t
    return t.contiguous()


# ---------------------------------------------------------------------------
# Forward / backward
# ---------------------------------------------------------------------------


def forward(q: Tensor, k: Tensor, v: Tensor, o: Tensor, stats: Optional[Tensor], a: dict,
            build_backward: bool = False, *, unsupported_error=NOT_COMPUTED, o_is_fresh: bool = False) -> None:
    """Runs one SDPA forward on the flex engine, writing ``o`` (and ``stats``, and ``a['max_logit']``) in place.

    Args:
        q, k, v: SDPA tensors ``(B, H_q, S_q, D_qk)`` / ``(B, H_kv, S_kv, D_qk)`` / ``(B, H_kv, S_kv, D_v)`` (any
            strides, last dim contiguous) or packed ``(T, H, D)``; fp16 / bf16 (CPU route: also fp32).
        o: output, q's shape with D_v, dtype of q (packed: ``(T_q, H_q, D_v)``).
        stats: None or fp32 ``(B, H_q, S_q, 1)`` (packed: ``(T_q, H_q, 1)``): the LSE, natural log or base 2
            (``a['stats_use_log2']``); -inf for rows that see no key.
        a: the remaining graph.sdpa arguments, already checked by the C layer's rules (``_Call.validate``).
        build_backward: build the plan with backward metadata (gradients will follow).
        unsupported_error: :func:`unsupported` of this call when the caller computed it (None or the error).
        o_is_fresh: ``o`` was just allocated and overlaps no input: when its flex view is one the kernels can write
            (no padding rows to zero, BSHD or packed q), the kernel writes it in place (no copy).

    Raises NotImplementedError naming a feature the lowering cannot express (check_supported), ValueError for
    lengths that break the reference's rules (host-readable lengths only), RuntimeError from the flex layer.
    """
    from .execution import run_forward

    check_supported(q, k, v, a, backward=False, unsupported_error=unsupported_error)
    scale = scale_of(a.get("attn_scale"))
    max_logit = a.get("max_logit")
    if max_logit is not None and scale < 0:
        raise _unsupported("max_logit with a negative attn_scale", "flex's max_logit needs a scale >= 0")
    need_bwd = build_backward or any(t.requires_grad for t in (q, k, v))
    geo, plan = _prepare(q, k, v, a, need_bwd)
    if plan is None:  # no query row or no key: nothing is visible
        o.zero_()
        if stats is not None:
            stats.fill_(-math.inf)
        if max_logit is not None:
            max_logit.fill_(-math.inf)
        return
    qf = _kernel_ready(geo.to_flex_q(q))
    kf = _kernel_ready(geo.to_flex_k(k))
    vf = _kernel_ready(geo.to_flex_k(v))
    of = geo.flex_out_view(o) if o_is_fresh else None
    out, lse, ml = run_forward(qf, kf, vf, plan, scale, max_logit is not None, want_lse=stats is not None, out=of)
    if of is None:
        geo.from_flex_q(out, o)
    if stats is not None:
        geo.lse_to_stats(lse, stats, bool(a.get("stats_use_log2")))
    if max_logit is not None:
        max_logit.copy_(ml.view(max_logit.shape))


def backward(q: Tensor, k: Tensor, v: Tensor, o: Tensor, dO: Tensor, stats: Tensor, dq: Tensor, dk: Tensor,
             dv: Tensor, a: dict, *, unsupported_error=NOT_COMPUTED) -> None:
    """Runs one SDPA backward on the flex engine into dq, dk, dv (shapes and dtypes of q, k, v; padding rows 0).

    ``o`` and ``dO`` have the forward output's layout (padding rows of dO are never read), ``stats`` is the
    forward's natural-log LSE (``(B, H_q, S_q, 1)``; packed q: ``(T_q, H_q, 1)`` or padded
    ``(B, H_q, S_max, 1)``). ``a['use_deterministic_algorithm']`` selects flex's bitwise reproducible backward.
    Raises as :func:`forward`.
    """
    from .execution import run_backward

    check_supported(q, k, v, a, backward=True, unsupported_error=unsupported_error)
    scale = scale_of(a.get("attn_scale"))
    geo, plan = _prepare(q, k, v, a, True)
    if plan is None:
        dq.zero_()
        dk.zero_()
        dv.zero_()
        return
    qf = _kernel_ready(geo.to_flex_q(q))
    kf = _kernel_ready(geo.to_flex_k(k))
    vf = _kernel_ready(geo.to_flex_k(v))
    of = _kernel_ready(geo.to_flex_q(o))
    dof = _kernel_ready(geo.to_flex_q(dO))
    lse = geo.stats_to_lse(stats, q.shape[0])
    dqf, dkf, dvf = run_backward(qf, kf, vf, of, dof, lse, None, plan, scale,
                                 bool(a.get("use_deterministic_algorithm")))
    geo.from_flex_q(dqf, dq)
    geo.from_flex_k(dkf, dk)
    geo.from_flex_k(dvf, dv)
