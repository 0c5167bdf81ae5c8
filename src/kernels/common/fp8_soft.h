// FP8 conversions with integer and float arithmetic only, for the kernels of GPUs without FP8
// instructions (sm_80 has no cvt to or from e4m3 / e5m2; the sm80 FP8 backward runs there,
// kernels/sm80/kernel_bwd_sm80.cuh) and for host code: the same results as the host rule of
// core/fp8_conv.h (round to nearest even, satfinite, NaN stays NaN, zero keeps its sign), which
// the CPU tests check them against on every code and on random and boundary floats
// (tests/cpp/test_fp8_conv.cpp). Plain C++ (no CUDA headers): __host__ __device__ under nvcc.
//
// Format: e5m2 = false is E4M3 (3 mantissa bits, bias 7, largest 448, no infinity), true E5M2 (2
// mantissa bits, bias 15, largest 57344, IEEE infinities). Method of fp8_soft_round: below the
// smallest normal (2^-6 / 2^-14) the quantum is the subnormal step (2^-9 / 2^-16), so rint(|x| /
// step) * step, both steps exact powers of two; above, the float's mantissa rounded to M bits by
// the integer add of (half - 1 + the kept lsb) and a mask (a carry moves into the exponent by
// itself); magnitudes at or above the largest finite value (infinity included) give it.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define FS_FP8_HD __host__ __device__ __forceinline__
#else
#define FS_FP8_HD inline
#endif

namespace flashspan::kern {

FS_FP8_HD uint32_t fp8_soft_bits(float x) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(x);
#else
  uint32_t u;
  std::memcpy(&u, &x, 4);
  return u;
#endif
}
FS_FP8_HD float fp8_soft_float(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float x;
  std::memcpy(&x, &u, 4);
  return x;
#endif
}

// The largest finite value of a format.
FS_FP8_HD float fp8_soft_max(bool e5m2) { return e5m2 ? 57344.0f : 448.0f; }

// x rounded to the format (nearest even, satfinite), as a float: the value an FP8 store and reload
// of x gives (core/fp8_conv.h fp8_round).
FS_FP8_HD float fp8_soft_round(float x, bool e5m2) {
  const float a = fabsf(x);
  const float top = fp8_soft_max(e5m2);
  if (!(a < top)) return a != a ? x : copysignf(top, x);  // NaN stays NaN; satfinite (inf too)
  float r;
  if (a < (e5m2 ? 0x1p-14f : 0x1p-6f)) {
    // Subnormal range: whole multiples of the subnormal step (scaling by powers of two is exact).
    r = e5m2 ? rintf(a * 0x1p16f) * 0x1p-16f : rintf(a * 0x1p9f) * 0x1p-9f;
  } else {
    const int shift = e5m2 ? 21 : 20;  // 23 - M float mantissa bits dropped
    uint32_t u = fp8_soft_bits(a);
    u += ((1u << (shift - 1)) - 1u) + ((u >> shift) & 1u);
    u &= ~((1u << shift) - 1u);
    r = fp8_soft_float(u);  // < top + one step; a < top keeps it at most top
  }
  return copysignf(r, x);
}

// The code of a value already on the format's grid (fp8_soft_round's results: finite, |v| <= the
// largest finite value, or NaN).
FS_FP8_HD uint32_t fp8_soft_code_of(float v, bool e5m2) {
  const uint32_t u = fp8_soft_bits(v);
  const uint32_t sign = (u >> 24) & 0x80u;
  const float a = fabsf(v);
  if (a != a) return sign | (e5m2 ? 0x7eu : 0x7fu);  // the format's quiet NaN (core/fp8_conv.h nan_code)
  const int m = e5m2 ? 2 : 3;
  if (a < (e5m2 ? 0x1p-14f : 0x1p-6f)) {
    // Subnormal (or zero): the mantissa field counts subnormal steps, exponent field 0.
    return sign | static_cast<uint32_t>(e5m2 ? a * 0x1p16f : a * 0x1p9f);
  }
  const uint32_t au = u & 0x7fffffffu;
  const int e = static_cast<int>(au >> 23) - 127 + (e5m2 ? 15 : 7);  // the format's biased exponent
  const uint32_t mant = (au >> (23 - m)) & ((1u << m) - 1u);
  return sign | (static_cast<uint32_t>(e) << m) | mant;
}

// float -> FP8 code (round to nearest even, satfinite; core/fp8_conv.h float_to_fp8_bits).
FS_FP8_HD uint32_t fp8_soft_encode(float x, bool e5m2) { return fp8_soft_code_of(fp8_soft_round(x, e5m2), e5m2); }

// FP8 code -> float, exact (core/fp8_conv.h fp8_bits_to_float).
FS_FP8_HD float fp8_soft_decode(uint32_t code, bool e5m2) {
  const uint32_t sign = (code & 0x80u) << 24;
  const uint32_t mag = code & 0x7fu;
  const int m = e5m2 ? 2 : 3;
  const uint32_t e = mag >> m, mant = mag & ((1u << m) - 1u);
  if (e5m2 ? e == 31u : mag == 0x7fu) {
    // E5M2: infinity (mantissa 0) or NaN; E4M3: S.1111.111 is its only NaN.
    return fp8_soft_float(sign | 0x7f800000u | (e5m2 && mant == 0 ? 0u : 0x400000u));
  }
  if (e == 0) {
    const float v = static_cast<float>(mant) * (e5m2 ? 0x1p-16f : 0x1p-9f);
    return sign != 0 ? -v : v;
  }
  // Normal: the float's biased exponent is e - bias + 127, its mantissa the format's, left-aligned.
  return fp8_soft_float(sign | ((e + (e5m2 ? 112u : 120u)) << 23) | (mant << (23 - m)));
}

}  // namespace flashspan::kern
