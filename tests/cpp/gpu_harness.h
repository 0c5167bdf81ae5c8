// Device-side helpers of the GPU tests: owned device buffers, device twins of host tensors
// (NaN-poisoned when not copied), downloads, and host plans uploaded to the device.
// Tests that need a GPU start with REQUIRE_GPU(), which skips when none is visible.
#pragma once

#ifdef FLASHSPAN_WITH_CUDA
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/common/launch_bwd_common.h"  // set_bwd_preprocess_paired
#include "kernels/sm90/launch_sm90.h"  // sm90::device_supported
#include "plan/mask_plan.h"
#include "test_util.h"

namespace flashspan::test {

inline bool gpu_available() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

#define REQUIRE_GPU()                                                      \
  do {                                                                     \
    if (!gpu_available()) GTEST_SKIP() << "no CUDA device is visible";     \
  } while (0)

// Whether the current device can run the sm90 kernels: an sm_90 device with this build's sm_90a
// code (sm90::device_supported). REQUIRE_SM90: a test of the sm90 kernels skips without one.
inline bool sm90_device() {
  int dev = 0;
  return cudaGetDevice(&dev) == cudaSuccess && sm90::device_supported(dev);
}

#define REQUIRE_SM90()                                                                          \
  do {                                                                                          \
    REQUIRE_GPU();                                                                              \
    if (!sm90_device()) GTEST_SKIP() << "not an sm_90 device with this build's sm_90a code";    \
  } while (0)

// The backward preprocess's paired form (bwd_prepost.cuh bwd_preprocess_rows_paired; the default since PERF_LOG
// v2.65, launch_bwd_common.h bwd_preprocess_paired) forced on (or, with 0, off) for a scope, the environment's answer
// after it.
struct ForcePairedPreprocess {
  explicit ForcePairedPreprocess(int on = 1) { set_bwd_preprocess_paired(on); }
  ~ForcePairedPreprocess() { set_bwd_preprocess_paired(-1); }
  ForcePairedPreprocess(const ForcePairedPreprocess&) = delete;
  ForcePairedPreprocess& operator=(const ForcePairedPreprocess&) = delete;
};

inline void cuda_ok(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}

// Owned device allocation.
struct DevBuf {
  void* p = nullptr;
  size_t bytes = 0;
  explicit DevBuf(size_t n = 0) : bytes(n) {
    if (n) cuda_ok(cudaMalloc(&p, n), "cudaMalloc");
  }
  ~DevBuf() {
    if (p) cudaFree(p);
  }
  DevBuf(const DevBuf&) = delete;
  DevBuf& operator=(const DevBuf&) = delete;
};

// Elements spanned by a strided view (0 for an empty one).
inline int64_t extent(const TensorView& v) {
  if (v.numel() == 0) return 0;
  int64_t e = 1;
  for (int d = 0; d < v.ndim; ++d) e += (v.shape[d] - 1) * v.strides[d];
  return e;
}

// Device twin of a host tensor (same strides).
struct DevTensor {
  std::unique_ptr<DevBuf> buf;
  TensorView view;
  size_t bytes = 0;
};

inline DevTensor dev_like(const HostTensor& h, bool copy) {
  DevTensor d;
  d.bytes = size_t(extent(h.view())) * dtype_size(h.dtype());
  d.buf = std::make_unique<DevBuf>(d.bytes ? d.bytes : 16);
  d.view = h.view();
  d.view.data = d.buf->p;
  d.view.device = DeviceType::kCUDA;
  d.view.device_id = 0;
  if (copy && d.bytes) cuda_ok(cudaMemcpy(d.buf->p, h.view().data, d.bytes, cudaMemcpyHostToDevice), "upload");
  if (!copy) cuda_ok(cudaMemset(d.buf->p, 0xff, d.buf->bytes), "poison");  // NaN in fp16/bf16/fp32
  return d;
}

inline void poison(DevTensor& d, cudaStream_t s = nullptr) {
  cuda_ok(cudaMemsetAsync(d.buf->p, 0xff, d.buf->bytes, s), "poison");
}

inline void download(const DevTensor& d, HostTensor& h) {
  h.poison();
  if (d.bytes) cuda_ok(cudaMemcpy(h.view().data, d.buf->p, d.bytes, cudaMemcpyDeviceToHost), "download");
}

inline std::vector<uint8_t> raw_bytes(const DevTensor& d) {
  std::vector<uint8_t> out(d.bytes);
  if (d.bytes) cuda_ok(cudaMemcpy(out.data(), d.buf->p, d.bytes, cudaMemcpyDeviceToHost), "download");
  return out;
}

// Copies a host plan to the device (the CUDA planner's output has the same layout).
// `drop_tasks` hides the task schedules, which makes the kernels run in grid mode.
inline std::unique_ptr<MaskPlan> upload_plan(const MaskPlan& host, bool drop_tasks = false) {
  auto d = std::make_unique<MaskPlan>();
  d->geometry = host.geometry;
  d->geometry.device = DeviceType::kCUDA;
  d->geometry.device_id = 0;
  d->signature = host.signature;
  d->counts = host.counts;
  if (drop_tasks) d->counts.num_tasks = d->counts.num_bwd_tasks = 0;
  d->arrays = host.arrays;
  d->buffer_elements = host.buffer_elements;
  const size_t bytes = size_t(std::max<int64_t>(host.buffer_elements, 1)) * sizeof(int32_t);
  cuda_ok(cudaMalloc(&d->device_buffer, bytes), "cudaMalloc(plan)");
  if (host.buffer_elements > 0) {
    cuda_ok(cudaMemcpy(d->device_buffer, host.host_buffer.data(), size_t(host.buffer_elements) * sizeof(int32_t),
                       cudaMemcpyHostToDevice),
            "upload plan");
  }
  return d;
}

}  // namespace flashspan::test

#endif  // FLASHSPAN_WITH_CUDA
