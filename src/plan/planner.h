// Mask planners. Both produce bitwise identical plans (same arrays, same order, same
// payload bits) for the same endpoints and consumer; see mask_plan.h for the format.
#pragma once

#include <memory>
#include <vector>

#include "core/tensor_view.h"
#include "plan/mask_plan.h"

namespace flashspan {

struct PlanRequest {
  const FlexGeometry* geometry = nullptr;  // validated geometry (validate_plan_inputs)
  Consumer consumer;
  bool build_backward = false;
  bool pack_gqa = false;  // packed-GQA forward view (mask_plan.h); ignored when Hq == Hkv
};

// Host planner (CPU plans, and the oracle for the CUDA planner). `mask` is host memory,
// contiguous [Hmask, nfunc, total_q]; endpoints are validated here (same messages as the
// CUDA planner). The plan keeps a copy of the endpoints for the CPU backend when
// keep_mask is true.
std::unique_ptr<MaskPlan> build_mask_plan_host(const PlanRequest& req, const int32_t* mask, bool keep_mask);

// CUDA planner: classify -> count and scan -> read a small header back (exact 64-bit sizes,
// device-side validation errors and format-limit errors raised as flashspan::Error) ->
// materialise. `mask` is device memory, contiguous [Hmask, nfunc, total_q]. Runs on
// `stream` (cudaStream_t). Defined only when built with CUDA (FLASHSPAN_WITH_CUDA).
// The plan's arrays are written in stream order on `stream` (the call synchronizes once for
// the header, and a second time with backward, for the K2Q full-run count); scratch is
// allocated and freed inside the call. Runs on the current device. Allocation failures are
// Error(kOutOfMemory) naming the allocation and its bytes; the CUDA context stays usable.
std::unique_ptr<MaskPlan> build_mask_plan_cuda(const PlanRequest& req, const int32_t* mask, void* stream);

#ifdef FLASHSPAN_WITH_CUDA
// THD plans of CUDA tensors: validate_plan_inputs reads the B+1 cumulative lengths on the host
// (the geometry is host metadata of a plan), so they are copied here: dtype int32, rank 1,
// contiguous and on a CUDA device are checked first (Error(kTypeMismatch/kInvalidArgument)
// naming cu_seqlens_q / cu_seqlens_k), then one copy each on `stream` (cudaStream_t) and one
// synchronize. Fills `q_host` / `k_host` with the values. Defined only when built with CUDA.
void copy_cu_seqlens_to_host(const TensorView& cu_seqlens_q, const TensorView& cu_seqlens_k, void* stream,
                             std::vector<int32_t>* q_host, std::vector<int32_t>* k_host);

// Uploads a host plan into a new CUDA plan (same arrays, counts, signature; one cudaMalloc,
// synchronous copy), e.g. to feed kernels a host-planned mask in tests. Throws
// Error(kInvalidArgument) for a plan already on the device, Error(kCudaError/kOutOfMemory).
// Defined only when built with CUDA.
std::unique_ptr<MaskPlan> copy_plan_to_device(const MaskPlan& host_plan);

// Downloads a CUDA plan into a new host plan (synchronous), e.g. to compare planners
// bitwise. Defined only when built with CUDA.
std::unique_ptr<MaskPlan> copy_plan_to_host(const MaskPlan& device_plan);
#endif

}  // namespace flashspan
