// Forward (or, with `bwd`, backward) of the two kernel families side by side in one process:
// the portable sm80 family (mma.sync, plans of consumer_for(80)) and the sm90 family (TMA +
// wgmma, consumer_for(90); its backward through sm90::set_bwd_enabled(1)), on the eight
// BENCHMARK.md masks. BF16 (or FP16), B = 1, Hq = Hkv = H, Hmask = 1, head dims D (Dqk = Dv)
// or DqkxDv (e.g. 192x128). Plans from the CUDA planner; each call gets its workspace (split
// schedule). Prints the median of CUDA-event timings after warmup (L2 flushed before every
// timed run), TFLOP/s over visible pairs (2 (Dqk + Dv) flops a pair forward, 2.5x that
// backward), the ratio sm90 / sm80 and the
// largest |difference| between the two families' outputs (backward: dq, dk, dv). The sm90
// outputs are checked against the sm80 ones (themselves checked against the CPU reference by
// the GPU tests) with the tests' criterion (tests/cpp/error_criteria.h): any mask that fails
// it makes the benchmark exit 1. The backward is the non-deterministic one, or with
// FAMILY_BENCH_DETERMINISTIC=1 the deterministic one (both families). FAMILY_BENCH_SM90_ONLY=1
// runs the sm90 family alone (for a profiler; nothing is compared).
//
// Usage: flashspan_family_bench [iters] [S] [D|DqkxDv] [H] [bf16|fp16] [fwd|bwd]
//        (defaults: 10 32768 128 4 bf16 fwd); FAMILY_BENCH_MASKS=causal,hstu runs only those masks.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "core/validation.h"
#include "core/geometry.h"
#include "dispatch/family.h"
#include "dispatch/flex_launch.h"
#include "kernels/sm90/launch_sm90.h"
#include "plan/planner.h"
#define FS_CRITERIA_NO_GTEST
#include "error_criteria.h"
#include "bench_util.cuh"
#include "core/half_conv.h"
#include "planner_masks.h"

using namespace flashspan;
using fs_bench::ck;
using fs_bench::dev_view;
using fs_bench::fill_random_16;
using fs_bench::time_ms;

int main(int argc, char** argv) {
  const int iters = argc > 1 ? std::atoi(argv[1]) : 10;
  const int64_t S = argc > 2 ? std::atoll(argv[2]) : 32768;
  const std::string dims = argc > 3 ? std::string(argv[3]) : "128";
  const size_t x = dims.find('x');
  const int D = std::atoi(dims.c_str());  // Dqk
  const int Dv = x == std::string::npos ? D : std::atoi(dims.c_str() + x + 1);
  if (D <= 0 || Dv <= 0) {
    std::fprintf(stderr, "head dims: D or DqkxDv expected, got '%s'\n", dims.c_str());
    return 2;
  }
  const int H = argc > 4 ? std::atoi(argv[4]) : 4;
  const bool fp16 = argc > 5 && std::string(argv[5]) == "fp16";
  const bool bwd = argc > 6 && std::string(argv[6]) == "bwd";
  if (bwd) sm90::set_bwd_enabled(1);
  const DType dt = fp16 ? DType::kFloat16 : DType::kBFloat16;
  cudaDeviceProp prop;
  ck(cudaGetDeviceProperties(&prop, 0), "device");
  std::printf("device: %s (sm_%d%d, %d SMs); S=%lld Dqk=%d Dv=%d H=%d %s %s, sm90 family available: %s\n", prop.name,
              prop.major, prop.minor, prop.multiProcessorCount, (long long)S, D, Dv, H, dtype_name(dt),
              bwd ? "backward" : "forward", sm90::device_supported(0) ? "yes" : "no");
  std::printf("%-16s %10s %10s %10s %10s %8s %10s\n", "mask", "sm80 ms", "sm80 TF/s", "sm90 ms", "sm90 TF/s", "ratio",
              "max|diff|");
  const size_t flush_bytes = size_t(256) << 20;
  void* flush = nullptr;
  ck(cudaMalloc(&flush, flush_bytes), "flush buffer");
  const size_t n = size_t(S) * H * D;    // q, k, dq, dk
  const size_t nv = size_t(S) * H * Dv;  // v, out, dout, dv
  uint16_t *q, *k, *v, *o80, *o90, *dout;
  for (uint16_t** p : {&q, &k}) ck(cudaMalloc(p, n * 2), "cudaMalloc");
  for (uint16_t** p : {&v, &o80, &o90, &dout}) ck(cudaMalloc(p, nv * 2), "cudaMalloc");
  // Backward outputs of each family: dq, dk, dv.
  uint16_t* grads[2][3] = {};
  if (bwd) {
    for (auto& fam : grads) {
      for (int i = 0; i < 3; ++i) ck(cudaMalloc(&fam[i], (i == 2 ? nv : n) * 2), "cudaMalloc grads");
    }
  }
  float* lse;
  ck(cudaMalloc(&lse, size_t(H) * S * 4), "cudaMalloc lse");
  uint32_t seed = 1;
  for (uint16_t* p : {q, k, v, dout}) fill_random_16<<<1024, 256>>>(p, p == q || p == k ? n : nv, seed++, fp16 ? 1 : 0);
  ck(cudaDeviceSynchronize(), "fill");
  std::vector<uint16_t> h80(std::max(n, nv)), h90(std::max(n, nv));

  bool mismatch = false;
  // FAMILY_BENCH_MASKS=causal,hstu restricts the masks (e.g. for a profiler run).
  const char* only = std::getenv("FAMILY_BENCH_MASKS");
  const char* det_env = std::getenv("FAMILY_BENCH_DETERMINISTIC");
  const bool det = det_env != nullptr && det_env[0] == '1';
  // FAMILY_BENCH_SM90_ONLY=1: the sm90 family alone (profiler runs; no comparison, no check).
  const char* only90_env = std::getenv("FAMILY_BENCH_SM90_ONLY");
  const bool sm90_only = only90_env != nullptr && only90_env[0] == '1';
  if (bwd && det) std::printf("deterministic backward\n");
  for (const std::string& name : fs_test::benchmark_mask_names()) {
    if (only != nullptr && ("," + std::string(only) + ",").find("," + name + ",") == std::string::npos) continue;
    const fs_test::SampleMask m = fs_test::mask_by_name(name, S);
    FlexGeometry g;
    g.varlen = false;
    g.batch = 1;
    g.max_seqlen_q = g.max_seqlen_k = S;
    g.total_q = g.total_k = S;
    g.num_heads_q = g.num_heads_kv = H;
    g.num_heads_mask = 1;
    g.nfunc = m.nfunc;
    g.head_dim_qk = D;
    g.head_dim_v = Dv;
    g.dtype = dt;
    g.device = DeviceType::kCUDA;
    g.device_id = 0;
    g.cu_seqlens_q = {0, int32_t(S)};
    g.cu_seqlens_k = {0, int32_t(S)};
    int32_t* dmask = nullptr;
    ck(cudaMalloc(&dmask, m.ep.size() * 4), "cudaMalloc mask");
    ck(cudaMemcpy(dmask, m.ep.data(), m.ep.size() * 4, cudaMemcpyHostToDevice), "mask upload");
    double ms[2] = {0, 0}, tf[2] = {0, 0};
    for (int fam = 0; fam < 2; ++fam) {
      const int arch = fam == 0 ? 80 : 90;
      if (arch == 90 && !sm90::device_supported(0)) continue;
      if (arch == 80 && sm90_only) continue;
      PlanRequest req;
      req.geometry = &g;
      req.consumer = consumer_for(arch, D, Dv);
      req.build_backward = bwd;
      auto plan = build_mask_plan_cuda(req, dmask, nullptr);
      ck(cudaDeviceSynchronize(), "plan");
      const double pairs = double(H) * double(plan->counts.visible_pairs);
      FlexFwdLaunch fa;
      fa.geometry = &g;
      fa.plan = plan.get();
      fa.q = dev_view(q, dt, {1, S, H, D});
      fa.k = dev_view(k, dt, {1, S, H, D});
      fa.v = dev_view(v, dt, {1, S, H, Dv});
      fa.out = dev_view(fam == 0 ? o80 : o90, dt, {1, S, H, Dv});
      fa.lse = dev_view(lse, DType::kFloat32, {1, H, S});
      fa.softmax_scale = default_softmax_scale(D);
      const size_t ws_bytes = flex_fwd_workspace_size(g, *plan, false);
      void* ws = nullptr;
      ck(cudaMalloc(&ws, std::max<size_t>(ws_bytes, 16)), "workspace");
      fa.workspace = ws;
      fa.workspace_bytes = ws_bytes;
      if (!bwd) {
        ms[fam] = time_ms([&] { launch_flex_fwd(fa); }, iters, flush, flush_bytes);
        tf[fam] = 2.0 * (D + Dv) * pairs / (ms[fam] * 1e-3) / 1e12;
      } else {
        launch_flex_fwd(fa);  // O and LSE of this family for its backward
        FlexBwdLaunch ba;
        ba.geometry = &g;
        ba.plan = plan.get();
        ba.q = fa.q;
        ba.k = fa.k;
        ba.v = fa.v;
        ba.out = fa.out;
        ba.dout = dev_view(dout, dt, {1, S, H, Dv});
        ba.lse = fa.lse;
        ba.dq = dev_view(grads[fam][0], dt, {1, S, H, D});
        ba.dk = dev_view(grads[fam][1], dt, {1, S, H, D});
        ba.dv = dev_view(grads[fam][2], dt, {1, S, H, Dv});
        ba.softmax_scale = fa.softmax_scale;
        ba.deterministic = det;
        const size_t bws_bytes = flex_bwd_workspace_size(g, *plan, det);
        void* bws = nullptr;
        ck(cudaMalloc(&bws, std::max<size_t>(bws_bytes, 16)), "backward workspace");
        ba.workspace = bws;
        ba.workspace_bytes = bws_bytes;
        const int64_t before = sm90::bwd_launches();
        ms[fam] = time_ms([&] { launch_flex_bwd(ba); }, iters, flush, flush_bytes);
        tf[fam] = 2.5 * 2.0 * (D + Dv) * pairs / (ms[fam] * 1e-3) / 1e12;
        if (arch == 90 && sm90::bwd_launches() == before) {
          std::printf("note: %s: the sm90 plan's backward ran on the sm80 kernels (not covered by the sm90 backward)\n",
                      name.c_str());
        }
        ck(cudaDeviceSynchronize(), "bench");
        ck(cudaFree(bws), "free");
      }
      ck(cudaDeviceSynchronize(), "bench");
      ck(cudaFree(ws), "free");
    }
    double maxdiff = -1;
    if (ms[1] > 0 && ms[0] > 0) {
      maxdiff = 0;
      const int outputs = bwd ? 3 : 1;
      static const char* const kNames[3] = {"dq", "dk", "dv"};
      for (int o = 0; o < outputs; ++o) {
        const size_t no = bwd && o < 2 ? n : nv;  // dq, dk: Dqk; out, dv: Dv
        ck(cudaMemcpy(h80.data(), bwd ? grads[0][o] : o80, no * 2, cudaMemcpyDeviceToHost), "download");
        ck(cudaMemcpy(h90.data(), bwd ? grads[1][o] : o90, no * 2, cudaMemcpyDeviceToHost), "download");
        std::vector<double> d80(no), d90(no);
        for (size_t i = 0; i < no; ++i) {
          d80[i] = double(fp16 ? half_bits_to_float(h80[i]) : bf16_bits_to_float(h80[i]));
          d90[i] = double(fp16 ? half_bits_to_float(h90[i]) : bf16_bits_to_float(h90[i]));
          const double d = std::fabs(d80[i] - d90[i]);
          if (!(d <= maxdiff)) maxdiff = std::isnan(d) ? INFINITY : d;
        }
        const std::string err = fs_test::tensor_error(d90, d80, dt);
        if (!err.empty()) {
          std::fprintf(stderr, "%s: sm90 %s differs from sm80 beyond the test criterion: %s\n", name.c_str(),
                       bwd ? kNames[o] : "out", err.c_str());
          mismatch = true;
        }
      }
    }
    std::printf("%-16s %10.3f %10.1f %10.3f %10.1f %8.2f %10.4f\n", name.c_str(), ms[0], tf[0], ms[1], tf[1],
                ms[1] > 0 && ms[0] > 0 ? tf[1] / tf[0] : 0.0, maxdiff);
    std::fflush(stdout);
    cudaFree(dmask);
  }
  for (void* p : {(void*)q, (void*)k, (void*)v, (void*)o80, (void*)o90, (void*)dout, (void*)lse}) cudaFree(p);
  for (auto& fam : grads) {
    for (uint16_t* g : fam) cudaFree(g);
  }
  cudaFree(flush);
  if (mismatch) {
    std::fprintf(stderr, "FAILED: the two families disagree on at least one mask\n");
    return 1;
  }
  std::printf("correctness: sm90 matches sm80 on every mask (%s; tests/cpp/error_criteria.h)\n",
              bwd ? "dq, dk, dv" : "out");
  return 0;
}
