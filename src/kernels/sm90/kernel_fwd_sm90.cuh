// Flex attention forward kernel for sm_90a (Hopper): TMA + wgmma + warp specialization.
//
// Algorithm: FlashAttention-2/3 forward (online softmax) over the plan's block-sparse Q2K
// lists, for plans whose consumer is consumer_for(90, dqk, dv): the forward tile of
// tile_sm90.h (128 query rows x kBlockK keys per block: 128, or 64 for (256, 256)), kernel head
// dims (kDqk, kDv) in {(64, 64), (128, 128), (192, 128), (256, 256)}; a call's smaller dims
// (multiples of 8, fwd_runs_head_dims_sm90) run on the next larger kernel: the tensor maps'
// inner extent is the true head dim, so TMA fills the columns past it with zeros (Q K^T
// unchanged, O's extra columns 0 and not stored). fp16 / bf16.
//
// Packed GQA (p.pack = G > 1, G a power of two dividing 128: fwd_runs_pack_sm90, tile_sm90.h):
// a run-time row mapping, no instantiation. Task heads are kv heads; block row r is packed row
// row0 + r = position (row0 + r) / G of query head hkv G + r % G (row0 a multiple of 128, so of
// G). Only three places know: the producer's Q box (one TMA box {64, G heads, 128 / G
// positions} over Q's packed tensor map, which writes the 128 rows in packed order with the
// unpacked tile's 128-byte rows and swizzle, so the descriptors and the consumers' loop are
// unchanged), the K / V head (the task head itself), and the epilogue's row -> (position, head)
// mapping and per-head max_logit (FwdEpilogue, FwdRows::pack_shift). The payload and the split
// workspace are per packed row already (the plan's packed view; fwd_split.cuh's combine maps
// the rows as the epilogue does).
//
// CTA = 3 warpgroups (384 threads), persistent (one CTA per SM, 1 per SM by shared memory):
//   WG0, the producer: after setmaxnreg.dec only thread 0 works. It takes the CTA's work items
//     from the TileScheduler (tile_scheduler.cuh: the split schedule's item list through the
//     atomic counter when p.split_schedule is set, otherwise tasks / grid cells blockIdx.x,
//     blockIdx.x + gridDim.x, ...), hands each item to the consumers through a 2-entry shared
//     ring, and issues the bulk tensor copies (TMA) of the item's Q tile and of K, V of every
//     key block of its walk into a kStages ring.
//   WG1, WG2, the consumers (setmaxnreg.inc): warpgroup c owns query rows 64c .. 64c+63. Per
//     key block: S = Q K^T (wgmma SS, m64n{kBlockK}k16), the scores -> logits step (kern::Variant,
//     variant.cuh: scale; a partial block masked by its payload words, PlanPayloadMask), the
//     online softmax in registers (kern::OnlineSoftmax, softmax.cuh), P converted to 16-bit A
//     fragments in registers (kern::pack_p), O += P V (wgmma RS, m64n{kDv}k16, V read N-major).
//     Full blocks do no masking work. After the walk, the forward epilogue
//     (kern::FwdEpilogue, epilogue_fwd.cuh) of each warp's 16 rows.
//   Consumer schedule (kOverlap, the default for every kernel: fwd_sm90_run.h): the
//     intra-warpgroup overlap of FlashAttention-3 (S_j issued, then P_{j-1} V_{j-1}; the softmax
//     of S_j runs while the P V GEMM is in flight) with the two consumer warpgroups taking turns
//     at the GEMM issues (ping-pong, named barriers); or serial (S, softmax, P V per block; the
//     (192, 128) kernel ping-pongs on the S GEMM), FLASHSPAN_SM90_OVERLAP=0.
//   Synchronisation: mbarriers (q_full / q_empty, k_full[s] / v_full[s] / k_empty[s] / v_empty[s],
//     item_full[i] / item_empty[i]); the producer fills with expect_tx + TMA complete_tx, the
//     consumers release with one arrival per thread (count 256); named barriers 2 and 3 for the
//     ping-pong turns.
//
// Payload (payload_layout.h, kM16N64Frag): a warp's wgmma accumulator holds the same elements
// as the m16n8 fragments of its 16 rows (HOPPER_BRIEF.md 1.3), so the plan's payload words are
// already in the consumer's register order: warp w of consumer WG c reads 16-row sub-tile
// mt = 4c + w, register s[j][r] (n8 block j of the kBlockK columns) is bit 4 (j % 8) + r of the
// lane's word of 64-column chunk j / 8 (PlanPayloadMask<kBlockK / 8>, the mask role the sm80 warp
// tiles share). No translation, no extra plan layout.
//
// Shared memory (1024-byte aligned, 128B-swizzled tiles as TMA writes them): a tile of R
// rows x D columns is D / 64 slabs of R rows x 128 bytes; Q (128 x kDqk), then kStages K tiles
// (kBlockK x kDqk), then kStages V tiles (kBlockK x kDv), then the barriers and the item ring.
// (128, 128): 161 KB; (192, 128): 209 KB; (256, 256): 193 KB (tile_sm90.h says why).
// wgmma descriptors: K-major tiles (Q, K): SBO = 1024 (8 rows x 128 B), k16 step = +32 B inside
// a slab, next slab every 4 steps; V as N-major B: LBO = kBlockK x 128 B (slab stride),
// SBO = 1024, k16 step (16 keys) = +2 KB.
//
// Rows outside the sample: the Q box may cover rows past the sample (the next sample's rows
// in THD, zero fill past the tensor); a block holding such rows or keys past the sample is
// never full, so the payload masks them (score -inf, P = 0) and those rows are not written.
//
// Results (FwdEpilogue): unsplit items write O normalised (0 for rows with no visible key), LSE
// (natural log, -inf for empty rows) and reduce max_logit with atomics; items of split tasks
// write the unnormalised fp32 O, the running max (log2 units) and row sum into their workspace
// slot (FwdSplit) for the combine kernel (fwd_split.cuh, the one both families launch).
//
// The SDPA FP8 forward (experimental; sdpa_fp8_fwd_kernel_sm90 below, params.h SdpaFp8Params): the
// same producer, consumers, scheduler (AnalyticGrid) and mask source (AnalyticSourceSm90) on 8-bit Q,
// K and V^T, with FwdSm90Layout<kDqk, kDv, 1>; what FP8 needs lives in the roles' FP8 branches:
//   tiles    the 16-bit tiles of those dims (128 x 128, 2 K / V stages), half the bytes: Q, K rows of
//            64 bytes (kDqk = 64: 64B swizzle, descriptor mode 2, SBO 512) or 128 (128B swizzle); V^T
//            kDv rows x 128 keys (128B swizzle). (64, 64) 40 KB, (128, 128) 80 KB of shared memory.
//   GEMMs    S = Q K^T: kDqk / 32 k32 steps of SS m64n128k32; O += P V: 4 k32 steps of RS m64n{kDv}k32
//            with B = V^T K-major (8-bit wgmma has no transpose operand, so each call first writes V^T
//            [B, H_v, D_v, keys] into its workspace: fp8_vt_sm90.cuh, zeros past each sample's keys).
//   P        the softmax's exponent shifted by log2 scale_s (OnlineSoftmax::update_row), so each block
//            comes out as exp(s - m_running) scale_s, quantized by cvt.rn.satfinite and packed into the
//            k32 A registers from each thread's own values (softmax.cuh pack_p): A's column k of each 32
//            holds P's column fp8_vt_key(k) (tile_sm90.h), and the pre-pass stores V's key fp8_vt_key(k)
//            at V^T's column k, so no byte moves between lanes. The overlapped schedule keeps the eager
//            update for FP8 (a lazy base would let P exceed scale_s and saturate).
//   results  O = acc descale_s descale_v scale_s / l (l = scale_s x the row sum: 1 / sum folded in at
//            the end, the flash form of P_q = fp8(P scale_s)), fp8(O scale_o); LSE of the unshifted
//            statistics; amax_s = max 1 / (row sum), amax_o = max |O| gathered per thread, flushed once
//            per warp when the CTA ends (epilogue_fwd.cuh Fp8Out; the launcher zeroes them).
//   masks    the analytic source's; keys past a sample are zeros in V^T, so no V rows are zeroed here.
//   packed   (THD; experimental, not yet run on a GPU) q and k through the per-sample maps (kSampleMaps, the
//            16-bit kernels' producer path), V through the pre-pass (ragged V read at its samples' starts into
//            the padded V^T workspace), O and the stats at the samples' starts (AnalyticSourceSm90::rows).
//
// Why raw PTX (inline asm: wgmma_sm90.inc, the mbarrier / TMA / setmaxnreg wrappers of ptx_sm90.cuh) and
// not CuTe from the pinned nvidia-cutlass headers: the kernel needs only a handful of Hopper
// instructions (four wgmma forms, one TMA load form, mbarrier init/arrive/expect_tx/try_wait,
// setmaxnreg, fences), each checked on an H200 (HOPPER_BRIEF.md); written out, the register
// order of every fragment stays explicit, which is what lets the plan's payload words map onto
// the accumulator registers with compile-time bit indices; and the build needs no extra header
// package and none of CuTe's template compile time (the CPU CI builds every CUDA file on 2 cores).
#pragma once

#include <cuda.h>

#include <cstdint>
#include <type_traits>

#include "kernels/common/analytic_seqlen.cuh"
#include "kernels/common/block_range.cuh"
#include "kernels/common/epilogue_fwd.cuh"
#include "kernels/common/kv_addr.cuh"
#include "kernels/common/ptx.cuh"
#include "kernels/common/sdpa_score_mod.cuh"
#include "kernels/common/softmax.cuh"
#include "kernels/common/tile_scheduler.cuh"
#include "kernels/common/variant.cuh"
#include "kernels/params.h"
#include "kernels/sm90/ptx_sm90.cuh"
#include "kernels/sm90/sample_maps_sm90.cuh"
#include "kernels/sm90/tile_sm90.h"

namespace flashspan::kern90 {

// kStages K/V stages, K and V released separately (k_empty / v_empty: K once the S GEMM has
// retired, V once the P V GEMM has), so that the overlapped consumers, which hold block j's K
// and block j-1's V at once, still let the producer load K_{j+1} early. 3 stages fit next to Q
// for D = 128 (224 KB of tiles) but measured no faster: with a shared K/V release, the overlapped
// D = 128 loop went 567 -> 634 TFLOP/s with a third stage, and the split release gives the same
// with 2 (S=32768 causal, PERF_LOG v2.0); 2 leave more of the unified L1 to the payload and CSR
// reads.
constexpr int kStages = 2, kThreads = 384;
constexpr int kConsumerThreads = 256;

// The forward tile of kernel head dims (kDqk, kDv): the sm90 tile table's (tile_sm90.h, the
// one the plans are laid out for) and the shared-memory layout. Two consumer warpgroups of 64
// rows, S fragments of kBlockK keys (s[kBlockK / 8][4], kBlockK / 64 payload words a row pair),
// P V in kPSteps k-steps (16 keys a k16 step, 32 an FP8 k32 step).
// kElemBytes: 2 (fp16 / bf16) or 1 (FP8, the SDPA FP8 forward). Q and K tiles are slabs of rows
// of kRowBytes = min(128, kDqk kElemBytes) bytes (one TMA box of kSlabCols columns a slab, swizzle
// span = the row: 128B, or 64B for FP8 head dim 64). V: 16-bit, kDv / 64 slabs of kBlockK rows x
// 128 bytes (N-major B of the P V GEMM); FP8, V^T (the pre-pass's [D_v, keys] rows, K-major B as
// 8-bit wgmma requires): one slab of kDv rows x kBlockK (= 128) bytes.
template <int kDqk, int kDv, int kElemBytes = 2>
struct FwdSm90Layout {
  static constexpr sm90::TileSm90 kTile = sm90::tile_sm90(kDqk, kDv);
  static_assert(kTile.dqk_tile == kDqk && kTile.dv_tile == kDv, "sm90 forward: kernel head dims of the sm90 tile table");
  static constexpr int kBlockQ = kTile.fwd_bq, kBlockK = kTile.fwd_bk;
  static_assert(kBlockQ == 2 * 64 && (kBlockK == 128 || kBlockK == 64),
                "sm90 forward: the kernel is written for 128 query rows and 64 or 128 keys");
  static_assert(kDqk % 64 == 0 && kDv % 64 == 0 && kDv <= 256, "sm90 forward: whole 64-column slabs, m64n{<=256}");
  static constexpr bool kFp8 = kElemBytes == 1;
  static_assert(kElemBytes == 2 || (kFp8 && kBlockK == 128 && kDqk <= 128 && kDv <= 128),
                "sm90 forward: 16-bit, or FP8 with 128-key blocks (one 128-byte V^T row) and head dims up to 128");
  static constexpr int kSlabCols = 128 / kElemBytes;   // columns of a 128-byte slab (a TMA box's inner extent)
  static constexpr int kRowBytes = kDqk * kElemBytes < 128 ? kDqk * kElemBytes : 128;  // Q / K slab rows
  static constexpr int kQKSlabs = kDqk * kElemBytes / kRowBytes;
  static constexpr int kQSlab = kBlockQ * kRowBytes;  // a tile's rows x one slab of columns
  static constexpr int kKSlab = kBlockK * kRowBytes;  // K tiles
  static constexpr int kVSlab = kFp8 ? kDv * kBlockK : kBlockK * 128;  // V tiles (FP8: the V^T tile)
  static constexpr int kPSteps = kBlockK * kElemBytes / 32;  // k-steps of P V (32 bytes of keys each)
  static constexpr int kQBytes = kQKSlabs * kQSlab;
  static constexpr int kKBytes = kQKSlabs * kKSlab;            // one K stage
  static constexpr int kVBytes = kFp8 ? kVSlab : kDv / 64 * kVSlab;  // one V stage
  static constexpr int kQ = 0;
  static constexpr int kK = kQ + kQBytes;
  static constexpr int kV = kK + kStages * kKBytes;
  static constexpr int kBar = kV + kStages * kVBytes;
  // q_full, q_empty, k_full[kStages], v_full[kStages], k_empty[kStages], v_empty[kStages], item_full[2],
  // item_empty[2]
  static constexpr int kNumBars = 2 + 4 * kStages + 4;
  static constexpr int kItem = kBar + 8 * kNumBars;  // int32 [2][8]: the item ring
  static constexpr int kUsed = kItem + 2 * 8 * 4;
  static constexpr int kBytes = kUsed + 1024;  // + slack to align the dynamic base to 1024
  static_assert(kBytes <= 232448, "sm90 forward: more shared memory than an sm_90 block may have (227 KB)");
  // The kernels with an additive bias (AnalyticModSourceSm90: D <= 128) stage it after the rest: two
  // buffers of a key block's bias tile (kBlockQ rows x kBlockK keys, 16-bit, kBlockK / 64 TMA boxes;
  // sdpa_score_mod.cuh SdpaBiasFrag::add_tma), loaded by the producer, and their barriers
  // bias_full[2], bias_empty[2] in the slack before them.
  static constexpr int kBiasBars = kUsed;
  static constexpr int kBiasStage = (kBiasBars + 4 * 8 + 1023) / 1024 * 1024;
  static constexpr int kBiasBuffer = kBlockQ * kBlockK * 2;  // two: key blocks j and j + 1 in flight
  static constexpr int kBytesBias = kBiasStage + 2 * kBiasBuffer + 1024;
  static_assert(kBiasBuffer == kBlockK / 64 * int(kern::SdpaBiasFrag::kTmaBox) &&
                    kBiasBuffer >= kBlockK / 64 * int(kern::SdpaBiasFrag::kTmaBoxBcast),
                "sm90 forward: the bias tile is kBlockK / 64 boxes of 128 rows (or of one row)");
  static_assert(kQSlab % 1024 == 0 && kKSlab % 1024 == 0 && kVSlab % 1024 == 0,
                "sm90 forward: every slab on a 1024-byte boundary (swizzle base offset 0)");
};

// SDPA's mask sources (defined below for the device pass only): the host pass names them too, as
// the template argument of sdpa_fwd_kernel_sm90 its launcher takes (fwd_sm90_run.cuh).
template <class L>
struct AnalyticSourceSm90;
template <class L, bool kBias>
struct AnalyticModSourceSm90T;
template <class L>
using AnalyticModSourceSm90 = AnalyticModSourceSm90T<L, true>;
template <class L>
using AnalyticModNoBiasSourceSm90 = AnalyticModSourceSm90T<L, false>;
template <class L>
struct AnalyticDropSourceSm90;
template <class L, bool kBias>
struct AnalyticPagedSourceSm90T;
template <class L>
using AnalyticPagedSourceSm90 = AnalyticPagedSourceSm90T<L, false>;
template <class L>
using AnalyticPagedBiasSourceSm90 = AnalyticPagedSourceSm90T<L, true>;

#if defined(__CUDA_ARCH__)

// S = Q K^T for this warpgroup's 64 rows: kDqk / 16 k-steps of m64n{kBlockK}k16 (both K-major);
// FP8: kDqk / 32 k-steps of m64n{kBlockK}k32.
template <class L, class E>
__device__ __forceinline__ void issue_qk(float (&s)[L::kBlockK / 8][4], uint32_t q_tile, uint32_t k_tile) {
  if constexpr (L::kFp8) {
    wgmma_ss_kmajor_fp8<L::kBlockK, L::kTile.dqk_tile, L::kRowBytes, L::kQSlab, L::kKSlab, E>(s, q_tile, k_tile);
  } else {
    wgmma_ss_kmajor<L::kBlockK, L::kTile.dqk_tile, L::kQSlab, L::kKSlab, E>(s, q_tile, k_tile);
  }
}

// O += P V: kBlockK / 16 k-steps (16 keys each) of m64n{kDv}k16, V N-major (LBO = slab stride).
// FP8: kBlockK / 32 k-steps (32 keys, 32 bytes of each V^T row) of m64n{kDv}k32, V^T K-major
// (rows of 128 bytes, 128B swizzle, SBO = 8 rows).
template <class L, class E>
__device__ __forceinline__ void issue_pv(float (&o)[L::kTile.dv_tile / 8][4], const uint32_t (&pa)[L::kPSteps][4],
                                         uint32_t v_tile) {
#pragma unroll
  for (int kk = 0; kk < L::kPSteps; ++kk) {
    if constexpr (L::kFp8) {
      wgmma_rs_fp8<L::kTile.dv_tile, E>(o, pa[kk], desc_add(smem_desc(v_tile, 16, 1024), kk * 32));
    } else {
      wgmma_rs_tnspb<L::kTile.dv_tile, E>(o, pa[kk], desc_add(smem_desc(v_tile, L::kVSlab, 1024), kk * 2048));
    }
  }
}

// Work items (kern::WorkItem, tile_scheduler.cuh): key blocks [begin, begin + count) of the Q2K
// walk (BlockCursor order) of local query block `block` of query head `head` of sample
// `batch`; slot >= 0 for a piece of a split task. The producer takes them from the
// TileScheduler and hands them to the consumers; block < 0 ends the CTA.
using kern::WorkItem;

// The CSR cursor of an item, restricted to [begin, begin + count) (block_range.cuh).
__device__ __forceinline__ kern::ItemCursor item_cursor(const FwdParams& p, const WorkItem& it) {
  const int hm = p.mask_per_head ? it.head : 0;
  const int64_t r = int64_t(hm) * p.view.num_q_blocks + __ldg(p.view.q_block_start + it.batch) + it.block;
  return kern::ItemCursor::make(kern::BlockCursor::row(p.view.q2k_partial_ptr, p.view.q2k_partial_kb,
                                                       p.view.q2k_full_ptr, p.view.q2k_full_runs, r),
                                it.begin, it.count);
}

// ---------------------------------------------------------------------------
// Mask sources: the per-item half of the Mask role, a template parameter of producer and
// consumers. Per work item `it` of the launch's scheduler:
//   Src::scheduler(p).next(n)         the CTA's n-th item
//   Src src = Src::item(p, it)        the item's state (analytic: its cursor and mask terms)
//   src.cursor(p, it)                 its key blocks: next(kb, partial, entry), done()
//   src.load(mask, p, kb, partial, entry, mt, lane)   the Mask (variant.cuh) of key block kb
//                                     for m16 tile mt of the block (warp w of consumer c: 4c + w)
//   src.score_mod(p, it, kb, mt, lane, stage)  the ScoreMod of that tile (Variant::logits): NoScoreMod,
//                                     or SDPA's modifiers (kMods: AnalyticModSourceSm90, which also
//                                     seeds the rows' statistics with a sink, src.init_stats, and
//                                     has the epilogue write SDPA's options; kDropout:
//                                     AnalyticDropSourceSm90, which also drops out P after the
//                                     softmax step, src.dropout)
//   Src::rows(p, it), Src::lse_unit(p)  where the epilogue writes the block's rows; LSE unit
// ---------------------------------------------------------------------------

// Flex: the plan's Q2K lists and payload, the plan's cu_seqlens and task list / grid / split
// items (the code the kernel had inline: scripts/sass_diff.sh, same SASS).
template <class L>
struct PlanSourceSm90 {
  static constexpr bool kAnalytic = false, kMods = false, kDropout = false, kStagedBias = false, kPaged = false;
  using Mask = kern::PlanPayloadMask<L::kBlockK / 8>;
  using ScoreMod = kern::NoScoreMod;

  __device__ __forceinline__ static kern::TileScheduler scheduler(const FwdParams& p) {
    return kern::TileScheduler::forward(p, p.num_heads_q / p.pack);  // kv heads when packed
  }
  __device__ __forceinline__ static PlanSourceSm90 item(const FwdParams&, const WorkItem&) { return {}; }
  __device__ __forceinline__ kern::ItemCursor cursor(const FwdParams& p, const WorkItem& it) const {
    return item_cursor(p, it);
  }
  __device__ __forceinline__ void load(Mask& mask, const FwdParams& p, int, bool partial, int entry, int mt,
                                       int lane) const {
    mask.load(p.view.q2k_partial_bits, partial, entry, L::kBlockQ, mt, lane);
  }
  __device__ __forceinline__ ScoreMod score_mod(const FwdParams&, const WorkItem&, int, int, int, uint32_t) const {
    return {};
  }
  // Packed rows (FwdRows) of the item; rows past the sample's length are not written.
  __device__ __forceinline__ static kern::FwdRows rows(const FwdParams& p, const WorkItem& it) {
    const int pack_shift = __ffs(p.pack) - 1;  // log2 G (pack a power of two), 0 unpacked
    const int q_start = __ldg(p.cu_seqlens_q + it.batch), len_q = __ldg(p.cu_seqlens_q + it.batch + 1) - q_start;
    const int row0 = it.block * L::kBlockQ;
    const int rows_valid = min(L::kBlockQ, (len_q << pack_shift) - row0);
    const int64_t q_row0 = p.varlen ? q_start : 0;
    return kern::FwdRows{it.batch,       it.head << pack_shift, q_row0 + (row0 >> pack_shift), rows_valid, pack_shift,
                         int64_t(it.batch) * p.oa.batch_stride, int64_t(it.batch) * p.lsea.batch_stride};
  }
  __device__ __forceinline__ static float lse_unit(const FwdParams&) { return kern::kLn2; }
};

// SDPA: the analytic mask (analytic_mask.h, analytic_seqlen.cuh: the roles of the sm80 SDPA
// kernels) of padded tensors (launch_sdpa_fwd_sm90: Q, K, V, O and the stats not ragged, so
// sample b is batch coordinate b of the tensor maps and the TensorAddr batch strides are the
// tensors' own). Items are the cells of an AnalyticGrid over every sample padded to S_q; a
// block's key blocks are the analytic Q2K cursor's (block_mask applied), a partial block's mask
// the tile mask of the block's QueryBlockMask. Rows past the sample are masked (never full), so
// they write O = 0 and LSE = -inf up to S_q; keys past it are masked, and the V rows of the
// sample's last key block past len_kv are zeroed before the P V GEMM (zero_v_rows_past: P = 0
// there, but a NaN in the padding would survive 0 * NaN). K and V may have different head counts
// (H_k != H_v, each dividing H_q): the producer loads V of query head h's own V head, h / group_v
// (kv_addr.cuh v_head), K of h / group_size; the tensor maps take each tensor's heads.
template <class L>
struct AnalyticSourceSm90 {
  static constexpr bool kAnalytic = true, kMods = false, kDropout = false, kStagedBias = false, kPaged = false;
  using Mask = kern::AnalyticTileMask<L::kBlockK / 8>;
  using ScoreMod = kern::NoScoreMod;
  kern::BlockMaskedCursor cur;
  kern::QueryBlockMask block;

  __device__ __forceinline__ static kern::AnalyticGrid scheduler(const FwdParams& p) {
    const AnalyticMaskParams& a = kern::analytic_of(p);
    return kern::AnalyticGrid{a.num_q_blocks, p.num_heads_q, p.batch, a.l2_group, a.item_counter};
  }
  __device__ __forceinline__ static AnalyticSourceSm90 item(const FwdParams& p, const WorkItem& it) {
    const kern::AnalyticSeqlen sl(p, it.batch);
    return AnalyticSourceSm90{
        kern::masked_q2k_cursor(kern::analytic_of(p), sl, it.head, it.block, L::kBlockQ, L::kBlockK),
        kern::QueryBlockMask::make(sl.mask, int64_t(it.block) * L::kBlockQ)};
  }
  __device__ __forceinline__ kern::BlockMaskedCursor cursor(const FwdParams&, const WorkItem&) const { return cur; }
  __device__ __forceinline__ void load(Mask& mask, const FwdParams&, int kb, bool, int, int mt, int lane) const {
    mask = Mask{block.tile(int64_t(kb) * L::kBlockK), mt, lane};
  }
  __device__ __forceinline__ ScoreMod score_mod(const FwdParams&, const WorkItem&, int, int, int, uint32_t) const {
    return {};
  }
  // Keys of key block kb inside the sample (>= kBlockK: all of them).
  __device__ __forceinline__ int keys_inside(int kb) const { return block.len_kv - kb * L::kBlockK; }
  // Every row of a padded O / stats below S_q; of a packed (ragged) one the sample's rows (rows_to_store), at
  // the sample's start (sample_start: its ragged offset, or b times the batch stride).
  __device__ __forceinline__ kern::FwdRows rows(const FwdParams& p, const WorkItem& it) const {
    const AnalyticMaskParams& a = kern::analytic_of(p);
    const int row0 = it.block * L::kBlockQ;
    return kern::FwdRows{it.batch,
                         it.head,
                         row0,
                         kern::rows_to_store(a, kSdpaO, row0, L::kBlockQ, row0 + block.rows, a.max_q),
                         0,
                         kern::sample_start(a.start[kSdpaO], it.batch),
                         kern::sample_start(a.start[kSdpaStats], it.batch)};
  }
  __device__ __forceinline__ static float lse_unit(const FwdParams& p) { return kern::analytic_of(p).lse_unit; }
};

// SDPA with score modifiers (sdpa_fwd_kernel_sm90 with this source): the analytic source plus
// softcap, ALiBi and the additive bias in the scores -> logits step (a kern::SdpaTileScoreMod per
// key block and warp: the head's softcap / slope, the tile's diagonal offset and bias addresses), the head's
// sink seeding the rows' statistics (OnlineSoftmax::seed_row: rows inside the sample only), and
// the epilogue options (score_max / score_sum_exp, the output gate: FwdEpilogue::store_rows with
// SDPA's options). The roles and the order are the sm80 SDPA kernels' (AnalyticMaskSm80): softcap
// and ALiBi on every block before the mask, the bias after it on the visible elements; each a
// run-time flag of this instantiation, but for the bias: kBias = false (AnalyticModNoBiasSourceSm90)
// is the kernel of the calls without one (fwd_sm90_run.cuh picks). Dropout: AnalyticDropSourceSm90
// below.
template <class L, bool kBias>
struct AnalyticModSourceSm90T : AnalyticSourceSm90<L> {
  static constexpr bool kMods = true;
  static constexpr bool kStagedBias = kBias;  // the bias tiles staged by the producer (bias_tma, load_bias)
  using ScoreMod = kern::SdpaTileScoreMod<kBias>;
  // The head's ALiBi slope * log2 e (0: none). The rest of a block's modifiers is formed per block
  // from the parameters and the work item (the main loop of the (128, 128) kernel spilled when
  // the bias's head address and the softcap terms were held across it too).
  float a2;

  __device__ __forceinline__ static AnalyticModSourceSm90T item(const FwdParams& p, const WorkItem& it) {
    const SdpaScoreParams& sp = kern::analytic_of(p).score;
    return AnalyticModSourceSm90T{{AnalyticSourceSm90<L>::item(p, it)},
                                  sp.alibi_n > 0 ? kern::alibi_slope_dev(it.head, sp.alibi_n) * kern::kLog2e : 0.0f};
  }
  // The modifiers of key block kb on m16 tile mt (rows 16 mt .. of the block) of item it; tile: the
  // block's bias tile in the stage (FwdSm90Layout::kBiasStage) when the producer stages it (bias_tma).
  __device__ __forceinline__ ScoreMod score_mod(const FwdParams& p, const WorkItem& it, int kb, int mt, int lane,
                                                uint32_t tile) const {
    const AnalyticMaskParams& a = kern::analytic_of(p);
    const float c2 = a.score.softcap2;
    const int64_t r0 = int64_t(it.block) * L::kBlockQ + 16 * mt, c0 = int64_t(kb) * L::kBlockK;
    // What a block forms here runs once a key block and warp: only what the call uses (PERF_LOG v2.73: the
    // diagonal offset, the bias's 64-bit addresses and two divisions were ~60 instructions a block whatever
    // the call, a fifth of what a staged bias added to the plain kernel's loop). The diagonal offset of the
    // tile's element (0, 0) (row r0, key c0; r0 + shift = block.lo0 - d_min + 16 mt) for ALiBi; the bias's
    // addresses for element loads (a staged bias is read from `tile`).
    const bool staged = bias_tma(p);
    kern::SdpaBiasFrag bias{nullptr, staged ? a.bias.row_stride : 0, 0, kBias ? a.bias.dtype : 0};
    if (kBias && !staged) bias = kern::SdpaBiasFrag::make(a.bias, it.batch, it.head, r0, c0, lane);
    return ScoreMod{kern::SdpaScoreMod{c2, kern::SdpaScoreMod::inv_softcap(c2), a2},
                    a2 != 0.0f ? kern::diag_base(c0, this->block.lo0 - a.band.d_min() + 16 * mt) : 0, lane, bias,
                    staged ? tile + (a.bias.row_stride == 0 ? 0u : uint32_t(16 * mt) * 128u) : 0u};
  }
  // Whether the producer stages the bias tiles by TMA (a 16-bit bias of whole aligned rows,
  // SdpaBiasParams::chunks; the others are read element by element, SdpaBiasFrag::add).
  __device__ __forceinline__ static bool bias_tma(const FwdParams& p) {
    return kBias && kern::analytic_of(p).bias.chunks != 0;
  }
  // The producer's copy of key block kb's bias tile into `tile` (bias_tma only): kBlockK / 64 boxes
  // of 64 keys x the block's kBlockQ rows (one row, row 0, when the bias is broadcast over rows;
  // launch_fwd_sm90.cu's map has extent 1 along every broadcast dimension), completing on `full`.
  __device__ __forceinline__ static void load_bias(const FwdParams& p, const CUtensorMap* tm, const WorkItem& it,
                                                   int kb, uint32_t tile, uint32_t full) {
    const SdpaBiasParams& bp = kern::analytic_of(p).bias;
    const bool bc = bp.row_stride == 0;
    const int row = bc ? 0 : it.block * L::kBlockQ, h = bp.head_stride == 0 ? 0 : it.head,
              b = bp.batch_stride == 0 ? 0 : it.batch;
    const uint32_t box = bc ? kern::SdpaBiasFrag::kTmaBoxBcast : kern::SdpaBiasFrag::kTmaBox;
    mbar_arrive_expect_tx(full, uint32_t(L::kBlockK / 64) * (bc ? 128u : uint32_t(L::kBlockQ) * 128u));
#pragma unroll
    for (int x = 0; x < L::kBlockK / 64; ++x) {
      tma_load_4d(tile + uint32_t(x) * box, tm, kb * L::kBlockK + 64 * x, row, h, b, full);
    }
  }
  // The statistics of the thread's rows of m16 tile mt seeded with the head's sink (rows past the
  // sample keep m = -inf, l = 0: O = 0, LSE = -inf).
  __device__ __forceinline__ void init_stats(kern::OnlineSoftmax& sm, const FwdParams& p, int head, int mt,
                                             int lane) const {
    const float* sink = kern::analytic_of(p).score.sink;
    if (sink == nullptr || p.max_logit != nullptr) return;  // with max_logit: fold_sink after the walk
    const float s2 = __ldg(sink + head) * kern::kLog2e;
#pragma unroll
    for (int hi = 0; hi < 2; ++hi) {
      if (16 * mt + (lane >> 2) + 8 * hi < this->block.rows) kern::OnlineSoftmax::seed_row(sm.m[hi], sm.l[hi], s2, lane);
    }
  }
  // With max_logit (the scores' maximum, sink left out) the sink joins the same rows' statistics after
  // the walk (settled, if lazy) instead, with the sums init_stats' seed gives (OnlineSoftmax::fold_sink_row;
  // the sm80 forward's AnalyticMaskSm80::fold_sink). Experimental (dispatch: sdpa_feature_pairs_enabled).
  template <int kNO>
  __device__ __forceinline__ void fold_sink(kern::OnlineSoftmax& sm, const FwdParams& p, int head, int mt, int lane,
                                            float (&o)[kNO][4]) const {
    const float* sink = kern::analytic_of(p).score.sink;
    if (sink == nullptr || p.max_logit == nullptr) return;
    const float s2 = __ldg(sink + head) * kern::kLog2e;
#pragma unroll
    for (int hi = 0; hi < 2; ++hi) {
      if (16 * mt + (lane >> 2) + 8 * hi < this->block.rows) {
        kern::OnlineSoftmax::fold_sink_row(o, hi, sm.m[hi], sm.l[hi], s2, lane);
      }
    }
  }
};

// SDPA with score modifiers and dropout (sdpa_fwd_kernel_sm90 with this source; experimental,
// FLASHSPAN_EXPERIMENTAL=1: sdpa_family.cpp): the modifiers' source plus dropout (Philox or the caller's
// mask, SdpaDropoutParams; the sm80 forward's AnalyticMaskSm80::dropout) on P after the online softmax
// step, every other feature a run-time flag as there. An instantiation of its own (units
// sdpa_fwd_drop_sm90_d{64,128}.cu): in the modifiers' kernel the dropout code, wherever it was put in
// the loop, made the (128, 128) consumer spill its row sums every key block, also for calls without
// dropout.
template <class L>
struct AnalyticDropSourceSm90 : AnalyticModSourceSm90<L> {
  static constexpr bool kDropout = true;

  __device__ __forceinline__ static AnalyticDropSourceSm90 item(const FwdParams& p, const WorkItem& it) {
    return AnalyticDropSourceSm90{{AnalyticModSourceSm90<L>::item(p, it)}};
  }
  // Dropout (SdpaDropoutParams) on P of key block kb of m16 tile mt, after the online softmax step (the row sums
  // and the LSE keep every element), the thread's elements those of AccFragment (rows 16 mt + g (+8) of the block,
  // columns 2 q (+1) of each n8 block of key block kb), so the keep mask is the sm80 kernels' bit for bit
  // (sdpa_dropout_forward, the sm80 forward's too). Philox: the dropped elements zeroed here, a select each; the
  // kept ones' 1 / (1 - p) applied to O once, after the walk (scale_o), not to each P (a multiply an element on
  // the softmax path).
  template <int kN>
  __device__ __forceinline__ void dropout(const FwdParams& p, const WorkItem& it, int kb, int mt, int lane,
                                          float (&s)[kN][4]) const {
    const SdpaDropoutParams& dp = kern::analytic_of(p).dropout;
    if (dp.mode == 0) return;  // (before the positions: ptxas placed them differently when the helper tested it first)
    const int64_t row0 = int64_t(it.block) * L::kBlockQ, i = row0 + 16 * mt + (lane >> 2);
    const int64_t j = int64_t(kb) * L::kBlockK + 2 * (lane & 3);
    kern::sdpa_dropout_forward<kN>(dp, /*o_scaled=*/true, it.batch, it.head, p.num_heads_q, i, j,
                                   row0 + this->block.rows, this->block.len_kv, s);
  }
  // Philox dropout's 1 / (1 - p) on the walk's O (dropout above), before the epilogue.
  template <int kNO>
  __device__ __forceinline__ static void scale_o(const FwdParams& p, float (&o)[kNO][4]) {
    kern::sdpa_dropout_scale_o<kNO>(kern::analytic_of(p).dropout, o);
  }
};

// SDPA over paged K/V caches (AnalyticPagedSourceSm90, sdpa_fwd_paged_kernel_sm90, on by default: dispatch's
// sdpa_sm90_paged_enabled; params.h SdpaPagedFwdSm90Params): the modifiers' source without the bias (softcap, ALiBi,
// sinks, the gate, score_max / score_sum_exp and the block_mask as run-time flags; the bias: kBias below, experimental;
// dropout keeps the sm80 paged kernel), its K and V boxes placed by the paged address role (kv_addr.cuh PagedKv, TMA
// form: the producer's load_paged_block) instead of ContiguousKv. Q padded, or packed (THD; experimental, dispatch's
// sdpa_sm90_paged_thd_enabled) through its per-sample map (kSampleMaps: the unpaged kernels' producer path, q's map
// alone); O, the stats and the gate padded or packed at the samples' starts (the analytic source's rows, a run-time
// answer). Rows of a last key block past the sample's keys (other samples' rows, or anything, in a page) are masked in
// S and zeroed in V (zero_v_rows_past), as the unpaged kernels' padding.
// kBias (AnalyticPagedBiasSourceSm90, as AnalyticModSourceSm90T's; sdpa_fwd_paged_bias_kernel_sm90, (128, 128) only;
// on by default: dispatch's sdpa_sm90_paged_bias_enabled): the modifiers' source with the additive bias, whose staging
// (load_bias: a 16-bit bias of whole aligned rows by TMA per key block, FwdSm90Layout::kBiasStage) and element-wise
// reads hold as they are, the bias indexing keys by their position in the sample, not through the pages. An
// instantiation of its own: as the paged source's base (one kernel for calls with and without a bias) it added 12 / 32
// B (D = 128) and 16 / 32 B (D = 64) of spill stores / loads to the 24-register producer of the calls without one
// (PERF_LOG v2.53).
template <class L, bool kBias>
struct AnalyticPagedSourceSm90T : AnalyticModSourceSm90T<L, kBias> {
  static constexpr bool kPaged = true;

  __device__ __forceinline__ static AnalyticPagedSourceSm90T item(const FwdParams& p, const WorkItem& it) {
    return AnalyticPagedSourceSm90T{{AnalyticModSourceSm90T<L, kBias>::item(p, it)}};
  }
  __device__ __forceinline__ static const SdpaPagedFwdSm90Params& paged(const FwdParams& p) {
    return static_cast<const SdpaPagedFwdSm90Params&>(p);
  }
};

// Named barrier of the two consumer warpgroups around zero_v_rows_past (ping-pong uses 2, 3).
constexpr int kVTailBar = 4;

// Zeroes rows [keys, kBlockK) of the V stage at v_tile (every 64-column slab: kBlockK rows of
// 128 bytes, the swizzle permutes 16-byte chunks inside a row) by the 256 consumer threads
// (t: 0..255), then makes the writes visible to the wgmma (async proxy) of both warpgroups.
// Both consumer warpgroups call it for the same block (they walk the same blocks).
template <class L>
__device__ __forceinline__ void zero_v_rows_past(uint32_t v_tile, int keys, int t) {
  constexpr int kChunks = L::kTile.dv_tile / 64 * L::kBlockK * 8;
#pragma unroll 4
  for (int i = t; i < kChunks; i += kConsumerThreads) {
    if ((i >> 3) % L::kBlockK >= keys) {
      asm volatile("st.shared.v4.u32 [%0], {%1, %1, %1, %1};\n" ::"r"(v_tile + 16 * i), "r"(0) : "memory");
    }
  }
  fence_proxy_async_smem();
  named_bar_sync(kVTailBar, kConsumerThreads);
}

// ---------------------------------------------------------------------------
// Producer (one thread)
// ---------------------------------------------------------------------------

// The per-sample tensor maps of packed (THD) SDPA tensors (AnalyticMaskParams::sample_maps; sample_maps_sm90.h,
// sample_maps_sm90.cuh): the SDPA kernels' (kSampleMaps), null for every other call. The FP8 kernel's q and k
// (kSampleMapsUsed: the first two of a sample's kSampleMapsFwd slots); its V^T stays the pre-pass's padded
// workspace, whose map is the kernel's own at the sample's batch coordinate. The paged kernel's q alone (the first
// slot; its K / V boxes come from the page tables, load_paged_block).
template <class Src, class L>
inline constexpr bool kSampleMaps = Src::kAnalytic;
template <class Src, class L>
inline constexpr int kSampleMapsUsed = Src::kPaged ? kSdpaQ + 1 : L::kFp8 ? kSdpaK + 1 : sm90::kSampleMapsFwd;
template <class Src, class L>
__device__ __forceinline__ const void* sample_maps_of(const FwdParams& p) {
  if constexpr (kSampleMaps<Src, L>) {
    return kern::analytic_of(p).sample_maps;
  } else {
    return nullptr;
  }
}
// Issues a Q / K / V load of sample kv (kv.batch: sample_coord's code) through the map of tensor x (kSdpaQ /
// kSdpaK / kSdpaV): issue(map, batch coordinate) (with_sample_map).
template <class Src, class L, class F>
__device__ __forceinline__ void with_kv_map(const FwdParams& p, const kern::ContiguousKv& kv, const CUtensorMap* tm,
                                            int x, F&& issue) {
  with_sample_map<kSampleMaps<Src, L>, sm90::kSampleMapsFwd>(sample_maps_of<Src, L>(p), kv.batch, tm, x, issue);
}

// Paged K or V (Src::kPaged): key block kb of sample b, kSlabs slabs of kSlabBytes (kBlockK rows of 128
// bytes each) at dst, through side s's map tm (kv_addr.cuh PagedKv, TMA form: kBlockK / box boxes of `box`
// rows a slab, each in its own page, box >= 8 rows so that each lands on whole 1024-byte swizzle atoms of the
// tile; one box for pages of kBlockK keys or more, or a side without a table). The boxes add up to the
// block's bytes, so the expect_tx of the contiguous load holds (a box past the map is zero filled and
// counted). An entry outside the container is not read through: its box lies past the map and the sample is
// flagged (SdpaPagedFwdSm90Params::bad_samples; the launcher writes NaN over its O and stats rows).
template <int kBlockK, int kSlabs, int kSlabBytes>
__device__ __forceinline__ void load_paged_block(const SdpaPagedFwdSm90Params& pp, const SdpaPagedSide& s,
                                                 const CUtensorMap* tm, int b, int kb, int len, int head,
                                                 uint32_t dst, uint32_t full) {
  const kern::PagedKv kv = kern::PagedKv::item(s, b);
  const int lb = kern::PagedKv::tma_log2_box<kBlockK>(s);
  for (int j = 0; j < (kBlockK >> lb); ++j) {
    int row, page;
    if (!kv.tma_box(s, b, kb * kBlockK + (j << lb), len, row, page)) pp.bad_samples[b] = 1;
#pragma unroll
    for (int x = 0; x < kSlabs; ++x) {
      tma_load_4d(dst + uint32_t(x * kSlabBytes) + uint32_t(j << lb) * 128u, tm, 64 * x, row, head, page, full);
    }
  }
}

template <class L, class Src>
__device__ __forceinline__ void producer(const FwdParams& p, const CUtensorMap* tm_q, const CUtensorMap* tm_k,
                                         const CUtensorMap* tm_v, const CUtensorMap* tm_bias, uint32_t base,
                                         int32_t* s_item) {
  constexpr int kBlockQ = L::kBlockQ, kBlockK = L::kBlockK;
  const uint32_t bars = base + L::kBar;
  const uint32_t q_full = bars, q_empty = bars + 8;
  const uint32_t k_full = bars + 16, v_full = k_full + 8 * kStages;
  const uint32_t k_empty = v_full + 8 * kStages, v_empty = k_empty + 8 * kStages;
  const uint32_t item_full = v_empty + 8 * kStages, item_empty = item_full + 16;
  prefetch_tensormap(tm_q);
  prefetch_tensormap(tm_k);
  prefetch_tensormap(tm_v);
  // The bias tiles (Src::bias_tma: SDPA with a 16-bit bias), one a key block into buffer kv_it % 2,
  // issued after the block's K (once the logits of block kv_it - 2 have read the buffer), so that a
  // tile lands while the consumers still wait for the S GEMM it is added to.
  [[maybe_unused]] bool bias_on = false;
  if constexpr (Src::kStagedBias) {
    bias_on = Src::bias_tma(p);
    if (bias_on) prefetch_tensormap(tm_bias);
  }
  [[maybe_unused]] const uint32_t bias_full = base + L::kBiasBars, bias_empty = bias_full + 16;
  const auto sched = Src::scheduler(p);
  const int pack = p.pack, pack_shift = __ffs(pack) - 1;  // G, log2 G (a power of two)
  uint32_t kv_it = 0;
  for (uint32_t item_it = 0;; ++item_it) {
    const WorkItem it = sched.next(item_it);
    const uint32_t rs = item_it & 1;
    mbar_wait(item_empty + 8 * rs, ((item_it >> 1) & 1) ^ 1);
    volatile int32_t* e = s_item + 8 * rs;
    e[0] = it.block;
    e[1] = it.head;
    e[2] = it.batch;
    e[3] = it.begin;
    e[4] = it.count;
    e[5] = it.slot;
    mbar_arrive(item_full + 8 * rs);  // release: the entry is visible to the waiting consumers
    if (it.block < 0) return;

    const Src src = Src::item(p, it);
    auto cur = src.cursor(p, it);
    // The Q box: rows q_row .. q_row + 127 of query head it.head, or packed (pack = G > 1) the
    // G heads from G it.head of positions q_row .. q_row + 128 / G - 1 (tensor map dims swapped:
    // launch_fwd_sm90.cu).
    const int q_pos = (p.varlen ? __ldg(p.cu_seqlens_q + it.batch) : 0) + it.block * (kBlockQ >> pack_shift);
    int q_c1 = pack > 1 ? it.head << pack_shift : q_pos;
    const int q_c2 = pack > 1 ? q_pos : it.head;
    kern::ContiguousKv kv = kern::ContiguousKv::tma_sample(p, it.batch);  // K/V address role (kv_addr.cuh)
    // Packed (THD) q, k or v (SDPA; AnalyticMaskParams::sample_maps, experimental): the maps of the sample's
    // own rows, built on the device before the kernel (launch_fwd_sm90.cu), batch coordinate 0, acquired here;
    // kv's batch field then says which sample's K / V maps the loads take (-1 - b: with_kv_map; the paged kernel's
    // K / V loads take it.batch, their boxes from the page tables).
    if constexpr (kSampleMaps<Src, L>) {
      if (const void* maps = sample_maps_of<Src, L>(p)) {
        acquire_sample_maps<sm90::kSampleMapsFwd, kSampleMapsUsed<Src, L>>(maps, it.batch);
        kv.batch = sample_coord(maps, it.batch);
        // A sample without query rows has a one-row map at the tensor's base (which may be null, or end there):
        // its box at row 1 lies wholly past the extent, zero filled, nothing read. (Blocks past a longer
        // sample's rows lie past its extent anyway; K / V are loaded only for blocks with visible keys.)
        if (src.block.rows <= 0 && q_c1 == 0) q_c1 = 1;
      }
    }
    const int hkv = it.head * pack / p.group_size;  // packed: pack = group_size, the task head
    // V's head: SDPA's own (H_k != H_v, kv_addr.cuh v_head; FP8: of its V^T workspace, which has H_v heads).
    const int hv = kern::v_head<Src::kAnalytic>(p, it.head, hkv);

    mbar_wait(q_empty, (item_it & 1) ^ 1);
    // Full boxes count towards the transaction bytes also where they lie past the tensor's
    // rows or head dim (zero filled).
    mbar_arrive_expect_tx(q_full, L::kQBytes);
    with_kv_map<Src, L>(p, kv, tm_q, kSdpaQ, [&](const CUtensorMap* m, int batch) {
#pragma unroll
      for (int s = 0; s < L::kQKSlabs; ++s) {
        tma_load_4d(base + L::kQ + s * L::kQSlab, m, L::kSlabCols * s, q_c1, q_c2, batch, q_full);
      }
    });

    int kb = 0, entry = 0;
    bool partial = false;
    while (cur.next(kb, partial, entry)) {
      const uint32_t st = kv_it % kStages, ph = (kv_it / kStages) & 1;
      mbar_wait(k_empty + 8 * st, ph ^ 1);
      const int row = kv.tma_row<kBlockK>(kb);
      mbar_arrive_expect_tx(k_full + 8 * st, L::kKBytes);
      if constexpr (Src::kPaged) {
        static_assert(!L::kFp8 && L::kSlabCols == 64, "paged K/V: 16-bit tiles");
        const SdpaPagedFwdSm90Params& pp = Src::paged(p);
        load_paged_block<kBlockK, L::kQKSlabs, L::kKSlab>(pp, pp.paged_k, tm_k, it.batch, kb, src.block.len_kv, hkv,
                                                          base + L::kK + st * L::kKBytes, k_full + 8 * st);
      } else {
        with_kv_map<Src, L>(p, kv, tm_k, kSdpaK, [&](const CUtensorMap* m, int batch) {
#pragma unroll
          for (int s = 0; s < L::kQKSlabs; ++s) {
            tma_load_4d(base + L::kK + st * L::kKBytes + s * L::kKSlab, m, L::kSlabCols * s, row, hkv, batch,
                        k_full + 8 * st);
          }
        });
      }
      if constexpr (Src::kStagedBias) {
        if (bias_on) {
          const uint32_t bst = kv_it & 1;
          mbar_wait(bias_empty + 8 * bst, ((kv_it >> 1) & 1) ^ 1);
          Src::load_bias(p, tm_bias, it, kb, base + L::kBiasStage + bst * L::kBiasBuffer, bias_full + 8 * bst);
        }
      }
      mbar_wait(v_empty + 8 * st, ph ^ 1);
      mbar_arrive_expect_tx(v_full + 8 * st, L::kVBytes);
      if constexpr (Src::kPaged) {
        const SdpaPagedFwdSm90Params& pp = Src::paged(p);
        load_paged_block<kBlockK, L::kTile.dv_tile / 64, L::kVSlab>(pp, pp.paged_v, tm_v, it.batch, kb,
                                                                    src.block.len_kv, hv,
                                                                    base + L::kV + st * L::kVBytes, v_full + 8 * st);
      } else if constexpr (L::kFp8) {
        // V^T (map over the pre-pass's [B, H_v, D_v, keys] workspace, padded also in packed calls): the
        // block's 128 keys of every d row, one box, at the sample's batch coordinate (kv.batch's code
        // decoded: the sample's maps are q's and k's only).
        tma_load_4d(base + L::kV + st * L::kVBytes, tm_v, row, 0, hv, sample_of_coord(kv.tma_batch()),
                    v_full + 8 * st);
      } else {
        with_kv_map<Src, L>(p, kv, tm_v, kSdpaV, [&](const CUtensorMap* m, int batch) {
#pragma unroll
          for (int s = 0; s < L::kTile.dv_tile / 64; ++s) {
            tma_load_4d(base + L::kV + st * L::kVBytes + s * L::kVSlab, m, 64 * s, row, hv, batch, v_full + 8 * st);
          }
        });
      }
      ++kv_it;
    }
  }
}

// ---------------------------------------------------------------------------
// Consumers (two warpgroups)
// ---------------------------------------------------------------------------

// Ping-pong: the two consumer warpgroups take turns issuing their GEMMs (named barriers 2 and 3,
// FA3's warp-scheduler barriers), so that one warpgroup's softmax runs under the other's GEMMs.
// A turn covers the S GEMM (serial schedule) or both GEMM issues of a step, S_j and
// P_{j-1} V_{j-1} (overlapped schedule, FA3's D <= 128 forward). On for the overlapped kernels
// (with the split K/V release: D = 128 causal S=32768 653 -> 655, tree_bfs 320 -> 328; D = 64
// 375 -> 422, PERF_LOG v2.0) and for the serial (192, 128) kernel, whose S GEMM (K = 192) is
// the longest against its softmax (560 -> 595); it cost the serial (128, 128) kernel 2-5 % and
// left (256, 256) unchanged (PERF_LOG v1.7). FLASHSPAN_SM90_FWD_PINGPONG=1 (build-time, for
// measurements) turns it on for every serial kernel too.
#ifndef FLASHSPAN_SM90_FWD_PINGPONG
#define FLASHSPAN_SM90_FWD_PINGPONG 0
#endif

// Keeps the softmax of S_j ahead of the wait for P_{j-1} V_{j-1} in the overlapped loop.
// ptxas schedules a wgmma wait (WARPGROUP.DEPBAR) as early as its basic block allows, and the
// block started at the merge after the partial block's mask: the whole softmax ran after the
// wait, so the warpgroup's own P V GEMM hid none of it (SASS of v2.2; the volatile-asm order of
// the source does not bind ptxas). A branch that is never taken (kb >= 0) ends the block right
// before the wait: ISETP + BRA a step. Measured (PERF_LOG v2.3, v2.7): (128, 128) +2.5-3.3 %
// (causal S=32768 676 -> 698), (192, 128) causal +7 % / document_causal -5 %, (256, 256) causal
// +4 % / document_causal 0; (64, 64) -2.6-3.5 %, so on for every kernel but (64, 64).
// FLASHSPAN_SM90_FWD_SOFTMAX_FIRST=0 (build-time) turns it off; =2 on for every kernel.
#ifndef FLASHSPAN_SM90_FWD_SOFTMAX_FIRST
#define FLASHSPAN_SM90_FWD_SOFTMAX_FIRST 1
#endif
template <class L>
__device__ __forceinline__ void softmax_before_wait([[maybe_unused]] int kb) {
  if constexpr (FLASHSPAN_SM90_FWD_SOFTMAX_FIRST == 2 ||
                (FLASHSPAN_SM90_FWD_SOFTMAX_FIRST && L::kTile.dqk_tile > 64)) {
    if (kb < 0) __trap();
  }
}

template <class L, class E, bool kMaxLogit, bool kOverlap, class Src>
__device__ __forceinline__ void consumer(const FwdParams& p, uint32_t base, const int32_t* s_item) {
  constexpr bool kPingPong = kOverlap || FLASHSPAN_SM90_FWD_PINGPONG || L::kTile.dqk_tile == 192;
  // Lazy rescaling (softmax.cuh LazyOnlineSoftmax) with the overlapped schedule, but not for FP8: a
  // row's base may lag its max by 2^8 there, and P (times scale_s, up to the format's largest value)
  // would saturate; FP8 keeps the eager update, and skips O's rescale only when no row's max moved
  // (OnlineSoftmax::any_moved: exact).
  constexpr bool kLazy = kOverlap && !L::kFp8;
  // The softmax's reduction chains (softmax.cuh row_max / exp2_row): 4 for FP8, whose softmax is its
  // critical path; 1 for 16-bit (4 measured 1-5 % slower there, PERF_LOG v2.20).
  constexpr int kChains = L::kFp8 ? 4 : 1;
  constexpr int kBlockQ = L::kBlockQ, kBlockK = L::kBlockK;
  constexpr int kNO = L::kTile.dv_tile / 8;  // n8 blocks of O
  constexpr int kNS = kBlockK / 8;           // n8 blocks of S
  constexpr int kKP = L::kPSteps;            // k-steps of P V (k16; FP8: k32)
  const uint32_t bars = base + L::kBar;
  const uint32_t q_full = bars, q_empty = bars + 8;
  const uint32_t k_full = bars + 16, v_full = k_full + 8 * kStages;
  const uint32_t k_empty = v_full + 8 * kStages, v_empty = k_empty + 8 * kStages;
  const uint32_t item_full = v_empty + 8 * kStages, item_empty = item_full + 16;
  const int c = consumer_warpgroup();  // rows 64c .. 64c + 63
  const int t = threadIdx.x & 127, warp = t >> 5, lane = t & 31;
  const int mt = 4 * c + warp;  // 16-row payload sub-tile of this warp
  const uint32_t q_tile = base + L::kQ + c * 64 * L::kRowBytes;
  // The staged bias's buffers and barriers (SDPA with a 16-bit bias: AnalyticModSourceSm90 bias_tma).
  [[maybe_unused]] const uint32_t bias_stage = base + L::kBiasStage;
  [[maybe_unused]] const uint32_t bias_full = base + L::kBiasBars, bias_empty = bias_full + 16;
  [[maybe_unused]] bool bias_on = false;
  if constexpr (Src::kStagedBias) bias_on = Src::bias_tma(p);
  // Roles (kernels/common): the variant's scores -> logits step with the plan's payload as the
  // mask, the online softmax, the forward epilogue.
  using Mask = typename Src::Mask;
  using Epilogue = kern::FwdEpilogue<E, kBlockQ, L::kTile.dv_tile>;
  // FP8 (L::kFp8, the SDPA FP8 forward): the logits take attn_scale from the FP8 factors (a device tensor
  // too) and descale_q descale_k; the softmax
  // shifts its exponent by log2 scale_s, so that P comes out scaled for its quantization
  // (OnlineSoftmax::update_row); the epilogue's FP8 output (kern::Fp8Out) undoes the shift and
  // applies the other factors, and gathers amax_s / amax_o, flushed when the CTA ends.
  float qk_scale = p.scale_log2;
  float shift = 0.0f;
  [[maybe_unused]] kern::Fp8Out q8{};
  if constexpr (L::kFp8) {
    const SdpaFp8Params& f8 = kern::fp8_of(p);
    qk_scale = kern::fp8_factor(f8, kFp8AttnScale) * kern::kLog2e;  // (p.scale_log2's product, on the device)
    qk_scale *= kern::fp8_factor(f8, kFp8DescaleQ) * kern::fp8_factor(f8, kFp8DescaleK);
    q8 = kern::Fp8Out::make(f8);
    shift = q8.shift;
  }
  const kern::Variant<Mask, typename Src::ScoreMod> variant{qk_scale, {}};
  const kern::AccFragment frag(lane);
  [[maybe_unused]] bool fused_softcap = false;
  if constexpr (Src::kMods) fused_softcap = kern::analytic_of(p).score.fused_softcap != 0 && qk_scale > 0.0f;

  // Ping-pong: warpgroup 0 issues first; each S GEMM issue waits for barrier 2 + c and then
  // opens the other's (both warpgroups run the same blocks, so the turns pair up; warpgroup 0
  // takes warpgroup 1's opening arrival back before it leaves).
  if constexpr (kPingPong) {
    if (c == 1) named_bar_arrive(2, 256);
  }
  uint32_t kv_it = 0;
  for (uint32_t item_it = 0;; ++item_it) {
    const uint32_t rs = item_it & 1;
    mbar_wait(item_full + 8 * rs, (item_it >> 1) & 1);
    const volatile int32_t* e = s_item + 8 * rs;
    const WorkItem it{e[0], e[1], e[2], e[3], e[4], e[5]};
    mbar_arrive(item_empty + 8 * rs);
    if (it.block < 0) {
      if constexpr (kPingPong) {
        if (c == 0) named_bar_sync(2, 256);
      }
      if constexpr (L::kFp8) q8.flush(kern::fp8_of(p), lane);
      return;
    }

    const Src src = Src::item(p, it);
    auto cur = src.cursor(p, it);
    float o[kNO][4];
#pragma unroll
    for (int n = 0; n < kNO; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
    // The overlapped schedule rescales lazily (softmax.cuh LazyOnlineSoftmax; settled before the
    // epilogue); the serial one eagerly, and so does FP8 (kLazy).
    std::conditional_t<kLazy, kern::LazyOnlineSoftmax, kern::OnlineSoftmax> sm;
    sm.init();
    if constexpr (Src::kMods) src.init_stats(sm, p, it.head, mt, lane);
    // The bias tile of block kv_it (Src::bias_tma: the producer stages it into buffer kv_it % 2): waited
    // for right before the block's logits, released right after them.
    auto bias_tile = [&]() -> uint32_t {
      if constexpr (Src::kStagedBias) {
        if (bias_on) {
          const uint32_t bst = kv_it & 1;
          mbar_wait(bias_full + 8 * bst, (kv_it >> 1) & 1);
          return bias_stage + bst * L::kBiasBuffer;
        }
      }
      return 0u;
    };
    auto release_bias = [&]() {
      if constexpr (Src::kStagedBias) {
        if (bias_on) mbar_arrive(bias_empty + 8 * (kv_it & 1));
      }
    };

    mbar_wait(q_full, item_it & 1);
    // Q is released to the producer as soon as the item's last S GEMM has completed, so that the
    // next item's Q load overlaps this item's last softmax, P V and epilogue.
    bool q_held = true;
    auto release_q = [&](bool last) {
      if (last && q_held) {
        mbar_arrive(q_empty);
        q_held = false;
      }
    };
    int kb = 0, entry = 0;
    bool partial = false;
    if constexpr (!kOverlap) {
      // Serial schedule: S, softmax, P V, one block after the other.
      while (cur.next(kb, partial, entry)) {
        const uint32_t st = kv_it % kStages, ph = (kv_it / kStages) & 1;
        const uint32_t k_tile = base + L::kK + st * L::kKBytes;
        const uint32_t v_tile = base + L::kV + st * L::kVBytes;
        Mask mask;
        src.load(mask, p, kb, partial, entry, mt, lane);
        mbar_wait(k_full + 8 * st, ph);
        float s[kNS][4];
        if constexpr (kPingPong) named_bar_sync(2 + c, 256);
        wg_fence();
        issue_qk<L, E>(s, q_tile, k_tile);
        wg_commit();
        if constexpr (kPingPong) named_bar_arrive(3 - c, 256);
        wg_wait<0>();
        mbar_arrive(k_empty + 8 * st);
        release_q(cur.done());
        reg_fence(s);
        float corr[2];
        const float exp_scale = variant.logits(s, mask, partial, src.score_mod(p, it, kb, mt, lane, bias_tile()));
        release_bias();
        sm.template update<kChains>(s, corr, exp_scale, shift);
        kern::OnlineSoftmax::rescale(o, corr);
        if constexpr (Src::kDropout) src.dropout(p, it, kb, mt, lane, s);
        uint32_t pa[kKP][4];
        kern::pack_p<E>(s, pa);
        mbar_wait(v_full + 8 * st, ph);
        if constexpr (Src::kAnalytic && !L::kFp8) {  // FP8: the V^T pre-pass wrote zeros there
          if (src.keys_inside(kb) < kBlockK) zero_v_rows_past<L>(v_tile, src.keys_inside(kb), 128 * c + t);
        }
        wg_fence();
        issue_pv<L, E>(o, pa, v_tile);
        wg_commit();
        wg_wait<0>();
        reg_fence(o);
        mbar_arrive(v_empty + 8 * st);
        ++kv_it;
      }
    } else {
      // Intra-warpgroup overlap (FlashAttention-3): S_j = Q K_j^T is issued, then
      // O += P_{j-1} V_{j-1}; the softmax of S_j runs while the P V GEMM is in flight, and O is
      // rescaled only once that GEMM has retired.
      // The first block is peeled so that the loop body has no branch around the wgmma
      // issue and wait (ptxas serialises wgmma behind waits in divergent paths, C7518).
      if (cur.next(kb, partial, entry)) {
        uint32_t st_prev = kv_it % kStages, ph_prev = (kv_it / kStages) & 1;
        // The walk ascends, so only its last block can reach past the sample's keys: its P V is
        // the one after the loop (kb_prev; the cursor may move kb past it when it ends).
        [[maybe_unused]] int kb_prev = kb;
        uint32_t pa[kKP][4];
        {
          Mask mask;
          src.load(mask, p, kb, partial, entry, mt, lane);
          mbar_wait(k_full + 8 * st_prev, ph_prev);
          float s[kNS][4];
          if constexpr (kPingPong) named_bar_sync(2 + c, 256);
          wg_fence();
          issue_qk<L, E>(s, q_tile, base + L::kK + st_prev * L::kKBytes);
          wg_commit();
          if constexpr (kPingPong) named_bar_arrive(3 - c, 256);
          wg_wait<0>();
          mbar_arrive(k_empty + 8 * st_prev);
          release_q(cur.done());
          reg_fence(s);
          float corr[2];
          const float exp_scale = variant.logits(s, mask, partial, src.score_mod(p, it, kb, mt, lane, bias_tile()));
          release_bias();
          if constexpr (kLazy) {
            sm.update(s, corr, exp_scale);  // o = 0: no rescale
          } else {
            sm.template update<kChains>(s, corr, exp_scale, shift);
          }
          if constexpr (Src::kDropout) src.dropout(p, it, kb, mt, lane, s);
          kern::pack_p<E>(s, pa);
          ++kv_it;
        }
        while (cur.next(kb, partial, entry)) {
          const uint32_t st = kv_it % kStages, ph = (kv_it / kStages) & 1;
          Mask mask;
          src.load(mask, p, kb, partial, entry, mt, lane);
          mbar_wait(k_full + 8 * st, ph);
          mbar_wait(v_full + 8 * st_prev, ph_prev);
          float s[kNS][4];
          if constexpr (kPingPong) named_bar_sync(2 + c, 256);
          wg_fence();
          issue_qk<L, E>(s, q_tile, base + L::kK + st * L::kKBytes);
          wg_commit();
          issue_pv<L, E>(o, pa, base + L::kV + st_prev * L::kVBytes);
          wg_commit();
          if constexpr (kPingPong) named_bar_arrive(3 - c, 256);
          wg_wait<1>();  // S_j done; P_{j-1} V_{j-1} may still run
          mbar_arrive(k_empty + 8 * st);
          release_q(cur.done());
          reg_fence(s);
          float corr[2];
          bool moved = true;
          const auto mod = src.score_mod(p, it, kb, mt, lane, bias_tile());
          bool fused = false;
          if constexpr (kLazy && Src::kMods && !Src::kDropout && !Src::kPaged) {
            if (fused_softcap && !partial && mod.softcap_only()) {
              // Softcap alone on a full block (SdpaScoreParams::fused_softcap, PERF_LOG v2.77): t and the update in
              // one basic block (Variant::logits' branches keep the 64 MUFU.TANH a burst of their own before the
              // row max), so that row 1's tanh can issue among row 0's exponentials. The same arithmetic as
              // Variant::logits' softcapped path on a full block (its ALiBi and bias terms are none here).
              mod.mod.softcap_t(s, qk_scale);
              release_bias();
              moved = sm.update(s, corr, mod.mod.c2);
              fused = true;
            }
          }
          if (!fused) {
            const float exp_scale = variant.logits(s, mask, partial, mod);
            release_bias();
            if constexpr (kLazy) {
              moved = sm.update(s, corr, exp_scale);
            } else {
              sm.template update<kChains>(s, corr, exp_scale, shift);
              // FP8 (eager): skip the rescale of O when no row's max moved (exact: the factors are 1).
              if constexpr (L::kFp8) moved = kern::OnlineSoftmax::any_moved(corr);
            }
          }
          softmax_before_wait<L>(kb);
          wg_wait<0>();
          reg_fence(o);
          mbar_arrive(v_empty + 8 * st_prev);
          if (moved) kern::OnlineSoftmax::rescale(o, corr);
          // Dropout after the wait, where P_{j-1}'s registers (the in-flight GEMM's A operand) are free:
          // before it, or with the Philox bits drawn before the S GEMM, the (128, 128) consumer spilled more in the loop.
          if constexpr (Src::kDropout) src.dropout(p, it, kb, mt, lane, s);
          kern::pack_p<E>(s, pa);
          st_prev = st;
          ph_prev = ph;
          kb_prev = kb;
          ++kv_it;
        }
        mbar_wait(v_full + 8 * st_prev, ph_prev);
        if constexpr (Src::kAnalytic && !L::kFp8) {  // FP8: the V^T pre-pass wrote zeros there
          if (src.keys_inside(kb_prev) < kBlockK) {
            zero_v_rows_past<L>(base + L::kV + st_prev * L::kVBytes, src.keys_inside(kb_prev), 128 * c + t);
          }
        }
        wg_fence();
        issue_pv<L, E>(o, pa, base + L::kV + st_prev * L::kVBytes);
        wg_commit();
        wg_wait<0>();
        reg_fence(o);
        mbar_arrive(v_empty + 8 * st_prev);
      }
      if constexpr (kLazy) sm.settle(o);
    }
    release_q(true);  // an item without key blocks
    if constexpr (Src::kDropout) src.scale_o(p, o);

    // Epilogue: this warp's 16 rows of the block (packed: rows of G query heads, FwdRows).
    const kern::FwdRows rw = src.rows(p, it);
    const int r0 = 64 * c + 16 * warp;
    if (!Src::kAnalytic && it.slot >= 0) {
      Epilogue::store_split_partial(p, it.slot, rw.rows_valid, r0, frag, o, sm);
    } else if constexpr (L::kFp8) {
      Epilogue::template store_rows<Src::kMods>(p, rw, r0, frag, o, sm, Src::lse_unit(p), &q8);
    } else if constexpr (Src::kMods) {
      // SDPA's sink folded into a copy of the statistics (src.fold_sink, with max_logit): sm keeps the
      // scores' row maxima for the max_logit reduction below.
      kern::OnlineSoftmax sf = sm;
      src.fold_sink(sf, p, it.head, mt, lane, o);
      Epilogue::template store_rows<Src::kMods>(p, rw, r0, frag, o, sf, Src::lse_unit(p));
    } else {
      Epilogue::template store_rows<Src::kMods>(p, rw, r0, frag, o, sm, Src::lse_unit(p));
    }
    // The analytic kernels are built with kMaxLogit and test the pointer (one instantiation).
    if constexpr (kMaxLogit) {
      if (!Src::kAnalytic || p.max_logit != nullptr) Epilogue::max_logit(p, rw, r0, frag, lane, sm);
    }
  }
}

#endif  // __CUDA_ARCH__

// The kernel body of mask source Src (PlanSourceSm90: flex; AnalyticSourceSm90: SDPA;
// AnalyticModSourceSm90: SDPA with score modifiers, sinks and epilogue options).
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
template <int kDqk, int kDv, class E, bool kMaxLogit, bool kOverlap, template <class> class Src>
__device__ __forceinline__ void fwd_sm90_body(const FwdParams& p, const CUtensorMap* tm_q, const CUtensorMap* tm_k,
                                              const CUtensorMap* tm_v, const CUtensorMap* tm_bias = nullptr) {
  using L = FwdSm90Layout<kDqk, kDv, E::kBits / 8>;
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  const uint32_t raw = kern::smem_u32(smem_raw);
  const uint32_t base = (raw + 1023u) & ~1023u;
  int32_t* s_item = reinterpret_cast<int32_t*>(smem_raw + (base - raw) + L::kItem);
  const uint32_t bars = base + L::kBar;
  if (threadIdx.x == 0) {
    mbar_init(bars + 0, 1);                  // q_full: producer arrive + tx
    mbar_init(bars + 8, kConsumerThreads);   // q_empty
    for (int s = 0; s < kStages; ++s) {
      mbar_init(bars + 16 + 8 * s, 1);                                  // k_full
      mbar_init(bars + 16 + 8 * (kStages + s), 1);                      // v_full
      mbar_init(bars + 16 + 8 * (2 * kStages + s), kConsumerThreads);   // k_empty
      mbar_init(bars + 16 + 8 * (3 * kStages + s), kConsumerThreads);   // v_empty
    }
    for (int i = 0; i < 2; ++i) {
      mbar_init(bars + 16 + 8 * (4 * kStages + i), 1);                     // item_full
      mbar_init(bars + 16 + 8 * (4 * kStages + 2 + i), kConsumerThreads);  // item_empty
    }
    if constexpr (Src<L>::kStagedBias) {
      for (int i = 0; i < 2; ++i) {
        mbar_init(base + L::kBiasBars + 8 * i, 1);                      // bias_full: producer arrive + tx
        mbar_init(base + L::kBiasBars + 16 + 8 * i, kConsumerThreads);  // bias_empty
      }
    }
    fence_barrier_init();
  }
  __syncthreads();
  if (threadIdx.x < 128) {
    setmaxnreg_dec<24>();
    if (threadIdx.x == 0) producer<L, Src<L>>(p, tm_q, tm_k, tm_v, tm_bias, base, s_item);
    // Exit here rather than fall through to the kernel's end: when the 24-register warpgroup's
    // path merges with the consumers' (the shared exit), ptxas (nvcc 13.0) caps the consumers'
    // registers near 204 instead of their 240 (the D = 128 overlapped loop then spilled 240 B and
    // serialised its wgmma, C7512); with the exit it does not (kernel_bwd_sm90.cuh, same rule).
    asm volatile("exit;");
  }
  setmaxnreg_inc<240>();
  consumer<L, E, kMaxLogit, kOverlap, Src<L>>(p, base, s_item);
}
#endif

// The kernel. Built for every target; the body exists only for sm_90a (the host checks the
// loaded binary's version before choosing this family: launch_fwd_sm90.cu).
template <int kDqk, int kDv, class E, bool kMaxLogit, bool kOverlap>
__global__ void __launch_bounds__(kThreads, 1)
    flex_fwd_kernel_sm90(const __grid_constant__ FwdParams p, const __grid_constant__ CUtensorMap tm_q,
                         const __grid_constant__ CUtensorMap tm_k, const __grid_constant__ CUtensorMap tm_v) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  fwd_sm90_body<kDqk, kDv, E, kMaxLogit, kOverlap, PlanSourceSm90>(p, &tm_q, &tm_k, &tm_v);
#else
  // No sm_90a code in this image: never launched (the host checks the binary version).
  __trap();
#endif
}

// The SDPA forward (analytic mask): the same kernel over an SdpaFwdParams, max_logit tested at run
// time (one instantiation per dtype and consumer schedule), for each mask source Src:
// AnalyticSourceSm90, the pure-mask calls; AnalyticModSourceSm90, the calls with score modifiers
// and sinks (softcap, ALiBi, the additive bias, sinks, the gate and score_max / score_sum_exp as
// run-time flags of one more instantiation per dtype), so that the pure-mask instantiation keeps
// its code (the modifiers' registers and instructions stay out of its main loop); AnalyticDropSourceSm90,
// the calls with dropout (experimental; with every modifier's flag besides), so that the modifiers'
// instantiation keeps its code in turn. tm_bias: the map of a 16-bit bias the producer stages
// (make_tensor_map_bias_sm90; read only when SdpaBiasParams::chunks is set, else any bytes).
template <int kDqk, int kDv, class E, bool kOverlap, template <class> class Src>
__global__ void __launch_bounds__(kThreads, 1)
    sdpa_fwd_kernel_sm90(const __grid_constant__ SdpaFwdParams p, const __grid_constant__ CUtensorMap tm_q,
                         const __grid_constant__ CUtensorMap tm_k, const __grid_constant__ CUtensorMap tm_v,
                         const __grid_constant__ CUtensorMap tm_bias) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  fwd_sm90_body<kDqk, kDv, E, true, kOverlap, Src>(p, &tm_q, &tm_k, &tm_v, &tm_bias);
#else
  __trap();
#endif
}

// The SDPA forward over paged K/V caches (params.h SdpaPagedFwdSm90Params): the same kernel
// with AnalyticPagedSourceSm90 (the modifiers' source without the bias, K / V boxes from the page tables), max_logit
// tested at run time, the overlapped consumers; (64, 64) and (128, 128), fp16 / bf16 (units
// sdpa_fwd_paged_sm90_d{64,128}.cu). tm_q: q's map, or with packed q (experimental) the template of the per-sample
// maps the producer loads through (AnalyticMaskParams::sample_maps); tm_k / tm_v: the containers' maps (column, row,
// head, page) with boxes of min(page_size, kBlockK) rows, or a side without a table its own map (launch_fwd_sm90.cu).
template <int kDqk, int kDv, class E>
__global__ void __launch_bounds__(kThreads, 1)
    sdpa_fwd_paged_kernel_sm90(const __grid_constant__ SdpaPagedFwdSm90Params p,
                               const __grid_constant__ CUtensorMap tm_q, const __grid_constant__ CUtensorMap tm_k,
                               const __grid_constant__ CUtensorMap tm_v) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  fwd_sm90_body<kDqk, kDv, E, true, true, AnalyticPagedSourceSm90>(p, &tm_q, &tm_k, &tm_v);
#else
  __trap();
#endif
}

// The paged forward with the additive bias (experimental; AnalyticPagedBiasSourceSm90): the kernel above with the
// modifiers' source with the bias, (128, 128) only (unit sdpa_fwd_paged_sm90_d128.cu; the launcher runs every paged
// call with a bias on it, head dims up to 128, the layout's kBytesBias), fp16 / bf16; tm_bias: a staged 16-bit bias's
// map, as sdpa_fwd_kernel_sm90's (read only when SdpaBiasParams::chunks is set, else any bytes).
template <int kDqk, int kDv, class E>
__global__ void __launch_bounds__(kThreads, 1)
    sdpa_fwd_paged_bias_kernel_sm90(const __grid_constant__ SdpaPagedFwdSm90Params p,
                                    const __grid_constant__ CUtensorMap tm_q, const __grid_constant__ CUtensorMap tm_k,
                                    const __grid_constant__ CUtensorMap tm_v,
                                    const __grid_constant__ CUtensorMap tm_bias) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  fwd_sm90_body<kDqk, kDv, E, true, true, AnalyticPagedBiasSourceSm90>(p, &tm_q, &tm_k, &tm_v, &tm_bias);
#else
  __trap();
#endif
}

// The SDPA FP8 forward (experimental; params.h SdpaFp8Params): the pure-mask SDPA kernel
// (AnalyticSourceSm90: causal / bands, padding, packed q / k / o / stats through the sample maps; max_logit tested
// at run time) on FP8 Q, K and the V^T workspace (tm_v: the pre-pass's [B, H_v, D_v, keys] bytes,
// fp8_vt_sm90.cuh), E Float8E4M3 or
// Float8E5M2 (one instantiation each), the consumer schedule overlapped with ping-pong. What
// differs from the 16-bit kernels lives in the roles' FP8 branches: the layout (FwdSm90Layout with
// kElemBytes = 1: 64- or 128-byte Q / K rows, the V^T tile), the k32 wgmma forms (issue_qk,
// issue_pv), P's packing (softmax.cuh pack_p: each thread's own values, with V^T's keys permuted
// to match), the softmax's exponent shift (log2 scale_s), the FP8 output and amaxes (epilogue_fwd.cuh
// Fp8Out).
template <int kDqk, int kDv, class E>
__global__ void __launch_bounds__(kThreads, 1)
    sdpa_fp8_fwd_kernel_sm90(const __grid_constant__ SdpaFp8FwdParams p, const __grid_constant__ CUtensorMap tm_q,
                             const __grid_constant__ CUtensorMap tm_k, const __grid_constant__ CUtensorMap tm_vt) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  static_assert(E::kBits == 8, "sdpa_fp8_fwd_kernel_sm90: FP8 element types");
  fwd_sm90_body<kDqk, kDv, E, true, true, AnalyticSourceSm90>(p, &tm_q, &tm_k, &tm_vt);
#else
  __trap();
#endif
}

}  // namespace flashspan::kern90
