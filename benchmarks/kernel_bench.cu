// Standalone timing of the sm80 flex kernels (no Python): BF16, D=128, B=1, H=16,
// S in {8192, 32768}, dense non-causal and causal (causal through the mask plan, row q
// sees [0, q+1)). Prints the median of CUDA-event timings after warmup (L2 flushed before
// every timed run) and TFLOP/s over visible pairs: 4*D per visible pair forward, 2.5x that
// backward. "bwd" is the default (atomic dQ) path, "bwdD" deterministic = true.
//
// Correctness: outputs are NaN-poisoned before the timed runs; afterwards sampled rows (out,
// LSE, dQ) and key columns (dK, dV) of the first and last head are checked against a
// double-precision reference on the host with the tests' criterion (tests/cpp/
// error_criteria.h). Any failed check is printed ("CHECK FAILED") and the exit status is 1.
//
// Usage: kernel_bench [iters] [S...]      (defaults: 10, 8192 32768)
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <random>
#include <vector>

#include <cmath>
#include <string>

#include "core/validation.h"
#include "core/geometry.h"
#include "core/half_conv.h"
#define FS_CRITERIA_NO_GTEST
#include "error_criteria.h"
#include "kernel_internals.h"
#include "bench_util.cuh"
#include "plan/planner.h"

using namespace flashspan;
using fs_bench::ck;
using fs_bench::dev_view;
using fs_bench::fill_random_16;
using fs_bench::time_ms;

namespace {

std::unique_ptr<MaskPlan> upload(const MaskPlan& h) {
  auto d = std::make_unique<MaskPlan>();
  d->geometry = h.geometry;
  d->geometry.device = DeviceType::kCUDA;
  d->signature = h.signature;
  d->counts = h.counts;
  d->arrays = h.arrays;
  d->buffer_elements = h.buffer_elements;
  ck(cudaMalloc(&d->device_buffer, size_t(h.buffer_elements) * 4), "cudaMalloc plan");
  ck(cudaMemcpy(d->device_buffer, h.host_buffer.data(), size_t(h.buffer_elements) * 4, cudaMemcpyHostToDevice),
     "plan upload");
  return d;
}

// ---------------------------------------------------------------------------
// Correctness spot-check (B = 1, BSHD [1, S, H, D] bf16, LSE [1, H, S] fp32)
// ---------------------------------------------------------------------------

// Head h of a [1, S, H, D] bf16 device tensor as double [S, D].
std::vector<double> head_rows(const uint16_t* d, int64_t S, int H, int D, int h) {
  std::vector<uint16_t> raw(size_t(S) * D);
  ck(cudaMemcpy2D(raw.data(), size_t(D) * 2, d + size_t(h) * D, size_t(H) * D * 2, size_t(D) * 2, size_t(S),
                  cudaMemcpyDeviceToHost),
     "download head");
  std::vector<double> out(raw.size());
  for (size_t i = 0; i < raw.size(); ++i) out[i] = bf16_bits_to_float(raw[i]);
  return out;
}

std::vector<double> head_lse(const float* lse, int64_t S, int h) {
  std::vector<float> raw(static_cast<size_t>(S));
  ck(cudaMemcpy(raw.data(), lse + size_t(h) * S, size_t(S) * 4, cudaMemcpyDeviceToHost), "download lse");
  return std::vector<double>(raw.begin(), raw.end());
}

double dot(const double* a, const double* b, int n) {
  double s = 0;
  for (int i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

// Sampled rows / keys: both ends, tile boundaries, and random ones.
std::vector<int64_t> sample_indices(int64_t S, uint64_t seed) {
  std::vector<int64_t> idx{0, 1, 63, 64, 127, 128, S / 2, S - 2, S - 1};
  std::mt19937_64 rng(seed);
  for (int i = 0; i < 12; ++i) idx.push_back(int64_t(rng() % uint64_t(S)));
  idx.erase(std::remove_if(idx.begin(), idx.end(), [&](int64_t x) { return x < 0 || x >= S; }), idx.end());
  return idx;
}

struct Check {
  bool ok = true;
  void report(const std::string& what, const std::string& err) {
    if (err.empty()) return;
    ok = false;
    std::printf("CHECK FAILED %s: %s\n", what.c_str(), err.c_str());
  }
};

// Forward: out rows and LSE of sampled rows of heads 0 and H-1.
void check_forward(Check& chk, const std::string& label, const uint16_t* q, const uint16_t* k, const uint16_t* v,
                   const uint16_t* o, const float* lse, int64_t S, int H, int D, bool causal, float scale) {
  std::vector<double> got_o, ref_o, got_l, ref_l;
  for (int h : {0, H - 1}) {
    const auto Q = head_rows(q, S, H, D, h), K = head_rows(k, S, H, D, h), V = head_rows(v, S, H, D, h);
    const auto O = head_rows(o, S, H, D, h), L = head_lse(lse, S, h);
    std::vector<double> s(static_cast<size_t>(S)), acc(static_cast<size_t>(D));
    for (int64_t i : sample_indices(S, 17 + h)) {
      const int64_t nk = causal ? i + 1 : S;
      double m = -INFINITY;
      for (int64_t j = 0; j < nk; ++j) m = std::max(m, s[j] = scale * dot(&Q[i * D], &K[j * D], D));
      double l = 0;
      std::fill(acc.begin(), acc.end(), 0.0);
      for (int64_t j = 0; j < nk; ++j) {
        const double p = std::exp(s[j] - m);
        l += p;
        for (int d = 0; d < D; ++d) acc[d] += p * V[j * D + d];
      }
      for (int d = 0; d < D; ++d) {
        ref_o.push_back(acc[d] / l);
        got_o.push_back(O[i * D + d]);
      }
      ref_l.push_back(m + std::log(l));
      got_l.push_back(L[i]);
    }
  }
  chk.report(label + " out", fs_test::tensor_error(got_o, ref_o, DType::kBFloat16));
  chk.report(label + " lse", fs_test::stat_error(got_l, ref_l));
}

// Backward (given the kernel's own out and LSE, as the kernels get them): dQ rows and dK / dV
// rows of sampled rows / keys of heads 0 and H-1.
void check_backward(Check& chk, const std::string& label, const uint16_t* q, const uint16_t* k, const uint16_t* v,
                    const uint16_t* o, const float* lse, const uint16_t* dout, const uint16_t* dq, const uint16_t* dk,
                    const uint16_t* dv, int64_t S, int H, int D, bool causal, float scale) {
  std::vector<double> got_q, ref_q, got_k, ref_k, got_v, ref_v;
  for (int h : {0, H - 1}) {
    const auto Q = head_rows(q, S, H, D, h), K = head_rows(k, S, H, D, h), V = head_rows(v, S, H, D, h);
    const auto O = head_rows(o, S, H, D, h), L = head_lse(lse, S, h), dO = head_rows(dout, S, H, D, h);
    const auto dQ = head_rows(dq, S, H, D, h), dK = head_rows(dk, S, H, D, h), dV = head_rows(dv, S, H, D, h);
    std::vector<double> Di(static_cast<size_t>(S));
    for (int64_t i = 0; i < S; ++i) Di[i] = dot(&dO[i * D], &O[i * D], D);
    std::vector<double> acc(static_cast<size_t>(D)), acc2(static_cast<size_t>(D));
    for (int64_t i : sample_indices(S, 29 + h)) {
      std::fill(acc.begin(), acc.end(), 0.0);
      for (int64_t j = 0; j < (causal ? i + 1 : S); ++j) {
        const double p = std::exp(scale * dot(&Q[i * D], &K[j * D], D) - L[i]);
        const double ds = p * (dot(&dO[i * D], &V[j * D], D) - Di[i]);
        for (int d = 0; d < D; ++d) acc[d] += ds * K[j * D + d];
      }
      for (int d = 0; d < D; ++d) {
        ref_q.push_back(scale * acc[d]);
        got_q.push_back(dQ[i * D + d]);
      }
    }
    for (int64_t j : sample_indices(S, 41 + h)) {
      std::fill(acc.begin(), acc.end(), 0.0);
      std::fill(acc2.begin(), acc2.end(), 0.0);
      for (int64_t i = causal ? j : 0; i < S; ++i) {
        const double p = std::exp(scale * dot(&Q[i * D], &K[j * D], D) - L[i]);
        const double ds = p * (dot(&dO[i * D], &V[j * D], D) - Di[i]);
        for (int d = 0; d < D; ++d) {
          acc[d] += ds * Q[i * D + d];
          acc2[d] += p * dO[i * D + d];
        }
      }
      for (int d = 0; d < D; ++d) {
        ref_k.push_back(scale * acc[d]);
        got_k.push_back(dK[j * D + d]);
        ref_v.push_back(acc2[d]);
        got_v.push_back(dV[j * D + d]);
      }
    }
  }
  chk.report(label + " dq", fs_test::tensor_error(got_q, ref_q, DType::kBFloat16));
  chk.report(label + " dk", fs_test::tensor_error(got_k, ref_k, DType::kBFloat16));
  chk.report(label + " dv", fs_test::tensor_error(got_v, ref_v, DType::kBFloat16));
}

}  // namespace

int main(int argc, char** argv) {
  const int iters = argc > 1 ? std::atoi(argv[1]) : 10;
  std::vector<int64_t> sizes;
  for (int i = 2; i < argc; ++i) sizes.push_back(std::atoll(argv[i]));
  if (sizes.empty()) sizes = {8192, 32768};
  const int B = 1, H = 16, D = 128;
  cudaDeviceProp prop;
  ck(cudaGetDeviceProperties(&prop, 0), "device");
  std::printf("device: %s (sm_%d%d, %d SMs)\n", prop.name, prop.major, prop.minor, prop.multiProcessorCount);
  std::printf("%-6s %-10s %-4s %10s %10s %10s %10s\n", "S", "mask", "dir", "ms", "TFLOP/s", "pairs(1e9)", "plan");
  const size_t flush_bytes = size_t(256) << 20;
  void* flush = nullptr;
  ck(cudaMalloc(&flush, flush_bytes), "flush buffer");
  Check chk;

  for (int64_t S : sizes) {
    const size_t n = size_t(B) * S * H * D;
    uint16_t *q, *k, *v, *o, *dout, *dq, *dk, *dv;
    float* lse;
    for (uint16_t** p : {&q, &k, &v, &o, &dout, &dq, &dk, &dv}) ck(cudaMalloc(p, n * 2), "cudaMalloc");
    ck(cudaMalloc(&lse, size_t(B) * H * S * 4), "cudaMalloc lse");
    uint32_t seed = 1;
    for (uint16_t* p : {q, k, v, dout}) fill_random_16<<<1024, 256>>>(p, n, seed++, 0);
    ck(cudaDeviceSynchronize(), "fill");

    for (int causal = 0; causal < 2; ++causal) {
      FlexGeometry g;
      g.varlen = false;
      g.batch = B;
      g.max_seqlen_q = g.max_seqlen_k = S;
      g.total_q = g.total_k = int64_t(B) * S;
      g.num_heads_q = g.num_heads_kv = H;
      g.num_heads_mask = 1;
      g.nfunc = 1;
      g.head_dim_qk = g.head_dim_v = D;
      g.dtype = DType::kBFloat16;
      g.device = DeviceType::kCPU;
      g.cu_seqlens_q = {0, int32_t(S)};
      g.cu_seqlens_k = {0, int32_t(S)};
      std::vector<int32_t> mask(size_t(B) * S);
      for (int64_t i = 0; i < S; ++i) mask[i] = causal ? int32_t(i + 1) : int32_t(S);
      PlanRequest req;
      req.geometry = &g;
      req.consumer = consumer_for(80, D, D);
      req.build_backward = true;
      auto hp = build_mask_plan_host(req, mask.data(), false);
      auto plan = upload(*hp);
      FlexGeometry gd = g;
      gd.device = DeviceType::kCUDA;
      const double pairs = double(H) * (causal ? double(S) * (S + 1) / 2 : double(S) * S);
      const float scale = default_softmax_scale(D);

      FlexFwdLaunch fa;
      fa.geometry = &gd;
      fa.plan = plan.get();
      fa.q = dev_view(q, DType::kBFloat16, {B, S, H, D});
      fa.k = dev_view(k, DType::kBFloat16, {B, S, H, D});
      fa.v = dev_view(v, DType::kBFloat16, {B, S, H, D});
      fa.out = dev_view(o, DType::kBFloat16, {B, S, H, D});
      fa.lse = dev_view(lse, DType::kFloat32, {B, H, S});
      fa.softmax_scale = scale;
      // The forward's split schedule needs its workspace (without one it runs unsplit).
      const size_t fws_bytes = flex_fwd_workspace_size(gd, *plan, false);
      void* fws = nullptr;
      ck(cudaMalloc(&fws, std::max<size_t>(fws_bytes, 16)), "forward workspace");
      fa.workspace = fws;
      fa.workspace_bytes = fws_bytes;
      ck(cudaMemset(o, 0xff, n * 2), "poison out");  // NaN: an unwritten element fails the check
      ck(cudaMemset(lse, 0xff, size_t(B) * H * S * 4), "poison lse");
      ck(cudaMemset(fws, 0xff, std::max<size_t>(fws_bytes, 16)), "poison workspace");
      const double fwd_ms = time_ms([&] { launch_flex_fwd(fa); }, iters, flush, flush_bytes);
      const double fwd_flops = 4.0 * D * pairs;
      std::printf("%-6lld %-10s %-4s %10.3f %10.1f %10.3f %10lld\n", (long long)S, causal ? "causal" : "dense", "fwd",
                  fwd_ms, fwd_flops / (fwd_ms * 1e-3) / 1e12, pairs / 1e9, (long long)hp->counts.fwd_partial);
      const std::string label = "S=" + std::to_string(S) + (causal ? " causal" : " dense");
      ck(cudaDeviceSynchronize(), "forward");
      check_forward(chk, label + " fwd", q, k, v, o, lse, S, H, D, causal == 1, scale);

      FlexBwdLaunch ba;
      ba.geometry = &gd;
      ba.plan = plan.get();
      ba.q = fa.q;
      ba.k = fa.k;
      ba.v = fa.v;
      ba.out = fa.out;
      ba.dout = dev_view(dout, DType::kBFloat16, {B, S, H, D});
      ba.lse = fa.lse;
      ba.dq = dev_view(dq, DType::kBFloat16, {B, S, H, D});
      ba.dk = dev_view(dk, DType::kBFloat16, {B, S, H, D});
      ba.dv = dev_view(dv, DType::kBFloat16, {B, S, H, D});
      ba.softmax_scale = scale;
      const size_t ws_bytes = flex_bwd_workspace_size(gd, *plan, false);  // the larger of the two
      void* ws = nullptr;
      ck(cudaMalloc(&ws, std::max<size_t>(ws_bytes, 16)), "workspace");
      ba.workspace = ws;
      ba.workspace_bytes = ws_bytes;
      for (int det = 0; det < 2; ++det) {
        ba.deterministic = det == 1;
        for (uint16_t* g : {dq, dk, dv}) ck(cudaMemset(g, 0xff, n * 2), "poison gradients");
        ck(cudaMemset(ws, 0xff, std::max<size_t>(ws_bytes, 16)), "poison workspace");
        const double bwd_ms = time_ms([&] { launch_flex_bwd(ba); }, iters, flush, flush_bytes);
        ck(cudaDeviceSynchronize(), "backward");
        check_backward(chk, label + (det ? " bwdD" : " bwd"), q, k, v, o, lse, dout, dq, dk, dv, S, H, D, causal == 1,
                       scale);
        std::printf("%-6lld %-10s %-4s %10.3f %10.1f %10.3f %10lld\n", (long long)S, causal ? "causal" : "dense",
                    det ? "bwdD" : "bwd", bwd_ms, 2.5 * fwd_flops / (bwd_ms * 1e-3) / 1e12, pairs / 1e9,
                    (long long)hp->counts.bwd_partial);
      }
      ck(cudaFree(ws), "free");
      ck(cudaFree(fws), "free");
      ck(cudaDeviceSynchronize(), "bench");
    }
    for (void* p : {(void*)q, (void*)k, (void*)v, (void*)o, (void*)dout, (void*)dq, (void*)dk, (void*)dv, (void*)lse})
      cudaFree(p);
  }
  cudaFree(flush);
  if (!chk.ok) {
    std::printf("kernel_bench: CORRECTNESS CHECK FAILED (see CHECK FAILED lines above)\n");
    return 1;
  }
  std::printf("correctness: sampled rows and key columns match the reference (tests/cpp/error_criteria.h)\n");
  return 0;
}
