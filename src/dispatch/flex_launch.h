// Launch interface between the API layer (src/api) and the GPU kernels.
// No CUDA headers here: the API layer is plain C++. Streams are cudaStream_t
// passed as void*. Implemented in src/kernels/sm80 (portable mma.sync path) and,
// later, src/kernels/sm90 (Hopper path); dispatch picks by plan.signature.consumer.arch.
#pragma once

#include <cstddef>

#include "core/geometry.h"
#include "core/tensor_view.h"
#include "plan/mask_plan.h"

namespace flashspan {

struct FlexFwdLaunch {
  const FlexGeometry* geometry = nullptr;  // the plan's geometry (cu_seqlens host copies)
  const MaskPlan* plan = nullptr;          // CUDA plan (device arrays)
  TensorView q, k, v, out;
  TensorView lse;        // optional (undefined = not written)
  TensorView max_logit;  // optional; reset to -inf on the stream by the launch, then reduced into
  float softmax_scale = 0.0f;
  // >= flex_fwd_workspace_size bytes, device: the split schedule (work items, per-item fp32
  // partial outputs of long Q2K walks). workspace_bytes == 0 runs every task unsplit (one CTA
  // per task; for internal callers -- the C ABI always passes the full size).
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
  void* stream = nullptr;                  // cudaStream_t
};

struct FlexBwdLaunch {
  const FlexGeometry* geometry = nullptr;
  const MaskPlan* plan = nullptr;          // must have backward metadata
  TensorView q, k, v, out, dout, lse;
  TensorView dlse;                         // optional fp32, shape of lse (gradient of lse)
  TensorView dq, dk, dv;
  float softmax_scale = 0.0f;
  bool deterministic = false;
  // >= flex_bwd_workspace_size bytes, device: D = rowsum(dO*O), LSE*log2(e), the fp32 dQ
  // accumulator (non-deterministic) and the split schedule of long K2Q walks.
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
  void* stream = nullptr;
};

// Bytes of workspace one call needs (counters, fp32 accumulators, ...). Pure functions of
// the geometry, plan.signature and the flags -- NOT of the plan's arrays or counts: the
// workspace is sized once at compile() and must serve every compatible plan (the API
// layer passes a MaskPlan that carries only geometry and signature). Never allocate.
size_t flex_fwd_workspace_size(const FlexGeometry& g, const MaskPlan& plan, bool has_max_logit);
size_t flex_bwd_workspace_size(const FlexGeometry& g, const MaskPlan& plan, bool deterministic);

// Throws flashspan::Error(kNotSupported, ...) when the kernels cannot run this
// configuration (head dims, dtype, architecture of the current device vs the plan's).
// Reads only geometry and plan.signature (same reason as above).
void flex_check_support_gpu(const FlexGeometry& g, const MaskPlan& plan, bool backward);

// Enqueue the kernels on the stream. Allocate nothing; CUDA-graph capturable.
// Throw flashspan::Error(kCudaError, ...) on a launch failure.
void launch_flex_fwd(const FlexFwdLaunch& args);
void launch_flex_bwd(const FlexBwdLaunch& args);

}  // namespace flashspan
