// Non-owning view of a strided tensor (the internal form of fs_tensor_t).
// Shapes and strides are in elements; byte_offset is already folded into data.
#pragma once

#include <array>
#include <cstdint>
#include <string>

#include "core/error.h"
#include "flashspan/flashspan.h"

namespace flashspan {

enum class DType : int {
  kFloat16, kBFloat16, kFloat32, kFloat64, kInt32, kInt64, kUInt8,
  kFloat8E4M3,  // float8_e4m3fn (core/fp8_conv.h)
  kFloat8E5M2,  // float8_e5m2
  kUnknown
};

inline bool is_fp8(DType t) { return t == DType::kFloat8E4M3 || t == DType::kFloat8E5M2; }

enum class DeviceType : int { kCPU = FS_DEVICE_CPU, kCUDA = FS_DEVICE_CUDA };

inline const char* dtype_name(DType t) {
  switch (t) {
    case DType::kFloat16: return "float16";
    case DType::kBFloat16: return "bfloat16";
    case DType::kFloat32: return "float32";
    case DType::kFloat64: return "float64";
    case DType::kInt32: return "int32";
    case DType::kInt64: return "int64";
    case DType::kUInt8: return "uint8";
    case DType::kFloat8E4M3: return "float8_e4m3fn";
    case DType::kFloat8E5M2: return "float8_e5m2";
    default: return "unknown";
  }
}

inline int dtype_size(DType t) {
  switch (t) {
    case DType::kFloat16:
    case DType::kBFloat16: return 2;
    case DType::kFloat32:
    case DType::kInt32: return 4;
    case DType::kFloat64:
    case DType::kInt64: return 8;
    case DType::kUInt8:
    case DType::kFloat8E4M3:
    case DType::kFloat8E5M2: return 1;
    default: return 0;
  }
}

inline DType dtype_from_fs(fs_dtype_t d) {
  if (d.lanes != 1) return DType::kUnknown;
  if (d.code == FS_DTYPE_FLOAT && d.bits == 16) return DType::kFloat16;
  if (d.code == FS_DTYPE_BFLOAT && d.bits == 16) return DType::kBFloat16;
  if (d.code == FS_DTYPE_FLOAT && d.bits == 32) return DType::kFloat32;
  if (d.code == FS_DTYPE_FLOAT && d.bits == 64) return DType::kFloat64;
  if (d.code == FS_DTYPE_INT && d.bits == 32) return DType::kInt32;
  if (d.code == FS_DTYPE_INT && d.bits == 64) return DType::kInt64;
  if (d.code == FS_DTYPE_UINT && d.bits == 8) return DType::kUInt8;
  if (d.code == FS_DTYPE_FLOAT8_E4M3FN && d.bits == 8) return DType::kFloat8E4M3;
  if (d.code == FS_DTYPE_FLOAT8_E5M2 && d.bits == 8) return DType::kFloat8E5M2;
  return DType::kUnknown;
}

inline fs_dtype_t dtype_to_fs(DType t) {
  switch (t) {
    case DType::kFloat16: return {FS_DTYPE_FLOAT, 16, 1};
    case DType::kBFloat16: return {FS_DTYPE_BFLOAT, 16, 1};
    case DType::kFloat32: return {FS_DTYPE_FLOAT, 32, 1};
    case DType::kFloat64: return {FS_DTYPE_FLOAT, 64, 1};
    case DType::kInt32: return {FS_DTYPE_INT, 32, 1};
    case DType::kInt64: return {FS_DTYPE_INT, 64, 1};
    case DType::kUInt8: return {FS_DTYPE_UINT, 8, 1};
    case DType::kFloat8E4M3: return {FS_DTYPE_FLOAT8_E4M3FN, 8, 1};
    case DType::kFloat8E5M2: return {FS_DTYPE_FLOAT8_E5M2, 8, 1};
    default: return {0, 0, 0};
  }
}

constexpr int kMaxDims = 6;

struct TensorView {
  void* data = nullptr;
  DType dtype = DType::kUnknown;
  DeviceType device = DeviceType::kCPU;
  int device_id = 0;
  int ndim = 0;
  std::array<int64_t, kMaxDims> shape{};
  std::array<int64_t, kMaxDims> strides{};  // elements

  bool defined() const { return ndim > 0 || data != nullptr; }
  int64_t size(int d) const { return shape[d < 0 ? d + ndim : d]; }
  int64_t stride(int d) const { return strides[d < 0 ? d + ndim : d]; }
  int64_t numel() const {
    int64_t n = 1;
    for (int i = 0; i < ndim; ++i) n *= shape[i];
    return n;
  }
  bool is_cuda() const { return device == DeviceType::kCUDA; }
  bool is_contiguous() const {
    int64_t expect = 1;
    for (int i = ndim - 1; i >= 0; --i) {
      if (shape[i] != 1 && strides[i] != expect) return false;
      expect *= shape[i];
    }
    return true;
  }
  template <typename T>
  T* ptr() const { return static_cast<T*>(data); }
  std::string shape_str() const {
    std::string s = "[";
    for (int i = 0; i < ndim; ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
    return s + "]";
  }
};

// Converts a C-ABI descriptor; `name` is used in error messages. A NULL descriptor
// gives an undefined view.
inline TensorView tensor_view_from_fs(const fs_tensor_t* t, const char* name) {
  TensorView v;
  if (t == nullptr) return v;
  FS_CHECK_ARG(t->ndim >= 0 && t->ndim <= kMaxDims, name, ": rank ", t->ndim, " is not supported (at most ",
               kMaxDims, ")");
  FS_CHECK_ARG(t->ndim == 0 || t->shape != nullptr, name, ": shape pointer is NULL");
  v.dtype = dtype_from_fs(t->dtype);
  FS_CHECK_TYPE(v.dtype != DType::kUnknown, name, ": unsupported dtype (code ", int(t->dtype.code), ", bits ",
                int(t->dtype.bits), ", lanes ", int(t->dtype.lanes), ")");
  FS_CHECK_TYPE(t->device.device_type == FS_DEVICE_CPU || t->device.device_type == FS_DEVICE_CUDA, name,
                ": unsupported device type ", t->device.device_type, " (CPU or CUDA expected)");
  v.device = static_cast<DeviceType>(t->device.device_type);
  v.device_id = t->device.device_id;
  v.ndim = t->ndim;
  int64_t expect = 1;
  for (int i = t->ndim - 1; i >= 0; --i) {
    FS_CHECK_ARG(t->shape[i] >= 0, name, ": negative extent ", t->shape[i], " in dimension ", i);
    v.shape[i] = t->shape[i];
    v.strides[i] = t->strides ? t->strides[i] : expect;
    // The element count (and every compact stride) must fit in int64: no overflow later on.
    FS_CHECK_ARG(!__builtin_mul_overflow(expect, t->shape[i] > 0 ? t->shape[i] : 1, &expect), name,
                 ": shape has more than 2^63 elements (extent ", t->shape[i], " in dimension ", i, ")");
  }
  v.data = static_cast<char*>(t->data) + t->byte_offset;
  // Kernels and the reference access elements as their type: a misaligned start is undefined
  // behaviour on the CPU and a fault on the GPU.
  const int item = dtype_size(v.dtype);
  FS_CHECK_ARG(v.data == nullptr || reinterpret_cast<uintptr_t>(v.data) % item == 0, name,
               ": data pointer (data + byte_offset) must be aligned to the element size (", item, " bytes for ",
               dtype_name(v.dtype), ")");
  return v;
}

}  // namespace flashspan
