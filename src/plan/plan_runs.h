// Full-block runs (plan format 2, mask_plan.h): helpers shared by the host planner, the CUDA
// planner (device code) and the tests, so that they cannot disagree.
//
// A run list is int32 pairs (first, end), end exclusive, ascending, disjoint, non-adjacent.
// The K2Q full runs are built from the Q2K full runs by "events": key block kb starts a K2Q
// run at query block i iff kb is in runs(i) but not in runs(i - 1), and ends one after i
// iff kb is in runs(i) but not in runs(i + 1) (runs(-1) = runs(nqb) = empty, per sample and
// mask head). So the starts of row i are the set difference runs(i) \ runs(i - 1), its ends
// runs(i) \ runs(i + 1): a few intervals per row, whatever the number of full blocks.
#pragma once

#include <cstdint>

#include "kernels/common/payload_layout.h"  // FS_HOST_DEVICE

namespace flashspan {

// Full blocks of runs [j0, j1) of a run list (pairs).
FS_HOST_DEVICE int64_t run_blocks(const int32_t* runs, int64_t j0, int64_t j1) {
  int64_t n = 0;
  for (int64_t j = j0; j < j1; ++j) n += runs[2 * j + 1] - runs[2 * j];
  return n;
}

// Calls emit(lo, hi) for each maximal interval of (union of runs a[0..na)) minus (union of
// runs b[0..nb)), ascending. Both lists are sorted, disjoint run lists. O(na + nb).
template <typename Emit>
FS_HOST_DEVICE void runs_minus(const int32_t* a, int64_t na, const int32_t* b, int64_t nb, Emit emit) {
  int64_t jb = 0;
  for (int64_t ja = 0; ja < na; ++ja) {
    int32_t lo = a[2 * ja];
    const int32_t hi = a[2 * ja + 1];
    while (jb < nb && b[2 * jb + 1] <= lo) ++jb;  // b runs entirely before lo
    int64_t k = jb;
    while (lo < hi) {
      if (k >= nb || b[2 * k] >= hi) {  // no b run overlaps [lo, hi)
        emit(lo, hi);
        break;
      }
      if (b[2 * k] > lo) emit(lo, b[2 * k]);
      lo = b[2 * k + 1];  // skip the covered part
      ++k;
    }
  }
}

}  // namespace flashspan
