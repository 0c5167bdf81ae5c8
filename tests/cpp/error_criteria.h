// Error criteria for kernel results against the CPU reference: the one definition the C++ GPU
// tests use. The Python twin is tests/python/criteria.py (same numbers). The reference
// (src/reference, accumulate_double) runs the softmax in double on the same 16-bit inputs.
//
// Outputs and gradients (16-bit tensors, compared as double):
//   relative L2    ||got - ref||_2 <= rel_l2 * ||ref||_2 + kFloor * sqrt(n)
//   max-abs bound  |got - ref| <= max_abs * (max|ref| + |ref|) + kFloor      (every element)
//   bf16: rel_l2 = 1e-2, max_abs = 2.5e-2;  fp16: rel_l2 = 3e-3, max_abs = 6e-3.
//   The relative L2 catches errors spread over many elements (a dQ scaled by 1.01, a key
//   column dropped in every block, a softmax_scale ignored); the elementwise bound catches
//   errors confined to a few elements (a zeroed row).
// LSE and max_logit (fp32): |got - ref| <= kStatAtol = 2e-3 (absolute; a 1 % loss of softmax
//   mass moves LSE by 1e-2), -inf exactly where the reference has -inf.
// A NaN where the reference is finite always fails (outputs are NaN-poisoned before each
// call, so an element the kernel never wrote stays NaN).
// The absolute floor (kFloor) can be raised per tensor (grad_floor): a gradient whose
// reference is a difference of large terms (dS = P (dP - D) with dP = D exactly, as for a band
// of one key, where dS and dQ are 0 while dP and D are each ~ |dO| |V|) carries the fp32
// rounding of those terms, not of its own (near-zero) size.
// Define FS_CRITERIA_NO_GTEST before including to get the core checks without GoogleTest.
#pragma once

#ifndef FS_CRITERIA_NO_GTEST
#include <gtest/gtest.h>
#endif

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

#include "core/geometry.h"

namespace fs_test {

struct ErrorCriteria {
  double rel_l2, max_abs;
};

inline ErrorCriteria criteria_for(flashspan::DType t) {
  switch (t) {
    case flashspan::DType::kBFloat16: return {1e-2, 2.5e-2};
    case flashspan::DType::kFloat16: return {3e-3, 6e-3};
    default: return {1e-5, 2e-5};
  }
}

constexpr double kStatAtol = 2e-3;
constexpr double kFloor = 1e-6;

// Core checks (no GoogleTest: the kernel benchmark uses them too). Each returns "" when the
// criterion holds, else a message naming the worst element.
namespace detail {
// Infinities must match exactly, NaN only where the reference is NaN. Collects the indices
// of the finite reference elements.
inline std::string check_special(const std::vector<double>& got, const std::vector<double>& ref,
                                 std::vector<size_t>* finite) {
  std::ostringstream os;
  if (got.size() != ref.size()) {
    os << "size " << got.size() << " != reference size " << ref.size();
    return os.str();
  }
  int64_t nan = 0, inf = 0;
  size_t first = got.size();
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::isnan(ref[i])) continue;
    if (std::isinf(ref[i]) || std::isinf(got[i])) {
      if (got[i] != ref[i]) {
        ++inf;
        first = std::min(first, i);
      }
      continue;
    }
    if (std::isnan(got[i])) {
      ++nan;
      first = std::min(first, i);
      continue;
    }
    finite->push_back(i);
  }
  if (nan || inf)
    os << nan << " NaN elements where the reference is finite (unwritten output?), " << inf
       << " infinities that differ; first at [" << first << "]: got " << got[first] << ", ref " << ref[first];
  return os.str();
}
}  // namespace detail

// Output / gradient criterion for a result of dtype `t`.
inline std::string tensor_error(const std::vector<double>& got, const std::vector<double>& ref, flashspan::DType t,
                                double floor = kFloor) {
  floor = std::max(floor, kFloor);
  std::vector<size_t> fin;
  std::string e = detail::check_special(got, ref, &fin);
  if (!e.empty()) return e;
  const ErrorCriteria c = criteria_for(t);
  double e2 = 0, r2 = 0, rmax = 0;
  for (size_t i : fin) {
    e2 += (got[i] - ref[i]) * (got[i] - ref[i]);
    r2 += ref[i] * ref[i];
    rmax = std::max(rmax, std::abs(ref[i]));
  }
  std::ostringstream os;
  const double l2 = std::sqrt(e2), rl2 = std::sqrt(r2);
  if (l2 > c.rel_l2 * rl2 + floor * std::sqrt(double(fin.size()))) {
    os << "relative L2 error " << l2 / std::max(rl2, 1e-300) << " > " << c.rel_l2 << " (||err|| " << l2
       << ", ||ref|| " << rl2 << ", " << fin.size() << " elements)";
    return os.str();
  }
  int64_t over = 0;
  size_t worst = 0;
  double worst_excess = -1;
  for (size_t i : fin) {
    const double bound = c.max_abs * (rmax + std::abs(ref[i])) + floor;
    const double excess = std::abs(got[i] - ref[i]) - bound;
    if (excess > 0) ++over;
    if (excess > worst_excess) worst_excess = excess, worst = i;
  }
  if (over)
    os << over << " elements over the max-abs bound (" << c.max_abs << " * (max|ref| + |ref|) + " << floor
       << ", max|ref| = " << rmax << "); worst at [" << worst << "]: got " << got[worst] << ", ref " << ref[worst];
  return os.str();
}

// The floor of dQ (and dK) of an attention backward, from the inputs' sizes: dS = P (dP - D),
// where the kernel's dP = dO.V_j and D = dO.O are fp32 sums of D_v products of size
// ~ sqrt(D_v) max|dO| max|V| that differ by their rounding (a few units of 2^-23 of that size,
// 2^-20 here), even where the exact dP - D is 0; dQ = scale sum_j dS_ij K_j (sum_j P_ij = 1)
// inherits it times |scale| max|K| (dK: max|Q|).
inline double grad_floor(double scale, int64_t dv, double max_do, double max_v, double max_other) {
  return std::ldexp(1.0, -20) * std::abs(scale) * std::sqrt(double(dv)) * max_do * max_v * max_other;
}

// LSE / max_logit criterion.
inline std::string stat_error(const std::vector<double>& got, const std::vector<double>& ref) {
  std::vector<size_t> fin;
  std::string e = detail::check_special(got, ref, &fin);
  if (!e.empty()) return e;
  double worst = 0;
  size_t at = 0;
  for (size_t i : fin)
    if (std::abs(got[i] - ref[i]) > worst) worst = std::abs(got[i] - ref[i]), at = i;
  std::ostringstream os;
  if (worst > kStatAtol)
    os << "max abs error " << worst << " > " << kStatAtol << " at [" << at << "]: got " << got[at] << ", ref "
       << ref[at];
  return os.str();
}

#ifndef FS_CRITERIA_NO_GTEST
// GoogleTest forms: EXPECT_TRUE(fs_test::tensor_close(got, ref, dtype)) << "what".
inline ::testing::AssertionResult tensor_close(const std::vector<double>& got, const std::vector<double>& ref,
                                               flashspan::DType t, double floor = kFloor) {
  const std::string e = tensor_error(got, ref, t, floor);
  if (e.empty()) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << e;
}
inline ::testing::AssertionResult stat_close(const std::vector<double>& got, const std::vector<double>& ref) {
  const std::string e = stat_error(got, ref);
  if (e.empty()) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << e;
}
#endif

// softmax_scale of a test case, chosen by `seed` (deterministic): 1/sqrt(D) (40 %), zero
// (10 %), a random positive scale in [0.25, 2] / sqrt(D) (the rest); negative instead of
// positive for a share when `allow_negative` (max_logit not requested: a negative scale and
// max_logit exclude each other).
inline float random_softmax_scale(uint64_t seed, int head_dim, bool allow_negative) {
  const uint64_t h = (seed * 0x9E3779B97F4A7C15ull) >> 33;
  const int bucket = int(h % 10);
  const float d = 1.0f / std::sqrt(float(head_dim));
  if (bucket == 0) return 0.0f;
  if (bucket <= 4) return d;
  const float u = 0.25f + 1.75f * float((h / 10) % 1000) / 1000.0f;
  return allow_negative && bucket >= 8 ? -u * d : u * d;
}

}  // namespace fs_test
