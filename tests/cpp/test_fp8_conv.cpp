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
