"""Explicit FlexAttentionFwd / FlexAttentionBwd: check_support -> compile -> execute with caller buffers."""

from __future__ import annotations

import ctypes
import threading
from typing import Optional

import torch

from . import _lib
from .plan import MaskPlan


def _check_plan(plan: MaskPlan, where: str) -> ctypes.c_void_p:
    """The live handle of ``plan``; errors start with ``where`` (the call that got it)."""
    if not isinstance(plan, MaskPlan):
        raise TypeError(f"{where}: plan must be a flashspan.MaskPlan, got {type(plan).__name__}")
    try:
        return plan._live_handle
    except ValueError as e:
        raise ValueError(f"{where}: {e}") from None


def _scale_fields(softmax_scale: Optional[float]) -> tuple[float, int]:
    if softmax_scale is None:
        return 0.0, 0
    return float(softmax_scale), 1


def _workspace_ptr(
    workspace: Optional[torch.Tensor], need: int, device: torch.device, where: str
) -> tuple[Optional[int], int]:
    """(pointer, bytes) of a caller workspace, checked host-side (the C layer cannot see its device).

    Errors start with ``where`` (e.g. ``"FlexAttentionFwd.execute"``).
    """
    if workspace is None:
        if need > 0:
            raise ValueError(
                f"{where}: workspace: this call needs a uint8 workspace of at least {need} bytes on {device} "
                "(allocate workspace_size bytes once and pass workspace=...)"
            )
        return None, 0
    if not isinstance(workspace, torch.Tensor):
        raise TypeError(f"{where}: workspace must be a torch.Tensor, got {type(workspace).__name__}")
    if workspace.dtype != torch.uint8:
        raise TypeError(f"{where}: workspace must be a uint8 tensor, got {workspace.dtype}")
    if workspace.device != device and need > 0:
        raise TypeError(f"{where}: workspace is on {workspace.device} but the call runs on {device}")
    if need > 0 and not workspace.is_contiguous():
        raise ValueError(f"{where}: workspace must be contiguous")
    nbytes = workspace.numel()
    if nbytes < need:
        raise ValueError(f"{where}: workspace has {nbytes} bytes but this call needs workspace_size = {need} bytes")
    return (workspace.data_ptr() or None), nbytes


class _Spec:
    """Compiled descriptor of one tensor argument: execute() accepts exactly this layout."""

    __slots__ = ("name", "shape", "stride", "dtype", "device")

    def __init__(self, name: str, t: torch.Tensor):
        self.name, self.shape, self.stride = name, tuple(t.shape), t.stride()
        self.dtype, self.device = t.dtype, t.device

    def desc(self) -> _lib.TensorDesc:
        return _lib.TensorDesc.from_spec(self.shape, self.stride, self.dtype, self.device, self.name)


def _specs(names, tensors) -> tuple:
    return tuple(None if t is None else _Spec(n, t) for n, t in zip(names, tensors))


def _bind(
    spec: Optional[_Spec], d: Optional[_lib.TensorDesc], t: Optional[torch.Tensor], name: str, where: str
) -> None:
    """Points a prebuilt descriptor at t after checking t has the compiled layout (host-only, no sync).

    Errors start with ``where: name`` (e.g. ``"FlexAttentionFwd.execute: q: ..."``).
    """
    if t is None:
        if spec is not None:
            raise ValueError(f"{where}: {name}: is required (it was given at construction)")
        return
    if spec is None:
        raise ValueError(f"{where}: {name}: was not given at construction, so it must be None")
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{where}: {name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype != spec.dtype:
        raise TypeError(f"{where}: {name}: dtype {t.dtype} differs from the compiled {spec.dtype}")
    if t.device != spec.device:
        raise TypeError(f"{where}: {name}: device {t.device} differs from the compiled {spec.device}")
    if t.shape != spec.shape or t.stride() != spec.stride:
        raise ValueError(
            f"{where}: {name}: shape {tuple(t.shape)} or strides differ from the compiled descriptor "
            f"(strides {t.stride()}; compiled shape {spec.shape}, strides {spec.stride})"
        )
    d.struct.data = t.data_ptr() or None


class _ThreadArgs(threading.local):
    """Per-thread argument structs of one op: execute() only swaps data pointers (ctypes releases the
    GIL during the call, so threads sharing one op must not share the structs)."""

    args = None
    descs = None


class _OpBase:
    """What FlexAttentionFwd and FlexAttentionBwd share: the C handle's lifecycle
    (check_support -> compile -> workspace_size) and the launch. Subclasses set _NAME and
    _C ("fwd" or "bwd", the infix of the fs_flex_*_* C functions)."""

    _NAME = ""
    _C = ""
    _handle = None

    def _fn(self, suffix: str):
        return getattr(_lib.lib(), f"fs_flex_{self._C}_{suffix}")

    def _live(self):
        if self._handle is None:
            raise ValueError(f"{self._NAME}: this object was destroyed")
        return self._handle

    def check_support(self) -> bool:
        """Raises RuntimeError (not supported: head dims, dtype, architecture) or returns True."""
        _lib.check(self._fn("check_support")(self._live()), f"{self._NAME}.check_support")
        self._supported = True
        return True

    def compile(self) -> None:
        """Prepares the launch (kernel selection, workspace size); runs check_support() first if needed. Idempotent."""
        if not self._supported:
            self.check_support()
        _lib.check(self._fn("compile")(self._live()), f"{self._NAME}.compile")
        self._compiled = True
        self._workspace_size = None

    @property
    def workspace_size(self) -> int:
        """Bytes of uint8 workspace execute() needs (on the device of the tensors)."""
        if self._workspace_size is None:
            n = ctypes.c_size_t()
            _lib.check(self._fn("workspace_size")(self._live(), ctypes.byref(n)), f"{self._NAME}.workspace_size")
            self._workspace_size = int(n.value)
        return self._workspace_size

    def _launch(self, handle, args, ws_ptr, ws_bytes, q) -> int:
        return self._fn("execute")(handle, ctypes.byref(args), ws_ptr, ws_bytes, _lib.stream_of(q))

    def __del__(self):
        h = getattr(self, "_handle", None)
        if h is not None:
            self._handle = None
            try:
                self._fn("destroy")(h)
            except Exception:
                pass


class FlexAttentionFwd(_OpBase):
    """Precompiled, allocation-free flex-attention forward.

    The constructor captures sample descriptors (shape, strides, dtype, device of
    q/k/v/out, presence of lse and max_logit) and a sample plan. ``check_support()``
    and ``compile()`` prepare the launch; ``execute()`` accepts new tensors with the
    same descriptors and any compatible plan, allocates nothing and runs on
    ``torch.cuda.current_stream()`` (CUDA-graph capturable). On CPU tensors the same
    object runs the CPU reference backend.

    Shapes: BSHD q ``[B,Sq,Hq,Dqk]`` k ``[B,Sk,Hkv,Dqk]`` v ``[B,Sk,Hkv,Dv]`` out
    ``[B,Sq,Hq,Dv]`` lse fp32 ``[B,Hq,Sq]``; THD drops B (lse ``[Hq,Tq]``);
    max_logit fp32 ``[Hq]`` (reset to -inf by each execute, then reduced into).

    Example::

        out = torch.empty((*q.shape[:-1], v.shape[-1]), dtype=q.dtype, device=q.device)
        lse = torch.empty(plan.lse_shape(), dtype=torch.float32, device=q.device)
        fwd = FlexAttentionFwd(q, k, v, out, plan, lse)
        fwd.check_support()
        fwd.compile()
        ws = torch.empty(fwd.workspace_size, dtype=torch.uint8, device=q.device)
        fwd.execute(q, k, v, out, plan, lse, workspace=ws)
    """

    def __init__(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        out: torch.Tensor,
        plan: MaskPlan,
        lse: Optional[torch.Tensor] = None,
        sample_max_logit: Optional[torch.Tensor] = None,
        softmax_scale: Optional[float] = None,
        _hold_plan: bool = True,
    ):
        self._handle = None
        handle = _check_plan(plan, type(self).__name__)
        self._scale, self._has_scale = _scale_fields(softmax_scale)
        self.softmax_scale = softmax_scale
        self.has_lse = lse is not None
        self.has_max_logit = sample_max_logit is not None
        self.device = q.device if isinstance(q, torch.Tensor) else None
        descs = self._descs(q, k, v, out, lse, sample_max_logit)
        args = self._args(descs, handle)
        h = ctypes.c_void_p()
        _lib.check(_lib.lib().fs_flex_fwd_create(ctypes.byref(args), ctypes.byref(h)), "FlexAttentionFwd")
        self._handle = h
        self._specs = _specs(self._NAMES, (q, k, v, out, lse, sample_max_logit))
        self._tls = _ThreadArgs()
        # The explicit API keeps its sample plan alive; internal cached objects (owned by
        # the plan itself) must not, or plan and cache would form a cycle.
        self._plan = plan if _hold_plan else None
        self._supported = False
        self._compiled = False
        self._workspace_size: Optional[int] = None

    _NAMES = ("q", "k", "v", "out", "lse", "max_logit")
    _NAME = "FlexAttentionFwd"
    _C = "fwd"
    _EXECUTE = "FlexAttentionFwd.execute"  # prefix of every execute() error

    @staticmethod
    def _descs(q, k, v, out, lse, max_logit):
        return (
            _lib.TensorDesc(q, "q"),
            _lib.TensorDesc(k, "k"),
            _lib.TensorDesc(v, "v"),
            _lib.TensorDesc(out, "out"),
            _lib.desc(lse, "lse"),
            _lib.desc(max_logit, "max_logit"),
        )

    def _args(self, d, plan_handle) -> _lib.FsFlexFwdArgs:
        return _lib.FsFlexFwdArgs(
            _lib.ptr(d[0]),
            _lib.ptr(d[1]),
            _lib.ptr(d[2]),
            _lib.ptr(d[3]),
            plan_handle,
            _lib.ptr(d[4]),
            _lib.ptr(d[5]),
            self._scale,
            self._has_scale,
        )

    def execute(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        out: torch.Tensor,
        plan: MaskPlan,
        lse: Optional[torch.Tensor] = None,
        workspace: Optional[torch.Tensor] = None,
        max_logit_tensor: Optional[torch.Tensor] = None,
    ) -> None:
        """Writes out (and lse / max_logit_tensor when compiled with them) on the current stream.

        Tensors must match the compiled descriptors; the plan must be compatible with
        the sample plan. Allocates nothing and never synchronises.
        """
        where = self._EXECUTE
        handle = self._live()
        plan_handle = _check_plan(plan, where)
        if not isinstance(q, torch.Tensor):
            raise TypeError(f"{where}: q must be a torch.Tensor, got {type(q).__name__}")
        ws_ptr, ws_bytes = _workspace_ptr(workspace, self.workspace_size, q.device, where)
        tls = self._tls
        if tls.args is None:
            tls.descs = tuple(None if sp is None else sp.desc() for sp in self._specs)
            tls.args = self._args(tls.descs, None)
        for spec, d, t, name in zip(self._specs, tls.descs, (q, k, v, out, lse, max_logit_tensor), self._NAMES):
            _bind(spec, d, t, name, where)
        args = tls.args
        args.plan = plan_handle
        # C-layer errors come back as "FlexAttentionFwd.execute: <argument>: <rule>".
        _lib.check(_lib.on_device(q, self._launch, handle, args, ws_ptr, ws_bytes, q), where)


class FlexAttentionBwd(_OpBase):
    """Precompiled, allocation-free flex-attention backward (dq, dk, dv from dout and the forward's lse).

    Same lifecycle as :class:`FlexAttentionFwd`. The plan must have been built with
    backward metadata. dq/dk/dv have the shapes and dtypes of q/k/v; with GQA, dk/dv
    sum over the query heads of a kv head. ``deterministic=True`` makes them bitwise
    reproducible. ``dlse`` (optional, fp32, the shape of lse) is the loss gradient with
    respect to the forward's LSE: it adds ``dlse_i * P_ij`` to the score gradient at no extra
    cost; give it at construction and then at every ``execute`` (or never).

    Example::

        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        bwd = FlexAttentionBwd(q, k, v, out, do, lse, dq, dk, dv, plan)
        bwd.check_support()
        bwd.compile()
        ws = torch.empty(bwd.workspace_size, dtype=torch.uint8, device=q.device)
        bwd.execute(q, k, v, out, do, lse, dq, dk, dv, plan, workspace=ws)
    """

    def __init__(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        out: torch.Tensor,
        do: torch.Tensor,
        lse: torch.Tensor,
        dq: torch.Tensor,
        dk: torch.Tensor,
        dv: torch.Tensor,
        plan: MaskPlan,
        softmax_scale: Optional[float] = None,
        deterministic: bool = False,
        dlse: Optional[torch.Tensor] = None,
        _hold_plan: bool = True,
    ):
        self._handle = None
        handle = _check_plan(plan, type(self).__name__)
        if not plan.has_backward:
            raise ValueError(
                "FlexAttentionBwd: plan: needs a plan built with backward metadata "
                "(create_mask_plan(..., build_backward=True))"
            )
        self._scale, self._has_scale = _scale_fields(softmax_scale)
        self.softmax_scale = softmax_scale
        self.deterministic = bool(deterministic)
        self.has_dlse = dlse is not None
        self.device = q.device if isinstance(q, torch.Tensor) else None
        descs = self._descs(q, k, v, out, do, lse, dq, dk, dv, dlse)
        args = self._args(descs, handle)
        h = ctypes.c_void_p()
        _lib.check(_lib.lib().fs_flex_bwd_create(ctypes.byref(args), ctypes.byref(h)), "FlexAttentionBwd")
        self._handle = h
        self._specs = _specs(self._NAMES, (q, k, v, out, do, lse, dq, dk, dv, dlse))
        self._tls = _ThreadArgs()
        self._plan = plan if _hold_plan else None
        self._supported = False
        self._compiled = False
        self._workspace_size: Optional[int] = None

    _NAMES = ("q", "k", "v", "out", "do", "lse", "dq", "dk", "dv", "dlse")
    _NAME = "FlexAttentionBwd"
    _C = "bwd"
    _EXECUTE = "FlexAttentionBwd.execute"  # prefix of every execute() error

    @staticmethod
    def _descs(q, k, v, out, do, lse, dq, dk, dv, dlse):
        names = FlexAttentionBwd._NAMES
        required = tuple(_lib.TensorDesc(t, n) for t, n in zip((q, k, v, out, do, lse, dq, dk, dv), names))
        return required + (_lib.desc(dlse, "dlse"),)

    def _args(self, d, plan_handle) -> _lib.FsFlexBwdArgs:
        return _lib.FsFlexBwdArgs(
            *(_lib.ptr(x) for x in d[:9]),
            plan_handle,
            self._scale,
            self._has_scale,
            1 if self.deterministic else 0,
            _lib.ptr(d[9]),
        )

    def execute(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        out: torch.Tensor,
        do: torch.Tensor,
        lse: torch.Tensor,
        dq: torch.Tensor,
        dk: torch.Tensor,
        dv: torch.Tensor,
        plan: MaskPlan,
        workspace: Optional[torch.Tensor] = None,
        dlse: Optional[torch.Tensor] = None,
    ) -> None:
        """Writes dq, dk, dv on the current stream; allocates nothing and never synchronises.

        dlse (fp32, shape of lse) must be given exactly when the object was constructed with one.
        """
        where = self._EXECUTE
        handle = self._live()
        plan_handle = _check_plan(plan, where)
        if not isinstance(q, torch.Tensor):
            raise TypeError(f"{where}: q must be a torch.Tensor, got {type(q).__name__}")
        ws_ptr, ws_bytes = _workspace_ptr(workspace, self.workspace_size, q.device, where)
        tls = self._tls
        if tls.args is None:
            tls.descs = tuple(None if sp is None else sp.desc() for sp in self._specs)
            tls.args = self._args(tls.descs, None)
        tensors = (q, k, v, out, do, lse, dq, dk, dv, dlse)
        for spec, d, t, name in zip(self._specs, tls.descs, tensors, self._NAMES):
            _bind(spec, d, t, name, where)
        args = tls.args
        args.plan = plan_handle
        _lib.check(_lib.on_device(q, self._launch, handle, args, ws_ptr, ws_bytes, q), where)


# ---------------------------------------------------------------------------
# Allocating helpers (used by the custom ops behind flex_attn_func)
# ---------------------------------------------------------------------------

_CACHE_LIMIT = 64


def _strides(*ts: Optional[torch.Tensor]) -> tuple:
    # Shapes, dtype and device of every tensor are fixed by the plan; only strides vary
    # between calls. A tensor that breaks the plan's geometry is still rejected, by the
    # cached op's descriptor check (_bind) and then by the C layer.
    return tuple(None if t is None else t.stride() for t in ts)


def _cached(plan: MaskPlan, key: tuple, make):
    cache = plan._op_cache
    op = cache.get(key)
    if op is None:
        if len(cache) >= _CACHE_LIMIT:
            cache.clear()
        op = make()
        op.check_support()
        op.compile()
        cache[key] = op
    return op


def lse_shape_of(q: torch.Tensor) -> tuple[int, ...]:
    """LSE shape for q: BSHD [B,Hq,Sq], THD [Hq,Tq]."""
    if q.dim() == 4:
        return (q.shape[0], q.shape[2], q.shape[1])
    return (q.shape[1], q.shape[0])


def run_forward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    plan: MaskPlan,
    softmax_scale: Optional[float],
    want_max_logit: bool,
) -> tuple[torch.Tensor, torch.Tensor, Optional[torch.Tensor]]:
    """Allocates out, lse (and max_logit) and runs the forward: (out, lse, max_logit or None)."""
    out = torch.empty((*q.shape[:-1], v.shape[-1]), dtype=q.dtype, device=q.device)
    lse = torch.empty(lse_shape_of(q), dtype=torch.float32, device=q.device)
    max_logit = torch.empty((q.shape[-2],), dtype=torch.float32, device=q.device) if want_max_logit else None
    key = ("fwd", _strides(q, k, v), want_max_logit, softmax_scale)
    op = _cached(
        plan,
        key,
        lambda: FlexAttentionFwd(q, k, v, out, plan, lse, max_logit, softmax_scale, _hold_plan=False),
    )
    n = op.workspace_size
    ws = torch.empty(n, dtype=torch.uint8, device=q.device) if n else None
    op.execute(q, k, v, out, plan, lse, workspace=ws, max_logit_tensor=max_logit)
    return out, lse, max_logit


def _run_backward_once(q, k, v, out, do, lse, dq, dk, dv, plan, softmax_scale, deterministic, dlse=None):
    key = ("bwd", _strides(q, k, v, out, do, lse, dq, dk, dv, dlse), softmax_scale, bool(deterministic))
    op = _cached(
        plan,
        key,
        lambda: FlexAttentionBwd(
            q, k, v, out, do, lse, dq, dk, dv, plan, softmax_scale, deterministic, dlse=dlse, _hold_plan=False
        ),
    )
    n = op.workspace_size
    ws = torch.empty(n, dtype=torch.uint8, device=q.device) if n else None
    op.execute(q, k, v, out, do, lse, dq, dk, dv, plan, workspace=ws, dlse=dlse)


def run_backward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    do: Optional[torch.Tensor],
    lse: torch.Tensor,
    dlse: Optional[torch.Tensor],
    plan: MaskPlan,
    softmax_scale: Optional[float],
    deterministic: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Allocates dq, dk, dv and runs the backward, including the gradient of lse when dlse is given.

    With g = dlse, d(lse_i)/d(S_ij) = P_ij, so the score gradient becomes
    dS_ij = P_ij (dP_ij - D_i + g_i): the library takes g as the optional dlse input of
    the backward and folds it into D_i = dO_i . O_i (one backward call either way).
    """
    if do is None:
        do = torch.zeros_like(out)
    elif do.stride(-1) != 1:
        do = do.contiguous()
    if dlse is not None:
        # Autograd may hand an expanded (stride-0) or non-fp32 gradient: one dense fp32 copy.
        dlse = dlse.to(torch.float32).contiguous()
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    _run_backward_once(q, k, v, out, do, lse, dq, dk, dv, plan, softmax_scale, deterministic, dlse)
    return dq, dk, dv
