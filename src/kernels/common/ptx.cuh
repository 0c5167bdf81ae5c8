// Thin inline-PTX wrappers used by the kernels of every family (sm_80 and newer): shared
// memory addresses, cp.async, exp2, tanh, element conversions (core/element_type.h tags), float atomics.
//
//   cp_async_16      cp.async.cg.shared.global 16 bytes, zero-filled when the predicate is false
//   cp_async_ca_16   the same through L1 (cp.async.ca)
//   ldmatrix_x4      ldmatrix.sync.aligned.m8n8.x4(.trans).shared.b16: lanes 8i..8i+7 give the row
//                    addresses of 8x8 matrix i; register i of lane l then holds row l/4, columns
//                    2(l%4)..+1 of matrix i (with .trans: rows 2(l%4)..+1 of column l/4)
//   exp2_approx      ex2.approx.ftz.f32 (exp2(-inf) = +0)
//   tanh_approx      tanh.approx.f32 (SDPA's softcap)
//   rcp_approx       rcp.approx.ftz.f32
//   pack2, store_pair, to_float, from_float, cvt_fp8x2, pack_fp8x4: element conversions
//   grid_dependency_wait / grid_dependency_trigger: programmatic dependent launch (sm_90 and newer;
//                    no-ops below, where launch_util.h launch_dependent launches without the attribute)
// The mma.sync wrappers of the sm80 family are in kernels/sm80/mma_sm80.cuh.
#pragma once

#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "core/element_type.h"

namespace flashspan::kern {

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// Programmatic dependent launch (CUDA programming guide, "Programmatic Dependent Launch and
// Synchronization"; PTX griddepcontrol). A kernel launched with launch_util.h launch_dependent may
// start while the kernel before it in the stream still runs: grid_dependency_wait blocks until that
// kernel has completed and its memory is visible. grid_dependency_trigger lets the dependent grid
// launch once every CTA of this grid has triggered or exited. Both are no-ops before sm_90.
__device__ __forceinline__ void grid_dependency_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void grid_dependency_trigger() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16-byte global -> shared copy; when !pred nothing is read and the 16 bytes are zeroed
// (src-size 0). `src` must still be a valid address: callers pass the tensor base then.
__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src, bool pred) {
  const int src_size = pred ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_size) : "memory");
}

// cp_async_16 through L1 (cp.async.ca: a broadcast operand read by many rows hits there).
__device__ __forceinline__ void cp_async_ca_16(uint32_t dst, const void* src, bool pred) {
  const int src_size = pred ? 16 : 0;
  asm volatile("cp.async.ca.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_size) : "memory");
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }

template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

__device__ __forceinline__ float exp2_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// rcp.approx.ftz.f32 (MUFU.RCP alone: __fdividef(1, x) adds a rescaling of tiny x, 12 instructions)
__device__ __forceinline__ float rcp_approx(float x) {
  float y;
  asm("rcp.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// tanh.approx.f32 (MUFU.TANH; sm_75 and newer): maximum relative error about 2^-11 (PTX ISA).
__device__ __forceinline__ float tanh_approx(float x) {
  float y;
  asm("tanh.approx.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// Two FP8 elements of format E (Float8E4M3 / Float8E5M2) from two floats (lo = the first
// element, the lower byte), rounded to nearest even, saturated to the format's largest finite
// value (satfinite: no infinity; NaN stays NaN). cvt's first source goes to the upper byte
// (PTX ISA 9.0, cvt with .e4m3x2 / .e5m2x2 destinations). sm_89 and newer.
template <class E>
__device__ __forceinline__ uint16_t cvt_fp8x2(float lo, float hi) {
  static_assert(E::kBits == 8, "cvt_fp8x2: FP8 element types only");
  uint16_t r;
  if constexpr (E::kFp8Format == 2) {
    asm("cvt.rn.satfinite.e5m2x2.f32 %0, %1, %2;\n" : "=h"(r) : "f"(hi), "f"(lo));
  } else {
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;\n" : "=h"(r) : "f"(hi), "f"(lo));
  }
  return r;
}

// Four floats -> one .b32 of four FP8 elements (byte i = x_i): an 8-bit A fragment register.
template <class E>
__device__ __forceinline__ uint32_t pack_fp8x4(float x0, float x1, float x2, float x3) {
  return uint32_t(cvt_fp8x2<E>(x0, x1)) | (uint32_t(cvt_fp8x2<E>(x2, x3)) << 16);
}

// Two floats -> one .b32 of two 16-bit elements of type E (lo = first element, the lower
// column), rounded to nearest even; for an FP8 E, the two bytes of cvt_fp8x2 in the low half.
template <class E>
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  if constexpr (E::kBits == 8) {
    return cvt_fp8x2<E>(lo, hi);
  } else {
    static_assert(E::kDType == DType::kBFloat16 || E::kDType == DType::kFloat16, "pack2: 16-bit element types only");
    if constexpr (E::kDType == DType::kBFloat16) {
      __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
      return *reinterpret_cast<uint32_t*>(&v);
    } else {
      __half2 v = __floats2half2_rn(lo, hi);
      return *reinterpret_cast<uint32_t*>(&v);
    }
  }
}

// Two adjacent elements of type E at dst (aligned to two elements) from two floats: one 32-bit
// store of pack2 (16-bit E), one 16-bit store of cvt_fp8x2 (FP8 E).
template <class E>
__device__ __forceinline__ void store_pair(typename E::Storage* dst, float lo, float hi) {
  if constexpr (E::kBits == 8) {
    *reinterpret_cast<uint16_t*>(dst) = cvt_fp8x2<E>(lo, hi);
  } else {
    *reinterpret_cast<uint32_t*>(dst) = pack2<E>(lo, hi);
  }
}

// One element of type E -> float (exact for every type here).
template <class E>
__device__ __forceinline__ float to_float(typename E::Storage bits) {
  if constexpr (E::kBits == 8) {
    uint32_t h2;  // the element as the low half of an f16x2
    if constexpr (E::kFp8Format == 2) {
      asm("cvt.rn.f16x2.e5m2x2 %0, %1;\n" : "=r"(h2) : "h"(uint16_t(bits)));
    } else {
      asm("cvt.rn.f16x2.e4m3x2 %0, %1;\n" : "=r"(h2) : "h"(uint16_t(bits)));
    }
    return __half2float(__ushort_as_half(uint16_t(h2 & 0xffffu)));
  } else {
    static_assert(E::kDType == DType::kBFloat16 || E::kDType == DType::kFloat16, "to_float: 16-bit element types only");
    if constexpr (E::kDType == DType::kBFloat16) {
      return __uint_as_float(uint32_t(bits) << 16);
    } else {
      return __half2float(__ushort_as_half(bits));
    }
  }
}

// A float -> one element of type E (its storage bits), rounded to nearest even (FP8: satfinite).
template <class E>
__device__ __forceinline__ typename E::Storage from_float(float x) {
  if constexpr (E::kBits == 8) {
    return uint8_t(cvt_fp8x2<E>(x, 0.0f) & 0xffu);
  } else {
    static_assert(E::kDType == DType::kBFloat16 || E::kDType == DType::kFloat16, "from_float: 16-bit element types only");
    if constexpr (E::kDType == DType::kBFloat16) {
      return __bfloat16_as_ushort(__float2bfloat16_rn(x));
    } else {
      return __half_as_ushort(__float2half_rn(x));
    }
  }
}

// Signed float max into global memory with integer atomics. Correct for any mix of signs
// when the buffer starts at -inf (or any float): non-negative floats order like signed
// ints; negative floats order inversely like unsigned ints, and every negative's bits
// compare above every non-negative's as unsigned.
__device__ __forceinline__ void atomic_max_float(float* addr, float v) {
  if (!(v >= 0.0f) && !(v < 0.0f)) return;  // NaN never stored
  if (__float_as_int(v) >= 0) {
    atomicMax(reinterpret_cast<int*>(addr), __float_as_int(v));
  } else {
    atomicMin(reinterpret_cast<unsigned int*>(addr), __float_as_uint(v));
  }
}

// p[0] += x, p[1] += y in global memory (p 8-byte aligned): one vector reduction on sm_90+,
// two scalar ones before.
__device__ __forceinline__ void atomic_add_f32x2(float* p, float x, float y) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  atomicAdd(reinterpret_cast<float2*>(p), make_float2(x, y));
#else
  atomicAdd(p, x);
  atomicAdd(p + 1, y);
#endif
}

}  // namespace flashspan::kern
