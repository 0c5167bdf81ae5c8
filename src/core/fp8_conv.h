// Scalar conversions between float and the two 8-bit floating-point formats of FP8 attention
// (the OCP 8-bit floating point specification, the formats of torch.float8_e4m3fn /
// torch.float8_e5m2 and of CUDA's __nv_fp8_e4m3 / __nv_fp8_e5m2), host side.
//
//   E4M3 ("e4m3fn"): 1 sign, 4 exponent (bias 7), 3 mantissa bits. Finite only: S.1111.111 is
//                    NaN, there is no infinity; largest finite 448 (S.1111.110), smallest
//                    subnormal 2^-9.
//   E5M2:            1 sign, 5 exponent (bias 15), 2 mantissa bits. IEEE-like: exponent 31 is
//                    inf (mantissa 0) or NaN; largest finite 57344, smallest subnormal 2^-16.
//
// float -> FP8 rounds to nearest, ties to even, and saturates: a magnitude at or above the largest
// finite value, infinity included, gives the largest finite value with the input's sign (what
// cuDNN and Transformer Engine do with `satfinite`, PTX cvt.rn.satfinite). NaN stays NaN (the
// format's quiet NaN with the input's sign); zero keeps its sign; magnitudes below half the
// smallest subnormal give zero. FP8 -> float is exact.
//
// Method: the result is r * 2^(e - M) for an integer r and the input's binade e (clamped below at
// the smallest normal binade, so subnormals share its quantum): r = rint(|x| / quantum) does the
// rounding (the FPU's default mode is round to nearest even; the division by a power of two is
// exact), and the code is ((e - e_min) << M) + r, which carries a rounded-up mantissa into the
// exponent field by itself.
#pragma once

#include <cmath>
#include <cstdint>

#include "core/tensor_view.h"

namespace flashspan {

// One FP8 format: M mantissa bits, exponent bias, and whether the top exponent is inf/NaN
// (E5M2) or ordinary numbers with the all-ones pattern as the only NaN (E4M3).
struct Fp8Format {
  int mantissa_bits;
  int bias;
  bool ieee_specials;
  float max_finite;
  uint8_t max_code;  // magnitude bits of max_finite
  uint8_t nan_code;  // magnitude bits of the quiet NaN
};

inline constexpr Fp8Format kFp8E4M3{3, 7, false, 448.0f, 0x7e, 0x7f};
inline constexpr Fp8Format kFp8E5M2{2, 15, true, 57344.0f, 0x7b, 0x7e};

inline float fp8_bits_to_float(uint8_t bits, const Fp8Format& f) {
  const bool negative = (bits & 0x80u) != 0;
  const int mag = bits & 0x7f;
  const int exp = mag >> f.mantissa_bits;
  const int mant = mag & ((1 << f.mantissa_bits) - 1);
  float value;
  if (f.ieee_specials && exp == (0x7f >> f.mantissa_bits)) {
    value = mant == 0 ? INFINITY : NAN;
  } else if (!f.ieee_specials && mag == 0x7f) {
    value = NAN;
  } else if (exp == 0) {  // zero or subnormal: mant * 2^(1 - bias - M)
    value = std::ldexp(static_cast<float>(mant), 1 - f.bias - f.mantissa_bits);
  } else {
    value = std::ldexp(static_cast<float>(mant + (1 << f.mantissa_bits)), exp - f.bias - f.mantissa_bits);
  }
  return negative ? -value : value;
}

inline uint8_t float_to_fp8_bits(float x, const Fp8Format& f) {
  const uint8_t sign = std::signbit(x) ? 0x80u : 0x00u;
  if (std::isnan(x)) return sign | f.nan_code;
  const float a = std::fabs(x);
  if (a >= f.max_finite) return sign | f.max_code;  // satfinite (inf included)
  if (a == 0.0f) return sign;
  const int e_min = 1 - f.bias;  // binade of the smallest normal
  int e = std::ilogb(a);         // a in [2^e, 2^(e+1))
  if (e < e_min) e = e_min;      // subnormals: the smallest normal binade's quantum
  const float r = std::rint(std::ldexp(a, f.mantissa_bits - e));  // in [0, 2^(M+1)]
  const int code = ((e - e_min) << f.mantissa_bits) + static_cast<int>(r);
  // a < max_finite, so rounding up reaches at most max_finite (E4M3: 464 would round to 480, the NaN
  // pattern, but a >= 448 saturated above); the result stays below the special codes.
  return sign | static_cast<uint8_t>(code);
}

// The format of an FP8 DType (E5M2 for kFloat8E5M2, else E4M3: callers check is_fp8 first).
inline const Fp8Format& fp8_format(DType t) { return t == DType::kFloat8E5M2 ? kFp8E5M2 : kFp8E4M3; }

// x rounded to the FP8 format of `t` (nearest even, saturating), as a float: the value an FP8 store
// and reload of x gives.
inline float fp8_round(DType t, float x) { return fp8_bits_to_float(float_to_fp8_bits(x, fp8_format(t)), fp8_format(t)); }

inline float fp8_e4m3_bits_to_float(uint8_t b) { return fp8_bits_to_float(b, kFp8E4M3); }
inline float fp8_e5m2_bits_to_float(uint8_t b) { return fp8_bits_to_float(b, kFp8E5M2); }
inline uint8_t float_to_fp8_e4m3_bits(float x) { return float_to_fp8_bits(x, kFp8E4M3); }
inline uint8_t float_to_fp8_e5m2_bits(float x) { return float_to_fp8_bits(x, kFp8E5M2); }

}  // namespace flashspan
