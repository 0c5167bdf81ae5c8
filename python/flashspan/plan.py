"""The opaque, immutable MaskPlan and create_mask_plan, which builds it from interval endpoints."""

from __future__ import annotations

import ctypes
import dataclasses
import inspect
import itertools
import operator
import threading
import warnings
import weakref
from typing import Any, Optional

import torch

from . import _lib
from ._checks import check_flag


def _torch_dtype(dt: _lib.FsDType) -> Optional[torch.dtype]:
    if dt.code == _lib.DTYPE_BFLOAT and dt.bits == 16:
        return torch.bfloat16
    if dt.code == _lib.DTYPE_FLOAT:
        return {16: torch.float16, 32: torch.float32, 64: torch.float64}.get(dt.bits)
    return None


def _torch_device(dev: _lib.FsDevice) -> torch.device:
    if dev.device_type == _lib.DEVICE_CUDA:
        return torch.device("cuda", dev.device_id)
    return torch.device("cpu")


# Live plans by id: torch.compile'd graphs and custom ops refer to a plan by this int,
# which is a plain constant for the tracer (see _ops.py). Weak: the registry never keeps
# a plan alive.
_registry: weakref.WeakValueDictionary[int, MaskPlan] = weakref.WeakValueDictionary()
_ids = itertools.count(1)
_registry_lock = threading.Lock()


def plan_from_id(plan_id: int) -> MaskPlan:
    """The live plan with this id; ValueError when it was closed or garbage collected."""
    plan = _registry.get(plan_id)
    if plan is None or plan._handle is None:
        raise ValueError(
            f"mask_plan: the MaskPlan with id {plan_id} no longer exists (closed or garbage collected); "
            "keep the plan alive while compiled code that uses it runs"
        )
    return plan


@dataclasses.dataclass(frozen=True)
class MaskPlanMetadata:
    """Immutable description of a plan, with the seed's field names (``plan.metadata``).

    Fields:
        mode: ``"fixed"`` (BSHD) or ``"varlen"`` (THD).
        arch: SM of the plan's CUDA device as ``major * 10 + minor`` (90 on an H100/H200,
            80 on an A100); 0 for CPU plans (CPU reference backend). The kernel family the
            payloads are laid out for is ``plan.arch`` (e.g. 80, the portable family).
        device: ``torch.device`` of the plan (and of q/k/v).
        dtype: ``torch.dtype`` of q/k/v.
        batch_size: B.
        total_q, total_k: ``B*Sq`` / ``B*Sk`` (BSHD) or Tq / Tk (THD).
        max_seqlen_q, max_seqlen_k: Sq / Sk (BSHD) or the THD maxima.
        num_q_heads, num_kv_heads: Hq, Hkv.
        head_dim, head_dim_v: Dqk, Dv.
        hmask: mask heads (1 or Hq).
        nfunc: endpoints per query row (odd).
        pack_gqa: packed-GQA forward planning was selected.
        has_backward: backward metadata was built.
    """

    mode: str
    arch: int
    device: torch.device
    dtype: torch.dtype
    batch_size: int
    total_q: int
    total_k: int
    max_seqlen_q: int
    max_seqlen_k: int
    num_q_heads: int
    num_kv_heads: int
    head_dim: int
    head_dim_v: int
    hmask: int
    nfunc: int
    pack_gqa: bool
    has_backward: bool


def _device_arch(device: torch.device) -> int:
    """``major * 10 + minor`` of a CUDA device (90 for sm_90); 0 for the CPU."""
    if device.type != "cuda":
        return 0
    major, minor = torch.cuda.get_device_capability(device)
    return major * 10 + minor


def _metadata(meta: dict) -> MaskPlanMetadata:
    return MaskPlanMetadata(
        mode="varlen" if meta["varlen"] else "fixed",
        arch=_device_arch(meta["device"]),
        device=meta["device"],
        dtype=meta["dtype"],
        batch_size=meta["batch"],
        total_q=meta["total_q"],
        total_k=meta["total_k"],
        max_seqlen_q=meta["max_seqlen_q"],
        max_seqlen_k=meta["max_seqlen_k"],
        num_q_heads=meta["num_heads_q"],
        num_kv_heads=meta["num_heads_kv"],
        head_dim=meta["head_dim_qk"],
        head_dim_v=meta["head_dim_v"],
        hmask=meta["num_heads_mask"],
        nfunc=meta["nfunc"],
        pack_gqa=bool(meta["pack_gqa"]),
        has_backward=bool(meta["has_backward"]),
    )


class MaskPlan:
    """Block-sparse metadata compiled from interval endpoints; reusable for any call of the same geometry.

    Built by :func:`create_mask_plan`; immutable. It owns copies of ``cu_seqlens``,
    the forward metadata and (``has_backward``) the backward metadata, on the device
    of the mask (CPU plans run the CPU reference backend). Geometry and statistics are
    exposed as read-only properties; :meth:`debug_snapshot` and :meth:`visualize`
    show its contents. Reuse checks are host-only (no device synchronisation).

    Example::

        plan = flashspan.create_mask_plan(mask_func, q, k, v)
        print(plan.fwd_partial_blocks, plan.fwd_full_blocks, plan.signature)
    """

    def __init__(self, *args: Any, **kwargs: Any):
        raise TypeError("MaskPlan is built by flashspan.create_mask_plan(mask_func, q, k, v, ...)")

    @classmethod
    def _from_handle(cls, handle: ctypes.c_void_p) -> MaskPlan:
        self = object.__new__(cls)
        d = self.__dict__
        d["_handle"] = handle
        info = _lib.FsMaskPlanInfo()
        try:
            _lib.check(_lib.lib().fs_mask_plan_get_info(handle, ctypes.byref(info)), "mask plan info")
        except BaseException:
            _lib.lib().fs_mask_plan_destroy(handle)
            d["_handle"] = None
            raise
        # Plain Python copies of the info: host-only checks read these, and torch.compile
        # traces plain ints/tuples (it cannot trace ctypes fields).
        meta = {}
        for name, _ in _lib.FsMaskPlanInfo._fields_:
            value = getattr(info, name)
            if name == "signature":
                value = value.decode("utf-8", "replace")
            elif name == "dtype":
                value = _torch_dtype(value)
            elif name == "device":
                value = _torch_device(value)
            else:
                value = int(value)
            meta[name] = value
        d["_meta"] = meta
        d["_metadata"] = _metadata(meta)
        d["_shapes"] = _call_shapes(meta)
        d["_closed"] = False
        d["_op_cache"] = {}
        with _registry_lock:
            d["_id"] = next(_ids)
            _registry[d["_id"]] = self
        return self

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("MaskPlan is immutable")

    def __delattr__(self, name: str) -> None:
        raise AttributeError("MaskPlan is immutable")

    def __reduce__(self):
        raise TypeError(
            "MaskPlan cannot be pickled or copied (it owns native memory); build it again with create_mask_plan"
        )

    def close(self) -> None:
        """Frees the plan's memory now; later use raises ValueError. Dropping the last reference does it too."""
        d = self.__dict__
        handle = d.get("_handle")
        if handle is None:
            return
        # Compiled op objects first: they were created against this plan.
        cache = d.get("_op_cache")
        if cache:
            cache.clear()
        d["_handle"] = None
        d["_closed"] = True
        try:
            lib = _lib.lib()
        except ImportError:  # interpreter shutdown
            return
        lib.fs_mask_plan_destroy(handle)

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # never raise from a finalizer (interpreter shutdown)
            pass

    # -- internals used by execution / api ---------------------------------------------------

    @property
    def _live_handle(self) -> ctypes.c_void_p:
        h = self.__dict__.get("_handle")
        if h is None:
            raise ValueError("mask_plan: this MaskPlan was closed; build a new one with create_mask_plan")
        return h

    @property
    def id(self) -> int:
        """Process-unique integer id (how compiled graphs and custom ops refer to the plan)."""
        return self._id

    # -- geometry -----------------------------------------------------------------------------

    @property
    def metadata(self) -> MaskPlanMetadata:
        """Frozen :class:`MaskPlanMetadata` (the seed's ``MaskPlan.metadata``: mode, arch, device, dtype, geometry)."""
        return self._metadata

    @property
    def varlen(self) -> bool:
        """True for the variable-length THD layout (cu_seqlens given), False for BSHD."""
        return bool(self._meta["varlen"])

    @property
    def layout(self) -> str:
        return "thd" if self.varlen else "bshd"

    batch = property(lambda self: self._meta["batch"], doc="B (number of sequences)")
    max_seqlen_q = property(lambda self: self._meta["max_seqlen_q"], doc="Sq (BSHD) or the THD maximum")
    max_seqlen_k = property(lambda self: self._meta["max_seqlen_k"], doc="Sk (BSHD) or the THD maximum")
    total_q = property(lambda self: self._meta["total_q"], doc="B*Sq or Tq")
    total_k = property(lambda self: self._meta["total_k"], doc="B*Sk or Tk")
    num_heads_q = property(lambda self: self._meta["num_heads_q"], doc="Hq")
    num_heads_kv = property(lambda self: self._meta["num_heads_kv"], doc="Hkv")
    num_heads_mask = property(lambda self: self._meta["num_heads_mask"], doc="Hmask (1 or Hq)")
    nfunc = property(lambda self: self._meta["nfunc"], doc="endpoints per query row (odd)")
    head_dim_qk = property(lambda self: self._meta["head_dim_qk"], doc="Dqk")
    head_dim_v = property(lambda self: self._meta["head_dim_v"], doc="Dv")
    pack_gqa = property(lambda self: bool(self._meta["pack_gqa"]), doc="packed-GQA planning")
    has_backward = property(lambda self: bool(self._meta["has_backward"]), doc="backward metadata built")
    arch = property(
        lambda self: self._meta["arch"],
        doc="kernel family the payloads are laid out for (80: portable mma.sync); the device's SM is metadata.arch",
    )
    fwd_block_q = property(lambda self: self._meta["fwd_block_q"])
    fwd_block_k = property(lambda self: self._meta["fwd_block_k"])
    bwd_block_q = property(lambda self: self._meta["bwd_block_q"])
    bwd_block_k = property(lambda self: self._meta["bwd_block_k"])
    fwd_num_q_blocks = property(lambda self: self._meta["fwd_num_q_blocks"])
    fwd_num_k_blocks = property(lambda self: self._meta["fwd_num_k_blocks"])
    fwd_partial_blocks = property(lambda self: self._meta["fwd_partial_blocks"], doc="summed over mask heads")
    fwd_full_blocks = property(lambda self: self._meta["fwd_full_blocks"], doc="summed over mask heads")
    bwd_partial_blocks = property(lambda self: self._meta["bwd_partial_blocks"])
    bwd_full_blocks = property(lambda self: self._meta["bwd_full_blocks"])
    visible_pairs = property(lambda self: self._meta["visible_pairs"], doc="visible (q,k) pairs, all mask heads")
    num_tasks = property(lambda self: self._meta["num_tasks"], doc="forward schedule length")
    bytes = property(lambda self: self._meta["bytes"], doc="total size of the plan's arrays")

    @property
    def signature(self) -> str:
        """Human-readable compatibility signature (consumer, tiles, layout, dtype, geometry)."""
        return self._meta["signature"]

    @property
    def dtype(self) -> Optional[torch.dtype]:
        """dtype of q/k/v the plan was built for."""
        return self._meta["dtype"]

    @property
    def device(self) -> torch.device:
        return self._meta["device"]

    # Expected shapes of the tensors of a call (host-only reuse checks). Methods, unlike the plan's other
    # attributes (properties): call them, ``plan.q_shape()`` (kept as methods: earlier versions had them so).
    def q_shape(self) -> tuple[int, ...]:
        """The shape q must have for this plan (a method, unlike the properties: ``plan.q_shape()``)."""
        return self._shapes["q"]

    def k_shape(self) -> tuple[int, ...]:
        """The shape k must have for this plan (a method: ``plan.k_shape()``)."""
        return self._shapes["k"]

    def v_shape(self) -> tuple[int, ...]:
        """The shape v must have for this plan (a method: ``plan.v_shape()``)."""
        return self._shapes["v"]

    def out_shape(self) -> tuple[int, ...]:
        """The shape of the output for this plan (a method: ``plan.out_shape()``)."""
        return self._shapes["out"]

    def lse_shape(self) -> tuple[int, ...]:
        """The shape of the LSE for this plan, ``[B, Hq, Sq]`` or ``[Hq, Tq]`` (a method: ``plan.lse_shape()``)."""
        return self._shapes["lse"]

    def check_compatible(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        need_backward: bool = False,
        where: str = "MaskPlan.check_compatible",
    ) -> None:
        """Host-only check that q/k/v match what the plan was built for (no device sync).

        Raises TypeError (not a tensor, or the dtype differs) or ValueError (shape or
        device differs, plan closed, or backward needed but not built), as the seed does. The C layer checks again.
        Messages start with ``where`` (the entry point the user called, e.g.
        ``"flex_attn_func"``), so a failure names the call that broke the rule.
        """
        if self._closed:
            raise ValueError(f"{where}: mask_plan: this MaskPlan was closed; build a new one with create_mask_plan")
        shapes = self._shapes
        meta = self._meta
        try:  # fast path: one expression, no loop (this runs on every call)
            if (
                q.shape == shapes["q"] and k.shape == shapes["k"] and v.shape == shapes["v"]
                and q.dtype == meta["dtype"] and k.dtype == q.dtype and v.dtype == q.dtype
                and q.device == meta["device"] and k.device == q.device and v.device == q.device
                and (meta["has_backward"] or not need_backward)
                and q.stride(-1) == 1 and k.stride(-1) == 1 and v.stride(-1) == 1
            ):
                return
        except AttributeError:
            pass  # not a tensor: the loop below names it
        for name, t, want in (("q", q, shapes["q"]), ("k", k, shapes["k"]), ("v", v, shapes["v"])):
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"{where}: {name} must be a torch.Tensor, got {type(t).__name__}")
            if tuple(t.shape) != want:
                if (self.layout == "bshd" and all(x.dim() == 4 for x in (q, k, v))
                        and all(tuple(x.transpose(1, 2).shape) == shapes[n] for n, x in (("q", q), ("k", k), ("v", v)))):
                    raise ValueError(f"{where}: {name} has shape {tuple(t.shape)} but the mask plan was built for "
                                     f"{want} (BSHD): q, k, v fit BHSD (SDPA's layout); flex takes BSHD: pass "
                                     f"q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)")
                raise ValueError(
                    f"{where}: {name} has shape {tuple(t.shape)} but the mask plan was built for {want} "
                    f"({self.layout.upper()}); build a new plan for a new geometry (plan: {self.signature})"
                )
            if t.dtype != self.dtype:
                raise TypeError(f"{where}: {name} has dtype {t.dtype} but the mask plan was built for {self.dtype}")
            if t.device != self.device:
                raise ValueError(f"{where}: {name} is on {t.device} but the mask plan was built for {self.device}")
            if t.shape[-1] > 1 and t.numel() > 0 and t.stride(-1) != 1:
                raise ValueError(
                    f"{where}: {name}: last dimension must be contiguous (stride 1), got stride {t.stride(-1)}"
                )
        if need_backward and not self.has_backward:
            raise ValueError(
                f"{where}: mask_plan was built without backward metadata but this call requires gradients; "
                "build it with create_mask_plan(..., build_backward=True) (or under autograd with inputs "
                "that require grad), or run under torch.no_grad()"
            )

    def info(self) -> dict:
        """All geometry and statistics fields (fs_mask_plan_info_t) as a dict."""
        return dict(self._meta)

    def __repr__(self) -> str:
        if self.__dict__.get("_handle") is None:
            return "MaskPlan(closed)"
        return (
            f"MaskPlan({self.layout.upper()}, B={self.batch}, Sq={self.max_seqlen_q}, Sk={self.max_seqlen_k}, "
            f"Hq={self.num_heads_q}, Hkv={self.num_heads_kv}, Hmask={self.num_heads_mask}, nfunc={self.nfunc}, "
            f"D=({self.head_dim_qk},{self.head_dim_v}), {self.dtype}, {self.device}, "
            f"fwd partial/full={self.fwd_partial_blocks}/{self.fwd_full_blocks}, "
            f"backward={'yes' if self.has_backward else 'no'}, {self.bytes} bytes)"
        )

    # -- debugging ------------------------------------------------------------------------------

    def array_names(self) -> list[str]:
        lib, h = _lib.lib(), self._live_handle
        count = ctypes.c_int32()
        _lib.check(lib.fs_mask_plan_num_arrays(h, ctypes.byref(count)), "mask plan arrays")
        names = []
        for i in range(count.value):
            name = ctypes.c_char_p()
            _lib.check(lib.fs_mask_plan_array_name(h, i, ctypes.byref(name)), "mask plan array name")
            names.append(name.value.decode())
        return names

    def array(self, name: str):
        """Host copy (numpy int32) of one named array; synchronises with the device for CUDA plans."""
        import numpy as np

        lib, h = _lib.lib(), self._live_handle
        n = ctypes.c_int64()
        key = name.encode()
        _lib.check(lib.fs_mask_plan_copy_array(h, key, None, 0, ctypes.byref(n)), f"mask plan array {name!r}")
        buf = np.empty(n.value, dtype=np.int32)
        dst = buf.ctypes.data_as(ctypes.POINTER(ctypes.c_int32))
        _lib.check(lib.fs_mask_plan_copy_array(h, key, dst, n.value, ctypes.byref(n)), f"mask plan array {name!r}")
        return buf[: n.value]

    def arrays(self) -> dict:
        """Host numpy int32 copies of every named array of the plan (see src/plan/mask_plan.h for their meaning).

        (Before the seed-shaped :meth:`debug_snapshot`, this dict was what ``debug_snapshot()`` returned.)
        """
        return {name: self.array(name) for name in self.array_names()}

    def debug_snapshot(self) -> dict:
        """Copies of the plan's metadata arrays for diagnostics, in the seed's layout.

        Returns ``{"metadata": MaskPlanMetadata, "forward": {name: tensor}, "backward":
        {name: tensor} or None, "dq": {name: tensor} or None, "cu_seqlens_q": tensor or None,
        "cu_seqlens_k": tensor or None}``. Tensors are int32 copies on the plan's device
        (changing them does not change the plan). ``forward`` holds the arrays named
        ``fwd_*`` (prefix dropped), ``backward`` those named ``bwd_*`` (None without backward
        metadata), ``dq`` the query-major subset of the backward arrays that the dQ pass reads
        (``q_block_start``, ``k_block_start``, ``q2k_*``). ``cu_seqlens_*`` are the plan's
        copies for THD plans, None for BSHD. The names are flashspan's (the seed's internal
        array names differ: see docs/SEED_API.md). Synchronises with the device for CUDA plans.
        """
        device = self.device
        groups: dict = {"fwd": {}, "bwd": {}}
        cu = {}
        for name in self.array_names():
            prefix, _, rest = name.partition("_")
            if prefix in groups:
                groups[prefix][rest] = torch.from_numpy(self.array(name).copy()).to(device)
            elif name in ("cu_seqlens_q", "cu_seqlens_k"):
                cu[name] = torch.from_numpy(self.array(name).copy()).to(device)
        backward = groups["bwd"] if self.has_backward and groups["bwd"] else None
        dq = None
        if backward is not None:
            dq = {
                n: t.clone()
                for n, t in backward.items()
                if n.startswith("q2k_") or n in ("q_block_start", "k_block_start")
            }
        return {
            "metadata": self._metadata,
            "forward": groups["fwd"],
            "backward": backward,
            "dq": dq,
            "cu_seqlens_q": cu.get("cu_seqlens_q") if self.varlen else None,
            "cu_seqlens_k": cu.get("cu_seqlens_k") if self.varlen else None,
        }

    def block_classes(self, direction: str = "fwd"):
        """numpy int8 [Hmask, NQB, NKB]: 0 empty, 1 partial, 2 full for every (query block, key block) pair.

        Blocks of all samples are laid out along both axes (sample b's blocks start at
        q_block_start[b] / k_block_start[b]); pairs across samples are empty.
        """
        import numpy as np

        if direction not in ("fwd", "bwd"):
            raise ValueError(f"direction must be 'fwd' or 'bwd', got {direction!r}")
        if direction == "bwd" and not self.has_backward:
            raise ValueError("direction='bwd': the plan has no backward metadata")
        p = direction + "_"
        qbs, kbs = self.array(p + "q_block_start"), self.array(p + "k_block_start")
        nqb, nkb = int(qbs[-1]), int(kbs[-1])
        hm = self.num_heads_mask
        grid = np.zeros((hm, nqb, nkb), dtype=np.int8)
        sample_of_qb = np.searchsorted(qbs, np.arange(nqb), side="right") - 1
        for kind, value in (("partial", 1), ("full", 2)):
            rowptr = self.array(p + f"q2k_{kind}_ptr")
            counts = np.diff(rowptr)
            rows = np.repeat(np.arange(hm * nqb), counts)
            if kind == "partial":
                kb = self.array(p + "q2k_partial_kb")[: rows.size]
            else:
                # Full blocks are stored as runs (first, end) of key blocks (plan format 2).
                runs = self.array(p + "q2k_full_runs").reshape(-1, 2)[: rows.size].astype(np.int64)
                lens = runs[:, 1] - runs[:, 0]
                rows = np.repeat(rows, lens)
                kb = np.repeat(runs[:, 0], lens) + (np.arange(int(lens.sum())) - np.repeat(np.cumsum(lens) - lens, lens))
            heads, gq = rows // nqb, rows % nqb
            gk = kbs[sample_of_qb[gq]] + kb
            grid[heads, gq, gk] = value
        return grid

    def visualize(self, path: str, direction: str = "fwd", max_heads: int = 8) -> None:
        """Writes a PNG of the block classes (white empty, orange partial, blue full) per mask head.

        One panel per mask head (the first ``max_heads``): query blocks down, key blocks
        across, integer block indices on both axes, a legend of the three classes and a
        title with their counts. Needs matplotlib (``pip install flashspan[plot]``).
        """
        try:
            import matplotlib

            matplotlib.use("Agg", force=False)
            import matplotlib.pyplot as plt
            from matplotlib.colors import ListedColormap
            from matplotlib.patches import Patch
            from matplotlib.ticker import MaxNLocator
        except ImportError as e:
            raise ImportError(
                "MaskPlan.visualize needs matplotlib: pip install matplotlib (or flashspan[plot])"
            ) from e
        grid = self.block_classes(direction)
        heads = min(grid.shape[0], max_heads)
        block_q = self.fwd_block_q if direction == "fwd" else self.bwd_block_q
        block_k = self.fwd_block_k if direction == "fwd" else self.bwd_block_k
        colors = ("#ffffff", "#f5a623", "#1f5fbf")
        # constrained layout reserves room for the axis labels, the panel titles and the
        # figure title (a plain layout cut the y label off and let the titles overlap).
        fig, axes = plt.subplots(
            1, heads, figsize=(4.2 * heads + 0.6, 4.8), squeeze=False, constrained_layout=True
        )
        cmap = ListedColormap(list(colors))
        for h in range(heads):
            ax = axes[0][h]
            ax.imshow(grid[h], cmap=cmap, vmin=0, vmax=2, interpolation="nearest", aspect="auto")
            ax.set_title(f"mask head {h}", fontsize=10)
            ax.set_xlabel(f"key block ({block_k} keys)")
            ax.set_ylabel(f"query block ({block_q} rows)")
            # Block indices are integers; the default locator puts ticks at -0.5, 0.25, ...
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
            ax.yaxis.set_major_locator(MaxNLocator(integer=True))
        shown = grid[:heads]
        counts = [int((shown == c).sum()) for c in range(3)]
        legend = [
            Patch(facecolor=color, edgecolor="#555555", label=f"{label} ({n})")
            for color, label, n in zip(colors, ("empty", "partial", "full"), counts)
        ]
        fig.legend(handles=legend, loc="outside lower center", ncol=3, frameon=False, fontsize=9)
        more = f" (first {heads} of {grid.shape[0]} mask heads)" if heads < grid.shape[0] else ""
        fig.suptitle(
            f"{direction} blocks: {counts[1]} partial, {counts[2]} full, {counts[0]} empty{more}", fontsize=11
        )
        fig.savefig(path, dpi=100)
        plt.close(fig)


def _call_shapes(m: dict) -> dict:
    """Expected q/k/v/out/lse shapes of a call with this plan geometry (see flashspan.h)."""
    if m["varlen"]:
        q = (m["total_q"], m["num_heads_q"], m["head_dim_qk"])
        k = (m["total_k"], m["num_heads_kv"], m["head_dim_qk"])
        lse = (m["num_heads_q"], m["total_q"])
    else:
        q = (m["batch"], m["max_seqlen_q"], m["num_heads_q"], m["head_dim_qk"])
        k = (m["batch"], m["max_seqlen_k"], m["num_heads_kv"], m["head_dim_qk"])
        lse = (m["batch"], m["num_heads_q"], m["max_seqlen_q"])
    return {"q": q, "k": k, "v": k[:-1] + (m["head_dim_v"],), "out": q[:-1] + (m["head_dim_v"],), "lse": lse}


_PLAN_OPTIONS = ("cu_seqlens_q", "cu_seqlens_k", "max_seqlen_q", "max_seqlen_k", "pack_gqa", "build_backward", "arch")


def create_mask_plan(
    mask_func: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *legacy_positional,
    cu_seqlens_q: Optional[torch.Tensor] = None,
    cu_seqlens_k: Optional[torch.Tensor] = None,
    max_seqlen_q: Optional[int] = None,
    max_seqlen_k: Optional[int] = None,
    pack_gqa: Optional[bool] = None,
    build_backward: Optional[bool] = None,
    arch: Optional[int] = None,
) -> MaskPlan:
    """Compiles interval endpoints into a reusable :class:`MaskPlan`.

    Signature (the seed's): ``create_mask_plan(mask_func, q, k, v, *, cu_seqlens_q=None,
    cu_seqlens_k=None, max_seqlen_q=None, max_seqlen_k=None, pack_gqa=None,
    build_backward=None)``, plus the flashspan keyword ``arch``; the options passed
    positionally (earlier flashspan versions) still work with a DeprecationWarning.

    Args:
        mask_func: int32 ``[Hmask, nfunc, B*Sq]`` (BSHD) or ``[Hmask, nfunc, Tq]`` (THD),
            Hmask in {1, Hq}, nfunc odd. Row r sees keys ``[0,F0) U [F1,F2) U ...`` with
            sample-local, nondecreasing endpoints in ``[0, Sk_b]``. :mod:`flashspan.masks` builds them
            (THD: one builder per sample, concatenated along the last dimension).
        q, k, v: sample tensors (only shape, dtype and device are read): BSHD
            ``[B,Sq,Hq,Dqk]``, ``[B,Sk,Hkv,Dqk]``, ``[B,Sk,Hkv,Dv]``, or THD ``[Tq,Hq,Dqk]``, ...
        cu_seqlens_q, cu_seqlens_k: int32 ``[B+1]`` (both for THD, neither for BSHD), prefix
            sums from 0 to the packed tensors' token counts ``Tq`` / ``Tk`` (ValueError
            otherwise: a token after the last sample would be a row no sample writes; the
            same rule as SDPA's cu_seqlens, docs/SDPA.md); the plan copies them. As SDPA,
            also int64 (values must fit int32: ValueError otherwise) and a vector with unit
            dimensions such as ``[1, B+1]``; other dtypes are a TypeError.
        max_seqlen_q, max_seqlen_k: THD maxima (computed from cu_seqlens when None,
            which reads them back from the device); ints (TypeError otherwise: a float
            is not truncated silently). For BSHD they may be given only when they equal
            the sequence lengths of q / k.
        pack_gqa: True / False / None (TypeError otherwise): force packed-GQA planning on/off
            (True needs Hmask = 1: ValueError otherwise); None lets the library choose (packs
            when Hq > Hkv and max_seqlen_q < the forward query tile, e.g. decode). Packing lays
            the forward out over rows (position, query head of the kv group), so one K/V tile
            serves the whole group; the backward view is the same either way. With Hq == Hkv
            packing is the identity and ``plan.pack_gqa`` is False.
        build_backward: True / False / None (TypeError otherwise): build backward metadata;
            None means "autograd is enabled and any of q/k/v requires grad".
        arch: kernel family the plan is laid out for: 80 (portable mma.sync kernels, any
            sm_80+ GPU), 90 (the Hopper kernels' tiles: a CUDA plan with it runs on sm_90 GPUs
            only), or None to let the library choose (``FLASHSPAN_KERNEL_FAMILY``, README
            "Kernel family"; with None CPU plans are 80). On CPU tensors ``arch=90`` is taken:
            the plan gets the sm90 layout (``plan.arch == 90``, its tiles) and runs on the CPU
            backend, a way to inspect or test a Hopper plan without a GPU. ``plan.arch`` tells
            which one a plan got.

    CUDA masks are planned on the current CUDA stream. Errors: ValueError (a rule is
    broken, message names it), TypeError (dtype/device), RuntimeError (CUDA failure).

    Example::

        S = 1024
        mask_func = torch.arange(1, S + 1, dtype=torch.int32).view(1, 1, S)  # causal
        plan = flashspan.create_mask_plan(mask_func, q, k, v)
    """
    if legacy_positional:
        if len(legacy_positional) > len(_PLAN_OPTIONS):
            raise TypeError(f"create_mask_plan() takes 4 positional arguments but {4 + len(legacy_positional)} were given")
        given = dict(zip(_PLAN_OPTIONS, legacy_positional))
        options = {"cu_seqlens_q": cu_seqlens_q, "cu_seqlens_k": cu_seqlens_k, "max_seqlen_q": max_seqlen_q,
                   "max_seqlen_k": max_seqlen_k, "pack_gqa": pack_gqa, "build_backward": build_backward, "arch": arch}
        for name in given:
            if options[name] is not None:
                raise TypeError(f"create_mask_plan() got multiple values for argument {name!r}")
        warnings.warn(
            "create_mask_plan: passing " + ", ".join(given) + " positionally is deprecated; pass them by keyword, "
            "as the seed API requires",
            DeprecationWarning,
            stacklevel=2,
        )
        options.update(given)
        cu_seqlens_q, cu_seqlens_k = options["cu_seqlens_q"], options["cu_seqlens_k"]
        max_seqlen_q, max_seqlen_k = options["max_seqlen_q"], options["max_seqlen_k"]
        pack_gqa, build_backward, arch = options["pack_gqa"], options["build_backward"], options["arch"]
    for name, t in (("mask_func", mask_func), ("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"create_mask_plan: {name} must be a torch.Tensor, got {type(t).__name__}")
    if (cu_seqlens_q is None) != (cu_seqlens_k is None):
        raise ValueError("create_mask_plan: cu_seqlens_q and cu_seqlens_k must be given together (THD) or both omitted (BSHD)")
    varlen = cu_seqlens_q is not None
    max_seqlen_q = _optional_int("max_seqlen_q", max_seqlen_q)
    max_seqlen_k = _optional_int("max_seqlen_k", max_seqlen_k)
    if varlen:
        for name, t in (("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k)):
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"create_mask_plan: {name} must be a torch.Tensor, got {type(t).__name__}")
        cu_seqlens_q = _cu_seqlens_arg(cu_seqlens_q, "cu_seqlens_q")
        cu_seqlens_k = _cu_seqlens_arg(cu_seqlens_k, "cu_seqlens_k")
        if max_seqlen_q is None:
            max_seqlen_q = _max_len(cu_seqlens_q, "cu_seqlens_q")
        if max_seqlen_k is None:
            max_seqlen_k = _max_len(cu_seqlens_k, "cu_seqlens_k")
    else:
        if max_seqlen_q is not None or max_seqlen_k is not None:
            for name, m, dim in (("max_seqlen_q", max_seqlen_q, q), ("max_seqlen_k", max_seqlen_k, k)):
                if m is not None and dim.dim() == 4 and int(m) != dim.shape[1]:
                    raise ValueError(f"create_mask_plan: {name}={m} does not match the BSHD sequence length {dim.shape[1]}")
        max_seqlen_q = max_seqlen_k = 0
    pack_gqa = check_flag("pack_gqa", pack_gqa, "create_mask_plan", none_ok=True)
    build_backward = check_flag("build_backward", build_backward, "create_mask_plan", none_ok=True)
    if pack_gqa is True and mask_func.dim() == 3 and mask_func.shape[0] != 1:
        raise ValueError(
            f"create_mask_plan: pack_gqa=True needs a mask shared by all query heads (Hmask = 1), got Hmask = "
            f"{mask_func.shape[0]}; pass pack_gqa=None or False for per-head masks"
        )
    if build_backward is None:
        build_backward = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))
    arch = _optional_int("arch", arch)
    if arch is not None and arch not in (80, 90):
        raise ValueError(f"create_mask_plan: arch must be 80, 90 or None, got {arch}")
    if pack_gqa is None:
        pack_gqa_code = -1
    else:
        pack_gqa_code = 1 if pack_gqa else 0

    # The C layer needs contiguous endpoints and cumulative lengths; a copy here is cheap
    # next to planning and spares the caller a rule that carries no meaning.
    mask_func = mask_func.contiguous()
    if varlen:
        cu_seqlens_q, cu_seqlens_k = cu_seqlens_q.contiguous(), cu_seqlens_k.contiguous()
    try:
        descs = [
            _lib.TensorDesc(mask_func, "mask_func"),
            _lib.TensorDesc(q, "q"),
            _lib.TensorDesc(k, "k"),
            _lib.TensorDesc(v, "v"),
            _lib.desc(cu_seqlens_q, "cu_seqlens_q"),
            _lib.desc(cu_seqlens_k, "cu_seqlens_k"),
        ]
    except (TypeError, ValueError) as e:  # device / dtype the C ABI has no code for: name the call too
        raise type(e)(f"create_mask_plan: {e}") from None
    args = _lib.FsMaskPlanArgs(
        _lib.ptr(descs[0]),
        _lib.ptr(descs[1]),
        _lib.ptr(descs[2]),
        _lib.ptr(descs[3]),
        _lib.ptr(descs[4]),
        _lib.ptr(descs[5]),
        int(max_seqlen_q),
        int(max_seqlen_k),
        pack_gqa_code,
        1 if build_backward else 0,
        0 if arch is None else arch,
        None,
    )
    handle = ctypes.c_void_p()

    def build() -> int:
        args.stream = _lib.stream_of(mask_func)
        return _lib.lib().fs_create_mask_plan(ctypes.byref(args), ctypes.byref(handle))

    # The CUDA planner selects q's device; the guard restores the caller's current device.
    try:
        _lib.check(_lib.on_device(q, build), "create_mask_plan")
    except ValueError as e:
        if not varlen:
            _raise_if_bhsd(mask_func, q, k, v, e)
        raise
    return MaskPlan._from_handle(handle)


def _raise_if_bhsd(mask_func: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, error) -> None:
    """A BSHD plan was refused: when q, k, v fit SDPA's BHSD layout ([B, H, S, D]) and not BSHD, say that
    instead of the rule BSHD broke (typically the mask length, B*Sq, read with H as Sq)."""
    if mask_func.dim() != 3 or any(t.dim() != 4 for t in (q, k, v)):
        return
    B, H, S, D = q.shape
    rows = mask_func.shape[2]
    fits = (rows == B * S and rows != B * H and k.shape[0] == v.shape[0] == B and k.shape[3] == D
            and k.shape[1] == v.shape[1] and k.shape[2] == v.shape[2] and k.shape[1] > 0 and H % k.shape[1] == 0)
    if fits:
        raise ValueError(
            f"create_mask_plan: q, k, v: shapes {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)} fit BHSD (SDPA's "
            f"layout: B={B}, H={H}, S={S}, D={D}; mask_func has B*S = {rows} rows) rather than BSHD; flex takes BSHD "
            f"[batch, seqlen, heads, head_dim]: pass q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2) "
            f"(read as BSHD: {error})") from None


def _seed_create_mask_plan(
    mask_func: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    cu_seqlens_q: Optional[torch.Tensor] = None,
    cu_seqlens_k: Optional[torch.Tensor] = None,
    max_seqlen_q: Optional[int] = None,
    max_seqlen_k: Optional[int] = None,
    pack_gqa: Optional[bool] = None,
    build_backward: Optional[bool] = None,
    arch: Optional[int] = None,
) -> MaskPlan:  # pragma: no cover - signature only
    pass


# Introspection shows the seed's signature (plus the keyword-only extension arch); the deprecated
# positional options are accepted on top.
create_mask_plan.__signature__ = inspect.signature(_seed_create_mask_plan)


def _optional_int(name: str, value: Any) -> Optional[int]:
    """None, or ``value`` as a Python int (ints, numpy ints, 0-d integer tensors; not bool or float).

    A float such as 64.5 would otherwise be truncated silently by the C struct field.
    """
    if value is None:
        return None
    if isinstance(value, bool):
        raise TypeError(f"create_mask_plan: {name} must be an int or None, got bool")
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(f"create_mask_plan: {name} must be an int or None, got {type(value).__name__} {value!r}") from None


_INT32_MIN, _INT32_MAX = -(2**31), 2**31 - 1


def _cu_seqlens_arg(cu: torch.Tensor, name: str) -> torch.Tensor:
    """``cu`` (named ``name``) as the C layer takes cumulative lengths: int32, 1-D. Takes what SDPA's cumulative
    lengths take (docs/SEED_API.md: a tensor valid in one front end is valid in the other): int32 or int64 (int64
    values must fit int32, the plan's index type: ValueError naming the value otherwise; checking them reads a
    CUDA tensor back to the host) and a vector given with unit dimensions, e.g. ``(1, B+1)`` or ``(B+1, 1, 1, 1)``
    (at most one dimension above 1). Other dtypes are a TypeError, other shapes a ValueError (_max_len)."""
    if cu.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"create_mask_plan: {name}: dtype must be int32 or int64, got {str(cu.dtype).replace('torch.', '')}")
    if cu.dim() > 1 and sum(1 for n in cu.shape if n != 1) <= 1:
        cu = cu.reshape(-1)
    if cu.dtype == torch.int64:
        if cu.numel():
            lo, hi = (int(x) for x in torch.aminmax(cu))
            if lo < _INT32_MIN or hi > _INT32_MAX:
                raise ValueError(f"create_mask_plan: {name}: int64 values must fit int32 (the plan's index type, "
                                 f"[-2**31, 2**31 - 1]), got {lo if lo < _INT32_MIN else hi}")
        cu = cu.to(torch.int32)
    return cu


def _max_len(cu: torch.Tensor, name: str) -> int:
    """Longest sample of cumulative lengths ``cu`` (named ``name`` in errors); reads them back to the host."""
    if cu.dim() != 1 or cu.numel() < 2:
        raise ValueError(f"create_mask_plan: {name}: must be a 1-D tensor of B+1 >= 2 values (or a vector with unit "
                         f"dimensions, e.g. (1, B+1)), got shape {tuple(cu.shape)}")
    return int((cu[1:] - cu[:-1]).max().item())
