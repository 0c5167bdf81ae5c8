// Helpers shared by the CUDA benchmarks (kernel_bench.cu, family_bench.cu): CUDA error check,
// contiguous device TensorView, deterministic random 16-bit inputs, and the timing loop
// (3 warmup calls, then the median of `iters` CUDA-event timings, L2 flushed before each).
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "core/tensor_view.h"

namespace fs_bench {

// Exits with `what` and the CUDA error string when e is not cudaSuccess.
inline void ck(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}

// A contiguous (row-major) CUDA tensor view of `shape` over p.
inline flashspan::TensorView dev_view(void* p, flashspan::DType t, std::vector<int64_t> shape) {
  flashspan::TensorView v;
  v.data = p;
  v.dtype = t;
  v.device = flashspan::DeviceType::kCUDA;
  v.ndim = int(shape.size());
  int64_t s = 1;
  for (int i = v.ndim - 1; i >= 0; --i) {
    v.shape[i] = shape[i];
    v.strides[i] = s;
    s *= shape[i];
  }
  return v;
}

// n hashed values in [-1, 1) as fp16 (fp16 != 0) or bf16 (truncated) bits; the same seed gives
// the same tensor.
__global__ void fill_random_16(uint16_t* p, size_t n, uint32_t seed, int fp16) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    uint32_t x = uint32_t(i) * 2654435761u ^ seed;
    x ^= x >> 13;
    x *= 0x5bd1e995u;
    x ^= x >> 15;
    const float f = (float(x & 0xffff) / 65535.0f - 0.5f) * 2.0f;
    p[i] = fp16 ? __half_as_ushort(__float2half(f)) : uint16_t(__float_as_uint(f) >> 16);
  }
}

// Median time of fn() in milliseconds over `iters` runs, each after writing `flush_bytes` of
// `flush` (evicts L2), after 3 untimed warmup calls.
template <class Fn>
double time_ms(Fn&& fn, int iters, void* flush, size_t flush_bytes) {
  cudaEvent_t a, b;
  ck(cudaEventCreate(&a), "event");
  ck(cudaEventCreate(&b), "event");
  for (int i = 0; i < 3; ++i) fn();
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
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

}  // namespace fs_bench
