// The softmax role of the forward kernels of every family (arch-neutral, no mma).
//
// Statistics of a row: the running max m of its scores in log2 units (scores arrive multiplied
// by scale * log2(e); -inf while the row has seen no visible key) and the row sum l of
// exp2(s - m) over its visible keys.
#pragma once

#include <cmath>

#include "kernels/common/ptx.cuh"

namespace flashspan::kern {

// Natural-log LSE of a row from its statistics, as every forward epilogue and split combine
// writes it: (m + log2 l) ln 2, -inf for a row without a visible key (l = 0). __log2f
// (MUFU.LG2) is exact enough here: a positive l is >= 1 (the row's max contributes 2^0).
__device__ __forceinline__ float lse_from_stats(float m, float l) {
  return l > 0.0f ? (m + __log2f(l)) * kLn2 : -INFINITY;
}

}  // namespace flashspan::kern
