// CPU emulation of the CUDA subset used by the mask planner: a test tool that runs the real
// planner source (src/plan/planner_cuda.cu, planner_kernels.cuh) on a machine without a GPU.
// Every CTA runs as blockDim.x fibers (ucontext) on the calling thread, resumed round-robin:
// __syncthreads yields to the scheduler, which resumes each fiber once per round, so a round
// ends with every live fiber at the barrier (as OS threads with a std::barrier would, at a
// fraction of the cost). CUB device algorithms are sequential stand-ins. It checks logic
// (offsets, scans, sorts, payload bits, error decoding), not GPU races or performance.
#pragma once
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <vector>
#include <algorithm>
#include <memory>
#include <ucontext.h>

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
inline void* emu_dyn_smem = nullptr;
inline void __syncthreads();  // defined after EmuFibers

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

// The fibers of the running CTA.
struct EmuFibers {
  static constexpr size_t kStack = 256 * 1024;
  ucontext_t sched{};
  std::vector<ucontext_t> ctx;
  std::vector<std::unique_ptr<char[]>> stacks;
  std::vector<char> done;
  std::function<void()> body;  // the kernel call of this CTA
  unsigned current = 0;

  static EmuFibers& get() {
    static EmuFibers f;
    return f;
  }
  static void entry() {
    EmuFibers& f = get();
    f.body();
    f.done[f.current] = 1;  // returns to uc_link = sched
  }
  void run_cta(unsigned threads) {
    if (stacks.size() < threads) {
      ctx.resize(threads);
      while (stacks.size() < threads) stacks.emplace_back(new char[kStack]);
    }
    done.assign(threads, 0);
    for (unsigned t = 0; t < threads; ++t) {
      getcontext(&ctx[t]);
      ctx[t].uc_stack.ss_sp = stacks[t].get();
      ctx[t].uc_stack.ss_size = kStack;
      ctx[t].uc_link = &sched;
      makecontext(&ctx[t], &EmuFibers::entry, 0);
    }
    for (bool live = true; live;) {
      live = false;
      for (unsigned t = 0; t < threads; ++t) {
        if (done[t]) continue;
        current = t;
        threadIdx = dim3(t);
        swapcontext(&sched, &ctx[t]);
        live = live || !done[t];
      }
    }
  }
};

inline void __syncthreads() {
  EmuFibers& f = EmuFibers::get();
  swapcontext(&f.ctx[f.current], &f.sched);
}

struct EmuLaunch {
  dim3 grid, block;
  size_t smem;
  EmuLaunch(dim3 g, dim3 b, size_t s = 0, cudaStream_t = nullptr) : grid(g), block(b), smem(s) {}
  template <class K, class... A>
  void run(K kernel, A... args) {
    std::vector<char> dyn(smem + 64);
    EmuFibers& f = EmuFibers::get();
    f.body = [&] { kernel(args...); };
    blockDim = block;
    gridDim = grid;
    for (unsigned by = 0; by < grid.y; ++by)
      for (unsigned bx = 0; bx < grid.x; ++bx) {
        std::memset(dyn.data(), 0xAB, dyn.size());  // shared memory is not zeroed
        emu_dyn_smem = dyn.data();
        blockIdx = dim3(bx, by);
        f.run_cta(block.x);
      }
  }
};
