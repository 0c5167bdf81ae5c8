// Standalone timing of the sm80 flex kernels (no Python): BF16, D=128, B=1, H=16,
// S in {8192, 32768}, dense non-causal and causal (causal through the mask plan, row q
// sees [0, q+1)). Prints the median of CUDA-event timings after warmup (L2 flushed before
// every timed run) and TFLOP/s over visible pairs: 4*D per visible pair forward, 2.5x that
// backward. "bwd" is the default (atomic dQ) path, "bwdD" deterministic = true.
//
// Usage: kernel_bench [iters] [S...]      (defaults: 10, 8192 32768)
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <random>
#include <vector>

#include "core/validation.h"
#include "dispatch/family.h"
#include "core/geometry.h"
#include "dispatch/flex_launch.h"
#include "plan/planner.h"

using namespace flashspan;

namespace {

void ck(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}

TensorView dev_view(void* p, DType t, std::vector<int64_t> shape) {
  TensorView v;
  v.data = p;
  v.dtype = t;
  v.device = DeviceType::kCUDA;
  v.ndim = int(shape.size());
  int64_t s = 1;
  for (int i = v.ndim - 1; i >= 0; --i) {
    v.shape[i] = shape[i];
    v.strides[i] = s;
    s *= shape[i];
  }
  return v;
}

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

__global__ void fill_random_bf16(uint16_t* p, size_t n, uint32_t seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    uint32_t x = uint32_t(i) * 2654435761u ^ seed;
    x ^= x >> 13;
    x *= 0x5bd1e995u;
    x ^= x >> 15;
    const float f = (float(x & 0xffff) / 65535.0f - 0.5f) * 2.0f;
    p[i] = uint16_t(__float_as_uint(f) >> 16);
  }
}

double median(std::vector<float> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

template <class Fn>
double time_ms(Fn&& fn, int iters, void* flush, size_t flush_bytes) {
  cudaEvent_t a, b;
  ck(cudaEventCreate(&a), "event");
  ck(cudaEventCreate(&b), "event");
  for (int i = 0; i < 3; ++i) fn();  // warmup
  std::vector<float> ms;
  for (int i = 0; i < iters; ++i) {
    ck(cudaMemsetAsync(flush, i & 0xff, flush_bytes), "L2 flush");
    ck(cudaEventRecord(a), "record");
    fn();
    ck(cudaEventRecord(b), "record");
    ck(cudaEventSynchronize(b), "sync");
    float t = 0;
    ck(cudaEventElapsedTime(&t, a, b), "elapsed");
    ms.push_back(t);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return median(ms);
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

  for (int64_t S : sizes) {
    const size_t n = size_t(B) * S * H * D;
    uint16_t *q, *k, *v, *o, *dout, *dq, *dk, *dv;
    float* lse;
    for (uint16_t** p : {&q, &k, &v, &o, &dout, &dq, &dk, &dv}) ck(cudaMalloc(p, n * 2), "cudaMalloc");
    ck(cudaMalloc(&lse, size_t(B) * H * S * 4), "cudaMalloc lse");
    uint32_t seed = 1;
    for (uint16_t* p : {q, k, v, dout}) fill_random_bf16<<<1024, 256>>>(p, n, seed++);
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
      const double fwd_ms = time_ms([&] { launch_flex_fwd(fa); }, iters, flush, flush_bytes);
      const double fwd_flops = 4.0 * D * pairs;
      std::printf("%-6lld %-10s %-4s %10.3f %10.1f %10.3f %10lld\n", (long long)S, causal ? "causal" : "dense", "fwd",
                  fwd_ms, fwd_flops / (fwd_ms * 1e-3) / 1e12, pairs / 1e9, (long long)hp->counts.fwd_partial);

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
        const double bwd_ms = time_ms([&] { launch_flex_bwd(ba); }, iters, flush, flush_bytes);
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
  return 0;
}
