// Mask planners. Both produce bitwise identical plans (same arrays, same order, same
// payload bits) for the same endpoints and consumer; see mask_plan.h for the format.
#pragma once

#include <memory>

#include "plan/mask_plan.h"

namespace flashspan {

struct PlanRequest {
  const FlexGeometry* geometry = nullptr;  // validated geometry (validate_plan_inputs)
  Consumer consumer;
  bool build_backward = false;
  bool pack_gqa = false;
};

// Host planner (CPU plans, and the oracle for the CUDA planner). `mask` is host memory,
// contiguous [Hmask, nfunc, total_q]; endpoints are validated here (same messages as the
// CUDA planner). The plan keeps a copy of the endpoints for the CPU backend when
// keep_mask is true.
std::unique_ptr<MaskPlan> build_mask_plan_host(const PlanRequest& req, const int32_t* mask, bool keep_mask);

// CUDA planner: classify -> count and scan -> read one small header back (exact sizes,
// device-side validation errors raised as flashspan::Error) -> materialise. `mask` is
// device memory, contiguous [Hmask, nfunc, total_q]. Runs on `stream` (cudaStream_t).
// Defined only when built with CUDA (FLASHSPAN_WITH_CUDA).
std::unique_ptr<MaskPlan> build_mask_plan_cuda(const PlanRequest& req, const int32_t* mask, void* stream);

}  // namespace flashspan
