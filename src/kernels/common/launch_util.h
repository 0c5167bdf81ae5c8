// Host-side launch helpers shared by every kernel family: launch error checks, the
// dynamic shared memory opt-in, and the size of a persistent grid.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <utility>

#include "core/error.h"
#include "kernels/params.h"

namespace flashspan {

// Throws Error(kCudaError) naming `what` when the last launch failed.
inline void check_launch(const char* what) {
  const cudaError_t e = cudaGetLastError();
  FS_CHECK(e == cudaSuccess, Status::kCudaError, what, ": kernel launch failed: ", cudaGetErrorString(e));
}

inline void check_cuda(cudaError_t e, const char* what) {
  FS_CHECK(e == cudaSuccess, Status::kCudaError, what, ": ", cudaGetErrorString(e));
}

// An analytic grid's L2 groups as a launcher binds them (the sm90 SDPA forward and backward: AnalyticMaskParams::
// l2_group / item_counter, tile_scheduler.cuh AnalyticGrid / AnalyticBwdGrid): `group` pairs a group, none where it
// would hold every one of the call's `pairs` (the ungrouped order); the workspace's counter (dispatch bound it, or
// null) kept only for a grouped call that claims, and then zeroed on `stream` (`what` names the launcher).
inline void bind_l2_group(AnalyticMaskParams& a, int group, int64_t pairs, bool claim, cudaStream_t stream,
                          const char* what) {
  a.l2_group = int64_t(group) < pairs ? group : 0;
  if (a.l2_group == 0 || !claim) a.item_counter = nullptr;
  if (a.item_counter != nullptr) check_cuda(cudaMemsetAsync(a.item_counter, 0, sizeof(int32_t), stream), what);
}

// Raises a kernel's dynamic shared memory limit to `bytes` once per device (the attribute
// belongs to the kernel as loaded in the current device's context). `done` is the kernel's
// own bitmask of configured devices. Not a stream operation, so capture-safe.
template <class Kernel>
void ensure_smem_limit(Kernel kernel, int bytes, std::atomic<uint64_t>& done, const char* what) {
  int dev = 0;
  check_cuda(cudaGetDevice(&dev), what);
  const uint64_t bit = dev < 64 ? (uint64_t(1) << dev) : 0;
  if (bit != 0 && (done.load(std::memory_order_acquire) & bit) != 0) return;
  check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes), what);
  done.fetch_or(bit, std::memory_order_acq_rel);
}

// A positive per-device value of the current device: `query(dev)` once, then from `cache` (0 = not yet known; devices
// from 64 on are queried every time). Host queries only, so safe during stream capture.
template <class Query>
int cached_per_device(std::atomic<int> (&cache)[64], const char* what, Query&& query) {
  int dev = 0;
  check_cuda(cudaGetDevice(&dev), what);
  if (dev < 64) {
    const int c = cache[dev].load(std::memory_order_relaxed);
    if (c > 0) return c;
  }
  const int v = query(dev);
  if (dev < 64) cache[dev].store(v, std::memory_order_relaxed);
  return v;
}

// Multiprocessors of the current device, cached per device (host query only, capture-safe).
inline int device_multiprocessors(const char* what) {
  static std::atomic<int> cache[64];
  return cached_per_device(cache, what, [&](int dev) {
    int sms = 0;
    check_cuda(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev), what);
    return std::max(1, sms);
  });
}

// CTAs of a persistent grid (split schedule) on the current device: SMs x resident CTAs
// per SM, capped by SplitSchedule::kMaxCtas (the item-list bound). Cached per device in
// `cache` (0 = not yet known); host queries only, so safe during stream capture.
template <class Kernel>
int persistent_ctas(Kernel kernel, int threads, int smem, std::atomic<int> (&cache)[64], const char* what) {
  return cached_per_device(cache, what, [&](int) {
    int per_sm = 0;
    check_cuda(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, size_t(smem)), what);
    return std::min(device_multiprocessors(what) * std::max(1, per_sm), SplitSchedule::kMaxCtas);
  });
}

// Launches `kernel` as a programmatic dependent of the stream's previous kernel (its launch and
// prologue overlap that kernel's tail; the kernel must call ptx.cuh grid_dependency_wait before it
// reads what the previous kernel writes) on devices of compute capability 9.0 and newer; an ordinary
// launch on older ones. Capture-safe (a cached attribute query, then one launch).
template <class... KArgs, class... Args>
void launch_dependent(void (*kernel)(KArgs...), unsigned grid, unsigned block, size_t smem, cudaStream_t stream,
                      const char* what, Args&&... args) {
  static std::atomic<int> major_cache[64];
  const int major = cached_per_device(major_cache, what, [&](int dev) {
    int m = 0;
    check_cuda(cudaDeviceGetAttribute(&m, cudaDevAttrComputeCapabilityMajor, dev), what);
    return m;
  });
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(grid);
  cfg.blockDim = dim3(block);
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = major >= 9 ? 1 : 0;
  check_cuda(cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...), what);
}

}  // namespace flashspan
