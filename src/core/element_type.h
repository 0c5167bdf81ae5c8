// Element types of the attention tensors (Q, K, V, O, dO, dQ, dK, dV): one tag struct per
// storage format, the template parameter `E` of every kernel and launcher (host and device).
//
//   E::Storage   the bits of one element as stored in global and shared memory
//   E::kDType    the DType of the tensors (core/tensor_view.h)
//   E::kBits     bits per element
//
// The device conversions of a tag (float <-> storage, two floats -> one packed .b32, the
// mma.sync / wgmma input type) are in kernels/common/ptx.cuh (`to_float<E>`, `pack2<E>`,
// `store_pair<E>`, the FP8 `cvt_fp8x2<E>`), kernels/sm80/mma_sm80.cuh (`mma_16816<E>`) and
// kernels/sm90/ptx_sm90.cuh (the wgmma forms). The sm80 kernels move 16-bit elements (their
// loaders copy 8 elements per 16 bytes and ldmatrix reads 16-bit rows): they check
// `E::kBits == 16`. The FP8 tags (8-bit storage; E::kFp8Format, SdpaFp8Params::format's code)
// run on the sm90 FP8 SDPA forward only (kernel_fwd_sm90.cuh, sdpa_fp8_fwd_kernel_sm90).
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

// FP8 (OCP 8-bit floats, as cuDNN / Transformer Engine use them): E4M3 (max 448, no infinity)
// and E5M2 (max 57344), DType::kFloat8E4M3 / kFloat8E5M2 (host conversions: core/fp8_conv.h).
// kFp8Format: 1 E4M3, 2 E5M2, the code of SdpaFp8Params::format (kernels/params.h,
// fp8_format_code); the launchers pick the tag from it (with_fp8_type).
struct Float8E4M3 {
  using Storage = uint8_t;
  static constexpr DType kDType = DType::kFloat8E4M3;
  static constexpr int kBits = 8;
  static constexpr int kFp8Format = 1;
};
struct Float8E5M2 {
  using Storage = uint8_t;
  static constexpr DType kDType = DType::kFloat8E5M2;
  static constexpr int kBits = 8;
  static constexpr int kFp8Format = 2;
};

// The FP8 format code (kFp8Format) of a dtype: 1 E4M3, 2 E5M2, 0 for any other dtype.
inline int fp8_format_code(DType t) {
  return t == DType::kFloat8E4M3 ? Float8E4M3::kFp8Format : t == DType::kFloat8E5M2 ? Float8E5M2::kFp8Format : 0;
}

// Calls f(Float8E4M3{}) or f(Float8E5M2{}) for an FP8 format code (1, 2); other codes:
// Status::kInternal naming `what`.
template <class F>
decltype(auto) with_fp8_type(int format, const char* what, F&& f) {
  if (format == Float8E5M2::kFp8Format) return f(Float8E5M2{});
  FS_CHECK(format == Float8E4M3::kFp8Format, Status::kInternal, what, ": FP8 format code ", format,
           " (1 e4m3, 2 e5m2)");
  return f(Float8E4M3{});
}

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
