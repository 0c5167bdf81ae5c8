// Instantiations and launch of the sm90 flex backward (kernel_bwd_sm90.cuh): head dims
// {(64, 64), (128, 128), (192, 128), (256, 256)} x {fp16, bf16}, deterministic or not (a runtime parameter); the shared preprocess / split schedule / convert kernels of
// kernels/common (launch_bwd_common.h) around it; tensor maps of Q, K, V, dO encoded on the host
// per call (no stream operation, so capture-safe).
#include <cuda.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>

#include "core/error.h"
#include "kernels/common/grid.h"
#include "kernels/common/launch_bwd_common.h"
#include "kernels/common/launch_util.h"
#include "kernels/sm90/kernel_bwd_sm90.cuh"
#include "kernels/sm90/launch_sm90.h"
#include "kernels/sm90/tile_sm90.h"
#include "kernels/sm90/tma_sm90.h"

namespace flashspan::sm90 {
namespace {

// Persistent grid: one CTA per SM (shared memory allows one); with the split schedule every
// CTA claims items from the list (deterministic: always, over every cell), otherwise CTA i runs
// tasks (or grid cells) i, i + grid, ...
template <int kD, class E, int kDv = kD>
void run_bwd(const BwdParams& p_in, const CUtensorMap& mq, const CUtensorMap& mk, const CUtensorMap& mv,
             const CUtensorMap& mdo, cudaStream_t stream) {
  using L = kern90::BwdSm90Layout<kD, kDv>;
  auto kernel = kern90::flex_bwd_kernel_sm90<kD, E, kDv>;
  static std::atomic<uint64_t> smem_set{0};
  ensure_smem_limit(kernel, L::kBytes, smem_set, "flex backward (sm90): cudaFuncSetAttribute");
  static std::atomic<int> ctas_cache[64];
  const int ctas = persistent_ctas(kernel, L::kThreads, L::kBytes, ctas_cache, "flex backward (sm90)");
  BwdParams p = p_in;
  if (p.split_schedule) {
    p.split.num_ctas = ctas;
    launch_bwd_split_schedule(p, stream, !p.deterministic || bwd_det_split_enabled());
    kernel<<<grid_1d(ctas, "flex backward (sm90), persistent"), L::kThreads, L::kBytes, stream>>>(p, mq, mk, mv, mdo);
    check_launch("flex backward (sm90), persistent");
    launch_bwd_split_convert(p, E::kDType, stream);
    return;
  }
  const int64_t items =
      p.grid_mode ? p.view.num_k_blocks * int64_t(p.num_heads_q / p.group_size) : p.view.num_tasks;
  if (items <= 0) return;
  const unsigned grid = unsigned(std::min<int64_t>(ctas, items));
  kernel<<<grid, L::kThreads, L::kBytes, stream>>>(p, mq, mk, mv, mdo);
  check_launch("flex backward (sm90)");
}

}  // namespace

namespace {
std::atomic<int> g_bwd_override{-1};
std::atomic<int64_t> g_bwd_launches{0};
std::atomic<int> g_det_split_override{-1};
}  // namespace

void set_bwd_det_split(int on) { g_det_split_override.store(on < 0 ? -1 : (on ? 1 : 0), std::memory_order_relaxed); }

bool bwd_det_split_enabled() {
  const int o = g_det_split_override.load(std::memory_order_relaxed);
  if (o >= 0) return o == 1;
  static const bool on = [] {
    const char* e = std::getenv("FLASHSPAN_EXPERIMENTAL");
    return e != nullptr && std::strcmp(e, "1") == 0;
  }();
  return on;
}

int64_t bwd_launches() { return g_bwd_launches.load(std::memory_order_relaxed); }

void set_bwd_enabled(int on) { g_bwd_override.store(on < 0 ? -1 : (on ? 1 : 0), std::memory_order_relaxed); }

bool bwd_enabled() {
  const int o = g_bwd_override.load(std::memory_order_relaxed);
  if (o >= 0) return o == 1;
  // On by default (checked on an H200: the GPU suite, compute-sanitizer, PERF_LOG v1.4);
  // FLASHSPAN_SM90_BWD=0 keeps the portable sm80 backward for comparison.
  static const bool on = [] {
    const char* off = std::getenv("FLASHSPAN_SM90_BWD");
    return !(off != nullptr && std::strcmp(off, "0") == 0);
  }();
  return on;
}

// FLASHSPAN_SM90_BWD_DETERMINISTIC=0 gives deterministic calls the sm80 backward (its separate
// dQ kernel): the ordered dQ tiles are slower than it where every key block adds one tile at the
// same walk position (longformer's global query rows, PERF_LOG v1.6).
bool bwd_deterministic_enabled() {
  static const bool on = [] {
    const char* off = std::getenv("FLASHSPAN_SM90_BWD_DETERMINISTIC");
    return !(off != nullptr && std::strcmp(off, "0") == 0);
  }();
  return on;
}

// FLASHSPAN_SM90_BWD_DET_UNORDERED=1 (measurement only, results not reproducible): deterministic
// calls run the deterministic schedule without the dQ tiles' counter waits, which splits the
// cost of the ordering from that of the schedule (PERF_LOG v2.2).
namespace {
bool bwd_det_unordered() {
  static const bool on = [] {
    const char* v = std::getenv("FLASHSPAN_SM90_BWD_DET_UNORDERED");
    return v != nullptr && std::strcmp(v, "1") == 0;
  }();
  return on;
}
}  // namespace

bool bwd_config_supported(const FlexGeometry& g, bool deterministic) {
  return (g.dtype == DType::kFloat16 || g.dtype == DType::kBFloat16) &&
         bwd_runs_head_dims_sm90(g.head_dim_qk, g.head_dim_v) && (!deterministic || bwd_deterministic_enabled());
}

int bwd_smem_bytes(int dqk, int dv) {
  if (!bwd_runs_head_dims_sm90(dqk, dv)) return 0;
  if (dqk == 192) return kern90::BwdSm90Layout<192, 128>::kBytes;
  if (dqk == 256) return kern90::BwdSm90Layout<256, 256>::kBytes;
  return dqk == 64 ? kern90::BwdSm90Layout<64>::kBytes : kern90::BwdSm90Layout<128>::kBytes;
}

void launch_bwd_sm90(const BwdParams& p_in, const TensorView& q, const TensorView& k, const TensorView& v,
                     const TensorView& dout, DType dtype, int64_t total_q, cudaStream_t stream) {
  BwdParams p = p_in;
  const TileSm90 tile = tile_sm90(p.head_dqk, p.head_dv);
  FS_CHECK(bwd_runs_head_dims_sm90(p.head_dqk, p.head_dv) && p.view.block_q == tile.bwd_bq &&
               p.view.block_k == tile.bwd_bk,
           Status::kInternal, "sm90 backward: unsupported configuration reached the launcher (D ", p.head_dqk, "/",
           p.head_dv, ", tile ", p.view.block_q, "x", p.view.block_k, ")");
  const int64_t cells = p.view.num_k_blocks * int64_t(p.num_heads_q / p.group_size);
  FS_CHECK(!p.deterministic || (p.dq_sem != nullptr && p.grid_mode == 1 &&
                                (cells == 0 || (p.split_schedule == 1 && p.split.num_tasks == cells))),
           Status::kInternal,
           "sm90 backward: the deterministic path needs the dQ tile counters and the split schedule over every key "
           "block (bwd_split.cuh, deterministic form)");
  // Measurement only: the deterministic schedule without its dQ ordering (kernel_bwd_sm90.cuh).
  if (p.deterministic && bwd_det_unordered()) p.dq_sem = nullptr;
  FS_CHECK(p.dq_blocked == 1, Status::kInternal, "sm90 backward: the dQ accumulator is not bound in tiles");
  g_bwd_launches.fetch_add(1, std::memory_order_relaxed);
  launch_bwd_preprocess(p, dtype, total_q, stream);  // clears the tiled dq_accum too (dq_blocked)
  const bool varlen = p.varlen != 0;
  const CUtensorMap mq = make_tensor_map_sm90(q, varlen, dtype, tile.bwd_bq, "q");
  const CUtensorMap mk = make_tensor_map_sm90(k, varlen, dtype, tile.bwd_bk, "k");
  const CUtensorMap mv = make_tensor_map_sm90(v, varlen, dtype, tile.bwd_bk, "v");
  const CUtensorMap mdo = make_tensor_map_sm90(dout, varlen, dtype, tile.bwd_bq, "dout");
  const bool d64 = p.head_dqk == 64;
  with_element_type(dtype, "flex backward (sm90)", [&](auto e) {
    using E = decltype(e);
    if (p.head_dqk == 192) {
      run_bwd<192, E, 128>(p, mq, mk, mv, mdo, stream);
    } else if (p.head_dqk == 256) {
      run_bwd<256, E, 256>(p, mq, mk, mv, mdo, stream);
    } else {
      d64 ? run_bwd<64, E>(p, mq, mk, mv, mdo, stream) : run_bwd<128, E>(p, mq, mk, mv, mdo, stream);
    }
  });
  if (total_q > 0) {
    const unsigned grid = grid_stride_1d(int64_t(p.num_heads_q) * total_q, 8);
    with_element_type(dtype, "flex backward dQ convert (sm90)", [&](auto e) {
      using E = decltype(e);
      if (p.head_dqk == 192) {
        kern90::flex_bwd_dq_convert_kernel_sm90<192, E><<<grid, 256, 0, stream>>>(p);
      } else if (p.head_dqk == 256) {
        kern90::flex_bwd_dq_convert_kernel_sm90<256, E><<<grid, 256, 0, stream>>>(p);
      } else if (d64) {
        kern90::flex_bwd_dq_convert_kernel_sm90<64, E><<<grid, 256, 0, stream>>>(p);
      } else {
        kern90::flex_bwd_dq_convert_kernel_sm90<128, E><<<grid, 256, 0, stream>>>(p);
      }
    });
    check_launch("flex backward dQ convert (sm90)");
  }
}

}  // namespace flashspan::sm90
