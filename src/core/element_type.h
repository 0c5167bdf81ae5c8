// Element types of the attention tensors (Q, K, V, O, dO, dQ, dK, dV): one tag struct per
// storage format, the template parameter `E` of every kernel and launcher (host and device).
//
//   E::Storage   the bits of one element as stored in global and shared memory
//   E::kDType    the DType of the tensors (core/tensor_view.h)
//   E::kBits     bits per element
//
// The device conversions of a tag (float <-> storage, two floats -> one packed .b32, the
// mma.sync / wgmma input type) are in kernels/common/ptx.cuh (`to_float<E>`, `pack2<E>`),
// kernels/sm80/mma_sm80.cuh (`mma_16816<E>`) and kernels/sm90/kernel_fwd_sm90.cuh; a new
// format (FP8: 8-bit storage, e4m3/e5m2) adds a tag here and its branches there. The
// kernels of today move 16-bit elements (their loaders copy 8 elements per 16 bytes and
// ldmatrix reads 16-bit rows): they check `E::kBits == 16`.
#pragma once

#include <cstdint>

#include "core/error.h"
#include "core/tensor_view.h"

namespace flashspan {

// IEEE binary16.
struct Float16 {
  using Storage = uint16_t;
  static constexpr DType kDType = DType::kFloat16;
  static constexpr int kBits = 16;
};

// bfloat16 (the upper half of a binary32).
struct BFloat16 {
  using Storage = uint16_t;
  static constexpr DType kDType = DType::kBFloat16;
  static constexpr int kBits = 16;
};

// Calls f(Float16{}) or f(BFloat16{}) for the tensors' dtype (the launchers' one switch from
// a run-time dtype to the element-type template parameter). Other dtypes: Status::kInternal
// naming `what` (the caller's validation admits fp16/bf16 only, so this is a bug if reached).
template <class F>
decltype(auto) with_element_type(DType dtype, const char* what, F&& f) {
  if (dtype == DType::kBFloat16) return f(BFloat16{});
  FS_CHECK(dtype == DType::kFloat16, Status::kInternal, what, ": element type ", dtype_name(dtype),
           " has no kernels (float16 and bfloat16 only)");
  return f(Float16{});
}

}  // namespace flashspan
