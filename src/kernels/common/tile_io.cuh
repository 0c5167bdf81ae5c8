// Shared-memory tiles of 16-bit elements and the loads/fragment reads on them.
//
// A tile is kRows x kD elements (kD % 64 == 0), row major, cut into 16-byte chunks of 8
// elements; chunk c of row r is stored at chunk position c ^ (r % 8) of that row. The
// XOR swizzle puts the 8 rows an ldmatrix phase reads (same chunk column, 8 consecutive
// rows) into 8 different 16-byte bank groups, so neither cp.async writes nor ldmatrix
// reads conflict.
#pragma once

#include <cstdint>

#include "kernels/common/ptx.cuh"

namespace flashspan::kern {

// Element offset of (row, chunk) in a swizzled tile with kD columns.
template <int kD>
__device__ __forceinline__ int swz_offset(int row, int chunk) {
  return row * kD + ((chunk ^ (row & 7)) << 3);
}

// Asynchronously copies rows [0, rows_valid) x columns [0, d_valid) of a global matrix
// (row stride in elements, columns contiguous) into a swizzled tile; the rest of the tile
// is zero-filled without touching global memory (`fallback` is any valid address).
template <int kRows, int kD, int kThreads>
__device__ __forceinline__ void load_tile_async(uint32_t smem_tile, const uint16_t* gbase, int64_t row_stride,
                                                int rows_valid, int d_valid, const void* fallback, int tid) {
  constexpr int kChunksPerRow = kD / 8;
  constexpr int kTotal = kRows * kChunksPerRow;
#pragma unroll
  for (int it = 0; it < (kTotal + kThreads - 1) / kThreads; ++it) {
    const int idx = it * kThreads + tid;
    if (kTotal % kThreads == 0 || idx < kTotal) {
      const int row = idx / kChunksPerRow;
      const int ch = idx % kChunksPerRow;
      const bool ok = row < rows_valid && ch * 8 < d_valid;
      const void* src = ok ? static_cast<const void*>(gbase + row * row_stride + ch * 8) : fallback;
      cp_async_16(smem_tile + swz_offset<kD>(row, ch) * 2, src, ok);
    }
  }
}

// A fragment (16x16, row major) of rows m0.., columns k0.. of a swizzled tile.
template <int kD>
__device__ __forceinline__ void load_frag_a(uint32_t (&a)[4], uint32_t tile, int m0, int k0, int lane) {
  const int row = m0 + (lane & 15);
  const int chunk = (k0 >> 3) + (lane >> 4);
  ldmatrix_x4(a, tile + swz_offset<kD>(row, chunk) * 2);
}

// A fragment of the TRANSPOSE of a stored tile: A(m, k) = tile(k0 + k, m0 + m).
template <int kD>
__device__ __forceinline__ void load_frag_a_trans(uint32_t (&a)[4], uint32_t tile, int m0, int k0, int lane) {
  const int i = lane >> 3;
  const int row = k0 + (lane & 7) + ((i >> 1) << 3);
  const int chunk = (m0 >> 3) + (i & 1);
  ldmatrix_x4_trans(a, tile + swz_offset<kD>(row, chunk) * 2);
}

// B fragments of two n8 blocks (n0, n0+8) at k-step k0 where the tile stores B^T, i.e.
// B(k, n) = tile(n, k) (K for S = Q K^T). b[0],b[1]: block n0; b[2],b[3]: block n0+8.
template <int kD>
__device__ __forceinline__ void load_frag_b_nk(uint32_t (&b)[4], uint32_t tile, int n0, int k0, int lane) {
  const int row = n0 + (lane & 7) + ((lane >> 4) << 3);
  const int chunk = (k0 >> 3) + ((lane >> 3) & 1);
  ldmatrix_x4(b, tile + swz_offset<kD>(row, chunk) * 2);
}

// B fragments of two n8 blocks where the tile stores B itself, B(k, n) = tile(k, n)
// (V for O = P V), read with ldmatrix.trans.
template <int kD>
__device__ __forceinline__ void load_frag_b_kn(uint32_t (&b)[4], uint32_t tile, int n0, int k0, int lane) {
  const int row = k0 + (lane & 7) + (((lane >> 3) & 1) << 3);
  const int chunk = (n0 >> 3) + (lane >> 4);
  ldmatrix_x4_trans(b, tile + swz_offset<kD>(row, chunk) * 2);
}

}  // namespace flashspan::kern
