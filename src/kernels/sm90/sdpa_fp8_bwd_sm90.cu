// The FP8 SDPA backward on the sm90 backward kernel (kernel_bwd_fp8_sm90.cuh says how): the launcher and
// the (64, 64) / (128, 128) instantiations (bf16 copies of the codes only).
#include <algorithm>
#include <atomic>
#include <type_traits>

#include "core/error.h"
#include "kernels/common/experimental_switch.h"
#include "kernels/common/fp8_prepass.h"
#include "kernels/common/grid.h"
#include "kernels/common/launch_util.h"
#include "kernels/sm90/kernel_bwd_fp8_sm90.cuh"
#include "kernels/sm90/sdpa_bwd_sm90_run.h"
#include "kernels/sm90/sdpa_fp8_bwd_sm90.h"
#include "kernels/sm90/tile_sm90.h"
#include "kernels/sm90/tma_sm90.h"

namespace flashspan::sm90 {
namespace {

std::atomic<int64_t> g_launches{0};

// The BSHD view of a workspace copy [B, H, S, D] (bf16, contiguous) for make_tensor_map_sm90. An empty copy
// (S = 0) keeps non-zero strides (as a row of one), which the tensor-map encoder takes; nothing reads it.
TensorView copy_view(const void* data, int64_t batch, int64_t heads, int64_t rows, int64_t cols) {
  TensorView v;
  v.data = const_cast<void*>(data);
  v.dtype = DType::kBFloat16;
  v.device = DeviceType::kCUDA;
  v.ndim = 4;
  v.shape = {batch, heads, rows, cols};
  const int64_t r = rows > 0 ? rows : 1;
  v.strides = {heads * r * cols, r * cols, cols, 1};
  return bshd_of_bhsd(v);
}

kern::OffSwitch g_store{"FLASHSPAN_SM90_SDPA_FP8_BWD_STORE"};

// kStore: the kernel stores dK / dV itself (sdpa_fp8_bwd_sm90_store_enabled), else through the slots and the
// store pass.
template <int kD, int kFormats, bool kStore>
void run_fp8_bwd(const SdpaFp8BwdParams& p, const CUtensorMap& mq, const CUtensorMap& mk, const CUtensorMap& mv,
                 const CUtensorMap& mdo, cudaStream_t s) {
  using L = kern90::BwdSm90Layout<kD>;
  const int item_heads = sdpa_bwd_item_heads_sm90(p.num_heads_q, p.group_size, p.analytic.score.group_v);
  const int64_t items = int64_t(p.analytic.num_k_blocks) * item_heads * p.batch;
  if (items > 0) {
    auto kernel = kern90::sdpa_fp8_bwd_kernel_sm90<kD, kFormats, kStore>;
    static std::atomic<uint64_t> smem_set{0};
    ensure_smem_limit(kernel, L::kBytes, smem_set, "sdpa fp8 backward (sm90): cudaFuncSetAttribute");
    static std::atomic<int> ctas_cache[64];
    const int ctas = persistent_ctas(kernel, L::kThreads, L::kBytes, ctas_cache, "sdpa fp8 backward (sm90)");
    kernel<<<unsigned(std::min<int64_t>(ctas, items)), L::kThreads, L::kBytes, s>>>(p, mq, mk, mv, mdo);
    check_launch("sdpa fp8 backward (sm90)");
  }
  if (p.total_q > 0) {
    kern90::sdpa_fp8_bwd_dq_store_kernel_sm90<kD>
        <<<grid_stride_1d(int64_t(p.num_heads_q) * p.total_q, 8), 256, 0, s>>>(p);
    check_launch("sdpa fp8 backward dQ (sm90)");
  }
  const int64_t units = int64_t(p.batch) * p.analytic.max_kv *
                        (p.num_heads_q / p.group_size + p.num_heads_q / p.analytic.score.group_v);
  if (!kStore && units > 0) {
    kern90::sdpa_fp8_bwd_dkdv_store_kernel_sm90<kD><<<grid_stride_1d(units, 8), 256, 0, s>>>(p);
    check_launch("sdpa fp8 backward dK / dV (sm90)");
  }
}

}  // namespace

int64_t sdpa_fp8_bwd_sm90_launches() { return g_launches.load(std::memory_order_relaxed); }

void set_sdpa_fp8_bwd_sm90_store_enabled(int on) { g_store.set(on); }
bool sdpa_fp8_bwd_sm90_store_enabled() { return g_store.on(); }

void launch_sdpa_fp8_bwd_sm90(const SdpaFp8BwdParams& p_in, cudaStream_t stream) {
  SdpaFp8BwdParams p = p_in;
  const int hk = p.num_heads_q / p.group_size, hv = p.num_heads_q / p.analytic.score.group_v;
  // H_k != H_v (its GPU tests passed on an H100, PERF_LOG v2.40): the 16-bit SDPA backward's items (the query heads sharing one
  // K and one V head: one of the groups a multiple of the other), every item's dK / dV into its slot, and the
  // store pass summing each head's slots (sdpa_fp8_bwd_dkdv_store_kernel_sm90).
  const bool hk_ne_hv = p.analytic.score.group_v != p.group_size;
  FS_CHECK(p.head_dqk % 16 == 0 && p.head_dv % 16 == 0 && p.head_dqk <= 128 && p.head_dv <= 128 &&
               sdpa_bwd_heads_run_sm90(p.group_size, p.analytic.score.group_v) && p.split_schedule == 0 &&
               (p.total_q == 0 || (p.dq_accum != nullptr && (!p.deterministic || p.dq_sem != nullptr))),
           Status::kInternal, "sdpa fp8 backward (sm90): unsupported configuration reached the launcher (D ",
           p.head_dqk, "/", p.head_dv, ")");
  const BwdDimsSm90 kdims = bwd_kernel_dims_sm90(p.head_dqk, p.head_dv);
  const int kd = kdims.dqk;
  FS_CHECK(kd == kdims.dv && (kd == 64 || kd == 128), Status::kInternal,
           "sdpa fp8 backward (sm90): kernel head dims ", kd, "/", kdims.dv);
  const TileSm90 t = tile_sm90(p.head_dqk, p.head_dv, false);
  const int kBq = t.bwd_bq, kBk = t.bwd_bk;
  static_assert(kern90::BwdSm90Layout<64>::kBlockQ == 64 && kern90::BwdSm90Layout<64>::kBlockK == 128 &&
                kern90::BwdSm90Layout<128>::kBlockQ == 64 && kern90::BwdSm90Layout<128>::kBlockK == 128);
  g_launches.fetch_add(1, std::memory_order_relaxed);
  // Factors, amaxes zeroed, the bf16 copies, D and lse2 (the sm80 FP8 backward's pre-pass).
  launch_sdpa_fp8_bwd_prepass(p, stream);
  // The grid fields, the dQ tiles (and counters) and every item's dK / dV slot cleared (one item a slot), as the
  // 16-bit launcher's. The in-kernel store (experimental) takes H_k = H_v only (an item is then its cell's task).
  const bool store = sdpa_fp8_bwd_sm90_store_enabled() && !hk_ne_hv;
  prepare_sdpa_bwd_sm90(p, kBq, kBk, kd, kd, sdpa_bwd_item_heads_sm90(p.num_heads_q, p.group_size, p.analytic.score.group_v),
                        /*slots=*/!store, stream);
  const int64_t sq = p.analytic.max_q, skv = p.analytic.max_kv;
  const CUtensorMap mq =
      make_tensor_map_sm90(copy_view(p.q, p.batch, p.num_heads_q, sq, p.head_dqk), false, DType::kBFloat16, kBq, "q");
  const CUtensorMap mk = make_tensor_map_sm90(copy_view(p.k, p.batch, hk, skv, p.head_dqk), false, DType::kBFloat16,
                                              kBk, "k");
  const CUtensorMap mv =
      make_tensor_map_sm90(copy_view(p.v, p.batch, hv, skv, p.head_dv), false, DType::kBFloat16, kBk, "v");
  const CUtensorMap mdo = make_tensor_map_sm90(copy_view(p.dout, p.batch, p.num_heads_q, sq, p.head_dv), false,
                                               DType::kBFloat16, kBq, "dout");
  // One instantiation per kernel head dim and pair of formats (q's, dO's).
  auto run = [&](auto d, auto fmt) {
    if (store) {
      run_fp8_bwd<decltype(d)::value, decltype(fmt)::value, true>(p, mq, mk, mv, mdo, stream);
    } else {
      run_fp8_bwd<decltype(d)::value, decltype(fmt)::value, false>(p, mq, mk, mv, mdo, stream);
    }
  };
  auto with_formats = [&](auto d) {
    switch (kern90::fp8_bwd_formats(p.format, p.do_format)) {
      case 0: run(d, std::integral_constant<int, 0>{}); break;
      case 1: run(d, std::integral_constant<int, 1>{}); break;
      case 2: run(d, std::integral_constant<int, 2>{}); break;
      default: run(d, std::integral_constant<int, 3>{}); break;
    }
  };
  if (kd == 64) {
    with_formats(std::integral_constant<int, 64>{});
  } else {
    with_formats(std::integral_constant<int, 128>{});
  }
}

}  // namespace flashspan::sm90
