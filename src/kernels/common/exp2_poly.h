// exp2_poly: 2^z on the FMA pipe (no MUFU op), the software exponential FlashAttention-4 uses to
// offload part of its exponentials from the MUFU unit: z = j + f with j = rint(z) and f in
// [-1/2, 1/2], 2^f by a degree-5 polynomial (Horner: five FFMA), 2^j added into the exponent bits.
// The rounding is the magic-number add (z + 1.5 * 2^23 rounds z to an integer held in the low
// mantissa bits; FADD, not the conversion pipe's FRND / F2I): three FADD, five FFMA, and on the
// integer pipe a shift, an add and a compare-select. Coefficients: scripts/fit_exp2_poly.py (a
// relative-error minimax fit with p(0) = 1, rounded to float). Max relative error of the float
// evaluation 1.7e-7 = 2^-22.5 over the reduced interval (ex2.approx.ftz.f32: ~2^-22), checked on
// the host against std::exp2 over [-130, 64] (tests/cpp/test_exp2_poly.cpp).
// Domain: z <= 127 (rcp_exp2_plus1 clamps at 64); z < -126 (-inf included) gives +0, as
// ex2.approx.ftz's flush of the results below 2^-126 (the select ignores what the reduction made of
// an infinite or huge negative z); NaN gives an unspecified value. Plain C++ (no CUDA headers):
// __host__ __device__ under nvcc, for the host test.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define FS_EXP2_HD __host__ __device__ __forceinline__
#else
#define FS_EXP2_HD inline
#endif

namespace flashspan::kern {

// The polynomial: 2^f ~ 1 + f (c1 + f (c2 + f (c3 + f (c4 + f c5)))), f in [-1/2, 1/2].
constexpr float kExp2PolyC1 = 6.931470037e-01f;
constexpr float kExp2PolyC2 = 2.402224243e-01f;
constexpr float kExp2PolyC3 = 5.550733581e-02f;
constexpr float kExp2PolyC4 = 9.671504609e-03f;
constexpr float kExp2PolyC5 = 1.326470170e-03f;

FS_EXP2_HD int32_t exp2_poly_bits(float x) {
#if defined(__CUDA_ARCH__)
  return __float_as_int(x);
#else
  int32_t u;
  std::memcpy(&u, &x, 4);
  return u;
#endif
}
FS_EXP2_HD float exp2_poly_float(int32_t u) {
#if defined(__CUDA_ARCH__)
  return __int_as_float(u);
#else
  float x;
  std::memcpy(&x, &u, 4);
  return x;
#endif
}
// a + b rounded once, never contracted with a neighbouring multiply nor reassociated.
FS_EXP2_HD float exp2_poly_add(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}

FS_EXP2_HD float exp2_poly(float z) {
  constexpr float kRound = 12582912.0f;  // 1.5 * 2^23: z + kRound is rint(z) + kRound, exactly, for |z| < 2^22
  const float t = exp2_poly_add(z, kRound);
  const float f = exp2_poly_add(z, -exp2_poly_add(t, -kRound));  // z - rint(z), exact
  float p = fmaf(kExp2PolyC5, f, kExp2PolyC4);
  p = fmaf(p, f, kExp2PolyC3);
  p = fmaf(p, f, kExp2PolyC2);
  p = fmaf(p, f, kExp2PolyC1);
  p = fmaf(p, f, 1.0f);  // 2^f in [2^-1/2, 2^1/2]
  // rint(z) is the low bits of t's mantissa in two's complement (kRound's own bits shift out):
  // added into p's exponent field. Unsigned shift and add, wrapping as the hardware does.
  const uint32_t e = uint32_t(exp2_poly_bits(t)) << 23;
  const float r = exp2_poly_float(int32_t(uint32_t(exp2_poly_bits(p)) + e));
  return z < -126.0f ? 0.0f : r;
}

}  // namespace flashspan::kern
