// Scalar conversions between float and the 16-bit storage formats, host side.
//
//   IEEE binary16 (float16): 1 sign, 5 exponent (bias 15), 10 mantissa bits.
//   bfloat16:                1 sign, 8 exponent (bias 127), 7 mantissa bits
//                            (the upper half of a binary32).
//
// float -> 16 bit rounds to nearest, ties to even (the IEEE default, and what CUDA's
// __float2half_rn / __float2bfloat16_rn do). Overflow gives +-inf; float16 keeps
// subnormals; NaN stays NaN (quiet) with its sign. 16 bit -> float is exact.
//
// The float16 rounding follows the bit-level method described in F. Giesen, "Half to
// float done quic" (2016): normal results round by adding 0xfff plus the lowest kept
// mantissa bit; subnormal results let one float addition do the round-to-nearest-even
// (the FPU's default rounding mode) by aligning the value against a magic constant.
#pragma once

#include <bit>
#include <cstdint>

namespace flashspan {

inline float half_bits_to_float(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t mant = h & 0x3ffu;
  if (exp == 0) {
    // Zero or subnormal: mant * 2^-24, exact in float.
    const float mag = static_cast<float>(mant) * 5.9604644775390625e-8f;
    return sign ? -mag : mag;
  }
  if (exp == 0x1f) return std::bit_cast<float>(sign | 0x7f800000u | (mant << 13));  // inf / NaN
  return std::bit_cast<float>(sign | ((exp + (127 - 15)) << 23) | (mant << 13));
}

inline uint16_t float_to_half_bits(float f) {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  uint32_t ax = x & 0x7fffffffu;
  if (ax >= 0x7f800000u) {  // inf or NaN (NaN: keep the top payload bits, force quiet)
    return sign | (ax > 0x7f800000u ? uint16_t(0x7e00u | ((ax >> 13) & 0x3ffu)) : uint16_t(0x7c00u));
  }
  // 65520 = 65504 + half an ulp: ties go to the even neighbour, which is inf.
  if (ax >= 0x477ff000u) return sign | 0x7c00u;
  if (ax >= 0x38800000u) {  // result is a normal half (|f| >= 2^-14)
    const uint32_t odd = (ax >> 13) & 1u;
    ax += 0xfffu + odd;                 // round to nearest, ties to even
    ax -= uint32_t(127 - 15) << 23;     // rebias the exponent
    return sign | static_cast<uint16_t>(ax >> 13);
  }
  // Subnormal half or zero: adding 0.5f puts the half's 2^-24 unit at the float's
  // last mantissa bit, so the float addition performs the rounding.
  constexpr uint32_t kMagicBits = uint32_t((127 - 15) + (23 - 10) + 1) << 23;  // 0.5f
  const float magic = std::bit_cast<float>(kMagicBits);
  const float sum = std::bit_cast<float>(ax) + magic;
  return sign | static_cast<uint16_t>(std::bit_cast<uint32_t>(sum) - kMagicBits);
}

inline float bf16_bits_to_float(uint16_t b) { return std::bit_cast<float>(uint32_t(b) << 16); }

inline uint16_t float_to_bf16_bits(float f) {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x0040u);  // quiet NaN
  const uint32_t odd = (x >> 16) & 1u;
  // Carry out of the mantissa rounds into the exponent, and past the largest finite
  // value into inf, which is the correct IEEE result.
  return static_cast<uint16_t>((x + 0x7fffu + odd) >> 16);
}

}  // namespace flashspan
