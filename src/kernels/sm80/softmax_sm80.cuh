// Online softmax (FlashAttention-2, Dao 2023, Alg. 1) on mma.sync accumulator fragments.
//
// A thread holds two rows of the warp's 16-row tile (hi = 0: row g, hi = 1: row g + 8) and,
// for each n8 block, the two columns 2t, 2t+1: register r = 2*hi + e. The four lanes of a
// quad (same g) share rows, so row reductions are two xor-shuffles.
// Scores arrive already multiplied by scale*log2(e) (masked ones are -inf), so the running
// max m is in log2 units and p = exp2(s - m). Rows that have seen no visible score keep
// m = -inf; the exponent then uses 0 instead of m so nothing becomes NaN.
#pragma once

#include <cmath>

#include "kernels/common/ptx.cuh"

namespace flashspan::kern {

__device__ __forceinline__ float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}

__device__ __forceinline__ float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

// One key block of the online softmax: s (scaled scores) becomes p; m, l (per row, l is
// the thread-local part of the row sum) are updated and the output accumulator rescaled.
template <int kN, int kNo>
__device__ __forceinline__ void online_softmax_step(float (&s)[kN][4], float (&m)[2], float (&l)[2],
                                                    float (&acc_o)[kNo][4]) {
#pragma unroll
  for (int hi = 0; hi < 2; ++hi) {
    float mx = m[hi];
#pragma unroll
    for (int n = 0; n < kN; ++n) mx = fmaxf(mx, fmaxf(s[n][2 * hi], s[n][2 * hi + 1]));
    mx = quad_max(mx);
    const float m_use = mx == -INFINITY ? 0.0f : mx;
    const float corr = exp2_approx(m[hi] - m_use);  // m[hi] = -inf -> 0
    m[hi] = mx;
    float sum = 0.0f;
#pragma unroll
    for (int n = 0; n < kN; ++n) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const float p = exp2_approx(s[n][2 * hi + e] - m_use);
        s[n][2 * hi + e] = p;
        sum += p;
      }
    }
    l[hi] = l[hi] * corr + sum;
#pragma unroll
    for (int n = 0; n < kNo; ++n) {
      acc_o[n][2 * hi] *= corr;
      acc_o[n][2 * hi + 1] *= corr;
    }
  }
}

}  // namespace flashspan::kern
