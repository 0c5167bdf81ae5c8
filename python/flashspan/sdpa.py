"""flashspan.sdpa / sdpa_backward: scaled dot-product attention with the seed's graph.sdpa argument names (eager, autograd)."""

from __future__ import annotations

import ctypes
import enum
import math
import numbers
import operator
import os
import warnings
from collections.abc import Mapping
from typing import Optional, Union

import torch
from torch import Tensor

from . import _lib
from . import _sdpa_lib as L
from ._checks import _short_repr, check_flag, check_float32, dense_grad
from ._sdpa_lib import check_packed_end
from .autograd import no_double_backward

__all__ = ["sdpa", "sdpa_backward", "diagonal_alignment", "TOP_LEFT", "BOTTOM_RIGHT", "dropout_offset_increment"]


class diagonal_alignment(str, enum.Enum):
    """Where the diagonal of the causal / band masks starts (the seed's ``cudnn.diagonal_alignment``).

    ``TOP_LEFT``: row i's diagonal is key i. ``BOTTOM_RIGHT``: key i + S_kv - S_q (the last query row sees the last
    key; the KV-cache convention). Members are strings, so ``"TOP_LEFT"`` / ``"BOTTOM_RIGHT"`` (any case) work too.
    """

    TOP_LEFT = "TOP_LEFT"
    BOTTOM_RIGHT = "BOTTOM_RIGHT"

    def __str__(self) -> str:
        return self.value


TOP_LEFT = diagonal_alignment.TOP_LEFT
BOTTOM_RIGHT = diagonal_alignment.BOTTOM_RIGHT

_CACHE = L.OpCache()
_LOG2E = 1.4426950408889634
_VALIDATED = L.OpCache(256)  # calls whose descriptors passed the C layer's rules (_scale_on_host)

# Where a call runs is the device of its tensors (_route). The variable once chose a Python lowering of pure-mask
# calls onto flex mask plans ("flex", retired with python/flashspan/sdpa_lowering.py, issue 24); it is still read
# per call so that a process that sets it is told, not silently ignored.
ROUTE_ENV = "FLASHSPAN_SDPA_ROUTE"
_ROUTE_ENV_NO_OPS = ("", "native", "reference")


def _route(q: Tensor) -> str:
    """Where a call on q runs: ``"reference"`` (CPU tensors: the SDPA CPU reference of the C layer) or ``"native"``
    (other devices: the C layer's SDPA operation on its GPU kernels). ``FLASHSPAN_SDPA_ROUTE`` (read per call) may
    be unset, ``native`` or ``reference`` (the routes the devices take anyway); ``flex`` (the retired Python
    lowering) or any other value raises ValueError naming the variable."""
    env = _getenv(ROUTE_ENV, _ROUTE_ENV_KEY)
    if env and env.strip().lower() not in _ROUTE_ENV_NO_OPS:
        _route_env_error(env)
    return "reference" if q.device.type == "cpu" else "native"


def _encodekey(name: str):
    try:
        return os.environ.encodekey(name)
    except AttributeError:  # os.environ is not os._Environ
        return name


_ROUTE_ENV_KEY = _encodekey(ROUTE_ENV)


def _getenv(name: str, key) -> Optional[str]:
    """os.environ.get(name) read per call, at a dict lookup's cost: os.environ's own mapping (``_data``, keyed by
    ``key``: ``os.environ.encodekey(name)``) read directly, which skips the Mapping.get / encode / decode calls
    (1 us of the op path on the 2-core VM); os.environ.get when os.environ is not an os._Environ."""
    environ = os.environ
    try:
        value = environ._data.get(key)
    except AttributeError:
        return environ.get(name)
    return None if value is None else environ.decodevalue(value)


def _route_env_error(env: str) -> None:
    if env.strip().lower() == "flex":
        raise ValueError(
            f"{ROUTE_ENV}=flex: the flex route of flashspan.sdpa (the Python lowering of pure-mask calls onto flex "
            "mask plans) was retired (issue 24); every SDPA call runs on the C layer's SDPA operation. Unset "
            f"{ROUTE_ENV}, and for flex attention call flashspan.flex_attn_func with a mask plan "
            "(flashspan.create_mask_plan) instead")
    raise ValueError(f"{ROUTE_ENV}: must be unset, native or reference, got {env!r} (the flex route was retired: "
                     "use flashspan.flex_attn_func for flex attention)")


def dropout_offset_increment(max_seq_len_kv: int) -> int:
    """How far to advance the Philox offset between calls that share a seed so their dropout masks are
    independent: 4 ceil(S_kv / 16) (each Philox counter serves four key columns of a 16-column block;
    docs/SDPA.md)."""
    return 4 * ((_int_arg(max_seq_len_kv, "max_seq_len_kv") + 15) // 16)


# ---------------------------------------------------------------------------
# Descriptors: a tensor seen through a logical 4-D [B, H, S, D] descriptor
# ---------------------------------------------------------------------------


class _Bound:
    """A torch tensor with the 4-D descriptor the C layer sees (THD tensors get [B, H, S_max, D] views)."""

    __slots__ = ("tensor", "shape", "stride")

    def __init__(self, tensor: Tensor, shape=None, stride=None):
        self.tensor = tensor
        self.shape = tuple(tensor.shape) if shape is None else tuple(shape)
        self.stride = tuple(tensor.stride()) if stride is None else tuple(stride)

    def key(self):
        return (self.shape, self.stride, self.tensor.dtype, self.tensor.device)

    def desc(self, name: str) -> _lib.TensorDesc:
        return _lib.TensorDesc.from_spec(self.shape, self.stride, self.tensor.dtype, self.tensor.device, name)

    def ptr(self) -> Optional[int]:
        return self.tensor.data_ptr() or None


_POSITIONAL = {"fwd": (L.Q, L.K, L.V, L.O, L.STATS), "bwd": (L.Q, L.K, L.V, L.O, L.DO, L.STATS, L.DQ, L.DK, L.DV)}
_SETTER_OF_SLOT = {slot: name for name, (slot, _d) in L.TENSOR_SETTERS.items()}
_SLOT_NAMES = {L.Q: "q", L.K: "k", L.V: "v", L.O: "o", L.STATS: "stats", L.DO: "dO", L.DQ: "dQ", L.DK: "dK", L.DV: "dV"}


class _Call:
    """One SDPA call for the C layer: bound tensors by slot, ragged offsets, scalar options, dropout."""

    def __init__(self, direction: str):
        self.direction = direction
        self.slots: dict[int, _Bound] = {}
        self.ragged: dict[int, tuple[_Bound, int]] = {}  # sequence slot -> (offsets, multiplier)
        self.options: list[tuple[str, object]] = []
        self.dropout: Optional[tuple[float, _Bound, _Bound]] = None
        self.dropout_mask: Optional[tuple[_Bound, _Bound, Optional[_Bound]]] = None

    def set(self, slot: int, t: Optional[Tensor], bound: Optional[_Bound] = None) -> None:
        if bound is not None:
            self.slots[slot] = bound
        elif t is not None:
            self.slots[slot] = _Bound(t)

    def option(self, name: str, value) -> None:
        self.options.append((name, value))

    def _key(self):
        # In insertion order (the order of the code path that bound them), not sorted: equal keys still mean equal
        # descriptors; the same call bound in another order only misses the cache.
        return (
            self.direction,
            tuple([(s, b.key()) for s, b in self.slots.items()]),
            tuple([(s, b.key(), m) for s, (b, m) in self.ragged.items()]),
            tuple(self.options),
            None if self.dropout is None else (self.dropout[0], self.dropout[1].key(), self.dropout[2].key()),
            None if self.dropout_mask is None else tuple(None if b is None else b.key() for b in self.dropout_mask),
        )

    def _build(self) -> L.Op:
        attrs, descs = self._attributes()
        return L.Op(self.direction, descs, attrs)

    def validate(self) -> None:
        """Runs the C layer's argument rules on the call's descriptors (fs_sdpa_*_create) without running it (cached by
        the descriptors): before _scale_on_host reads a device scale tensor, so bad input raises the C layer's error."""
        _VALIDATED.get(self._key(), self._create_only)

    def _create_only(self) -> bool:
        attrs, descs = self._attributes()
        lib = L.lib()
        handle = ctypes.c_void_p()
        create = getattr(lib, f"fs_sdpa_{self.direction}_create")
        _lib.check(create(*[_lib.ptr(d) for d in descs], attrs.handle, ctypes.byref(handle)))
        getattr(lib, f"fs_sdpa_{self.direction}_destroy")(handle)
        return True

    def _attributes(self):
        attrs = L.Attributes(self.direction == "bwd")
        for name, value in self.options:
            attrs.set(name, value)
        for slot, b in self.slots.items():
            name = _SETTER_OF_SLOT.get(slot)
            if name is not None:
                attrs.set(name, b.desc(name))
        if self.dropout is not None:
            p, seed, offset = self.dropout
            attrs.set_dropout(p, seed.desc("dropout seed"), offset.desc("dropout offset"))
        if self.dropout_mask is not None:
            mask, scale, scale_inv = self.dropout_mask
            attrs.set_dropout_mask(
                mask.desc("dropout mask"), scale.desc("dropout scale"), None if scale_inv is None else scale_inv.desc("x")
            )
        for slot, (b, mult) in self.ragged.items():
            attrs.set_ragged_offset(slot, b.desc("ragged offset"), mult)
        descs = []
        for slot in _POSITIONAL[self.direction]:
            b = self.slots.get(slot)
            descs.append(None if b is None else b.desc(_SLOT_NAMES[slot]))
        return attrs, descs

    def run(self) -> L.Op:
        """Runs the call on its (cached) operation; returns that operation."""
        op = _CACHE.get(self._key(), self._build)
        _execute(op, self.slots[L.Q].tensor, self.pointers())
        return op

    def pointers(self) -> dict:
        """slot -> data pointer (None for NULL) of every tensor the call binds."""
        pointers = {s: b.ptr() for s, b in self.slots.items()}
        if self.dropout is not None:
            pointers[L.DROPOUT_SEED] = self.dropout[1].ptr()
            pointers[L.DROPOUT_OFFSET] = self.dropout[2].ptr()
        if self.dropout_mask is not None:
            pointers[L.DROPOUT_MASK] = self.dropout_mask[0].ptr()
            pointers[L.DROPOUT_SCALE] = self.dropout_mask[1].ptr()
            if self.dropout_mask[2] is not None:
                pointers[L.DROPOUT_SCALE_INV] = self.dropout_mask[2].ptr()
        for slot, (b, _m) in self.ragged.items():
            pointers[L.RAGGED[slot]] = b.ptr()
        return pointers


def _execute(op: L.Op, q: Tensor, pointers: dict) -> None:
    """Executes ``op`` on the tensors at ``pointers`` on q's device and current stream (with a fresh workspace)."""
    workspace = None
    if op.workspace_bytes:
        workspace = torch.empty(op.workspace_bytes, dtype=torch.uint8, device=q.device)
    _lib.on_device(q, op.execute, pointers, workspace, _lib.stream_of(q))


# ---------------------------------------------------------------------------
# Per-signature fast path (issue 24, "Host cost")
# ---------------------------------------------------------------------------
#
# Without packed (THD) tensors, ragged offsets or dropout, everything the Python layer does for a call (the _Layout,
# the bound descriptors, the options, the _CACHE key and so the operation, every Python check) depends only on the
# call's signature: the shapes, strides, dtypes and devices of its tensors and the values of its other arguments
# (their types too: 1 and True and 1.0 are different signatures; the route follows from the devices). The first
# call of a signature takes the full path (every check, the C layer's create-time rules); when it runs, the fast
# path remembers what it bound: the operation, which argument feeds which slot, how the outputs were allocated. A
# later call of the same signature allocates the outputs, gathers the data pointers and executes (the C layer's
# execute-time checks run as before). A call whose full path raised is never remembered, so bad input raises the
# same error every time. Not remembered either (full path on every call): packed tensors, ragged offsets, dropout,
# arguments of other types (tuples, dicts, foreign enums, tensor subclasses), and calls whose bound tensors are not
# the arguments themselves (a non-contiguous sink_token copied, a device attn_scale read on the host by
# _scale_on_host): _remember checks that the pointers it would gather are those the full path bound.

_FAST_CAPACITY = 256
_FAST: dict = {}  # signature -> _FastEntry
_FAST_TENSORS = frozenset((Tensor, torch.nn.Parameter))
_FAST_TYPES = frozenset((type(None), bool, int, float, str, diagonal_alignment)) | _FAST_TENSORS
# Keyword tensors bound as they are (by data pointer) when given, by argument name.
_FAST_NAMED = (
    ("attn_scale", L.ATTN_SCALE), ("bias", L.BIAS), ("block_mask", L.BLOCK_MASK), ("seq_len_q", L.SEQ_LEN_Q),
    ("seq_len_kv", L.SEQ_LEN_KV), ("cu_seq_len_q", L.CU_SEQ_LEN_Q), ("cu_seq_len_kv", L.CU_SEQ_LEN_KV),
    ("rng_dump", L.RNG_DUMP), ("sink_token", L.SINK_TOKEN), ("gate", L.GATE), ("score_max", L.SCORE_MAX),
    ("score_sum_exp", L.SCORE_SUM_EXP), ("max_logit", L.MAX_LOGIT), ("paged_attention_k_table", L.PAGE_TABLE_K),
    ("paged_attention_v_table", L.PAGE_TABLE_V), ("dBias", L.DBIAS), ("dSink_token", L.DSINK_TOKEN),
    ("dgate", L.DGATE),
)


class _FastEntry:
    """What the full path bound for one signature: the operation, slot -> index of the positional tensors, slot ->
    keyword argument, and (index, shape, stride, dtype) of each positional output it allocated."""

    __slots__ = ("op", "pos", "named", "allocs")

    def __init__(self, op, pos, named, allocs):
        self.op, self.pos, self.named, self.allocs = op, pos, named, allocs

    def pointers(self, tensors, kw: dict) -> dict:
        """slot -> data pointer (None for NULL) of the positional ``tensors`` and keyword tensors this entry binds."""
        pointers = {slot: tensors[i].data_ptr() or None for slot, i in self.pos}
        for slot, name in self.named:
            pointers[slot] = kw[name].data_ptr() or None
        return pointers

    def run(self, tensors: tuple, kw: dict) -> tuple:
        q = tensors[0]
        if self.allocs:
            tensors = list(tensors)
            dev = q.device
            for i, shape, stride, dtype in self.allocs:
                tensors[i] = torch.empty_strided(shape, stride, dtype=dtype, device=dev)
        _execute(self.op, q, self.pointers(tensors, kw))
        return tensors


def _fast_key(direction: str, tensors: tuple, stats_needed, kw: Optional[dict]):
    """The signature of a call (``tensors``: the positional tensors, q first, None where not given), or None when
    the call takes the full path every time.

    The one place of the tensor part of both fast paths' keys: the engine's (``direction`` "fwd" / "bwd", ``kw`` its
    keyword arguments; a packed THD tensor, not 4-D, is not eligible) and the ops' (sdpa_ops._op_key, this function:
    ``direction`` the op's name, ``stats_needed`` its other arguments' values, ``kw`` None: no keyword part, tensors
    of any rank)."""
    parts = [direction, stats_needed]
    append = parts.append
    engine = kw is not None
    for t in tensors:
        if t is None:
            append(None)
        elif type(t) in _FAST_TENSORS:
            shape = t.shape
            if engine and len(shape) != 4:
                return None  # packed (THD)
            append((shape, t.stride(), t.dtype, t.device))
        else:
            return None  # not a plain tensor
    if not engine:
        return tuple(parts)
    # The keyword arguments: their names, types and values (tensors: their layouts), tuples built at C speed; the
    # loop over the values runs only when a keyword argument is a tensor.
    vals = tuple(kw.values())
    types = tuple(map(type, vals))
    if not _FAST_TYPES.issuperset(types):
        return None  # dropout / ragged_offsets (tuples, dicts) and anything else
    if not _FAST_TENSORS.isdisjoint(types):
        vals = tuple([(v.shape, v.stride(), v.dtype, v.device) if tp in _FAST_TENSORS else v
                      for v, tp in zip(vals, types)])
    if tensors[0] is None:
        return None  # no q: the full path names it (TypeError)
    _route(tensors[0])  # FLASHSPAN_SDPA_ROUTE's check (per call); the route itself follows from the devices
    append(tuple(kw))
    append(types)
    append(vals)
    return tuple(parts)


def _remember(key, call: _Call, op: L.Op, given: tuple, bound: tuple, kw: dict) -> None:
    """Remembers the call's binding for its signature ``key`` (None: not eligible), if the fast path would bind the
    same pointers. ``given``: the positional tensors as the caller passed them, ``bound``: after the full path
    allocated its outputs (the positions in the order of the direction's slots)."""
    if key is None:
        return
    slots = _POSITIONAL[call.direction]
    pos = tuple((slot, i) for i, (slot, t) in enumerate(zip(slots, bound)) if t is not None)
    named = tuple((slot, name) for name, slot in _FAST_NAMED if isinstance(kw.get(name), Tensor))
    allocs = tuple((i, tuple(t.shape), t.stride(), t.dtype) for i, (g, t) in enumerate(zip(given, bound))
                   if g is None and t is not None)
    entry = _FastEntry(op, pos, named, allocs)
    if entry.pointers(bound, kw) != call.pointers():
        return  # a tensor bound per call (a copy, a host-read scale): full path each time
    if len(_FAST) >= _FAST_CAPACITY:
        _FAST.clear()
    _FAST[key] = entry


# ---------------------------------------------------------------------------
# Argument canonicalisation shared by forward and backward
# ---------------------------------------------------------------------------


def _float_arg(x, name: str) -> float:
    """``x`` as a float for an argument the C layer takes as a float (softcap, the dropout probability): a real number
    (int, float, NumPy scalar, anything with ``__float__``), not a bool or a string (``float("2")`` would parse it).
    TypeError naming the argument otherwise, as the seed's graph.sdpa (pybind11) refuses an argument of another type.
    A finite value past float32's range is a ValueError (check_float32: the C layer would see inf); its other rules
    (finite, positive, in [0, 1), ...) are the C layer's. (attn_scale keeps its own check: a scale that
    is not a finite number is a ValueError, flex's softmax_scale class, docs/ERRORS.md.)"""
    if type(x) is float:
        return check_float32(x, name)
    if not isinstance(x, (bool, str, bytes)) and hasattr(type(x), "__float__"):
        try:
            value = float(x)
        except OverflowError:  # an int past float64's range: check_float32 names it
            return check_float32(x, name)
        except (TypeError, ValueError, RuntimeError):
            pass  # e.g. a tensor of several elements
        else:
            return check_float32(value, name)
    raise TypeError(f"{name}: must be a real number (float), got {type(x).__name__} {x!r}")


_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


def _int_arg(x, name: str, what: str = "an int") -> int:
    """``x`` as an int for an argument the C layer takes as an integer (the band bounds, sliding_window_length, the
    packed and paged length maxima, Philox seed and offset): an integer (int, NumPy integer, anything with
    ``__index__``), not a bool, a float (``int(2.5)`` would truncate it) or a string. TypeError naming the argument
    otherwise, as the seed's graph.sdpa (pybind11). The C layer takes int64 (ctypes would wrap a larger value modulo
    2**64: a bound of 2**64 + 2 ran as 2), so a value outside int64 is a ValueError naming the argument; its other
    rules are the C layer's."""
    if type(x) is not int:
        if isinstance(x, bool):
            raise TypeError(f"{name}: must be {what}, got bool {x!r}")
        try:
            x = operator.index(x)
        except (TypeError, ValueError, RuntimeError):
            raise TypeError(f"{name}: must be {what}, got {type(x).__name__} {x!r}") from None
    if _INT64_MIN <= x <= _INT64_MAX:
        return x
    raise ValueError(f"{name}: {x} does not fit int64 (must be in [-2**63, 2**63 - 1])")


def _tensor_arg(x, name: str, device: torch.device, dtype) -> Optional[Tensor]:
    """A tensor argument that may also be given as a number, made a 1-element tensor of ``dtype`` on ``device``:
    int64 takes an integer (_int_arg: a float seed is not truncated), float32 a real number."""
    if x is None:
        return None
    if isinstance(x, Tensor):
        return x
    if dtype == torch.int64:
        return torch.tensor([_int_arg(x, name, "an int or an int32 / int64 tensor")], dtype=dtype, device=device)
    if isinstance(x, numbers.Real) and not isinstance(x, bool):
        return torch.tensor([check_float32(x, name)], dtype=dtype, device=device)
    raise TypeError(f"{name}: must be a torch.Tensor or a number, got {type(x).__name__}")


# The keyword arguments that take a tensor or None only (flashspan.sdpa / sdpa_backward; the full path checks them
# first, so a list or a number gets a TypeError naming the argument rather than an AttributeError from inside).
_TENSOR_KWARGS = ("bias", "dBias", "block_mask", "seq_len_q", "seq_len_kv", "cu_seq_len_q", "cu_seq_len_kv", "rng_dump",
                  "paged_attention_k_table", "paged_attention_v_table", "score_max", "score_sum_exp", "max_logit",
                  "sink_token", "dSink_token", "gate", "dgate")


def _check_tensor_kwargs(kw: dict) -> None:
    for name in _TENSOR_KWARGS:
        x = kw.get(name)
        if x is not None and not isinstance(x, Tensor):
            raise TypeError(f"{name}: must be a torch.Tensor or None, got {type(x).__name__}")


# The flags of flashspan.sdpa / sdpa_backward's engine (the full path checks them first, with check_flag: a string
# "false" is truthy, 1.5 is a number; TypeError naming the flag). generate_stats may also be None (its default).
_FWD_FLAGS = ("use_alibi_mask", "use_padding_mask", "use_causal_mask", "use_causal_mask_bottom_right",
              "stats_use_log2", "generate_stats")
_BWD_FLAGS = ("use_alibi_mask", "use_padding_mask", "use_causal_mask", "use_causal_mask_bottom_right",
              "use_deterministic_algorithm")


def _check_flags(kw: dict, names: tuple) -> None:
    """Each flag of ``names`` in ``kw`` made a Python bool (a NumPy bool converted), or a TypeError naming it. The
    full path only: the fast path's key holds the type of every keyword argument, so a call with a flag of another
    type never reuses a remembered call's binding, and a call whose full path raised is never remembered."""
    for name in names:
        value = kw[name]
        if value.__class__ is not bool:
            kw[name] = check_flag(name, value, none_ok=name == "generate_stats")


def _max_len(lengths: Optional[Tensor], cu: Optional[Tensor], given: Optional[int], side: str) -> int:
    """S_max of a THD side: the given value, else the longest sample (one host read)."""
    if given is not None:
        return _int_arg(given, f"max_seq_len_{side}")
    if cu is not None:
        c = cu.reshape(-1).to(torch.int64)
        return int((c[1:] - c[:-1]).max().item()) if c.numel() > 1 else 0
    if lengths is not None:
        return int(lengths.reshape(-1).max().item()) if lengths.numel() else 0
    raise ValueError(f"max_seq_len_{side}: a 3-D (T, H, D) tensor needs sequence lengths (cu_seq_len_{side})")


def _dense_max_len(given, side: str, S: Optional[int]) -> None:
    """max_seq_len_q / max_seq_len_kv given for a dense (B, H, S, D) side, where it has no use (it is S_max of packed
    THD tensors): an int (TypeError otherwise, as on THD sides) equal to that side's S when it is known (ValueError
    otherwise, as create_mask_plan's max_seqlen_q / max_seqlen_k for BSHD), never silently ignored."""
    if given is None:
        return
    value = _int_arg(given, f"max_seq_len_{side}")
    if S is not None and value != S:
        raise ValueError(f"max_seq_len_{side}: must equal S_{side} = {S} of the dense (B, H, S, D) "
                         f"{'q' if side == 'q' else 'k, v'} (it gives S_max of packed (T, H, D) tensors), got {value}")


_RAGGED_NAMES = ("q", "k", "v", "o", "stats", "dO", "dQ", "dK", "dV", "gate", "dgate", "paged_attention_k_table",
                 "paged_attention_v_table")


def _ragged_offsets_arg(ragged_offsets) -> dict:
    """``ragged_offsets`` as a dict {tensor name: offsets tensor}: None is {}; TypeError naming the argument for
    anything but a mapping of tensors (a list of offsets was a TypeError about dict's update, a list value an
    AttributeError), ValueError for an unknown tensor name. The offsets' dtype, shape and values are the C layer's
    rules and bind_seq's host checks."""
    if ragged_offsets is None:
        return {}
    if not isinstance(ragged_offsets, Mapping):
        raise TypeError(f"ragged_offsets: must be a dict {{tensor name: int32 / int64 tensor of token offsets (B + 1,)}}"
                        f", e.g. {{'q': torch.tensor([0, 4, 10])}}, got {type(ragged_offsets).__name__} "
                        f"{_short_repr(ragged_offsets)}")
    offsets = dict(ragged_offsets)
    unknown = set(offsets) - set(_RAGGED_NAMES)
    if unknown:
        raise ValueError(f"ragged_offsets: unknown tensor name(s) {sorted(unknown, key=str)}")
    for name, t in offsets.items():
        if not isinstance(t, Tensor):
            raise TypeError(f"ragged_offsets: {name!r}: must be a torch.Tensor (int32 / int64 token offsets, shape "
                            f"(B + 1,)), got {type(t).__name__} {_short_repr(t)}")
    return offsets


class _Layout:
    """Sizes of one call and how its THD (3-D) tensors map to [B, H, S_max, D] descriptors."""

    def __init__(self, q: Tensor, k: Tensor, v: Tensor, seq_len_q, seq_len_kv, cu_q, cu_kv, ragged_offsets,
                 max_seq_len_q, max_seq_len_kv, paged: bool):
        for name, t in (("q", q), ("k", k), ("v", v)):
            if not isinstance(t, Tensor):
                raise TypeError(f"{name}: must be a torch.Tensor, got {type(t).__name__}")
        self.ragged_offsets = _ragged_offsets_arg(ragged_offsets)
        self.paged = paged
        self.thd_q = q.dim() == 3
        self.thd_kv = k.dim() == 3 and not paged
        if k.dim() != v.dim() and not paged:  # paged containers: the C layer names their layout
            raise ValueError(f"k, v: must both be 4-D (B, H, S, D) or both 3-D (T, H, D), got {k.dim()}-D and {v.dim()}-D")
        self.cu_q, self.cu_kv = cu_q, cu_kv
        self.seq_len_q, self.seq_len_kv = seq_len_q, seq_len_kv
        if self.thd_q:
            if cu_q is None and "q" not in self.ragged_offsets:
                raise ValueError("q: a 3-D (T, H, D) tensor is packed (THD): pass cu_seq_len_q (token offsets), or "
                                 "seq_len_q with ragged_offsets={'q': token offsets}")
            lens = seq_len_q if seq_len_q is not None else None
            self.B = (cu_q.numel() - 1) if cu_q is not None else lens.numel()
            self.Sq = _max_len(seq_len_q, cu_q, max_seq_len_q, "q")
        else:
            if q.dim() != 4:
                raise ValueError(f"q: must be 4-D (B, H_q, S_q, D_qk) or 3-D (T, H_q, D_qk), got shape {tuple(q.shape)}")
            self.B, self.Sq = q.shape[0], q.shape[2]
            _dense_max_len(max_seq_len_q, "q", q.shape[2])
        if self.thd_kv:
            if cu_kv is None and "k" not in self.ragged_offsets:
                raise ValueError("k: a 3-D (T, H, D) tensor is packed (THD): pass cu_seq_len_kv (token offsets), or "
                                 "seq_len_kv with ragged_offsets={'k': ..., 'v': ...}")
            self.Skv = _max_len(seq_len_kv, cu_kv, max_seq_len_kv, "kv")
        else:
            self.Skv = None
            # (a paged container's dim 2 is its block size: only the type is checked there)
            _dense_max_len(max_seq_len_kv, "kv", k.shape[2] if k.dim() == 4 and not paged else None)

    def bind_seq(self, call: _Call, slot: int, t: Optional[Tensor], name: str, thd: bool) -> None:
        """Binds a sequence tensor: 4-D as is, 3-D (T, H, D) as a ragged [B, H, S_max, D] descriptor."""
        if t is None:
            return
        if not thd:
            if t.dim() != 4:
                form = "(B, H_q, S_q, 1)" if name == "stats" else "(B, H, S, D) like q"
                raise ValueError(f"{name}: must be 4-D {form}, got shape {tuple(t.shape)}")
            call.set(slot, t)
            return
        if t.dim() != 3:
            raise ValueError(f"{name}: must be 3-D (T, H, D) like q (THD), got shape {tuple(t.shape)}")
        side_q = slot in (L.Q, L.O, L.STATS, L.DO, L.DQ, L.GATE, L.DGATE)
        s_max = self.Sq if side_q else self.Skv
        T, H, D = t.shape
        call.set(slot, None, _Bound(t, (self.B, H, s_max, D), (0, t.stride(1), t.stride(0), t.stride(2))))
        # A tensor without its own ragged offsets shares those of the tensor it mirrors (o, stats, dO, dQ: q;
        # dK: k; dV: v; dgate: gate), else its side's cumulative lengths (fully packed).
        offsets = self.ragged_offsets.get(name)
        source = {"o": "q", "stats": "q", "dO": "q", "dQ": "q", "dK": "k", "dV": "v", "dgate": "gate"}.get(name)
        if offsets is None and source is not None:
            offsets = self.ragged_offsets.get(source)
        if offsets is None and name == "dgate":
            offsets = self.ragged_offsets.get("q")
        packed_by_cu = offsets is None  # the cumulative lengths are also the packing: samples fill the tensor
        if offsets is None:
            offsets = self.cu_q if side_q else self.cu_kv
        if offsets is None:
            raise ValueError(f"{name}: a packed (T, H, D) tensor needs ragged offsets or cu_seq_len_"
                             f"{'q' if side_q else 'kv'}")
        if t.device.type == "cpu" and offsets.device.type == "cpu" and offsets.numel() and T >= 0:
            # Host check that every sample fits in the packed tensor (GPU calls skip it: it would sync).
            o = offsets.reshape(-1).to(torch.int64)
            if packed_by_cu:
                check_packed_end(o.tolist(), T, "q" if side_q else "kv", name)
            if o.numel() and int(o[-1].item()) > T:
                raise ValueError(f"{name}: the ragged offsets reach token {int(o[-1].item())} but the packed tensor has "
                                 f"T = {T} tokens")
            # Each sample's rows [offset, offset + length) must lie inside the packed tensor too.
            lens, cu = (self.seq_len_q, self.cu_q) if side_q else (self.seq_len_kv, self.cu_kv)
            if cu is not None and cu.device.type == "cpu":
                lens = cu.reshape(-1).to(torch.int64).diff()
            if lens is not None and lens.device.type == "cpu" and lens.numel() == o.numel() - 1:
                ends = o[:-1] + lens.reshape(-1).to(torch.int64)
                bad = torch.nonzero((ends > T) | (o[:-1] < 0)).reshape(-1)
                if bad.numel():
                    b = int(bad[0])
                    raise ValueError(f"{name}: the ragged offsets place sample {b}'s rows [{int(o[b])}, {int(ends[b])}) "
                                     f"outside the packed tensor's T = {T} tokens")
                if not packed_by_cu:  # (cumulative lengths place the samples one after another: the C layer's rules)
                    _check_no_shared_rows(name, o[:-1], ends)
        call.ragged[slot] = (_Bound(offsets.reshape(-1)), t.stride(0))


def _check_no_shared_rows(name: str, starts: Tensor, ends: Tensor) -> None:
    """Host check (CPU tensors) that no two samples of a packed tensor share a row: sample b holds the rows
    [starts[b], ends[b]). Interleaved tokens are not supported (the spec's ragged layout): an output sample placed over
    another overwrote it, silently. Empty samples hold no row."""
    keep = torch.nonzero(ends > starts).reshape(-1)
    if keep.numel() < 2:
        return
    order = keep[torch.argsort(starts[keep], stable=True)]
    s, e = starts[order], ends[order]
    # Sorted by start, two samples overlap only if some sample ends past the start of the next one.
    clash = torch.nonzero(e[:-1] > s[1:]).reshape(-1)
    if clash.numel():
        i = int(clash[0])
        a, b = sorted((int(order[i]), int(order[i + 1])))
        raise ValueError(f"{name}: the ragged offsets place samples {a} and {b} on shared rows (sample {a}: rows "
                         f"[{int(starts[a])}, {int(ends[a])}), sample {b}: rows [{int(starts[b])}, {int(ends[b])})): "
                         f"each sample needs rows of its own (interleaved tokens are not supported)")


def _apply_common(call: _Call, lay: _Layout, q: Tensor, *, attn_scale, bias, block_mask, use_alibi_mask,
                  use_padding_mask, seq_len_q, seq_len_kv, cu_seq_len_q, cu_seq_len_kv, diagonal_alignment,
                  diagonal_band_left_bound, diagonal_band_right_bound, dropout, rng_dump, max_total_seq_len_q,
                  max_total_seq_len_kv, sink_token, softcap, gate, use_causal_mask, use_causal_mask_bottom_right,
                  sliding_window_length, backward: bool) -> None:
    dev = q.device
    if isinstance(attn_scale, Tensor):
        call.set(L.ATTN_SCALE, attn_scale.reshape(-1) if attn_scale.dim() == 0 else attn_scale)
    elif attn_scale is not None:
        if isinstance(attn_scale, bool) or not isinstance(attn_scale, numbers.Real):
            # ValueError, as flex's softmax_scale (the seed's class for a scale that is not a finite number).
            raise ValueError(f"attn_scale: must be a finite float, a 1-element float32 tensor or None, got "
                             f"{type(attn_scale).__name__} {attn_scale!r}")
        call.option("attn_scale", check_float32(attn_scale, "attn_scale"))
    call.set(L.BIAS, bias)
    call.set(L.BLOCK_MASK, block_mask)
    if use_alibi_mask:
        call.option("alibi_mask", 1)
    if use_padding_mask:
        call.option("padding_mask", 1)
    for slot, t in ((L.SEQ_LEN_Q, seq_len_q), (L.SEQ_LEN_KV, seq_len_kv), (L.CU_SEQ_LEN_Q, cu_seq_len_q),
                    (L.CU_SEQ_LEN_KV, cu_seq_len_kv)):
        if t is not None:
            call.set(slot, t.reshape(-1) if t.dim() == 0 else t)
    call.option("diagonal_alignment", L.alignment_code(diagonal_alignment))
    # Deprecated spellings first, so explicit bounds given alongside keep the seed's precedence.
    if use_causal_mask:
        call.option("causal_mask", 1)
    if use_causal_mask_bottom_right:
        call.option("causal_mask_bottom_right", 1)
    if diagonal_band_left_bound is not None:
        diagonal_band_left_bound = _int_arg(diagonal_band_left_bound, "diagonal_band_left_bound")
    if sliding_window_length is not None:
        sliding_window_length = _int_arg(sliding_window_length, "sliding_window_length")
        if diagonal_band_left_bound is not None and diagonal_band_left_bound != sliding_window_length:
            raise ValueError(
                f"sliding_window_length, diagonal_band_left_bound: both set the left bound (sliding_window_length is "
                f"the deprecated spelling of diagonal_band_left_bound) but disagree, got {sliding_window_length} and "
                f"{diagonal_band_left_bound}; pass only diagonal_band_left_bound")
        call.option("sliding_window_length", sliding_window_length)
    if diagonal_band_left_bound is not None:
        call.option("diagonal_band_left_bound", diagonal_band_left_bound)
    if diagonal_band_right_bound is not None:
        call.option("diagonal_band_right_bound", _int_arg(diagonal_band_right_bound, "diagonal_band_right_bound"))
    if max_total_seq_len_q is not None:
        call.option("max_total_seq_len_q", _int_arg(max_total_seq_len_q, "max_total_seq_len_q"))
    if max_total_seq_len_kv is not None:
        call.option("max_total_seq_len_kv", _int_arg(max_total_seq_len_kv, "max_total_seq_len_kv"))
    if dropout is not None:
        if not isinstance(dropout, (tuple, list)) or len(dropout) not in (2, 3):
            raise ValueError("dropout: must be (probability, seed, offset) or (mask, scale)"
                             + (" or (mask, scale, scale_inv)" if backward else ""))
        if isinstance(dropout[0], Tensor):
            mask, scale = dropout[0], _tensor_arg(dropout[1], "dropout scale", dev, torch.float32)
            scale_inv = _tensor_arg(dropout[2], "dropout scale_inv", dev, torch.float32) if len(dropout) == 3 else None
            call.dropout_mask = (_Bound(mask if mask.dtype != torch.bool else mask.view(torch.uint8)),
                                 _Bound(scale.reshape(-1)), None if scale_inv is None else _Bound(scale_inv.reshape(-1)))
        else:
            if len(dropout) != 3:
                raise ValueError("dropout: the Philox form is (probability, seed, offset)")
            seed = _tensor_arg(dropout[1], "dropout seed", dev, torch.int64)
            offset = _tensor_arg(dropout[2], "dropout offset", dev, torch.int64)
            call.dropout = (_float_arg(dropout[0], "dropout probability"), _Bound(seed.reshape(-1)),
                            _Bound(offset.reshape(-1)))
    call.set(L.RNG_DUMP, rng_dump)
    if sink_token is not None:
        call.set(L.SINK_TOKEN, sink_token.reshape(-1) if sink_token.is_contiguous() else sink_token.contiguous().reshape(-1))
    if softcap is not None:
        call.option("softcap", _float_arg(softcap, "softcap"))
    lay.bind_seq(call, L.GATE, gate, "gate", lay.thd_q)


def _like_layout(shape, like: Tensor, dtype, device) -> Tensor:
    """An empty tensor of ``shape`` whose dims are ordered in memory like ``like``'s (O adopts Q's layout)."""
    like_stride = like.stride()
    key = (shape, like_stride)
    try:
        stride = _LIKE_STRIDES.get(key)
    except TypeError:  # symbolic sizes (torch.compile's fake tensors) are not hashable: no memo
        stride = key = None
    if stride is None:
        stride = _like_strides(shape, like_stride)
        if key is not None:
            if len(_LIKE_STRIDES) >= 256:
                _LIKE_STRIDES.clear()
            _LIKE_STRIDES[key] = stride
    if stride is _PLAIN:
        return torch.empty(shape, dtype=dtype, device=device)
    return torch.empty_strided(shape, stride, dtype=dtype, device=device)


_PLAIN = ()  # _like_strides: torch.empty's own (contiguous) strides
_LIKE_STRIDES: dict = {}  # (shape, like's strides) -> _like_strides (a pure function of the two)


def _like_strides(shape: tuple, like_stride: tuple):
    """Strides of ``shape`` with its dims ordered in memory as strides ``like_stride`` order theirs (innermost: the
    smallest stride, ties by the later dim), or _PLAIN when ``like`` has a zero stride or another rank."""
    if 0 in like_stride or len(like_stride) != len(shape):
        return _PLAIN
    order = sorted(range(len(like_stride)), key=lambda d: (like_stride[d], -d))  # innermost first
    stride = [0] * len(shape)
    acc = 1
    for d in order:
        stride[d] = acc
        acc *= shape[d]
    return tuple(stride)


# ---------------------------------------------------------------------------
# Eager forward / backward on the C layer
# ---------------------------------------------------------------------------


def _check_packed_table(table: Tensor, offsets: Tensor, container: Tensor, kw: dict, name: str) -> None:
    """Host check (CPU tensors) that a packed page table's memory holds every page its samples read: the C layer
    sees only the [B, 1, max_pages, 1] descriptor, so an offset past the table's storage was read out of bounds."""
    lens, cu = kw.get("seq_len_kv"), kw.get("cu_seq_len_kv")
    if table.device.type != "cpu" or offsets.device.type != "cpu" or container.dim() != 4:
        return
    if cu is not None and cu.device.type == "cpu":
        lens = cu.reshape(-1).to(torch.int64).diff()
    if lens is None or lens.device.type != "cpu":
        return
    o = offsets.reshape(-1).to(torch.int64)
    lens = lens.reshape(-1).to(torch.int64)
    if o.numel() < lens.numel():
        return  # the C layer names the offsets' shape
    bs = max(int(container.shape[2]), 1)
    pages = (lens.clamp(min=0) + bs - 1) // bs
    avail = table.untyped_storage().nbytes() // table.element_size() - table.storage_offset()
    step = max(int(table.stride(2)), 1)
    last = (o[: lens.numel()] + pages - 1) * step  # entry of each sample's last page
    bad = torch.nonzero((pages > 0) & ((last >= avail) | (o[: lens.numel()] < 0))).reshape(-1)
    if bad.numel():
        b = int(bad[0])
        raise ValueError(f"{name}: the ragged offsets place sample {b}'s {int(pages[b])} page entries at "
                         f"[{int(o[b])}, {int(o[b] + pages[b])}), outside the table's {avail // step} entries")


def _forward(q, k, v, *, stats_needed: bool, o: Optional[Tensor] = None, stats: Optional[Tensor] = None,
             _no_grad: bool = False, **kw):
    """Runs one forward; returns (o, stats or None). ``kw`` holds the remaining graph.sdpa arguments.

    CPU tensors run the CPU reference of the C layer, CUDA tensors its SDPA GPU kernels (the native route), after the
    same argument checks (:func:`_route`). ``_no_grad``: the full path runs under torch.no_grad() (the fast path
    records nothing for autograd either way: it only allocates and executes)."""
    return _forward_kw(q, k, v, stats_needed, kw, o, stats, _no_grad)


def _forward_kw(q, k, v, stats_needed: bool, kw: dict, o: Optional[Tensor] = None, stats: Optional[Tensor] = None,
                _no_grad: bool = False):
    """:func:`_forward` with the keyword arguments as a dict the call owns (the full path pops from it): callers
    that build that dict anyway (the custom ops) pass it without another copy."""
    given = (q, k, v, o, stats)
    key = _fast_key("fwd", given, stats_needed, kw)
    if key is not None:
        entry = _FAST.get(key)
        if entry is not None:
            bound = entry.run(given, kw)
            return bound[3], bound[4]
    if _no_grad:
        with torch.no_grad():
            return _forward_full(key, given, stats_needed, kw)
    return _forward_full(key, given, stats_needed, kw)


def _forward_full(key, given: tuple, stats_needed: bool, kw: dict):
    """_forward's full path (``key``: the call's _fast_key, remembered if it runs)."""
    q, k, v, o, stats = given
    _check_tensor_kwargs(kw)
    _check_flags(kw, _FWD_FLAGS)
    kw_in = kw.copy()
    lay = _Layout(q, k, v, kw["seq_len_q"], kw["seq_len_kv"], kw["cu_seq_len_q"], kw["cu_seq_len_kv"],
                  kw.pop("ragged_offsets"), kw.pop("max_seq_len_q"), kw.pop("max_seq_len_kv"),
                  kw["paged_attention_k_table"] is not None or kw["paged_attention_v_table"] is not None)
    call = _Call("fwd")
    lay.bind_seq(call, L.Q, q, "q", lay.thd_q)
    if lay.paged:
        # Paged containers [num_blocks, H, block_size, D] (or a dense side) as they are: the C layer checks and names
        # each side's layout (its page table's or the dense one).
        call.set(L.K, k)
        call.set(L.V, v)
    else:
        lay.bind_seq(call, L.K, k, "k", lay.thd_kv)
        lay.bind_seq(call, L.V, v, "v", lay.thd_kv)
    dv = v.shape[-1]
    if o is None:
        o = (torch.empty((q.shape[0], q.shape[1], dv), dtype=q.dtype, device=q.device) if lay.thd_q
             else _like_layout((q.shape[0], q.shape[1], q.shape[2], dv), q, q.dtype, q.device))
    lay.bind_seq(call, L.O, o, "o", lay.thd_q)
    if stats_needed and stats is None:
        stats = (torch.empty((q.shape[0], q.shape[1], 1), dtype=torch.float32, device=q.device) if lay.thd_q
                 else torch.empty((q.shape[0], q.shape[1], q.shape[2], 1), dtype=torch.float32, device=q.device))
    lay.bind_seq(call, L.STATS, stats, "stats", lay.thd_q)
    if kw.pop("generate_stats") is not None:
        call.option("generate_stats", 1 if stats is not None else 0)
    if kw.pop("stats_use_log2"):
        call.option("stats_use_log2", 1)
    for slot, name in ((L.SCORE_MAX, "score_max"), (L.SCORE_SUM_EXP, "score_sum_exp"), (L.MAX_LOGIT, "max_logit")):
        call.set(slot, kw.pop(name))
    call.set(L.PAGE_TABLE_K, kw.pop("paged_attention_k_table"))
    call.set(L.PAGE_TABLE_V, kw.pop("paged_attention_v_table"))
    for side, slot in (("k", L.PAGE_TABLE_K), ("v", L.PAGE_TABLE_V)):
        off = lay.ragged_offsets.get(f"paged_attention_{side}_table")
        if off is not None:
            if slot not in call.slots:
                raise ValueError(f"ragged_offsets: paged_attention_{side}_table is not given")
            # Offsets count page-table entries: one entry per page along dim 2.
            call.ragged[slot] = (_Bound(off.reshape(-1)), call.slots[slot].stride[2])
            _check_packed_table(call.slots[slot].tensor, off, k if side == "k" else v, kw, f"paged_attention_{side}_table")
    m = kw.pop("paged_attention_max_seq_len_kv")
    if m is not None:
        call.option("paged_attention_max_seq_len_kv", _int_arg(m, "paged_attention_max_seq_len_kv"))
    _apply_common(call, lay, q, backward=False, **kw)
    if _route(q) == "native":
        _scale_on_host(call)
    op = call.run()
    _remember(key, call, op, given, (q, k, v, o, stats), kw_in)
    return o, stats


def _backward(q, k, v, o, dO, stats, *, dq=None, dk=None, dv=None, **kw):
    """Runs one backward into dq/dk/dv (allocated in q/k/v's layouts when None); returns them (runs where
    :func:`_forward` runs)."""
    return _backward_kw(q, k, v, o, dO, stats, kw, dq, dk, dv)


def _backward_kw(q, k, v, o, dO, stats, kw: dict, dq=None, dk=None, dv=None):
    """:func:`_backward` with the keyword arguments as a dict the call owns (as :func:`_forward_kw`)."""
    given = (q, k, v, o, dO, stats, dq, dk, dv)
    key = _fast_key("bwd", given, False, kw)
    if key is not None:
        entry = _FAST.get(key)
        if entry is not None:
            bound = entry.run(given, kw)
            return bound[6], bound[7], bound[8]
    return _backward_full(key, given, kw)


def _backward_full(key, given: tuple, kw: dict):
    """_backward's full path (``key``: the call's _fast_key, remembered if it runs)."""
    q, k, v, o, dO, stats, dq, dk, dv = given
    _check_tensor_kwargs(kw)
    _check_flags(kw, _BWD_FLAGS)
    args = dict(kw)
    lay = _Layout(q, k, v, kw["seq_len_q"], kw["seq_len_kv"], kw["cu_seq_len_q"], kw["cu_seq_len_kv"],
                  kw.pop("ragged_offsets"), kw.pop("max_seq_len_q"), kw.pop("max_seq_len_kv"), False)
    call = _Call("bwd")
    thd_stats = lay.thd_q and stats.dim() == 3 and stats.shape[-1] == 1 and stats.shape[0] == q.shape[0]
    if lay.thd_q and isinstance(stats, Tensor):
        _check_thd_stats(stats, q, lay)
    if lay.thd_q and not thd_stats:
        # Padded stats (B, H, S_q[, 1]) for packed Q (the seed's sdpa_bwd contract).
        stats = stats.reshape(stats.shape[0], stats.shape[1], stats.shape[2], 1) if stats.dim() == 3 else stats
    for slot, t, name, thd in ((L.Q, q, "q", lay.thd_q), (L.K, k, "k", lay.thd_kv), (L.V, v, "v", lay.thd_kv),
                               (L.O, o, "o", lay.thd_q), (L.DO, dO, "dO", lay.thd_q),
                               (L.STATS, stats, "stats", thd_stats)):
        lay.bind_seq(call, slot, t, name, thd)
    # Gradients adopt each input's layout; packed (THD) gradients are compact (T, H, D).
    if dq is None:
        dq = q.new_empty(q.shape) if lay.thd_q else _like_layout(tuple(q.shape), q, q.dtype, q.device)
    if dk is None:
        dk = q.new_empty(k.shape) if lay.thd_kv else _like_layout(tuple(k.shape), k, q.dtype, q.device)
    if dv is None:
        dv = q.new_empty(v.shape) if lay.thd_kv else _like_layout(tuple(v.shape), v, q.dtype, q.device)
    lay.bind_seq(call, L.DQ, dq, "dQ", lay.thd_q)
    lay.bind_seq(call, L.DK, dk, "dK", lay.thd_kv)
    lay.bind_seq(call, L.DV, dv, "dV", lay.thd_kv)
    call.set(L.DBIAS, kw.pop("dBias"))
    call.set(L.DSINK_TOKEN, kw.pop("dSink_token"))
    lay.bind_seq(call, L.DGATE, kw.pop("dgate"), "dgate", lay.thd_q)
    if kw.pop("use_deterministic_algorithm"):
        call.option("deterministic_algorithm", 1)
    _apply_common(call, lay, q, backward=True, **kw)
    if _route(q) == "native":
        _scale_on_host(call)
    op = call.run()
    _remember(key, call, op, given, (q, k, v, o, dO, stats, dq, dk, dv), args)
    return dq, dk, dv


def _check_thd_stats(stats: Tensor, q: Tensor, lay: _Layout) -> None:
    """The backward's stats for packed (T, H, D) q: packed (T_q, H_q, 1), or padded (B, H_q, S_q, 1) / (B, H_q, S_q)
    (S_q: the padded length, max_seq_len_q or the longest sample). ValueError naming both forms and the shape as
    given otherwise (the C layer saw a 3-D one read as padded, reshaped to 4-D)."""
    T, Hq = q.shape[0], q.shape[1]
    shape = tuple(stats.shape)
    if shape in ((T, Hq, 1), (lay.B, Hq, lay.Sq), (lay.B, Hq, lay.Sq, 1)):
        return
    raise ValueError(f"stats: with packed (T, H, D) q it must be the packed (T, H_q, 1) = ({T}, {Hq}, 1) or the "
                     f"padded (B, H_q, S_q, 1) = ({lay.B}, {Hq}, {lay.Sq}, 1) (the forward's natural-log stats; "
                     f"also (B, H_q, S_q)), got shape {shape}")


def _scale_on_host(call: _Call) -> None:
    """The GPU kernels take attn_scale as a float: a device tensor scale is checked by the C layer's rules (one
    float32 element on q's device), then read on the host (one device sync per call); a host tensor goes to the C
    layer as it is (read there, no sync)."""
    bound = call.slots.get(L.ATTN_SCALE)
    if bound is None or bound.tensor.device.type == "cpu":
        return  # none, or a host scalar: the C layer takes it as a pass-by-value scale
    call.validate()
    del call.slots[L.ATTN_SCALE]
    call.option("attn_scale", float(bound.tensor.reshape(-1)[0].item()))


# The seed's deprecated spellings (its C++ set_causal_mask, set_causal_mask_bottom_right, set_sliding_window_length
# and set_is_inference are marked DEPRECATED, each with the setter it calls) -> what to pass instead.
_DEPRECATED = {
    "use_causal_mask": "diagonal_band_right_bound=0 (with the default diagonal_alignment=TOP_LEFT)",
    "use_causal_mask_bottom_right": "diagonal_alignment=BOTTOM_RIGHT, diagonal_band_right_bound=0",
    "sliding_window_length": "diagonal_band_left_bound (the same value)",
    "is_inference": "generate_stats (its negation: is_inference=True is generate_stats=False)",
}


def _warn_deprecated(use_causal_mask, use_causal_mask_bottom_right, sliding_window_length, is_inference,
                     stacklevel: int = 3) -> None:
    """A DeprecationWarning for each deprecated spelling given (set or not None), naming its replacement; attributed
    to the caller of flashspan.sdpa / sdpa_backward (``stacklevel``). They keep working as before (docs/SDPA.md)."""
    given = (("use_causal_mask", use_causal_mask), ("use_causal_mask_bottom_right", use_causal_mask_bottom_right),
             ("sliding_window_length", sliding_window_length is not None), ("is_inference", is_inference is not None))
    for name, on in given:
        if on:
            warnings.warn(f"{name} is deprecated (as in the seed): pass {_DEPRECATED[name]}", DeprecationWarning,
                          stacklevel=stacklevel)


def _scale_not_differentiated(name: str, prefix: str = "") -> None:
    """A scale tensor that requires grad: the scale is not differentiated (cuDNN's attn_scale is a non-differentiable
    input), so its .grad would stay None silently. ValueError naming it instead."""
    raise ValueError(f"{prefix}{name}: the scale is not differentiated (it gets no gradient, as cuDNN's attn_scale): pass "
                     f"{name}.detach() or a float, got a tensor with requires_grad=True")


def _check_unsupported(implementation, compute_data_type) -> None:
    if compute_data_type is None and (implementation is None or implementation.__class__ is str
                                      and implementation in ("AUTO", "COMPOSITE", "UNIFIED")):
        return  # the defaults (no attribute lookups)
    impl = getattr(implementation, "name", implementation)
    if impl is not None and str(impl).upper() not in ("AUTO", "COMPOSITE", "UNIFIED"):
        raise ValueError(f"implementation: must be AUTO, COMPOSITE or UNIFIED, got {implementation!r}")
    if compute_data_type is torch.float32:
        return  # torch's spelling of the seed's FLOAT
    cdt = getattr(compute_data_type, "name", compute_data_type)
    if cdt is not None and str(cdt).upper() not in ("NOT_SET", "FLOAT"):
        raise ValueError(f"compute_data_type: flashspan computes in float32 (FLOAT, NOT_SET or torch.float32), "
                         f"got {compute_data_type!r}")


# ---------------------------------------------------------------------------
# Autograd
# ---------------------------------------------------------------------------


class _SdpaFunction(torch.autograd.Function):
    """forward(q, k, v, bias, sink_token, gate, spec) -> (o, stats); spec carries every other argument."""

    @staticmethod
    def forward(ctx, q, k, v, bias, sink_token, gate, spec):
        kw = dict(spec["fwd"])
        kw.update(bias=bias, sink_token=sink_token, gate=gate)
        o, stats = _forward(q, k, v, stats_needed=True, **kw)
        ctx.save_for_backward(q, k, v, o, stats, bias, sink_token, gate)
        ctx.spec = spec
        ctx.mark_non_differentiable(stats)
        ctx.set_materialize_grads(False)
        return o, stats

    @staticmethod
    def backward(ctx, do, _dstats):
        q, k, v, o, stats, bias, sink_token, gate = ctx.saved_tensors
        if do is None:
            return (None,) * 7
        kw = dict(ctx.spec["bwd"])
        need = ctx.needs_input_grad
        dbias = torch.empty_like(bias) if bias is not None and need[3] else None
        dsink = (torch.empty(q.shape[1], dtype=torch.float32, device=q.device)
                 if sink_token is not None and need[4] else None)
        dgate = torch.empty_like(gate) if gate is not None and need[5] else None
        kw.update(bias=bias, sink_token=sink_token, gate=gate, dBias=dbias, dSink_token=dsink, dgate=dgate)
        dq, dk, dv = _backward(q, k, v, o, dense_grad(do), stats, **kw)
        if dsink is not None:
            dsink = dsink.to(sink_token.dtype).reshape(sink_token.shape)
        dq, dk, dv, dbias, dsink, dgate = no_double_backward("sdpa", (q, k, v, bias, sink_token, gate),
                                                             (dq, dk, dv, dbias, dsink, dgate))
        return dq, dk, dv, dbias, dsink, dgate, None


# ---------------------------------------------------------------------------
# Public API
# ---------------------------------------------------------------------------


def sdpa(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    attn_scale: Optional[Union[float, Tensor]] = None,
    bias: Optional[Tensor] = None,
    block_mask: Optional[Tensor] = None,
    use_alibi_mask: bool = False,
    use_padding_mask: bool = False,
    seq_len_q: Optional[Tensor] = None,
    seq_len_kv: Optional[Tensor] = None,
    cu_seq_len_q: Optional[Tensor] = None,
    cu_seq_len_kv: Optional[Tensor] = None,
    diagonal_alignment=TOP_LEFT,
    diagonal_band_left_bound: Optional[int] = None,
    diagonal_band_right_bound: Optional[int] = None,
    dropout: Optional[tuple] = None,
    rng_dump: Optional[Tensor] = None,
    paged_attention_k_table: Optional[Tensor] = None,
    paged_attention_v_table: Optional[Tensor] = None,
    paged_attention_max_seq_len_kv: Optional[int] = None,
    max_total_seq_len_q: Optional[int] = None,
    max_total_seq_len_kv: Optional[int] = None,
    generate_stats: Optional[bool] = None,
    stats_use_log2: bool = False,
    implementation="AUTO",
    unfuse_fma: bool = False,
    compute_data_type=None,
    name: Optional[str] = None,
    *,
    score_max: Optional[Tensor] = None,
    score_sum_exp: Optional[Tensor] = None,
    max_logit: Optional[Tensor] = None,
    sink_token: Optional[Tensor] = None,
    softcap: Optional[float] = None,
    gate: Optional[Tensor] = None,
    ragged_offsets: Optional[dict] = None,
    max_seq_len_q: Optional[int] = None,
    max_seq_len_kv: Optional[int] = None,
    use_causal_mask: bool = False,
    use_causal_mask_bottom_right: bool = False,
    sliding_window_length: Optional[int] = None,
    is_inference: Optional[bool] = None,
) -> tuple[Tensor, Optional[Tensor]]:
    """Scaled dot-product attention with the seed's ``graph.sdpa`` arguments, run eagerly (autograd-enabled).

    ``O = softmax(attn_scale * Q K^T [softcap] + bias + ALiBi + masks [+ sink]) [dropout] V [* sigmoid(gate)]``;
    the exact semantics of every option are in docs/SDPA.md.

    Args:
        q, k, v: ``(B, H_q, S_q, D_qk)``, ``(B, H_k, S_kv, D_qk)``, ``(B, H_v, S_kv, D_v)`` logical BHSD with any
            strides (BSHD memory: pass ``x.transpose(1, 2)``), last dim contiguous; or packed THD ``(T, H, D)``
            with ``cu_seq_len_q`` / ``cu_seq_len_kv`` (then ``use_padding_mask=True``). With page tables, k / v are
            containers ``(num_blocks, H, block_size, D)`` (block_size a power of two). fp16 / bf16 (CPU tensors
            also float32 / float64). H_k and H_v divide H_q; head dims multiples of 8 up to 256.
        attn_scale: float or 1-element fp32 tensor; None means 1 (no scaling), as in the seed. Not differentiated
            (as cuDNN's): a tensor that requires grad is a ValueError (pass ``attn_scale.detach()``).
        bias: additive, ``(1|B, 1|H_q, 1|S_q, 1|S_kv)``, dtype of q or fp32; differentiable.
        block_mask: uint8 ``(1|B, 1|H_q, ceil(S_q/128), ceil(ceil(S_kv/128)/8))``; bit ``kb % 8`` of byte ``kb // 8``
            set = the 128x128 tile (query block, key block kb) is computed.
        use_alibi_mask: ALiBi (needs ``diagonal_band_right_bound=0``); the ALiBi paper's slopes for H_q heads. With
            S_q < S_kv (decode, a KV cache) use ``diagonal_alignment=BOTTOM_RIGHT``: top-left, query 0 of a
            decode step sees key 0 only.
        use_padding_mask, seq_len_q, seq_len_kv, cu_seq_len_q, cu_seq_len_kv: per-sample lengths, ``(B,)`` /
            ``(B, 1, 1, 1)`` or prefix sums ``(B+1,)``, int32 / int64; one form per side.
        diagonal_alignment: ``flashspan.diagonal_alignment.TOP_LEFT`` (default, the seed's) / ``BOTTOM_RIGHT`` (or
            those names as strings; also ``flashspan.TOP_LEFT`` / ``flashspan.BOTTOM_RIGHT``). Decode and KV-cache
            calls (S_q < S_kv) want ``BOTTOM_RIGHT``: the last query row sees the last key.
        diagonal_band_left_bound: masks columns at or before ``row - left_bound`` (>= 1).
        diagonal_band_right_bound: masks columns beyond ``row + right_bound`` (0 = causal).
        dropout: ``(probability, seed, offset)`` (Philox, seed/offset int tensors or ints) or ``(mask, scale)``.
        rng_dump: output ``(B, H_q, S_q, S_kv)`` (uint8 or float) receiving the Philox keep mask.
        paged_attention_k_table, paged_attention_v_table: int32 ``(B, 1, max_pages, 1)``; need
            ``use_padding_mask`` with Q- and KV-side lengths (as in the seed); forward only.
            paged_attention_max_seq_len_kv: the logical S_kv (default max_pages * block_size).
        max_total_seq_len_q, max_total_seq_len_kv: packed token totals (THD only).
        generate_stats: return the fp32 LSE stats ``(B, H_q, S_q, 1)`` (THD: packed ``(T, H_q, 1)``; score_max /
            score_sum_exp stay padded); default: only when gradients are needed it is computed, and returned only if
            requested.
        stats_use_log2: stats in base 2 (the natural-log stats times log2(e)); only the returned stats: with gradients
            the backward still runs on the natural-log stats, which the forward keeps for it.
        implementation, unfuse_fma, compute_data_type, name: accepted for parity (one engine; float32 compute).
        score_max, score_sum_exp: optional fp32 ``(B, H_q, S_q, 1)`` outputs (row max, sum of exp(x - max)); always
            padded: with packed THD q they are ``(B, H_q, S_max, 1)`` (S_max: ``max_seq_len_q``, else the longest sample), not packed
            ``(T, H_q, 1)`` like the stats.
        max_logit: optional fp32 ``(H_q,)`` output, per-head maximum logit (QK-clip).
        sink_token: fp32 ``(H_q,)`` per-head sink logits in the softmax denominator; differentiable.
        softcap: ``x -> softcap * tanh(x / softcap)`` after scaling.
        gate: ``O * sigmoid(gate)``, shape of O; differentiable.
        ragged_offsets: ``{"q": token offsets (B+1,), ...}`` for partially packed THD tensors.
        max_seq_len_q, max_seq_len_kv: S_max of THD tensors (else read from the lengths: one host sync); ints. On a
            dense side they may be given only equal to its S (TypeError for another type, ValueError otherwise).
        use_causal_mask, use_causal_mask_bottom_right, sliding_window_length, is_inference: the seed's deprecated
            spellings (its set_causal_mask, set_causal_mask_bottom_right, set_sliding_window_length and
            set_is_inference), still honoured, each with a DeprecationWarning naming what to pass instead:
            ``diagonal_band_right_bound=0``; ``diagonal_alignment=BOTTOM_RIGHT, diagonal_band_right_bound=0``;
            ``diagonal_band_left_bound``; ``generate_stats`` (the negation). An explicit bound given alongside wins
            over use_causal_mask*; sliding_window_length differing from diagonal_band_left_bound, or is_inference
            equal to generate_stats, is a ValueError.

    Returns:
        ``(o, stats)``; ``stats`` is None unless generate_stats. ``o`` has q's layout (THD: packed ``(T, H_q, D_v)``).
        ``o`` is differentiable; ``stats`` (like score_max, score_sum_exp and max_logit) carries no gradient: it is
        marked non-differentiable (cuDNN's stats are an output the backward consumes), so a loss term on it is
        silently dropped. For a differentiable LSE use :func:`flashspan.flex_attn_func` with ``return_lse=True``.
        A query row that sees no key (past its sample's length, or a band / block mask that leaves it none) has
        ``o = 0`` and stats ``-inf`` (zero gradients); a row whose logits hold a NaN (a NaN or Inf in q, a NaN
        bias) has a NaN ``o`` and stats, as PyTorch's math SDPA.

    Raises:
        ValueError / TypeError naming the argument and the rule (docs/SDPA.md lists them; docs/ERRORS.md gives the
        class of each kind of rule, the same as flex's); NotImplementedError (a RuntimeError) naming the feature when
        a CUDA call needs one the GPU path does not have yet; RuntimeError when its gradients are differentiated
        again (double backward).

    Where it runs (docs/SDPA.md, "What runs where"): CPU tensors run the CPU reference (every feature). CUDA tensors
    run the C layer's own SDPA GPU kernels with the analytic mask (the native route, on every GPU):
    the masks (causal / bands / sliding windows with either alignment), padding, THD, GQA / MQA, H_k != H_v, LSE,
    max_logit, the deterministic backward, bias with dBias, ALiBi, softcap, sinks with dSink, dropout, the block
    mask, the gate with dgate and score_max / score_sum_exp; on sm_90 GPUs (H100, H200) the sm90 kernels where they
    cover the call, else the sm80 ones; paged K/V caches in the forward (``FLASHSPAN_SDPA_PAGED=0`` refuses them),
    with the bias or dropout too; max_logit with sinks and score_max / score_sum_exp with a packed o (these feature pairs run by
    default since their GPU tests passed on an H200; ``FLASHSPAN_SDPA_FEATURE_PAIRS=0`` refuses them). What the
    GPU kernels do not run raises NotImplementedError naming it. (The flex route, ``FLASHSPAN_SDPA_ROUTE=flex``, was
    retired: for flex attention with a mask that is not arithmetic, call ``flashspan.flex_attn_func``.)

    torch.compile: this function runs eagerly (ctypes calls, host-side caches behind a lock) and is not traced;
    under ``torch.compile(fullgraph=True)`` Dynamo stops at it (an "unsupported context manager" error). Compiled
    models call :func:`flashspan.sdpa_torch` (the custom ops ``torch.ops.flashspan.sdpa_fwd`` / ``sdpa_bwd``, which
    torch.compile traces, backward included).

    Example::

        q = torch.randn(2, 4, 128, 64, dtype=torch.bfloat16, requires_grad=True)
        k, v = torch.randn_like(q), torch.randn_like(q)
        o, stats = flashspan.sdpa(q, k, v, attn_scale=0.125, diagonal_band_right_bound=0, generate_stats=True)
        o.float().sum().backward()
    """
    if unfuse_fma is not False:  # accepted for parity, unused: its type is checked here (one identity test)
        check_flag("unfuse_fma", unfuse_fma)
    del name, unfuse_fma
    _check_unsupported(implementation, compute_data_type)
    if use_causal_mask or use_causal_mask_bottom_right or sliding_window_length is not None or is_inference is not None:
        # Checked before the DeprecationWarning (a string "no" is truthy); the falsy ones by the full path.
        use_causal_mask = check_flag("use_causal_mask", use_causal_mask)
        use_causal_mask_bottom_right = check_flag("use_causal_mask_bottom_right", use_causal_mask_bottom_right)
        is_inference = check_flag("is_inference", is_inference, none_ok=True)
        _warn_deprecated(use_causal_mask, use_causal_mask_bottom_right, sliding_window_length, is_inference)
    if is_inference is not None:
        generate_stats = check_flag("generate_stats", generate_stats, none_ok=True)
        if generate_stats is not None and generate_stats == is_inference:
            raise ValueError(
                f"is_inference, generate_stats: is_inference (deprecated) is the negation of generate_stats, got "
                f"is_inference={is_inference!r} and generate_stats={generate_stats!r}; pass only generate_stats")
        if generate_stats is None:
            generate_stats = not is_inference
    grad_enabled = torch.is_grad_enabled()
    if grad_enabled and isinstance(attn_scale, Tensor) and attn_scale.requires_grad:
        _scale_not_differentiated("attn_scale")
    needs_grad = grad_enabled and True in [isinstance(t, Tensor) and t.requires_grad
                                           for t in (q, k, v, bias, sink_token, gate)]
    if not needs_grad:
        # No gradients: one keyword dict (the arguments of fwd and fwd_only below), no_grad() on the full path only.
        return _forward(
            q, k, v, stats_needed=bool(generate_stats), _no_grad=grad_enabled, bias=bias, sink_token=sink_token,
            gate=gate, generate_stats=generate_stats, attn_scale=attn_scale, block_mask=block_mask,
            use_alibi_mask=use_alibi_mask, use_padding_mask=use_padding_mask, seq_len_q=seq_len_q,
            seq_len_kv=seq_len_kv, cu_seq_len_q=cu_seq_len_q, cu_seq_len_kv=cu_seq_len_kv,
            diagonal_alignment=diagonal_alignment, diagonal_band_left_bound=diagonal_band_left_bound,
            diagonal_band_right_bound=diagonal_band_right_bound, dropout=dropout, rng_dump=rng_dump,
            max_total_seq_len_q=max_total_seq_len_q, max_total_seq_len_kv=max_total_seq_len_kv, softcap=softcap,
            use_causal_mask=use_causal_mask, use_causal_mask_bottom_right=use_causal_mask_bottom_right,
            sliding_window_length=sliding_window_length, ragged_offsets=ragged_offsets, max_seq_len_q=max_seq_len_q,
            max_seq_len_kv=max_seq_len_kv, paged_attention_k_table=paged_attention_k_table,
            paged_attention_v_table=paged_attention_v_table,
            paged_attention_max_seq_len_kv=paged_attention_max_seq_len_kv, stats_use_log2=stats_use_log2,
            score_max=score_max, score_sum_exp=score_sum_exp, max_logit=max_logit)
    # With gradients the forward computes natural-log stats whatever generate_stats and stats_use_log2 say (the full
    # path never sees them): check both flags here (the others are the full path's).
    if stats_use_log2.__class__ is not bool or (generate_stats is not None and generate_stats.__class__ is not bool):
        stats_use_log2 = check_flag("stats_use_log2", stats_use_log2)
        generate_stats = check_flag("generate_stats", generate_stats, none_ok=True)
    paged = paged_attention_k_table is not None or paged_attention_v_table is not None
    fwd = dict(
        attn_scale=attn_scale, block_mask=block_mask, use_alibi_mask=use_alibi_mask, use_padding_mask=use_padding_mask,
        seq_len_q=seq_len_q, seq_len_kv=seq_len_kv, cu_seq_len_q=cu_seq_len_q, cu_seq_len_kv=cu_seq_len_kv,
        diagonal_alignment=diagonal_alignment, diagonal_band_left_bound=diagonal_band_left_bound,
        diagonal_band_right_bound=diagonal_band_right_bound, dropout=dropout, rng_dump=rng_dump,
        max_total_seq_len_q=max_total_seq_len_q, max_total_seq_len_kv=max_total_seq_len_kv, softcap=softcap,
        use_causal_mask=use_causal_mask, use_causal_mask_bottom_right=use_causal_mask_bottom_right,
        sliding_window_length=sliding_window_length, ragged_offsets=ragged_offsets, max_seq_len_q=max_seq_len_q,
        max_seq_len_kv=max_seq_len_kv,
    )
    fwd_only = dict(
        paged_attention_k_table=paged_attention_k_table, paged_attention_v_table=paged_attention_v_table,
        paged_attention_max_seq_len_kv=paged_attention_max_seq_len_kv, stats_use_log2=stats_use_log2,
        score_max=score_max, score_sum_exp=score_sum_exp, max_logit=max_logit,
    )
    if paged:
        raise ValueError("paged_attention_k_table, paged_attention_v_table: paged K/V caches have no backward pass "
                         "(as in the seed); call under torch.no_grad() or pass contiguous K/V")
    # The backward consumes natural-log stats (the seed: stats_use_log2 "only affects stats ... the backward pass is
    # unaffected"): the forward keeps them natural for the backward and the caller gets the base-2 copy (below).
    spec = {
        "fwd": dict(fwd, generate_stats=True, **dict(fwd_only, stats_use_log2=False)),
        "bwd": dict(fwd, use_deterministic_algorithm=torch.are_deterministic_algorithms_enabled()),
    }
    for key in ("rng_dump",):
        spec["bwd"][key] = None
    o, stats = _SdpaFunction.apply(q, k, v, bias, sink_token, gate, spec)
    if not generate_stats:
        return o, None
    # The base-2 stats are the natural ones times log2(e) (-inf stays -inf), as the C layer computes them.
    return o, (stats * _LOG2E if stats_use_log2 else stats)


def sdpa_backward(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    o: Tensor,
    dO: Tensor,
    stats: Tensor,
    attn_scale: Optional[Union[float, Tensor]] = None,
    bias: Optional[Tensor] = None,
    dBias: Optional[Tensor] = None,
    use_alibi_mask: bool = False,
    use_padding_mask: bool = False,
    seq_len_q: Optional[Tensor] = None,
    seq_len_kv: Optional[Tensor] = None,
    max_total_seq_len_q: Optional[int] = None,
    max_total_seq_len_kv: Optional[int] = None,
    diagonal_alignment=TOP_LEFT,
    diagonal_band_left_bound: Optional[int] = None,
    diagonal_band_right_bound: Optional[int] = None,
    dropout: Optional[tuple] = None,
    use_deterministic_algorithm: bool = False,
    compute_data_type=None,
    name: Optional[str] = None,
    *,
    cu_seq_len_q: Optional[Tensor] = None,
    cu_seq_len_kv: Optional[Tensor] = None,
    block_mask: Optional[Tensor] = None,
    sink_token: Optional[Tensor] = None,
    dSink_token: Optional[Tensor] = None,
    softcap: Optional[float] = None,
    gate: Optional[Tensor] = None,
    dgate: Optional[Tensor] = None,
    ragged_offsets: Optional[dict] = None,
    max_seq_len_q: Optional[int] = None,
    max_seq_len_kv: Optional[int] = None,
    use_causal_mask: bool = False,
    use_causal_mask_bottom_right: bool = False,
    sliding_window_length: Optional[int] = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """SDPA backward with the seed's ``graph.sdpa_backward`` arguments, run eagerly.

    Every masking / score / dropout argument must match the forward. ``stats`` is the forward's natural-log
    LSE (``(B, H_q, S_q, 1)``; THD: ``(T, H_q, 1)`` or padded ``(B, H_q, S_max, 1)``). ``dBias`` (bias's
    shape), ``dSink_token`` (fp32 ``(H_q,)``) and ``dgate`` (gate's shape) are optional outputs written in
    place; ``dBias`` must not share memory with ``bias`` or another input (ValueError "dBias: shares memory
    with ..."). Returns ``(dQ, dK, dV)`` in q / k / v's layouts. Raises as :func:`sdpa`.
    """
    del name
    _check_unsupported(None, compute_data_type)
    if use_causal_mask or use_causal_mask_bottom_right or sliding_window_length is not None:
        # Checked before the DeprecationWarning (a string "no" is truthy); the falsy ones by the full path.
        use_causal_mask = check_flag("use_causal_mask", use_causal_mask)
        use_causal_mask_bottom_right = check_flag("use_causal_mask_bottom_right", use_causal_mask_bottom_right)
        _warn_deprecated(use_causal_mask, use_causal_mask_bottom_right, sliding_window_length, None)
    if isinstance(dO, Tensor) and dO.numel() == 0:
        dO = dense_grad(dO)  # an empty output's dO (any strides: it has no element), e.g. autograd's expanded one
    return _backward(
        q, k, v, o, dO, stats, attn_scale=attn_scale, bias=bias, dBias=dBias, use_alibi_mask=use_alibi_mask,
        use_padding_mask=use_padding_mask, seq_len_q=seq_len_q, seq_len_kv=seq_len_kv, cu_seq_len_q=cu_seq_len_q,
        cu_seq_len_kv=cu_seq_len_kv, max_total_seq_len_q=max_total_seq_len_q, max_total_seq_len_kv=max_total_seq_len_kv,
        diagonal_alignment=diagonal_alignment, diagonal_band_left_bound=diagonal_band_left_bound,
        diagonal_band_right_bound=diagonal_band_right_bound, dropout=dropout, rng_dump=None,
        use_deterministic_algorithm=use_deterministic_algorithm, block_mask=block_mask, sink_token=sink_token,
        dSink_token=dSink_token, softcap=softcap, gate=gate, dgate=dgate, ragged_offsets=ragged_offsets,
        max_seq_len_q=max_seq_len_q, max_seq_len_kv=max_seq_len_kv, use_causal_mask=use_causal_mask,
        use_causal_mask_bottom_right=use_causal_mask_bottom_right, sliding_window_length=sliding_window_length,
    )


# The package exports the function `sdpa` under this module's name, so `flashspan.sdpa` is the function, not the
# module: the module's public names are made reachable through the function too (flashspan.sdpa.TOP_LEFT,
# flashspan.sdpa.dropout_offset_increment, ...), as docs/SDPA.md writes them.
for _name in __all__:
    setattr(sdpa, _name, globals()[_name])
del _name
