// Instantiations and launch of the sm90 flex forward (kernel_fwd_sm90.cuh): head dims
// {64, 128} x {fp16, bf16} x {max_logit off, on}; tensor maps of Q, K, V (encoded on the host
// per call: no stream operation, so capture-safe); the split schedule of long walks when the
// caller gave a workspace: count, scan (split_schedule.cuh), item list (every task, so
// the persistent kernel always claims from it, longest tasks first), the persistent kernel,
// and the combine of split tasks.
#include <cuda.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <mutex>

#include "core/error.h"
#include "kernels/common/grid.h"
#include "kernels/common/split_schedule.cuh"
#include "kernels/sm90/kernel_fwd_sm90.cuh"
#include "kernels/sm90/launch_sm90.h"
#include "kernels/sm90/tile_sm90.h"
#include "kernels/sm90/tma_sm90.h"

namespace flashspan::sm90 {
namespace {

void check_cuda(cudaError_t e, const char* what) {
  FS_CHECK(e == cudaSuccess, Status::kCudaError, what, ": ", cudaGetErrorString(e));
}
void check_launch(const char* what) {
  const cudaError_t e = cudaGetLastError();
  FS_CHECK(e == cudaSuccess, Status::kCudaError, what, ": kernel launch failed: ", cudaGetErrorString(e));
}

// A. Key blocks of every task (as the sm80 count kernel).
__global__ void __launch_bounds__(256) fwd_split_count_kernel_sm90(const FwdParams p) {
  const int t = blockIdx.x * 256 + threadIdx.x;
  if (t >= p.split.num_tasks) return;
  const kern::Task task = kern::load_task(p.view.tasks, t);
  const int qb = task.block, h = task.head, b = task.batch;
  const int64_t r = int64_t(p.mask_per_head ? h : 0) * p.view.num_q_blocks + __ldg(p.view.q_block_start + b) + qb;
  // Blocks of the row: partial entries + full blocks of its runs (plan format 2).
  p.split.task_iters[t] =
      kern::BlockCursor::row(p.view.q2k_partial_ptr, p.view.q2k_partial_kb, p.view.q2k_full_ptr, p.view.q2k_full_runs, r)
          .remaining();
}

// B. Items of task blockIdx.x, split or not: the sm90 kernel always runs the item list.
__global__ void __launch_bounds__(256) fwd_split_items_kernel_sm90(const FwdParams p) {
  kern::write_split_items<true>(p.split, blockIdx.x);
}

// C. Rows of split task blockIdx.x from its items' slots (unpacked rows, 128-row blocks):
// m = max m_i, l = sum l_i 2^(m_i - m), out = sum O_i 2^(m_i - m) / l, LSE = (m + log2 l) ln 2;
// rows without a visible key get out 0 and LSE -inf.
template <class E>
__global__ void __launch_bounds__(256) fwd_split_combine_kernel_sm90(const FwdParams p) {
  using Elem = typename E::Storage;
  const FwdSplit& sp = p.split;
  const int t = blockIdx.x;
  const int slot0 = sp.task_slot[t];
  if (slot0 < 0) return;
  constexpr int bq = kern90::kBlockQ;
  const int n = sp.item_start[t + 1] - sp.item_start[t];
  const kern::Task task = kern::load_task(p.view.tasks, t);
  const int qb = task.block, h = task.head, b = task.batch;
  const int q_start = __ldg(p.cu_seqlens_q + b), len_q = __ldg(p.cu_seqlens_q + b + 1) - q_start;
  const int row0 = qb * bq;
  const int rows_valid = min(bq, len_q - row0);
  const int64_t q_row0 = (p.varlen ? q_start : 0) + row0;
  __shared__ float s_m[bq], s_inv[bq];
  for (int row = threadIdx.x; row < rows_valid; row += blockDim.x) {
    float m = -INFINITY;
    for (int i = 0; i < n; ++i) m = fmaxf(m, sp.ml[int64_t(slot0 + i) * 2 * bq + row]);
    const float m_use = m == -INFINITY ? 0.0f : m;
    float l = 0.0f;
    for (int i = 0; i < n; ++i) {
      const float* ml = sp.ml + int64_t(slot0 + i) * 2 * bq;
      l += ml[bq + row] * exp2f(ml[row] - m_use);
    }
    s_m[row] = m_use;
    s_inv[row] = l > 0.0f ? 1.0f / l : 0.0f;
    if (p.lse != nullptr) {
      p.lse[int64_t(b) * p.lsea.batch_stride + int64_t(h) * p.lsea.head_stride + (q_row0 + row) * p.lsea.row_stride] =
          kern::lse_from_stats(m, l);
    }
  }
  __syncthreads();
  Elem* o = static_cast<Elem*>(p.o) + int64_t(b) * p.oa.batch_stride + q_row0 * p.oa.row_stride +
            int64_t(h) * p.oa.head_stride;
  const int pairs = p.head_dv / 2;
  for (int idx = threadIdx.x; idx < rows_valid * pairs; idx += blockDim.x) {
    const int row = idx / pairs, c = 2 * (idx - row * pairs);
    const float m_use = s_m[row];
    float2 acc = make_float2(0.0f, 0.0f);
    for (int i = 0; i < n; ++i) {
      const int64_t slot = slot0 + i;
      const float w = exp2f(sp.ml[slot * 2 * bq + row] - m_use);
      const float2 x = *reinterpret_cast<const float2*>(sp.o_accum + (slot * bq + row) * p.head_dv + c);
      acc.x += w * x.x;
      acc.y += w * x.y;
    }
    const float inv = s_inv[row];
    *reinterpret_cast<uint32_t*>(o + int64_t(row) * p.oa.row_stride + c) = kern::pack2<E>(acc.x * inv, acc.y * inv);
  }
}

__global__ void fill_neg_inf_kernel_sm90(float* p, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) p[i] = -INFINITY;
}

int device_sms(int dev) {
  static std::atomic<int> cache[64];
  if (dev >= 0 && dev < 64) {
    const int c = cache[dev].load(std::memory_order_relaxed);
    if (c > 0) return c;
  }
  int sms = 0;
  check_cuda(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev), "sm90 forward: SM count");
  sms = std::max(1, std::min(sms, SplitSchedule::kMaxCtas));
  if (dev >= 0 && dev < 64) cache[dev].store(sms, std::memory_order_relaxed);
  return sms;
}

template <int kD, class E, bool kMaxLogit, bool kOverlap>
void run(const FwdParams& p, const CUtensorMap& mq, const CUtensorMap& mk, const CUtensorMap& mv,
         cudaStream_t stream) {
  using L = kern90::FwdSm90Layout<kD>;
  auto kernel = kern90::flex_fwd_kernel_sm90<kD, E, kMaxLogit, kOverlap>;
  static std::atomic<uint64_t> smem_set{0};
  int dev = 0;
  check_cuda(cudaGetDevice(&dev), "sm90 forward: cudaGetDevice");
  const uint64_t bit = dev < 64 ? (uint64_t(1) << dev) : 0;
  if (bit == 0 || (smem_set.load(std::memory_order_acquire) & bit) == 0) {
    check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, L::kBytes),
               "sm90 forward: cudaFuncSetAttribute(MaxDynamicSharedMemorySize)");
    smem_set.fetch_or(bit, std::memory_order_acq_rel);
  }
  const int sms = device_sms(dev);
  if (p.split_schedule) {
    FwdParams ps = p;
    ps.split.num_ctas = sms;
    const unsigned tasks = grid_1d(ps.split.num_tasks, "flex forward (sm90 tasks)");  // grid.h
    fwd_split_count_kernel_sm90<<<grid_1d((int64_t(tasks) + 255) / 256, "flex forward split count (sm90)"), 256, 0,
                                  stream>>>(ps);
    check_launch("flex forward split count (sm90)");
    kern::split_scan_kernel<true><<<1, kern::kSplitScanThreads, 0, stream>>>(ps.split);
    check_launch("flex forward split scan (sm90)");
    fwd_split_items_kernel_sm90<<<tasks, 256, 0, stream>>>(ps);
    check_launch("flex forward split items (sm90)");
    kernel<<<unsigned(sms), kern90::kThreads, L::kBytes, stream>>>(ps, mq, mk, mv);
    check_launch("flex forward (sm90)");
    fwd_split_combine_kernel_sm90<E><<<tasks, 256, 0, stream>>>(ps);
    check_launch("flex forward split combine (sm90)");
    return;
  }
  const int64_t items = p.grid_mode ? p.view.num_q_blocks * p.num_heads_q : p.view.num_tasks;
  const unsigned grid = unsigned(std::min<int64_t>(sms, items));
  kernel<<<grid, kern90::kThreads, L::kBytes, stream>>>(p, mq, mk, mv);
  check_launch("flex forward (sm90)");
}

// Consumer schedule: intra-warpgroup overlap of the softmax with the P V GEMM (kOverlap) for
// D = 64, unless FLASHSPAN_SM90_OVERLAP=0 (the serial schedule, for comparison). D = 128 runs
// the serial schedule: its overlapped loop needs more registers than ptxas (nvcc 13.0) gives the
// consumer region (C7512, ~240 bytes of spills), and measured slower on the H200 (PERF_LOG v1.0).
bool overlap_disabled() {
  static const bool off = [] {
    const char* e = std::getenv("FLASHSPAN_SM90_OVERLAP");
    return e != nullptr && e[0] == '0';
  }();
  return off;
}

template <int kD, class E, bool kMaxLogit>
void run_o(const FwdParams& p, const CUtensorMap& mq, const CUtensorMap& mk, const CUtensorMap& mv,
           cudaStream_t s) {
  if constexpr (kD == 64) {
    if (!overlap_disabled()) {
      run<kD, E, kMaxLogit, true>(p, mq, mk, mv, s);
      return;
    }
  }
  run<kD, E, kMaxLogit, false>(p, mq, mk, mv, s);
}

template <int kD>
void run_d(const FwdParams& p, DType dtype, const CUtensorMap& mq, const CUtensorMap& mk, const CUtensorMap& mv,
           cudaStream_t s) {
  const bool ml = p.max_logit != nullptr;
  with_element_type(dtype, "flex forward (sm90)", [&](auto e) {
    using E = decltype(e);
    ml ? run_o<kD, E, true>(p, mq, mk, mv, s) : run_o<kD, E, false>(p, mq, mk, mv, s);
  });
}

}  // namespace

bool fwd_config_supported(const FlexGeometry& g, bool pack_gqa) {
  const bool packed = pack_gqa && g.num_heads_kv > 0 && g.group_size() > 1;
  return (g.dtype == DType::kFloat16 || g.dtype == DType::kBFloat16) &&
         fwd_runs_head_dims_sm90(g.head_dim_qk, g.head_dim_v) && !packed;
}

bool device_supported(int device_id) {
  static std::mutex mu;
  static int state[64] = {};  // 0 unknown, 1 yes, 2 no
  if (device_id < 0 || device_id >= 64) return false;
  std::lock_guard<std::mutex> lock(mu);
  if (state[device_id] == 0) {
    bool ok = false;
    int major = 0, minor = 0, prev = 0;
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device_id) == cudaSuccess &&
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device_id) == cudaSuccess && major == 9 &&
        minor == 0 && cudaGetDevice(&prev) == cudaSuccess && cudaSetDevice(device_id) == cudaSuccess) {
      // The binary the runtime loads for this device: 90 only when sm_90a code was built.
      cudaFuncAttributes attr{};
      ok = cudaFuncGetAttributes(&attr, kern90::flex_fwd_kernel_sm90<128, BFloat16, false, false>) == cudaSuccess &&
           attr.binaryVersion == 90;
      (void)cudaSetDevice(prev);
    }
    (void)cudaGetLastError();
    state[device_id] = ok ? 1 : 2;
  }
  return state[device_id] == 1;
}

int fwd_smem_bytes(int d) {
  return d <= 64 ? kern90::FwdSm90Layout<64>::kBytes : kern90::FwdSm90Layout<128>::kBytes;
}

void launch_fwd_sm90(const FwdParams& p, const TensorView& q, const TensorView& k, const TensorView& v,
                     DType dtype, cudaStream_t stream) {
  FS_CHECK(p.pack == 1 && fwd_runs_head_dims_sm90(p.head_dqk, p.head_dv) && p.view.block_q == kern90::kBlockQ &&
               p.view.block_k == kern90::kBlockK,
           Status::kInternal, "sm90 forward: unsupported configuration reached the launcher (D ", p.head_dqk, "/", p.head_dv,
           ", tile ", p.view.block_q, "x", p.view.block_k, ", pack ", p.pack, ")");
  if (p.max_logit != nullptr) {
    fill_neg_inf_kernel_sm90<<<grid_1d((int64_t(p.num_heads_q) + 127) / 128, "sm90 forward: max_logit reset"), 128,
                               0, stream>>>(p.max_logit, p.num_heads_q);
    check_launch("flex forward: max_logit reset (sm90)");
  }
  if (p.view.num_q_blocks == 0 || (!p.grid_mode && p.view.num_tasks == 0)) return;
  const bool varlen = p.varlen != 0;
  const CUtensorMap mq = make_tensor_map_sm90(q, varlen, dtype, kern90::kBlockQ, "q");
  const CUtensorMap mk = make_tensor_map_sm90(k, varlen, dtype, kern90::kBlockK, "k");
  const CUtensorMap mv = make_tensor_map_sm90(v, varlen, dtype, kern90::kBlockK, "v");
  if (p.head_dqk == 64) {
    run_d<64>(p, dtype, mq, mk, mv, stream);
  } else {
    run_d<128>(p, dtype, mq, mk, mv, stream);
  }
}

}  // namespace flashspan::sm90
