"""ctypes binding of the SDPA part of the C ABI (flashspan.h, "SDPA" section): slots, attributes, operations."""

from __future__ import annotations

import ctypes
import threading
from collections import OrderedDict
from ctypes import POINTER, c_float, c_int32, c_int64, c_size_t, c_void_p
from typing import Optional

import torch

from . import _lib

# fs_sdpa_slot_t (must match flashspan.h)
Q, K, V, O, STATS, DO, DQ, DK, DV = range(9)
SCORE_MAX, SCORE_SUM_EXP, MAX_LOGIT = 9, 10, 11
ATTN_SCALE, BIAS, DBIAS, BLOCK_MASK = 12, 13, 14, 15
SEQ_LEN_Q, SEQ_LEN_KV, CU_SEQ_LEN_Q, CU_SEQ_LEN_KV = 16, 17, 18, 19
PAGE_TABLE_K, PAGE_TABLE_V = 20, 21
SINK_TOKEN, DSINK_TOKEN = 22, 23
DROPOUT_SEED, DROPOUT_OFFSET, DROPOUT_MASK, DROPOUT_SCALE, DROPOUT_SCALE_INV, RNG_DUMP = 24, 25, 26, 27, 28, 29
GATE, DGATE = 30, 31
RAGGED = {Q: 32, K: 33, V: 34, O: 35, STATS: 36, DO: 37, DQ: 38, DK: 39, DV: 40, PAGE_TABLE_K: 41, PAGE_TABLE_V: 42,
          GATE: 43, DGATE: 44}
DESCALE_Q, DESCALE_K, DESCALE_V, DESCALE_S, SCALE_S, SCALE_O, AMAX_S, AMAX_O = range(45, 53)
DESCALE_O, DESCALE_DO, DESCALE_DP, SCALE_DQ, SCALE_DK, SCALE_DV, SCALE_DP = range(53, 60)
AMAX_DQ, AMAX_DK, AMAX_DV, AMAX_DP = range(60, 64)
NUM_SLOTS = 64

TOP_LEFT, BOTTOM_RIGHT = 0, 1


def alignment_code(value) -> int:
    """The C enum of a ``diagonal_alignment`` argument: TOP_LEFT (default, also for None) or BOTTOM_RIGHT, given as
    an enum with that ``name``, its name as a string (any case), or 0 / 1. ValueError names the argument otherwise."""
    if value is None:
        return TOP_LEFT
    name = getattr(value, "name", value)
    if isinstance(name, str):
        up = name.upper()
        if up in ("TOP_LEFT", "BOTTOM_RIGHT"):
            return TOP_LEFT if up == "TOP_LEFT" else BOTTOM_RIGHT
    if isinstance(value, int) and value in (0, 1):
        return int(value)
    raise ValueError(f"diagonal_alignment: must be TOP_LEFT or BOTTOM_RIGHT, got {value!r}")


def check_packed_end(cu: list, T: int, side: str, name: str) -> None:
    """A packed ``(T, H, D)`` tensor whose samples are placed by the cumulative lengths ``cu`` (host ints; no
    ragged offsets of its own) holds exactly its samples: ``cu[-1]`` must be ``T``, as flex's cu_seqlens rule.
    Tokens past the last sample would be rows no sample writes. Offsets that are not prefix sums (not starting
    at 0, decreasing) are left to the rules of the C layer, which name that."""
    if not cu or cu[0] != 0 or any(b < a for a, b in zip(cu, cu[1:])) or cu[-1] == T:
        return
    raise ValueError(f"cu_seq_len_{side}: must end at the total length {T} ({name}'s T), got {cu[-1]}")


_T = POINTER(_lib.FsTensor)
_H = c_void_p
_st = c_int32

# Tensor setter name -> slot, per direction ("both", "fwd", "bwd").
TENSOR_SETTERS = {
    "attn_scale_tensor": (ATTN_SCALE, "both"),
    "bias": (BIAS, "both"),
    "seq_len_q": (SEQ_LEN_Q, "both"),
    "seq_len_kv": (SEQ_LEN_KV, "both"),
    "cu_seq_len_q": (CU_SEQ_LEN_Q, "both"),
    "cu_seq_len_kv": (CU_SEQ_LEN_KV, "both"),
    "block_mask": (BLOCK_MASK, "both"),
    "rng_dump": (RNG_DUMP, "both"),
    "sink_token": (SINK_TOKEN, "both"),
    "gate": (GATE, "both"),
    "logit_max": (SCORE_MAX, "fwd"),
    "score_sum_exp": (SCORE_SUM_EXP, "fwd"),
    "max_logit": (MAX_LOGIT, "fwd"),
    "paged_attention_k_table": (PAGE_TABLE_K, "fwd"),
    "paged_attention_v_table": (PAGE_TABLE_V, "fwd"),
    "dbias": (DBIAS, "bwd"),
    "dsink_token": (DSINK_TOKEN, "bwd"),
    "dgate": (DGATE, "bwd"),
    "descale_q": (DESCALE_Q, "both"),
    "descale_k": (DESCALE_K, "both"),
    "descale_v": (DESCALE_V, "both"),
    "descale_s": (DESCALE_S, "both"),
    "scale_s": (SCALE_S, "both"),
    "scale_o": (SCALE_O, "fwd"),
    "amax_s": (AMAX_S, "fwd"),
    "amax_o": (AMAX_O, "fwd"),
    "descale_o": (DESCALE_O, "bwd"),
    "descale_do": (DESCALE_DO, "bwd"),
    "descale_dp": (DESCALE_DP, "bwd"),
    "scale_dq": (SCALE_DQ, "bwd"),
    "scale_dk": (SCALE_DK, "bwd"),
    "scale_dv": (SCALE_DV, "bwd"),
    "scale_dp": (SCALE_DP, "bwd"),
    "amax_dq": (AMAX_DQ, "bwd"),
    "amax_dk": (AMAX_DK, "bwd"),
    "amax_dv": (AMAX_DV, "bwd"),
    "amax_dp": (AMAX_DP, "bwd"),
}
_INT_SETTERS = {  # name -> C type of the value
    "alibi_mask": c_int32,
    "padding_mask": c_int32,
    "max_total_seq_len_q": c_int64,
    "max_total_seq_len_kv": c_int64,
    "diagonal_alignment": c_int32,
    "diagonal_band_left_bound": c_int64,
    "diagonal_band_right_bound": c_int64,
    "causal_mask": c_int32,
    "causal_mask_bottom_right": c_int32,
    "sliding_window_length": c_int64,
    "generate_stats": c_int32,
    "is_inference": c_int32,
    "stats_use_log2": c_int32,
    "paged_attention_max_seq_len_kv": c_int64,
    "deterministic_algorithm": c_int32,
}
_FLOAT_SETTERS = ("attn_scale", "softcap")


def _signatures() -> dict:
    """Argument types of every fs_sdpa_* function of flashspan.h (each returns fs_status_t)."""
    sigs = {
        "fs_sdpa_attributes_create": [c_int32, POINTER(_H)],
        "fs_sdpa_attributes_destroy": [_H],
        "fs_sdpa_attributes_set_dropout": [_H, c_float, _T, _T],
        "fs_sdpa_attributes_set_dropout_mask": [_H, _T, _T, _T],
        "fs_sdpa_attributes_set_ragged_offset": [_H, c_int32, _T, c_int64],
        "fs_sdpa_fwd_create": [_T, _T, _T, _T, _T, _H, POINTER(_H)],
        "fs_sdpa_bwd_create": [_T, _T, _T, _T, _T, _T, _T, _T, _T, _H, POINTER(_H)],
    }
    for name in TENSOR_SETTERS:
        sigs[f"fs_sdpa_attributes_set_{name}"] = [_H, _T]
    for name, ctype in _INT_SETTERS.items():
        sigs[f"fs_sdpa_attributes_set_{name}"] = [_H, ctype]
    for name in _FLOAT_SETTERS:
        sigs[f"fs_sdpa_attributes_set_{name}"] = [_H, c_float]
    for d in ("fwd", "bwd"):
        sigs[f"fs_sdpa_{d}_destroy"] = [_H]
        sigs[f"fs_sdpa_{d}_check_support"] = [_H]
        sigs[f"fs_sdpa_{d}_compile"] = [_H]
        sigs[f"fs_sdpa_{d}_workspace_size"] = [_H, POINTER(c_size_t)]
        sigs[f"fs_sdpa_{d}_execute"] = [_H, POINTER(c_void_p), c_int32, c_void_p, c_size_t, c_void_p]
    return sigs


SIGNATURES = _signatures()

_declared = False
_declare_lock = threading.Lock()


def lib() -> ctypes.CDLL:
    """The library with the SDPA functions declared (raises ImportError when the build lacks them)."""
    global _declared
    handle = _lib.lib()
    if _declared:
        return handle
    with _declare_lock:
        if _declared:
            return handle
        try:
            for name, args in SIGNATURES.items():
                fn = getattr(handle, name)
                fn.restype = _st
                fn.argtypes = args
        except AttributeError as e:
            raise ImportError(f"flashspan: {_lib.library_path()} lacks the SDPA C ABI ({e}); rebuild it") from e
        _declared = True
    return handle


class Attributes:
    """An fs_sdpa_attributes_t (owned): options by seed setter name, tensors by slot (descriptors only)."""

    __slots__ = ("handle", "_lib", "_keep")

    def __init__(self, backward: bool):
        self._lib = lib()
        self.handle = _H()
        self._keep = []  # descriptors must outlive nothing (C copies them), kept for debugging only
        _lib.check(self._lib.fs_sdpa_attributes_create(1 if backward else 0, ctypes.byref(self.handle)))

    def __del__(self):
        if getattr(self, "handle", None) and self.handle.value:
            self._lib.fs_sdpa_attributes_destroy(self.handle)
            self.handle = _H()

    def set(self, name: str, value) -> None:
        """set_<name>(value): a tensor setter (TENSOR_SETTERS) takes a TensorDesc, others a number."""
        fn = getattr(self._lib, f"fs_sdpa_attributes_set_{name}")
        if name in TENSOR_SETTERS:
            _lib.check(fn(self.handle, _lib.ptr(value)))
        else:
            _lib.check(fn(self.handle, value))

    def set_dropout(self, probability: float, seed: _lib.TensorDesc, offset: _lib.TensorDesc) -> None:
        _lib.check(self._lib.fs_sdpa_attributes_set_dropout(self.handle, probability, _lib.ptr(seed), _lib.ptr(offset)))

    def set_dropout_mask(self, mask, scale, scale_inv) -> None:
        _lib.check(
            self._lib.fs_sdpa_attributes_set_dropout_mask(self.handle, _lib.ptr(mask), _lib.ptr(scale), _lib.ptr(scale_inv))
        )

    def set_ragged_offset(self, slot: int, offsets: _lib.TensorDesc, multiplier: int) -> None:
        _lib.check(self._lib.fs_sdpa_attributes_set_ragged_offset(self.handle, slot, _lib.ptr(offsets), multiplier))


_Pointers = c_void_p * NUM_SLOTS  # the execute call's data pointers, by slot


class Op:
    """A created, supported and compiled fs_sdpa_fwd_t / fs_sdpa_bwd_t."""

    __slots__ = ("handle", "direction", "_lib", "workspace_bytes", "_execute")

    def __init__(self, direction: str, descs: list, attrs: Attributes):
        self._lib = lib()
        self.direction = direction
        self.handle = _H()
        create = getattr(self._lib, f"fs_sdpa_{direction}_create")
        _lib.check(create(*[_lib.ptr(d) for d in descs], attrs.handle, ctypes.byref(self.handle)))
        status = getattr(self._lib, f"fs_sdpa_{direction}_check_support")(self.handle)
        if status == _lib.STATUS_NOT_SUPPORTED:
            # A feature or configuration the device path does not run (the C layer names it).
            raise NotImplementedError(_lib.last_error())
        _lib.check(status)
        _lib.check(getattr(self._lib, f"fs_sdpa_{direction}_compile")(self.handle))
        n = c_size_t(0)
        _lib.check(getattr(self._lib, f"fs_sdpa_{direction}_workspace_size")(self.handle, ctypes.byref(n)))
        self.workspace_bytes = n.value
        self._execute = getattr(self._lib, f"fs_sdpa_{direction}_execute")

    def __del__(self):
        if getattr(self, "handle", None) and self.handle.value:
            getattr(self._lib, f"fs_sdpa_{self.direction}_destroy")(self.handle)
            self.handle = _H()

    def execute(self, pointers: dict, workspace: Optional[torch.Tensor], stream: Optional[int]) -> None:
        pack = _Pointers()
        for slot, p in pointers.items():
            pack[slot] = p or None
        if workspace is None:
            ws, nbytes = None, 0
        else:
            nbytes = workspace.numel()
            ws = workspace.data_ptr() if nbytes else None
        status = self._execute(self.handle, pack, NUM_SLOTS, ws, nbytes, stream)
        if status:
            _lib.check(status)


class OpCache:
    """Bounded cache of compiled operations keyed by descriptors and options (like the seed's graph cache)."""

    def __init__(self, capacity: int = 128):
        self._ops: OrderedDict = OrderedDict()
        self._lock = threading.Lock()
        self.capacity = capacity

    def get(self, key, build):
        with self._lock:
            op = self._ops.get(key)
            if op is not None:
                self._ops.move_to_end(key)
                return op
        op = build()
        with self._lock:
            self._ops[key] = op
            while len(self._ops) > self.capacity:
                self._ops.popitem(last=False)
        return op
