// CPU emulation of the CUDA subset used by the mask planner: a test tool that runs the real
// planner source (src/plan/planner_cuda.cu, planner_kernels.cuh) on a machine without a GPU.
// Every CTA runs as blockDim.x std::threads with a std::barrier for __syncthreads; CUB device
// algorithms are sequential stand-ins. It checks logic (offsets, scans, sorts, payload bits,
// error decoding), not GPU races or performance.
#pragma once
#include <atomic>
#include <barrier>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <thread>
#include <vector>
#include <algorithm>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(x)
#define __shared__ static

struct dim3 {
  unsigned x = 1, y = 1, z = 1;
  dim3(unsigned a = 1, unsigned b = 1, unsigned c = 1) : x(a), y(b), z(c) {}
};
inline thread_local dim3 threadIdx, blockIdx, blockDim, gridDim;
inline std::barrier<>* emu_barrier = nullptr;
inline void* emu_dyn_smem = nullptr;
inline void __syncthreads() { emu_barrier->arrive_and_wait(); }

template <class T> T atomicAdd(T* p, T v) { return std::atomic_ref<T>(*p).fetch_add(v); }
inline unsigned long long atomicMin(unsigned long long* p, unsigned long long v) {
  std::atomic_ref<unsigned long long> r(*p);
  unsigned long long cur = r.load();
  while (v < cur && !r.compare_exchange_weak(cur, v)) {}
  return cur;
}
inline long long min(long long a, long long b) { return a < b ? a : b; }
inline long long max(long long a, long long b) { return a > b ? a : b; }

typedef int cudaError_t;
typedef void* cudaStream_t;
enum { cudaSuccess = 0, cudaErrorMemoryAllocation = 2 };
enum cudaMemcpyKind { cudaMemcpyHostToDevice, cudaMemcpyDeviceToHost, cudaMemcpyDeviceToDevice };
enum { cudaStreamNonBlocking = 1 };
inline const char* cudaGetErrorString(cudaError_t) { return "emu error"; }
inline cudaError_t cudaGetLastError() { return cudaSuccess; }
inline cudaError_t cudaMalloc(void** p, size_t n) { *p = std::malloc(n ? n : 1); std::memset(*p, 0xCD, n); return cudaSuccess; }
template <class T> cudaError_t cudaMalloc(T** p, size_t n) { return cudaMalloc(reinterpret_cast<void**>(p), n); }
inline cudaError_t cudaMallocAsync(void** p, size_t n, cudaStream_t) { return cudaMalloc(p, n); }
inline cudaError_t cudaFree(void* p) { std::free(p); return cudaSuccess; }
inline cudaError_t cudaFreeAsync(void* p, cudaStream_t) { std::free(p); return cudaSuccess; }
inline cudaError_t cudaMemcpy(void* d, const void* s, size_t n, cudaMemcpyKind) { std::memcpy(d, s, n); return cudaSuccess; }
inline cudaError_t cudaMemcpyAsync(void* d, const void* s, size_t n, cudaMemcpyKind, cudaStream_t) { std::memcpy(d, s, n); return cudaSuccess; }
inline cudaError_t cudaMemsetAsync(void* d, int v, size_t n, cudaStream_t) { std::memset(d, v, n); return cudaSuccess; }
inline cudaError_t cudaStreamSynchronize(cudaStream_t) { return cudaSuccess; }
inline cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned) { *s = reinterpret_cast<void*>(0x1234); return cudaSuccess; }
inline cudaError_t cudaStreamDestroy(cudaStream_t) { return cudaSuccess; }
inline cudaError_t cudaGetDeviceCount(int* n) { *n = 1; return cudaSuccess; }

struct EmuLaunch {
  dim3 grid, block;
  size_t smem;
  EmuLaunch(dim3 g, dim3 b, size_t s = 0, cudaStream_t = nullptr) : grid(g), block(b), smem(s) {}
  template <class K, class... A>
  void run(K kernel, A... args) {
    std::vector<char> dyn(smem + 64);
    for (unsigned by = 0; by < grid.y; ++by)
      for (unsigned bx = 0; bx < grid.x; ++bx) {
        std::memset(dyn.data(), 0xAB, dyn.size());  // shared memory is not zeroed
        emu_dyn_smem = dyn.data();
        std::barrier<> bar(block.x);
        emu_barrier = &bar;
        std::vector<std::thread> th;
        for (unsigned t = 0; t < block.x; ++t)
          th.emplace_back([&, t] {
            threadIdx = dim3(t);
            blockIdx = dim3(bx, by);
            blockDim = block;
            gridDim = grid;
            kernel(args...);
            bar.arrive_and_drop();
          });
        for (auto& x : th) x.join();
      }
  }
};
