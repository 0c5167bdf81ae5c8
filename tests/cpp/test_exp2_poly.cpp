// kernels/common/exp2_poly.h: the FMA-pipe exp2 of the softcap forward's measurement switch
// FLASHSPAN_SOFTCAP_POLY_EXP2 (sdpa_score_mod.cuh), evaluated on the host with the same float
// operations (std::fmaf, the magic-number rounding, the exponent-bit add) against std::exp2 in
// double over [-130, 64]: relative error within 2^-22 (ex2.approx.ftz.f32's bound) where 2^z is a
// normal float, +0 below -126 (-inf included), exact at the integers.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>

#include "kernels/common/exp2_poly.h"

namespace {

using flashspan::kern::exp2_poly;

constexpr double kBound = 0x1p-22;

double rel_err(float z) {
  const double ref = std::exp2(double(z));
  return std::fabs(double(exp2_poly(z)) / ref - 1.0);
}

TEST(Exp2Poly, DenseGridRelativeError) {
  double worst = 0.0;
  float worst_z = 0.0f;
  // Every float at a step of 2^-14 over [-126, 64] (3.1 M points) ...
  for (int64_t i = -126LL << 14; i <= 64LL << 14; ++i) {
    const float z = float(std::ldexp(double(i), -14));
    const double e = rel_err(z);
    if (e > worst) worst = e, worst_z = z;
  }
  // ... every float of the reduced interval's ends and around 0 (the reduction's edges) ...
  for (float base : {-0.5f, 0.5f, 0.0f, -1.0f, 1.0f, 10.5f, -100.5f}) {
    float z = base;
    for (int k = 0; k < 20000; ++k) z = std::nextafter(z, -std::numeric_limits<float>::infinity());
    for (int k = 0; k < 40000; ++k, z = std::nextafter(z, std::numeric_limits<float>::infinity())) {
      const double e = rel_err(z);
      if (e > worst) worst = e, worst_z = z;
    }
  }
  // ... and random floats of [-126, 64].
  std::mt19937 rng(12345);
  std::uniform_real_distribution<float> u(-126.0f, 64.0f);
  for (int k = 0; k < 2000000; ++k) {
    const float z = u(rng);
    const double e = rel_err(z);
    if (e > worst) worst = e, worst_z = z;
  }
  EXPECT_LE(worst, kBound) << "worst z = " << worst_z;
  std::printf("exp2_poly: max relative error %.3e (2^%.2f) at z = %.9g\n", worst, std::log2(worst), double(worst_z));
}

TEST(Exp2Poly, IntegersExact) {
  for (int j = -126; j <= 64; ++j) EXPECT_EQ(exp2_poly(float(j)), float(std::ldexp(1.0, j))) << j;
}

TEST(Exp2Poly, FlushBelowMinus126) {
  EXPECT_EQ(exp2_poly(-std::numeric_limits<float>::infinity()), 0.0f);
  EXPECT_EQ(exp2_poly(-std::numeric_limits<float>::max()), 0.0f);
  EXPECT_EQ(exp2_poly(-1e30f), 0.0f);
  for (float z = -130.0f; z < -126.0f; z += 1.0f / 64) {
    EXPECT_EQ(exp2_poly(z), 0.0f) << z;
  }
  EXPECT_EQ(exp2_poly(std::nextafter(-126.0f, -200.0f)), 0.0f);
  EXPECT_GT(exp2_poly(-126.0f), 0.0f);
}

TEST(Exp2Poly, SoftcapTanhThroughReciprocal) {
  // The value rcp_exp2_plus1 forms from it, 1 / (2^z + 1), over the softcap's domain (z <= 64):
  // the polynomial's relative error of 2^z is at most the same relative error of 2^z + 1.
  for (float z = -130.0f; z <= 64.0f; z += 1.0f / 256) {
    const double ref = 1.0 / (std::exp2(double(z)) + 1.0);
    const double got = 1.0 / (double(exp2_poly(z)) + 1.0);
    EXPECT_LE(std::fabs(got / ref - 1.0), kBound) << z;
  }
}

}  // namespace
