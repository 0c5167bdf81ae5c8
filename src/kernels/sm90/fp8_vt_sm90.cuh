// The V^T pre-pass of the sm90 FP8 SDPA forward (kernel_fwd_sm90.cuh sdpa_fp8_fwd_kernel_sm90):
// wgmma's 8-bit forms take both operands K-major (no transpose operand, PTX ISA 9.0 sec.
// 9.7.15.5), and O = P V reduces over the keys, while V [keys, D_v] has D_v contiguous. So each
// call first writes V^T into its workspace (params.h SdpaFp8Params::v_t):
//   vt[b][h][d][k] = V[b][h][key(k)][d]   for keys k < fp8_vt_keys_sm90(S_kv) (128-key blocks),
//   key(k) = 32 (k / 32) + fp8_vt_key(k % 32)  (tile_sm90.h: the permutation inside each 32-key
//   group that matches the A fragment pack_p builds from each thread's own P values),
// 0 where key(k) >= the sample's length (padding and the tail of the last block: P is 0 there,
// and a zero V keeps a NaN of the padding out of 0 * NaN), rows d < D_v only (the kernel's tensor
// map fills d >= D_v with zeros). Reading V once costs S_kv D_v bytes a (sample, kv head) against
// the forward's S_q S_kv D work; in the forward's stream, before it.
// One CTA of 256 threads a tile of 64 keys x 64 columns: 16-byte loads of V's rows into shared
// memory, 16-byte stores of V^T's rows (each thread gathers 16 permuted keys of one column).
// A packed (ragged) V (kRagged; experimental): each sample read from its start (sample_start), the
// rows of its keys only; a sample whose start is not 16-byte aligned (its rows then are not: the
// launcher checks the strides, dispatch the multiplier) is read a byte at a time, so it cannot fault.
#pragma once

#include <cstdint>

#include "kernels/common/analytic_seqlen.cuh"
#include "kernels/params.h"
#include "kernels/sm90/tile_sm90.h"

namespace flashspan::kern90 {

constexpr int kVtKeys = 64, kVtCols = 64, kVtThreads = 256;
// Shared tile pitch: 64 bytes of a key's columns + 16 (16-byte aligned rows, fewer bank conflicts
// on the column gathers).
constexpr int kVtPitch = kVtCols + 16;

// CTA n: key tile n % key_tiles, column tile n / key_tiles % col_tiles, kv head, sample (grid_1d
// over B H_v col_tiles key_tiles, fp8_vt_sm90.cu).
template <bool kRagged>
__global__ void __launch_bounds__(kVtThreads)
    sdpa_fp8_vt_kernel_sm90(const __grid_constant__ SdpaFp8FwdParams p, int key_tiles, int col_tiles, int heads_v) {
  __shared__ __align__(16) uint8_t tile[kVtKeys * kVtPitch];
  int64_t n = blockIdx.x;
  const int kt = int(n % key_tiles);
  n /= key_tiles;
  const int ct = int(n % col_tiles);
  n /= col_tiles;
  const int h = int(n % heads_v), b = int(n / heads_v);
  const AnalyticMaskParams& a = p.analytic;
  const int len_kv = kern::sample_length(a.seq_len_kv, a.cu_seq_len_kv, a.max_kv, b);
  const int dv = p.head_dv, key0 = kt * kVtKeys, col0 = ct * kVtCols;
  const int t = threadIdx.x;
  {
    // Load: key key0 + t / 4, 16 columns from col0 + 16 (t % 4).
    const int key = key0 + (t >> 2), col = col0 + 16 * (t & 3);
    uint4 x = make_uint4(0, 0, 0, 0);
    if (key < len_kv && col < dv) {
      const uint8_t* v = static_cast<const uint8_t*>(p.v) + kern::sample_start(a.start[kSdpaV], b) +
                         int64_t(h) * p.va.head_stride + int64_t(key) * p.va.row_stride + col;
      if (!kRagged || reinterpret_cast<uintptr_t>(v) % 16 == 0) {
        x = __ldg(reinterpret_cast<const uint4*>(v));
      } else {
        uint32_t w[4] = {0, 0, 0, 0};
#pragma unroll
        for (int i = 0; i < 16; ++i) w[i / 4] |= uint32_t(__ldg(v + i)) << (8 * (i % 4));
        x = make_uint4(w[0], w[1], w[2], w[3]);
      }
    }
    *reinterpret_cast<uint4*>(tile + (t >> 2) * kVtPitch + 16 * (t & 3)) = x;
  }
  __syncthreads();
  // Store: column col0 + t / 4 of V^T, keys key0 + 16 (t % 4) .. + 15 (permuted inside their
  // 32-key group).
  const int col = col0 + (t >> 2);
  if (col >= dv) return;
  const int k0 = 16 * (t & 3);
  uint32_t w[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    uint32_t word = 0;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int k = k0 + 4 * i + j;
      const int src = (k & ~31) | sm90::fp8_vt_key(k & 31);
      word |= uint32_t(tile[src * kVtPitch + (t >> 2)]) << (8 * j);
    }
    w[i] = word;
  }
  const int64_t keys = sm90::fp8_vt_keys_sm90(a.max_kv);
  uint8_t* vt = static_cast<uint8_t*>(p.fp8.v_t) + ((int64_t(b) * heads_v + h) * dv + col) * keys + key0 + k0;
  *reinterpret_cast<uint4*>(vt) = make_uint4(w[0], w[1], w[2], w[3]);
}

}  // namespace flashspan::kern90
