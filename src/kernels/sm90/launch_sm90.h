// Host side of the sm90 (Hopper: TMA + wgmma) kernel family: the forward, and the backward for
// the configurations it covers (bwd_config_supported); the backward of other sm90 plans runs
// on the sm80 kernels (the sm90 consumer's backward tile is the sm80 one there: tile_sm90.h).
#pragma once

#include <cuda_runtime.h>

#include "core/geometry.h"
#include "core/tensor_view.h"
#include "kernels/params.h"

namespace flashspan::sm90 {

// Whether the sm90 forward kernel covers a configuration (independent of the device): fp16 or
// bf16, head dims of fwd_runs_head_dims_sm90 (tile_sm90.h: each a multiple of 8 up to 128, or
// (192, 128), or (256, 256)), unpacked forward rows, or packed rows (pack_gqa with G > 1) when
// fwd_packed_enabled() and G is one of fwd_runs_pack_sm90 (a power of two dividing 128). Plans
// of the sm90 family are only built for such configurations (c_api.cpp, resolve_arch).
bool fwd_config_supported(const FlexGeometry& g, bool pack_gqa);

// Whether packed-GQA plans may run on the sm90 forward: yes unless the environment sets
// FLASHSPAN_SM90_PACK_GQA=0 (read once, when the library is loaded; then packed plans keep the
// sm80 family). set_fwd_packed_enabled overrides it for this process (tests: 1 on, 0 off, -1 back
// to the environment's answer).
bool fwd_packed_enabled();
void set_fwd_packed_enabled(int on);
// Calls of launch_fwd_sm90 in this process so far (tests check that the sm90 forward ran).
int64_t fwd_launches();

// Whether device `device_id` can run the sm90 family: compute capability 9.0 and this build's
// sm_90a code loaded for it (a build without 90a in FLASHSPAN_CUDA_ARCHS has none). Cached.
bool device_supported(int device_id);

// Dynamic shared memory of the sm90 forward for these head dims (bytes; 0 when it has none).
int fwd_smem_bytes(int dqk, int dv);

// Enqueues the sm90 forward: p as launch_flex_fwd fills it (view of a consumer_for(90) plan,
// pack = 1 or a G of fwd_runs_pack_sm90, split schedule bound when a workspace was given); q, k,
// v for the tensor maps.
void launch_fwd_sm90(const FwdParams& p, const TensorView& q, const TensorView& k, const TensorView& v,
                     DType dtype, cudaStream_t stream);

// SDPA forward with the analytic mask (kernel_fwd_sm90.cuh sdpa_fwd_kernel_sm90), for the calls
// sdpa_fwd_sm90_refusal (dispatch/sdpa_launch.h) accepts: p as sdpa_fwd_params fills it (padded
// tensors, head dims of sdpa_fwd_runs_head_dims_sm90, H_k and H_v each dividing H_q, equal or
// not); q, k, v the [B, H, S, D] descriptors of the call (tensor maps). Persistent grid over
// (query block, query head, sample) of every sample padded to S_q; rows past a sample write
// O = 0 and LSE = -inf (a packed O / stats: the sample's rows only). bias: the call's additive bias (null
// without one): a 16-bit one of whole aligned rows (SdpaBiasParams::chunks) is staged by TMA (tensor map from
// it). Packed (THD) q, k or v (on unless FLASHSPAN_SM90_SDPA_THD=0, dispatch's sdpa_sm90_thd_enabled): loaded
// through per-sample maps (sample_maps_sm90.h) built in `workspace` (sample_maps_bytes(B, 3) bytes, 128-byte
// aligned) before the kernel; null workspace otherwise.
void launch_sdpa_fwd_sm90(const SdpaFwdParams& p, const TensorView& q, const TensorView& k, const TensorView& v,
                          const TensorView* bias, DType dtype, void* workspace, size_t workspace_bytes,
                          cudaStream_t stream);
// Calls of launch_sdpa_fwd_sm90 in this process so far (tests check which family ran), and of those
// the ones that ran the kernel with dropout (AnalyticDropSourceSm90; experimental, FLASHSPAN_EXPERIMENTAL=1:
// dispatch/sdpa_launch.h sdpa_sm90_dropout_enabled).
int64_t sdpa_fwd_launches();
int64_t sdpa_fwd_drop_launches();

// SDPA forward over paged K/V caches (kernel_fwd_sm90.cuh sdpa_fwd_paged_kernel_sm90; on by default,
// dispatch/sdpa_launch.h sdpa_sm90_paged_enabled), for the calls sdpa_fwd_sm90_paged_refusal accepts: p as
// sdpa_paged_fwd_params_sm90 fills it (q / o / stats / gate padded, or packed (on by default,
// sdpa_sm90_paged_thd_enabled), k / v without ragged offsets, head dims up to 128, no dropout (a bias on by default,
// sdpa_sm90_paged_bias_enabled: bias its descriptor, as launch_sdpa_fwd_sm90's, null without one; such calls run
// on the (128, 128) bias kernel, kernel_fwd_sm90.cuh sdpa_fwd_paged_bias_kernel_sm90, whatever their head dims),
// pages of 8 keys or more, bad_samples: B int32 of the workspace); q the [B, H, S, D] descriptor (packed: its samples at
// their ragged starts), k / v the containers [num_pages, H, page_size, D] of a paged side (a map
// (column, row, head, page) with boxes of min(page_size, 128) rows) or a side's own [B, H, S, D] descriptor;
// maps / maps_bytes: packed q's per-sample maps' part of the workspace (sample_maps_sm90.h, kSampleMapsFwd slots a
// sample of which q's is written; dispatch's sdpa_fwd_sm90_maps), else unused. Zeroes bad_samples (packed q: takes
// the maps pre-pass's flags instead, which it writes for every sample: a start not 16-byte aligned), runs the kernel,
// then writes NaN over the O and stats rows of every flagged sample: one of whose page-table entries that the kernel
// read lay outside its container, or whose q start was not aligned (launch_sample_poison_sm90).
void launch_sdpa_fwd_paged_sm90(const SdpaPagedFwdSm90Params& p, const TensorView& q, const TensorView& k,
                                const TensorView& v, const TensorView* bias, DType dtype, void* maps,
                                size_t maps_bytes, cudaStream_t stream);
// Calls of launch_sdpa_fwd_paged_sm90 in this process so far (tests check which kernel ran).
int64_t sdpa_fwd_paged_launches();

// The SDPA FP8 forward (on by default, FLASHSPAN_SM90_SDPA_FP8=0 turns it off: dispatch/sdpa_launch.h
// sdpa_fp8_sm90_enabled; kernel_fwd_sm90.cuh sdpa_fp8_fwd_kernel_sm90): p an SdpaFwdParams as
// sdpa_fwd_params fills it (padded [B, H, S, D] tensors, each head dim a multiple of 16 up to 128:
// tile_sm90.h sdpa_fp8_fwd_runs_head_dims_sm90; the pure-mask features: causal / bands, padding
// lengths, GQA / MQA, H_k != H_v (V by h / group_v), the block_mask, stats, max_logit, score_max /
// score_sum_exp) plus p.fp8 (q's and o's formats, the six factors and attn_scale, the two amaxes, the V^T
// workspace of
// fp8_vt_bytes_sm90(B, H_v, D_v, S_kv) bytes, 16-byte aligned); q, k, v the FP8 [B, H, S, D]
// descriptors (16-byte aligned data, strides multiples of 16 elements). Zeroes amax_s / amax_o (and resets max_logit), writes V^T (the
// pre-pass), then runs the persistent FP8 kernel over (query block, query head, sample): O in the
// FP8 format, the LSE stats, amax_s, amax_o (params.h SdpaFp8Params says what each is). Packed (THD) q, k, v, o,
// stats (experimental, dispatch's sdpa_fp8_sm90_thd_enabled; not yet run on a GPU): q and k through per-sample maps
// (sample_maps_sm90.h) built in `workspace` (sample_maps_bytes(B, 3) bytes, 128-byte aligned: the 16-bit
// forward's layout, V's slot unused) before the kernel, V read at its samples' starts by the V^T pre-pass, O and
// the stats written at their samples' starts (the sample's rows only); a sample start of q or k not 16-byte
// aligned gets NaN over its O and stats rows; null workspace when q and k are padded.
void launch_sdpa_fp8_fwd_sm90(const SdpaFp8FwdParams& p, const TensorView& q, const TensorView& k,
                              const TensorView& v, void* workspace, size_t workspace_bytes, cudaStream_t stream);
// Calls of launch_sdpa_fp8_fwd_sm90 in this process so far.
int64_t sdpa_fp8_fwd_launches();

// The sm90 backward's switches, from here to bwd_split_first_enabled and the wide tiles' below: one home,
// switches_sm90.cpp (plain host code, so that builds linking the family registry without a CUDA unit have them).
// Whether the sm90 backward is switched on: yes unless FLASHSPAN_SM90_BWD=0 (the portable
// backward, for comparison). Read once per process.
bool bwd_enabled();
// Overrides bwd_enabled() for this process (tests and benchmarks): 1 on, 0 off, -1 back to the
// environment's answer.
void set_bwd_enabled(int on);
// Whether deterministic calls may take the sm90 backward: yes unless
// FLASHSPAN_SM90_BWD_DETERMINISTIC=0 (then they run the sm80 backward; read once).
bool bwd_deterministic_enabled();
// Calls of launch_bwd_sm90 in this process so far (tests check that the sm90 backward ran).
int64_t bwd_launches();
// Whether the deterministic sm90 backward cuts long walks into items (bwd_split.cuh,
// split_rule.h): on by default (PERF_LOG v2.32; FLASHSPAN_SM90_BWD_DET_SPLIT=0 turns it off, read
// once: every cell one item, the schedule before the cut). set_bwd_det_split: 1 on, 0 off, -1 back
// to the environment's answer (tests).
bool bwd_det_split_enabled();
void set_bwd_det_split(int on);
// How far above the mean a walk must be for that cut (SplitSchedule::above_mean, split_rule.h):
// FLASHSPAN_SM90_BWD_DET_SPLIT_ABOVE=m (an integer 2 .. 4096; read once; measurement only), else 2
// with FLASHSPAN_EXPERIMENTAL=1 (read per call), else 4 (16 until PERF_LOG v2.50): at S = 32768
// sink_local's sink column, the trees' upper-level spans and longformer's global key blocks are that
// far above the mean among the benchmark masks, causal, document_causal, local and hstu (longest
// walks 1-3x the mean) not (test_split_rule.cpp). set_bwd_det_split_above_mean:
// m in 2 .. 4096, or anything else back to that answer (tests).
int bwd_det_split_above_mean();
void set_bwd_det_split_above_mean(int m);

// The cell order of non-deterministic sm90 backward calls (tile_sm90.h bwd_cell_order_sm90):
// FLASHSPAN_SM90_BWD_CELLS=1 always, =0 never (the plan's task list), unset: that rule
// (read once). Returns 1 / 0 when forced, -1 for the rule; set_bwd_cell_order: 1, 0, or -1
// back to the environment's answer (tests).
int bwd_cell_order_forced();
void set_bwd_cell_order(int on);
// The deterministic backward's cell list (flex_dispatch.cu, BwdParams::det_band): key blocks descending in
// bands of `band` blocks, each band's cells head by head; 1 = heads fastest (the default), kDetBandAll = heads
// slowest; experimental, not yet run on a GPU. FLASHSPAN_SM90_BWD_DET_BAND (read per call): an integer
// 1 .. kDetBandAll, or "all" (kDetBandAll); unset, with FLASHSPAN_EXPERIMENTAL=1 the rule (0: heads slowest
// where a head's query side outgrows L2, bwd_cell_order_sm90, the non-deterministic cell order's rule; else
// heads fastest), else 1; anything else 1. Returns the band, or 0 for the rule; set_bwd_det_band: band >= 0
// that answer, -1 back to the environment's (tests).
int bwd_det_band_forced();
void set_bwd_det_band(int band);
// The deterministic backward's item order as the launcher passes it (BwdParams::det_claim):
// FLASHSPAN_SM90_BWD_DET_CLAIM "1" claimed in list order (1), "0" snake waves (0), else the plan
// decides (-1: split_rule.h split_det_claims). Read per call.
int bwd_det_claim();
// The SDPA forward's item groups (AnalyticMaskParams::l2_group; 0: one group) for (sample, head) pairs of
// kv_bytes_per_pair bytes of K and V each, of a call grouped by default or not (FLASHSPAN_SM90_FWD_L2_GROUP;
// switches_sm90.cpp), and whether grouped cells are claimed through the counter (AnalyticMaskParams::item_counter,
// where the workspace has one: calls with a band or a block mask; FLASHSPAN_SM90_FWD_CLAIM), given whether the call's
// workspace holds the counter (`counter`).
int fwd_l2_group(int64_t kv_bytes_per_pair, bool grouped);
bool fwd_claim(bool counter);
// The SDPA backward's item groups (AnalyticMaskParams::l2_group of its heads-fastest cells, always claimed) for
// (sample, item head) pairs of bytes_per_pair bytes of Q, dO and dQ tiles each, of a call grouped by default or not
// (FLASHSPAN_SM90_BWD_L2_GROUP; switches_sm90.cpp); the non-deterministic backward's only. bwd_det_l2_group: the
// deterministic backward's (its descending key blocks grouped; FLASHSPAN_SM90_BWD_DET_L2_GROUP), the same rule for
// lists of `cells` cells that fill the `ctas` CTAs many times over.
int bwd_l2_group(int64_t bytes_per_pair, bool grouped);
int bwd_det_l2_group(int64_t bytes_per_pair, bool grouped, int64_t cells, int ctas);
// The deterministic backward's other switches as the launcher passes them (launch_bwd_sm90.cu): without the dQ
// tiles' counter waits (FLASHSPAN_SM90_BWD_DET_UNORDERED=1, measurement only, read once), the dQ turn handed on
// relaxed (BwdParams::det_relaxed; FLASHSPAN_SM90_BWD_DET_RELAXED=1, measurement only, not reproducible; read per
// call), the dQ tiles' pieces (BwdParams::dq_chunks: 2 unless FLASHSPAN_SM90_BWD_DET_DQ_CHUNKS=1, read per call),
// each split item's own dK / dV slot (BwdParams::det_own_slots; on unless FLASHSPAN_SM90_BWD_DET_OWN_SLOTS=0, read
// per call).
bool bwd_det_unordered();
bool bwd_det_relaxed();
int bwd_det_dq_chunks();
bool bwd_det_own_slots();
// Whether the cell order puts the split tasks' items first (split_schedule.cuh kSplitFirst: the cut
// walks of sink columns and global tokens start first, spread over the heads): experimental
// (FLASHSPAN_EXPERIMENTAL=1, read per call; PERF_LOG v2.10: longformer +15 %, tree_bfs -7 % at
// S=131072 D=128, so not the default); set_bwd_split_first: 1 on, 0 off,
// -1 back to the environment's answer (tests).
bool bwd_split_first_enabled();
void set_bwd_split_first(int on);
// The register split of the (128, 128) key-split backward kernels in a step without score modifiers or dropout, fp16
// and bf16, flex and SDPA (kernel_bwd_sm90.cuh kBwdOrder240; the kernel's kOrder): 4 (the default since PERF_LOG
// v2.79, +3 % on an H100) the consumers at 240 registers and the producer warpgroup at 24, the warpgroup index
// uniform; 0 the 40 / 232 split of v2.20-v2.78. FLASHSPAN_SM90_BWD_ORDER=0 (read per call) picks 0, any other value
// or none 4. set_bwd_gemm_order: 0, 4 or an experimental value below for this process (tests; other values 4), -1
// back to the environment's answer.
// Experimental (FLASHSPAN_EXPERIMENTAL=1; kernel_bwd_sm90.cuh kBwdOrderEarlyDq / kBwdOrderLateDk /
// kBwdOrderDeferDk, PERF_LOG v2.80): bits on top of 4 -- 8 dQ issued behind the running dV, 16 the step's dK waited
// for in the next step, 32 the step's dK issued in the next step -- as the values 12, 16, 20, 28, 32, 36, 44; without
// FLASHSPAN_EXPERIMENTAL those give 4. Each kernel takes its share: the (128, 128) kernels, flex and SDPA,
// bwd_gemm_order_128; the flex (64, 64) wide tile bwd_gemm_order_wide64.
int bwd_gemm_order();
void set_bwd_gemm_order(int order);
// The orders with a kernel, by their slot in the launchers' smem / CTA caches (bwd_gemm_order_slot): the (128, 128)
// kernel's 0, 4, 12, 20, 28, 36, 44 and the (64, 64) wide tile's 16, 32 (and 0).
inline constexpr int kBwdGemmOrders[] = {0, 4, 12, 20, 28, 36, 44, 16, 32};
inline constexpr int kBwdGemmOrderSlots = 9;
constexpr bool bwd_gemm_order_has_kernel(int order) {
  for (int o : kBwdGemmOrders) {
    if (o == order) return true;
  }
  return false;
}
constexpr int bwd_gemm_order_slot(int order) {
  for (int i = 0; i < kBwdGemmOrderSlots; ++i) {
    if (kBwdGemmOrders[i] == order) return i;
  }
  return 1;
}
// Launches of the pure-mask key-split backward kernels (flex and SDPA) by the order of the kernel that ran (one of
// kBwdGemmOrders; tests: that an order's kernel, not another, ran). count_bwd_order_launch: the launchers' increment.
int64_t bwd_order_launches(int order);
void count_bwd_order_launch(int order);
// The (128, 128) kernels' order (flex and SDPA) for bwd_gemm_order's: 0, else the value with the 240-register bit (16 -> 20,
// 32 -> 36), 4 for any other.
constexpr int bwd_gemm_order_128(int order) {
  const int o = order | 4;
  return order == 0 ? 0 : bwd_gemm_order_has_kernel(o) ? o : 4;  // (o has the 240 bit: one of 4 .. 44)
}
// The flex (64, 64) wide tile's: its late-dK (16) or deferred-dK (32) bit, else 0.
constexpr int bwd_gemm_order_wide64(int order) {
  const int o = order & 48;
  return o == 48 ? 0 : o;
}

// Whether the sm90 backward kernel covers a configuration (independent of the device): fp16 or
// bf16, head dims of bwd_runs_head_dims_sm90 (each a multiple of 8 up to 128, (192, 128), (256, 256)),
// deterministic or not (deterministic unless FLASHSPAN_SM90_BWD_DETERMINISTIC=0).
bool bwd_config_supported(const FlexGeometry& g, bool deterministic);

// Dynamic shared memory of the sm90 backward for these head dims on the plan's backward tile
// bwd_bq x bwd_bk (bytes; 0 when it has none).
int bwd_smem_bytes(int dqk, int dv, int bwd_bq, int bwd_bk);

// Whether (64, 64) plans of the sm90 family get the wide 128 x 128 backward tile
// (tile_sm90.h kTileSm90Wide64; consumer_sm90 in family.cpp asks here): yes unless
// FLASHSPAN_SM90_BWD_WIDE64=0 (read once), and only while bwd_enabled() and the deterministic
// switch (FLASHSPAN_SM90_BWD_DETERMINISTIC) are on, since only the sm90 backward runs that tile.
// set_bwd_wide64_enabled overrides the environment for this process (tests: 1 on, 0 off, -1
// back to the environment's answer; a plan keeps the tile it was built with).
bool bwd_wide64_enabled();
void set_bwd_wide64_enabled(int on);

// Whether (192, 128) plans of the sm90 family get the 64 x 96 backward tile (tile_sm90.h
// kTileSm90Wide192, the three-warpgroup consumers of kernel_bwd_sm90.cuh; the SDPA backward of
// (192, 128) asks per call): yes unless FLASHSPAN_SM90_BWD_WIDE192=0 (read once), and only while
// bwd_enabled() and the deterministic switch are on (PERF_LOG v2.14). set_bwd_wide192_enabled: the override, as set_bwd_wide64_enabled.
bool bwd_wide192_enabled();
void set_bwd_wide192_enabled(int on);

// Whether an SDPA backward call of Philox dropout without score modifiers (no softcap, ALiBi, bias, dBias: the common
// training call) runs the Philox-only dropout kernel (kernel_bwd_mods_sm90.cuh sdpa_bwd_drop_kernel_sm90: the
// pure-mask consumer and the keep bits; 1.93x -> 1.39x the plain backward on an H100, PERF_LOG v2.72) rather than
// the modifiers' dropout kernel (sdpa_bwd_mods_kernel_sm90<..., true>): on unless FLASHSPAN_SM90_BWD_DROPOUT_PHILOX
// is "0" (read per call; FLASHSPAN_EXPERIMENTAL ignored); set_bwd_dropout_philox_enabled overrides it for this
// process (1 on, 0 off, -1 back to the environment's answer).
bool bwd_dropout_philox_enabled();
void set_bwd_dropout_philox_enabled(int on);
// The rule: a call of Philox dropout without softcap, ALiBi, a bias, dBias or a block_mask (sinks, the gate and
// H_k != H_v are not the main loop's) while bwd_dropout_philox_enabled(). Read by run_sdpa_bwd_sm90
// (sdpa_bwd_sm90_run.cuh) and the launcher's count (sdpa_bwd_drop_philox_launches).
bool sdpa_bwd_dropout_philox_kernel(const AnalyticMaskParams& a);

// Enqueues the sm90 backward (preprocess, dK/dV + dQ kernel, split schedule and converts): p as
// launch_flex_bwd fills it (backward view of a consumer_for(90) plan, dq_blocked = 1; the split
// schedule bound in task mode when deterministic = 0; dq_sem bound and grid_mode = 1 when
// deterministic = 1); q, k, v, dout for the tensor maps.
void launch_bwd_sm90(const BwdParams& p, const TensorView& q, const TensorView& k, const TensorView& v,
                     const TensorView& dout, DType dtype, int64_t total_q, cudaStream_t stream);

// SDPA backward with the analytic mask (kernel_bwd_sm90.cuh sdpa_bwd_kernel_sm90), for the calls
// sdpa_bwd_sm90_refusal (dispatch/sdpa_launch.h) accepts: p as sdpa_bwd_params_sm90 fills it
// (padded tensors, head dims of sdpa_fwd_runs_head_dims_sm90, the dq_accum tiles and, when
// deterministic, their counters bound); q, k, v, dout the [B, H, S, D] descriptors of the call
// (tensor maps). Preprocess, the persistent dK / dV + dQ kernel over (key block, kv head, sample)
// of every sample padded to S_kv, the dQ convert. Rows past a sample get zero gradients. Unless
// FLASHSPAN_SM90_SDPA_BWD_MODS=0 (sdpa_bwd_sm90_mods_enabled) also softcap, ALiBi, the bias with dBias
// (the kernel with score modifiers, kernel_bwd_mods_sm90.cuh sdpa_bwd_mods_kernel_sm90), sinks with
// dSink and the gate with dgate (around either kernel), head dims up to 128; with
// FLASHSPAN_EXPERIMENTAL=1 (sdpa_sm90_dropout_enabled) dropout too, on the kernel with modifiers and
// dropout (sdpa_bwd_mods_kernel_sm90<..., true>). Packed (THD) q, k, v or dO (on unless FLASHSPAN_SM90_SDPA_THD=0,
// dispatch's sdpa_sm90_thd_enabled): loaded through per-sample maps (sample_maps_sm90.h: q, k, v and the main
// dO) built in `workspace` (sample_maps_bytes(B, 4) bytes, 128-byte aligned) before the kernel; a packed dQ, dK,
// dV written at the samples' starts, their rows only; null workspace otherwise.
void launch_sdpa_bwd_sm90(const SdpaBwdParams& p, const TensorView& q, const TensorView& k, const TensorView& v,
                          const TensorView& dout, DType dtype, void* workspace, size_t workspace_bytes,
                          cudaStream_t stream);
// Calls of launch_sdpa_bwd_sm90 in this process so far (tests check which family ran), of those
// the ones that ran a kernel with score modifiers (softcap, ALiBi, bias / dBias, or dropout), and of
// those the ones that ran a kernel with dropout (sdpa_bwd_mods_kernel_sm90<..., true> or, Philox without
// modifiers, sdpa_bwd_drop_kernel_sm90: of those, sdpa_bwd_drop_philox_launches).
int64_t sdpa_bwd_launches();
int64_t sdpa_bwd_mods_launches();
int64_t sdpa_bwd_drop_launches();
int64_t sdpa_bwd_drop_philox_launches();
// Calls of launch_sdpa_bwd_sm90 so far whose cells ran in L2 groups (AnalyticMaskParams::l2_group > 0).
int64_t sdpa_bwd_l2_grouped_launches();

}  // namespace flashspan::sm90
