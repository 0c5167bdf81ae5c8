#pragma once
#include "cuda_emu.h"
namespace cub {
struct DeviceScan {
  template <class In, class Out, class N>
  static cudaError_t ExclusiveSum(void* tmp, size_t& bytes, In in, Out out, N n, cudaStream_t = nullptr) {
    if (!tmp) { bytes = 16; return cudaSuccess; }
    long long acc = 0;
    for (long long i = 0; i < (long long)n; ++i) { auto v = in[i]; out[i] = acc; acc += v; }
    return cudaSuccess;
  }
};
}  // namespace cub
