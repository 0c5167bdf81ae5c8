// The diagonal band of SDPA (docs/SDPA.md), in one place for the CPU reference and the GPU
// kernels (host and device code; plain integer arithmetic).
//
// Query row i (< len_q) of a sample sees key column j (< len_kv) when its diagonal offset
//   d = j - i - shift,   shift = len_kv - len_q (BOTTOM_RIGHT) or 0 (TOP_LEFT),
// lies in [1 - left, right] for the bounds that are set: diagonal_band_right_bound masks the
// columns past row + right (0 = causal), diagonal_band_left_bound the columns at or before
// row - left (a sliding window of `left` tokens including the diagonal). Validation
// (core/sdpa_problem.cpp) resolves the seed's spellings into these fields: the deprecated
// setters' precedence, left >= 1, right >= 0, and bounds clamped to S_q + S_kv, so that
// i + shift +- bound never overflows int64.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define FS_BAND_HD __host__ __device__ __forceinline__
#else
#define FS_BAND_HD inline
#endif

namespace flashspan::sdpa {

struct Band {
  int32_t has_left = 0, has_right = 0;
  int32_t bottom_right = 0;  // diagonal_alignment BOTTOM_RIGHT
  int64_t left = 0, right = 0;

  // Offset of sample (len_q, len_kv)'s diagonal: row i's diagonal is column i + shift.
  FS_BAND_HD int64_t shift(int64_t len_q, int64_t len_kv) const { return bottom_right ? len_kv - len_q : 0; }
  // The visible diagonal offsets [d_min, d_max]; an unset bound gives -/+ kUnbounded, past
  // every offset of a sample (|d| <= S_q + S_kv < 2^62).
  static constexpr int64_t kUnbounded = int64_t(1) << 62;
  FS_BAND_HD int64_t d_min() const { return has_left ? 1 - left : -kUnbounded; }
  FS_BAND_HD int64_t d_max() const { return has_right ? right : kUnbounded; }
  // Columns [*lo, *hi) row i sees (empty: *lo == *hi), within [0, len_kv).
  FS_BAND_HD void columns(int64_t i, int64_t len_q, int64_t len_kv, int64_t* lo, int64_t* hi) const {
    const int64_t sh = shift(len_q, len_kv);
    *lo = 0;
    *hi = len_kv;
    if (has_right && i + sh + right + 1 < *hi) *hi = i + sh + right + 1;
    if (has_left && i + sh - left + 1 > *lo) *lo = i + sh - left + 1;
    if (*hi < *lo) *hi = *lo;
  }
};

}  // namespace flashspan::sdpa
