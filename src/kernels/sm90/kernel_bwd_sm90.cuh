// Flex attention backward kernel for sm_90a (Hopper): dK/dV (and the dQ contribution) of the
// plan's K2Q walk with TMA + wgmma + warp specialization.
//
// Algorithm: FlashAttention-2/3 backward (Dao 2023, Alg. 2; Shah et al. 2024, sec. 3) over the
// plan's backward view (tile 64 query rows x 128 keys, payload rows = queries, cols = keys),
// for plans whose consumer is consumer_for(90) and head dims Dqk = Dv = kD in {64, 128}
// (and, on the 64 x 64 tile of (192, 128) / (256, 256), the column-split consumers described
// at the end of this comment; producer, dQ writer, dQ order warp, scheduler, deterministic
// order, pre- and postprocess are the same):
//   per (key block, kv head, batch) work item, for every (query head of the kv group, query
//   block) pair of its K2Q walk (kernels/common/k2q_walk.cuh):
//     S^T = K Q^T, P^T = exp2(S^T scale log2(e) - lse2)   (masked: 0)
//     dP^T = V dO^T, dS^T = P^T (dP^T - D)
//     dV += P^T dO, dK += dS^T Q                          (registers, whole item)
//     dQ_part = dS K                                      (fp32, added to dq_accum in global
//                                                          memory by the bulk copy engine)
//   then dK (times the softmax scale) and dV are written, or, for a piece of a split task, added
//   to the split schedule's fp32 slot (bwd_split.cuh converts it).
// The preprocess (D = rowsum(dO O) - dlse, lse2 = LSE log2(e)) and the postprocess (dq = scale
// dq_accum, the split convert) are the shared kernels of kernels/common (launch_bwd_common.h).
//
// CTA = 3 warpgroups (384 threads), persistent (one CTA per SM, 1 per SM by shared memory):
//   WG0 warp 0, the producer: takes the CTA's work items (the split schedule's item list through
//     the atomic counter when p.split_schedule is set, otherwise tasks / grid cells blockIdx.x,
//     blockIdx.x + gridDim.x, ...), hands each to the other roles through a 2-entry shared ring,
//     loads K and V of the key block (TMA, once per item) and, for each step, Q and dO of the
//     query block (TMA, a kStages ring) and the step's 64 lse2 / D values and its (head, query
//     block, payload) into shared memory (all 32 lanes: plain loads and stores).
//   WG0 warp 1, the dQ writer: per step, adds the 64 x kD fp32 dQ tile that the consumers left
//     in shared memory to the step's tile of dq_accum with one bulk reduce-add
//     (cp.reduce.async.bulk .add.f32, 32 KB). dq_accum holds one such tile per (query head,
//     query block), in the consumers' register order (dq_tile_offset_sm90), so that the tile is
//     one contiguous block in shared and global memory; flex_bwd_dq_convert_kernel_sm90 writes dq.
//     (Per-row reductions into a [Hq, total_q, kD] accumulator, 64 bulk operations a step, held
//     the kernel at 466 TFLOP/s on the H200 against 589 without any dQ reduction: PERF_LOG v1.4.)
//   Deterministic (p.deterministic, bitwise reproducible across runs and GPUs): the split
//     schedule in its deterministic form (bwd_split.cuh): its tasks are every grid cell (key
//     block, kv head) in descending key-block order, heads fastest (cell_descending; or in bands
//     head by head, BwdParams::det_band, experimental); a walk
//     far longer than the mean (split_rule.h, a cut of the plan alone) is cut into items of
//     disjoint step ranges, each of which adds its dK / dV partial sums into a slot of its own
//     (zeroed, so the one addition is exact) that the convert sums in item order; the CTAs take
//     the items in snake waves (TileScheduler::next_cell_item: CTA i's items rise in index) when the
//     plan's walks are causal-like, else claim them in list order (TileScheduler::claim;
//     BwdParams::det_claim, SplitSchedule::kUneven);
//     each walk runs in ascending query-block order (K2QWalkAscending, whose seek positions a
//     split item without walking its first steps). The writer adds a dQ tile only once the tile's counter
//     (p.dq_sem) equals the number of key blocks after its own in the tile's Q2K row
//     (dq_order_rank, computed ahead by warp 2 of WG0, the dQ order warp, which walks the items'
//     K2Q pairs as the producer does), then waits for the addition to be written and increments
//     the counter with a release (the bulk completion makes the addition visible to the writer's
//     thread only; the release, to the next writer's acquire: BwdParams::det_relaxed). Each tile is
//     added in two halves (BwdParams::dq_chunks), each by a writer warp of its own (warps 1 and 3 of
//     WG0) with its own counter, so one half's turn, write and release overlap the other's (PERF_LOG
//     v2.64). So every tile sums its contributions in descending key-block order,
//     whichever item of key block kb holds the tile's step (the items of kb cover disjoint
//     ranges of its pairs, so the tile gets exactly one addition from kb) and whichever CTA runs
//     it. This is the order in which causal-like walks reach a query block anyway (a key block's
//     walk starts at its diagonal, so larger key blocks arrive first), as FlashAttention-3's
//     deterministic causal backward orders it.
//     No deadlock: a CTA runs its items in rising list order, and every CTA is resident (one
//     per SM, the persistent grid). Take the lowest-numbered unfinished item X (finished: its
//     writer has released its last addition). X's CTA has finished its earlier (lower) items, so
//     it is running X (claimed in list order: while X is unclaimed so is every later item, every
//     claimed item is finished, and a free CTA claims X next; once claimed, its CTA runs it). X's
//     steps wait only on additions of larger key blocks of X's head, whose items precede X in the
//     list (each head's cells descending, whatever the band) and are finished; its producer and consumers
//     wait only on roles of their own CTA. So X finishes.
//     Unordered (FLASHSPAN_SM90_BWD_DET_UNORDERED=1, a measurement switch, not deterministic):
//     p.dq_sem = nullptr: the same schedule with neither the counter waits nor the dQ order warp.
//   WG1, WG2, the consumers (setmaxnreg 240): warpgroup c owns keys 64c .. 64c+63 of the key
//     block, so S^T / dP^T are m64n64 accumulators (rows = keys, cols = queries) and dK / dV
//     m64n{kD} accumulators that stay in registers for the whole item. P^T and dS^T feed the
//     dV / dK GEMMs from registers (wgmma RS: an m64n64 accumulator's registers are the A
//     fragments of four k16 steps, HOPPER_BRIEF.md 1.3); dS^T also goes to shared memory
//     (bf16/fp16, [128 keys][64 queries], 128B-swizzled), from which both warpgroups read dS as
//     the M-major A operand of dQ = dS K (warpgroup c: dQ columns c kD/2 .. (c+1) kD/2 - 1,
//     m64n{kD/2}).
//   Synchronisation: mbarriers (kv_full / kv_empty, qdo_full[s] / qdo_empty[s], dq_full /
//   dq_empty, item_full[i] / item_empty[i]) and one named barrier between the consumer
//   warpgroups (dS complete before the dQ GEMM; dS is double-buffered, so one barrier a step).
//   Who waits (PERF_LOG v2.63, found with cuda-gdb): mbarrier.try_wait is a per-thread test, so the
//   lanes of one warp may pass the same wait at different times. A thread waits on a ring's barrier
//   only where the barrier cannot complete its next phase of the same parity without an arrival of
//   that thread: a thread one phase late would otherwise find the phase it waits for completed twice,
//   test the parity of the next, incomplete phase and wait forever. The consumers' waits (each thread
//   arrives on the opposite barrier itself), the producer lanes' qdo_empty (each lane's own qdo_full
//   arrival gates the stage's next use) and the writer's and dQ order warp's item_full (lane 0 releases
//   the entry only after the __syncwarp that follows every lane's read) are of that kind; item_empty
//   and rank_empty are waited on by lane 0 alone, which writes the entry (lanes 1-31 of the producer
//   once waited on item_empty too and hung, one phase late, after lane 0 had handed out the last item).
//
// Payload (payload_layout.h, kM16N64Frag: element (query r, key c) of the 64 x 128 tile lives in
// lane 4 (r % 8) + (c % 8) / 2 of 16-row sub-tile (r / 16, c / 64), bit 4 ((c % 64) / 8) +
// 2 ((r % 16) / 8) + c % 2). The consumer's accumulator is the transposed tile (rows = keys), so
// a thread needs the words of other lanes: for its keys 64c + 16w + g (+8) and queries
// 8j + 2q (+1) (w = warp of the warpgroup, g = lane / 4, q = lane % 4) those are the 8 words
// (j / 2) 64 + 32c + 8q + 4e + g / 2 (e = query parity), each tested at bit
// 8w + (g % 2) + 4 (key half) + 2 (j % 2): 8 coalesced loads and 32 bit tests a partial step.
//
// Rows and keys outside the sample: a block holding them is never full, so the payload masks
// them (P = 0, dS = 0); the step's lse2 / D of rows past the sample are +inf / 0 (no NaN can
// enter from another sample's or unwritten workspace rows); dQ rows past the sample are not
// added, dK / dV rows past the sample not written.
//
// Shared memory (1024-byte aligned, 128B-swizzled tiles as TMA writes them): K, V (128 rows x
// kD, kD / 64 slabs of 16 KB), kStages x Q, dO (64 rows x kD, slabs of 8 KB), 2 x dS^T (16 KB),
// the fp32 dQ tile (64 x kD floats in register order: the consumers' 16-byte stores are
// conflict-free), the step statistics, infos, the item ring and the barriers: 199 KB.
// wgmma descriptors (SBO = 1024 = 8 rows x 128 B everywhere):
//   S^T, dP^T (SS, both K-major): A = K / V rows 64c.., B = Q / dO; k16 step +32 B in a slab.
//   dV, dK (RS, B = dO / Q N-major): LBO = 8 KB (Q slab stride), k16 step = 16 query rows = 2 KB.
//   dQ (SS, A = dS M-major, B = K N-major): k16 step = 16 keys = 2 KB; B = K slab c.
//
// Column-split consumers (bwd_consumer_cols; (192, 128) and (256, 256), tile 64 x 64, as
// FlashAttention-3's hdim-192/256 backward splits dK / dV over its MMA warpgroups): one
// warpgroup holding dK (64 x Dqk) and dV (64 x Dv) would need 160 / 256 accumulator registers,
// so warpgroup c owns half the columns of each (ColPieces: 48 + 32 / 64 + 64 registers) and
// the dQ columns of the same half (48 / 64 registers, live only during the dQ GEMM). A step:
// S = Q K^T and dP = dO V^T for keys 32c .. 32c + 31 (m64n32, rows = queries: the plan's own
// orientation, so the payload is one word a thread, bits 16c + 4j + r), P and dS of those keys
// into shared memory (16-bit, query rows of 64 keys, 128B-swizzled, double-buffered), a named
// barrier, then dQ = dS K (SS, A K-major, B = K N-major), dV += P^T dO and dK += dS^T Q (SS,
// A = P / dS M-major, B = dO / Q N-major) on the warpgroup's columns; with one Q / dO stage
// ((256, 256)) dV and dK first and the stage released before dQ, so that the next step's Q / dO
// load runs under dQ (PERF_LOG v2.11: S=32768 H=16 causal 296 -> 442 TFLOP/s). Shared memory: (192, 128)
// K 24 + V 16 + 2 x (Q 24 + dO 16) + 2 x (P, dS 16) + dQ 48 KB = 200 KB; (256, 256) one Q / dO
// stage: 32 + 32 + 64 + 32 + 64 KB = 224 KB (of 227).
//
// Wide tile (kBq = 128; (64, 64) plans whose consumer has tile_sm90.h's kTileSm90Wide64, 128 query
// rows x 128 keys, as the seed system's and FlashAttention-3's sm90 backward for D <= 64;
// sm90::bwd_wide64_enabled: by default, FLASHSPAN_SM90_BWD_WIDE64=0 keeps 64 x 128; PERF_LOG v2.2). The key-split consumers with 128 queries a step:
// warpgroup c still owns keys 64c .. 64c + 63, so S^T and dP^T are m64n128 accumulators (64
// registers each), dV += P^T dO and dK += dS^T Q are m64n64 RS over k = 128 queries (8 k16 steps
// from the packed P^T / dS^T registers), and dS^T goes to shared memory as two 64-query slabs
// ([128 keys][64 queries] each, 128B-swizzled, the 64-row tile's layout twice). dQ (128 x 64) is
// split by rows: warpgroup c computes queries 64c .. 64c + 63, all 64 columns (m64n64, A = dS^T
// slab c M-major, B = K N-major, 8 k16 steps), so the dQ tile (128 x 64 fp32, 32 KB, one bulk
// reduce-add a step as at D = 128) is in the register order of dq_tile_offset_sm90<64, 128>. The
// payload words are those of the 64-row tile for j = 0 .. 15 (16 loads a partial step). Per step
// and warpgroup: 4 + 4 + 8 + 8 + 8 wgmma k16 instructions of N = 128 / 128 / 64 / 64 / 64 for
// twice the 64-row tile's FLOPs, with the same barriers, one statistics / payload / dQ hand-off.
// Registers (ptxas, nvcc 13.0): consumers at most R229 of their 232 after setmaxnreg (S^T, dP^T
// 128 + dK, dV 64 live across the exp), no spill in the consumer path (the kernel's 56-byte stack
// frame is the 40-register producer's, as in the other kernels). Shared memory: K 16 + V 16 +
// 2 x (Q 16 + dO 16) + 2 x dS^T 32 + dQ 32 + 2 KB statistics + 4 KB payload = 199 KB.
// Only the sm90 backward runs this tile (the sm80 backward's traits assume 64 query rows), so a
// plan gets it only while this backward takes every backward call (family.cpp consumer_sm90).
//
// Three consumer warpgroups (kWideTile for (192, 128): tile_sm90.h kTileSm90Wide192, 64 query rows x
// 96 keys; sm90::bwd_wide192_enabled, by default; bwd_consumer_t3): FlashAttention-3's hdim-192
// backward schedule. The column-split kernel on 64 x 64 is L2-bound (each step reads 40 KB of Q / dO
// and reduce-adds 48 KB of fp32 dQ for 64 keys); 96 keys a step serve 1.5x the FLOPs with the same
// bytes. 512 threads (setmaxnreg 32 / 160): warpgroup c computes S, dP for keys 32c .. 32c + 31,
// dQ columns 64c .. 64c + 63, dK^T rows (head-dim columns) 64c .. 64c + 63 and, c < 2, dV^T rows
// 64c ..: dK / dV transposed (m64n96, N = keys) so that three warpgroups of M = 64 cover Dqk = 192
// and Dv = 128. One P / dS buffer (two would not fit: K 36 + V 24 + 2 x (Q 24 + dO 16) + P, dS 32 +
// dQ 48 KB = 220 KB), so a second named barrier per step keeps a step's P / dS stores behind every
// warpgroup's previous GEMMs. The epilogue writes dK / dV from the transposed accumulators with
// 16-bit stores (once per item). The payload of the 96-key tile: payload_layout.h's sub-tiles of
// 64 columns, the second with 32.
#pragma once

#include <cuda.h>

#include <cstdint>
#include <type_traits>
#include <utility>

#include "kernels/common/analytic_mask.h"
#include "kernels/common/analytic_seqlen.cuh"
#include "kernels/common/block_range.cuh"
#include "kernels/common/bwd_prepost.cuh"
#include "kernels/common/k2q_walk.cuh"
#include "kernels/common/kv_addr.cuh"
#include "kernels/common/payload_layout.h"
#include "kernels/common/ptx.cuh"
#include "kernels/common/seqlen_info.cuh"
#include "kernels/common/split_rule.h"
#include "kernels/common/tile_scheduler.cuh"
#include "kernels/params.h"
#include "kernels/sm90/bwd_trace_sm90.cuh"
#include "kernels/sm90/ptx_sm90.cuh"
#include "kernels/sm90/sample_maps_sm90.cuh"
#include "kernels/sm90/tile_sm90.h"

namespace flashspan::kern90 {

// The register split of the key-split consumers in a step without score modifiers, dropout or FP8 (a kernel
// template parameter, launch_sm90.h bwd_gemm_order): kBwdOrder240 runs the consumers at 240 registers, the producer
// warpgroup at 24, with the warpgroup index uniform (the wgmma descriptors on the uniform datapath: 47 fewer
// instructions a step at D = 128, no R2UR); the default of the (128, 128) kernels since PERF_LOG v2.79 (+3 % on an
// H100). 0: 40 / 232 (since v2.20), the (64, 64) wide tile's (kBwdOrder240 measured 7-10 % slower there). The
// GEMMs' order is the same either way (v2.78's dV issued behind dP^T and dK before the dS^T barrier measured no
// faster: v2.79).
inline constexpr int kBwdOrder240 = 4;
template <int kOrder>
inline constexpr bool kBwdOrderRegs240 = (kOrder & kBwdOrder240) != 0;
// Three experimental steps of the pure-mask key-split consumers (FLASHSPAN_EXPERIMENTAL=1, launch_sm90.h
// bwd_gemm_order; PERF_LOG v2.80, not yet run on a GPU): kBwdOrderEarlyDq (on top of kBwdOrder240) issues dQ right after the dS^T barrier, behind the running dV
// (FlashAttention-3's and the seed system's order: no wait for dV in between); kBwdOrderLateDk leaves the step's dK
// (A from the dS^T buffer) running into the next step -- its wait, and the release of the step's Q / dO stage, come
// with the next step's S^T wait -- so that the dQ stores, the step's end and the next step's S^T / dP^T issue run
// under it (on top of kBwdOrder240 at (128, 128), alone on the (64, 64) wide tile's 232 registers).
// kBwdOrderDeferDk goes further: the step's dK is issued in the next step, behind its S^T / dP^T, so that it runs
// while that step forms P^T and dS^T (the tensor pipe's longest idle phase); the next step releases the Q / dO stage
// before it issues dV.
inline constexpr int kBwdOrderEarlyDq = 8;
inline constexpr int kBwdOrderLateDk = 16;
inline constexpr int kBwdOrderDeferDk = 32;
// The kernels that have the kBwdOrder240 variant (the launchers' one rule): the pure-mask (128, 128) key-split tile.
template <int kD, int kDv, bool kWideTile>
inline constexpr bool kHasBwdOrder240 = kD == 128 && kDv == 128 && !kWideTile;
// The orders of the kBwdOrder240 kernels (launch_sm90.h bwd_gemm_order_128): for_bwd_order240(order, f) calls
// f(std::integral_constant<int, o>{}) for the one that equals order (none for 0), so that each launcher names its
// kernels once: order 4 and the experimental 12, 20, 28, 36, 44.
template <class F>
__host__ void for_bwd_order240(int order, F&& f) {
  [&]<int... kO>(std::integer_sequence<int, kO...>) {
    ((order == kO ? f(std::integral_constant<int, kO>{}) : void()), ...);
  }(std::integer_sequence<int, kBwdOrder240, kBwdOrder240 | kBwdOrderEarlyDq, kBwdOrder240 | kBwdOrderLateDk,
                          kBwdOrder240 | kBwdOrderEarlyDq | kBwdOrderLateDk, kBwdOrder240 | kBwdOrderDeferDk,
                          kBwdOrder240 | kBwdOrderEarlyDq | kBwdOrderDeferDk>{});
}
// The kernels that have kBwdOrderLateDk / kBwdOrderDeferDk alone: the (64, 64) wide tile.
template <int kD, int kDv, bool kWideTile>
inline constexpr bool kHasBwdOrderLateDkWide = kD == 64 && kDv == 64 && kWideTile;

// Shared-memory layout and tile of the kernel for head dims (kDqk, kDv): the tile is the plan's
// (tile_sm90.h; kWideTile: the wide tile of those dims, which only this backward runs).
// 64 x 128 (Dqk = Dv in {64, 128}): the key-split consumers (bwd_consumer); 64 x 64 ((192, 128),
// (256, 256)): the column-split consumers (bwd_consumer_cols); wide, (64, 64): 128 x 128
// (kTileSm90Wide64), the key-split consumers with 128 query rows a step (see "Wide tile" in the
// header comment); wide, (192, 128): 64 x 96 (kTileSm90Wide192), the three-warpgroup consumers
// with dK / dV transposed (bwd_consumer_t3, "Three consumer warpgroups" below).
template <int kDqk, int kDv = kDqk, bool kWideTile = false>
struct BwdSm90Layout {
  static_assert(sm90::bwd_kernel_head_dims_sm90(kDqk, kDv), "sm90 backward: head dims (64, 64), (128, 128), (192, 128) or (256, 256)");
  static constexpr int kD = kDqk;
  static constexpr int kBlockQ = sm90::tile_sm90(kDqk, kDv, kWideTile).bwd_bq;  // 64, or 128 (wide, (64, 64))
  static constexpr int kBlockK = sm90::tile_sm90(kDqk, kDv, kWideTile).bwd_bk;  // 128, 64 for (192, 128) / (256, 256), 96 (wide (192, 128))
  static constexpr bool kWide = kBlockQ == 128;                                 // the wide tile of (64, 64)
  static constexpr bool kColSplit = kBlockK == 64;                             // the column-split consumers
  static constexpr bool kT3 = kBlockK == 96;                                   // the three-warpgroup consumers
  static_assert(kWideTile == (kWide || kT3), "sm90 backward: wide tiles exist for (64, 64) and (192, 128) only");
  static_assert((kBlockQ == 64 && (kBlockK == 128 || kColSplit || kT3)) || (kWide && kBlockK == 128),
                "the consumer layouts below assume 64 x 128, 64 x 64, 64 x 96 or the wide 128 x 128");
  static_assert(kColSplit || kT3 || kDqk == kDv, "the key-split consumers need Dqk = Dv");
  // Q / dO stages: 2, or 1 for (256, 256) (two stages of its 64 KB Q + dO do not fit beside K, V,
  // the P / dS buffers and the 64 KB dQ tile).
  static constexpr int kStages = kDqk == 256 ? 1 : 2;
  // A producer warpgroup and two consumer warpgroups, or three (kT3).
  static constexpr int kThreads = kT3 ? 512 : 384;
  static constexpr int kConsumerThreads = kThreads - 128;
  // Registers a thread after setmaxnreg, within the CTA's pool: the launch's registers a thread (168
  // for 384 threads: 65536 / 384 rounded down to a multiple of 8; 128 for kT3's 512) times its
  // threads. 40 x 128 + 232 x 256 = 64512 = 168 x 384 (kT3: 32 x 128 + 160 x 384 = 65536): a split that
  // asks for more never completes its setmaxnreg.inc (32 / 240 did: the kernel failed, PERF_LOG v2.20).
  // 24 / 240 (FlashAttention-3's) fits and lets the consumers issue dQ behind a running dV, but the
  // 24-register producer spills 500-650 B and it measured no faster (D = 64: 5 % slower, v2.20).
  static constexpr int kProducerRegs = kT3 ? 32 : 40;
  static constexpr int kConsumerRegs = kT3 ? 160 : 232;
  static constexpr int kLaunchRegs = kT3 ? 128 : 168;
  static_assert(128 * kProducerRegs + kConsumerThreads * kConsumerRegs <= kThreads * kLaunchRegs,
                "sm90 backward: setmaxnreg beyond the CTA's register pool");
  static constexpr int kSlabs = kDqk / 64;   // 64-column slabs of K and Q
  static constexpr int kSlabsV = kDv / 64;   // of V and dO
  static constexpr int kSlabK = kBlockK * 128;  // kBlockK keys x 64 16-bit columns
  static constexpr int kSlabQ = kBlockQ * 128;  // 64 query rows x 64 16-bit columns
  static constexpr int kTileK = kSlabs * kSlabK;
  static constexpr int kTileV = kSlabsV * kSlabK;
  static constexpr int kTileQ = kSlabs * kSlabQ;
  static constexpr int kTileDO = kSlabsV * kSlabQ;
  static constexpr int kDqFloats = kBlockQ * kDqk;   // the fp32 dQ tile
  static constexpr int kDqBytes = kDqFloats * 4;
  // dQ columns of one consumer warpgroup: half of them (64-row tiles), or all of them for its 64 of
  // the wide tile's 128 query rows.
  static constexpr int kDqN = kWide ? kDqk : kDqk / 2;
  static constexpr int kK = 0;
  static constexpr int kV = kK + kTileK;
  static constexpr int kQ = kV + kTileV;             // [kStages]
  static constexpr int kDO = kQ + kStages * kTileQ;  // [kStages]
  static constexpr int kDS = kDO + kStages * kTileDO;  // [kDsBufs] dS^T (key split) or P, dS (column split, kT3)
  // Key split: dS^T, kBlockQ / 64 slabs of kBlockK keys x 64 queries (128 B rows). Column split:
  // P then dS, each 64 query rows x 128 B. kT3: P then dS, each 64 query rows x 96 keys as two
  // slabs of 64 keys (the second half used), 16 KB; one buffer (two would not fit beside the rest).
  static constexpr int kXSlab = kBlockQ * 128;
  static constexpr int kXBytes = kT3 ? 2 * kXSlab : kXSlab;
  static constexpr int kDsSlab = kBlockK * 128;
  static constexpr int kDSBytes = (kColSplit || kT3) ? 2 * kXBytes : (kBlockQ / 64) * kDsSlab;
  static constexpr int kDsBufs = kT3 ? 1 : 2;
  static constexpr int kDQ = kDS + kDsBufs * kDSBytes;
  static constexpr int kStat = kDQ + kDqBytes;  // [kStages][2][64] fp32: lse2, D
  static constexpr int kPayBytes = 4 * payload_words(kBlockQ, kBlockK);  // one partial block's payload (1 KB / 512 B)
  static constexpr int kPay = kStat + kStages * 2 * kBlockQ * 4;  // [kStages] payload of a partial step
  static constexpr int kInfo = kPay + kStages * kPayBytes;         // [kStages] int4 {h, qb, payload, -}
  static constexpr int kDqInfo = kInfo + kStages * 16;              // int64: the step's dq_accum tile
  static constexpr int kRank = kDqInfo + 16;                         // [2] int32: the dQ order ring
  static constexpr int kItem = kRank + 16;                           // [2][8] int32: the item ring
  static constexpr int kBar = kItem + 2 * 8 * 4;
  // kv_full, kv_empty, qdo_full[kStages], qdo_empty[kStages], dq_full, dq_empty, item_full[2], item_empty[2],
  // rank_full[2], rank_empty[2], info_full[kStages]
  static constexpr int kNumBars = 2 + 2 * kStages + 2 + 4 + 4 + kStages;
  static constexpr int kUsed = kBar + 8 * kNumBars;
  static constexpr int kBytes = kUsed + 1024;  // + slack to align the dynamic base to 1024
  static_assert(kBytes <= 232448, "sm90 backward: more shared memory than an sm_90 block may have (227 KB)");
  // SDPA's staged bias (the score modifiers' kernels, Src::kStageBias; kernel_bwd_mods_sm90.cuh): one
  // step's kBlockQ x kBlockK tile after the rest, each consumer warp's kBlockQ queries x 16 keys
  // (SdpaBiasFrag::stage_transposed); those kernels launch with kBytesBias. The (128, 128) softcap kernel keeps
  // its 1 - t^2 (32 fp16 a thread, kBlockQ x 32 B a warp) in the same regions.
  static constexpr int kBiasStage = (kUsed + 127) / 128 * 128;
  static constexpr int kBiasWarpBytes = kBlockQ * 16 * 2;
  static constexpr int kBytesBias = kBiasStage + (kConsumerThreads / 32) * kBiasWarpBytes + 1024;
  // Barrier addresses relative to kBar.
  static constexpr int kKvFull = 0, kKvEmpty = 8, kQdoFull = 16, kQdoEmpty = kQdoFull + 8 * kStages;
  static constexpr int kDqFull = kQdoEmpty + 8 * kStages, kDqEmpty = kDqFull + 8;
  static constexpr int kItemFull = kDqEmpty + 8, kItemEmpty = kItemFull + 16;
  static constexpr int kRankFull = kItemEmpty + 16, kRankEmpty = kRankFull + 16;
  // info_full[st]: the producer's lane 0 has written the step's info (s_info[st]), before its Q / dO
  // land (qdo_full): the consumers read the next step's (h, qb) from it (Src::kStageBias).
  static constexpr int kInfoFull = kRankEmpty + 16;
};

// Column pieces of a head dimension kD in {128, 192, 256} that consumer warpgroup c of the
// column-split kernels owns (dK, dV and dQ columns): kD / 2 columns as one or two wgmma N, each
// starting on a 64-column slab or, for N = 32, also 32 columns into one (an N-major B operand
// cannot start inside a 128-byte swizzle row for a wider N):
//   128: [64c, 64c + 64);  192: [128c, 128c + 64) and [64 + 32c, 96 + 32c);  256: [128c, 128c + 128).
// The warpgroup's accumulator holds piece 0 then piece 1 (kD / 16 n8 blocks).
template <int kD>
struct ColPieces {
  static_assert(kD == 128 || kD == 192 || kD == 256, "column pieces of head dim 128, 192 or 256");
  static constexpr int kN0 = kD == 256 ? 128 : 64;
  static constexpr int kN1 = kD == 192 ? 32 : 0;
  static_assert(kN0 + kN1 == kD / 2, "each warpgroup owns half the columns");
  int c;
  __host__ __device__ __forceinline__ int off0() const { return (kD == 128 ? 64 : 128) * c; }
  __host__ __device__ __forceinline__ int off1() const { return 64 + 32 * c; }
  // Column of the warpgroup's n8 block n (0 .. kD / 16 - 1).
  __host__ __device__ __forceinline__ int operator()(int n) const {
    return n < kN0 / 8 ? off0() + 8 * n : off1() + 8 * (n - kN0 / 8);
  }
};

// The columns 8 n of a whole-width accumulator (the key-split kernels' dK / dV).
struct ColsWhole {
  __host__ __device__ __forceinline__ int operator()(int n) const { return 8 * n; }
};

// A work item as the producer hands it to the other roles: key block kb (sample-local) of kv
// head hkv of sample b, `steps` (query head, query block) pairs of its K2Q walk from pair `begin`;
// slot >= 0 for a piece of a split task. kb < 0 ends the CTA.
struct BwdItem {
  int kb, hkv, b, begin, steps, slot;
};

// Float index of dQ element (query row r, column d) inside a kBq x kD dq_accum tile: the
// consumers' register order, so that each thread stores its accumulators dq[j][0..3] as one
// float4 (16-byte stores, conflict-free).
//   kBq = 64: warpgroup c's thread t stores n8 block j of its columns at
//     ((c * kD / 16 + j) * 128 + t) * 4; thread t = 32 w + 4 g + qd of warpgroup c holds rows
//     16 w + g (+8), columns c kD / 2 + 8 j + 2 qd (+1) (the m64n{kD/2} accumulator,
//     HOPPER_BRIEF.md 1.3).
//   kBq = 128 (the wide tile): warpgroup c holds query rows 64 c + 16 w + g (+8), every column
//     8 j + 2 qd (+1) (m64n{kD}), stored at ((c * kD / 8 + j) * 128 + t) * 4.
template <int kD, int kBq = 64>
__host__ __device__ __forceinline__ int dq_tile_offset_sm90(int r, int d) {
  static_assert(kBq == 64 || kBq == 128, "dQ tiles of 64 or 128 query rows");
  if constexpr (kBq == 64) {
    const int w = r >> 4, g = r & 7, hi = (r >> 3) & 1;
    const int c = d / (kD / 2), j = (d % (kD / 2)) >> 3, qd = (d & 7) >> 1, e = d & 1;
    return ((c * (kD / 16) + j) * 128 + 32 * w + 4 * g + qd) * 4 + 2 * hi + e;
  } else {
    const int c = r >> 6, w = (r >> 4) & 3, g = r & 7, hi = (r >> 3) & 1;
    const int j = d >> 3, qd = (d & 7) >> 1, e = d & 1;
    return ((c * (kD / 8) + j) * 128 + 32 * w + 4 * g + qd) * 4 + 2 * hi + e;
  }
}

#if defined(__CUDA_ARCH__)

// An m64n{8 kN8} accumulator (rows = keys, cols = queries) as the A fragments of kN8 / 2 k16
// steps (queries 16kk .. 16kk + 15), packed to 16 bit (HOPPER_BRIEF.md 1.3).
template <class E, int kN8>
__device__ __forceinline__ void pack_a_frag(const float (&s)[kN8][4], uint32_t (&a)[kN8 / 2][4]) {
#pragma unroll
  for (int kk = 0; kk < kN8 / 2; ++kk) {
    a[kk][0] = kern::pack2<E>(s[2 * kk][0], s[2 * kk][1]);
    a[kk][1] = kern::pack2<E>(s[2 * kk][2], s[2 * kk][3]);
    a[kk][2] = kern::pack2<E>(s[2 * kk + 1][0], s[2 * kk + 1][1]);
    a[kk][3] = kern::pack2<E>(s[2 * kk + 1][2], s[2 * kk + 1][3]);
  }
}

template <int kN>
__device__ __forceinline__ void zero_frag(float (&d)[kN][4]) {
#pragma unroll
  for (int i = 0; i < kN; ++i) d[i][0] = d[i][1] = d[i][2] = d[i][3] = 0.0f;
}

// ---------------------------------------------------------------------------
// Tile scheduler of the backward producer: the CTA's next work item.
// ---------------------------------------------------------------------------

// Steps of task (kb, hkv, b): the K2Q lists of the kv group's query heads (bwd_split.cuh counts
// the same).
__device__ __forceinline__ int bwd_task_steps(const BwdParams& p, int kb, int hkv, int b) {
  const int64_t gk = int64_t(__ldg(p.view.k_block_start + b)) + kb;
  int n = 0;
  for (int h = hkv * p.group_size; h < (hkv + 1) * p.group_size; ++h) {
    const int64_t r = int64_t(p.mask_per_head ? h : 0) * p.view.num_k_blocks + gk;
    n += kern::BlockCursor::row(p.view.k2q_partial_ptr, p.view.k2q_partial_qb, p.view.k2q_full_ptr,
                                p.view.k2q_full_runs, r)
             .remaining();
  }
  return n;
}

// Item `item_it` of this CTA from the shared tile scheduler (common/tile_scheduler.cuh: split
// items, grid cells or tasks; deterministic: split items over the descending cells), asked by
// lane 0 and broadcast to the warp, with its step count.
__device__ __forceinline__ BwdItem next_bwd_item(const BwdParams& p, uint32_t item_it, int lane) {
  kern::WorkItem w = kern::TileScheduler::none();
  if (lane == 0) {
    const kern::TileScheduler sched = kern::TileScheduler::backward(p);
    // Deterministic: snake waves, or claimed in list order (BwdParams::det_claim; by default when the
    // scan kernel found the walks uneven).
    // (The header exists only with the split schedule, which every deterministic call has.)
    const bool snake = p.deterministic && !kern::split_det_claims(p.det_claim, sched.hdr[SplitSchedule::kUneven]);
    w = snake ? sched.next_cell_item(item_it) : sched.next(item_it);
  }
  w.block = __shfl_sync(0xffffffffu, w.block, 0);
  w.head = __shfl_sync(0xffffffffu, w.head, 0);
  w.batch = __shfl_sync(0xffffffffu, w.batch, 0);
  w.begin = __shfl_sync(0xffffffffu, w.begin, 0);
  w.count = __shfl_sync(0xffffffffu, w.count, 0);
  w.slot = __shfl_sync(0xffffffffu, w.slot, 0);
  BwdItem it{w.block, w.head, w.batch, w.begin, 0, w.slot};
  if (it.kb >= 0) it.steps = max(0, min(bwd_task_steps(p, it.kb, it.hkv, it.b) - w.begin, w.count));
  return it;
}

// Deterministic order of the dQ tile (query head h, local query block qb of sample b): the
// number of key blocks after kb (larger index) in the tile's Q2K row, i.e. how many additions
// precede kb's when the key blocks add in descending order. One warp (all lanes); the row's
// partial entries and full runs are read in parallel.
__device__ __forceinline__ int dq_order_rank(const BwdParams& p, int h, int b, int qb, int kb, int lane) {
  const int64_t r = int64_t(p.mask_per_head ? h : 0) * p.view.num_q_blocks + __ldg(p.view.q_block_start + b) + qb;
  int n = 0;
  const int i1 = __ldg(p.view.q2k_partial_ptr + r + 1);
  for (int i = __ldg(p.view.q2k_partial_ptr + r) + lane; i < i1; i += 32) n += __ldg(p.view.q2k_partial_kb + i) > kb;
  const int j1 = __ldg(p.view.q2k_full_ptr + r + 1);
  for (int j = __ldg(p.view.q2k_full_ptr + r) + lane; j < j1; j += 32) {
    const int2 run = __ldg(reinterpret_cast<const int2*>(p.view.q2k_full_runs) + j);
    n += max(0, run.y - max(run.x, kb + 1));
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) n += __shfl_xor_sync(0xffffffffu, n, o);
  return n;
}

// ---------------------------------------------------------------------------
// Mask sources: the per-item half of the Mask role, a template parameter of the producer, the
// dQ order warp and the key-split consumers (as kernel_fwd_sm90.cuh's PlanSourceSm90 /
// AnalyticSourceSm90). Per work item:
//   Src::next_item(p, n, lane)       the CTA's n-th item with its step count (all lanes)
//   Src::Seqlen sl(p, b)             the sample's q_start (workspace rows), len_q, k_start, len_k
//   Src::kv_heads(p, hkv)            the K and V heads of item head hkv (the producer's TMA head
//                                    coordinates)
//   Src::walk<Walk>(p, hkv, b, kb, steps)   its (query head, query block, payload) steps (then
//                                    seek(begin));
//                                    payload >= 0: a partial step (the plan's payload index; the
//                                    analytic walk says 0 and has no payload to load)
//   Src::dq_rank(p, h, b, qb, kb, lane)  the deterministic order of the step's dQ addition
//   Src::q_block0(p, b)              the sample's first global query block (dq_accum tiles)
//   Src::keys_to_store(p, sl, key0)  the dK / dV rows the epilogue writes
//   Src::dkdv_start(p, b)            the element offsets of sample b in dK and dV (the epilogue's bases)
//   Src::kMods                       SDPA's score modifiers in the key-split consumer's scores ->
//                                    P^T, dS^T step (AnalyticModSourceBwdSm90,
//                                    kernel_bwd_mods_sm90.cuh: Src::logits, Src::grads)
//   Src::kDropout                    and dropout (Src::step_keep before the step's GEMMs); without
//                                    kMods (AnalyticDropSourceBwdSm90: Philox, no modifiers) the
//                                    pure-mask P^T, then Src::drop_grads instead of dS^T = P^T (dP^T - D)
//   Src::kStageBias                  a 16-bit bias (SdpaBiasParams::chunks) staged by the consumer
//                                    warps a step ahead (Src::stage_bias; BwdSm90Layout::kBiasStage),
//                                    the step's (h, qb) taken from info_full before its Q / dO land
//   Src::kFp8                        the FP8 backward (Fp8SourceBwdSm90, kernel_bwd_fp8_sm90.cuh; with
//                                    kMods for its logits): Src::grads_fp8 instead of grads, the
//                                    consumer's amax_dP into Src::flush_amax when it ends; with
//                                    Src::kFp8Store, Src::store_dkdv instead of the dK / dV epilogue
// ---------------------------------------------------------------------------

// Flex: the plan's K2Q lists, payload, cu_seqlens and task list / grid / split items (the code
// the kernel had inline: scripts/sass_diff.sh, same SASS).
struct PlanSourceBwdSm90 {
  static constexpr bool kAnalytic = false, kMods = false, kDropout = false, kStageBias = false, kFp8 = false,
                        kFp8Store = false;
  using Seqlen = kern::SeqlenInfo;
  __device__ __forceinline__ static BwdItem next_item(const BwdParams& p, uint32_t item_it, int lane) {
    return next_bwd_item(p, item_it, lane);
  }
  // K and V of the kv head itself.
  __device__ __forceinline__ static int2 kv_heads(const BwdParams&, int hkv) { return make_int2(hkv, hkv); }
  template <class Walk>
  __device__ __forceinline__ static Walk walk(const BwdParams& p, int hkv, int b, int kb, int steps) {
    return Walk{&p, hkv * p.group_size, (hkv + 1) * p.group_size, b, kb, steps};
  }
  __device__ __forceinline__ static int dq_rank(const BwdParams& p, int h, int b, int qb, int kb, int lane) {
    return dq_order_rank(p, h, b, qb, kb, lane);
  }
  __device__ __forceinline__ static int64_t q_block0(const BwdParams& p, int b) { return __ldg(p.view.q_block_start + b); }
  __device__ __forceinline__ static int keys_to_store(const BwdParams&, const Seqlen& sl, int key0) {
    return sl.len_k - key0;
  }
  __device__ __forceinline__ static longlong2 dkdv_start(const BwdParams& p, int b) {
    return make_longlong2(int64_t(b) * p.dka.batch_stride, int64_t(b) * p.dva.batch_stride);
  }
};

// SDPA: the analytic mask (analytic_mask.h, analytic_seqlen.cuh) of padded tensors (sample b is
// batch coordinate b of the tensor maps) or, experimental, packed ones (sample b's own maps:
// sample_maps_sm90.cuh, launch_sdpa_bwd_sm90). Items are the cells of an AnalyticBwdGrid (key block,
// kv head, sample) over every sample padded to S_kv; a block's steps are the analytic K2Q walk's
// (every query head of the kv group, ascending query blocks), a partial step's element mask the
// tile mask of the item's KeyBlockMask (the consumers, analytic_step_mask). Workspace rows of
// sample b start at b * S_q (AnalyticSeqlen::q_start); dq_accum tiles at b * num_q_blocks.
// Every dK / dV row below S_kv of a padded dK / dV is written (0 past the sample), a packed one's sample
// rows only (keys_to_store, dkdv_start); inputs past the sample are
// zeroed in shared memory before use (zero_rows_past). kBk: the kernel's key block (128: the
// key-split kernels of dims up to 128; 64: the column-split kernels of (192, 128) / (256, 256)).
//
// H_k != H_v (K and V head counts each dividing H_q, the larger group a multiple of the smaller:
// sdpa_family.cpp): an item's query heads are the g = min(H_q / H_k, H_q / H_v) heads
// u g .. u g + g - 1 of item head u (the grid's heads: H_q / g = max(H_k, H_v)), which share one
// K head (h / group_size) and one V head (h / group_v, kv_addr.cuh v_head), so the producer loads
// both once per item as for H_k = H_v (g = group_size, u the kv head). The item's dK and dV are
// then partial sums of the head with the larger group (over its group / g items): every item adds
// both into its own fp32 slot (the epilogue's split-slot path; slot = its grid cell,
// AnalyticBwdGrid::slot) and sdpa_bwd_dkdv_sum_kernel_sm90 sums each head's slots in ascending item
// order (each slot written once onto zeros: bitwise reproducible, deterministic or not). dQ is
// unchanged: each (query head, query block, key block) step is still one item's.
//
// The item heads and grid (independent of the tile; sdpa_bwd_dkdv_sum_kernel_sm90 asks them too):
struct AnalyticItemsBwdSm90 {
  // The query heads of an item (g above; group_size when H_k = H_v).
  __device__ __forceinline__ static int item_group(const BwdParams& p) {
    return sm90::sdpa_bwd_item_group_sm90(p.group_size, kern::analytic_of(p).score.group_v);
  }
  __device__ __forceinline__ static kern::AnalyticBwdGrid grid(const BwdParams& p) {
    const AnalyticMaskParams& a = kern::analytic_of(p);
    return kern::AnalyticBwdGrid{a.num_k_blocks,
                                 sm90::sdpa_bwd_item_heads_sm90(p.num_heads_q, p.group_size, a.score.group_v), p.batch,
                                 kern::sdpa_bwd_grid_heads_slowest(a.band.has_left, a.band.has_right), a.l2_group,
                                 a.item_counter};
  }
};

template <int kBk>
struct AnalyticSourceBwdSm90 : AnalyticItemsBwdSm90 {
  static constexpr bool kAnalytic = true, kMods = false, kDropout = false, kStageBias = false, kFp8 = false,
                        kFp8Store = false;
  static constexpr int kBlockQ = 64, kBlockK = kBk;
  using Seqlen = kern::AnalyticSeqlen;
  __device__ __forceinline__ static BwdItem next_item(const BwdParams& p, uint32_t item_it, int lane) {
    const kern::AnalyticBwdGrid g = grid(p);
    const kern::WorkItem w = p.deterministic ? g.next_descending_warp(item_it, lane) : g.next_warp(item_it, lane);
    // H_k != H_v: the item's dK / dV into its slot (above).
    const bool slots = p.group_size != kern::analytic_of(p).score.group_v;
    BwdItem it{w.block, w.head, w.batch, 0, 0, -1};
    if (it.kb >= 0) {
      const Seqlen sl(p, it.b);
      it.steps = item_group(p) * kern::k2q_cursor(sl.mask, it.kb, kBlockQ, kBlockK).remaining();
      if (slots) it.slot = int(g.slot(it.kb, it.hkv, it.b));
    }
    return it;
  }
  // K of the item's first query head's K head, V of its V head (kv_addr.cuh v_head).
  __device__ __forceinline__ static int2 kv_heads(const BwdParams& p, int hkv) {
    const int h0 = hkv * item_group(p);
    return make_int2(h0 / p.group_size, kern::v_head<true>(p, h0, 0));
  }
  template <class Walk>
  __device__ __forceinline__ static kern::AnalyticK2QWalk walk(const BwdParams& p, int hkv, int b, int kb, int steps) {
    const Seqlen sl(p, b);
    const int g = item_group(p);
    return kern::masked_k2q_walk(kern::analytic_of(p), sl, hkv * g, (hkv + 1) * g, steps, kb, kBlockQ, kBlockK);
  }
  // Key blocks after kb in query block qb's Q2K row (every one of them adds to the tile).
  __device__ __forceinline__ static int dq_rank(const BwdParams& p, int, int b, int qb, int kb, int) {
    const Seqlen sl(p, b);
    const kern::AnalyticCursor row = kern::q2k_cursor(sl.mask, qb, kBlockQ, kBlockK);
    return max(0, row.end - max(row.pos, kb + 1));
  }
  __device__ __forceinline__ static int64_t q_block0(const BwdParams& p, int b) {
    return int64_t(b) * kern::analytic_of(p).num_q_blocks;
  }
  // A padded dK / dV: every row below S_kv (rows past the sample: 0); a packed one (experimental: dK and dV
  // both packed, sdpa_family.cpp) the sample's rows.
  __device__ __forceinline__ static int keys_to_store(const BwdParams& p, const Seqlen& sl, int key0) {
    const AnalyticMaskParams& a = kern::analytic_of(p);
    return kern::rows_to_store(a, kSdpaDK, key0, a.max_kv, sl.len_k, a.max_kv);
  }
  // Sample b's start in dK and dV (its ragged offset, or b times the batch stride).
  __device__ __forceinline__ static longlong2 dkdv_start(const BwdParams& p, int b) {
    const AnalyticMaskParams& a = kern::analytic_of(p);
    return make_longlong2(kern::sample_start(a.start[kSdpaDK], b), kern::sample_start(a.start[kSdpaDV], b));
  }
};

// ---------------------------------------------------------------------------
// Producer (warp 0 of WG0)
// ---------------------------------------------------------------------------

// The per-sample tensor maps of packed (THD) SDPA tensors (AnalyticMaskParams::sample_maps, sample_maps_sm90.cuh):
// the 16-bit SDPA kernels' (the FP8 backward takes padded tensors only).
template <class Src>
inline constexpr bool kBwdSampleMaps = Src::kAnalytic && !Src::kFp8;
// A producer's loads of two tensors xa, xb (kSdpaK / kSdpaV, or kSdpaQ / sm90::kSampleMapDO) through
// issue(map a, map b, batch coordinate): the kernel's `ta`, `tb` at coord, or for a packed call sample -1 - coord's
// own maps at 0 (with_sample_map's two issue sites; the flex kernels' code as before).
template <class Src, class F>
__device__ __forceinline__ void bwd_load_maps(const BwdParams& p, int coord, const CUtensorMap* ta, int xa,
                                              const CUtensorMap* tb, int xb, F&& issue) {
  if constexpr (kBwdSampleMaps<Src>) {
    with_sample_maps<true, sm90::kSampleMapsBwd>(kern::analytic_of(p).sample_maps, coord, ta, xa, tb, xb, issue);
  } else {
    issue(ta, tb, coord);
  }
}

// Walk: kern::K2QWalk (BlockCursor order, what the split schedule counts) or, deterministic,
// kern::K2QWalkAscending (the dQ order warp walks the same); the analytic source's walk is
// ascending in both cases. L: the kernel's BwdSm90Layout; Src: the mask source.
template <class L, class Src, class Walk>
__device__ __forceinline__ void bwd_producer(const BwdParams& p, const CUtensorMap* tm_q, const CUtensorMap* tm_k,
                                             const CUtensorMap* tm_v, const CUtensorMap* tm_do, uint32_t base,
                                             uint8_t* smem) {
  const int lane = threadIdx.x & 31;
  const uint32_t bars = base + L::kBar;
  if (lane == 0) {
    prefetch_tensormap(tm_q);
    prefetch_tensormap(tm_k);
    prefetch_tensormap(tm_v);
    prefetch_tensormap(tm_do);
  }
  float* s_stat = reinterpret_cast<float*>(smem + L::kStat);
  int4* s_info = reinterpret_cast<int4*>(smem + L::kInfo);
  uint32_t step_it = 0;
  for (uint32_t item_it = 0;; ++item_it) {
    const BwdItem it = Src::next_item(p, item_it, lane);
    if (lane == 0) {
      // Lane 0 alone waits for the entry (header: who waits): lanes 1-31 never touch the ring.
      const uint32_t rs = item_it & 1;
      mbar_wait(bars + L::kItemEmpty + 8 * rs, ((item_it >> 1) & 1) ^ 1);
      volatile int32_t* e = reinterpret_cast<int32_t*>(smem + L::kItem) + 8 * rs;
      e[0] = it.kb;
      e[1] = it.hkv;
      e[2] = it.b;
      e[3] = it.begin;
      e[4] = it.steps;
      e[5] = it.slot;
      mbar_arrive(bars + L::kItemFull + 8 * rs);  // release: the entry is visible to the waiting roles
    }
    if (it.kb < 0) return;

    const typename Src::Seqlen sl(p, it.b);
    // Packed (THD) tensors (SDPA, experimental: AnalyticMaskParams::sample_maps): sample b's maps of q, k, v and
    // the main dO (sample_maps_sm90.cuh: bcoord then codes the sample), acquired by the issuing lane.
    int bcoord = p.varlen ? 0 : it.b;
    if constexpr (kBwdSampleMaps<Src>) {
      if (const void* maps = kern::analytic_of(p).sample_maps) {
        if (lane == 0) acquire_sample_maps<sm90::kSampleMapsBwd>(maps, it.b);
        bcoord = sample_coord(maps, it.b);
      }
    }
    const int q_row0 = p.varlen ? sl.q_start : 0;
    if (lane == 0) {
      mbar_wait(bars + L::kKvEmpty, (item_it & 1) ^ 1);
      const kern::ContiguousKv kv = kern::ContiguousKv::tma_sample(p, it.b, sl.k_start);  // K/V address role
      int row = kv.tma_row<L::kBlockK>(it.kb);
      // A packed sample without keys has a one-row map at the tensor's base (which may be null, or end there):
      // its box at row 1 lies wholly past the extent, zero filled, nothing read (sample_maps_sm90.h).
      if constexpr (kBwdSampleMaps<Src>) {
        if (bcoord < 0 && sl.len_k <= 0) row = 1;
      }
      const int2 kvh = Src::kv_heads(p, it.hkv);  // the K and V heads (SDPA: H_k != H_v)
      mbar_arrive_expect_tx(bars + L::kKvFull, L::kTileK + L::kTileV);
      bwd_load_maps<Src>(p, bcoord, tm_k, kSdpaK, tm_v, kSdpaV, [&](const CUtensorMap* mk, const CUtensorMap* mv, int batch) {
#pragma unroll
        for (int s = 0; s < (L::kSlabs > L::kSlabsV ? L::kSlabs : L::kSlabsV); ++s) {
          if (s < L::kSlabs) tma_load_4d(base + L::kK + s * L::kSlabK, mk, 64 * s, row, kvh.x, batch, bars + L::kKvFull);
          if (s < L::kSlabsV) tma_load_4d(base + L::kV + s * L::kSlabK, mv, 64 * s, row, kvh.y, batch, bars + L::kKvFull);
        }
      });
    }
    auto walk = Src::template walk<Walk>(p, it.hkv, it.b, it.kb, it.steps);
    walk.seek(it.begin);
    for (int s = 0; s < it.steps; ++s, ++step_it) {
      int h = 0, qb = 0, payload = -1;
      walk.next(h, qb, payload);
      const int pay = Src::kAnalytic ? -1 : payload;  // the payload to load (the analytic mask has none)
      const uint32_t st = step_it % L::kStages, ph = (step_it / L::kStages) & 1;
      // The step's statistics (rows past the sample: lse2 = +inf, D = 0), loaded before the wait
      // for the stage, so that their L2 latency overlaps the consumers' last step.
      constexpr int kStatPerLane = L::kBlockQ / 32;
      float st_lse2[kStatPerLane], st_delta[kStatPerLane];
      {
        const int q_left = sl.len_q - qb * L::kBlockQ;
        const int64_t ws = int64_t(h) * p.total_q + sl.q_start + int64_t(qb) * L::kBlockQ;
#pragma unroll
        for (int i = 0; i < kStatPerLane; ++i) {
          const int r = lane + 32 * i;
          const bool valid = r < q_left;
          st_lse2[i] = valid ? __ldg(p.lse2 + ws + r) : INFINITY;
          st_delta[i] = valid ? __ldg(p.delta + ws + r) : 0.0f;
        }
      }
      mbar_wait(bars + L::kQdoEmpty + 8 * st, ph ^ 1);
      const uint32_t full = bars + L::kQdoFull + 8 * st;
      if (lane == 0) {
        // First of the 33 arrivals of this phase: the transaction bytes of the Q and dO boxes
        // and of a partial step's payload (copied into the stage, so that the consumers read
        // it from shared memory after their S GEMM instead of holding it in registers).
        mbar_arrive_expect_tx(full, L::kTileQ + L::kTileDO + (pay >= 0 ? L::kPayBytes : 0));
        if (pay >= 0) {
          bulk_load(base + L::kPay + st * L::kPayBytes, p.view.q2k_partial_bits + size_t(pay) * (L::kPayBytes / 4),
                    L::kPayBytes, full);
        }
        const int row = q_row0 + qb * L::kBlockQ;
        bwd_load_maps<Src>(p, bcoord, tm_q, kSdpaQ, tm_do, sm90::kSampleMapDO,
                           [&](const CUtensorMap* mq, const CUtensorMap* mdo, int batch) {
#pragma unroll
          for (int sl2 = 0; sl2 < (L::kSlabs > L::kSlabsV ? L::kSlabs : L::kSlabsV); ++sl2) {
            if (sl2 < L::kSlabs) {
              tma_load_4d(base + L::kQ + st * L::kTileQ + sl2 * L::kSlabQ, mq, 64 * sl2, row, h, batch, full);
            }
            if (sl2 < L::kSlabsV) {
              tma_load_4d(base + L::kDO + st * L::kTileDO + sl2 * L::kSlabQ, mdo, 64 * sl2, row, h, batch, full);
            }
          }
        });
      }
      // The step's statistics and its info into the stage.
      float* stat = s_stat + st * 2 * L::kBlockQ;
#pragma unroll
      for (int i = 0; i < kStatPerLane; ++i) {
        stat[lane + 32 * i] = st_lse2[i];
        stat[L::kBlockQ + lane + 32 * i] = st_delta[i];
      }
      if (lane == 0) {
        s_info[st] = make_int4(h, qb, payload, 0);
        if constexpr (Src::kStageBias) mbar_arrive(bars + L::kInfoFull + 8 * st);  // the info, ahead of the data
      }
      mbar_arrive(full);  // every lane releases its own statistics (and lane 0 the info)
    }
  }
}

// ---------------------------------------------------------------------------
// dQ writers (warp 1 of WG0; and warp 3, deterministic: the tiles' second halves)
// ---------------------------------------------------------------------------

// chunk: the piece of each dQ tile this writer adds (BwdParams::dq_chunks; 0 = the whole tile when dq_chunks = 1).
// With dq_chunks = 2 (the launchers' default for deterministic calls) warp 3 of WG0 runs a second writer for each
// tile's second half: each half has its own counter (kDqSemChunkWords apart) and its own chain of turns, so one half's
// turn wait, write and release overlap the other's, and the consumers' dq_empty completes once both halves are read
// (its count: dq_chunks).
template <class L>
__device__ __forceinline__ void bwd_dq_writer(const BwdParams& p, uint32_t base, uint8_t* smem, int chunk) {
  const int lane = threadIdx.x & 31;
  const int chunks = p.dq_chunks;
  const uint32_t piece_bytes = uint32_t(L::kDqBytes / chunks), piece_off = uint32_t(chunk) * piece_bytes;
  const uint32_t bars = base + L::kBar;
  const volatile int64_t* dq_info = reinterpret_cast<const int64_t*>(smem + L::kDqInfo);
  const volatile int32_t* s_rank = reinterpret_cast<const int32_t*>(smem + L::kRank);
  uint32_t dq_it = 0;
  BwdTraceWriter tr;  // FLASHSPAN_BWD_TRACE (bwd_trace_sm90.cuh): no code without it
  if (lane == 0 && chunk == 0) tr.begin();
  for (uint32_t item_it = 0;; ++item_it) {
    const uint32_t rs = item_it & 1;
    mbar_wait(bars + L::kItemFull + 8 * rs, (item_it >> 1) & 1);
    const volatile int32_t* e = reinterpret_cast<const int32_t*>(smem + L::kItem) + 8 * rs;
    const int kb = e[0], steps = e[4];
    __syncwarp();
    if (lane == 0) mbar_arrive(bars + L::kItemEmpty + 8 * rs);
    if (kb < 0) break;
    if (lane == 0) {
      for (int s = 0; s < steps; ++s, ++dq_it) {
        mbar_wait(bars + L::kDqFull, dq_it & 1);
        tr.step(dq_it);
        tr.mark(kTrReady);
        const int64_t tile = *dq_info;
        [[maybe_unused]] int trace_rank = -1;
        int32_t* sem = p.dq_sem != nullptr ? p.dq_sem + tile * kDqSemStride + chunk * kDqSemChunkWords : nullptr;
        if (sem != nullptr) {
          // Deterministic: wait until every larger key block of the tile's row has added.
          const uint32_t rs2 = dq_it & 1;
          mbar_wait(bars + L::kRankFull + 8 * rs2, (dq_it >> 1) & 1);
          const int rank = s_rank[rs2];
          mbar_arrive(bars + L::kRankEmpty + 8 * rs2);
          trace_rank = rank;
          tr.mark(kTrPoll);
          // Poll without sleeping first (a sleeping waiter may take its turn late, and a tile
          // that every key block adds at one walk position is a chain of turns); measured: no
          // change to longformer's deterministic speed on the H200 (PERF_LOG v1.6).
          for (int polls = 0; ld_acquire_gpu(sem) != rank; ++polls) {
            if (polls >= 256) __nanosleep(32);
          }
          tr.mark(kTrTurn);
          fence_proxy_async_global();
        }
        bulk_reduce_add_f32(p.dq_accum + tile * L::kDqFloats + piece_off / 4, base + L::kDQ + piece_off, piece_bytes);
        bulk_commit_group();
        bulk_wait_group_read<0>();  // the shared dQ tile may be overwritten
        mbar_arrive(bars + L::kDqEmpty);
        tr.mark(kTrRead);
        if (sem != nullptr) {
          bulk_wait_group<0>();  // the addition is written: the next key block may add
          tr.hold();
          fence_proxy_async_global();
          // The release makes the completed additions (wait_group 0: visible to this thread) visible to the
          // next key block's writer, which acquires the counter. det_relaxed (measurement only) drops it and is
          // not bitwise reproducible (PERF_LOG v2.64: 1-3 runs in 16 of the flex trees / hstu on an H100).
          if (p.det_relaxed) {
            red_relaxed_gpu_add(sem, 1);
          } else {
            red_release_gpu_add(sem, 1);
          }
          tr.mark(kTrReleased);
          tr.flush_held();
        }
        tr.info(tile, dq_it, trace_rank, kb, s, item_it);
      }
    }
  }
  bulk_wait_group<0>();  // every reduction written before the CTA exits
  if (lane == 0 && chunk == 0) tr.end(dq_it);
}

// ---------------------------------------------------------------------------
// dQ order (warp 2 of WG0; deterministic only)
// ---------------------------------------------------------------------------

// Walks each item's K2Q pairs as the producer does (ascending, K2QWalkAscending) and hands the writer, through a 2-entry
// ring, the order of every step's dQ addition (dq_order_rank), ahead of the step. A warp of its
// own so that the producer's register budget (40) stays as it was for both paths.
template <class L, class Src>
__device__ __forceinline__ void bwd_dq_order(const BwdParams& p, uint8_t* smem, uint32_t bars) {
  const int lane = threadIdx.x & 31;
  volatile int32_t* s_rank = reinterpret_cast<int32_t*>(smem + L::kRank);
  uint32_t step_it = 0;
  for (uint32_t item_it = 0;; ++item_it) {
    const uint32_t rs = item_it & 1;
    mbar_wait(bars + L::kItemFull + 8 * rs, (item_it >> 1) & 1);
    const volatile int32_t* e = reinterpret_cast<const int32_t*>(smem + L::kItem) + 8 * rs;
    const int kb = e[0], hkv = e[1], b = e[2], begin = e[3], steps = e[4];
    __syncwarp();
    if (lane == 0) mbar_arrive(bars + L::kItemEmpty + 8 * rs);
    if (kb < 0) return;
    auto walk = Src::template walk<kern::K2QWalkAscending>(p, hkv, b, kb, steps);
    walk.seek(begin);
    for (int s = 0; s < steps; ++s, ++step_it) {
      int h = 0, qb = 0, payload = -1;
      walk.next(h, qb, payload);
      const int rank = Src::dq_rank(p, h, b, qb, kb, lane);
      if (lane == 0) {
        // Lane 0 alone waits for the slot (header: who waits).
        const uint32_t r2 = step_it & 1;
        mbar_wait(bars + L::kRankEmpty + 8 * r2, ((step_it >> 1) & 1) ^ 1);
        s_rank[r2] = rank;
        mbar_arrive(bars + L::kRankFull + 8 * r2);  // release: the entry is visible to the writer
      }
      __syncwarp();
    }
  }
}

// ---------------------------------------------------------------------------
// Consumers (two warpgroups)
// ---------------------------------------------------------------------------

// The consumers' take of work item `item_it` from the producer's 2-entry item ring (every
// consumer thread waits, reads the entry and releases it with its own arrival).
template <class L>
__device__ __forceinline__ BwdItem take_bwd_item(uint32_t bars, const uint8_t* smem, uint32_t item_it) {
  const uint32_t rs = item_it & 1;
  mbar_wait(bars + L::kItemFull + 8 * rs, (item_it >> 1) & 1);
  const volatile int32_t* e = reinterpret_cast<const int32_t*>(smem + L::kItem) + 8 * rs;
  const BwdItem it{e[0], e[1], e[2], e[3], e[4], e[5]};
  mbar_arrive(bars + L::kItemEmpty + 8 * rs);
  return it;
}

// Whether a split item's slot is its own and written with plain stores (the flex deterministic backward: one slot
// per item, bwd_split.cuh, not zeroed; BwdParams::det_own_slots, by default), or added into with fp32 atomics (a
// zeroed slot: shared by a split task's items when non-deterministic; SDPA's H_k != H_v slots).
__device__ __forceinline__ bool split_slot_owned(const BwdParams& p) { return p.det_own_slots != 0; }

// An element pair (a: 8-byte aligned) of a split slot: stored when the slot is the item's own (split_slot_owned),
// else added with fp32 atomics. (dkdv_epilogue_t3 branches once for its dK and dV elements.)
__device__ __forceinline__ void slot_put2(bool own, float* a, float x, float y) {
  if (own) {
    *reinterpret_cast<float2*>(a) = make_float2(x, y);
  } else {
    kern::atomic_add_f32x2(a, x, y);
  }
}

// Epilogue of a work item: the thread holds dK / dV of keys key_thr and key_thr + 8 of the key
// block (rows of its m64nN accumulators), n8 blocks n at columns colk(n) / colv(n) + 2 qd (+1)
// (key split: keys 64c + 16w + g, every column; column split: keys 16w + g, the warpgroup's
// column pieces). slot >= 0: dK (unscaled) and dV added with fp32 atomics to split slot `slot` (stored, when
// the slot is the item's own: split_slot_owned)
// ([kBlockK, Dqk] / [kBlockK, Dv] fp32, bwd_split.cuh); else dK (times the softmax scale) and dV
// rows of the valid keys written in the input dtype at the sample's start in dK / dV (start_of(): Src::dkdv_start). kBoundCols: a call's head dims below the
// kernel's (dims up to 128 on the (64, 64) / (128, 128) kernels) store only the columns below
// p.head_dqk / p.head_dv (the accumulators' extra columns are 0: TMA zero fill). kCallSlots: the
// split slots are rows of the call's head dims (flex: bwd_split.cuh's workspace and convert), else of
// the kernel's (SDPA's H_k != H_v slots, sdpa_bwd_dkdv_sum_kernel_sm90).
template <int kBlockK, int kDqk, int kDv, class E, bool kBoundCols = false, bool kCallSlots = false, int kNK, int kNV,
          class ColK, class ColV, class Start>
__device__ __forceinline__ void dkdv_epilogue_sm90(const BwdParams& p, const BwdItem& it, int keys_valid,
                                                   int64_t krow, Start start_of, int key_thr, int qd,
                                                   const float (&dk)[kNK][4], const float (&dv)[kNV][4], ColK colk,
                                                   ColV colv) {
  using Elem = typename E::Storage;
  constexpr int kN = kNK > kNV ? kNK : kNV;
  if (it.slot >= 0) {
    // own: the flex deterministic split schedule gives every item a slot of its own (bwd_split.cuh), which this
    // item's threads cover once (each dK / dV element has one owner): plain stores, no zeroed slot to add into.
    const bool own = split_slot_owned(p);
    const int ldk = kCallSlots ? p.head_dqk : kDqk, ldv = kCallSlots ? p.head_dv : kDv;
    float* dka = p.split.dk_accum + int64_t(it.slot) * kBlockK * ldk;
    float* dva = p.split.dv_accum + int64_t(it.slot) * kBlockK * ldv;
#pragma unroll
    for (int hi = 0; hi < 2; ++hi) {
      const int key = key_thr + 8 * hi;
      if (key < keys_valid) {
#pragma unroll
        for (int n = 0; n < kN; ++n) {
          if (n < kNK && (!kCallSlots || colk(n) < p.head_dqk)) {
            slot_put2(own, dka + int64_t(key) * ldk + colk(n) + 2 * qd, dk[n][2 * hi], dk[n][2 * hi + 1]);
          }
          if (n < kNV && (!kCallSlots || colv(n) < p.head_dv)) {
            slot_put2(own, dva + int64_t(key) * ldv + colv(n) + 2 * qd, dv[n][2 * hi], dv[n][2 * hi + 1]);
          }
        }
      }
    }
    return;
  }
  const longlong2 start = start_of();  // (formed past the slot path, which does not need it)
  Elem* dkp = static_cast<Elem*>(p.dk) + start.x + krow * p.dka.row_stride + int64_t(it.hkv) * p.dka.head_stride;
  Elem* dvp = static_cast<Elem*>(p.dv) + start.y + krow * p.dva.row_stride + int64_t(it.hkv) * p.dva.head_stride;
#pragma unroll
  for (int hi = 0; hi < 2; ++hi) {
    const int key = key_thr + 8 * hi;
    if (key < keys_valid) {
      Elem* krow_k = dkp + int64_t(key) * p.dka.row_stride;
      Elem* krow_v = dvp + int64_t(key) * p.dva.row_stride;
#pragma unroll
      for (int n = 0; n < kN; ++n) {
        if (n < kNK && (!kBoundCols || colk(n) < p.head_dqk)) {
          *reinterpret_cast<uint32_t*>(krow_k + colk(n) + 2 * qd) =
              kern::pack2<E>(dk[n][2 * hi] * p.scale, dk[n][2 * hi + 1] * p.scale);
        }
        if (n < kNV && (!kBoundCols || colv(n) < p.head_dv)) {
          *reinterpret_cast<uint32_t*>(krow_v + colv(n) + 2 * qd) = kern::pack2<E>(dv[n][2 * hi], dv[n][2 * hi + 1]);
        }
      }
    }
  }
}

// Named barrier of the two consumer warpgroups around zero_rows_past (1: dS complete).
constexpr int kZeroBar = 2;

// Analytic mask (SDPA): zeroes rows [keep, kRows) of two tiles at a and b (kSlabs 64-column
// slabs of kRows rows x 128 bytes each; the swizzle permutes 16-byte chunks inside a row, so a
// row's 8 chunks are the row) by the kThreads consumer threads (t: 0 .. kThreads - 1: two
// warpgroups, or three for the 64 x 96 tile), then makes the writes visible to the wgmma (async
// proxy) of every consumer warpgroup, which all call it with the same arguments. Rows past a sample (padding: any values, NaN included) would otherwise reach the
// gradients through the GEMMs that multiply a masked P or dS of 0 with them (0 * NaN): Q and dO
// (dK += dS^T Q, dV += P^T dO) and K and V (dQ = dS K; dP^T = V dO^T).
// kSlabsB: b's slabs when they differ from a's ((192, 128): K / Q 3 slabs, V / dO 2).
template <int kRows, int kSlabs, int kSlabsB = kSlabs, int kThreads = 256>
__device__ __forceinline__ void zero_rows_past(uint32_t a, uint32_t b, int keep, int t) {
  constexpr int kChunks = kSlabs * kRows * 8;     // 16-byte chunks of tile a
  constexpr int kChunksB = kSlabsB * kRows * 8;   // of tile b
#pragma unroll 2
  for (int i = t; i < kChunks + kChunksB; i += kThreads) {
    const bool second = i >= kChunks;
    const int j = second ? i - kChunks : i;
    if ((j >> 3) % kRows >= keep) {
      asm volatile("st.shared.v4.u32 [%0], {%1, %1, %1, %1};\n" ::"r"((second ? b : a) + 16 * j), "r"(0) : "memory");
    }
  }
  fence_proxy_async_smem();
  named_bar_sync(kZeroBar, kThreads);
}

// The payload-word form (pw[j / 2][e], bits 4 hi + 2 (j % 2)) of the analytic element mask of
// one step (query block qb, key block kb): the thread's keys key_thr (+8 hi) and queries
// 8 j + 2 qd + e of the S^T accumulator, from the tile mask (analytic_mask.h TileMask).
__device__ __forceinline__ void analytic_step_mask(const kern::TileMask& tm, int key_thr, int qd, uint32_t (&pw)[4][2]) {
#pragma unroll
  for (int m = 0; m < 4; ++m) {
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      uint32_t wv = 0;
#pragma unroll
      for (int jj = 0; jj < 2; ++jj) {
#pragma unroll
        for (int hi = 0; hi < 2; ++hi) {
          if (tm.visible(8 * (2 * m + jj) + 2 * qd + e, key_thr + 8 * hi)) wv |= 1u << (4 * hi + 2 * jj);
        }
      }
      pw[m][e] = wv;
    }
  }
}

// kWideTile: the wide tile of (64, 64), 128 query rows a step (plan source only). Src::kMods:
// the scores -> P^T, dS^T step (element mask included) with SDPA's score modifiers (the source's
// logits / grads), the rest of the step as without them.
template <int kD, class E, class Src, bool kWideTile = false, int kOrder = 0>
__device__ __forceinline__ void bwd_consumer(const BwdParams& p, uint32_t base, uint8_t* smem) {
  using L = BwdSm90Layout<kD, kD, kWideTile>;
  constexpr int kBq = L::kBlockQ;  // the step's query rows, 64 or 128
  constexpr int kN = kD / 8;       // n8 blocks of dK / dV
  constexpr int kNQ = kBq / 8;     // n8 blocks (query columns) of S^T / dP^T
  constexpr int kKQ = kBq / 16;    // k16 steps over the step's queries (dV, dK)
  const uint32_t bars = base + L::kBar;
  // keys 64c .. 64c + 63 (with 240 registers, kBwdOrderRegs240: uniform, so that the descriptors are built on the
  // uniform datapath; at 232 a uniform index made ptxas serialise the wgmma, PERF_LOG v2.21)
  constexpr bool kUniformWg = kBwdOrderRegs240<kOrder>;
  constexpr bool kEarlyDq = (kOrder & kBwdOrderEarlyDq) != 0;
  constexpr bool kLateDk = (kOrder & kBwdOrderLateDk) != 0;
  constexpr bool kDeferDk = (kOrder & kBwdOrderDeferDk) != 0;
  static_assert(!(kEarlyDq || kLateDk || kDeferDk) || (!Src::kMods && !Src::kDropout && !Src::kFp8 && !Src::kStageBias),
                "sm90 backward: the early-dQ / late-dK / deferred-dK steps are the pure-mask kernels'");
  static_assert(!(kLateDk && kDeferDk), "sm90 backward: the late and the deferred dK exclude each other");
  static_assert(!kEarlyDq || (kUniformWg && kBq == 64), "sm90 backward: early dQ needs the 240-register (128, 128) kernel");
  const int c = kUniformWg ? consumer_warpgroup() : (threadIdx.x - 128) >> 7;
  const int t = threadIdx.x & 127, w = t >> 5, lane = t & 31, g = lane >> 2, qd = lane & 3;
  const int key_thr = 64 * c + 16 * w + g;  // the thread's first key of the block (+8: second)
  const float* s_stat = reinterpret_cast<const float*>(smem + L::kStat);
  const int4* s_info = reinterpret_cast<const int4*>(smem + L::kInfo);
  float* s_dq = reinterpret_cast<float*>(smem + L::kDQ);
  // Payload: word offsets (j / 2) 64 + 32c + 8qd + 4e + g / 2 and the thread's bit shift.
  [[maybe_unused]] const int pw_thr = 32 * c + 8 * qd + (g >> 1);
  [[maybe_unused]] const int pw_shift = 8 * w + (g & 1);
  // dS^T store offset of the thread's pairs (key row key_thr, chunk j ^ (key & 7), 4 qd bytes).
  const uint32_t ds_row = uint32_t(key_thr) * 128 + 4 * qd;
  // Operand tiles of this warpgroup.
  const uint32_t k_tile = base + L::kK + c * 64 * 128;  // K rows 64c.. (A of S^T)
  const uint32_t v_tile = base + L::kV + c * 64 * 128;  // V rows 64c.. (A of dP^T)
  // B of dQ, K columns c kDqN .. (64-row tiles: kDqN = kD / 2; the wide tile: every column, c = 0
  // here): slab (c kDqN) / 64, plus 64 bytes for the second half of a slab (kD = 64; the 128B
  // swizzle is applied to the absolute address, so a start inside the swizzle row addresses the
  // right elements, as the K-major k16 steps do).
  const int cq = L::kWide ? 0 : c;
  const uint32_t kq_tile = base + L::kK + (cq * L::kDqN / 64) * L::kSlabK + (cq * L::kDqN % 64) * 2;
  // A of dQ: the dS^T slab of the warpgroup's dQ rows (64-row tiles: the only slab; the wide
  // tile: queries 64c ..).
  const uint32_t ds_slab = L::kWide ? c * L::kDsSlab : 0;
  // The warp's region of shared memory after the rest (the modifiers' kernels launched with kBytesBias): SDPA's
  // staged bias (Src::kStageBias: the calls with a 16-bit bias of whole chunks), which holds one step's bias
  // (read in Src::logits, refilled for the next step once dV is done), or softcap's 1 - t^2 from Src::logits
  // to Src::grads (kernel_bwd_mods_sm90.cuh AnalyticModSourceBwdSm90's kStash).
  [[maybe_unused]] const uint32_t warp_region = base + L::kBiasStage + uint32_t(4 * c + w) * L::kBiasWarpBytes;
  // Step n's (the kernel's n-th) copies, once its info is out (info_full; before its Q / dO land).
  [[maybe_unused]] auto stage_bias_of = [&](const BwdItem& it, const typename Src::Seqlen& sl, uint32_t n) {
    if constexpr (Src::kStageBias) {
      const uint32_t sn = n % L::kStages;
      mbar_wait(bars + L::kInfoFull + 8 * sn, (n / L::kStages) & 1);
      Src::stage_bias(p, it, sl, s_info[sn], 64 * c + 16 * w, lane, warp_region);
    }
  };

  // The FP8 backward (Src::kFp8, kernel_bwd_fp8_sm90.cuh): the thread's running amax_dP, flushed at the end.
  [[maybe_unused]] float amax_dp = 0.0f;
  // dK += dS^T Q with A from a dS^T buffer (the warpgroup's 64 key rows, K-major: k16 step kk in slab kk / 4, 32
  // bytes a step inside it) and B the stage's Q, one commit group (kLateDk, kDeferDk: no register operand stays live
  // into the next step; with dS^T's registers held there, ptxas serialised every wgmma: C7512).
  [[maybe_unused]] auto gemm_dk_ss = [&](float (&acc)[kN][4], uint32_t ds_b, uint32_t q_t) {
#pragma unroll
    for (int kk = 0; kk < kKQ; ++kk) {
      const uint32_t a = ds_b + (kk >> 2) * L::kDsSlab + uint32_t(c) * 64 * 128;
      wgmma_ss_tnspb<kD, E>(acc, desc_add(smem_desc(a, 16, 1024), 32 * (kk & 3)),
                            desc_add(smem_desc(q_t, L::kSlabQ, 1024), kk * 2048), 1);
    }
    wg_commit();
  };
  uint32_t step_it = 0;
  BwdTraceConsumer tr;  // FLASHSPAN_BWD_TRACE (bwd_trace_sm90.cuh): thread 0 of warpgroup 0; no code without it
  tr.begin();
  for (uint32_t item_it = 0;; ++item_it) {
    const BwdItem it = take_bwd_item<L>(bars, smem, item_it);
    if (it.kb < 0) {
      if constexpr (Src::kFp8) Src::flush_amax(p, amax_dp, lane);
      tr.end(step_it);
      return;
    }

    float dk[kN][4], dv[kN][4];
    zero_frag(dk);
    zero_frag(dv);
    mbar_wait(bars + L::kKvFull, item_it & 1);
    const typename Src::Seqlen sl(p, it.b);
    const int64_t qblk0 = Src::q_block0(p, it.b);  // the sample's first global query block
    if constexpr (Src::kAnalytic) {
      const int keys_in = sl.len_k - it.kb * L::kBlockK;
      if (it.steps > 0 && keys_in < L::kBlockK) {
        zero_rows_past<L::kBlockK, L::kSlabs>(base + L::kK, base + L::kV, keys_in, 128 * c + t);
      }
    }
    for (int s = 0; s < it.steps; ++s, ++step_it) {
      const uint32_t st = step_it % L::kStages, ph = (step_it / L::kStages) & 1;
      const uint32_t q_tile = base + L::kQ + st * L::kTileQ;
      const uint32_t do_tile = base + L::kDO + st * L::kTileQ;
      // The warpgroup's K / V / dQ-B tile addresses, made opaque each step so that their wgmma
      // descriptors are built per step (a few instructions) rather than hoisted out of the loop as
      // live 64-bit registers, which made ptxas serialise the wgmma (C7512) at this kernel's 232.
      uint32_t k_t = k_tile, v_t = v_tile, kq_t = kq_tile;
      if constexpr (!kUniformWg) asm volatile("" : "+r"(k_t), "+r"(v_t), "+r"(kq_t));
      tr.step(step_it, it.kb, s, item_it);
      if constexpr (Src::kStageBias) {
        // An item's first step stages its own bias (the later ones: a step ahead, once dV is done).
        if (s == 0) stage_bias_of(it, sl, step_it);
      }
      mbar_wait(bars + L::kQdoFull + 8 * st, ph);
      tr.mark(kTrQdoFull);
      if constexpr (Src::kAnalytic) {
        const int rows_in = sl.len_q - s_info[st].y * L::kBlockQ;
        if (rows_in < L::kBlockQ) zero_rows_past<L::kBlockQ, L::kSlabs>(q_tile, do_tile, rows_in, 128 * c + t);
      }
      // SDPA's dropout: the step's Philox keep bits, drawn while the accumulators below are not live (drawn
      // a step ahead under the dQ / dK GEMMs instead, the Philox-only kernel ran 2 % slower: PERF_LOG v2.72).
      [[maybe_unused]] uint32_t keep = 0;
      if constexpr (Src::kDropout) keep = Src::template step_keep<kNQ>(p, it, s_info[st], key_thr, lane);
      // S^T = K Q^T and dP^T = V dO^T (kD / 16 k16 steps each, both operands K-major).
      float sacc[kNQ][4], dpacc[kNQ][4];
      wg_fence();
      wgmma_ss_kmajor<kBq, kD, L::kSlabK, L::kSlabQ, E>(sacc, k_t, q_tile);
      wg_commit();
      wgmma_ss_kmajor<kBq, kD, L::kSlabK, L::kSlabQ, E>(dpacc, v_t, do_tile);
      wg_commit();
      // The previous step's stage and dS^T buffer (kDeferDk).
      [[maybe_unused]] const uint32_t st_prev = (step_it - 1) % L::kStages;
      [[maybe_unused]] const uint32_t ds_prev = base + L::kDS + ((step_it - 1) & 1) * L::kDSBytes;
      if constexpr (kDeferDk) {
        // The previous step's dK behind this step's S^T / dP^T (an empty group in an item's first step).
        if (s > 0) {
          gemm_dk_ss(dk, ds_prev, base + L::kQ + st_prev * L::kTileQ);
        } else {
          wg_commit();
        }
      }
      const float* lse2 = s_stat + st * 2 * L::kBlockQ;
      const float* delta = lse2 + L::kBlockQ;
      const int4 info = s_info[st];  // {h, qb, payload}
      if constexpr (kDeferDk) {
        wg_wait<2>();
      } else {
        wg_wait<1>();
      }
      reg_fence(sacc);
      if constexpr (kLateDk) {
        // The previous step's dK has completed with this S^T (wgmma groups complete in order): its Q / dO stage is free.
        if (s > 0) mbar_arrive(bars + L::kQdoEmpty + 8 * st_prev);
      }
      // Payload words of a partial step, pre-shifted (a full block: every bit set, so the mask
      // test below is branch-free).
      uint32_t pw[kBq / 16][2];
#pragma unroll
      for (int m = 0; m < kBq / 16; ++m) pw[m][0] = pw[m][1] = ~0u;
      if (info.z >= 0) {
        if constexpr (Src::kMods) {
          // (the element mask is the source's logits': fewer live registers than these words)
        } else if constexpr (Src::kAnalytic) {
          analytic_step_mask(kern::TileMask::make(sl.mask, int64_t(info.y) * L::kBlockQ, int64_t(it.kb) * L::kBlockK),
                             key_thr, qd, pw);
        } else {
          const uint32_t* bits = reinterpret_cast<const uint32_t*>(smem + L::kPay + st * L::kPayBytes) + pw_thr;
#pragma unroll
          for (int m = 0; m < kBq / 16; ++m) {
#pragma unroll
            for (int x = 0; x < 2; ++x) pw[m][x] = bits[64 * m + 4 * x] >> pw_shift;
          }
        }
      }
      // SDPA's softcap: its 1 - t^2 of each element (fp16 pairs) from the modifiers' P^T to their dS^T, in registers
      // (or in the warp's region: the source's kStash, kernel_bwd_mods_sm90.cuh).
      [[maybe_unused]] uint32_t dlogit[kNQ][2];
      if constexpr (Src::kMods) {
        // SDPA's score modifiers: P^T = exp2(logit2 - lse2 + bias) (masked: 0).
        Src::template logits<kNQ>(p, it, sl, info, key_thr, lse2, lane, warp_region, sacc, dlogit);
        reg_fence(sacc);  // P^T (z^T with dropout) formed here, under the dP^T GEMM
      } else {
        // P^T = exp2(S^T scale log2(e) - lse2[query]); masked elements 0 (a full block has none: its
        // bit tests are skipped, PERF_LOG v2.23; a branch around the whole exp2 loop instead made
        // ptxas serialise the D = 128 wgmma, C7512).
#pragma unroll
        for (int j = 0; j < kNQ; ++j) {
          const float2 l2 = *reinterpret_cast<const float2*>(lse2 + 8 * j + 2 * qd);
#pragma unroll
          for (int r = 0; r < 4; ++r) sacc[j][r] = kern::exp2_approx(fmaf(sacc[j][r], p.scale_log2, (r & 1) ? -l2.y : -l2.x));
        }
        if (info.z >= 0) {  // a partial block's masked elements (a full block has none: no bit tests)
#pragma unroll
          for (int j = 0; j < kNQ; ++j) {
#pragma unroll
            for (int r = 0; r < 4; ++r) {
              if (!((pw[j >> 1][r & 1] >> (4 * (r >> 1) + 2 * (j & 1))) & 1u)) sacc[j][r] = 0.0f;
            }
          }
        }
      }
      uint32_t pa[kKQ][4], dsa[kKQ][4];
      // acc += A (from registers: P^T for dV, dS^T for dK) times the stage's dO / Q (N-major: LBO = slab stride), one
      // commit group.
      auto gemm_rs_stage = [&](float (&acc)[kN][4], const uint32_t (&a)[kKQ][4], uint32_t tile) {
#pragma unroll
        for (int kk = 0; kk < kKQ; ++kk) wgmma_rs_tnspb<kD, E>(acc, a[kk], desc_add(smem_desc(tile, L::kSlabQ, 1024), kk * 2048));
        wg_commit();
      };
      if constexpr (kDeferDk) {
        wg_wait<1>();  // dP^T (the previous step's dK may still run)
      } else {
        wg_wait<0>();
      }
      reg_fence(dpacc);
      if constexpr (Src::kFp8) {
        // FP8: dP8 (dS^T's registers) and S8 (P^T's), both on the FP8 grid, amax_dP.
        Src::template grads_fp8<kNQ>(p, delta, lane, sacc, dpacc, amax_dp);
      } else if constexpr (Src::kMods) {
        // dS^T = P^T d logit / d x (dP^T - D[query]) (+ dropout, dBias's workspace).
        Src::template grads<kNQ>(p, it, sl, info, key_thr, lse2, delta, lane, keep, warp_region, dlogit, sacc, dpacc);
      } else if constexpr (Src::kDropout) {
        // Philox dropout without modifiers: P^T m and dS^T = P^T (m dP^T - D[query]).
        Src::template drop_grads<kNQ>(p, delta, lane, keep, sacc, dpacc);
      } else {
        // dS^T = P^T (dP^T - D[query]).
#pragma unroll
        for (int j = 0; j < kNQ; ++j) {
          const float2 dd = *reinterpret_cast<const float2*>(delta + 8 * j + 2 * qd);
#pragma unroll
          for (int r = 0; r < 4; ++r) dpacc[j][r] = sacc[j][r] * (dpacc[j][r] - ((r & 1) ? dd.y : dd.x));
        }
      }
      pack_a_frag<E>(dpacc, dsa);
      pack_a_frag<E>(sacc, pa);
      if constexpr (kDeferDk) {
        // The previous step's dK done: its Q / dO stage is free (released here, not after this step's dQ, so that
        // the producer has the rest of the step to land the stage after next).
        wg_wait<0>();
        if (s > 0) mbar_arrive(bars + L::kQdoEmpty + 8 * st_prev);
      }
      // dV += P^T dO, running while dS^T goes to shared memory.
      wg_fence();
      gemm_rs_stage(dv, pa, do_tile);
      // dS^T to shared memory: key rows of 64 queries (128 B) in slab j / 8 (queries 64 (j / 8) ..),
      // chunk j % 8 at (j % 8) ^ (key % 8).
      const uint32_t ds_buf = base + L::kDS + (step_it & 1) * L::kDSBytes;
#pragma unroll
      for (int j = 0; j < kNQ; ++j) {
#pragma unroll
        for (int hi = 0; hi < 2; ++hi) {
          const uint32_t addr = ds_buf + (j >> 3) * L::kDsSlab + ds_row + hi * 8 * 128 + (((j & 7) ^ g) << 4);
          asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(addr), "r"(dsa[j >> 1][2 * (j & 1) + hi]) : "memory");
        }
      }
      fence_proxy_async_smem();
      named_bar_sync(1, L::kConsumerThreads);  // dS^T of both warpgroups in shared memory
      // dV done: P^T's registers are free before the dQ accumulators become live. (Issuing dQ and dK
      // behind a running dV, FlashAttention-3's and the seed system's order, needs 240 consumer
      // registers and so a 24-register producer warpgroup: measured no faster at D = 128 and 5 %
      // slower at D = 64, PERF_LOG v2.20; kEarlyDq: that order again on the 240-register kernel.)
      if constexpr (!kEarlyDq) wg_wait<0>();
      if constexpr (Src::kStageBias) {
        // The next step's bias into the region this step's logits read (P^T, made from it, is
        // consumed: dV is done), in flight under this step's dQ and dK and the next one's S^T. Its
        // (h, qb) are out before its Q / dO land (info_full).
        if (s + 1 < it.steps) stage_bias_of(it, sl, step_it + 1);
      }
      // dQ (64-row tiles: columns c kD/2 ..; the wide tile: rows 64c ..) = dS K (A = dS^T slab
      // M-major, B = K N-major, 8 k16 steps), then dK += dS^T Q (A from registers), which runs
      // while dQ goes to shared memory.
      float dq[L::kDqN / 8][4];
      wg_fence();
#pragma unroll
      for (int kk = 0; kk < L::kBlockK / 16; ++kk) {
        wgmma_ss_tnspab<L::kDqN, E>(dq, desc_add(smem_desc(ds_buf + ds_slab, L::kDsSlab, 1024), kk * 2048),
                                    desc_add(smem_desc(kq_t, L::kSlabK, 1024), kk * 2048), kk > 0);
      }
      wg_commit();
      if constexpr (kDeferDk) {
        wg_wait<0>();  // dQ done (with dV); dK in the next step
      } else {
        if constexpr (kLateDk) {
          gemm_dk_ss(dk, ds_buf, q_tile);
        } else {
          gemm_rs_stage(dk, dsa, q_tile);
        }
        wg_wait<1>();  // dQ done (dK may still run; kEarlyDq: dV done with it)
      }
      reg_fence(dq);
      // dQ tile to shared memory for the writer, in register order (dq_tile_offset_sm90).
      tr.mark(kTrDqDone);
      mbar_wait(bars + L::kDqEmpty, (step_it & 1) ^ 1);
      tr.mark(kTrDqEmpty);
#pragma unroll
      for (int j = 0; j < L::kDqN / 8; ++j) {
        *reinterpret_cast<float4*>(s_dq + ((c * (L::kDqN / 8) + j) * 128 + t) * 4) =
            make_float4(dq[j][0], dq[j][1], dq[j][2], dq[j][3]);
      }
      if (t == 0 && c == 0) {
        // The step's dq_accum tile: (query head, global query block).
        *reinterpret_cast<volatile int64_t*>(smem + L::kDqInfo) = int64_t(info.x) * p.view.num_q_blocks + qblk0 + info.y;
        tr.tile(int64_t(info.x) * p.view.num_q_blocks + qblk0 + info.y);
      }
      fence_proxy_async_smem();
      mbar_arrive(bars + L::kDqFull);
      tr.mark(kTrDqFull);
      if constexpr (!kLateDk && !kDeferDk) {
        wg_wait<0>();  // dK done
        mbar_arrive(bars + L::kQdoEmpty + 8 * st);  // Q, dO, the statistics and the info are free
      }
      tr.mark(kTrStepEnd);
    }
    if constexpr (kLateDk || kDeferDk) {
      // The item's last dK (kDeferDk: issued here), its stage released here; the next item's first step releases none.
      // (The wait outside the branch: inside it, ptxas serialised every wgmma of the late-dK kernels, C7518.)
      const uint32_t st_last = (step_it - 1) % L::kStages;
      if constexpr (kDeferDk) {
        if (it.steps > 0) gemm_dk_ss(dk, base + L::kDS + ((step_it - 1) & 1) * L::kDSBytes, base + L::kQ + st_last * L::kTileQ);
      }
      wg_wait<0>();
      if (it.steps > 0) mbar_arrive(bars + L::kQdoEmpty + 8 * st_last);
    }
    reg_fence(dk);
    reg_fence(dv);
    mbar_arrive(bars + L::kKvEmpty);  // K and V are free (every GEMM of the item has completed)
    const int key0 = it.kb * L::kBlockK;
    const int keys_valid = min(L::kBlockK, Src::keys_to_store(p, sl, key0));
    const int64_t krow = int64_t(p.varlen ? sl.k_start : 0) + key0;
    if constexpr (Src::kFp8Store) {
      // The FP8 backward storing dK / dV as FP8 codes itself (experimental: Fp8SourceBwdSm90<..., true>).
      Src::store_dkdv(p, it, keys_valid, krow, key_thr, lane, dk, dv);
    } else {
      // (flex: call head dims below the kernel's, a split task's slots of the call's dims)
      dkdv_epilogue_sm90<L::kBlockK, kD, kD, E, true, !Src::kAnalytic>(
          p, it, keys_valid, krow, [&] { return Src::dkdv_start(p, it.b); }, key_thr, qd, dk, dv, ColsWhole{},
          ColsWhole{});
    }
  }
}

// ---------------------------------------------------------------------------
// Column-split consumers (two warpgroups; the 64 x 64 tile of (192, 128) and (256, 256))
// ---------------------------------------------------------------------------

// The analytic element mask of one column-split step as the plan's payload word of the thread
// (shifted to its warpgroup's keys): bit 4 j + 2 hi + e for query row_thr + 8 hi and key
// key_thr + 8 j + e (key_thr = 32 c + 2 qd), from the tile mask (analytic_mask.h TileMask).
__device__ __forceinline__ uint32_t analytic_step_mask_cols(const kern::TileMask& tm, int row_thr, int key_thr) {
  uint32_t w = 0;
#pragma unroll
  for (int j = 0; j < 4; ++j) {
#pragma unroll
    for (int hi = 0; hi < 2; ++hi) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        if (tm.visible(row_thr + 8 * hi, key_thr + 8 * j + e)) w |= 1u << (4 * j + 2 * hi + e);
      }
    }
  }
  return w;
}

// acc += A B[:, the warpgroup's columns] over the step's 64 query rows (4 k16 steps): A = P or dS
// in shared memory as the M-major operand (query rows of 64 keys, 128B-swizzled: M = keys), B =
// dO or Q (N-major, kSlab-byte slabs of 64 columns). dV += P^T dO and dK += dS^T Q.
template <int kD, int kSlab, class E>
__device__ __forceinline__ void gemm_kv_cols(float (&acc)[kD / 16][4], uint32_t a_buf, uint32_t b_tile,
                                             ColPieces<kD> pc) {
  using PC = ColPieces<kD>;
  float(&a0)[PC::kN0 / 8][4] = *reinterpret_cast<float(*)[PC::kN0 / 8][4]>(&acc[0][0]);
  const uint32_t b0 = b_tile + (pc.off0() >> 6) * kSlab;
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) {
    wgmma_ss_tnspab<PC::kN0, E>(a0, desc_add(smem_desc(a_buf, 8192, 1024), kk * 2048), desc_add(smem_desc(b0, kSlab, 1024), kk * 2048), 1);
  }
  if constexpr (PC::kN1 > 0) {
    float(&a1)[PC::kN1 / 8][4] = *reinterpret_cast<float(*)[PC::kN1 / 8][4]>(&acc[PC::kN0 / 8][0]);
    const uint32_t b1 = b_tile + (pc.off1() >> 6) * kSlab + (pc.off1() & 63) * 2;
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      wgmma_ss_tnspab<PC::kN1, E>(a1, desc_add(smem_desc(a_buf, 8192, 1024), kk * 2048), desc_add(smem_desc(b1, kSlab, 1024), kk * 2048), 1);
    }
  }
}

// acc = dS K[:, the warpgroup's columns] over the block's 64 keys (4 k16 steps): A = dS (query
// rows of 64 keys, K-major: a k16 step is 32 bytes), B = K (N-major, kSlab-byte slabs).
template <int kD, int kSlab, class E>
__device__ __forceinline__ void gemm_dq_cols(float (&acc)[kD / 16][4], uint32_t ds_buf, uint32_t k_tile,
                                             ColPieces<kD> pc) {
  using PC = ColPieces<kD>;
  float(&a0)[PC::kN0 / 8][4] = *reinterpret_cast<float(*)[PC::kN0 / 8][4]>(&acc[0][0]);
  const uint32_t b0 = k_tile + (pc.off0() >> 6) * kSlab;
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) {
    wgmma_ss_tnspb<PC::kN0, E>(a0, desc_add(smem_desc(ds_buf, 16, 1024), 32 * kk), desc_add(smem_desc(b0, kSlab, 1024), kk * 2048), kk > 0);
  }
  if constexpr (PC::kN1 > 0) {
    float(&a1)[PC::kN1 / 8][4] = *reinterpret_cast<float(*)[PC::kN1 / 8][4]>(&acc[PC::kN0 / 8][0]);
    const uint32_t b1 = k_tile + (pc.off1() >> 6) * kSlab + (pc.off1() & 63) * 2;
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      wgmma_ss_tnspb<PC::kN1, E>(a1, desc_add(smem_desc(ds_buf, 16, 1024), 32 * kk), desc_add(smem_desc(b1, kSlab, 1024), kk * 2048), kk > 0);
    }
  }
}

// One step of the column-split consumers (bwd_consumer_cols, bwd_consumer_t3) up to P and dS: waits for the step's
// Q / dO stage st (phase ph), zeroes its rows past the sample (analytic sources; t: the thread's index among the
// consumers), issues S and dP for the warpgroup's 32 keys (k_rows / v_rows; m64n32, rows = the step's 64 queries),
// and leaves P = exp2(S scale log2(e) - lse2[query]) in sacc (masked elements 0: the analytic mask's bits at query
// row_thr, key key_thr of key block kb, or the payload's word pay_word >> pay_shift) and dS = P (dP - D[query]) in
// dpacc. Returns the step's info {h, qb, payload}.
template <class L, int kDqk, int kDv, class E, class Src>
__device__ __forceinline__ int4 colsplit_step_p_ds(const BwdParams& p, const typename Src::Seqlen& sl, const uint8_t* smem,
                                                   uint32_t bars, uint32_t st, uint32_t ph, uint32_t q_tile,
                                                   uint32_t do_tile, uint32_t k_rows, uint32_t v_rows, int kb, int row_thr,
                                                   int key_thr, int t, int pay_word, int pay_shift, float (&sacc)[4][4],
                                                   float (&dpacc)[4][4]) {
  const float* s_stat = reinterpret_cast<const float*>(smem + L::kStat);
  const int4* s_info = reinterpret_cast<const int4*>(smem + L::kInfo);
  mbar_wait(bars + L::kQdoFull + 8 * st, ph);
  if constexpr (Src::kAnalytic) {
    const int rows_in = sl.len_q - s_info[st].y * L::kBlockQ;
    if (rows_in < L::kBlockQ) {
      zero_rows_past<L::kBlockQ, L::kSlabs, L::kSlabsV, L::kConsumerThreads>(q_tile, do_tile, rows_in, t);
    }
  }
  wg_fence();
  wgmma_ss_kmajor<32, kDqk, L::kSlabQ, L::kSlabK, E>(sacc, q_tile, k_rows);
  wg_commit();
  wgmma_ss_kmajor<32, kDv, L::kSlabQ, L::kSlabK, E>(dpacc, do_tile, v_rows);
  wg_commit();
  const float* lse2 = s_stat + st * 2 * L::kBlockQ;
  const float* delta = lse2 + L::kBlockQ;
  const float l2[2] = {lse2[row_thr], lse2[row_thr + 8]};
  const float dd[2] = {delta[row_thr], delta[row_thr + 8]};
  const int4 info = s_info[st];  // {h, qb, payload}
  uint32_t pw = ~0u;             // a full block: every bit set
  if (info.z >= 0) {
    if constexpr (Src::kAnalytic) {
      pw = analytic_step_mask_cols(kern::TileMask::make(sl.mask, int64_t(info.y) * L::kBlockQ, int64_t(kb) * L::kBlockK),
                                   row_thr, key_thr);
    } else {
      pw = reinterpret_cast<const uint32_t*>(smem + L::kPay + st * L::kPayBytes)[pay_word] >> pay_shift;
    }
  }
  wg_wait<1>();
  reg_fence(sacc);
  // P = exp2(S scale log2(e) - lse2[query]); masked elements 0.
#pragma unroll
  for (int j = 0; j < 4; ++j) {
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      float x = kern::exp2_approx(fmaf(sacc[j][r], p.scale_log2, -l2[r >> 1]));
      if (!((pw >> (4 * j + r)) & 1u)) x = 0.0f;
      sacc[j][r] = x;
    }
  }
  wg_wait<0>();
  reg_fence(dpacc);
  // dS = P (dP - D[query]).
#pragma unroll
  for (int j = 0; j < 4; ++j) {
#pragma unroll
    for (int r = 0; r < 4; ++r) dpacc[j][r] = sacc[j][r] * (dpacc[j][r] - dd[r >> 1]);
  }
  return info;
}

// Warpgroup c (threads t = 32 w + 4 g + qd): per step, S and dP for keys 32c .. 32c + 31 of the
// block (m64n32, rows = the 64 queries, both operands K-major), P and dS of those keys into the
// step's shared P / dS buffers (query rows of 64 keys, 128B-swizzled); after a named barrier both
// warpgroups read the whole P and dS: dV[:, its Dv columns] += P^T dO and dK[:, its Dqk columns]
// += dS^T Q (SS, A M-major), dQ[:, its Dqk columns] = dS K (SS, A K-major), the columns of
// ColPieces. dK / dV (64 keys x Dqk / 2, Dv / 2 fp32) stay in registers for the item.
// Payload: S is the plan's own orientation (rows = queries), so the thread's 16 elements are
// bits 16c + 4j + r of its lane's word of 16-row sub-tile w (payload_layout.h: key 32c + 8j +
// 2qd + e, query 16w + g + 8hi; r = 2hi + e, the accumulator register).
// Src: the mask source (PlanSourceBwdSm90, or AnalyticSourceBwdSm90<64>: element masks from
// positions, rows of Q / dO / K / V past the sample zeroed in shared memory before use).
template <int kDqk, int kDv, class E, class Src>
__device__ __forceinline__ void bwd_consumer_cols(const BwdParams& p, uint32_t base, uint8_t* smem) {
  using L = BwdSm90Layout<kDqk, kDv>;
  static_assert(L::kColSplit, "the column-split consumers run the 64 x 64 tile");
  const uint32_t bars = base + L::kBar;
  const int c = consumer_warpgroup();
  const int t = threadIdx.x & 127, w = t >> 5, lane = t & 31, g = lane >> 2, qd = lane & 3;
  const int row_thr = 16 * w + g;  // first query row of S / dP and first key of dK / dV (+8: second)
  const ColPieces<kDqk> pk{c};
  const ColPieces<kDv> pv{c};
  float* s_dq = reinterpret_cast<float*>(smem + L::kDQ);
  const uint32_t k_rows = base + L::kK + c * 32 * 128;  // K rows 32c .. (B of S)
  const uint32_t v_rows = base + L::kV + c * 32 * 128;  // V rows 32c .. (B of dP)
  // P / dS store offset: query row row_thr, 16-byte chunk (4c + j) ^ g (row % 8 = g), 4 qd bytes.
  const uint32_t x_row = uint32_t(row_thr) * 128 + 4 * qd;

  uint32_t step_it = 0;
  for (uint32_t item_it = 0;; ++item_it) {
    const BwdItem it = take_bwd_item<L>(bars, smem, item_it);
    if (it.kb < 0) return;

    float dk[kDqk / 16][4], dv[kDv / 16][4];
    zero_frag(dk);
    zero_frag(dv);
    mbar_wait(bars + L::kKvFull, item_it & 1);
    const typename Src::Seqlen sl(p, it.b);
    const int64_t qblk0 = Src::q_block0(p, it.b);
    if constexpr (Src::kAnalytic) {
      const int keys_in = sl.len_k - it.kb * L::kBlockK;
      if (it.steps > 0 && keys_in < L::kBlockK) {
        zero_rows_past<L::kBlockK, L::kSlabs, L::kSlabsV>(base + L::kK, base + L::kV, keys_in, 128 * c + t);
      }
    }
    for (int s = 0; s < it.steps; ++s, ++step_it) {
      const uint32_t st = step_it % L::kStages, ph = (step_it / L::kStages) & 1;
      const uint32_t q_tile = base + L::kQ + st * L::kTileQ;
      const uint32_t do_tile = base + L::kDO + st * L::kTileDO;
      float sacc[4][4], dpacc[4][4];
      const int4 info = colsplit_step_p_ds<L, kDqk, kDv, E, Src>(p, sl, smem, bars, st, ph, q_tile, do_tile, k_rows,
                                                                 v_rows, it.kb, row_thr, 32 * c + 2 * qd, 128 * c + t,
                                                                 32 * w + lane, 16 * c, sacc, dpacc);
      // P and dS of keys 32c .. to the step's buffers (double-buffered: the other warpgroup has
      // finished every GEMM of step - 1, so of the buffer's last use, before it passed the
      // barrier of step - 1 that this warpgroup passed too).
      const uint32_t p_buf = base + L::kDS + (step_it & 1) * L::kDSBytes;
      const uint32_t ds_buf = p_buf + L::kXBytes;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
#pragma unroll
        for (int hi = 0; hi < 2; ++hi) {
          const uint32_t off = x_row + hi * 8 * 128 + (((4 * c + j) ^ g) << 4);
          const uint32_t pp = kern::pack2<E>(sacc[j][2 * hi], sacc[j][2 * hi + 1]);
          const uint32_t dsp = kern::pack2<E>(dpacc[j][2 * hi], dpacc[j][2 * hi + 1]);
          asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(p_buf + off), "r"(pp) : "memory");
          asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(ds_buf + off), "r"(dsp) : "memory");
        }
      }
      fence_proxy_async_smem();
      named_bar_sync(1, L::kConsumerThreads);  // P and dS of both warpgroups in shared memory
      float dq[kDqk / 16][4];
      wg_fence();
      if constexpr (L::kStages == 1) {
        // One Q / dO stage ((256, 256)): dV and dK (the GEMMs that read Q and dO) first, so that
        // the stage is free, and the producer loads the next step's Q and dO, while dQ = dS K (K
        // and dS only) runs and goes to shared memory; with dQ first the next step's loads
        // waited for every GEMM of this one.
        gemm_kv_cols<kDv, L::kSlabQ, E>(dv, p_buf, do_tile, pv);
        gemm_kv_cols<kDqk, L::kSlabQ, E>(dk, ds_buf, q_tile, pk);
        wg_commit();
        gemm_dq_cols<kDqk, L::kSlabK, E>(dq, ds_buf, base + L::kK, pk);
        wg_commit();
        wg_wait<1>();                                // dV, dK done (dQ may still run)
        mbar_arrive(bars + L::kQdoEmpty + 8 * st);  // Q, dO, the statistics and the info are free
        wg_wait<0>();                                // dQ done
      } else {
        // dQ (the warpgroup's columns) = dS K first, so that its store overlaps dV and dK.
        gemm_dq_cols<kDqk, L::kSlabK, E>(dq, ds_buf, base + L::kK, pk);
        wg_commit();
        gemm_kv_cols<kDv, L::kSlabQ, E>(dv, p_buf, do_tile, pv);
        gemm_kv_cols<kDqk, L::kSlabQ, E>(dk, ds_buf, q_tile, pk);
        wg_commit();
        wg_wait<1>();  // dQ done (dV, dK may still run)
      }
      reg_fence(dq);
      mbar_wait(bars + L::kDqEmpty, (step_it & 1) ^ 1);
#pragma unroll
      for (int n = 0; n < kDqk / 16; ++n) {
        // n8 block pk(n) / 8 of the tile, in register order (dq_tile_offset_sm90).
        *reinterpret_cast<float4*>(s_dq + ((pk(n) >> 3) * 128 + t) * 4) = make_float4(dq[n][0], dq[n][1], dq[n][2], dq[n][3]);
      }
      if (t == 0 && c == 0) {
        *reinterpret_cast<volatile int64_t*>(smem + L::kDqInfo) = int64_t(info.x) * p.view.num_q_blocks + qblk0 + info.y;
      }
      fence_proxy_async_smem();
      mbar_arrive(bars + L::kDqFull);
      if constexpr (L::kStages != 1) {
        wg_wait<0>();                                // dV, dK done
        mbar_arrive(bars + L::kQdoEmpty + 8 * st);  // Q, dO, the statistics and the info are free
      }
    }
    reg_fence(dk);
    reg_fence(dv);
    mbar_arrive(bars + L::kKvEmpty);
    const int key0 = it.kb * L::kBlockK;
    const int keys_valid = min(L::kBlockK, Src::keys_to_store(p, sl, key0));
    const int64_t krow = int64_t(p.varlen ? sl.k_start : 0) + key0;
    dkdv_epilogue_sm90<L::kBlockK, kDqk, kDv, E>(p, it, keys_valid, krow, [&] { return Src::dkdv_start(p, it.b); },
                                                  row_thr, qd, dk, dv, pk, pv);
  }
}

// ---------------------------------------------------------------------------
// Three consumer warpgroups (the 64 x 96 tile of (192, 128); dK / dV transposed)
// ---------------------------------------------------------------------------

// Named barrier of the three consumer warpgroups before a step's P / dS stores: the one P / dS
// buffer is free (each warpgroup reaches it only after every GEMM of its previous step has
// completed). 1: P and dS complete; 2: kZeroBar (analytic source, not used here).
constexpr int kPdsFreeBar = 3;

// acc (m64n96: rows = 64 head-dim columns, cols = the block's 96 keys) += X^T Y over the step's 64
// query rows (4 k16 steps): A = X^T, X = Q or dO's 64-column slab x_slab (query rows of 128 B,
// 128B-swizzled: M-major), B = Y = dS or P in the step's buffer (query rows of 64 keys, two slabs of
// kYSlab bytes, the second one's first 32 keys used: N-major). dK^T += Q^T dS and dV^T += dO^T P.
// As two wgmma of N = 64 (keys 0 .. 63, slab 0) and N = 32 (keys 64 .. 95, slab 1): an N-major
// operand of the 128B swizzle spans whole 64-element atoms in the canonical layouts of the PTX
// ISA, which N = 96 does not.
template <int kXSlab, int kYSlab, class E>
__device__ __forceinline__ void gemm_kv_t3(float (&acc)[12][4], uint32_t x_slab, uint32_t y_buf) {
  float(&a0)[8][4] = *reinterpret_cast<float(*)[8][4]>(&acc[0][0]);
  float(&a1)[4][4] = *reinterpret_cast<float(*)[4][4]>(&acc[8][0]);
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) {
    const uint64_t da = desc_add(smem_desc(x_slab, kXSlab, 1024), kk * 2048);
    const uint64_t dy = smem_desc(y_buf, kYSlab, 1024);
    wgmma_ss_tnspab<64, E>(a0, da, desc_add(dy, kk * 2048), 1);
    wgmma_ss_tnspab<32, E>(a1, da, desc_add(dy, kYSlab + kk * 2048), 1);
  }
}

// acc = dS K[:, 64 columns] over the block's 96 keys (6 k16 steps): A = dS (query rows of keys,
// K-major: a k16 step is 32 bytes inside a 64-key slab, the second slab after 4 steps), B = K's
// 64-column slab k_slab (key rows of 128 B: N-major).
template <int kXSlab, int kKSlab, class E>
__device__ __forceinline__ void gemm_dq_t3(float (&acc)[8][4], uint32_t ds_buf, uint32_t k_slab) {
#pragma unroll
  for (int kk = 0; kk < 6; ++kk) {
    wgmma_ss_tnspb<64, E>(acc, desc_add(smem_desc(ds_buf, 16, 1024), (kk >> 2) * kXSlab + 32 * (kk & 3)),
                          desc_add(smem_desc(k_slab, kKSlab, 1024), kk * 2048), kk > 0);
  }
}

// Epilogue of a work item of the three-warpgroup consumers: the thread holds dK^T (and, in
// warpgroups 0 and 1, dV^T) of head-dim columns d0 and d0 + 8 (rows of its m64n96 accumulators) for
// keys 8 j + 2 qd + e (j < 12, e < 2). slot >= 0: dK (unscaled) and dV added with fp32 atomics to
// split slot `slot` ([96, Dqk] / [96, Dv] fp32, bwd_split.cuh); else dK (times the softmax scale) and
// dV elements of the valid keys written in the input dtype (16-bit stores: a warp's store covers 4
// keys x 8 columns; once per item).
template <int kDqk, int kDv, class E, class Start>
__device__ __forceinline__ void dkdv_epilogue_t3(const BwdParams& p, const BwdItem& it, int keys_valid, int64_t krow,
                                                 Start start_of, int d0, int qd, bool has_dv,
                                                 const float (&dkt)[12][4], const float (&dvt)[12][4]) {
  using Elem = typename E::Storage;
  if (it.slot >= 0) {
    const bool own = split_slot_owned(p);  // (as dkdv_epilogue_sm90's)
    float* dka = p.split.dk_accum + int64_t(it.slot) * 96 * kDqk;
    float* dva = p.split.dv_accum + int64_t(it.slot) * 96 * kDv;
#pragma unroll
    for (int j = 0; j < 12; ++j) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int key = 8 * j + 2 * qd + e;
        if (key < keys_valid) {
#pragma unroll
          for (int hi = 0; hi < 2; ++hi) {
            float* a = dka + int64_t(key) * kDqk + d0 + 8 * hi;
            float* b = dva + int64_t(key) * kDv + d0 + 8 * hi;
            if (own) {
              *a = dkt[j][2 * hi + e];
              if (has_dv) *b = dvt[j][2 * hi + e];
            } else {
              atomicAdd(a, dkt[j][2 * hi + e]);
              if (has_dv) atomicAdd(b, dvt[j][2 * hi + e]);
            }
          }
        }
      }
    }
    return;
  }
  const longlong2 start = start_of();
  Elem* dkp = static_cast<Elem*>(p.dk) + start.x + krow * p.dka.row_stride + int64_t(it.hkv) * p.dka.head_stride + d0;
  Elem* dvp = static_cast<Elem*>(p.dv) + start.y + krow * p.dva.row_stride + int64_t(it.hkv) * p.dva.head_stride + d0;
#pragma unroll
  for (int j = 0; j < 12; ++j) {
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int key = 8 * j + 2 * qd + e;
      if (key < keys_valid) {
#pragma unroll
        for (int hi = 0; hi < 2; ++hi) {
          dkp[int64_t(key) * p.dka.row_stride + 8 * hi] = kern::from_float<E>(dkt[j][2 * hi + e] * p.scale);
          if (has_dv) dvp[int64_t(key) * p.dva.row_stride + 8 * hi] = kern::from_float<E>(dvt[j][2 * hi + e]);
        }
      }
    }
  }
}

// Warpgroup c of three (threads t = 32 w + 4 g + qd), FlashAttention-3's hdim-192 backward schedule
// (three MMA warpgroups, dK / dV transposed so that N = the 96 keys). Per step: S and dP for keys
// 32c .. 32c + 31 of the block (m64n32, rows = the 64 queries, both operands K-major), P and dS of
// those keys into the step's buffer (after a named barrier: the buffer's previous readers are done);
// after the barrier of all three, dQ[:, 64c .. 64c + 63] = dS K (m64n64, 6 k16 steps), dK^T[64c ..
// 64c + 63, :] += Q^T dS and, for c < 2, dV^T[64c .., :] += dO^T P (m64n96, 4 k16 steps each).
// dK^T / dV^T (48 + 48 fp32 registers) stay in registers for the item (within the 160 of
// setmaxnreg: S, dP 16 + 16 while they live, dQ 32 after them). Per step and warpgroup: 12 + 8 wgmma
// k16 instructions of N = 32 (S, dP), 6 of N = 64 (dQ), 4 + 4 (c < 2) of N = 64 + 32; the 64 x 64 tile's
// two warpgroups had the same GEMMs per query block for 2/3 of the keys, so the bytes a step moves
// through L2 (Q, dO 40 KB, the fp32 dQ tile 48 KB) now serve 1.5x the FLOPs.
// Payload (64 x 96 tile: 64-column sub-tiles, the second with 32 columns, payload_layout.h): the
// thread's 16 elements are bits 16 (c % 2) + 4 j + r of word (2 w + c / 2) 32 + lane.
// Src: the mask source (PlanSourceBwdSm90, or AnalyticSourceBwdSm90<96>: element masks from
// positions, rows of Q / dO / K / V past the sample zeroed in shared memory before use).
template <int kDqk, int kDv, class E, class Src>
__device__ __forceinline__ void bwd_consumer_t3(const BwdParams& p, uint32_t base, uint8_t* smem) {
  using L = BwdSm90Layout<kDqk, kDv, true>;
  static_assert(L::kT3 && kDqk == 192 && kDv == 128 && L::kStages == 2, "the three-warpgroup consumers run (192, 128) on 64 x 96");
  const uint32_t bars = base + L::kBar;
  // 0, 1, 2; broadcast from lane 0 so that the compiler knows it is warp-uniform: the dV^T GEMM's
  // branch on it (has_dv) is then not a divergent path, behind which ptxas serialises every wgmma of
  // the kernel (C7520: a warpgroup arrive and wait around each of the 43 HGMMA a step, PERF_LOG v2.20).
  const int c = consumer_warpgroup();
  const int t = threadIdx.x & 127, w = t >> 5, lane = t & 31, g = lane >> 2, qd = lane & 3;
  const int row_thr = 16 * w + g;  // first query row of S / dP (+8: second)
  const bool has_dv = c < 2;       // dV^T's 128 rows: warpgroups 0 and 1
  float* s_dq = reinterpret_cast<float*>(smem + L::kDQ);
  const uint32_t k_rows = base + L::kK + c * 32 * 128;  // K rows 32c .. (B of S)
  const uint32_t v_rows = base + L::kV + c * 32 * 128;  // V rows 32c .. (B of dP)
  const uint32_t k_slab = base + L::kK + c * L::kSlabK;  // K columns 64c .. (B of dQ)
  const uint32_t p_buf = base + L::kDS;
  const uint32_t ds_buf = p_buf + L::kXBytes;
  // P / dS store offset: query row row_thr, slab c / 2, 16-byte chunk (4 (c % 2) + j) ^ g, 4 qd bytes.
  const uint32_t x_row = (c >> 1) * L::kXSlab + uint32_t(row_thr) * 128 + 4 * qd;
  const int pay_word = (2 * w + (c >> 1)) * 32 + lane, pay_shift = 16 * (c & 1);

  uint32_t step_it = 0;
  for (uint32_t item_it = 0;; ++item_it) {
    const BwdItem it = take_bwd_item<L>(bars, smem, item_it);
    if (it.kb < 0) return;

    float dkt[12][4], dvt[12][4];
    zero_frag(dkt);
    zero_frag(dvt);
    mbar_wait(bars + L::kKvFull, item_it & 1);
    const typename Src::Seqlen sl(p, it.b);
    const int64_t qblk0 = Src::q_block0(p, it.b);
    if constexpr (Src::kAnalytic) {
      const int keys_in = sl.len_k - it.kb * L::kBlockK;
      if (it.steps > 0 && keys_in < L::kBlockK) {
        zero_rows_past<L::kBlockK, L::kSlabs, L::kSlabsV, L::kConsumerThreads>(base + L::kK, base + L::kV, keys_in,
                                                                              128 * c + t);
      }
    }
    for (int s = 0; s < it.steps; ++s, ++step_it) {
      const uint32_t st = step_it % L::kStages, ph = (step_it / L::kStages) & 1;
      const uint32_t q_tile = base + L::kQ + st * L::kTileQ;
      const uint32_t do_tile = base + L::kDO + st * L::kTileDO;
      float sacc[4][4], dpacc[4][4];
      const int4 info = colsplit_step_p_ds<L, kDqk, kDv, E, Src>(p, sl, smem, bars, st, ph, q_tile, do_tile, k_rows,
                                                                 v_rows, it.kb, row_thr, 32 * c + 2 * qd, 128 * c + t,
                                                                 pay_word, pay_shift, sacc, dpacc);
      named_bar_sync(kPdsFreeBar, L::kConsumerThreads);  // every warpgroup's previous GEMMs are done
#pragma unroll
      for (int j = 0; j < 4; ++j) {
#pragma unroll
        for (int hi = 0; hi < 2; ++hi) {
          const uint32_t off = x_row + hi * 8 * 128 + (((4 * (c & 1) + j) ^ g) << 4);
          const uint32_t pp = kern::pack2<E>(sacc[j][2 * hi], sacc[j][2 * hi + 1]);
          const uint32_t dsp = kern::pack2<E>(dpacc[j][2 * hi], dpacc[j][2 * hi + 1]);
          asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(p_buf + off), "r"(pp) : "memory");
          asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(ds_buf + off), "r"(dsp) : "memory");
        }
      }
      fence_proxy_async_smem();
      named_bar_sync(1, L::kConsumerThreads);  // P and dS of all three warpgroups in shared memory
      // dQ first, so that its store overlaps dK^T and dV^T.
      float dq[8][4];
      wg_fence();
      gemm_dq_t3<L::kXSlab, L::kSlabK, E>(dq, ds_buf, k_slab);
      wg_commit();
      gemm_kv_t3<L::kSlabQ, L::kXSlab, E>(dkt, q_tile + c * L::kSlabQ, ds_buf);
      if (has_dv) gemm_kv_t3<L::kSlabQ, L::kXSlab, E>(dvt, do_tile + c * L::kSlabQ, p_buf);
      wg_commit();
      wg_wait<1>();  // dQ done (dK^T, dV^T may still run)
      reg_fence(dq);
      mbar_wait(bars + L::kDqEmpty, (step_it & 1) ^ 1);
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        // n8 block 8c + j of the tile, in register order (dq_tile_offset_sm90).
        *reinterpret_cast<float4*>(s_dq + ((8 * c + j) * 128 + t) * 4) = make_float4(dq[j][0], dq[j][1], dq[j][2], dq[j][3]);
      }
      if (t == 0 && c == 0) {
        *reinterpret_cast<volatile int64_t*>(smem + L::kDqInfo) = int64_t(info.x) * p.view.num_q_blocks + qblk0 + info.y;
      }
      fence_proxy_async_smem();
      mbar_arrive(bars + L::kDqFull);
      wg_wait<0>();                                // dK^T, dV^T done
      mbar_arrive(bars + L::kQdoEmpty + 8 * st);  // Q, dO, the statistics and the info are free
    }
    reg_fence(dkt);
    reg_fence(dvt);
    mbar_arrive(bars + L::kKvEmpty);
    const int key0 = it.kb * L::kBlockK;
    const int keys_valid = min(L::kBlockK, Src::keys_to_store(p, sl, key0));
    const int64_t krow = int64_t(p.varlen ? sl.k_start : 0) + key0;
    dkdv_epilogue_t3<kDqk, kDv, E>(p, it, keys_valid, krow, [&] { return Src::dkdv_start(p, it.b); },
                                   64 * c + row_thr, qd, has_dv, dkt, dvt);
  }
}

#endif  // __CUDA_ARCH__

// The kernel body of mask source Src (PlanSourceBwdSm90: flex; AnalyticSourceBwdSm90: SDPA, the
// key-split and column-split kernels alike: AnalyticSourceBwdSm90<kBlockK>).
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
template <int kD, class E, int kDv, class Src, bool kWideTile = false, int kOrder = 0>
__device__ __forceinline__ void bwd_sm90_body(const BwdParams& p, const CUtensorMap* tm_q, const CUtensorMap* tm_k,
                                              const CUtensorMap* tm_v, const CUtensorMap* tm_do) {
  using L = BwdSm90Layout<kD, kDv, kWideTile>;
  if constexpr (Src::kAnalytic) {
    static_assert(L::kBlockQ == Src::kBlockQ && L::kBlockK == Src::kBlockK,
                  "the analytic source walks the kernel's tile (AnalyticSourceBwdSm90<kBlockK>)");
  }
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  const uint32_t raw = kern::smem_u32(smem_raw);
  const uint32_t base = (raw + 1023u) & ~1023u;
  uint8_t* smem = smem_raw + (base - raw);
  const uint32_t bars = base + L::kBar;
  if (threadIdx.x == 0) {
    mbar_init(bars + L::kKvFull, 1);                       // producer arrive + tx
    mbar_init(bars + L::kKvEmpty, L::kConsumerThreads);
    for (int s = 0; s < L::kStages; ++s) {
      mbar_init(bars + L::kQdoFull + 8 * s, 33);           // lane 0's arrive + tx, then each producer lane's
      mbar_init(bars + L::kQdoEmpty + 8 * s, L::kConsumerThreads);
    }
    mbar_init(bars + L::kDqFull, L::kConsumerThreads);
    // The writers' lane 0 (two when the dQ tiles are added in halves: dq_chunks).
    const int writers = p.dq_chunks;
    mbar_init(bars + L::kDqEmpty, writers);
    for (int i = 0; i < 2; ++i) {
      mbar_init(bars + L::kItemFull + 8 * i, 1);
      // consumers + the writers (+ the dQ order warp when the dQ tiles are ordered)
      mbar_init(bars + L::kItemEmpty + 8 * i, L::kConsumerThreads + writers + (p.dq_sem != nullptr ? 1 : 0));
      mbar_init(bars + L::kRankFull + 8 * i, 1);
      mbar_init(bars + L::kRankEmpty + 8 * i, writers);
    }
    if constexpr (Src::kStageBias) {
      for (int i = 0; i < L::kStages; ++i) mbar_init(bars + L::kInfoFull + 8 * i, 1);  // the producer's lane 0
    }
    fence_barrier_init();
  }
  __syncthreads();
  // kBwdOrder240: 24 / 240 (FlashAttention-3's split; the producer warpgroup spills), else the layout's.
  constexpr bool k240 = kBwdOrderRegs240<kOrder>;
  static_assert(!k240 || (!L::kT3 && !L::kColSplit), "sm90 backward: kOrder is the key-split consumers'");
  constexpr int kProducerRegs = k240 ? 24 : L::kProducerRegs;
  constexpr int kConsumerRegs = k240 ? 240 : L::kConsumerRegs;
  static_assert(128 * kProducerRegs + L::kConsumerThreads * kConsumerRegs <= L::kThreads * L::kLaunchRegs,
                "sm90 backward: setmaxnreg beyond the CTA's register pool");
  if (threadIdx.x < 128) {
    setmaxnreg_dec<kProducerRegs>();
    const int warp = threadIdx.x >> 5;
    if (warp == 0) {
      if constexpr (Src::kAnalytic) {
        bwd_producer<L, Src, kern::AnalyticK2QWalk>(p, tm_q, tm_k, tm_v, tm_do, base, smem);
      } else if (p.deterministic) {
        bwd_producer<L, Src, kern::K2QWalkAscending>(p, tm_q, tm_k, tm_v, tm_do, base, smem);
      } else {
        bwd_producer<L, Src, kern::K2QWalk>(p, tm_q, tm_k, tm_v, tm_do, base, smem);
      }
    } else if (warp == 1) {
      bwd_dq_writer<L>(p, base, smem, 0);
    } else if (warp == 2 && p.dq_sem != nullptr) {
      bwd_dq_order<L, Src>(p, smem, bars);
    } else if (warp == 3 && p.dq_chunks == 2) {
      bwd_dq_writer<L>(p, base, smem, 1);
    }
    // Exit here rather than fall through to the kernel's end: when the 24-register warpgroup's
    // path merges with the consumers' (the shared exit), ptxas (nvcc 13.0) caps the consumers'
    // registers near 204 instead of their 240 and spills (C7512); with the exit it does not.
    asm volatile("exit;");
  }
  setmaxnreg_inc<kConsumerRegs>();
  if constexpr (L::kT3) {
    bwd_consumer_t3<kD, kDv, E, Src>(p, base, smem);
  } else if constexpr (L::kColSplit) {
    bwd_consumer_cols<kD, kDv, E, Src>(p, base, smem);
  } else {
    bwd_consumer<kD, E, Src, kWideTile, kOrder>(p, base, smem);
  }
}
#endif

// The kernel. Built for every target; the body exists only for sm_90a (the host checks the
// loaded binary's version before choosing this family: launch_fwd_sm90.cu, device_supported).
// Head dims (kD, kDv): (64, 64), (128, 128) (key-split consumers), (192, 128), (256, 256)
// (column-split consumers); kWideTile: (64, 64) on the wide 128 x 128 tile (key-split consumers)
// or (192, 128) on the 64 x 96 tile (three-warpgroup consumers).
template <int kD, class E, int kDv = kD, bool kWideTile = false, int kOrder = 0>
__global__ void __launch_bounds__(BwdSm90Layout<kD, kDv, kWideTile>::kThreads, 1)
    flex_bwd_kernel_sm90(const __grid_constant__ BwdParams p, const __grid_constant__ CUtensorMap tm_q,
                         const __grid_constant__ CUtensorMap tm_k, const __grid_constant__ CUtensorMap tm_v,
                         const __grid_constant__ CUtensorMap tm_do) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  bwd_sm90_body<kD, E, kDv, PlanSourceBwdSm90, kWideTile, kOrder>(p, &tm_q, &tm_k, &tm_v, &tm_do);
#else
  // No sm_90a code in this image: never launched (the host checks the binary version).
  __trap();
#endif
}

// The SDPA backward (analytic mask, AnalyticSourceBwdSm90): the same kernel over an
// SdpaBwdParams, (kD, kDv) = (64, 64) or (128, 128) (the key-split consumers; a call's head dims
// up to kD, multiples of 8) or exactly (192, 128) / (256, 256) (the column-split consumers; with
// kWideTile, (192, 128) on the 64 x 96 tile: the three-warpgroup consumers), deterministic or not at
// run time (one instantiation per dtype and head dims).
template <int kD, class E, int kDv = kD, bool kWideTile = false, int kOrder = 0>
__global__ void __launch_bounds__(BwdSm90Layout<kD, kDv, kWideTile>::kThreads, 1)
    sdpa_bwd_kernel_sm90(const __grid_constant__ SdpaBwdParams p, const __grid_constant__ CUtensorMap tm_q,
                         const __grid_constant__ CUtensorMap tm_k, const __grid_constant__ CUtensorMap tm_v,
                         const __grid_constant__ CUtensorMap tm_do) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  bwd_sm90_body<kD, E, kDv, AnalyticSourceBwdSm90<BwdSm90Layout<kD, kDv, kWideTile>::kBlockK>, kWideTile, kOrder>(
      p, &tm_q, &tm_k, &tm_v, &tm_do);
#else
  __trap();
#endif
}

// dq = scale * dq_accum from the sm90 backward's tiles (one per (query head, global query
// block), kBq x kD, dq_tile_offset_sm90) in the input dtype. One warp per (query row, head),
// grid-stride over the Hq * total_q units, as the shared convert (bwd_prepost.cuh). kBq: the
// plan's backward query block (64, or 128 on the wide tile of (64, 64)).
template <int kD, class E, int kBq = 64>
__global__ void __launch_bounds__(256) flex_bwd_dq_convert_kernel_sm90(const BwdParams p) {
  using Elem = typename E::Storage;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t units = int64_t(p.num_heads_q) * p.total_q;
  for (int64_t w = int64_t(blockIdx.x) * 8 + warp; w < units; w += int64_t(gridDim.x) * 8) {
    const int64_t h = w / p.total_q, t = w - h * p.total_q;
    const kern::QueryRow qr = kern::query_row(p, t);
    // Sample and sample-local position of row t (THD: the last sample starting at or before t;
    // empty samples own no row).
    const int b = p.varlen ? kern::find_block_owner(p.cu_seqlens_q, p.batch, int(t)) : int(qr.b);
    const int64_t pos = p.varlen ? t - __ldg(p.cu_seqlens_q + b) : qr.row;
    const int64_t tile = h * p.view.num_q_blocks + __ldg(p.view.q_block_start + b) + pos / kBq;
    const float* src = p.dq_accum + tile * (kBq * kD);
    const int rr = int(pos % kBq);
    Elem* dst = static_cast<Elem*>(p.dq) + qr.b * p.dqa.batch_stride + qr.row * p.dqa.row_stride + h * p.dqa.head_stride;
#pragma unroll
    for (int d = 2 * lane; d < kD; d += 64) {
      if (d < p.head_dqk) {  // (a call's head dim below the kernel's: its columns only)
        const float2 x = *reinterpret_cast<const float2*>(src + dq_tile_offset_sm90<kD, kBq>(rr, d));
        *reinterpret_cast<uint32_t*>(dst + d) = kern::pack2<E>(x.x * p.scale, x.y * p.scale);
      }
    }
  }
}

// dq = scale * dq_accum of the SDPA backward (sdpa_bwd_kernel_sm90): the rows of every sample
// padded to S_q (total_q = B S_q; row t is position t % S_q of sample t / S_q), tile (query head,
// sample b's query block b * num_q_blocks + pos / 64), written in the input dtype at the dQ
// tensor's own sample start (padded: every row, 0 past the sample; packed: the sample's rows) and only the call's
// head_dqk columns (a smaller head dim than kD runs on the kD kernel). One warp per (row, head).
template <int kD, class E, int kDv = kD>
__global__ void __launch_bounds__(256) sdpa_bwd_dq_convert_kernel_sm90(const SdpaBwdParams p) {
  using Elem = typename E::Storage;
  constexpr int kBq = BwdSm90Layout<kD, kDv>::kBlockQ;
  const AnalyticMaskParams& a = p.analytic;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t units = int64_t(p.num_heads_q) * p.total_q;
  for (int64_t w = int64_t(blockIdx.x) * 8 + warp; w < units; w += int64_t(gridDim.x) * 8) {
    const int64_t h = w / p.total_q, t = w - h * p.total_q;
    const int b = int(t / a.max_q);
    const int64_t pos = t - int64_t(b) * a.max_q;
    // A packed dQ (experimental): the sample's rows only (the next sample's follow).
    if (a.start[kSdpaDQ].ragged.ptr != nullptr && pos >= kern::sample_length(a.seq_len_q, a.cu_seq_len_q, a.max_q, b)) {
      continue;
    }
    const int64_t tile = h * p.view.num_q_blocks + int64_t(b) * a.num_q_blocks + pos / kBq;
    const float* src = p.dq_accum + tile * (kBq * kD);
    const int rr = int(pos % kBq);
    Elem* dst = static_cast<Elem*>(p.dq) + kern::sample_start(a.start[kSdpaDQ], b) + pos * p.dqa.row_stride +
                h * p.dqa.head_stride;
#pragma unroll
    for (int d = 2 * lane; d < kD; d += 64) {
      if (d < p.head_dqk) {
        const float2 x = *reinterpret_cast<const float2*>(src + dq_tile_offset_sm90<kD>(rr, d));
        *reinterpret_cast<uint32_t*>(dst + d) = kern::pack2<E>(x.x * p.scale, x.y * p.scale);
      }
    }
  }
}

// One (key row, head) unit of the slot sums of H_k != H_v's dK / dV (sdpa_bwd_dkdv_sum_kernel_sm90 below, the FP8
// backward's store pass, kernel_bwd_fp8_sm90.cuh): unit w of the B S_kv (H_k + H_v) units, dK's heads first, rows
// = B S_kv; g the item group (AnalyticItemsBwdSm90::item_group).
struct DkdvSlotUnit {
  bool is_v;
  int h, b, s;      // the unit's K or V head, sample, key row in the sample
  int kb, r;        // that row's key block (bk keys) and row in it
  int ratio;        // the item heads whose slots hold the head's partial sums: h ratio .. h ratio + ratio - 1
  __device__ __forceinline__ static DkdvSlotUnit of(const BwdParams& p, int64_t w, int64_t rows, int heads_k, int bk,
                                                    int g) {
    const AnalyticMaskParams& a = kern::analytic_of(p);
    DkdvSlotUnit u;
    const int64_t hh = w / rows, t = w - hh * rows;
    u.is_v = hh >= heads_k;
    u.h = int(u.is_v ? hh - heads_k : hh);
    u.b = int(t / a.max_kv);
    u.s = int(t - int64_t(u.b) * a.max_kv);
    u.kb = u.s / bk;
    u.r = u.s - u.kb * bk;
    u.ratio = (u.is_v ? a.score.group_v : p.group_size) / g;
    return u;
  }
  // The float pair at column c of item head i's slot row (accum: dk_accum or dv_accum, width floats a row).
  __device__ __forceinline__ float2 at(const float* accum, const kern::AnalyticBwdGrid& grid, int i, int bk, int width,
                                       int c) const {
    return *reinterpret_cast<const float2*>(accum + (grid.slot(kb, i, b) * bk + r) * width + c);
  }
};

// dK and dV of an SDPA call with H_k != H_v (AnalyticSourceBwdSm90): every work item added its
// partial dK / dV (unscaled) into its own fp32 slot of p.split.dk_accum / dv_accum ([bk, kd] /
// [bk, kdv] floats, bk = p.view.block_k the kernel's key block, kd / kdv its head dims; slot =
// AnalyticBwdGrid::slot of its cell). The rows of K head hk are the sum of the slots of item heads
// hk r .. hk r + r - 1 (r = group_size / item_group), those of V head hv of hv r' .. (r' = group_v /
// item_group), added in that order from zero (a fixed order: bitwise reproducible); dK times the
// softmax scale. Written in the input dtype at each tensor's own sample start: every row below S_kv
// (0 past the sample: the slots hold 0 there) and the call's head_dqk / head_dv columns. One warp
// per (key row, head) of dK, then of dV, grid-stride over the B S_kv (H_k + H_v) units.
template <class E>
__global__ void __launch_bounds__(256) sdpa_bwd_dkdv_sum_kernel_sm90(const SdpaBwdParams p, int kd, int kdv) {
#if defined(__CUDA_ARCH__)
  using Elem = typename E::Storage;
  const AnalyticMaskParams& a = p.analytic;
  const kern::AnalyticBwdGrid grid = AnalyticItemsBwdSm90::grid(p);
  const int g = AnalyticItemsBwdSm90::item_group(p);
  const int heads_k = p.num_heads_q / p.group_size;
  const int bk = p.view.block_k;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t rows = int64_t(p.batch) * a.max_kv;
  const int64_t units = rows * (heads_k + p.num_heads_q / a.score.group_v);
  for (int64_t w = int64_t(blockIdx.x) * 8 + warp; w < units; w += int64_t(gridDim.x) * 8) {
    const DkdvSlotUnit un = DkdvSlotUnit::of(p, w, rows, heads_k, bk, g);
    const bool is_v = un.is_v;
    // A packed dK / dV (experimental): the sample's rows only (the next sample's follow).
    if (a.start[is_v ? kSdpaDV : kSdpaDK].ragged.ptr != nullptr &&
        un.s >= kern::sample_length(a.seq_len_kv, a.cu_seq_len_kv, a.max_kv, un.b)) {
      continue;
    }
    const int width = is_v ? kdv : kd;
    const int cols = is_v ? p.head_dv : p.head_dqk;
    const float scale = is_v ? 1.0f : p.scale;
    const float* acc = is_v ? p.split.dv_accum : p.split.dk_accum;
    Elem* dst = is_v ? static_cast<Elem*>(p.dv) + kern::sample_start(a.start[kSdpaDV], un.b) +
                           un.s * p.dva.row_stride + int64_t(un.h) * p.dva.head_stride
                     : static_cast<Elem*>(p.dk) + kern::sample_start(a.start[kSdpaDK], un.b) +
                           un.s * p.dka.row_stride + int64_t(un.h) * p.dka.head_stride;
    for (int c = 2 * lane; c < cols; c += 64) {
      float2 x = make_float2(0.0f, 0.0f);
      for (int u = un.h * un.ratio; u < (un.h + 1) * un.ratio; ++u) {
        const float2 y = un.at(acc, grid, u, bk, width, c);
        x.x += y.x;
        x.y += y.y;
      }
      *reinterpret_cast<uint32_t*>(dst + c) = kern::pack2<E>(x.x * scale, x.y * scale);
    }
  }
#endif
}

}  // namespace flashspan::kern90
