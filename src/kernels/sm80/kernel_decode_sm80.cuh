// The SDPA decode forward (sm_80 and newer; mma.sync, cp.async): packed GQA on the 16-row decode
// tile and the key walk split into items whose partial results a combine kernel merges
// (FlashDecoding, Dao et al. 2023: "Flash-Decoding for long-context inference"). For calls with few
// query rows per kv head (S_q G <= 16, sdpa_family.cpp sdpa_decode_refusal), where the prefill
// kernels would run one or a few valid rows of a 128-row tile per query head, reread K / V once per
// query head of a GQA group, and leave most SMs idle when B H_k is small.
//
// Composition: the sm80 forward's work item (kernel_fwd_sm80.cuh fwd_item: Q gather of packed rows,
// the K / V loader of either address role -- contiguous or paged --, the mainloop, online softmax,
// split partial store, max_logit) with the mask policy below, one item per CTA (params.h
// SdpaDecodeGrid: item i = task t * splits + split s, slot i); then sdpa_fwd_decode_combine_kernel
// (below) per (task, packed row).
//
// The mask policy (AnalyticPackedMaskSm80): packed row r of a block is query position
// (row0 + r) / G of query head hkv G + (row0 + r) % G, so the rows of one block hold several
// positions (S_q > 1) or one (decode proper). Its Q2K walk is q2k_cursor_rows over the positions the
// block's valid rows hold (a key block is full when every one of them sees it whole); a partial
// block's element test is each thread row's own position's (QueryBlockMask of that position, kept
// per item). Score modifiers: softcap (head-independent); ALiBi with each thread row's own head's slope
// and position (sdpa_decode_alibi_enabled); sinks join the denominator in the combine kernel. The additive bias, dropout, the block_mask and
// H_k != H_v (per-head tensors inside the main loop) are not taken: the rule sends those calls to
// the prefill kernels.
#pragma once

#include <cstdint>

#include "kernels/sm80/kernel_fwd_sm80.cuh"

namespace flashspan::kern {

template <class T>
struct AnalyticPackedMaskSm80 {
  static_assert(T::kWarps == 1 && T::kMT == 1, "the packed decode mask: one warp of one m16 tile (the decode tile)");
  // kAnalytic false: fwd_item's items write split partials (slot >= 0 always); kFeatures true: the
  // scores are scaled before apply() (softcap needs the logits), dropout() / init_stats() no-ops.
  static constexpr bool kAnalytic = false;
  static constexpr bool kFeatures = true;
  using Seqlen = AnalyticSeqlen;
  QueryBlockMask rowm[2];  // the thread's rows g, g + 8: their positions' masks
  float c2, inv_c2;        // softcap * log2 e and its inverse (0: none)
  int head0, row0;         // the task's first query head and the block's first packed row (ALiBi's heads)

  __device__ __forceinline__ static AnalyticCursor q2k(const FwdParams& p, const Seqlen& sl, int, int, int qb) {
    const int64_t row0 = int64_t(qb) * T::kBlockQ;
    const int64_t end = min(int64_t(sl.len_q) * p.pack, row0 + T::kBlockQ);  // past the block's valid rows
    if (end <= row0) return AnalyticCursor{0, 0, 0, 0};
    return q2k_cursor_rows(sl.mask, row0 / p.pack, (end - 1) / p.pack + 1, T::kBlockK);
  }
  template <class Elem>
  __device__ __forceinline__ static const Elem* sample_ptr(const FwdParams& p, const void* base, const TensorAddr&,
                                                           int x, int b, int) {
    return static_cast<const Elem*>(base) + sample_start(analytic_of(p).start[x], b);
  }
  __device__ __forceinline__ static int rows_store(const FwdParams&, int, int rows_valid) { return rows_valid; }
  __device__ __forceinline__ static AnalyticPackedMaskSm80 item(const FwdParams& p, const Seqlen& sl, int row0,
                                                                int head0) {
    const int g = (threadIdx.x & 31) >> 2;
    AnalyticPackedMaskSm80 m;
#pragma unroll
    for (int hi = 0; hi < 2; ++hi) m.rowm[hi] = QueryBlockMask::make(sl.mask, (row0 + g + 8 * hi) / p.pack);
    m.c2 = analytic_of(p).score.softcap2;
    m.inv_c2 = SdpaScoreMod::inv_softcap(m.c2);
    m.head0 = head0;
    m.row0 = row0;
    return m;
  }
  // Softcap and ALiBi on every block (the sm80 SDPA kernels' order: SdpaScoreMod::apply), then a
  // partial block's element mask: register r of n8 block n is row half r / 2 (position of rowm[r / 2])
  // at column 8 n + 2 t + r % 2 of the key block. ALiBi per row half, slope_h (j - i - shift) with the
  // row's head h and position i, formed per block (held across the main loop, the rows' slopes and
  // shifted positions took 6-12 more registers of every decode kernel, ALiBi or not).
  __device__ __forceinline__ void apply(const QkvParams& q, float (&s)[T::kNS][4], const bool& partial,
                                        const int& entry, int, int lane) const {
    if (c2 != 0.0f) SdpaScoreMod{c2, inv_c2, 0.0f}.apply<T::kNS>(s, 0, lane);
    const int col = 2 * (lane & 3);
    const FwdParams& p = static_cast<const FwdParams&>(q);
    const AnalyticMaskParams& a = analytic_of(p);
    if (a.score.alibi_n > 0) {
#pragma unroll
      for (int hi = 0; hi < 2; ++hi) {
        const int pr = row0 + (lane >> 2) + 8 * hi;
        const float a2 = alibi_slope_dev(head0 + pr % p.pack, a.score.alibi_n) * kLog2e;
        // QueryBlockMask's lo0 = d_min + position + shift.
        const int d0 = diag_base(int64_t(entry) * T::kBlockK, rowm[hi].lo0 - a.band.d_min()) + col;
#pragma unroll
        for (int n = 0; n < T::kNS; ++n) {
#pragma unroll
          for (int e = 0; e < 2; ++e) s[n][2 * hi + e] = fmaf(a2, float(d0 + 8 * n + e), s[n][2 * hi + e]);
        }
      }
    }
    if (!partial) return;
#pragma unroll
    for (int hi = 0; hi < 2; ++hi) {
      const TileMask tm = rowm[hi].tile(int64_t(entry) * T::kBlockK);
#pragma unroll
      for (int n = 0; n < T::kNS; ++n) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          if (!tm.visible(0, col + 8 * n + e)) s[n][2 * hi + e] = -INFINITY;
        }
      }
    }
  }
  template <int kN>
  __device__ __forceinline__ void dropout(const QkvParams&, float (&)[kN][4], int, int, int) const {}
  template <int kMT>
  __device__ __forceinline__ static void init_stats(const FwdParams&, int, int, int, int, float (&)[kMT][2],
                                                    float (&)[kMT][2]) {}
};

// One item of the decode grid (SdpaDecodeGrid): its task's block, kv head and sample, its range of
// the task's key walk, its slot. KvAddr: ContiguousKv, or PagedKv (p's page tables).
template <class T, class E, class KvAddr>
__global__ void __launch_bounds__(T::kThreads, T::kMinBlocks)
    sdpa_fwd_decode_kernel_sm80(const SdpaPagedFwdParams p, const SdpaDecodeGrid d) {
  extern __shared__ __align__(128) uint8_t smem[];
  __shared__ int32_t s_item[4];  // fwd_item reads the slot from s_item[3]
  const int item = blockIdx.x;
  const int t = item / d.splits, split = item - t * d.splits;
  const int bh = t / d.num_q_blocks, qb = t - bh * d.num_q_blocks;
  const int b = bh / d.num_heads_kv, hkv = bh - b * d.num_heads_kv;
  if (threadIdx.x == 0) s_item[3] = item;
  // The combine grid (launched as a programmatic dependent) may launch once every item has started:
  // it waits for this grid's completion (grid_dependency_wait) before it reads a slot.
  grid_dependency_trigger();
  __syncthreads();
  fwd_item<T, E, true, true, AnalyticPackedMaskSm80<T>, KvAddr>(p, smem_u32(smem), s_item, qb, hkv, b,
                                                                split * d.chunk, d.chunk);
}

// The combine of the decode forward (params.h SdpaDecodeGrid): the `splits` slots of task t (slots
// t splits ..) merged, for one packed row of the task's block, into O, the LSE (a.lse_unit) and the
// epilogue options (score_max / score_sum_exp, the output gate: sdpa_fwd_row_options); a head's
// sink joins the denominator here (the items seed nothing). One CTA per (task, packed row):
// blockIdx.x = t combine_rows + row (rows past S_q G get none). Launched as a programmatic
// dependent of the decode grid (launch_util.h launch_dependent): it waits for that grid
// (grid_dependency_wait) before it writes anything. A row past the sample that a padded O holds
// (rows_to_store) gets O = 0, LSE = -inf without reading a slot; rows past those return at once. Warp w folds
// slots w, w + kWarps, ... into its (m, l, O) with merge_scales (softmax.cuh; lane l holds columns
// 4 l .. 4 l + 3, float4 loads, eight slots' loads in flight), warp 0 folds the sink and the
// warps' results: the sums of merge_split_stats, in another order. (The first form, one CTA per
// task with a thread per column pair walking every slot, was latency-bound: 54 us for 8 tasks of 86
// slots, more than the decode kernel's 42, PERF_LOG v2.26.)
inline constexpr int kDecodeCombineThreads = 256;

__device__ __forceinline__ void merge_row_part(float& m, float& l, float4& x, float m_b, float l_b, const float4& y) {
  const MergeScales s = merge_scales(m, m_b);
  m = s.m;
  l = l * s.a + l_b * s.b;
  x.x = x.x * s.a + y.x * s.b;
  x.y = x.y * s.a + y.y * s.b;
  x.z = x.z * s.a + y.z * s.b;
  x.w = x.w * s.a + y.w * s.b;
}

template <class E>
__global__ void __launch_bounds__(kDecodeCombineThreads)
    sdpa_fwd_decode_combine_kernel(const SdpaFwdParams p, const SdpaDecodeGrid d) {
  using Elem = typename E::Storage;
  constexpr int kBq = kDecodeBlockQ, kWarps = kDecodeCombineThreads / 32;
  const AnalyticMaskParams& a = p.analytic;
  const int t = blockIdx.x / d.combine_rows, row = blockIdx.x - t * d.combine_rows;
  const int bh = t / d.num_q_blocks, qb = t - bh * d.num_q_blocks;
  const int b = bh / d.num_heads_kv, hkv = bh - b * d.num_heads_kv;
  const int pack = p.pack, row0 = qb * kBq;
  const int len_q = sample_length(a.seq_len_q, a.cu_seq_len_q, a.max_q, b);
  if (row >= rows_to_store(a, kSdpaO, row0, kBq, len_q * pack, a.max_q * pack)) return;
  grid_dependency_wait();  // the decode items' slots (a programmatic dependent launch)
  const bool valid = row < len_q * pack - row0;  // uniform over the CTA
  const int pos = (row0 + row) / pack, head = hkv * pack + (row0 + row - pos * pack);
  const int64_t slot0 = int64_t(t) * d.splits;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int dv = p.head_dv, c = 4 * lane;  // dv <= 128 (the decode rule)
  __shared__ float s_m[kWarps], s_l[kWarps];
  __shared__ float4 s_x[kWarps][32];

  float m = -INFINITY, l = 0.0f;
  float4 x = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  if (valid) {
    const float* ml = p.split.ml + slot0 * 2 * kBq + row;
    const float* acc = p.split.o_accum + (slot0 * kBq + row) * dv + min(c, dv - 4);  // lanes past dv: unused
    // kBatch slots' loads issued before their merges (left to the compiler, an unrolled loop
    // waited for each slot's loads before the next: 0.9 us a slot, PERF_LOG v2.26).
    constexpr int kBatch = 8;
    for (int i0 = warp; i0 < d.splits; i0 += kBatch * kWarps) {
      float mb[kBatch], lb[kBatch];
      float4 y[kBatch];
#pragma unroll
      for (int u = 0; u < kBatch; ++u) {  // unconditional loads (a slot past the task's reads the last)
        const int64_t i = min(i0 + u * kWarps, d.splits - 1);
        mb[u] = __ldg(ml + i * 2 * kBq);
        lb[u] = __ldg(ml + i * 2 * kBq + kBq);
        y[u] = __ldg(reinterpret_cast<const float4*>(acc + i * kBq * dv));
      }
#pragma unroll
      for (int u = 0; u < kBatch; ++u) {
        if (i0 + u * kWarps < d.splits) merge_row_part(m, l, x, mb[u], lb[u], y[u]);
      }
    }
    if (lane == 0) {
      s_m[warp] = m;
      s_l[warp] = l;
    }
    s_x[warp][lane] = x;
    __syncthreads();  // s_m, s_l, s_x
  }
  if (warp > 0) return;
  if (valid) {
    const float* sink = a.score.sink;
    m = sink != nullptr ? __ldg(sink + head) * kLog2e : -INFINITY;
    l = sink != nullptr ? 1.0f : 0.0f;
    x = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
    for (int w = 0; w < kWarps; ++w) merge_row_part(m, l, x, s_m[w], s_l[w], s_x[w][lane]);
  }
  const Elem* gate = sdpa_fwd_row_options<E>(p, b, head, 0, pos, m, l, lane == 0);
  if (lane == 0 && p.lse != nullptr) {
    p.lse[sample_start(a.start[kSdpaStats], b) + int64_t(head) * p.lsea.head_stride +
          int64_t(pos) * p.lsea.row_stride] = lse_from_stats(m, l, a.lse_unit);
  }
  if (c >= dv) return;
  const float inv = l > 0.0f ? 1.0f / l : 0.0f;
  x.x *= inv;
  x.y *= inv;
  x.z *= inv;
  x.w *= inv;
  if (gate != nullptr) {
    sdpa_gate_pair<E>(gate, c, x.x, x.y);
    sdpa_gate_pair<E>(gate, c + 2, x.z, x.w);
  }
  Elem* o = static_cast<Elem*>(p.o) + sample_start(a.start[kSdpaO], b) + int64_t(pos) * p.oa.row_stride +
            int64_t(head) * p.oa.head_stride + c;
  *reinterpret_cast<uint2*>(o) = make_uint2(pack2<E>(x.x, x.y), pack2<E>(x.z, x.w));
}

}  // namespace flashspan::kern
