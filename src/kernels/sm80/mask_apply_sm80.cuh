// Applies a partial block's packed predicate (payload_layout.h, kM16N64Frag) to a warp's
// score fragment.
//
// The warp holds rows 16*mt .. 16*mt+15 of the block and kN n8 column blocks starting at
// column c0 (c0 % 32 == 0; a warp tile either starts on a 64-column chunk or lies inside
// one half of it). Accumulator register r (= 2*hi + e) of n8 block j of a chunk has bit
// 4*j + r in the lane's word of that chunk, so one word serves 8 column blocks.
#pragma once

#include <cstdint>

#include "kernels/common/analytic_mask.h"
#include "kernels/common/variant.cuh"  // apply_tile_mask: the analytic mask on the same fragment

namespace flashspan::kern {

template <int kN>
__device__ __forceinline__ void apply_payload(float (&s)[kN][4], const uint32_t* __restrict__ tile_bits, int mt,
                                              int c0, int block_k, int lane) {
  constexpr int kWords = (kN + 7) / 8;
  const int chunks_per_row = block_k >> 6;
  const int shift = 4 * ((c0 & 63) >> 3);
  uint32_t w[kWords];
#pragma unroll
  for (int ci = 0; ci < kWords; ++ci) {
    w[ci] = __ldg(tile_bits + (mt * chunks_per_row + (c0 >> 6) + ci) * 32 + lane) >> shift;
  }
#pragma unroll
  for (int n = 0; n < kN; ++n) {
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      if (!((w[n >> 3] >> (4 * (n & 7) + r)) & 1u)) s[n][r] = -INFINITY;
    }
  }
}

}  // namespace flashspan::kern
