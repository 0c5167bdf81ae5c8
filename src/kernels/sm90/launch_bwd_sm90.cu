// Instantiations and launch of the sm90 flex backward (kernel_bwd_sm90.cuh): head dims
// {(64, 64), (128, 128), (192, 128), (256, 256)}, (64, 64) on the wide 128 x 128 tile and (192, 128)
// on the wide 64 x 96 tile, x {fp16,
// bf16}, deterministic or not (a runtime parameter); the shared preprocess / split schedule / convert kernels of
// kernels/common (launch_bwd_common.h) around it; tensor maps of Q, K, V, dO encoded on the host
// per call (no stream operation, so capture-safe).
#include <cuda.h>

#include <algorithm>
#include <atomic>

#include "core/env_switch.h"
#include "core/error.h"
#include "kernels/common/grid.h"
#include "kernels/common/launch_bwd_common.h"
#include "kernels/common/launch_util.h"
#include "kernels/sm90/kernel_bwd_sm90.cuh"
#include "kernels/sm90/launch_sm90.h"
#include "kernels/sm90/sample_maps_sm90.h"
#include "kernels/sm90/sdpa_bwd_sm90_run.h"
#include "kernels/sm90/tile_sm90.h"
#include "kernels/sm90/tma_sm90.h"

namespace flashspan::sm90 {
namespace {

// Persistent grid: one CTA per SM (shared memory allows one); with the split schedule every
// CTA takes items from the list (deterministic: always, over every cell, in snake waves),
// otherwise CTA i runs tasks (or grid cells) i, i + grid, ...
template <int kD, class E, int kDv = kD, bool kWideTile = false>
void run_bwd(const BwdParams& p_in, const CUtensorMap& mq, const CUtensorMap& mk, const CUtensorMap& mv,
             const CUtensorMap& mdo, cudaStream_t stream) {
  using L = kern90::BwdSm90Layout<kD, kDv, kWideTile>;
  // The register split of the (128, 128) kernel (bwd_gemm_order: 4 by default, or 0) and the experimental GEMM orders
  // of it and of the (64, 64) wide tile (launch_sm90.h).
  constexpr bool kOrders = kern90::kHasBwdOrder240<kD, kDv, kWideTile>;
  constexpr bool kWideOrders = kern90::kHasBwdOrderLateDkWide<kD, kDv, kWideTile>;
  const int order = kOrders ? bwd_gemm_order_128(bwd_gemm_order()) : kWideOrders ? bwd_gemm_order_wide64(bwd_gemm_order()) : 0;
  const int slot = bwd_gemm_order_slot(order);
  auto kernel = kern90::flex_bwd_kernel_sm90<kD, E, kDv, kWideTile>;
  int kernel_order = 0;  // the chosen kernel's kOrder (count_bwd_order_launch)
  if constexpr (kOrders) {
    kern90::for_bwd_order240(order, [&](auto o) {
      kernel = kern90::flex_bwd_kernel_sm90<kD, E, kDv, kWideTile, o.value>;
      kernel_order = o.value;
    });
  }
  if constexpr (kWideOrders) {
    constexpr int kDk = kern90::kBwdOrderLateDk, kDd = kern90::kBwdOrderDeferDk;
    if (order == kDk) kernel = kern90::flex_bwd_kernel_sm90<kD, E, kDv, kWideTile, kDk>, kernel_order = kDk;
    if (order == kDd) kernel = kern90::flex_bwd_kernel_sm90<kD, E, kDv, kWideTile, kDd>, kernel_order = kDd;
  }
  static std::atomic<uint64_t> smem_set[kBwdGemmOrderSlots] = {};
  ensure_smem_limit(kernel, L::kBytes, smem_set[slot], "flex backward (sm90): cudaFuncSetAttribute");
  static std::atomic<int> ctas_cache[kBwdGemmOrderSlots][64];
  const int ctas = persistent_ctas(kernel, L::kThreads, L::kBytes, ctas_cache[slot], "flex backward (sm90)");
  BwdParams p = p_in;
  if (p.split_schedule) {
    p.split.num_ctas = ctas;
    if (p.deterministic) p.split.above_mean = bwd_det_split_above_mean();
    launch_bwd_split_schedule(p, stream, !p.deterministic || bwd_det_split_enabled());
    kernel<<<grid_1d(ctas, "flex backward (sm90), persistent"), L::kThreads, L::kBytes, stream>>>(p, mq, mk, mv, mdo);
    check_launch("flex backward (sm90), persistent");
    if (!L::kColSplit && !L::kT3) count_bwd_order_launch(kernel_order);
    launch_bwd_split_convert(p, E::kDType, stream);
    return;
  }
  const int64_t items =
      p.grid_mode ? p.view.num_k_blocks * int64_t(p.num_heads_q / p.group_size) : p.view.num_tasks;
  if (items <= 0) return;
  const unsigned grid = unsigned(std::min<int64_t>(ctas, items));
  kernel<<<grid, L::kThreads, L::kBytes, stream>>>(p, mq, mk, mv, mdo);
  check_launch("flex backward (sm90)");
  if (!L::kColSplit && !L::kT3) count_bwd_order_launch(kernel_order);
}

}  // namespace

namespace {
std::atomic<int64_t> g_bwd_launches{0};
std::atomic<int64_t> g_sdpa_bwd_launches{0};
std::atomic<int64_t> g_sdpa_bwd_mods_launches{0};
std::atomic<int64_t> g_sdpa_bwd_drop_launches{0};
std::atomic<int64_t> g_sdpa_bwd_drop_philox_launches{0};
std::atomic<int64_t> g_sdpa_bwd_l2_grouped_launches{0};
std::atomic<int64_t> g_bwd_order_launches[kBwdGemmOrderSlots] = {};
}  // namespace

int64_t bwd_order_launches(int order) {
  return g_bwd_order_launches[bwd_gemm_order_slot(order)].load(std::memory_order_relaxed);
}
void count_bwd_order_launch(int order) {
  g_bwd_order_launches[bwd_gemm_order_slot(order)].fetch_add(1, std::memory_order_relaxed);
}

int64_t bwd_launches() { return g_bwd_launches.load(std::memory_order_relaxed); }
int64_t sdpa_bwd_launches() { return g_sdpa_bwd_launches.load(std::memory_order_relaxed); }
int64_t sdpa_bwd_mods_launches() { return g_sdpa_bwd_mods_launches.load(std::memory_order_relaxed); }
int64_t sdpa_bwd_drop_launches() { return g_sdpa_bwd_drop_launches.load(std::memory_order_relaxed); }
int64_t sdpa_bwd_drop_philox_launches() { return g_sdpa_bwd_drop_philox_launches.load(std::memory_order_relaxed); }
int64_t sdpa_bwd_l2_grouped_launches() { return g_sdpa_bwd_l2_grouped_launches.load(std::memory_order_relaxed); }

// The BSHD view [B, S_q, H_q, D_v] of the gated dO in the workspace ([H_q, B S_q, D_v], params.h
// SdpaEpilogueParams::do_gated; rows of D_v elements, a multiple of 8: TMA's 16-byte strides), as
// make_tensor_map_sm90 reads dO.
namespace {
TensorView gated_do_view(const SdpaBwdParams& p, const TensorView& dout) {
  TensorView v = dout;
  v.data = p.analytic.epi.do_gated;
  v.ndim = 4;
  const int64_t sq = p.analytic.max_q, dv = p.head_dv;
  v.shape = {int64_t(p.batch), sq, int64_t(p.num_heads_q), dv};
  v.strides = {sq * dv, dv, p.total_q * dv, 1};
  return v;
}
}  // namespace

bool bwd_config_supported(const FlexGeometry& g, bool deterministic) {
  return (g.dtype == DType::kFloat16 || g.dtype == DType::kBFloat16) &&
         bwd_runs_head_dims_sm90(g.head_dim_qk, g.head_dim_v) && (!deterministic || bwd_deterministic_enabled());
}

int bwd_smem_bytes(int dqk_call, int dv_call, int bwd_bq, int bwd_bk) {
  if (!bwd_runs_head_dims_sm90(dqk_call, dv_call)) return 0;
  const bool wide = bwd_wide_tile_sm90(dqk_call, dv_call, bwd_bq, bwd_bk);
  const int dqk = bwd_kernel_dims_sm90(dqk_call, dv_call).dqk;  // the kernel's (64 / 128 for smaller dims)
  if (dqk == 192) return wide ? kern90::BwdSm90Layout<192, 128, true>::kBytes : kern90::BwdSm90Layout<192, 128>::kBytes;
  if (wide) return kern90::BwdSm90Layout<64, 64, true>::kBytes;
  if (dqk == 256) return kern90::BwdSm90Layout<256, 256>::kBytes;
  return dqk == 64 ? kern90::BwdSm90Layout<64>::kBytes : kern90::BwdSm90Layout<128>::kBytes;
}

namespace {
// The dQ writers' switches, the same for the flex and SDPA launchers: the turn's hand-off (release unless
// FLASHSPAN_SM90_BWD_DET_RELAXED=1, measurement only) and the deterministic tiles in two halves (unless
// FLASHSPAN_SM90_BWD_DET_DQ_CHUNKS=1; the non-deterministic backward adds whole tiles: halves there were no faster,
// PERF_LOG v2.64).
void bind_dq_hand_off(BwdParams& p) {
  p.det_relaxed = bwd_det_relaxed() ? 1 : 0;
  p.dq_chunks = p.deterministic ? bwd_det_dq_chunks() : 1;
}
}  // namespace

void launch_bwd_sm90(const BwdParams& p_in, const TensorView& q, const TensorView& k, const TensorView& v,
                     const TensorView& dout, DType dtype, int64_t total_q, cudaStream_t stream) {
  BwdParams p = p_in;
  const bool wide = bwd_wide_tile_sm90(p.head_dqk, p.head_dv, p.view.block_q, p.view.block_k);
  const TileSm90 tile = tile_sm90(p.head_dqk, p.head_dv, wide);
  FS_CHECK(bwd_runs_head_dims_sm90(p.head_dqk, p.head_dv) && p.view.block_q == tile.bwd_bq &&
               p.view.block_k == tile.bwd_bk,
           Status::kInternal, "sm90 backward: unsupported configuration reached the launcher (D ", p.head_dqk, "/",
           p.head_dv, ", tile ", p.view.block_q, "x", p.view.block_k, ")");
  const int64_t cells = p.view.num_k_blocks * int64_t(p.num_heads_q / p.group_size);
  FS_CHECK(!p.deterministic || (p.dq_sem != nullptr && p.grid_mode == 1 && p.det_band >= 1 &&
                                (cells == 0 || (p.split_schedule == 1 && p.split.num_tasks == cells))),
           Status::kInternal,
           "sm90 backward: the deterministic path needs the dQ tile counters and the split schedule over every key "
           "block (bwd_split.cuh, deterministic form)");
  // Measurement only: the deterministic schedule without its dQ ordering (kernel_bwd_sm90.cuh).
  if (p.deterministic && bwd_det_unordered()) p.dq_sem = nullptr;
  p.det_claim = bwd_det_claim();
  bind_dq_hand_off(p);
  p.det_own_slots = p.deterministic && p.split_schedule && bwd_det_own_slots() ? 1 : 0;
  FS_CHECK(p.dq_blocked == 1, Status::kInternal, "sm90 backward: the dQ accumulator is not bound in tiles");
  g_bwd_launches.fetch_add(1, std::memory_order_relaxed);
  // The kernel's head dims: the call's, or (64, 64) / (128, 128) for smaller dims (tile_sm90.h
  // bwd_runs_head_dims_sm90: TMA zero-fills the columns past the call's, the dK / dV stores and the
  // dQ convert write only the call's); the dq_accum tiles are kd wide.
  const int kd = bwd_kernel_dims_sm90(p.head_dqk, p.head_dv).dqk;
  launch_bwd_preprocess(p, dtype, total_q, stream, kd);  // clears the kd-wide dq_accum tiles too (dq_blocked)
  const bool varlen = p.varlen != 0;
  const CUtensorMap mq = make_tensor_map_sm90(q, varlen, dtype, tile.bwd_bq, "q");
  const CUtensorMap mk = make_tensor_map_sm90(k, varlen, dtype, tile.bwd_bk, "k");
  const CUtensorMap mv = make_tensor_map_sm90(v, varlen, dtype, tile.bwd_bk, "v");
  const CUtensorMap mdo = make_tensor_map_sm90(dout, varlen, dtype, tile.bwd_bq, "dout");
  const bool d64 = kd == 64;
  with_element_type(dtype, "flex backward (sm90)", [&](auto e) {
    using E = decltype(e);
    if (p.head_dqk == 192) {
      wide ? run_bwd<192, E, 128, true>(p, mq, mk, mv, mdo, stream) : run_bwd<192, E, 128>(p, mq, mk, mv, mdo, stream);
    } else if (p.head_dqk == 256) {
      run_bwd<256, E, 256>(p, mq, mk, mv, mdo, stream);
    } else if (wide) {
      run_bwd<64, E, 64, true>(p, mq, mk, mv, mdo, stream);
    } else {
      d64 ? run_bwd<64, E>(p, mq, mk, mv, mdo, stream) : run_bwd<128, E>(p, mq, mk, mv, mdo, stream);
    }
  });
  if (total_q > 0) {
    const unsigned grid = grid_stride_1d(int64_t(p.num_heads_q) * total_q, 8);
    with_element_type(dtype, "flex backward dQ convert (sm90)", [&](auto e) {
      using E = decltype(e);
      if (p.head_dqk == 192) {
        kern90::flex_bwd_dq_convert_kernel_sm90<192, E><<<grid, 256, 0, stream>>>(p);  // 64-row tiles either way
      } else if (p.head_dqk == 256) {
        kern90::flex_bwd_dq_convert_kernel_sm90<256, E><<<grid, 256, 0, stream>>>(p);
      } else if (wide) {
        kern90::flex_bwd_dq_convert_kernel_sm90<64, E, 128><<<grid, 256, 0, stream>>>(p);
      } else if (d64) {
        kern90::flex_bwd_dq_convert_kernel_sm90<64, E><<<grid, 256, 0, stream>>>(p);
      } else {
        kern90::flex_bwd_dq_convert_kernel_sm90<128, E><<<grid, 256, 0, stream>>>(p);
      }
    });
    check_launch("flex backward dQ convert (sm90)");
  }
}

void prepare_sdpa_bwd_sm90(SdpaBwdParams& p, int kBq, int kBk, int kd, int kdv, int64_t item_heads, bool slots,
                           cudaStream_t stream) {
  p.analytic.num_q_blocks = (p.analytic.max_q + kBq - 1) / kBq;
  p.analytic.num_k_blocks = (p.analytic.max_kv + kBk - 1) / kBk;
  // The dq_accum tiles (and the deterministic counters): one per (query head, sample, query
  // block), sample b's blocks from b * num_q_blocks (AnalyticSourceBwdSm90::q_block0).
  p.view.num_q_blocks = int64_t(p.batch) * p.analytic.num_q_blocks;
  p.view.block_q = kBq;
  p.view.block_k = kBk;
  p.varlen = 0;
  p.dq_blocked = 1;
  p.grid_mode = 1;
  bind_dq_hand_off(p);
  if (p.total_q > 0) {
    check_cuda(cudaMemsetAsync(p.dq_accum, 0,
                               sizeof(float) * size_t(p.num_heads_q) * size_t(p.view.num_q_blocks) * kBq * size_t(kd),
                               stream),
               "sdpa backward (sm90): clearing the dQ tiles");
    if (p.deterministic) {
      check_cuda(cudaMemsetAsync(p.dq_sem, 0,
                                 sizeof(int32_t) * kDqSemStride * size_t(p.num_heads_q) * size_t(p.view.num_q_blocks),
                                 stream),
                 "sdpa backward (sm90): clearing the dQ tile counters");
    }
  }
  const int64_t slot_rows = int64_t(p.batch) * item_heads * p.analytic.num_k_blocks * kBk;
  if (slots && slot_rows > 0) {
    FS_CHECK(p.split.dk_accum != nullptr && p.split.dv_accum != nullptr &&
                 int64_t(p.batch) * item_heads * p.analytic.num_k_blocks < (int64_t(1) << 31) &&
                 slot_rows * kd <= sdpa_bwd_slot_floats_sm90(p.batch, p.analytic.max_kv, item_heads, p.head_dqk,
                                                             p.head_dv, kd),
             Status::kInternal, "sdpa backward (sm90): the dK / dV slots exceed the workspace");
    check_cuda(cudaMemsetAsync(p.split.dk_accum, 0, sizeof(float) * size_t(slot_rows) * size_t(kd), stream),
               "sdpa backward (sm90): clearing the dK slots");
    check_cuda(cudaMemsetAsync(p.split.dv_accum, 0, sizeof(float) * size_t(slot_rows) * size_t(kdv), stream),
               "sdpa backward (sm90): clearing the dV slots");
  }
}

namespace {
// The cells in L2 groups of (sample, item head) pairs (bwd_l2_group / bwd_det_l2_group: by the Q, dO and fp32 dQ tile
// bytes of an item's query heads), claimed through the workspace's counter (dispatch sdpa_bwd_layout, which holds one
// for the orders that group: the non-deterministic heads-fastest cells of a band, analytic_mask.h
// sdpa_bwd_grid_heads_slowest, and the deterministic order of every call; zeroed here). A group of every pair is the
// ungrouped order.
void set_sdpa_bwd_l2_group(SdpaBwdParams& p, int64_t item_heads, int kd, cudaStream_t stream) {
  AnalyticMaskParams& a = p.analytic;
  int g = 0;
  if (a.item_counter != nullptr) {
    const int64_t bytes = int64_t(a.max_q) * (p.num_heads_q / item_heads) * (2 * (p.head_dqk + p.head_dv) + 4 * kd);
    const bool grouped = a.band.has_left == 0;
    // (the deterministic rule also weighs the list against the persistent grid: one CTA per SM)
    const int64_t cells = int64_t(a.num_k_blocks) * item_heads * p.batch;
    g = p.deterministic ? bwd_det_l2_group(bytes, grouped, cells, device_multiprocessors("sdpa backward (sm90)"))
                        : bwd_l2_group(bytes, grouped);
  }
  // (FLASHSPAN_SM90_BWD_DET_CLAIM=0: the deterministic groups in static snake waves instead of claimed)
  const bool claim = !p.deterministic || bwd_det_claim() != 0;
  bind_l2_group(a, g, item_heads * p.batch, claim, stream, "sdpa backward (sm90): item counter reset");
  if (a.l2_group > 0) g_sdpa_bwd_l2_grouped_launches.fetch_add(1, std::memory_order_relaxed);
}
}  // namespace

void launch_sdpa_bwd_sm90(const SdpaBwdParams& p_in, const TensorView& q, const TensorView& k, const TensorView& v,
                          const TensorView& dout, DType dtype, void* workspace, size_t workspace_bytes,
                          cudaStream_t stream) {
  SdpaBwdParams p = p_in;
  FS_CHECK(bwd_runs_head_dims_sm90(p.head_dqk, p.head_dv) && p.split_schedule == 0 &&
               (p.total_q == 0 || (p.dq_accum != nullptr && (!p.deterministic || p.dq_sem != nullptr))),
           Status::kInternal, "sdpa backward (sm90): unsupported configuration reached the launcher (D ", p.head_dqk,
           "/", p.head_dv, ")");
  // Packed (THD) q, k, v or dO: per-sample maps (sample_maps_sm90.h); a packed O, stats, gate, dgate: the
  // preprocess at the samples' starts (bwd_prepost.cuh); a packed dQ, dK, dV: the dQ convert, the dK / dV epilogue
  // and slot sums at the samples' starts, their rows only (dK and dV both packed or both padded: sdpa_family.cpp).
  const SampleStart* st = p.analytic.start;
  const bool packed = sample_maps_packed(p.analytic, {kSdpaQ, kSdpaK, kSdpaV, kSdpaDO}, p.batch, kSampleMapsBwd,
                                         workspace, workspace_bytes, "sdpa backward (sm90)");
  FS_CHECK((st[kSdpaDK].ragged.ptr == nullptr) == (st[kSdpaDV].ragged.ptr == nullptr), Status::kInternal,
           "sdpa backward (sm90): dK and dV one packed, the other padded");
  const BwdDimsSm90 kdims = bwd_kernel_dims_sm90(p.head_dqk, p.head_dv);  // the kernel's (Dqk, Dv)
  const int kd = kdims.dqk;                                                           // (the dq_accum tiles' width)
  // The kernel with score modifiers (sdpa_bwd_mods_kernel_sm90) when the main loop has any: softcap,
  // ALiBi, the bias or dBias's dS (params.h sdpa_bwd_has_features; unless FLASHSPAN_SM90_SDPA_BWD_MODS=0
  // sdpa_family.cpp lets them through for head dims up to 128). Sinks and the gate are not the main
  // loop's (dSink and the gated dO are formed around it), so a call with only them runs the pure-mask
  // kernel. Dropout (in sdpa_bwd_has_features too; sdpa_family.cpp lets it through unless
  // FLASHSPAN_SM90_SDPA_DROPOUT=0) runs on the kernel with modifiers and dropout (sdpa_bwd_mods_kernel_sm90<..., true>)
  // or, Philox without modifiers, on the Philox-only kernel (sdpa_bwd_drop_kernel_sm90; launch_sm90.h
  // sdpa_bwd_dropout_philox_kernel, the runner's choice).
  // H_k != H_v runs on whichever of them the call needs (params.h sdpa_score_step_features: its work
  // items are each kernel's, kernel_bwd_sm90.cuh AnalyticSourceBwdSm90), its dK / dV through the
  // items' slots and sdpa_bwd_dkdv_sum_kernel_sm90 (below). The block_mask stays on the sm80 kernels.
  const AnalyticMaskParams& am = p.analytic;
  const bool hk_ne_hv = am.score.group_v != p.group_size;
  FS_CHECK(am.block_mask.bits == nullptr && sdpa_bwd_heads_run_sm90(p.group_size, am.score.group_v), Status::kInternal,
           "sdpa backward (sm90): a block_mask, or H_k != H_v with neither group a multiple of the other, reached the "
           "launcher");
  const bool mods = sdpa_score_step_features(am), drop = am.dropout.mode != 0;
  FS_CHECK(!mods || kd <= 128, Status::kInternal,
           "sdpa backward (sm90): score modifiers or dropout with head dims above 128 reached the launcher");
  g_sdpa_bwd_launches.fetch_add(1, std::memory_order_relaxed);
  if (mods) g_sdpa_bwd_mods_launches.fetch_add(1, std::memory_order_relaxed);
  if (drop) g_sdpa_bwd_drop_launches.fetch_add(1, std::memory_order_relaxed);
  if (drop && sdpa_bwd_dropout_philox_kernel(am)) g_sdpa_bwd_drop_philox_launches.fetch_add(1, std::memory_order_relaxed);
  // The kernel's tile (the non-wide table entry of the call's dims: 64 x 128 up to 128, 64 x 64 for
  // (192, 128) / (256, 256); (192, 128) on the wide 64 x 96 tile while bwd_wide192_enabled(): no plan
  // here, so the switch is read per call); the kernels' layouts agree (static_asserts below).
  const bool wide192 = kd == 192 && bwd_wide192_enabled();
  const TileSm90 t = tile_sm90(p.head_dqk, p.head_dv, wide192);
  const int kBq = t.bwd_bq, kBk = t.bwd_bk;
  static_assert(kern90::BwdSm90Layout<64>::kBlockQ == 64 && kern90::BwdSm90Layout<64>::kBlockK == 128 &&
                kern90::BwdSm90Layout<128>::kBlockK == 128 && kern90::BwdSm90Layout<192, 128>::kBlockK == 64 &&
                kern90::BwdSm90Layout<256, 256>::kBlockK == 64 && kern90::BwdSm90Layout<256, 256>::kBlockQ == 64 &&
                kern90::BwdSm90Layout<192, 128, true>::kBlockK == 96 &&
                kern90::BwdSm90Layout<192, 128, true>::kBlockQ == 64);
  const int kdv = kdims.dv;
  const int64_t item_heads = sdpa_bwd_item_heads_sm90(p.num_heads_q, p.group_size, am.score.group_v);
  // H_k != H_v: every item's dK / dV slot zeroed for its atomic additions (kernel_bwd_sm90.cuh
  // dkdv_epilogue_sm90; sdpa_params.cpp reserved sdpa_bwd_slot_floats_sm90, for the larger key block).
  prepare_sdpa_bwd_sm90(p, kBq, kBk, kd, kdv, item_heads, hk_ne_hv, stream);
  set_sdpa_bwd_l2_group(p, item_heads, kd, stream);
  if (p.total_q > 0) {
    // D and lse2 of every row padded to S_q (bwd_prepost.cuh, the sm80 SDPA backward's kernel;
    // with the gate also dgate and the gated dO, from the caller's dO).
    launch_sdpa_bwd_preprocess(p, dtype, stream, "sdpa backward preprocess (sm90)");
  }
  // dSink from D and lse2; dBias's dS workspace zeroed for the kernel's stores (launch_bwd_common.h,
  // the sm80 launcher's too), or the accumulator of dBias's shape the kernel adds into, or dBias itself
  // (SdpaBiasParams::ds_form: dispatch's sdpa_dbias_ds_form).
  launch_sdpa_bwd_dsink(p, stream);
  launch_sdpa_bwd_ds_clear(p, stream);
  // Padded tensors: sample b is batch b (the tensor maps' batch coordinate; the dK / dV
  // epilogue's TensorAddr batch strides, which SDPA's parameters keep in analytic.start).
  p.dka.batch_stride = p.analytic.start[kSdpaDK].batch_stride;
  p.dva.batch_stride = p.analytic.start[kSdpaDV].batch_stride;
  // Packed tensors: the four maps' templates of one sample's rows (sample_map_view), which a pre-pass turns into
  // each sample's maps in the workspace on the stream.
  const TensorView vq = sample_map_view(bshd_of_bhsd(q), packed, workspace);
  const TensorView vk = sample_map_view(bshd_of_bhsd(k), packed, workspace);
  const TensorView vv = sample_map_view(bshd_of_bhsd(v), packed, workspace);
  const CUtensorMap mq = make_tensor_map_sm90(vq, false, dtype, kBq, "q");
  const CUtensorMap mk = make_tensor_map_sm90(vk, false, dtype, kBk, "k");
  const CUtensorMap mv = make_tensor_map_sm90(vv, false, dtype, kBk, "v");
  // With the output gate the main kernel's dO is the preprocess's dO * sigmoid(G) in the workspace
  // (sdpa_bwd_main_params; rows past a sample unwritten there: zeroed in shared memory as dO's are).
  // (Without query rows the workspace may be empty and nothing reads dO.)
  const bool gated = am.epi.gate != nullptr && p.total_q > 0;
  const TensorView dout_main = sample_map_view(gated ? gated_do_view(p, dout) : bshd_of_bhsd(dout), packed, workspace);
  const CUtensorMap mdo = make_tensor_map_sm90(dout_main, false, dtype, kBq, "dout");
  SdpaBwdParams pk = sdpa_bwd_main_params(p);
  int32_t* sample_flags = nullptr;
  if (packed) {
    // The main dO: the caller's, or the gated copy (padded rows per sample: [H_q, B S_q, D_v]).
    SampleStart gated_start;
    gated_start.batch_stride = dout_main.strides[0];
    const SampleMapsJob job = sample_maps_job(am, {{mq, vq, st[kSdpaQ]}, {mk, vk, st[kSdpaK]}, {mv, vv, st[kSdpaV]},
                                                   {mdo, dout_main, gated ? gated_start : st[kSdpaDO]}});
    sample_flags = launch_sample_maps_sm90(job, p.batch, workspace, stream);
    pk.analytic.sample_maps = workspace;
  }
  switch (kd) {
    case 64:
      drop   ? run_sdpa_bwd_sm90<64, 64, false, true, true>(pk, dtype, mq, mk, mv, mdo, stream)
      : mods ? run_sdpa_bwd_sm90<64, 64, false, true>(pk, dtype, mq, mk, mv, mdo, stream)
             : run_sdpa_bwd_sm90<64, 64>(pk, dtype, mq, mk, mv, mdo, stream);
      break;
    case 128:
      drop   ? run_sdpa_bwd_sm90<128, 128, false, true, true>(pk, dtype, mq, mk, mv, mdo, stream)
      : mods ? run_sdpa_bwd_sm90<128, 128, false, true>(pk, dtype, mq, mk, mv, mdo, stream)
             : run_sdpa_bwd_sm90<128, 128>(pk, dtype, mq, mk, mv, mdo, stream);
      break;
    case 192:
      wide192 ? run_sdpa_bwd_sm90<192, 128, true>(pk, dtype, mq, mk, mv, mdo, stream)
              : run_sdpa_bwd_sm90<192, 128>(pk, dtype, mq, mk, mv, mdo, stream);
      break;
    default: run_sdpa_bwd_sm90<256, 256>(pk, dtype, mq, mk, mv, mdo, stream); break;
  }
  if (hk_ne_hv && int64_t(p.batch) * item_heads * p.analytic.num_k_blocks > 0) {
    // dK of each K head and dV of each V head: the sums of their items' slots.
    const int64_t units = int64_t(p.batch) * p.analytic.max_kv *
                          (p.num_heads_q / p.group_size + p.num_heads_q / am.score.group_v);
    with_element_type(dtype, "sdpa backward dK / dV sum (sm90)", [&](auto e) {
      kern90::sdpa_bwd_dkdv_sum_kernel_sm90<decltype(e)><<<grid_stride_1d(units, 8), 256, 0, stream>>>(pk, kd, kdv);
    });
    check_launch("sdpa backward dK / dV sum (sm90)");
  }
  launch_sdpa_bwd_dbias(p, stream);  // dBias from the buffer the kernel filled (none in the direct form)
  if (sample_flags != nullptr) launch_sample_poison_bwd_sm90(p, dtype, sample_flags, stream);
}

}  // namespace flashspan::sm90

#if FLASHSPAN_BWD_TRACE
// The backward trace's host hook (bwd_trace_sm90.cuh; builds with the CMake option
// FLASHSPAN_BWD_TRACE only, a measurement instrument: not part of the C ABI of flashspan.h).
// buf: device memory of max_ctas * (kBwdTraceHeaderWords + 2 * kBwdTraceRecWords * cap) u64
// words, zeroed by the caller before the traced launch (the flex kernels of this unit record into
// it while it is set); nullptr turns the trace off. Synchronous (cudaMemcpyToSymbol on the
// legacy default stream): call it with no backward in flight. Returns the cudaError_t.
// benchmarks/bwd_trace.py calls it through ctypes.
extern "C" __attribute__((visibility("default"))) int flashspan_debug_bwd_trace_sm90(void* buf, int max_ctas, int cap) {
  const flashspan::kern90::BwdTraceConfig c{buf != nullptr && max_ctas > 0 && cap > 0 ? static_cast<uint64_t*>(buf) : nullptr,
                                            max_ctas, cap};
  return int(cudaMemcpyToSymbol(flashspan::kern90::g_bwd_trace_sm90, &c, sizeof c));
}
// The buffer's layout: out[0] header words a CTA, out[1] words a record, out[2] the layout version.
extern "C" __attribute__((visibility("default"))) void flashspan_debug_bwd_trace_sm90_layout(int64_t* out) {
  out[0] = flashspan::kern90::kBwdTraceHeaderWords;
  out[1] = flashspan::kern90::kBwdTraceRecWords;
  out[2] = flashspan::kern90::kBwdTraceVersion;
}
#endif
