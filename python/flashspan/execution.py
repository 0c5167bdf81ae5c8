"""Explicit FlexAttentionFwd / FlexAttentionBwd: check_support -> compile -> execute with caller buffers."""

from __future__ import annotations

import ctypes
import inspect
import re
import threading
import warnings
from typing import Any, Optional

import torch

from . import _lib
from ._checks import _short_repr, check_flag, check_softmax_scale
from .plan import MaskPlan

# The workspace must start on this boundary (the seed's rule, which its kernels carve from).
WORKSPACE_ALIGNMENT = 128

# Default of FlexAttentionBwd.execute's workspace, which the seed's signature makes required (keyword-only, no
# default): the parameter needs a default only because the deprecated keywords (**legacy) follow it.
_WORKSPACE_REQUIRED = object()


def _check_plan(plan: MaskPlan, where: str, name: str = "mask_plan") -> ctypes.c_void_p:
    """The live handle of ``plan``; errors start with ``where`` (the call that got it) and ``name`` (the parameter
    that took it: sample_mask_plan at construction, mask_plan in execute())."""
    if not isinstance(plan, MaskPlan):
        raise TypeError(f"{where}: {name}: must be a flashspan.MaskPlan, got {type(plan).__name__}")
    try:
        return plan._live_handle
    except ValueError as e:
        raise ValueError(f"{where}: {e}") from None


def _named(e: Exception, where: str, names: dict) -> Exception:
    """``e`` (a broken rule from the C layer, ``where: a, b: rule``) with the arguments it starts with renamed by
    ``names`` (the C layer's tensor names -> the parameters of the call that failed, e.g. out -> sample_o at
    construction, o_tensor in execute()); ``e`` itself when it names none of them."""
    msg = str(e)
    head = f"{where}: "
    m = re.match(r"(\w+(?:, \w+)*): ", msg[len(head):]) if msg.startswith(head) else None
    if m is None or not any(n in names for n in m.group(1).split(", ")):
        return e
    lead = ", ".join(names.get(n, n) for n in m.group(1).split(", "))
    return type(e)(f"{head}{lead}: {msg[len(head) + m.end():]}")


def _create(fn, args, where: str, names: dict):
    """Creates the C operation; a broken rule's message names the constructor's parameters (_named)."""
    h = ctypes.c_void_p()
    try:
        _lib.check(fn(ctypes.byref(args), ctypes.byref(h)), where)
    except (TypeError, ValueError, NotImplementedError) as e:
        raise _named(e, where, names) from None
    return h


def _scale_fields(softmax_scale: Optional[float]) -> tuple[float, int]:
    if softmax_scale is None:
        return 0.0, 0
    return float(softmax_scale), 1


def _workspace_ptr(
    workspace: Optional[torch.Tensor], need: int, device: torch.device, where: str
) -> tuple[Optional[int], int]:
    """(pointer, bytes) of a caller workspace, checked host-side (the C layer cannot see its device).

    The workspace may be any contiguous tensor (any dtype: it is used as bytes) whose start
    is 128-byte aligned, on the device of the call, of at least ``need`` bytes. Errors are
    ValueError (TypeError for a non-tensor) and start with ``where`` (e.g.
    ``"FlexAttentionFwd.execute"``).
    """
    if workspace is None:
        if need > 0:
            raise ValueError(
                f"{where}: workspace: this call needs a workspace of at least {need} bytes on {device} "
                "(allocate workspace_size bytes once, e.g. torch.empty(n, dtype=torch.uint8), and pass workspace=...)"
            )
        return None, 0
    if not isinstance(workspace, torch.Tensor):
        raise TypeError(f"{where}: workspace must be a torch.Tensor, got {type(workspace).__name__}")
    if workspace.device != device and need > 0:
        raise ValueError(f"{where}: workspace is on {workspace.device} but the call runs on {device}")
    if need > 0 and not workspace.is_contiguous():
        raise ValueError(f"{where}: workspace must be contiguous")
    nbytes = workspace.numel() * workspace.element_size()
    if nbytes < need:
        raise ValueError(f"{where}: workspace has {nbytes} bytes but this call needs workspace_size = {need} bytes")
    ptr = workspace.data_ptr()
    if need > 0 and ptr % WORKSPACE_ALIGNMENT != 0:
        raise ValueError(
            f"{where}: workspace must start on a {WORKSPACE_ALIGNMENT}-byte boundary (data_ptr() % "
            f"{WORKSPACE_ALIGNMENT} == {ptr % WORKSPACE_ALIGNMENT}); pass a fresh allocation, not an offset view"
        )
    return (ptr or None), nbytes


def _raw_stream(current_stream: Any, device: torch.device, where: str) -> Optional[int]:
    """cudaStream_t (int) to launch on: ``current_stream`` (a torch.cuda.Stream, a cuda-python
    CUstream or an int handle) or, when None, torch's current stream of ``device``. None on the CPU, where a
    stream is checked (TypeError for another type, as on CUDA) and not used."""
    cuda = device.type == "cuda"
    if current_stream is None:
        return _lib.current_raw_stream(device) if cuda else None
    handle = None
    if isinstance(current_stream, torch.cuda.Stream):
        handle = current_stream.cuda_stream
    elif not isinstance(current_stream, (bool, str, bytes, float)):  # int("5") would parse, int(1.5) truncate
        try:
            handle = int(current_stream)
        except (TypeError, ValueError):
            getptr = getattr(current_stream, "getPtr", None)
            if getptr is not None:
                handle = int(getptr())
    if handle is None:
        raise TypeError(
            f"{where}: current_stream: must be None, a torch.cuda.Stream or a CUDA stream handle (an int or a "
            f"cuda-python CUstream), got {type(current_stream).__name__} {_short_repr(current_stream)}"
        )
    return handle if cuda else None


def _record_streams(tensors, current_stream: Any, device: torch.device) -> None:
    """With an explicit stream, tell torch's caching allocator the tensors are used there (as the seed does)."""
    if current_stream is None or device.type != "cuda":
        return
    stream = current_stream
    if not isinstance(stream, torch.cuda.Stream):
        stream = torch.cuda.ExternalStream(_raw_stream(current_stream, device, ""), device=device)
    for t in tensors:
        if isinstance(t, torch.Tensor) and t.is_cuda:
            t.record_stream(stream)


def _legacy_kwargs(where: str, legacy: dict, aliases: dict, values: dict) -> dict:
    """Maps deprecated keyword names (``aliases``: old name -> seed name) onto ``values``.

    TypeError for an unknown keyword or a value given under both names; DeprecationWarning otherwise.
    """
    for old, value in legacy.items():
        new = aliases.get(old)
        if new is None:
            raise TypeError(f"{where}() got an unexpected keyword argument {old!r}")
        if values.get(new) is not None:
            raise TypeError(f"{where}() got values for both {new!r} and its deprecated name {old!r}")
        if new == old:  # a constructor keyword that moved to execute() (softmax_scale)
            msg = (f"{where}: the constructor's keyword {old!r} is deprecated; pass it to every call, "
                   f"execute(..., {old}=...), as the seed does (the constructor's value is only execute()'s default)")
        else:
            msg = f"{where}: keyword {old!r} is deprecated; use {new!r} (the seed's name)"
        warnings.warn(msg, DeprecationWarning, stacklevel=3)
        values[new] = value
    return values


def _with_signature(stub):
    """Gives the decorated function the signature of ``stub`` for introspection (the seed's), while
    the function itself also accepts deprecated keyword names through ``**legacy``."""

    def wrap(fn):
        fn.__signature__ = inspect.signature(stub)
        return fn

    return wrap


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

    Errors start with ``where: name`` (e.g. ``"FlexAttentionFwd.execute: q_tensor: ..."``).
    """
    if t is None:
        if spec is not None:
            raise ValueError(f"{where}: {name}: is required (it was given at construction)")
        return
    if spec is None:
        raise ValueError(f"{where}: {name}: was not given at construction, so it must be None")
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{where}: {name}: must be a torch.Tensor, got {type(t).__name__}")
    # ValueError for every descriptor mismatch, dtype and device included (the seed's rule).
    if t.dtype != spec.dtype:
        raise ValueError(f"{where}: {name}: dtype {t.dtype} differs from the compiled {spec.dtype}")
    if t.device != spec.device:
        raise ValueError(f"{where}: {name}: device {t.device} differs from the compiled {spec.device}")
    if t.shape != spec.shape:
        raise ValueError(
            f"{where}: {name}: shape {tuple(t.shape)} differs from the compiled {tuple(spec.shape)} "
            f"(compile a new object for a new geometry)"
        )
    if t.stride() != spec.stride:
        raise ValueError(
            f"{where}: {name}: strides {t.stride()} differ from the compiled {tuple(spec.stride)} (same shape "
            f"{tuple(t.shape)}; the compiled descriptor fixes the memory layout: pass a tensor laid out like the sample)"
        )
    d.struct.data = t.data_ptr() or None


def _bind_all(specs: tuple, descs: tuple, tensors: tuple, names: tuple, where: str) -> None:
    """_bind of every argument: one loop whose common case (a tensor with the compiled dtype, shape, strides and
    device) only swaps the data pointer; anything else goes through _bind, which names the broken rule."""
    for spec, d, t, name in zip(specs, descs, tensors, names):
        if (
            spec is not None and isinstance(t, torch.Tensor) and t.dtype == spec.dtype and t.shape == spec.shape
            and t.stride() == spec.stride and t.device == spec.device
        ):
            d.struct.data = t.data_ptr() or None
        elif spec is not None or t is not None:
            _bind(spec, d, t, name, where)


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
    _execute_fn = None  # fs_flex_<_C>_execute, looked up on first use

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
        """Bytes of workspace execute() needs (on the device of the tensors; 0 on the CPU)."""
        if self._workspace_size is None:
            n = ctypes.c_size_t()
            _lib.check(self._fn("workspace_size")(self._live(), ctypes.byref(n)), f"{self._NAME}.workspace_size")
            self._workspace_size = int(n.value)
        return self._workspace_size

    def _begin_execute(self, where: str, mask_plan, q, workspace, softmax_scale, want_max_logit: bool):
        """Checks shared by both execute()s; returns (handle, plan handle, workspace ptr, bytes, scale fields)."""
        handle = self._live()
        if not self._compiled:
            # The seed raises RuntimeError for a launch before compile().
            raise RuntimeError(f"{where}: compile() must be called before execute()")
        plan_handle = _check_plan(mask_plan, where)
        if not isinstance(q, torch.Tensor):
            raise TypeError(f"{where}: q_tensor: must be a torch.Tensor, got {type(q).__name__}")
        scale = check_softmax_scale(softmax_scale, where, want_max_logit)
        if scale is None:
            scale = self._default_scale
        ws_ptr, ws_bytes = _workspace_ptr(workspace, self.workspace_size, q.device, where)
        return handle, plan_handle, ws_ptr, ws_bytes, _scale_fields(scale)

    def _launch(self, handle, args, ws_ptr, ws_bytes, stream) -> int:
        fn = self._execute_fn
        if fn is None:
            fn = self._execute_fn = self._fn("execute")
        return fn(handle, ctypes.byref(args), ws_ptr, ws_bytes, stream)

    def __del__(self):
        h = getattr(self, "_handle", None)
        if h is not None:
            self._handle = None
            try:
                self._fn("destroy")(h)
            except Exception:
                pass


def _fwd_init_signature(
    self,
    sample_q: torch.Tensor,
    sample_k: torch.Tensor,
    sample_v: torch.Tensor,
    sample_o: torch.Tensor,
    sample_mask_plan: MaskPlan,
    sample_lse: Optional[torch.Tensor] = None,
    *,
    sm90_use_smem_mask_pipeline: bool = True,
    sample_max_logit: Optional[torch.Tensor] = None,
) -> None:  # pragma: no cover - signature only
    pass


def _fwd_execute_signature(
    self,
    q_tensor: torch.Tensor,
    k_tensor: torch.Tensor,
    v_tensor: torch.Tensor,
    o_tensor: torch.Tensor,
    mask_plan: MaskPlan,
    lse_tensor: Optional[torch.Tensor] = None,
    *,
    workspace: Optional[torch.Tensor] = None,
    softmax_scale: Optional[float] = None,
    current_stream: Any = None,
    max_logit_tensor: Optional[torch.Tensor] = None,
) -> None:  # pragma: no cover - signature only
    pass


class FlexAttentionFwd(_OpBase):
    """Precompiled, allocation-free flex-attention forward (the seed's constructor and execute()).

    ``FlexAttentionFwd(sample_q, sample_k, sample_v, sample_o, sample_mask_plan,
    sample_lse=None, *, sm90_use_smem_mask_pipeline=True, sample_max_logit=None)`` captures
    sample descriptors (shape, strides, dtype, device of q/k/v/o, presence of lse and
    max_logit) and a sample plan. ``check_support()`` and ``compile()`` prepare the launch;
    ``execute()`` accepts new tensors with the same descriptors and any compatible plan,
    allocates nothing and runs on ``current_stream`` (default: torch's current stream; CUDA
    graph capturable). On CPU tensors the same object runs the CPU reference backend.

    Shapes: BSHD q ``[B,Sq,Hq,Dqk]`` k ``[B,Sk,Hkv,Dqk]`` v ``[B,Sk,Hkv,Dv]`` o
    ``[B,Sq,Hq,Dv]`` lse fp32 ``[B,Hq,Sq]``; THD drops B (lse ``[Hq,Tq]``);
    max_logit fp32 ``[Hq]`` (reset to -inf by each execute, then reduced into). With float64 q / k / v
    (CPU tensors only) lse and max_logit are float64 (``flashspan.execution.stats_dtype_of(q)``).

    ``sm90_use_smem_mask_pipeline`` is accepted for the seed's sake (a bool; flashspan's
    kernels choose their own mask pipeline). The deprecated keyword ``softmax_scale`` (the
    scale used when execute() gets none) and the keyword names ``q, k, v, out, plan, lse``
    of earlier versions still work with a DeprecationWarning.

    Errors: TypeError (not a tensor / MaskPlan, a flag that is not a bool), ValueError
    (descriptor or geometry breaks a rule, scale), RuntimeError (execute before compile,
    unsupported configuration, CUDA failure); messages name the argument and the rule.

    Example::

        out = torch.empty((*q.shape[:-1], v.shape[-1]), dtype=q.dtype, device=q.device)
        lse = torch.empty((q.shape[0], q.shape[2], q.shape[1]), dtype=torch.float32, device=q.device)  # fp64 q: fp64
        fwd = FlexAttentionFwd(q, k, v, out, plan, lse)
        fwd.check_support()
        fwd.compile()
        ws = torch.empty(fwd.workspace_size, dtype=torch.uint8, device=q.device)
        fwd.execute(q, k, v, out, plan, lse, workspace=ws)
    """

    _LEGACY_INIT = {"q": "sample_q", "k": "sample_k", "v": "sample_v", "out": "sample_o",
                    "plan": "sample_mask_plan", "lse": "sample_lse", "softmax_scale": "softmax_scale"}
    _LEGACY_EXECUTE = {"q": "q_tensor", "k": "k_tensor", "v": "v_tensor", "out": "o_tensor", "plan": "mask_plan",
                       "lse": "lse_tensor"}

    @_with_signature(_fwd_init_signature)
    def __init__(
        self,
        sample_q: Optional[torch.Tensor] = None,
        sample_k: Optional[torch.Tensor] = None,
        sample_v: Optional[torch.Tensor] = None,
        sample_o: Optional[torch.Tensor] = None,
        sample_mask_plan: Optional[MaskPlan] = None,
        sample_lse: Optional[torch.Tensor] = None,
        *,
        sm90_use_smem_mask_pipeline: bool = True,
        sample_max_logit: Optional[torch.Tensor] = None,
        _hold_plan: bool = True,
        **legacy,
    ):
        self._handle = None
        where = type(self).__name__
        a = _legacy_kwargs(where, legacy, self._LEGACY_INIT, {
            "sample_q": sample_q, "sample_k": sample_k, "sample_v": sample_v, "sample_o": sample_o,
            "sample_mask_plan": sample_mask_plan, "sample_lse": sample_lse, "softmax_scale": None})
        for name in ("sample_q", "sample_k", "sample_v", "sample_o", "sample_mask_plan"):
            if a[name] is None:
                raise TypeError(f"{where}() missing required argument {name!r}")
        q, k, v, out, plan, lse = (a[n] for n in ("sample_q", "sample_k", "sample_v", "sample_o",
                                                   "sample_mask_plan", "sample_lse"))
        check_flag("sm90_use_smem_mask_pipeline", sm90_use_smem_mask_pipeline, where)
        handle = _check_plan(plan, where, "sample_mask_plan")
        self._default_scale = check_softmax_scale(a["softmax_scale"], where, sample_max_logit is not None)
        self._scale, self._has_scale = _scale_fields(self._default_scale)
        self.softmax_scale = self._default_scale
        self.has_lse = lse is not None
        self.has_max_logit = sample_max_logit is not None
        self.device = q.device if isinstance(q, torch.Tensor) else None
        descs = self._descs(q, k, v, out, lse, sample_max_logit)
        args = self._args(descs, handle)
        self._handle = _create(_lib.lib().fs_flex_fwd_create, args, where, self._SAMPLE_NAMES)
        self._specs = _specs(self._NAMES, (q, k, v, out, lse, sample_max_logit))
        self._tls = _ThreadArgs()
        # The explicit API keeps its sample plan alive; internal cached objects (owned by
        # the plan itself) must not, or plan and cache would form a cycle.
        self._plan = plan if _hold_plan else None
        self._supported = False
        self._compiled = False
        self._workspace_size: Optional[int] = None

    # execute()'s parameters, in the order of the compiled descriptors (errors name them so), and the constructor's
    # for the C layer's names of the same tensors.
    _NAMES = ("q_tensor", "k_tensor", "v_tensor", "o_tensor", "lse_tensor", "max_logit_tensor")
    _SAMPLE_NAMES = {"q": "sample_q", "k": "sample_k", "v": "sample_v", "out": "sample_o", "o": "sample_o",
                     "lse": "sample_lse", "max_logit": "sample_max_logit", "plan": "sample_mask_plan"}
    _EXECUTE_NAMES = {"q": "q_tensor", "k": "k_tensor", "v": "v_tensor", "out": "o_tensor", "o": "o_tensor",
                      "lse": "lse_tensor", "max_logit": "max_logit_tensor", "plan": "mask_plan"}
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

    @_with_signature(_fwd_execute_signature)
    def execute(
        self,
        q_tensor: Optional[torch.Tensor] = None,
        k_tensor: Optional[torch.Tensor] = None,
        v_tensor: Optional[torch.Tensor] = None,
        o_tensor: Optional[torch.Tensor] = None,
        mask_plan: Optional[MaskPlan] = None,
        lse_tensor: Optional[torch.Tensor] = None,
        *,
        workspace: Optional[torch.Tensor] = None,
        softmax_scale: Optional[float] = None,
        current_stream: Any = None,
        max_logit_tensor: Optional[torch.Tensor] = None,
        **legacy,
    ) -> None:
        """Writes o (and lse / max_logit_tensor when compiled with them) on ``current_stream``.

        Tensors must match the compiled descriptors (ValueError otherwise); the plan must be
        compatible with the sample plan. ``softmax_scale`` (finite; >= 0 with max_logit)
        defaults to ``1/sqrt(Dqk)``. ``workspace``: any contiguous tensor of at least
        ``workspace_size`` bytes on the call's device, 128-byte aligned (None when
        workspace_size is 0). ``current_stream``: torch.cuda.Stream or raw CUDA stream
        handle; None = torch's current stream. Allocates nothing and never synchronises.
        RuntimeError before compile().
        """
        where = self._EXECUTE
        if legacy:
            a = _legacy_kwargs(where, legacy, self._LEGACY_EXECUTE, {
                "q_tensor": q_tensor, "k_tensor": k_tensor, "v_tensor": v_tensor, "o_tensor": o_tensor,
                "mask_plan": mask_plan, "lse_tensor": lse_tensor})
            q_tensor, k_tensor, v_tensor, o_tensor, mask_plan, lse_tensor = (
                a[n] for n in ("q_tensor", "k_tensor", "v_tensor", "o_tensor", "mask_plan", "lse_tensor"))
        q = q_tensor
        handle, plan_handle, ws_ptr, ws_bytes, (scale, has_scale) = self._begin_execute(
            where, mask_plan, q, workspace, softmax_scale, self.has_max_logit)
        tls = self._tls
        if tls.args is None:
            tls.descs = tuple(None if sp is None else sp.desc() for sp in self._specs)
            tls.args = self._args(tls.descs, None)
        tensors = (q_tensor, k_tensor, v_tensor, o_tensor, lse_tensor, max_logit_tensor)
        _bind_all(self._specs, tls.descs, tensors, self._NAMES, where)
        args = tls.args
        args.plan = plan_handle
        args.softmax_scale = scale
        args.has_softmax_scale = has_scale
        stream = _raw_stream(current_stream, q.device, where)
        # C-layer errors come back as "FlexAttentionFwd.execute: <argument>: <rule>".
        try:
            _lib.check(_lib.on_device(q, self._launch, handle, args, ws_ptr, ws_bytes, stream), where)
        except (TypeError, ValueError, NotImplementedError) as e:
            raise _named(e, where, self._EXECUTE_NAMES) from None
        if current_stream is not None:
            _record_streams(tensors + (workspace,), current_stream, q.device)


def _bwd_init_signature(
    self,
    sample_q: torch.Tensor,
    sample_k: torch.Tensor,
    sample_v: torch.Tensor,
    sample_o: torch.Tensor,
    sample_do: torch.Tensor,
    sample_lse: torch.Tensor,
    sample_dq: torch.Tensor,
    sample_dk: torch.Tensor,
    sample_dv: torch.Tensor,
    sample_mask_plan: MaskPlan,
    sample_dlse: Optional[torch.Tensor] = None,
    *,
    deterministic: bool = False,
) -> None:  # pragma: no cover - signature only
    pass


def _bwd_execute_signature(
    self,
    q_tensor: torch.Tensor,
    k_tensor: torch.Tensor,
    v_tensor: torch.Tensor,
    o_tensor: torch.Tensor,
    do_tensor: torch.Tensor,
    lse_tensor: torch.Tensor,
    dq_tensor: torch.Tensor,
    dk_tensor: torch.Tensor,
    dv_tensor: torch.Tensor,
    mask_plan: MaskPlan,
    dlse_tensor: Optional[torch.Tensor] = None,
    *,
    workspace: Optional[torch.Tensor],
    softmax_scale: Optional[float] = None,
    current_stream: Any = None,
) -> None:  # pragma: no cover - signature only
    pass


class FlexAttentionBwd(_OpBase):
    """Precompiled, allocation-free flex-attention backward (dq, dk, dv from do and the forward's lse).

    ``FlexAttentionBwd(sample_q, sample_k, sample_v, sample_o, sample_do, sample_lse,
    sample_dq, sample_dk, sample_dv, sample_mask_plan, sample_dlse=None, *,
    deterministic=False)``: same lifecycle as :class:`FlexAttentionFwd`. The plan must have
    been built with backward metadata. dq/dk/dv have the shapes and dtypes of q/k/v; with
    GQA, dk/dv sum over the query heads of a kv head. ``deterministic=True`` (a bool) makes
    them bitwise reproducible. ``sample_dlse`` (optional; lse's dtype, fp32 or fp64 for fp64
    inputs; the shape of lse) is the loss gradient with respect to the forward's LSE: it adds ``dlse_i * P_ij`` to the score
    gradient at no extra cost; give it at construction and then as ``dlse_tensor`` at every
    ``execute`` (or never). The deprecated keywords ``softmax_scale`` (the scale used when
    execute() gets none) and ``dlse`` still work with a DeprecationWarning.

    Example::

        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        bwd = FlexAttentionBwd(q, k, v, out, do, lse, dq, dk, dv, plan)
        bwd.check_support()
        bwd.compile()
        ws = torch.empty(bwd.workspace_size, dtype=torch.uint8, device=q.device)
        bwd.execute(q, k, v, out, do, lse, dq, dk, dv, plan, workspace=ws)
    """

    _LEGACY_INIT = {"q": "sample_q", "k": "sample_k", "v": "sample_v", "out": "sample_o", "do": "sample_do",
                    "lse": "sample_lse", "dq": "sample_dq", "dk": "sample_dk", "dv": "sample_dv",
                    "plan": "sample_mask_plan", "dlse": "sample_dlse", "softmax_scale": "softmax_scale"}
    _LEGACY_EXECUTE = {"q": "q_tensor", "k": "k_tensor", "v": "v_tensor", "out": "o_tensor", "do": "do_tensor",
                       "lse": "lse_tensor", "dq": "dq_tensor", "dk": "dk_tensor", "dv": "dv_tensor",
                       "plan": "mask_plan", "dlse": "dlse_tensor"}
    _REQUIRED = ("sample_q", "sample_k", "sample_v", "sample_o", "sample_do", "sample_lse", "sample_dq",
                 "sample_dk", "sample_dv", "sample_mask_plan")

    @_with_signature(_bwd_init_signature)
    def __init__(
        self,
        sample_q: Optional[torch.Tensor] = None,
        sample_k: Optional[torch.Tensor] = None,
        sample_v: Optional[torch.Tensor] = None,
        sample_o: Optional[torch.Tensor] = None,
        sample_do: Optional[torch.Tensor] = None,
        sample_lse: Optional[torch.Tensor] = None,
        sample_dq: Optional[torch.Tensor] = None,
        sample_dk: Optional[torch.Tensor] = None,
        sample_dv: Optional[torch.Tensor] = None,
        sample_mask_plan: Optional[MaskPlan] = None,
        sample_dlse: Optional[torch.Tensor] = None,
        *,
        deterministic: bool = False,
        _hold_plan: bool = True,
        **legacy,
    ):
        self._handle = None
        where = type(self).__name__
        a = _legacy_kwargs(where, legacy, self._LEGACY_INIT, {
            "sample_q": sample_q, "sample_k": sample_k, "sample_v": sample_v, "sample_o": sample_o,
            "sample_do": sample_do, "sample_lse": sample_lse, "sample_dq": sample_dq, "sample_dk": sample_dk,
            "sample_dv": sample_dv, "sample_mask_plan": sample_mask_plan, "sample_dlse": sample_dlse,
            "softmax_scale": None})
        for name in self._REQUIRED:
            if a[name] is None:
                raise TypeError(f"{where}() missing required argument {name!r}")
        plan, dlse = a["sample_mask_plan"], a["sample_dlse"]
        if dlse is not None and not isinstance(dlse, torch.Tensor):
            # Earlier versions took softmax_scale in this position.
            raise TypeError(
                f"{where}: sample_dlse (11th argument) must be a torch.Tensor or None, got {type(dlse).__name__}; "
                "pass the softmax scale to execute(..., softmax_scale=...)"
            )
        deterministic = check_flag("deterministic", deterministic, where)
        handle = _check_plan(plan, where, "sample_mask_plan")
        if not plan.has_backward:
            raise ValueError(
                f"{where}: sample_mask_plan: needs a plan built with backward metadata "
                "(create_mask_plan(..., build_backward=True))"
            )
        self._default_scale = check_softmax_scale(a["softmax_scale"], where)
        self._scale, self._has_scale = _scale_fields(self._default_scale)
        self.softmax_scale = self._default_scale
        self.deterministic = deterministic
        self.has_dlse = dlse is not None
        tensors = tuple(a[n] for n in self._REQUIRED[:9]) + (dlse,)
        q = tensors[0]
        self.device = q.device if isinstance(q, torch.Tensor) else None
        descs = self._descs(*tensors)
        args = self._args(descs, handle)
        self._handle = _create(_lib.lib().fs_flex_bwd_create, args, where, self._SAMPLE_NAMES)
        self._specs = _specs(self._NAMES, tensors)
        self._tls = _ThreadArgs()
        self._plan = plan if _hold_plan else None
        self._supported = False
        self._compiled = False
        self._workspace_size: Optional[int] = None

    _NAMES = ("q_tensor", "k_tensor", "v_tensor", "o_tensor", "do_tensor", "lse_tensor", "dq_tensor", "dk_tensor",
              "dv_tensor", "dlse_tensor")
    _SAMPLE_NAMES = {"q": "sample_q", "k": "sample_k", "v": "sample_v", "out": "sample_o", "o": "sample_o",
                     "do": "sample_do", "dout": "sample_do", "lse": "sample_lse", "dq": "sample_dq",
                     "dk": "sample_dk", "dv": "sample_dv", "dlse": "sample_dlse", "plan": "sample_mask_plan"}
    _EXECUTE_NAMES = {"q": "q_tensor", "k": "k_tensor", "v": "v_tensor", "out": "o_tensor", "o": "o_tensor",
                      "do": "do_tensor", "dout": "do_tensor", "lse": "lse_tensor", "dq": "dq_tensor",
                      "dk": "dk_tensor", "dv": "dv_tensor", "dlse": "dlse_tensor", "plan": "mask_plan"}
    _NAME = "FlexAttentionBwd"
    _C = "bwd"
    _EXECUTE = "FlexAttentionBwd.execute"  # prefix of every execute() error

    @staticmethod
    def _descs(q, k, v, out, do, lse, dq, dk, dv, dlse):
        names = ("q", "k", "v", "out", "do", "lse", "dq", "dk", "dv")
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

    @_with_signature(_bwd_execute_signature)
    def execute(
        self,
        q_tensor: Optional[torch.Tensor] = None,
        k_tensor: Optional[torch.Tensor] = None,
        v_tensor: Optional[torch.Tensor] = None,
        o_tensor: Optional[torch.Tensor] = None,
        do_tensor: Optional[torch.Tensor] = None,
        lse_tensor: Optional[torch.Tensor] = None,
        dq_tensor: Optional[torch.Tensor] = None,
        dk_tensor: Optional[torch.Tensor] = None,
        dv_tensor: Optional[torch.Tensor] = None,
        mask_plan: Optional[MaskPlan] = None,
        dlse_tensor: Optional[torch.Tensor] = None,
        *,
        workspace: Optional[torch.Tensor] = _WORKSPACE_REQUIRED,
        softmax_scale: Optional[float] = None,
        current_stream: Any = None,
        **legacy,
    ) -> None:
        """Writes dq, dk, dv on ``current_stream``; allocates nothing and never synchronises.

        ``dlse_tensor`` (lse's dtype and shape) must be given exactly when the object was
        constructed with ``sample_dlse``. ``workspace`` is keyword-only and required, as in the
        seed (``workspace=None`` when ``workspace_size`` is 0, e.g. on the CPU). Other
        arguments as :meth:`FlexAttentionFwd.execute`.
        """
        where = self._EXECUTE
        if workspace is _WORKSPACE_REQUIRED:
            # The shown (seed's) signature has no default; the call behaves as that signature says.
            raise TypeError(f"{where}() missing 1 required keyword-only argument: 'workspace' (workspace=None "
                            "when workspace_size is 0, e.g. on the CPU)")
        if legacy:
            a = _legacy_kwargs(where, legacy, self._LEGACY_EXECUTE, {
                "q_tensor": q_tensor, "k_tensor": k_tensor, "v_tensor": v_tensor, "o_tensor": o_tensor,
                "do_tensor": do_tensor, "lse_tensor": lse_tensor, "dq_tensor": dq_tensor, "dk_tensor": dk_tensor,
                "dv_tensor": dv_tensor, "mask_plan": mask_plan, "dlse_tensor": dlse_tensor})
            q_tensor, k_tensor, v_tensor, o_tensor, do_tensor, lse_tensor, dq_tensor, dk_tensor, dv_tensor, \
                mask_plan, dlse_tensor = (a[n] for n in self._LEGACY_EXECUTE.values())
        q = q_tensor
        handle, plan_handle, ws_ptr, ws_bytes, (scale, has_scale) = self._begin_execute(
            where, mask_plan, q, workspace, softmax_scale, False)
        tls = self._tls
        if tls.args is None:
            tls.descs = tuple(None if sp is None else sp.desc() for sp in self._specs)
            tls.args = self._args(tls.descs, None)
        tensors = (q_tensor, k_tensor, v_tensor, o_tensor, do_tensor, lse_tensor, dq_tensor, dk_tensor, dv_tensor,
                   dlse_tensor)
        _bind_all(self._specs, tls.descs, tensors, self._NAMES, where)
        args = tls.args
        args.plan = plan_handle
        args.softmax_scale = scale
        args.has_softmax_scale = has_scale
        stream = _raw_stream(current_stream, q.device, where)
        try:
            _lib.check(_lib.on_device(q, self._launch, handle, args, ws_ptr, ws_bytes, stream), where)
        except (TypeError, ValueError, NotImplementedError) as e:
            raise _named(e, where, self._EXECUTE_NAMES) from None
        if current_stream is not None:
            _record_streams(tensors + (workspace,), current_stream, q.device)


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


def stats_dtype_of(q: torch.Tensor) -> torch.dtype:
    """The dtype of flex's LSE / dlse / max_logit for inputs like q: float64 for float64 q (CPU only), else
    float32 (the C layer's rule, core/validation.h flex_stats_dtype)."""
    return torch.float64 if q.dtype == torch.float64 else torch.float32


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
    want_lse: bool = True,
    out: Optional[torch.Tensor] = None,
) -> tuple[torch.Tensor, Optional[torch.Tensor], Optional[torch.Tensor]]:
    """Runs the forward: (out, lse or None, max_logit or None).

    Allocates out (unless given: then the kernel writes it in place, any strides with a contiguous last
    dimension), lse (when ``want_lse``; without it the kernel writes no LSE) and max_logit (``want_max_logit``).
    """
    dev = q.device
    if out is None:
        out = torch.empty((*q.shape[:-1], v.shape[-1]), dtype=q.dtype, device=dev)
    stats = stats_dtype_of(q)
    lse = torch.empty(lse_shape_of(q), dtype=stats, device=dev) if want_lse else None
    max_logit = torch.empty((q.shape[-2],), dtype=stats, device=dev) if want_max_logit else None
    # Shapes, dtype and device of every tensor are fixed by the plan; only strides vary between calls. A tensor
    # that breaks the plan's geometry is still rejected, by the cached op's descriptor check (_bind) and then by
    # the C layer.
    key = ("fwd", q.stride(), k.stride(), v.stride(), out.stride(), want_max_logit, want_lse)
    op = plan._op_cache.get(key)
    if op is None:
        op = _cached(
            plan,
            key,
            lambda: FlexAttentionFwd(q, k, v, out, plan, lse, sample_max_logit=max_logit, _hold_plan=False),
        )
    n = op.workspace_size
    ws = torch.empty(n, dtype=torch.uint8, device=dev) if n else None
    op.execute(q, k, v, out, plan, lse, workspace=ws, softmax_scale=softmax_scale, max_logit_tensor=max_logit)
    return out, lse, max_logit


def _run_backward_once(q, k, v, out, do, lse, dq, dk, dv, plan, softmax_scale, deterministic, dlse=None):
    key = ("bwd", _strides(q, k, v, out, do, lse, dq, dk, dv, dlse), deterministic)
    op = _cached(
        plan,
        key,
        lambda: FlexAttentionBwd(
            q, k, v, out, do, lse, dq, dk, dv, plan, dlse, deterministic=deterministic, _hold_plan=False
        ),
    )
    n = op.workspace_size
    ws = torch.empty(n, dtype=torch.uint8, device=q.device) if n else None
    op.execute(q, k, v, out, do, lse, dq, dk, dv, plan, dlse, workspace=ws, softmax_scale=softmax_scale)


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
        # Autograd may hand an expanded (stride-0) gradient or one of another dtype: one dense copy in lse's dtype.
        dlse = dlse.to(stats_dtype_of(q)).contiguous()
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    _run_backward_once(q, k, v, out, do, lse, dq, dk, dv, plan, softmax_scale, deterministic, dlse)
    return dq, dk, dv
