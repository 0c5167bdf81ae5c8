// Host launchers of the backward's arch-neutral kernels (launch_bwd_common.h).
#include "kernels/common/launch_bwd_common.h"

#include <algorithm>
#include <atomic>

#include "kernels/common/bwd_prepost.cuh"
#include "kernels/common/bwd_split.cuh"
#include "kernels/common/experimental_switch.h"
#include "kernels/common/grid.h"
#include "kernels/common/launch_util.h"
#include "kernels/common/split_schedule.cuh"

namespace flashspan {

namespace kern {
namespace {

// dSink, one CTA per query head (bwd_prepost.cuh sdpa_dsink_reduce).
__global__ void __launch_bounds__(256) sdpa_bwd_dsink_kernel(const SdpaBwdParams p) { sdpa_dsink_reduce(p); }

// dBias from the dS workspace (bwd_prepost.cuh): the keys-reduced form, one warp per dBias element
// (sdpa_dbias_reduce), and the keys-kept form's two passes (sdpa_dbias_reduce_cols).
__global__ void __launch_bounds__(256) sdpa_bwd_dbias_kernel(const SdpaBwdParams p) {
  sdpa_dbias_reduce(p.analytic.bias, p.batch, p.num_heads_q, p.analytic.max_q, p.analytic.max_kv);
}
__global__ void __launch_bounds__(256) sdpa_bwd_dbias_acc_kernel(const SdpaBwdParams p) {
  sdpa_dbias_from_acc(p.analytic.bias, p.batch, p.num_heads_q, p.analytic.max_q, p.analytic.max_kv);
}
__global__ void __launch_bounds__(256) sdpa_bwd_dbias_zero_kernel(const SdpaBwdParams p) {
  sdpa_dbias_zero_fill(p.analytic.bias, p.batch, p.num_heads_q, p.analytic.max_q, p.analytic.max_kv);
}
template <bool kFinal>
__global__ void __launch_bounds__(256) sdpa_bwd_dbias_cols_kernel(const SdpaBwdParams p, int64_t chunk, int64_t chunks) {
  sdpa_dbias_reduce_cols<kFinal>(p.analytic.bias, p.batch, p.num_heads_q, p.analytic.max_q, p.analytic.max_kv, chunk,
                                 chunks);
}

}  // namespace
}  // namespace kern

namespace {
kern::OffSwitch g_pre_paired("FLASHSPAN_BWD_PREPROCESS_PAIRED");
kern::OffSwitch g_dbias_cols("FLASHSPAN_SDPA_DBIAS_COLS");
std::atomic<int64_t> g_dbias_form_launches[3];  // by SdpaDbiasDsForm

// dBias one dense row-major block (each dimension of size > 1 strided by the product of the later sizes).
bool dbias_dense(const SdpaBiasParams& bp) {
  int64_t inner = 1;
  for (int d = 3; d >= 0; --d) {
    if (bp.dbias_size[d] > 1 && bp.dbias_stride[d] != inner) return false;
    inner *= bp.dbias_size[d];
  }
  return true;
}
}  // namespace

int64_t sdpa_dbias_form_launches(int form) {
  return form >= 0 && form < 3 ? g_dbias_form_launches[form].load(std::memory_order_relaxed) : 0;
}

void set_sdpa_dbias_cols(int on) { g_dbias_cols.set(on); }
bool sdpa_dbias_cols_enabled() { return g_dbias_cols.on(); }

void set_bwd_preprocess_paired(int on) { g_pre_paired.set(on); }
bool bwd_preprocess_paired() { return g_pre_paired.on(); }

unsigned bwd_preprocess_grid(int64_t units, int head_dv, bool paired) {
  // The paired form's CTAs cover 8 warps x 32 / lanes rows x kPreUnits passes (bwd_prepost.cuh
  // preprocess_lanes); the other keeps its grid (a CTA per 8 units).
  if (!paired) return grid_stride_1d(units, 8);
  return grid_stride_1d(units, 8 * (32 / kern::preprocess_lanes(head_dv)) * kern::kPreUnits);
}

void launch_sdpa_bwd_preprocess(const SdpaBwdParams& p, DType dtype, cudaStream_t stream, const char* what) {
  const bool paired = bwd_preprocess_paired();
  const unsigned grid = bwd_preprocess_grid(int64_t(p.num_heads_q) * p.total_q, p.head_dv, paired);
  with_element_type(dtype, what, [&](auto e) {
    using E = decltype(e);
    if (paired) {
      kern::sdpa_bwd_preprocess_kernel<E, true><<<grid, 256, 0, stream>>>(p);
    } else {
      kern::sdpa_bwd_preprocess_kernel<E, false><<<grid, 256, 0, stream>>>(p);
    }
  });
  check_launch(what);
}

void launch_bwd_preprocess(const BwdParams& p, DType dtype, int64_t total_q, cudaStream_t stream, int dq_cols) {
  if (p.dq_accum != nullptr && total_q > 0) {
    // dq_accum: [Hq, total_q, Dqk], or with dq_blocked one Bq x dq_cols tile per (query head, global
    // query block of the backward view) (params.h).
    const size_t rows = p.dq_blocked ? size_t(p.view.num_q_blocks) * size_t(p.view.block_q) : size_t(total_q);
    const size_t cols = size_t(dq_cols > 0 ? dq_cols : p.head_dqk);
    check_cuda(cudaMemsetAsync(p.dq_accum, 0, sizeof(float) * size_t(p.num_heads_q) * rows * cols, stream),
               "flex backward: clearing the dQ accumulator");
  }
  if (p.dq_sem != nullptr && total_q > 0) {
    // The ordering counters of the dQ tiles (deterministic sm90 backward): one per tile.
    check_cuda(cudaMemsetAsync(p.dq_sem, 0,
                               sizeof(int32_t) * kDqSemStride * size_t(p.num_heads_q) * size_t(p.view.num_q_blocks),
                               stream),
               "flex backward: clearing the dQ tile counters");
  }
  if (total_q > 0) {
    // head_dv / 8 lanes per (query row, head), several rows a warp, grid-stride (bwd_prepost.cuh):
    // any batch size, head count or THD sample count fits one launch.
    const bool paired = bwd_preprocess_paired();
    const unsigned grid = bwd_preprocess_grid(int64_t(p.num_heads_q) * total_q, p.head_dv, paired);
    with_element_type(dtype, "flex backward preprocess", [&](auto e) {
      using E = decltype(e);
      if (paired) {
        kern::flex_bwd_preprocess_kernel<E, true><<<grid, 256, 0, stream>>>(p);
      } else {
        kern::flex_bwd_preprocess_kernel<E, false><<<grid, 256, 0, stream>>>(p);
      }
    });
    check_launch("flex backward preprocess");
  }
}

void launch_bwd_split_schedule(const BwdParams& p, cudaStream_t stream, bool cut_walks) {
  const unsigned tasks = grid_1d(p.split.num_tasks, "flex backward dK/dV (tasks)");
  kern::flex_bwd_split_count_kernel<<<grid_1d((int64_t(tasks) + 255) / 256, "flex backward split count"), 256, 0,
                                      stream>>>(p);
  check_launch("flex backward split count");
  if (p.deterministic) {
    // One slot per item and a cut of the plan alone (bwd_split.cuh, deterministic form), or no
    // cut at all.
    if (cut_walks) {
      kern::split_scan_kernel<true, kern::kSplitPlanOnly><<<1, kern::kSplitScanThreads, 0, stream>>>(p.split);
    } else {
      kern::split_scan_kernel<true, kern::kSplitNone><<<1, kern::kSplitScanThreads, 0, stream>>>(p.split);
    }
  } else if (p.split.split_first) {
    // The sm90 backward in cell order: the cut walks' items first (split_schedule.cuh kSplitFirst).
    kern::split_scan_kernel<false, kern::kSplitPerGrid, true><<<1, kern::kSplitScanThreads, 0, stream>>>(p.split);
  } else {
    kern::split_scan_kernel<false><<<1, kern::kSplitScanThreads, 0, stream>>>(p.split);
  }
  check_launch("flex backward split scan");
  kern::flex_bwd_split_items_kernel<<<dim3(tasks, kern::kSplitRowGroups), 256, 0, stream>>>(p);
  check_launch("flex backward split items");
}

void launch_bwd_split_convert(const BwdParams& p, DType dtype, cudaStream_t stream) {
  const unsigned tasks = grid_1d(p.split.num_tasks, "flex backward dK/dV (tasks)");
  with_element_type(dtype, "flex backward split convert", [&](auto e) {
    kern::flex_bwd_split_convert_kernel<decltype(e)><<<dim3(tasks, kern::kSplitRowGroups), 256, 0, stream>>>(p);
  });
  check_launch("flex backward split convert");
}

void launch_bwd_dq_convert(const BwdParams& p, DType dtype, int64_t total_q, cudaStream_t stream) {
  if (total_q <= 0) return;
  // One warp per (query row, head), grid-stride (bwd_prepost.cuh).
  const unsigned grid = grid_stride_1d(int64_t(p.num_heads_q) * total_q, 8);
  with_element_type(dtype, "flex backward dQ convert", [&](auto e) {
    kern::flex_bwd_dq_convert_kernel<decltype(e)><<<grid, 256, 0, stream>>>(p);
  });
  check_launch("flex backward dQ convert");
}

void launch_sdpa_bwd_dsink(const SdpaBwdParams& p, cudaStream_t stream) {
  if (p.analytic.score.dsink == nullptr) return;
  if (p.total_q > 0) {
    kern::sdpa_bwd_dsink_kernel<<<p.num_heads_q, 256, 0, stream>>>(p);
    check_launch("sdpa backward dSink");
  } else {
    check_cuda(cudaMemsetAsync(p.analytic.score.dsink, 0, sizeof(float) * size_t(p.num_heads_q), stream),
               "sdpa backward: clearing dSink");
  }
}

void launch_sdpa_bwd_ds_clear(const SdpaBwdParams& p, cudaStream_t stream) {
  const SdpaBiasParams& bp = p.analytic.bias;
  if (bp.dbias == nullptr) return;
  const int64_t elems =
      kern::DbiasGeometry::make(bp, p.batch, p.num_heads_q, p.analytic.max_q, p.analytic.max_kv).elems();
  if (bp.ds_form == kDbiasDsDirect) {  // the kernel stores into dBias itself: dBias zeroed
    if (elems <= 0) return;
    if (dbias_dense(bp)) {
      const size_t bytes = size_t(elems) * (bp.dbias_dtype == kSdpaBiasF32 ? 4 : 2);
      check_cuda(cudaMemsetAsync(bp.dbias, 0, bytes, stream), "sdpa backward: clearing dBias");
    } else {
      kern::sdpa_bwd_dbias_zero_kernel<<<grid_stride_1d(elems, 256), 256, 0, stream>>>(p);
      check_launch("sdpa backward: clearing dBias");
    }
    return;
  }
  if (bp.ds == nullptr) return;
  const size_t floats = bp.ds_form == kDbiasDsAccumulate
                            ? size_t(elems)
                            : size_t(p.batch) * size_t(p.num_heads_q) * size_t(p.analytic.max_q) * size_t(bp.ds_ld);
  check_cuda(cudaMemsetAsync(bp.ds, 0, sizeof(float) * floats, stream),
             "sdpa backward: clearing the dS workspace of dBias");
}

void launch_sdpa_bwd_dbias(const SdpaBwdParams& p, cudaStream_t stream) {
  const SdpaBiasParams& bp = p.analytic.bias;
  if (bp.dbias == nullptr) return;
  const kern::DbiasGeometry g =
      kern::DbiasGeometry::make(bp, p.batch, p.num_heads_q, p.analytic.max_q, p.analytic.max_kv);
  const int64_t elems = g.elems(), terms = g.terms();
  if (bp.ds_form >= 0 && bp.ds_form < 3) g_dbias_form_launches[bp.ds_form].fetch_add(1, std::memory_order_relaxed);
  if (elems <= 0 || bp.ds_form == kDbiasDsDirect) return;  // (direct: the kernel stored dBias)
  if (bp.ds_form == kDbiasDsAccumulate) {  // the kernel summed dS into the accumulator: converted
    kern::sdpa_bwd_dbias_acc_kernel<<<grid_stride_1d(elems, 256), 256, 0, stream>>>(p);
    check_launch("sdpa backward dBias (accumulator)");
    return;
  }
  if (g.n3 == 1 || !sdpa_dbias_cols_enabled()) {  // keys reduced (or the keys-kept form off): a warp an element
    kern::sdpa_bwd_dbias_kernel<<<grid_stride_1d(elems, 8), 256, 0, stream>>>(p);
    check_launch("sdpa backward dBias");
    return;
  }
  // Keys kept: a thread per (element, run of terms), with enough runs that about kDbiasThreads threads
  // read at once (a (1, 1, 1, S) dBias has S elements of B H S_q terms each); a function of the shapes
  // alone, so the sums' order (and the result, bitwise) does not depend on the GPU.
  constexpr int64_t kDbiasThreads = int64_t(1) << 18;
  const int64_t nterms = std::max<int64_t>(terms, 1);  // (no terms: one empty run, dBias 0)
  int64_t chunks = std::min<int64_t>(std::max<int64_t>((kDbiasThreads + elems - 1) / elems, 1), nterms);
  const int64_t chunk = (nterms + chunks - 1) / chunks;
  chunks = (nterms + chunk - 1) / chunk;
  kern::sdpa_bwd_dbias_cols_kernel<false><<<grid_stride_1d(elems * chunks, 256), 256, 0, stream>>>(p, chunk, chunks);
  check_launch("sdpa backward dBias");
  if (chunks > 1) {
    kern::sdpa_bwd_dbias_cols_kernel<true><<<grid_stride_1d(elems, 256), 256, 0, stream>>>(p, chunk, chunks);
    check_launch("sdpa backward dBias (runs)");
  }
}

}  // namespace flashspan
