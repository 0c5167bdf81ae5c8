// Instantiations and launch of the sm90 flex forward (kernel_fwd_sm90.cuh): head dims
// {64, 128} x {fp16, bf16} x {max_logit off, on}; tensor maps of Q, K, V (encoded on the host
// per call: no stream operation, so capture-safe); the split schedule of long walks when the
// caller gave a workspace: count, scan, item list (every task, so the persistent kernel always
// claims from it, longest tasks first), the persistent kernel, and the combine of split tasks
// (the arch-neutral kernels of fwd_split.cuh, launched through kernels/common/fwd_launch.h).
#include <cuda.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <mutex>

#include "core/error.h"
#include "kernels/common/fwd_launch.h"
#include "kernels/common/launch_util.h"
#include "kernels/sm90/kernel_fwd_sm90.cuh"
#include "kernels/sm90/launch_sm90.h"
#include "kernels/sm90/tile_sm90.h"
#include "kernels/sm90/tma_sm90.h"

namespace flashspan::sm90 {
namespace {

// The persistent grid: one CTA per SM (the kernel's 384 threads at 168 registers fill an SM's
// register file; launch_util.h, persistent_ctas), capped by SplitSchedule::kMaxCtas.
template <int kD, class E, bool kMaxLogit, bool kOverlap>
void run(const FwdParams& p, const CUtensorMap& mq, const CUtensorMap& mk, const CUtensorMap& mv,
         cudaStream_t stream) {
  using L = kern90::FwdSm90Layout<kD>;
  auto kernel = kern90::flex_fwd_kernel_sm90<kD, E, kMaxLogit, kOverlap>;
  static std::atomic<uint64_t> smem_set{0};
  ensure_smem_limit(kernel, L::kBytes, smem_set, "sm90 forward: cudaFuncSetAttribute(MaxDynamicSharedMemorySize)");
  static std::atomic<int> ctas_cache[64];
  const int ctas = persistent_ctas(kernel, kern90::kThreads, L::kBytes, ctas_cache, "sm90 forward: persistent grid");
  if (p.split_schedule) {
    FwdParams ps = p;
    ps.split.num_ctas = ctas;
    launch_fwd_split_schedule(ps, true, stream);
    kernel<<<unsigned(ctas), kern90::kThreads, L::kBytes, stream>>>(ps, mq, mk, mv);
    check_launch("flex forward (sm90)");
    launch_fwd_split_combine(ps, E::kDType, stream);
    return;
  }
  const int64_t items = p.grid_mode ? p.view.num_q_blocks * p.num_heads_q : p.view.num_tasks;
  const unsigned grid = unsigned(std::min<int64_t>(ctas, items));
  kernel<<<grid, kern90::kThreads, L::kBytes, stream>>>(p, mq, mk, mv);
  check_launch("flex forward (sm90)");
}

// Consumer schedule: intra-warpgroup overlap of the softmax with the P V GEMM (kOverlap).
// FLASHSPAN_SM90_OVERLAP: unset = overlap for D = 64, serial for D = 128; 0 = serial for both;
// 1 = overlap for both. (The D = 128 overlapped loop spilled under nvcc 13.0 until the producer
// warpgroup got its own exit, kernel_fwd_sm90.cuh; its speed decides the default, PERF_LOG.)
int overlap_mode() {
  static const int mode = [] {
    const char* e = std::getenv("FLASHSPAN_SM90_OVERLAP");
    if (e == nullptr || e[0] == '\0') return -1;
    return e[0] == '0' ? 0 : 1;
  }();
  return mode;
}

template <int kD, class E, bool kMaxLogit>
void run_o(const FwdParams& p, const CUtensorMap& mq, const CUtensorMap& mk, const CUtensorMap& mv,
           cudaStream_t s) {
  const int mode = overlap_mode();
  const bool overlap = mode == 1 || (mode == -1 && kD == 64);
  if (overlap) {
    run<kD, E, kMaxLogit, true>(p, mq, mk, mv, s);
  } else {
    run<kD, E, kMaxLogit, false>(p, mq, mk, mv, s);
  }
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
  if (p.max_logit != nullptr) launch_max_logit_reset(p.max_logit, p.num_heads_q, stream);
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
