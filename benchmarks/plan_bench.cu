// Mask planner benchmark: CUDA planner build time on the eight BENCHMARK.md masks.
//
//   flashspan_plan_bench [--S 131072] [--runs 10] [--heads 4] [--hmask 1|H] [--masks a,b,...]
//                        [--host] [--check]
//
// B = 1, Hq = Hkv = --heads, Hmask = --hmask (1, or --heads: every head gets the same
// endpoints, planned per head), (Dqk, Dv) = (128, 128) (sm80 consumer: fwd 128x64, bwd
// 64x128). Per mask: median wall time of build_mask_plan_cuda (synchronized; the planner
// synchronizes once for its header, twice with backward) over --runs runs after 2 warm-up
// runs, forward only and with backward; plan bytes of both (plan format 2: full blocks as
// runs), block counts and full runs. --host also times the host planner once; --check
// compares the CUDA plan with the host plan bitwise. A plan that cannot be built prints the
// error (e.g. the format limit, or out of memory) and the next mask runs.
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "core/error.h"
#include "dispatch/family.h"
#include "plan/planner.h"
#include "planner_masks.h"

namespace {

#define BENCH_CUDA(expr)                                                                      \
  do {                                                                                        \
    const cudaError_t e_ = (expr);                                                            \
    if (e_ != cudaSuccess) {                                                                  \
      std::fprintf(stderr, "%s failed: %s\n", #expr, cudaGetErrorString(e_));                 \
      std::exit(1);                                                                           \
    }                                                                                         \
  } while (0)

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

}  // namespace

int main(int argc, char** argv) {
  int64_t S = 131072;
  int runs = 10, heads = 4, hmask = 1;
  std::string only;
  bool host = false, check = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--S" && i + 1 < argc) S = std::atoll(argv[++i]);
    else if (a == "--runs" && i + 1 < argc) runs = std::atoi(argv[++i]);
    else if (a == "--heads" && i + 1 < argc) heads = std::atoi(argv[++i]);
    else if (a == "--hmask" && i + 1 < argc) hmask = std::atoi(argv[++i]);
    // append, not "," + std::string(...): GCC 12 warns (-Wrestrict) on the inlined insert at position 0.
    else if (a == "--masks" && i + 1 < argc) only = std::string(",").append(argv[++i]).append(",");
    else if (a == "--host") host = true;
    else if (a == "--check") check = true;
    else {
      std::fprintf(stderr,
                   "usage: %s [--S N] [--runs N] [--heads H] [--hmask 1|H] [--masks a,b] [--host] [--check]\n",
                   argv[0]);
      return 2;
    }
  }
  if (hmask != 1) hmask = heads;
  cudaDeviceProp prop{};
  BENCH_CUDA(cudaGetDeviceProperties(&prop, 0));
  std::printf("device: %s, S=%lld, B=1, Hq=Hkv=%d, Hmask=%d, runs=%d (median)\n", prop.name,
              static_cast<long long>(S), heads, hmask, runs);
  std::printf("%-16s %5s %11s %12s %10s %11s %12s %10s %10s %12s %14s %14s %14s", "mask", "nfunc", "fwd_part", "fwd_full",
              "fwd_runs", "bwd_part", "bwd_full", "bwd_runs", "k2q_runs", "fwd_ms", "fwdbwd_ms", "bytes_f",
              "bytes_fb");
  if (host) std::printf(" %12s", "host_fb_ms");
  if (check) std::printf(" %6s", "check");
  std::printf("\n");
  cudaStream_t stream = nullptr;
  BENCH_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const flashspan::Consumer consumer = flashspan::consumer_for(80, 128, 128);
  int failures = 0;
  for (const std::string& name : fs_test::benchmark_mask_names()) {
    if (!only.empty() && only.find("," + name + ",") == std::string::npos) continue;
    const fs_test::SampleMask m = fs_test::mask_by_name(name, S);
    flashspan::FlexGeometry g = fs_test::make_geometry(false, {S}, {S}, heads, heads, hmask, m.nfunc);
    g.device = flashspan::DeviceType::kCUDA;
    int32_t* d_mask = nullptr;
    const size_t head_bytes = m.ep.size() * sizeof(int32_t);
    BENCH_CUDA(cudaMalloc(&d_mask, head_bytes * hmask));
    BENCH_CUDA(cudaMemcpy(d_mask, m.ep.data(), head_bytes, cudaMemcpyHostToDevice));
    for (int h = 1; h < hmask; ++h)
      BENCH_CUDA(cudaMemcpy(reinterpret_cast<char*>(d_mask) + h * head_bytes, d_mask, head_bytes,
                            cudaMemcpyDeviceToDevice));
    double ms[2] = {0, 0};
    int64_t bytes_f = 0;
    std::unique_ptr<flashspan::MaskPlan> last;
    try {
      for (int bwd = 0; bwd < 2; ++bwd) {
        flashspan::PlanRequest req;
        req.geometry = &g;
        req.consumer = consumer;
        req.build_backward = bwd == 1;
        std::vector<double> t;
        for (int r = 0; r < runs + 2; ++r) {
          BENCH_CUDA(cudaStreamSynchronize(stream));
          const auto t0 = std::chrono::steady_clock::now();
          auto plan = flashspan::build_mask_plan_cuda(req, d_mask, stream);
          BENCH_CUDA(cudaStreamSynchronize(stream));
          const auto t1 = std::chrono::steady_clock::now();
          if (r >= 2) t.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
          if (bwd == 0 && r == runs + 1) bytes_f = plan->bytes();
          if (bwd == 1 && r == runs + 1) last = std::move(plan);
        }
        ms[bwd] = median(t);
      }
    } catch (const flashspan::Error& e) {
      std::printf("%-16s ERROR: %s\n", name.c_str(), e.what());
      ++failures;
      BENCH_CUDA(cudaFree(d_mask));
      continue;
    }
    const auto& c = last->counts;
    std::printf("%-16s %5d %11lld %12lld %10lld %11lld %12lld %10lld %10lld %12.3f %14.3f %14lld %14lld", name.c_str(),
                m.nfunc, static_cast<long long>(c.fwd_partial), static_cast<long long>(c.fwd_full),
                static_cast<long long>(c.fwd_full_runs), static_cast<long long>(c.bwd_partial),
                static_cast<long long>(c.bwd_full), static_cast<long long>(c.bwd_full_runs),
                static_cast<long long>(c.bwd_k2q_full_runs), ms[0], ms[1], static_cast<long long>(bytes_f),
                static_cast<long long>(last->bytes()));
    if (host || check) {
      flashspan::FlexGeometry gh = g;
      gh.device = flashspan::DeviceType::kCPU;
      flashspan::PlanRequest req;
      req.geometry = &gh;
      req.consumer = consumer;
      req.build_backward = true;
      const auto t0 = std::chrono::steady_clock::now();
      std::vector<int32_t> host_mask;
      for (int h = 0; h < hmask; ++h) host_mask.insert(host_mask.end(), m.ep.begin(), m.ep.end());
      auto hp = flashspan::build_mask_plan_host(req, host_mask.data(), false);
      const double hms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      if (host) std::printf(" %12.1f", hms);
      if (check) {
        auto dl = flashspan::copy_plan_to_host(*last);
        const bool same = dl->buffer_elements == hp->buffer_elements && dl->host_buffer == hp->host_buffer &&
                          dl->counts.visible_pairs == hp->counts.visible_pairs;
        std::printf(" %6s", same ? "ok" : "DIFF");
        failures += !same;
      }
    }
    std::printf("\n");
    BENCH_CUDA(cudaFree(d_mask));
  }
  BENCH_CUDA(cudaStreamDestroy(stream));
  return failures ? 1 : 0;
}
