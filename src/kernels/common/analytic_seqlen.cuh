// Sample geometry of the analytic-mask kernels (SDPA), every family: a sample's lengths and
// where each tensor's sample starts, read from the caller's int32/int64 device arrays
// (AnalyticMaskParams, params.h). The counterpart of SeqlenInfo (seqlen_info.cuh), which
// reads the plan's cu_seqlens.
#pragma once

#include <cstdint>

#include "kernels/common/analytic_mask.h"
#include "kernels/params.h"

namespace flashspan::kern {

// The analytic mask of an SDPA kernel's parameters, given as the base FwdParams / BwdParams
// the shared kernel bodies take (the kernel's parameter is an SdpaFwdParams / SdpaBwdParams).
__device__ __forceinline__ const AnalyticMaskParams& analytic_of(const FwdParams& p) {
  return static_cast<const SdpaFwdParams&>(p).analytic;
}
__device__ __forceinline__ const AnalyticMaskParams& analytic_of(const BwdParams& p) {
  return static_cast<const SdpaBwdParams&>(p).analytic;
}

// The FP8 factors of an SDPA FP8 forward's parameters (the kernel's parameter is an
// SdpaFp8FwdParams; only its FP8 instantiations call this).
__device__ __forceinline__ const SdpaFp8Params& fp8_of(const FwdParams& p) {
  return static_cast<const SdpaFp8FwdParams&>(p).fp8;
}
// FP8 factor i (SdpaFp8Factor of an SdpaFp8Params, SdpaFp8BwdFactor of an SdpaFp8BwdParams): its float in
// device memory, or its host value.
template <class Fp8Factors>
__device__ __forceinline__ float fp8_factor(const Fp8Factors& f, int i) {
  return f.factor[i] != nullptr ? __ldg(f.factor[i]) : f.host_factor[i];
}

__device__ __forceinline__ int64_t load_index(const IndexArray& a, int64_t i) {
  return a.is64 ? int64_t(__ldg(static_cast<const long long*>(a.ptr) + i)) : int64_t(__ldg(static_cast<const int*>(a.ptr) + i));
}

// Length of sample b: seq_len[b], or cu_seq_len[b + 1] - cu_seq_len[b], or max when neither
// is given; clamped to [0, max].
__device__ __forceinline__ int sample_length(const IndexArray& len, const IndexArray& cu, int max, int b) {
  int64_t n = max;
  if (len.ptr != nullptr) {
    n = load_index(len, b);
  } else if (cu.ptr != nullptr) {
    n = load_index(cu, b + 1) - load_index(cu, b);
  }
  return int(clamp64(n, 0, max));
}

// Element offset of (sample b, head 0, row 0) of a tensor (SampleStart).
__device__ __forceinline__ int64_t sample_start(const SampleStart& s, int b) {
  return s.ragged.ptr != nullptr ? load_index(s.ragged, b) * s.mult : int64_t(b) * s.batch_stride;
}

// One sample as the analytic kernels see it. q_start / k_start: its first row in the
// backward workspace (b * max_q) and b * max_kv, the fields SeqlenInfo's users read.
struct AnalyticSeqlen {
  int q_start, len_q, k_start, len_k;
  AnalyticSample mask;
  int b;  // the sample

  __device__ __forceinline__ AnalyticSeqlen(const AnalyticMaskParams& a, int b_)
      : q_start(b_ * a.max_q),
        len_q(sample_length(a.seq_len_q, a.cu_seq_len_q, a.max_q, b_)),
        k_start(b_ * a.max_kv),
        len_k(sample_length(a.seq_len_kv, a.cu_seq_len_kv, a.max_kv, b_)),
        mask(AnalyticSample::make(a.band, len_q, len_k)),
        b(b_) {}
  // p: the base FwdParams / BwdParams of an SDPA kernel's parameters (analytic_of).
  template <class Params>
  __device__ __forceinline__ AnalyticSeqlen(const Params& p, int b) : AnalyticSeqlen(analytic_of(p), b) {}
};

// Byte (query row 0, key column 0) of (sample b, query head h) of the block_mask, or null.
__device__ __forceinline__ const uint8_t* block_mask_base(const AnalyticMaskParams& a, int b, int h) {
  const SdpaBlockMaskParams& m = a.block_mask;
  return m.bits == nullptr ? nullptr : m.bits + int64_t(b) * m.batch_stride + int64_t(h) * m.head_stride;
}

// The Q2K cursor of query block qb (bq x bk tiles) of query head h in sample sl.b, block_mask
// applied (the forward and the dQ kernel). kBlockMask = false: the call has no block_mask (the
// sm80 kernels' mask-only instantiations), so the cursor's row is null at compile time.
template <bool kBlockMask = true>
__device__ __forceinline__ BlockMaskedCursor masked_q2k_cursor(const AnalyticMaskParams& a, const AnalyticSeqlen& sl,
                                                                int h, int qb, int bq, int bk) {
  const uint8_t* base = kBlockMask ? block_mask_base(a, sl.b, h) : nullptr;
  const uint8_t* row = base == nullptr ? nullptr : base + ((int64_t(qb) * bq) >> kBlockMaskShift) * a.block_mask.row_stride;
  return BlockMaskedCursor{q2k_cursor(sl.mask, qb, bq, bk), row, bk};
}

// The K2Q walk of key block kb over query heads [h0, h1) of sample sl.b, block_mask applied
// (kBlockMask as above).
template <bool kBlockMask = true>
__device__ __forceinline__ AnalyticK2QWalk masked_k2q_walk(const AnalyticMaskParams& a, const AnalyticSeqlen& sl,
                                                           int h0, int h1, int count, int kb, int bq, int bk) {
  const AnalyticCursor row = k2q_cursor(sl.mask, kb, bq, bk);
  AnalyticK2QWalk w{h0, h1, count, row, row};
  const uint8_t* base = kBlockMask ? block_mask_base(a, sl.b, 0) : nullptr;
  if (base != nullptr) {
    const int64_t c = (int64_t(kb) * bk) >> kBlockMaskShift;
    w.bm = base + (c >> 3);
    w.bm_head_stride = a.block_mask.head_stride;
    w.bm_row_stride = a.block_mask.row_stride;
    w.bm_bit = int(c & 7);
    w.bq = bq;
  }
  return w;
}

// Rows of a tile at row0 (block of `rows` rows) an output of tensor x writes: a padded
// output every row below its max, a ragged one the sample's rows (len).
__device__ __forceinline__ int rows_to_store(const AnalyticMaskParams& a, int x, int row0, int rows, int len, int max) {
  const int n = a.start[x].ragged.ptr != nullptr ? len - row0 : max - row0;
  return n < rows ? n : rows;
}

}  // namespace flashspan::kern
