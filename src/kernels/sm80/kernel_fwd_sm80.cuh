// Flex attention forward kernel for sm_80 and newer (mma.sync m16n8k16, cp.async, ldmatrix).
//
// Algorithm: FlashAttention-2 (Dao 2023) forward over the plan's block-sparse Q2K lists.
// One CTA per task of plan.fwd_tasks {local query block, query head, batch, cost} (packed
// GQA: {packed local query block, kv head, batch, cost}, params.h), or with
// the split schedule (fwd_split.cuh) a persistent grid running work items (ranges of a
// task's key-block walk) whose partial results a combine kernel merges; warp w
// owns kMT m16 tiles, rows 16*kMT*w .. 16*kMT*(w+1)-1 of the block (m16 tile i of warp w is
// payload sub-tile row mt = kMT*w + i). Key blocks are visited in ascending order, merged from
// the full list (no masking) and the partial list (payload bits applied to the scores);
// empty blocks are never visited.
//
// Pipeline (single K and V buffers, as in FA2): K[i] is loaded while P[i-1] V[i-1] runs and
// V[i] while Q K[i]^T and the softmax run; two barriers per block.
// Shared memory: Q (kBlockQ x kDqk) + K (kBlockK x kDqk) + V (kBlockK x kDv), 16-bit, swizzled.
// Head dims below the tile's are zero-filled on load and the unused k-steps skipped.
//
// Packed GQA (p.pack = G > 1): a block's rows are packed rows of the G query heads of one kv
// head, so each K/V tile serves G query heads. Only the Q gather (load_q_tile_async), the
// O / LSE row addresses and the per-head max_logit reduction differ; the main loop does not
// know about packing.
#pragma once

#include <cstdint>

#include "kernels/common/analytic_mask.h"
#include "kernels/common/analytic_seqlen.cuh"
#include "kernels/common/block_range.cuh"
#include "kernels/common/epilogue_fwd.cuh"
#include "kernels/common/fp8_soft.h"
#include "kernels/common/grid.h"
#include "kernels/common/kv_addr.cuh"
#include "kernels/common/sdpa_score_mod.cuh"
#include "kernels/common/seqlen_info.cuh"
#include "kernels/common/softmax.cuh"
#include "kernels/common/split_schedule.cuh"
#include "kernels/common/tile_scheduler.cuh"
#include "kernels/params.h"
#include "kernels/sm80/mask_apply_sm80.cuh"
#include "kernels/sm80/mma_sm80.cuh"
#include "kernels/sm80/tile_io_sm80.cuh"
#include "kernels/sm80/tile_sm80.h"

namespace flashspan::kern {

template <int kBlockQ_, int kBlockK_, int kDqk_, int kDv_, int kMT_, int kMinBlocks_, bool kExact_>
struct FwdTraitsSm80 {
  static constexpr int kBlockQ = kBlockQ_, kBlockK = kBlockK_, kDqk = kDqk_, kDv = kDv_;
  // kExact: the head dims equal the tile's, so no k-step or column block is skipped at run
  // time (branch-free inner loops that ptxas can software-pipeline).
  static constexpr bool kExact = kExact_;
  // Each warp owns kMT m16 tiles (rows 16*kMT*w ..): every K/V fragment read from shared
  // memory feeds kMT mma instructions, which is what makes the kernel shared-memory-light.
  static constexpr int kMT = kMT_;
  static constexpr int kWarps = kBlockQ / (16 * kMT);
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kNS = kBlockK / 8;  // n8 blocks of a score row tile
  static constexpr int kNO = kDv / 8;      // n8 blocks of the output tile
  static constexpr int kSmemQ = kBlockQ * kDqk * 2;
  static constexpr int kSmemK = kBlockK * kDqk * 2;
  static constexpr int kSmemV = kBlockK * kDv * 2;
  static constexpr int kSmemBytes = kSmemQ + kSmemK + kSmemV;
  static constexpr int kMinBlocks = kMinBlocks_;  // CTAs per SM asked of ptxas
  // One-warp tiles (the 16-row decode tile) compile one kernel for both max_logit cases and
  // test p.max_logit at run time: their reduction is a few instructions per item, and it
  // halves their instantiations. Wider tiles keep the compile-time switch.
  static constexpr bool kMaxLogitAtRunTime = kWarps == 1;
  // K/V tiles of the main loop through TileRowLoader8 (tile_io.cuh: one 64-bit source base
  // per 16-row step, per-thread offsets computed once) where load_tile_async has no fast
  // layout for the head dim. Only (256, 256): there the element-wise fallback kept a 64-bit
  // source offset per copy (2 x 16) live across the loop, 255 registers and spills in it.
  // (192, 128) would qualify for K too, but with it ptxas spilled 4-32 bytes (1-3 LDL in the
  // loop) for ~110 fewer loop instructions: left on the fallback until measured.
  static constexpr bool kLoader8 = kDqk == 256 && kDv == 256;
  static_assert(kBlockQ % (16 * kMT) == 0 && kBlockK % 64 == 0 && kDqk % 64 == 0 && kDv % 64 == 0);
};

// Loads the Q tile of a query block, packed or not: tile row r is row pr = row0 + r of the
// block's view, i.e. query position pr / pack of query head head0 + pr % pack, at
//   q0 + (pr / pack) * row_stride + (pr % pack) * head_stride   (q0: position 0, head head0);
// pack = 1 is the plain tile (row0 + r, head0). Rows [rows_valid, kRows) and columns
// [d_valid, kD) are zero-filled without reading global memory (q0 must be a valid address).
// A thread covers rows r0, r0 + R, r0 + 2R, ... (R a multiple of 8, so the swizzle key of its
// rows is fixed) and steps (position, head) from one of its rows to the next with an add and
// a compare: one division per tile, no per-element index math. Thread layout: that of
// load_tile_async when it applies (same chunk column per thread; keeping it, rather than a
// new layout, matters for the registers of the main loop: ptxas shares the lane-derived
// values with the fragment addresses), else 8 threads per row, 8 chunks apart (one warp,
// the decode tile: 4 threads per row, 4 chunks apart, so that kR = 8 keeps a thread's key;
// one 16-row tile an item, where load_tile_async's one-warp layout's whole lines do not matter).
template <int kRows, int kD, int kThreads>
__device__ __forceinline__ void load_q_tile_async(uint32_t smem_tile, const uint16_t* q0, int64_t row_stride,
                                                  int64_t head_stride, int row0, int pack, int rows_valid,
                                                  int d_valid, int tid) {
  constexpr int kChunksPerRow = kD / 8;
  constexpr bool kColumnLayout = kThreads % kChunksPerRow == 0 && (kThreads / kChunksPerRow) % 8 == 0 &&
                                 kRows % (kThreads / kChunksPerRow) == 0;
  // Threads per row, chunks per thread and row, rows per step.
  constexpr int kTpr = kColumnLayout ? kChunksPerRow : (kThreads >= 64 ? 8 : kThreads / 8);
  constexpr int kCpt = kChunksPerRow / kTpr;
  constexpr int kR = kThreads / kTpr;
  // kTpr % 8 == 0: the j term of a chunk passes the swizzle XOR unchanged (dst + compile-time
  // steps); else (one warp) each j has its own shared-memory offset.
  constexpr bool kXorFree = kTpr % 8 == 0;
  static_assert(kChunksPerRow % kTpr == 0 && kR % 8 == 0 && kRows % kR == 0, "Q tile loader geometry");
  // Chunk c0 + kTpr j of row r0 + it R lands at chunk (c0 ^ (r0 % 8)) + kTpr j of that row
  // when kTpr is a multiple of 8 (the XOR leaves the j term alone; kXorFree).
  const int c0 = tid % kTpr, r0 = tid / kTpr;
  const uint32_t dst = smem_tile + swz_offset<kD>(r0, c0) * 2;
  const int pr = row0 + r0;
  int pos = pr / pack, sub = pr - pos * pack;
  const int dpos = kR / pack, dsub = kR - dpos * pack;
#pragma unroll
  for (int it = 0; it < kRows / kR; ++it) {
    const bool row_ok = r0 + it * kR < rows_valid;
    const uint16_t* src = q0 + int64_t(pos) * row_stride + int64_t(sub) * head_stride + c0 * 8;
#pragma unroll
    for (int j = 0; j < kCpt; ++j) {
      const bool ok = row_ok && (c0 + kTpr * j) * 8 < d_valid;
      if constexpr (kXorFree) {
        cp_async_16(dst + (it * kR * kD + 8 * kTpr * j) * 2, ok ? src + 8 * kTpr * j : q0, ok);
      } else {
        cp_async_16(smem_tile + (swz_offset<kD>(r0, c0 + kTpr * j) + it * kR * kD) * 2, ok ? src + 8 * kTpr * j : q0,
                    ok);
      }
    }
    pos += dpos;
    sub += dsub;
    if (sub >= pack) {
      sub -= pack;
      ++pos;
    }
  }
}

// Loads key rows [0, rows_valid) of a K or V tile through a TileRowLoader8 (`tile0`: row 0
// of the tile in global memory): all rows valid (every block but a sample's last) is a
// uniform branch to the copies without row checks.
template <int kRows, class Loader>
__device__ __forceinline__ void load_kv_rows8(const Loader& ld, uint32_t smem_tile, const uint16_t* tile0,
                                              int rows_valid, int tid) {
  if (rows_valid >= kRows) {
    ld.load_full(smem_tile, tile0 + ld.offset());
  } else {
    ld.load_partial(smem_tile, tile0 + ld.offset(), rows_valid, tid);
  }
}

// ---------------------------------------------------------------------------------------
// Roles of a forward work item. Each is a __forceinline__ function over the item's state,
// passed by reference, so the kernel compiles as one body (same code as the former single
// function: scripts/sass_diff.sh).

// KV loader: key block kb of K or V into its shared-memory tile, rows past the sample's length
// zero-filled. The block's rows from the K/V address role (KvAddr, kv_addr.cuh): contiguous
// rows (ContiguousKv: TileRowLoader8 (tile_io_sm80.cuh) where FwdTraitsSm80::kLoader8, else
// load_tile_async), or a paged cache (PagedKv, the specialization below: row gathers).
template <class T, class KvAddr_ = ContiguousKv>
struct FwdKvLoaderSm80 {
  using KvAddr = KvAddr_;
  using LoaderK = TileRowLoader8<T::kBlockK, T::kDqk, T::kThreads>;
  using LoaderV = TileRowLoader8<T::kBlockK, T::kDv, T::kThreads>;
  [[maybe_unused]] LoaderK ld_k;
  [[maybe_unused]] LoaderV ld_v;

  // b: the item's sample (unused: contiguous rows start at the head base).
  __device__ __forceinline__ void init(const QkvParams& p, int /*b*/, int tid) {
    if constexpr (T::kLoader8) {
      static_assert(LoaderK::kApplies && LoaderV::kApplies);
      ld_k.init(p.ka.row_stride, T::kExact ? T::kDqk : p.head_dqk, tid);
      ld_v.init(p.va.row_stride, T::kExact ? T::kDv : p.head_dv, tid);
    }
  }
  // k, v: position 0 of the item's kv head in the sample.
  template <class Elem>
  __device__ __forceinline__ void load_k(const QkvParams& p, uint32_t sK, const Elem* k, int kb, int len_k,
                                         int tid) const {
    if constexpr (T::kLoader8) {
      load_kv_rows8<T::kBlockK>(ld_k, sK, k + KvAddr::template block_offset<T::kBlockK>(p.ka, kb), len_k - kb * T::kBlockK,
                                tid);
    } else {
      load_tile_async<T::kBlockK, T::kDqk, T::kThreads>(sK, k + KvAddr::template block_offset<T::kBlockK>(p.ka, kb),
                                                        p.ka.row_stride, len_k - kb * T::kBlockK, p.head_dqk, tid);
    }
  }
  template <class Elem>
  __device__ __forceinline__ void load_v(const QkvParams& p, uint32_t sV, const Elem* v, int kb, int len_k,
                                         int tid) const {
    if constexpr (T::kLoader8) {
      load_kv_rows8<T::kBlockK>(ld_v, sV, v + KvAddr::template block_offset<T::kBlockK>(p.va, kb), len_k - kb * T::kBlockK,
                                tid);
    } else {
      load_tile_async<T::kBlockK, T::kDv, T::kThreads>(sV, v + KvAddr::template block_offset<T::kBlockK>(p.va, kb),
                                                       p.va.row_stride, len_k - kb * T::kBlockK, p.head_dv, tid);
    }
  }
};

// Paged K/V (PagedKv, SDPA's paged caches; the kernel's parameters are SdpaPagedFwdParams): each
// row of a key block gathered through its page (a block spans pages when the page size is below
// kBlockK), for K and V separately (their own page tables and page sizes; a side without a table
// is contiguous). k, v: the head base (container head hkv / hv, or a contiguous side's sample
// head). Rows past the sample are zero-filled and never looked up.
// The per-item policies are rebuilt at each tile load from the sample index (their page-table
// row: one multiply, or a cached load of a packed table's offset) rather than held across the
// main loop (ptxas, sm_90a, D = 128: held, 40 / 16 bytes of spills in the inexact / exact
// kernels; rebuilt, 0 / 16).
template <class T>
struct FwdKvLoaderSm80<T, PagedKv> {
  int b;  // the item's sample

  __device__ __forceinline__ static const SdpaPagedFwdParams& paged_of(const QkvParams& p) {
    return static_cast<const SdpaPagedFwdParams&>(static_cast<const FwdParams&>(p));
  }
  __device__ __forceinline__ void init(const QkvParams&, int b_, int /*tid*/) { b = b_; }
  // Key block kb of one side. A block inside one page (a contiguous side, or pages of kBlockK
  // keys or more: key blocks start at multiples of kBlockK, so a power-of-two page holds whole
  // blocks) is one lookup and the contiguous copy (load_tile_async) from its first row; smaller
  // pages, and a first row whose entry lies outside the container, gather row by row.
  template <int kD, class Elem>
  __device__ __forceinline__ void load_side(const SdpaPagedSide& side, int64_t row_stride, int d_valid, uint32_t s_tile,
                                            const Elem* base, int kb, int len_k, int tid) const {
    const PagedKv pk = PagedKv::item(side, b);
    const int key0 = kb * T::kBlockK;
    if ((side.table == nullptr || (int64_t(1) << side.log2_page) >= T::kBlockK) && key0 < len_k) {
      int64_t off = 0;
      if (pk.row_offset(side, key0, row_stride, off)) {
        load_tile_async<T::kBlockK, kD, T::kThreads>(s_tile, base + off, row_stride, len_k - key0, d_valid, tid);
        return;
      }
    }
    const auto row_offset = [&](int key, int64_t& off) { return pk.row_offset(side, key, row_stride, off); };
    gather_tile_async<T::kBlockK, kD, T::kThreads>(s_tile, base, row_offset, key0, len_k - key0, d_valid, tid);
  }
  template <class Elem>
  __device__ __forceinline__ void load_k(const QkvParams& p, uint32_t sK, const Elem* k, int kb, int len_k,
                                         int tid) const {
    load_side<T::kDqk>(paged_of(p).paged_k, p.ka.row_stride, T::kExact ? T::kDqk : p.head_dqk, sK, k, kb, len_k, tid);
  }
  template <class Elem>
  __device__ __forceinline__ void load_v(const QkvParams& p, uint32_t sV, const Elem* v, int kb, int len_k,
                                         int tid) const {
    load_side<T::kDv>(paged_of(p).paged_v, p.va.row_stride, T::kExact ? T::kDv : p.head_dv, sV, v, kb, len_k, tid);
  }
};

// Mask policies of the forward, a template parameter of fwd_item (the compile-time Mask role):
// which key blocks a query block walks (full or partial), how a partial block's scores are
// masked, and the sample geometry that comes with it. Per work item (query block qb of task
// head h, CSR mask head hm, sample b):
//   typename Mask::Seqlen sl(p, b)      the sample's lengths (and the plan's row starts)
//   Mask::q2k(p, sl, hm, b, qb)         the Q2K cursor: next(blk, partial, entry), skip(n)
//   Mask::sample_ptr<Elem>(p, base, a, x, b, start)   row 0, head 0 of sample b of tensor x
//   Mask::rows_store(p, row0, rows_valid) rows of the block the epilogue writes
//   Mask mask = Mask::item(p, sl, row0); mask.apply(p, s, partial, entry, mt, lane)
//                                       a partial block's element mask on m16 tile mt
//   Mask::kFeatures                     SDPA's features beyond the mask in the main loop
//                                       (run-time flags: score modifiers, bias, dropout, sinks,
//                                       block_mask, H_k != H_v); false (the plan, SDPA's
//                                       mask-only instantiations): the plan kernel's softmax
//                                       (the scale folded into the exponent)

// The plan's payload: a partial key block's predicate bits applied to m16 tile mt of the
// block's scores (mask_apply_sm80.cuh); full blocks are not masked. The hooks are the code the
// kernel had inline (scripts/sass_diff.sh: these instantiations compile to the same SASS).
template <class T>
struct PlanPayloadMaskSm80 {
  static constexpr bool kAnalytic = false;
  static constexpr bool kFeatures = false;  // (AnalyticMaskSm80)
  static constexpr size_t kWordsPerTile = size_t(T::kBlockQ) * T::kBlockK / 32;
  using Seqlen = SeqlenInfo;

  __device__ __forceinline__ static BlockCursor q2k(const FwdParams& p, const Seqlen&, int hm, int b, int qb) {
    const int64_t r = int64_t(hm) * p.view.num_q_blocks + __ldg(p.view.q_block_start + b) + qb;
    return BlockCursor::row(p.view.q2k_partial_ptr, p.view.q2k_partial_kb, p.view.q2k_full_ptr, p.view.q2k_full_runs,
                            r);
  }
  template <class Elem>
  __device__ __forceinline__ static const Elem* sample_ptr(const FwdParams& p, const void* base, const TensorAddr& a,
                                                           int /*x*/, int b, int start) {
    return static_cast<const Elem*>(base) + int64_t(b) * a.batch_stride + int64_t(p.varlen ? start : 0) * a.row_stride;
  }
  __device__ __forceinline__ static int rows_store(const FwdParams&, int /*row0*/, int rows_valid) {
    return rows_valid;
  }
  __device__ __forceinline__ static PlanPayloadMaskSm80 item(const FwdParams&, const Seqlen&, int /*row0*/,
                                                             int /*head*/) {
    return PlanPayloadMaskSm80{};
  }
  __device__ __forceinline__ static void apply(const QkvParams& p, float (&s)[T::kNS][4], const bool& partial,
                                               const int& entry, int mt, int lane) {
    if (partial) {
      apply_payload<T::kNS>(s, p.view.q2k_partial_bits + size_t(entry) * kWordsPerTile, mt, 0, T::kBlockK, lane);
    }
  }
};

// The analytic mask of SDPA (analytic_mask.h): blocks and element masks from positions, the
// sample's lengths and tensor starts from the caller's device arrays (AnalyticMaskParams).
// Per item it keeps the query block's mask terms (QueryBlockMask) and the head's ALiBi slope;
// entry = the key block. apply() runs SDPA's score modifiers (sdpa_score_mod.cuh: softcap,
// ALiBi; run-time flags) on every block before the mask and the additive bias after it (on the
// visible elements only); init_stats() seeds the row
// statistics with the head's sink. kFeatures_ (sdpa_fwd_has_features, params.h): those
// features, dropout, the block_mask and H_k != H_v compiled in (run-time flags); false: the
// mask alone (apply() is the element mask of a partial block; no block_mask).
template <class T, bool kFeatures_ = true>
struct AnalyticMaskSm80 {
  static constexpr bool kAnalytic = true;
  static constexpr bool kFeatures = kFeatures_;
  static_assert((1 << kBlockMaskShift) % T::kBlockQ == 0 && (1 << kBlockMaskShift) % T::kBlockK == 0,
                "block_mask: tiles must lie inside one 128 x 128 block");
  using Seqlen = AnalyticSeqlen;
  QueryBlockMask block;
  float a2;  // ALiBi slope * log2 e of the item's head (0: none)
  int b, head, row0;  // the item's sample, query head and first row (the additive bias's element, SdpaBiasFrag)

  // hm: the query head (SDPA calls set mask_per_head); the block_mask leaves blocks out.
  __device__ __forceinline__ static BlockMaskedCursor q2k(const FwdParams& p, const Seqlen& sl, int hm, int, int qb) {
    return masked_q2k_cursor<kFeatures>(analytic_of(p), sl, hm, qb, T::kBlockQ, T::kBlockK);
  }
  template <class Elem>
  __device__ __forceinline__ static const Elem* sample_ptr(const FwdParams& p, const void* base, const TensorAddr&,
                                                           int x, int b, int) {
    return static_cast<const Elem*>(base) + sample_start(analytic_of(p).start[x], b);
  }
  __device__ __forceinline__ static int rows_store(const FwdParams& p, int row0, int rows_valid) {
    const AnalyticMaskParams& a = analytic_of(p);
    return rows_to_store(a, kSdpaO, row0, T::kBlockQ, rows_valid + row0, a.max_q);
  }
  __device__ __forceinline__ static AnalyticMaskSm80 item(const FwdParams& p, const Seqlen& sl, int row0, int head) {
    const SdpaScoreParams& sp = analytic_of(p).score;
    return AnalyticMaskSm80{QueryBlockMask::make(sl.mask, row0),
                            kFeatures && sp.alibi_n > 0 ? alibi_slope_dev(head, sp.alibi_n) * kLog2e : 0.0f, sl.b,
                            head, row0};
  }
  __device__ __forceinline__ void apply(const QkvParams& q, float (&s)[T::kNS][4], const bool& partial,
                                        const int& entry, int mt, int lane) const {
    if constexpr (!kFeatures) {
      if (partial) apply_tile_mask<T::kNS>(s, block.tile(int64_t(entry) * T::kBlockK), mt, 0, lane);
      return;
    }
    const AnalyticMaskParams& a = analytic_of(static_cast<const FwdParams&>(q));
    const float c2 = a.score.softcap2;
    if (c2 != 0.0f || a2 != 0.0f) {
      // Diagonal offset of the m16 tile's element (0, 0): key entry * kBlockK, row r0 + 16 mt
      // (r0 + shift = block.lo0 - d_min).
      const SdpaScoreMod mod{c2, SdpaScoreMod::inv_softcap(c2), a2};
      mod.apply<T::kNS>(s, diag_base(int64_t(entry) * T::kBlockK, block.lo0 - a.band.d_min() + 16 * mt), lane);
    }
    if (partial) apply_tile_mask<T::kNS>(s, block.tile(int64_t(entry) * T::kBlockK), mt, 0, lane);
    // The additive bias on the visible elements (after the mask: never read where it is -inf).
    if (a.bias.bias != nullptr) {
      SdpaBiasFrag::make(a.bias, b, head, int64_t(row0) + 16 * mt, int64_t(entry) * T::kBlockK, lane).add<T::kNS>(s);
    }
  }
  // Dropout (SdpaDropoutParams) on P of m16 tile mt after the online softmax step (sdpa_dropout_forward:
  // with SdpaDropoutParams::o_scaled, Philox's 1 / (1 - p) applied to O after the walk by scale_o, as the
  // sm90 forward does).
  template <int kN>
  __device__ __forceinline__ void dropout(const QkvParams& q, float (&s)[kN][4], int entry, int mt, int lane) const {
    const AnalyticMaskParams& a = analytic_of(static_cast<const FwdParams&>(q));
    if (a.dropout.mode == 0) return;  // (before the positions, as the sm90 forward's)
    const int64_t i = int64_t(row0) + 16 * mt + (lane >> 2), j = int64_t(entry) * T::kBlockK + 2 * (lane & 3);
    sdpa_dropout_forward<kN>(a.dropout, a.dropout.o_scaled, b, head, q.num_heads_q, i, j, int64_t(row0) + block.rows,
                             block.len_kv, s);
  }
  // Philox dropout's 1 / (1 - p) on the walk's O with o_scaled (dropout above), before the epilogue.
  template <int kMT, int kNO>
  __device__ __forceinline__ static void scale_o(const FwdParams& p, float (&o)[kMT][kNO][4]) {
    if (!analytic_of(p).dropout.o_scaled) return;
#pragma unroll
    for (int i = 0; i < kMT; ++i) sdpa_dropout_scale_o<kNO>(analytic_of(p).dropout, o[i]);
  }
  // Row statistics of the thread's rows (m16 tile i: rows r0 + 16 i + g + 8 hi of the block at
  // row `first`) seeded with the head's sink (log2 units: m = sink, l = 1 on one lane of the
  // quad), so that it joins the denominator; rows past the sample keep m = -inf, l = 0 (O = 0,
  // LSE = -inf).
  template <int kMT>
  __device__ __forceinline__ static void init_stats(const FwdParams& p, int head, int first, int len_q, int lane,
                                                    float (&m)[kMT][2], float (&l)[kMT][2]) {
    const float* sink = analytic_of(p).score.sink;
    if (sink == nullptr || p.max_logit != nullptr) return;  // with max_logit: fold_sink after the walk
    const float s2 = __ldg(sink + head) * kLog2e;
#pragma unroll
    for (int i = 0; i < kMT; ++i) {
#pragma unroll
      for (int hi = 0; hi < 2; ++hi) {
        if (first + 16 * i + (lane >> 2) + 8 * hi < len_q) OnlineSoftmax::seed_row(m[i][hi], l[i][hi], s2, lane);
      }
    }
  }
  // With max_logit (the scores' maximum, sink left out) the sink joins the statistics of the same rows
  // after the walk instead (OnlineSoftmax::fold_sink_row: the sums init_stats' seed gives), so that m
  // holds the scores' maxima until then. Experimental (dispatch: sdpa_feature_pairs_enabled).
  template <int kMT, int kNO>
  __device__ __forceinline__ static void fold_sink(const FwdParams& p, int head, int first, int len_q, int lane,
                                                   float (&m)[kMT][2], float (&l)[kMT][2],
                                                   float (&o)[kMT][kNO][4]) {
    const float* sink = analytic_of(p).score.sink;
    if (sink == nullptr || p.max_logit == nullptr) return;
    const float s2 = __ldg(sink + head) * kLog2e;
#pragma unroll
    for (int i = 0; i < kMT; ++i) {
#pragma unroll
      for (int hi = 0; hi < 2; ++hi) {
        if (first + 16 * i + (lane >> 2) + 8 * hi < len_q) {
          OnlineSoftmax::fold_sink_row(o[i], hi, m[i][hi], l[i][hi], s2, lane);
        }
      }
    }
  }
};

// The FP8 forward's steps in the sm80 forward (params.h SdpaFp8FwdSm80Params; launch_sdpa_fp8_fwd_sm80.cu),
// fwd_item's F8 parameter: NoFp8FwdSm80 for every 16-bit instantiation (its code is not compiled in),
// Fp8FwdSm80 for the FP8 kernel, which runs the loop on bf16 copies of the FP8 codes (exact products, as an
// FP8 GEMM's). Its softmax folds qk_scale_log2 (the factors' product) into the exponent and shifts it by
// log2 scale_s (OnlineSoftmax::update_row's shift, the sm90 FP8 forward's form): p = fp8_q(P~ scale_s), the
// un-normalised probabilities of the running max quantized (software rounding: fp8_soft.h), which bf16
// holds exactly for the P V GEMM; l = scale_s times the row sum (of the unquantized terms). The epilogue
// (fwd_store_rows_sm80) stores O = acc o_mul / l as fp8_o(O scale_o) a code pair at a time (software
// conversion), the LSE (m - shift + log2 l) unit, score_max / score_sum_exp (l / scale_s), and gathers
// amax_s = max 1 / sum (= scale_s / l) and amax_o = max |O| per thread; flush() reduces them per warp into the
// outputs (zeroed by the launcher; non-negative: integer max). The factors, the shift and the amaxes are the
// sm90 FP8 forward's epilogue state (epilogue_fwd.cuh Fp8Out), read by each CTA from the factors.
struct NoFp8FwdSm80 {
  static constexpr bool kOn = false;
};
struct Fp8FwdSm80 {
  static constexpr bool kOn = true;
  Fp8Out out;           // O's factors, scale_s's shift, the amaxes (the sm90 FP8 forward's epilogue state)
  float qk_scale_log2;  // attn_scale descale_q descale_k log2 e: the codes' scores to log2-unit logits
  bool e5m2;            // P's format (q's): E5M2, else E4M3

  __device__ __forceinline__ static Fp8FwdSm80 make(const SdpaFp8FwdParams& p) {
    const SdpaFp8Params& f = p.fp8;  // (attn_scale is its kFp8AttnScale: a device tensor too)
    return Fp8FwdSm80{Fp8Out::make(f),
                      fp8_factor(f, kFp8AttnScale) * fp8_factor(f, kFp8DescaleQ) * fp8_factor(f, kFp8DescaleK) * kLog2e,
                      f.format == 2};
  }
  __device__ __forceinline__ void flush(const SdpaFp8Params& f, int lane) const { out.flush(f, lane); }
};

// Softmax with rescale: scores to log2 units, the mask, then the online softmax step (s
// becomes P; m, l updated; the output accumulator rescaled). Then P as 16-bit A fragments of
// the P V GEMM (k-step kk = key columns 16kk..16kk+15): half the registers of the fp32
// scores, which are dead from here on. The plan's mask with a positive scale leaves the scores
// unscaled and the softmax folds the scale into its exponent (one FFMA a score: Variant::logits);
// the analytic mask's score modifiers need the scaled scores.
template <class T, class E, class Mask, class F8 = NoFp8FwdSm80>
__device__ __forceinline__ void fwd_softmax_sm80(const Mask& mask, float (&s)[T::kMT][T::kNS][4], float (&m)[T::kMT][2],
                                                 float (&l)[T::kMT][2], float (&acc_o)[T::kMT][T::kNO][4],
                                                 uint32_t (&pa)[T::kMT][T::kBlockK / 16][4], const QkvParams& p,
                                                 const bool& partial, const int& entry, int warp, int lane,
                                                 [[maybe_unused]] const F8* f8 = nullptr) {
  constexpr int kMT = T::kMT;
  if constexpr (F8::kOn) {
    // FP8 (Fp8FwdSm80): the mask, the update with the factors' scale (folded into the exponent when positive,
    // as the 16-bit loop's; else applied to the scores first) and scale_s's shift, then P quantized to q's
    // format (exact in E's bf16 for the P V GEMM).
    static_assert(!Mask::kFeatures, "the FP8 forward runs the mask-only loop");
    const float sc = f8->qk_scale_log2;
    const bool fold = sc > 0.0f;
#pragma unroll
    for (int i = 0; i < kMT; ++i) {
      if (!fold) {
#pragma unroll
        for (int n = 0; n < T::kNS; ++n) {
#pragma unroll
          for (int e = 0; e < 4; ++e) s[i][n][e] *= sc;
        }
      }
      mask.apply(p, s[i], partial, entry, warp * kMT + i, lane);
#pragma unroll
      for (int hi = 0; hi < 2; ++hi) {
        const float corr = OnlineSoftmax::update_row(s[i], hi, m[i][hi], l[i][hi], fold ? sc : 1.0f, f8->out.shift);
        OnlineSoftmax::rescale_row(acc_o[i], hi, corr);
      }
#pragma unroll
      for (int n = 0; n < T::kNS; ++n) {
#pragma unroll
        for (int e = 0; e < 4; ++e) s[i][n][e] = fp8_soft_round(s[i][n][e], f8->e5m2);
      }
      pack_p<E>(s[i], pa[i]);
    }
  } else {
#pragma unroll
    for (int i = 0; i < kMT; ++i) {
      const bool fold = !Mask::kFeatures && p.scale_log2 > 0.0f;
      if (!fold) {
#pragma unroll
        for (int n = 0; n < T::kNS; ++n) {
#pragma unroll
          for (int e = 0; e < 4; ++e) s[i][n][e] *= p.scale_log2;
        }
      }
      mask.apply(p, s[i], partial, entry, warp * kMT + i, lane);
      online_softmax_step<T::kNS, T::kNO>(s[i], m[i], l[i], acc_o[i], fold ? p.scale_log2 : 1.0f);
      if constexpr (Mask::kFeatures) mask.template dropout<T::kNS>(p, s[i], entry, warp * kMT + i, lane);
    }
#pragma unroll
    for (int i = 0; i < kMT; ++i) pack_p<E>(s[i], pa[i]);
  }
}

// Where the rows of a work item go: row r of the block is position (row0 + r) / pack of
// query head head0 + (row0 + r) % pack of sample b (task head h; head0 = h * pack).
// rows_valid: the rows the epilogue writes. lse_index: the LSE element of an unpacked row
// (fwd_store_rows_sm80).
struct FwdRowsSm80 {
  static constexpr bool kAnalytic = false;
  int b, h, pack, q_start, row0, rows_valid;
  int m0;  // first row of the warp; m16 tile i starts at m0 + 16 i
  int g, t;

  // Element of row row0 + row of head h of the LSE.
  __device__ __forceinline__ int64_t lse_index(const FwdParams& p, int row) const {
    return int64_t(b) * p.lsea.batch_stride + int64_t(h) * p.lsea.head_stride +
           (int64_t(p.varlen ? q_start : 0) + row0 + row) * p.lsea.row_stride;
  }
};

// The same rows of an SDPA call (analytic mask): O and the stats start at their own
// per-sample offsets (AnalyticMaskParams::start), and the stats may be in base 2.
// The epilogue options (SdpaEpilogueParams) read their own starts through sample b
// (sdpa_fwd_row_epilogue).
struct FwdRowsAnalyticSm80 : FwdRowsSm80 {
  static constexpr bool kAnalytic = true;
  int64_t o_start, lse_start;

  __device__ __forceinline__ int64_t lse_index(const FwdParams& p, int row) const {
    return lse_start + int64_t(h) * p.lsea.head_stride + int64_t(row0 + row) * p.lsea.row_stride;
  }
};

// SDPA's forward epilogue options on one row (lsum: the quad's sum, m: the row max in log2
// units): sdpa_score_mod.cuh's sdpa_fwd_row_options at the row's sample position.
template <class E>
__device__ __forceinline__ const typename E::Storage* sdpa_fwd_row_epilogue(const FwdParams& p,
                                                                             const FwdRowsAnalyticSm80& rw, int row,
                                                                             float m, float lsum) {
  return sdpa_fwd_row_options<E>(p, rw.b, rw.h, rw.row0, row, m, lsum, rw.t == 0);
}

// Epilogue of a whole task, unpacked rows (pack = 1): O normalised (0 for empty rows), LSE
// (natural log, -inf for empty rows). The one-CTA-per-task kernel has two copies of this loop
// (unpacked, packed): one loop with the run-time row mapping cost it 100+ bytes of spills at
// D = 128 (ptxas -v). The persistent kernel is the other way round (the two copies put
// spills in its main loop, one does not), so it runs the packed copy, which with pack = 1 is
// the unpacked mapping.
// The FP8 forward's rows (Fp8FwdSm80; fwd_store_rows_sm80 with F8 = Fp8FwdSm80): O in o's FP8 format (element =
// byte strides), a code pair per store; the LSE, statistics outputs and amaxes as Fp8FwdSm80 says.
template <class T, class E, class Rows>
__device__ __forceinline__ void fwd_store_rows_fp8_sm80(const FwdParams& p, Rows rw,
                                                        const float (&acc_o)[T::kMT][T::kNO][4],
                                                        const float (&m)[T::kMT][2], const float (&l)[T::kMT][2],
                                                        Fp8FwdSm80* f8) {
  static_assert(Rows::kAnalytic, "the FP8 forward is SDPA's");
  Fp8Out& q8 = f8->out;
  uint8_t* o8 = static_cast<uint8_t*>(p.o) + rw.o_start + int64_t(rw.row0) * p.oa.row_stride +
                int64_t(rw.h) * p.oa.head_stride;
#pragma unroll
  for (int i = 0; i < T::kMT; ++i) {
#pragma unroll
    for (int hi = 0; hi < 2; ++hi) {
      const float lsum = quad_sum(l[i][hi]);
      const float inv = lsum > 0.0f ? 1.0f / lsum : 0.0f;
      const int row = rw.m0 + 16 * i + rw.g + 8 * hi;
      if (row < rw.rows_valid) {
        if (lsum > 0.0f) q8.amax_s = fmaxf(q8.amax_s, q8.s_mul * inv);
        // score_max / score_sum_exp (l without scale_s); FP8 calls have no gate.
        sdpa_fwd_row_epilogue<E>(p, rw, row, m[i][hi], lsum / q8.s_mul);
        const float oi = inv * q8.o_mul;
        uint8_t* orow = o8 + int64_t(row) * p.oa.row_stride;
#pragma unroll
        for (int n = 0; n < T::kNO; ++n) {
          const int col = n * 8 + 2 * rw.t;
          if (col < p.head_dv) {
            const float x0 = acc_o[i][n][2 * hi] * oi, x1 = acc_o[i][n][2 * hi + 1] * oi;
            q8.amax_o = fmaxf(q8.amax_o, fmaxf(fabsf(x0), fabsf(x1)));
            *reinterpret_cast<uint16_t*>(orow + col) =
                uint16_t(fp8_soft_encode(x0 * q8.scale_o, q8.o_e5m2) |
                         (fp8_soft_encode(x1 * q8.scale_o, q8.o_e5m2) << 8));
          }
        }
        if (p.lse != nullptr && rw.t == 0) {
          p.lse[rw.lse_index(p, row)] = lse_from_stats(m[i][hi] - q8.shift, lsum, analytic_of(p).lse_unit);
        }
      }
    }
  }
}

template <class T, class E, class Rows, class F8 = NoFp8FwdSm80>
__device__ __forceinline__ void fwd_store_rows_sm80(const FwdParams& p, Rows rw,
                                                    const float (&acc_o)[T::kMT][T::kNO][4],
                                                    const float (&m)[T::kMT][2], const float (&l)[T::kMT][2],
                                                    [[maybe_unused]] F8* f8 = nullptr) {
  using Elem = typename E::Storage;
  if constexpr (F8::kOn) {
    fwd_store_rows_fp8_sm80<T, E, Rows>(p, rw, acc_o, m, l, f8);
  } else {
    Elem* o;  // row row0 of head h (a member function computing it changed the plan kernels' SASS)
    if constexpr (Rows::kAnalytic) {
      o = static_cast<Elem*>(p.o) + rw.o_start + int64_t(rw.row0) * p.oa.row_stride + int64_t(rw.h) * p.oa.head_stride;
    } else {
      o = static_cast<Elem*>(p.o) + int64_t(rw.b) * p.oa.batch_stride +
          (int64_t(p.varlen ? rw.q_start : 0) + rw.row0) * p.oa.row_stride + int64_t(rw.h) * p.oa.head_stride;
    }
#pragma unroll
    for (int i = 0; i < T::kMT; ++i) {
#pragma unroll
      for (int hi = 0; hi < 2; ++hi) {
        const float lsum = quad_sum(l[i][hi]);
        const float inv = lsum > 0.0f ? 1.0f / lsum : 0.0f;
        const int row = rw.m0 + 16 * i + rw.g + 8 * hi;
        if (row < rw.rows_valid) {
          Elem* orow = o + int64_t(row) * p.oa.row_stride;
          if constexpr (Rows::kAnalytic) {
            const Elem* grow = sdpa_fwd_row_epilogue<E>(p, rw, row, m[i][hi], lsum);
#pragma unroll
            for (int n = 0; n < T::kNO; ++n) {
              const int col = n * 8 + 2 * rw.t;
              if (col < p.head_dv) {
                float x0 = acc_o[i][n][2 * hi] * inv, x1 = acc_o[i][n][2 * hi + 1] * inv;
                if (grow != nullptr) sdpa_gate_pair<E>(grow, col, x0, x1);
                *reinterpret_cast<uint32_t*>(orow + col) = pack2<E>(x0, x1);
              }
            }
          } else {
#pragma unroll
            for (int n = 0; n < T::kNO; ++n) {
              const int col = n * 8 + 2 * rw.t;
              if (col < p.head_dv) {
                *reinterpret_cast<uint32_t*>(orow + col) =
                    pack2<E>(acc_o[i][n][2 * hi] * inv, acc_o[i][n][2 * hi + 1] * inv);
              }
            }
          }
          if (p.lse != nullptr && rw.t == 0) {
            // (m + log2 l) in natural-log units, or base 2 (SDPA's stats_use_log2: lse_unit 1).
            const float unit = Rows::kAnalytic ? analytic_of(p).lse_unit : kLn2;
            const float lse = lse_from_stats(m[i][hi], lsum, unit);
            p.lse[rw.lse_index(p, row)] = lse;
          }
        }
      }
    }
  }
}

// The same for packed rows (any pack >= 1): row `row` is position pos of query head
// h * pack + sub. The base `o` is written with the same terms as above (position row0,
// which may lie past the sample: only o + (pos - row0) rows are dereferenced), which keeps
// ptxas from holding extra values across the main loop.
template <class T, class E>
__device__ __forceinline__ void fwd_store_packed_rows_sm80(const FwdParams& p, FwdRowsSm80 rw,
                                                           const float (&acc_o)[T::kMT][T::kNO][4],
                                                           const float (&m)[T::kMT][2], const float (&l)[T::kMT][2]) {
  using Elem = typename E::Storage;
  const int pack = rw.pack, row0 = rw.row0;
  Elem* o = static_cast<Elem*>(p.o) + int64_t(rw.b) * p.oa.batch_stride +
            (int64_t(p.varlen ? rw.q_start : 0) + row0) * p.oa.row_stride + int64_t(rw.h) * pack * p.oa.head_stride;
#pragma unroll
  for (int i = 0; i < T::kMT; ++i) {
#pragma unroll
    for (int hi = 0; hi < 2; ++hi) {
      const float lsum = quad_sum(l[i][hi]);
      const float inv = lsum > 0.0f ? 1.0f / lsum : 0.0f;
      const int row = rw.m0 + 16 * i + rw.g + 8 * hi;
      if (row < rw.rows_valid) {
        // Packed row row0 + row = pos * pack + sub.
        const int pos = (row0 + row) / pack, sub = row0 + row - pos * pack;
        Elem* orow = o + int64_t(pos - row0) * p.oa.row_stride + int64_t(sub) * p.oa.head_stride;
#pragma unroll
        for (int n = 0; n < T::kNO; ++n) {
          const int col = n * 8 + 2 * rw.t;
          if (col < p.head_dv) {
            *reinterpret_cast<uint32_t*>(orow + col) =
                pack2<E>(acc_o[i][n][2 * hi] * inv, acc_o[i][n][2 * hi + 1] * inv);
          }
        }
        if (p.lse != nullptr && rw.t == 0) {
          const float lse = lse_from_stats(m[i][hi], lsum);
          p.lse[int64_t(rw.b) * p.lsea.batch_stride + int64_t(rw.h * pack + sub) * p.lsea.head_stride +
                (int64_t(p.varlen ? rw.q_start : 0) + pos) * p.lsea.row_stride] = lse;
        }
      }
    }
  }
}

// max_logit: max over visible scores of scale * q.k, reduced into p.max_logit with the float
// atomic. The running max is in log2 units. Rows past rows_valid never see a key (m = -inf),
// so they need no masking here. `red`: kBlockQ floats of shared memory.
template <class T>
__device__ __forceinline__ void fwd_max_logit_sm80(const FwdParams& p, float* red, FwdRowsSm80 rw,
                                                   const float (&m)[T::kMT][2], int head0, int warp, int lane,
                                                   int tid) {
  if (rw.pack == 1) {
    // One head: warp shuffles, then one atomic per CTA.
    float mx = -INFINITY;
#pragma unroll
    for (int i = 0; i < T::kMT; ++i) mx = fmaxf(mx, fmaxf(m[i][0], m[i][1]));
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
    if (lane == 0) red[warp] = mx;
    __syncthreads();
    if (tid == 0) {
      float v = red[0];
#pragma unroll
      for (int w = 1; w < T::kWarps; ++w) v = fmaxf(v, red[w]);
      if (v != -INFINITY) atomic_max_float(p.max_logit + rw.h, v * kLn2);
    }
  } else {
    // Packed rows: row r belongs to query head head0 + (row0 + r) % pack. Per-row maxima
    // (quad-uniform after the softmax's quad_max) go to shared memory; thread j < pack
    // reduces rows j, j + pack, ... (one head) and issues one atomic per head.
    if (rw.t == 0) {
#pragma unroll
      for (int i = 0; i < T::kMT; ++i) {
        red[rw.m0 + 16 * i + rw.g] = m[i][0];
        red[rw.m0 + 16 * i + rw.g + 8] = m[i][1];
      }
    }
    __syncthreads();
    const int heads = min(rw.pack, rw.rows_valid);
    for (int j = tid; j < heads; j += T::kThreads) {
      float v = -INFINITY;
      for (int r = j; r < rw.rows_valid; r += rw.pack) v = fmaxf(v, red[r]);
      if (v != -INFINITY) atomic_max_float(p.max_logit + head0 + (rw.row0 + j) % rw.pack, v * kLn2);
    }
  }
}

// One work item: key blocks [begin, begin + count) of the Q2K walk (BlockCursor order) of query block qb
// of task head h (the query head; the kv head when packed) of sample b. kPersistent = false:
// the whole walk, slot -1 (begin, count and s_item unused). kPersistent = true: the slot is
// read at the end from s_item[3] (kept out of registers during the walk). Slot -1 (an
// unsplit task) writes O normalised, LSE and zeros for empty rows as always; slot >= 0 (a
// piece of a split task) writes its unnormalised fp32 accumulator, running max and sum to
// workspace slot `slot` (FwdSplit) for the combine kernel. max_logit is reduced with the
// atomic in both cases.
// Shared memory: the item's first loads (Q, K[first]) are issued before the loop's first
// __syncthreads, so the caller must __syncthreads between two items of one CTA.
// Composition of the roles above: SeqlenInfo, the Q2K cursor walk, FwdKvLoaderSm80, the
// mainloop (the Q K^T and P V GEMMs inline, PlanPayloadMaskSm80 + fwd_softmax_sm80 between
// them), one epilogue (fwd_store_*_sm80; a piece of a split task: the shared
// FwdEpilogue::store_split_partial) and fwd_max_logit_sm80. The GEMMs and the block walk stay
// inline: as functions they changed the kernels' SASS (ptxas allocates the near-255-register
// loop differently), which scripts/sass_diff.sh rejects.
template <class T, class E, bool kMaxLogit, bool kPersistent, class Mask = PlanPayloadMaskSm80<T>,
          class KvAddr = ContiguousKv, class F8 = NoFp8FwdSm80>
__device__ __forceinline__ void fwd_item(const FwdParams& p, uint32_t sQ, const int32_t* s_item, int qb, int h,
                                         int b, int begin, int count, [[maybe_unused]] F8* f8 = nullptr) {
  using Elem = typename E::Storage;
  static_assert(E::kBits == 16, "the sm80 loaders and ldmatrix move 16-bit elements");
  constexpr int kMT = T::kMT;
  const uint32_t sK = sQ + T::kSmemQ;
  const uint32_t sV = sK + T::kSmemK;
  // Persistent kernel: the thread index through an opaque move keeps ptxas from hoisting
  // the lane-derived fragment addresses out of the item loop and holding them across it
  // (measured at D = 128: up to 290 bytes of spills without it, none with it).
  int tid = threadIdx.x;
  if constexpr (kPersistent) asm volatile("mov.u32 %0, %%tid.x;" : "=r"(tid));
  const int lane = tid & 31, warp = tid >> 5;

  // Row r of the block: position (row0 + r) / pack of query head head0 + (row0 + r) % pack.
  const int pack = p.pack;
  const int head0 = h * pack;
  const int hkv = head0 / p.group_size;
  // CSR mask head: the query head unpacked; packed, the kv head's virtual mask head (Hmask = Hq)
  // or 0 -- both are `h`.
  const int hm = p.mask_per_head ? h : 0;
  const typename Mask::Seqlen sl(p, b);
  const int q_start = sl.q_start, len_q = sl.len_q, k_start = sl.k_start, len_k = sl.len_k;
  const int row0 = qb * T::kBlockQ;
  const int rows_valid = min(T::kBlockQ, len_q * pack - row0);
  const int rows_store = Mask::rows_store(p, row0, rows_valid);
  if (Mask::kAnalytic && rows_store <= 0) return;  // a ragged output's block past the sample

  auto cur = Mask::q2k(p, sl, hm, b, qb);

  // Position 0 of head head0 in sample b.
  const Elem* q = Mask::template sample_ptr<Elem>(p, p.q, p.qa, kSdpaQ, b, q_start) + int64_t(head0) * p.qa.head_stride;
  const Elem* k = Mask::template sample_ptr<Elem>(p, p.k, p.ka, kSdpaK, b, k_start) + int64_t(hkv) * p.ka.head_stride;
  const int hv = v_head<Mask::kFeatures || F8::kOn>(p, head0, hkv);  // V's head: K's, but for SDPA with H_k != H_v
  const Elem* v = Mask::template sample_ptr<Elem>(p, p.v, p.va, kSdpaV, b, k_start) + int64_t(hv) * p.va.head_stride;
  const Mask mask = Mask::item(p, sl, row0, head0);

  // Persistent items walk blocks [begin, begin + count) of the row: skip `begin`, then stop
  // after `count` blocks (`left` counts the blocks still to fetch after the current one).
  [[maybe_unused]] int left = count - 1;
  if (kPersistent && begin > 0) cur.skip(begin);
  int kb = 0, entry = 0;
  bool partial = false;
  bool have = (!kPersistent || count > 0) && cur.next(kb, partial, entry);
  load_q_tile_async<T::kBlockQ, T::kDqk, T::kThreads>(sQ, q, p.qa.row_stride, p.qa.head_stride, row0, pack,
                                                      rows_valid, p.head_dqk, tid);
  FwdKvLoaderSm80<T, KvAddr> kv;
  kv.init(p, b, tid);
  if (have) kv.load_k(p, sK, k, kb, len_k, tid);
  cp_async_commit();

  float acc_o[kMT][T::kNO][4];
  float m[kMT][2], l[kMT][2];
#pragma unroll
  for (int i = 0; i < kMT; ++i) {
#pragma unroll
    for (int n = 0; n < T::kNO; ++n) acc_o[i][n][0] = acc_o[i][n][1] = acc_o[i][n][2] = acc_o[i][n][3] = 0.0f;
    m[i][0] = m[i][1] = -INFINITY;
    l[i][0] = l[i][1] = 0.0f;
  }
  const int m0 = warp * 16 * kMT;  // first row of the warp; m16 tile i starts at m0 + 16 i
  if constexpr (Mask::kFeatures) Mask::init_stats(p, head0, row0 + m0, len_q, lane, m, l);
  const LdsmAddr<T::kDqk> aQ = ldsm_a<T::kDqk>(sQ + m0 * T::kDqk * 2, lane);
  const LdsmAddr<T::kDqk> bK = ldsm_b_nk<T::kDqk>(sK, lane);
  const LdsmAddr<T::kDv> bV = ldsm_b_kn<T::kDv>(sV, lane);

  while (have) {
    cp_async_wait<0>();
    __syncthreads();  // K[kb] visible to all; every warp is done with V of the previous block
    kv.load_v(p, sV, v, kb, len_k, tid);
    cp_async_commit();

    float s[kMT][T::kNS][4];
#pragma unroll
    for (int i = 0; i < kMT; ++i) {
#pragma unroll
      for (int n = 0; n < T::kNS; ++n) s[i][n][0] = s[i][n][1] = s[i][n][2] = s[i][n][3] = 0.0f;
    }
#pragma unroll
    for (int kk = 0; kk < T::kDqk / 16; ++kk) {
      if (T::kExact || kk * 16 < p.head_dqk) {
        uint32_t a[kMT][4];
#pragma unroll
        for (int i = 0; i < kMT; ++i) ldmatrix_x4(a[i], aQ.at(kk, 16 * i));
#pragma unroll
        for (int n = 0; n < T::kNS; n += 2) {
          uint32_t bb[4];
          ldmatrix_x4(bb, bK.at(kk, n * 8));
#pragma unroll
          for (int i = 0; i < kMT; ++i) {
            mma_16816<E>(s[i][n], a[i], bb[0], bb[1]);
            mma_16816<E>(s[i][n + 1], a[i], bb[2], bb[3]);
          }
        }
      }
    }
    uint32_t pa[kMT][T::kBlockK / 16][4];
    fwd_softmax_sm80<T, E, Mask, F8>(mask, s, m, l, acc_o, pa, p, partial, entry, warp, lane, f8);

    int kb_next = 0, entry_next = 0;
    bool partial_next = false;
    bool have_next;
    if constexpr (kPersistent) {
      have_next = left > 0 && cur.next(kb_next, partial_next, entry_next);
      --left;
    } else {
      have_next = cur.next(kb_next, partial_next, entry_next);
    }
    cp_async_wait<0>();
    __syncthreads();  // V[kb] visible; every warp is done with K[kb]
    if (have_next) kv.load_k(p, sK, k, kb_next, len_k, tid);
    cp_async_commit();

#pragma unroll
    for (int kk = 0; kk < T::kBlockK / 16; ++kk) {
#pragma unroll
      for (int n = 0; n < T::kNO; n += 2) {
        if (T::kExact || n * 8 < p.head_dv) {
          uint32_t bb[4];
          ldmatrix_x4_trans(bb, bV.at(n / 2, kk * 16));
#pragma unroll
          for (int i = 0; i < kMT; ++i) {
            mma_16816<E>(acc_o[i][n], pa[i][kk], bb[0], bb[1]);
            mma_16816<E>(acc_o[i][n + 1], pa[i][kk], bb[2], bb[3]);
          }
        }
      }
    }
    kb = kb_next;
    partial = partial_next;
    entry = entry_next;
    have = have_next;
  }
  cp_async_wait<0>();

  const int g = lane >> 2, t = lane & 3;
  const FwdRowsSm80 rw{b, h, pack, q_start, row0, rows_store, m0, g, t};
  const int slot = kPersistent ? s_item[3] : -1;
  if constexpr (Mask::kAnalytic) {
    const FwdRowsAnalyticSm80 rwa{rw, sample_start(analytic_of(p).start[kSdpaO], b),
                                  sample_start(analytic_of(p).start[kSdpaStats], b)};
    if constexpr (Mask::kFeatures) {
      // SDPA's sink folded into a copy of the statistics (Mask::fold_sink, with max_logit): m keeps the
      // scores' row maxima for the max_logit reduction below.
      float mf[kMT][2], lf[kMT][2];
#pragma unroll
      for (int i = 0; i < kMT; ++i) {
#pragma unroll
        for (int hi = 0; hi < 2; ++hi) mf[i][hi] = m[i][hi], lf[i][hi] = l[i][hi];
      }
      Mask::scale_o(p, acc_o);  // Philox dropout's 1 / (1 - p)
      Mask::fold_sink(p, head0, row0 + m0, len_q, lane, mf, lf, acc_o);
      fwd_store_rows_sm80<T, E>(p, rwa, acc_o, mf, lf);
    } else {
      fwd_store_rows_sm80<T, E, FwdRowsAnalyticSm80, F8>(p, rwa, acc_o, m, l, f8);
    }
  } else if (slot >= 0) {
    // A piece of a split task: the shared forward epilogue (epilogue_fwd.cuh), m16 tile by tile.
    const AccFragment f(lane);
#pragma unroll
    for (int i = 0; i < kMT; ++i) {
      const OnlineSoftmax sm{{m[i][0], m[i][1]}, {l[i][0], l[i][1]}};
      FwdEpilogue<E, T::kBlockQ, T::kDv>::store_split_partial(p, slot, rows_store, m0 + 16 * i, f, acc_o[i], sm);
    }
  } else if (!kPersistent && pack == 1) {
    fwd_store_rows_sm80<T, E>(p, rw, acc_o, m, l);
  } else {
    fwd_store_packed_rows_sm80<T, E>(p, rw, acc_o, m, l);
  }
  if constexpr (kMaxLogit) {
    // One-warp tiles and the analytic kernels test the pointer here (kMaxLogitAtRunTime;
    // uniform over the CTA, so no barrier of the reduction is skipped by part of it).
    if ((T::kMaxLogitAtRunTime || Mask::kAnalytic) && p.max_logit == nullptr) return;
    __shared__ float red[T::kBlockQ];
    fwd_max_logit_sm80<T>(p, red, rw, m, head0, warp, lane, tid);
  }
}

// Forward kernel, one CTA per task (or per (query block, task head) cell in grid mode): the
// whole Q2K walk, direct writes. With a split schedule (p.split_schedule) it runs only when the
// schedule split no task (hdr[kNumSplit] = 0, decided on the device by the scan kernel);
// otherwise the persistent kernel below does the work and these CTAs exit at once. Two
// kernels rather than one: the persistent item loop costs registers (ptxas holds values
// across it), which the common unsplit case (e.g. causal masks) should not pay.
template <class T, class E, bool kMaxLogit>
__global__ void __launch_bounds__(T::kThreads, T::kMinBlocks) flex_fwd_kernel_sm80(const FwdParams p) {
  extern __shared__ __align__(128) uint8_t smem[];
  if (p.split_schedule && p.split.hdr[SplitSchedule::kNumSplit] > 0) return;
  int qb, h, b;
  if (p.grid_mode) {
    // Folded grid (grid.h): CTA = task head * NQB + global query block.
    const GridCell cell = unfold_2d(blockIdx.x, int(p.view.num_q_blocks));
    const int gq = cell.x;
    h = cell.y;
    b = find_block_owner(p.view.q_block_start, p.batch, gq);
    qb = gq - __ldg(p.view.q_block_start + b);
  } else {
    const Task task = load_task(p.view.tasks, blockIdx.x);
    qb = task.block;
    h = task.head;
    b = task.batch;
  }
  fwd_item<T, E, kMaxLogit, false>(p, smem_u32(smem), nullptr, qb, h, b, 0, 0x7fffffff);
}

// Forward kernel of SDPA (analytic mask): one CTA per (query block, query head) of every
// sample, padded to S_q rows, in the sm90 SDPA forward's cell order (tile_scheduler.cuh
// AnalyticGrid: the last query block first, heads fastest; under a causal band the
// longest walks start first, as the flex route's cost-ordered task list). Blocks past a
// sample's length write the padded rows of padded outputs (O 0, LSE -inf) or exit (ragged
// outputs). max_logit is tested at run time (one instantiation for both cases). kFeatures:
// AnalyticMaskSm80's (the launcher picks it per call: sdpa_fwd_has_features).
template <class T, class E, bool kFeatures>
__global__ void __launch_bounds__(T::kThreads, T::kMinBlocks) sdpa_fwd_kernel_sm80(const SdpaFwdParams p) {
  extern __shared__ __align__(128) uint8_t smem[];
  const WorkItem w = AnalyticGrid{p.analytic.num_q_blocks, p.num_heads_q, p.batch}.next(0);  // cell blockIdx.x
  fwd_item<T, E, true, false, AnalyticMaskSm80<T, kFeatures>>(p, smem_u32(smem), nullptr, w.block, w.head, w.batch,
                                                              0, 0x7fffffff);
}

// Paged forward kernel of SDPA (PagedKv, params.h SdpaPagedFwdParams): sdpa_fwd_kernel_sm80 with
// K and V gathered through their page tables; prefill and decode (S_q = 1: one row of a
// 128-row tile; the packed decode tile and split-KV are not used here yet).
template <class T, class E>
__global__ void __launch_bounds__(T::kThreads, T::kMinBlocks) sdpa_fwd_paged_kernel_sm80(const SdpaPagedFwdParams p) {
  extern __shared__ __align__(128) uint8_t smem[];
  const int nqb = p.analytic.num_q_blocks;
  const GridCell cell = unfold_2d(blockIdx.x, nqb * p.batch);
  const int b = cell.x / nqb;
  fwd_item<T, E, true, false, AnalyticMaskSm80<T>, PagedKv>(p, smem_u32(smem), nullptr, cell.x - b * nqb, cell.y,
                                                            b, 0, 0x7fffffff);
}

// Persistent forward kernel of the split schedule (task mode, p.split_schedule = 1): each CTA
// claims items in list order with an atomic counter until the list is exhausted (items of
// long tasks come first). Exits at once when the schedule split no task.
template <class T, class E, bool kMaxLogit>
__global__ void __launch_bounds__(T::kThreads, T::kMinBlocks) flex_fwd_persistent_kernel_sm80(const FwdParams p) {
  extern __shared__ __align__(128) uint8_t smem[];
  __shared__ int32_t s_item[4];  // {task, begin, end, slot} of the current item
  if (p.split.hdr[SplitSchedule::kNumSplit] == 0) return;
  const uint32_t sQ = smem_u32(smem);
  for (;;) {
    const int task_index = claim_split_item(p.split, s_item);  // also frees the tiles and red
    if (task_index < 0) return;
    const int begin = s_item[1], count = s_item[2] - begin;
    const Task task = load_task(p.view.tasks, task_index);
    fwd_item<T, E, kMaxLogit, true>(p, sQ, s_item, task.block, task.head, task.batch, begin, count);
  }
}

// ---------------------------------------------------------------------------------------
// The forward instantiations of a tile (host): fn(FwdTraitsSm80<...>{}) for the tile the
// launcher runs and the call's head dims, so the plan and the SDPA launchers instantiate the
// same table. Head dims equal to the tile's run the branch-free (exact) variant; (192, 128)
// and (256, 256) always do. kDecode: include the 16 x 64 decode tile (plan launches only).

template <int kBQ, int kD1, int kD2, int kMT, int kMinBlocks, bool kAlwaysExact, class Fn>
void with_fwd_tile_traits_sm80(int dqk, int dv, Fn&& fn) {
  if constexpr (kAlwaysExact) {
    fn(FwdTraitsSm80<kBQ, 64, kD1, kD2, kMT, kMinBlocks, true>{});
  } else if (dqk == kD1 && dv == kD2) {
    fn(FwdTraitsSm80<kBQ, 64, kD1, kD2, kMT, kMinBlocks, true>{});
  } else {
    fn(FwdTraitsSm80<kBQ, 64, kD1, kD2, kMT, kMinBlocks, false>{});
  }
}

template <bool kDecode, class Fn>
void with_fwd_traits_sm80(const sm80::TileSm80& tile, int dqk, int dv, Fn&& fn) {
  if constexpr (kDecode) {
    if (tile.fwd_bq == kDecodeBlockQ) {
      // Decode tile (fwd_tile_for_plan_sm80: head dims <= 128 on the 128 head-dim tile): one
      // warp of 16 rows, 36 KB of shared memory, so 6 CTAs per H200 SM (4 on an A100) keep
      // enough K/V loads in flight; at 32 threads registers never limit occupancy (the
      // minimum-blocks hint only documents it).
      static_assert(kDecodeBlockQ == 16, "the decode tile is one warp of one m16 tile");
      with_fwd_tile_traits_sm80<kDecodeBlockQ, 128, 128, 1, 4, false>(dqk, dv, fn);
      return;
    }
  }
  // Tiles: 128x64 with 4 warps of 32 rows (2 CTAs per SM) up to D = 128 and for (192, 128);
  // 64x64 with 4 warps of 16 rows for (256, 256), whose output accumulator alone takes 128
  // registers a thread.
  if (tile.dqk_tile == 64) {
    with_fwd_tile_traits_sm80<128, 64, 64, 2, 2, false>(dqk, dv, fn);
  } else if (tile.dqk_tile == 128) {
    // Measured on an H200 (BF16, D=128, S=8K/32K): 4 warps x 32 rows at 2 CTAs/SM reached
    // 348 TFLOP/s, 8 warps x 16 rows at 1 CTA/SM 244 (twice the K/V fragment traffic).
    with_fwd_tile_traits_sm80<128, 128, 128, 2, 2, false>(dqk, dv, fn);
  } else if (tile.dqk_tile == 192) {
    with_fwd_tile_traits_sm80<128, 192, 128, 2, 1, true>(dqk, dv, fn);
  } else {
    with_fwd_tile_traits_sm80<64, 256, 256, 1, 1, true>(dqk, dv, fn);
  }
}

}  // namespace flashspan::kern
