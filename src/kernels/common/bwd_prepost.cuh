// Backward pre- and post-processing, arch-neutral (no mma): the row statistics the dK/dV and
// dQ kernels of every family read, and the conversion of the fp32 dQ accumulator.
//   preprocess:  D_i = dO_i . O_i - dlse_i and lse2_i = LSE_i * log2(e) (+inf for an empty
//                row) into the workspace, [Hq, total_q] fp32 each (params.h, BwdParams).
//   dQ convert:  dq = scale * dq_accum in the input dtype (atomic dQ path).
#pragma once

#include <cstdint>

#include "kernels/common/ptx.cuh"
#include "kernels/params.h"

namespace flashspan::kern {

// ---------------------------------------------------------------------------------------
// 1. Preprocess: one warp per (row, head); grid (ceil(max_seqlen_q / 8), Hq, B), 256 threads.
template <bool kBf16>
__global__ void __launch_bounds__(256) flex_bwd_preprocess_kernel(const BwdParams p) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int h = blockIdx.y, b = blockIdx.z;
  const int i = blockIdx.x * 8 + warp;
  const int q_start = __ldg(p.cu_seqlens_q + b), len_q = __ldg(p.cu_seqlens_q + b + 1) - q_start;
  if (i >= len_q) return;
  const int64_t row = int64_t(p.varlen ? q_start : 0) + i;
  const uint16_t* o = static_cast<const uint16_t*>(p.o) + int64_t(b) * p.oa.batch_stride + row * p.oa.row_stride +
                      int64_t(h) * p.oa.head_stride;
  const uint16_t* d = static_cast<const uint16_t*>(p.dout) + int64_t(b) * p.doa.batch_stride +
                      row * p.doa.row_stride + int64_t(h) * p.doa.head_stride;
  float acc = 0.0f;
  for (int c = lane * 8; c < p.head_dv; c += 256) {
    const uint4 ov = *reinterpret_cast<const uint4*>(o + c);
    const uint4 dv = *reinterpret_cast<const uint4*>(d + c);
    const uint16_t* oe = reinterpret_cast<const uint16_t*>(&ov);
    const uint16_t* de = reinterpret_cast<const uint16_t*>(&dv);
#pragma unroll
    for (int e = 0; e < 8; ++e) acc += to_float<kBf16>(oe[e]) * to_float<kBf16>(de[e]);
  }
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, off);
  if (lane == 0) {
    const int64_t ws = int64_t(h) * p.total_q + q_start + i;
    if (p.dlse != nullptr) {
      acc -= p.dlse[int64_t(b) * p.dlsea.batch_stride + int64_t(h) * p.dlsea.head_stride + row * p.dlsea.row_stride];
    }
    p.delta[ws] = acc;
    const float lse = p.lse[int64_t(b) * p.lsea.batch_stride + int64_t(h) * p.lsea.head_stride + row * p.lsea.row_stride];
    p.lse2[ws] = lse == -INFINITY ? INFINITY : lse * kLog2e;
  }
}

// ---------------------------------------------------------------------------------------
// 2b. dQ conversion (atomic path): dq = scale * dq_accum in the input dtype. One warp per
// (row, head); grid (ceil(max_seqlen_q / 8), Hq, B), 256 threads.
template <bool kBf16>
__global__ void __launch_bounds__(256) flex_bwd_dq_convert_kernel(const BwdParams p) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int h = blockIdx.y, b = blockIdx.z;
  const int i = blockIdx.x * 8 + warp;
  const int q_start = __ldg(p.cu_seqlens_q + b), len_q = __ldg(p.cu_seqlens_q + b + 1) - q_start;
  if (i >= len_q) return;
  const float* src = p.dq_accum + (int64_t(h) * p.total_q + q_start + i) * p.head_dqk;
  uint16_t* dst = static_cast<uint16_t*>(p.dq) + int64_t(b) * p.dqa.batch_stride +
                  (int64_t(p.varlen ? q_start : 0) + i) * p.dqa.row_stride + int64_t(h) * p.dqa.head_stride;
  for (int c = lane * 2; c < p.head_dqk; c += 64) {
    const float2 x = *reinterpret_cast<const float2*>(src + c);
    *reinterpret_cast<uint32_t*>(dst + c) = pack2<kBf16>(x.x * p.scale, x.y * p.scale);
  }
}

}  // namespace flashspan::kern
