"""ctypes binding of the flashspan C ABI (include/flashspan/flashspan.h): loading, structs, errors, tensors."""

from __future__ import annotations

import ctypes
import glob
import os
import threading
from ctypes import (
    POINTER,
    Structure,
    c_char,
    c_char_p,
    c_float,
    c_int32,
    c_int64,
    c_size_t,
    c_uint8,
    c_uint16,
    c_uint64,
    c_void_p,
)
from typing import Optional

import torch

# Must equal FLASHSPAN_ABI_VERSION of the header these mirrors were written from.
ABI_VERSION = 3

# fs_status_t
STATUS_SUCCESS = 0
STATUS_INVALID_ARGUMENT = 1
STATUS_TYPE_ERROR = 2
STATUS_NOT_SUPPORTED = 3
STATUS_CUDA_ERROR = 4
STATUS_OUT_OF_MEMORY = 5
STATUS_INTERNAL_ERROR = 6

_STATUS_NAMES = {
    STATUS_INVALID_ARGUMENT: "invalid argument",
    STATUS_TYPE_ERROR: "type error",
    STATUS_NOT_SUPPORTED: "not supported",
    STATUS_CUDA_ERROR: "CUDA error",
    STATUS_OUT_OF_MEMORY: "out of memory",
    STATUS_INTERNAL_ERROR: "internal error",
}

# fs_device_type_t / fs_dtype_code_t (DLPack values)
DEVICE_CPU = 1
DEVICE_CUDA = 2
DTYPE_INT = 0
DTYPE_UINT = 1
DTYPE_FLOAT = 2
DTYPE_BFLOAT = 4
DTYPE_FLOAT8_E4M3FN = 10  # DLPack v1.1 kDLFloat8_e4m3fn
DTYPE_FLOAT8_E5M2 = 12  # kDLFloat8_e5m2


# ---------------------------------------------------------------------------
# Struct mirrors (field order and types exactly as in flashspan.h)
# ---------------------------------------------------------------------------


class FsDevice(Structure):
    _fields_ = [("device_type", c_int32), ("device_id", c_int32)]


class FsDType(Structure):
    _fields_ = [("code", c_uint8), ("bits", c_uint8), ("lanes", c_uint16)]


class FsTensor(Structure):
    _fields_ = [
        ("data", c_void_p),
        ("device", FsDevice),
        ("ndim", c_int32),
        ("dtype", FsDType),
        ("shape", POINTER(c_int64)),
        ("strides", POINTER(c_int64)),
        ("byte_offset", c_uint64),
    ]


FsMaskPlanHandle = c_void_p
FsFlexFwdHandle = c_void_p
FsFlexBwdHandle = c_void_p


class FsMaskPlanArgs(Structure):
    _fields_ = [
        ("mask_func", POINTER(FsTensor)),
        ("q", POINTER(FsTensor)),
        ("k", POINTER(FsTensor)),
        ("v", POINTER(FsTensor)),
        ("cu_seqlens_q", POINTER(FsTensor)),
        ("cu_seqlens_k", POINTER(FsTensor)),
        ("max_seqlen_q", c_int64),
        ("max_seqlen_k", c_int64),
        ("pack_gqa", c_int32),
        ("build_backward", c_int32),
        ("arch", c_int32),
        ("stream", c_void_p),
    ]


class FsMaskPlanInfo(Structure):
    _fields_ = [
        ("varlen", c_int32),
        ("batch", c_int32),
        ("max_seqlen_q", c_int64),
        ("max_seqlen_k", c_int64),
        ("total_q", c_int64),
        ("total_k", c_int64),
        ("num_heads_q", c_int32),
        ("num_heads_kv", c_int32),
        ("num_heads_mask", c_int32),
        ("nfunc", c_int32),
        ("head_dim_qk", c_int32),
        ("head_dim_v", c_int32),
        ("dtype", FsDType),
        ("device", FsDevice),
        ("pack_gqa", c_int32),
        ("has_backward", c_int32),
        ("arch", c_int32),
        ("fwd_block_q", c_int32),
        ("fwd_block_k", c_int32),
        ("bwd_block_q", c_int32),
        ("bwd_block_k", c_int32),
        ("fwd_num_q_blocks", c_int64),
        ("fwd_num_k_blocks", c_int64),
        ("fwd_partial_blocks", c_int64),
        ("fwd_full_blocks", c_int64),
        ("bwd_partial_blocks", c_int64),
        ("bwd_full_blocks", c_int64),
        ("visible_pairs", c_int64),
        ("num_tasks", c_int64),
        ("bytes", c_int64),
        ("signature", c_char * 256),
    ]


class FsFlexFwdArgs(Structure):
    _fields_ = [
        ("q", POINTER(FsTensor)),
        ("k", POINTER(FsTensor)),
        ("v", POINTER(FsTensor)),
        ("out", POINTER(FsTensor)),
        ("plan", FsMaskPlanHandle),
        ("lse", POINTER(FsTensor)),
        ("max_logit", POINTER(FsTensor)),
        ("softmax_scale", c_float),
        ("has_softmax_scale", c_int32),
    ]


class FsFlexBwdArgs(Structure):
    _fields_ = [
        ("q", POINTER(FsTensor)),
        ("k", POINTER(FsTensor)),
        ("v", POINTER(FsTensor)),
        ("out", POINTER(FsTensor)),
        ("dout", POINTER(FsTensor)),
        ("lse", POINTER(FsTensor)),
        ("dq", POINTER(FsTensor)),
        ("dk", POINTER(FsTensor)),
        ("dv", POINTER(FsTensor)),
        ("plan", FsMaskPlanHandle),
        ("softmax_scale", c_float),
        ("has_softmax_scale", c_int32),
        ("deterministic", c_int32),
        ("dlse", POINTER(FsTensor)),
    ]


_status = c_int32  # fs_status_t is an enum: int-sized on every supported ABI

# name -> (restype, argtypes): every function of the header.
_SIGNATURES = {
    "fs_get_last_error": (c_char_p, []),
    "fs_abi_version": (c_int32, []),
    "fs_version": (c_char_p, []),
    "fs_cuda_available": (c_int32, []),
    "fs_built_cuda_archs": (c_char_p, []),
    "fs_create_mask_plan": (_status, [POINTER(FsMaskPlanArgs), POINTER(FsMaskPlanHandle)]),
    "fs_mask_plan_destroy": (_status, [FsMaskPlanHandle]),
    "fs_mask_plan_get_info": (_status, [FsMaskPlanHandle, POINTER(FsMaskPlanInfo)]),
    "fs_mask_plan_num_arrays": (_status, [FsMaskPlanHandle, POINTER(c_int32)]),
    "fs_mask_plan_array_name": (_status, [FsMaskPlanHandle, c_int32, POINTER(c_char_p)]),
    "fs_mask_plan_copy_array": (
        _status,
        [FsMaskPlanHandle, c_char_p, POINTER(c_int32), c_int64, POINTER(c_int64)],
    ),
    "fs_flex_fwd_create": (_status, [POINTER(FsFlexFwdArgs), POINTER(FsFlexFwdHandle)]),
    "fs_flex_fwd_destroy": (_status, [FsFlexFwdHandle]),
    "fs_flex_fwd_check_support": (_status, [FsFlexFwdHandle]),
    "fs_flex_fwd_compile": (_status, [FsFlexFwdHandle]),
    "fs_flex_fwd_workspace_size": (_status, [FsFlexFwdHandle, POINTER(c_size_t)]),
    "fs_flex_fwd_execute": (
        _status,
        [FsFlexFwdHandle, POINTER(FsFlexFwdArgs), c_void_p, c_size_t, c_void_p],
    ),
    "fs_flex_bwd_create": (_status, [POINTER(FsFlexBwdArgs), POINTER(FsFlexBwdHandle)]),
    "fs_flex_bwd_destroy": (_status, [FsFlexBwdHandle]),
    "fs_flex_bwd_check_support": (_status, [FsFlexBwdHandle]),
    "fs_flex_bwd_compile": (_status, [FsFlexBwdHandle]),
    "fs_flex_bwd_workspace_size": (_status, [FsFlexBwdHandle, POINTER(c_size_t)]),
    "fs_flex_bwd_execute": (
        _status,
        [FsFlexBwdHandle, POINTER(FsFlexBwdArgs), c_void_p, c_size_t, c_void_p],
    ),
}


# ---------------------------------------------------------------------------
# Loading
# ---------------------------------------------------------------------------

_LIB_NAME = "libflashspan.so"
_lock = threading.Lock()
_lib: Optional[ctypes.CDLL] = None
_lib_path: Optional[str] = None


def candidate_paths() -> list[str]:
    """Where the library is looked for, in order: $FLASHSPAN_LIBRARY, the package, the repo build dirs."""
    paths = []
    env = os.environ.get("FLASHSPAN_LIBRARY")
    if env:
        paths.append(env)
    pkg_dir = os.path.dirname(os.path.abspath(__file__))
    paths.append(os.path.join(pkg_dir, "lib", _LIB_NAME))
    # Source checkout: python/flashspan/_lib.py -> repo root two levels up. The most
    # recently built library wins, so a fresh `cmake --build` is picked up.
    repo = os.path.dirname(os.path.dirname(pkg_dir))
    builds = [os.path.join(repo, "build", _LIB_NAME)] + glob.glob(os.path.join(repo, "build-*", _LIB_NAME))
    builds = [p for p in builds if os.path.exists(p)]
    builds.sort(key=os.path.getmtime, reverse=True)
    paths.extend(builds)
    return paths


def _declare(lib: ctypes.CDLL) -> None:
    for name, (restype, argtypes) in _SIGNATURES.items():
        fn = getattr(lib, name)
        fn.restype = restype
        fn.argtypes = argtypes


def lib() -> ctypes.CDLL:
    """The loaded library (loaded on first use). Raises ImportError when it cannot be found or is incompatible."""
    global _lib, _lib_path
    if _lib is not None:
        return _lib
    with _lock:
        if _lib is not None:
            return _lib
        env = os.environ.get("FLASHSPAN_LIBRARY")
        if env and not os.path.exists(env):
            raise ImportError(f"flashspan: FLASHSPAN_LIBRARY={env!r} does not exist")
        tried = []
        for path in candidate_paths():
            if not os.path.exists(path):
                tried.append(path)
                continue
            try:
                handle = ctypes.CDLL(path)
            except OSError as e:
                raise ImportError(f"flashspan: cannot load {path}: {e}") from e
            try:
                _declare(handle)
            except AttributeError as e:
                raise ImportError(f"flashspan: {path} lacks a C ABI function ({e}); rebuild it") from e
            version = handle.fs_abi_version()
            if version != ABI_VERSION:
                raise ImportError(
                    f"flashspan: {path} has C ABI version {version}, this package needs {ABI_VERSION}; "
                    "rebuild the library or reinstall the package"
                )
            _lib, _lib_path = handle, path
            return handle
        # candidate_paths() lists only the build folders that exist: name the patterns searched too,
        # so the message says where a source checkout's build is expected.
        repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        searched = tried + [os.path.join(repo, "build", _LIB_NAME), os.path.join(repo, "build-*", _LIB_NAME)]
        raise ImportError(
            "flashspan: libflashspan.so not found; set FLASHSPAN_LIBRARY to its path, `pip install .` "
            "(CPU only, without CUDA: `pip install . -C cmake.define.FLASHSPAN_CUDA=OFF`), "
            "or build it with cmake into build/ (looked in: " + ", ".join(dict.fromkeys(searched)) + ")"
        )


def library_path() -> str:
    """Path of the loaded libflashspan.so."""
    lib()
    return _lib_path  # type: ignore[return-value]


def last_error() -> str:
    msg = lib().fs_get_last_error()
    return msg.decode("utf-8", "replace") if msg else ""


def check(status: int, what: str = "") -> None:
    """Raises the Python exception of a failed fs_status_t, carrying fs_get_last_error()."""
    if status == STATUS_SUCCESS:
        return
    msg = last_error() or _STATUS_NAMES.get(status, f"status {status}")
    if what:
        msg = f"{what}: {msg}"
    if status == STATUS_INVALID_ARGUMENT:
        raise ValueError(msg)
    if status == STATUS_TYPE_ERROR:
        raise TypeError(msg)
    if status == STATUS_OUT_OF_MEMORY:
        raise torch.OutOfMemoryError(msg)  # a RuntimeError subclass, as torch raises it
    raise RuntimeError(f"{msg} [{_STATUS_NAMES.get(status, status)}]")


# ---------------------------------------------------------------------------
# Tensors
# ---------------------------------------------------------------------------

_DTYPES = {
    torch.float16: (DTYPE_FLOAT, 16),
    torch.bfloat16: (DTYPE_BFLOAT, 16),
    torch.float32: (DTYPE_FLOAT, 32),
    torch.float64: (DTYPE_FLOAT, 64),
    torch.int32: (DTYPE_INT, 32),
    torch.int64: (DTYPE_INT, 64),
    torch.int16: (DTYPE_INT, 16),
    torch.int8: (DTYPE_INT, 8),
    torch.uint8: (DTYPE_UINT, 8),
    torch.float8_e4m3fn: (DTYPE_FLOAT8_E4M3FN, 8),
    torch.float8_e5m2: (DTYPE_FLOAT8_E5M2, 8),
}


def _fs_dtype(dtype: torch.dtype, name: str) -> FsDType:
    code_bits = _DTYPES.get(dtype)
    if code_bits is None:
        # (A dtype the C ABI has no code for; the C layer's rule of each argument narrows the ones it has.)
        raise TypeError(f"{name}: dtype {dtype} is not supported by flashspan (tensors of float16, bfloat16, float32, "
                        "float64, float8_e4m3fn, float8_e5m2, int8 / int16 / int32 / int64 or uint8 only; q, k, v: "
                        "float16 or bfloat16 on CUDA, also float32 / float64 on the CPU)")
    return FsDType(code_bits[0], code_bits[1], 1)


def _fs_device(device: torch.device, name: str) -> FsDevice:
    if device.type == "cuda":
        return FsDevice(DEVICE_CUDA, device.index if device.index is not None else 0)
    if device.type == "cpu":
        return FsDevice(DEVICE_CPU, 0)
    raise TypeError(f"{name}: device {device} is not supported (CPU or CUDA tensors only)")


class TensorDesc:
    """An fs_tensor_t describing a torch.Tensor; owns the shape/stride arrays it points to.

    The descriptor borrows the tensor's memory: keep the tensor alive while the C
    layer may read it. Strides are in elements, as in DLPack.
    """

    __slots__ = ("tensor", "struct", "_shape", "_strides")

    def __init__(self, t: torch.Tensor, name: str = "tensor"):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        self.tensor = t
        self._init(tuple(t.shape), t.stride(), t.dtype, t.device, t.data_ptr(), name)

    @classmethod
    def from_spec(cls, shape, strides, dtype: torch.dtype, device: torch.device, name: str) -> TensorDesc:
        """A descriptor of a layout without a tensor yet (data NULL until set)."""
        self = cls.__new__(cls)
        self.tensor = None
        self._init(tuple(shape), tuple(strides), dtype, device, 0, name)
        return self

    def _init(self, shape, strides, dtype, device, data, name):
        fs_dtype, fs_device = _fs_dtype(dtype, name), _fs_device(device, name)
        ndim = len(shape)
        self._shape = (c_int64 * max(ndim, 1))(*shape)
        self._strides = (c_int64 * max(ndim, 1))(*strides)
        self.struct = FsTensor(
            c_void_p(data or None),
            fs_device,
            ndim,
            fs_dtype,
            self._shape,
            self._strides,
            0,  # data_ptr() already includes the storage offset
        )

    def ptr(self):
        return ctypes.pointer(self.struct)


def desc(t: Optional[torch.Tensor], name: str = "tensor") -> Optional[TensorDesc]:
    return None if t is None else TensorDesc(t, name)


def ptr(d: Optional[TensorDesc]):
    """POINTER(FsTensor) of a descriptor, NULL for None."""
    return None if d is None else ctypes.pointer(d.struct)


# torch's current CUDA stream of a device index as a raw cudaStream_t (an int), without building a
# torch.cuda.Stream object (what torch.cuda.current_stream(device).cuda_stream returns; the same private
# binding torch's own generated code launches with). Absent in CPU-only builds of torch.
_current_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)


def current_raw_stream(device: torch.device) -> int:
    """cudaStream_t (as an int) of torch's current stream of the CUDA ``device``."""
    index = device.index
    if _current_raw_stream is None or index is None:
        return torch.cuda.current_stream(device).cuda_stream
    return _current_raw_stream(index)


def stream_of(t: torch.Tensor) -> Optional[int]:
    """cudaStream_t (as an int) of the current stream of t's device; None for CPU tensors."""
    if not t.is_cuda:
        return None
    return current_raw_stream(t.device)


def on_device(t: torch.Tensor, fn, *args):
    """fn(*args) with t's CUDA device current (kernels launch on the current device); the
    previous device is restored. A plain call for CPU tensors and when already current."""
    if t.is_cuda:
        index = t.get_device()
        if index != torch.cuda.current_device():
            with torch.cuda.device(index):
                return fn(*args)
    return fn(*args)


def version() -> str:
    return lib().fs_version().decode()


def cuda_available() -> bool:
    return bool(lib().fs_cuda_available())


def built_cuda_archs() -> list[str]:
    s = lib().fs_built_cuda_archs().decode()
    return [a for a in s.replace(";", ",").split(",") if a]
