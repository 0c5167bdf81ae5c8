// core/fp8_conv.h: every one of the 256 codes of E4M3 and E5M2 decoded against the formats' definitions
// (field by field with std::ldexp, plus the anchor values of the OCP FP8 specification), every finite code
// encoded back to itself, and float -> FP8 against a brute-force nearest-even search over all codes (random
// floats, every midpoint between neighbours and the floats next to it, subnormals, saturation, specials).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "core/fp8_conv.h"

namespace {

using flashspan::Fp8Format;
using flashspan::kFp8E4M3;
using flashspan::kFp8E5M2;

struct Spec {
  const Fp8Format* f;
  int exp_bits, man_bits, bias;
  bool has_inf;  // E5M2: exponent all ones is inf / NaN; E4M3 (fn): only S.1111.111 is NaN
  const char* name;
};
const Spec kSpecs[] = {{&kFp8E4M3, 4, 3, 7, false, "E4M3"}, {&kFp8E5M2, 5, 2, 15, true, "E5M2"}};

// The value of a code by its definition (NaN for the NaN codes).
double defined_value(const Spec& s, int code) {
  const int sign = code >> 7, e = (code >> s.man_bits) & ((1 << s.exp_bits) - 1), m = code & ((1 << s.man_bits) - 1);
  const int emax = (1 << s.exp_bits) - 1;
  double v;
  if (s.has_inf && e == emax) {
    v = m == 0 ? std::numeric_limits<double>::infinity() : std::numeric_limits<double>::quiet_NaN();
  } else if (!s.has_inf && e == emax && m == (1 << s.man_bits) - 1) {
    v = std::numeric_limits<double>::quiet_NaN();
  } else if (e == 0) {
    v = std::ldexp(double(m) / (1 << s.man_bits), 1 - s.bias);
  } else {
    v = std::ldexp(1.0 + double(m) / (1 << s.man_bits), e - s.bias);
  }
  return sign ? -v : v;
}

bool finite_code(const Spec& s, int code) { return std::isfinite(defined_value(s, code)); }

TEST(Fp8Conv, DecodeEveryCode) {
  for (const Spec& s : kSpecs) {
    int nans = 0;
    for (int c = 0; c < 256; ++c) {
      const double want = defined_value(s, c);
      const float got = flashspan::fp8_bits_to_float(uint8_t(c), *s.f);
      if (std::isnan(want)) {
        EXPECT_TRUE(std::isnan(got)) << s.name << " code " << c;
        ++nans;
      } else {
        EXPECT_EQ(double(got), want) << s.name << " code " << c;
        EXPECT_EQ(std::signbit(got), (c & 0x80) != 0) << s.name << " code " << c << " sign";
      }
    }
    EXPECT_EQ(nans, s.has_inf ? 6 : 2) << s.name;
  }
  // Anchors of the OCP FP8 specification.
  EXPECT_EQ(flashspan::fp8_e4m3_bits_to_float(0x7e), 448.0f);
  EXPECT_EQ(flashspan::fp8_e4m3_bits_to_float(0x38), 1.0f);
  EXPECT_EQ(flashspan::fp8_e4m3_bits_to_float(0x08), 0.015625f);        // smallest normal 2^-6
  EXPECT_EQ(flashspan::fp8_e4m3_bits_to_float(0x01), 0.001953125f);     // smallest subnormal 2^-9
  EXPECT_TRUE(std::isnan(flashspan::fp8_e4m3_bits_to_float(0x7f)));
  EXPECT_EQ(flashspan::fp8_e5m2_bits_to_float(0x7b), 57344.0f);
  EXPECT_EQ(flashspan::fp8_e5m2_bits_to_float(0x3c), 1.0f);
  EXPECT_EQ(flashspan::fp8_e5m2_bits_to_float(0x01), 1.52587890625e-05f);  // 2^-16
  EXPECT_EQ(flashspan::fp8_e5m2_bits_to_float(0x7c), std::numeric_limits<float>::infinity());
  EXPECT_EQ(flashspan::fp8_e5m2_bits_to_float(0xfc), -std::numeric_limits<float>::infinity());
  EXPECT_EQ(kFp8E4M3.max_finite, 448.0f);
  EXPECT_EQ(kFp8E5M2.max_finite, 57344.0f);
}

TEST(Fp8Conv, EveryFiniteCodeEncodesToItself) {
  for (const Spec& s : kSpecs) {
    for (int c = 0; c < 256; ++c) {
      if (!finite_code(s, c)) continue;
      const float x = flashspan::fp8_bits_to_float(uint8_t(c), *s.f);
      EXPECT_EQ(int(flashspan::float_to_fp8_bits(x, *s.f)), c) << s.name << " value " << x;
    }
  }
}

// Brute force: the finite code nearest |x| (ties to the even code, i.e. an even mantissa), |x| at or above the
// largest finite value saturating to it; with x's sign.
uint8_t brute_force(const Spec& s, float x) {
  const uint8_t sign = std::signbit(x) ? 0x80 : 0;
  const double a = std::fabs(double(x));
  if (a >= s.f->max_finite) return sign | s.f->max_code;
  int best = 0;
  double best_d = std::numeric_limits<double>::infinity();
  for (int c = 0; c < 128; ++c) {
    if (!finite_code(s, c)) continue;
    const double d = std::fabs(defined_value(s, c) - a);
    if (d < best_d || (d == best_d && (c & 1) == 0)) {
      best = c;
      best_d = d;
    }
  }
  return sign | uint8_t(best);
}

void expect_encodes(const Spec& s, float x) {
  EXPECT_EQ(int(flashspan::float_to_fp8_bits(x, *s.f)), int(brute_force(s, x))) << s.name << " x = " << x;
}

TEST(Fp8Conv, EncodeIsNearestEvenSaturating) {
  std::mt19937_64 rng(11);
  for (const Spec& s : kSpecs) {
    // Every midpoint between neighbouring finite codes, and the floats on either side of it.
    std::vector<double> values;
    for (int c = 0; c < 128; ++c)
      if (finite_code(s, c)) values.push_back(defined_value(s, c));
    for (size_t i = 0; i + 1 < values.size(); ++i) {
      const float mid = float((values[i] + values[i + 1]) / 2);  // exact: a few bits
      for (float x : {mid, std::nextafter(mid, 0.0f), std::nextafter(mid, 1e9f)}) {
        expect_encodes(s, x);
        expect_encodes(s, -x);
      }
    }
    // Random floats over the format's range and beyond (log-uniform magnitudes, both signs).
    std::uniform_real_distribution<double> e(-30.0, 20.0);
    for (int i = 0; i < 20000; ++i) {
      const float x = float(std::exp2(e(rng))) * (i % 2 ? -1.0f : 1.0f);
      expect_encodes(s, x);
    }
    // Specials.
    const float inf = std::numeric_limits<float>::infinity();
    EXPECT_EQ(int(flashspan::float_to_fp8_bits(inf, *s.f)), int(s.f->max_code)) << s.name;
    EXPECT_EQ(int(flashspan::float_to_fp8_bits(-inf, *s.f)), 0x80 | s.f->max_code) << s.name;
    EXPECT_EQ(int(flashspan::float_to_fp8_bits(1e30f, *s.f)), int(s.f->max_code)) << s.name;
    EXPECT_EQ(int(flashspan::float_to_fp8_bits(0.0f, *s.f)), 0) << s.name;
    EXPECT_EQ(int(flashspan::float_to_fp8_bits(-0.0f, *s.f)), 0x80) << s.name;
    EXPECT_EQ(int(flashspan::float_to_fp8_bits(1e-30f, *s.f)), 0) << s.name;
    EXPECT_EQ(int(flashspan::float_to_fp8_bits(-1e-30f, *s.f)), 0x80) << s.name;
    EXPECT_EQ(int(flashspan::float_to_fp8_bits(std::numeric_limits<float>::denorm_min(), *s.f)), 0) << s.name;
    const float nan = std::numeric_limits<float>::quiet_NaN();
    EXPECT_TRUE(std::isnan(flashspan::fp8_bits_to_float(flashspan::float_to_fp8_bits(nan, *s.f), *s.f))) << s.name;
    EXPECT_EQ(flashspan::float_to_fp8_bits(-nan, *s.f) & 0x80, 0x80) << s.name << ": NaN keeps its sign";
  }
  // The cases named in docs: E4M3 464 is the midpoint of 448 and (the NaN pattern's) 480: ties to even 448, as
  // does everything up to saturation; half the smallest subnormal ties to 0.
  EXPECT_EQ(flashspan::float_to_fp8_e4m3_bits(464.0f), 0x7e);
  EXPECT_EQ(flashspan::float_to_fp8_e4m3_bits(500.0f), 0x7e);
  EXPECT_EQ(flashspan::float_to_fp8_e4m3_bits(0.0009765625f), 0x00);     // 2^-10
  EXPECT_EQ(flashspan::float_to_fp8_e4m3_bits(0.00146484375f), 0x01);    // 0.75 * 2^-9
  EXPECT_EQ(flashspan::float_to_fp8_e5m2_bits(61440.0f), 0x7b);         // midpoint to inf: saturates
  EXPECT_EQ(flashspan::fp8_round(flashspan::DType::kFloat8E4M3, 1.0625f), 1.0f);   // tie to even
  EXPECT_EQ(flashspan::fp8_round(flashspan::DType::kFloat8E5M2, 1.125f), 1.0f);
}

}  // namespace

// kernels/common/fp8_soft.h, the FP8 conversions of the sm80 FP8 backward's kernels (no FP8 instruction on
// sm_80), against the host rule above: every code decoded, and float -> FP8 (the rounded value and its
// code) on every code's value and its neighbours, every midpoint and the floats next to it, the subnormal
// and saturation boundaries, specials, and a million random bit patterns, for both formats.
#include "kernels/common/fp8_soft.h"

namespace {

float next_up(float x) { return std::nextafter(x, std::numeric_limits<float>::infinity()); }
float next_down(float x) { return std::nextafter(x, -std::numeric_limits<float>::infinity()); }

void expect_soft_matches(const Spec& s, float x) {
  const bool e5m2 = s.f == &kFp8E5M2;
  const uint8_t want = flashspan::float_to_fp8_bits(x, *s.f);
  const uint32_t got = flashspan::kern::fp8_soft_encode(x, e5m2);
  ASSERT_EQ(got, uint32_t(want)) << s.name << " x = " << x << " (bits 0x" << std::hex << flashspan::kern::fp8_soft_bits(x)
                                 << ")";
  const float rv = flashspan::kern::fp8_soft_round(x, e5m2);
  const float wv = flashspan::fp8_bits_to_float(want, *s.f);
  if (std::isnan(wv)) {
    ASSERT_TRUE(std::isnan(rv)) << s.name << " x = " << x;
  } else {
    ASSERT_EQ(std::memcmp(&rv, &wv, 4), 0) << s.name << " x = " << x << ": " << rv << " vs " << wv;
  }
}

}  // namespace

TEST(Fp8Soft, DecodeEveryCodeAsTheHostRule) {
  for (const Spec& s : kSpecs) {
    const bool e5m2 = s.f == &kFp8E5M2;
    for (int code = 0; code < 256; ++code) {
      const float want = flashspan::fp8_bits_to_float(uint8_t(code), *s.f);
      const float got = flashspan::kern::fp8_soft_decode(uint32_t(code), e5m2);
      if (std::isnan(want)) {
        EXPECT_TRUE(std::isnan(got)) << s.name << " code " << code;
      } else {
        EXPECT_EQ(std::memcmp(&got, &want, 4), 0) << s.name << " code " << code << ": " << got << " vs " << want;
      }
    }
  }
}

TEST(Fp8Soft, EncodeAndRoundAsTheHostRule) {
  const float inf = std::numeric_limits<float>::infinity();
  for (const Spec& s : kSpecs) {
    std::vector<float> xs = {0.0f, -0.0f, inf, -inf, std::numeric_limits<float>::quiet_NaN(),
                             -std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::max(),
                             std::numeric_limits<float>::min(), std::numeric_limits<float>::denorm_min(), 1e-30f,
                             s.f->max_finite, next_up(s.f->max_finite), next_down(s.f->max_finite)};
    // Every finite value, the midpoints to its upper neighbour and the floats next to all of them.
    for (int code = 0; code < 0x7f; ++code) {
      const float v = flashspan::fp8_bits_to_float(uint8_t(code), *s.f);
      if (!std::isfinite(v)) continue;
      const float up = flashspan::fp8_bits_to_float(uint8_t(code + 1), *s.f);
      const float mid = std::isfinite(up) ? 0.5f * (v + up) : v + 0.5f * (v - flashspan::fp8_bits_to_float(uint8_t(code - 1), *s.f));
      for (float c : {v, mid}) {
        for (float y : {c, next_up(c), next_down(c)}) {
          xs.push_back(y);
          xs.push_back(-y);
        }
      }
    }
    for (float x : xs) expect_soft_matches(s, x);
    std::mt19937 rng(20261204);
    for (int i = 0; i < 1000000; ++i) {
      const uint32_t u = rng();
      float x;
      std::memcpy(&x, &u, 4);
      expect_soft_matches(s, x);
      // Magnitudes near the format's range, where every rounding path runs.
      const float y = std::ldexp(float(rng() % (1u << 24)) / float(1u << 24) + 0.5f, int(rng() % 40) - 24);
      expect_soft_matches(s, (u & 1) ? y : -y);
    }
  }
}
