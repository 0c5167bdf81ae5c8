// One validation module for every backend (CPU reference, CUDA planner, GPU kernels).
// Each check throws flashspan::Error with a message naming the argument and the rule.
#pragma once

#include <cstdint>

#include "core/geometry.h"
#include "core/tensor_view.h"

namespace flashspan {

struct PlanInputs {
  TensorView mask_func;     // int32 [Hmask, nfunc, B*Sq | Tq]
  TensorView q, k, v;       // sample tensors
  TensorView cu_seqlens_q;  // int32 [B+1], undefined for BSHD
  TensorView cu_seqlens_k;
  int64_t max_seqlen_q = 0; // THD only
  int64_t max_seqlen_k = 0;
};

// Checks ranks, dtypes, devices, head counts, nfunc, mask length, head dims and the
// cumulative lengths (values are read on the host: `cu_q_host/cu_k_host` must hold the
// B+1 values when the tensors live on the GPU, else they are read from the tensors).
// Returns the geometry with cu_seqlens copies filled in.
FlexGeometry validate_plan_inputs(const PlanInputs& in, const int32_t* cu_q_host = nullptr,
                                  const int32_t* cu_k_host = nullptr);

// Endpoint rules on host memory `mask` (contiguous [Hmask, nfunc, total_q]): every
// endpoint in [0, len_k(sample)], nondecreasing within the row. Messages give the
// mask head, row (sample, position) and endpoint index.
void validate_endpoints_host(const int32_t* mask, const FlexGeometry& g);

// Formats the error of a failed endpoint check (shared by host and CUDA planners so
// both give the same message). kind: 1 = negative, 2 = past the sample's key length,
// 3 = decreasing.
[[noreturn]] void throw_endpoint_error(int kind, int64_t mask_head, int64_t row, int64_t index, int64_t value,
                                       int64_t limit, const FlexGeometry& g);

// Supported head dimensions of the reference (any multiple of 8 up to 256). The GPU kernel
// families add their own rule (check_head_dims_gpu, src/dispatch/family.h).
void check_head_dims_reference(int dqk, int dv);

// The dtype of flex's statistics (LSE, dlse, max_logit) for inputs of dtype `io`: float64 for float64 inputs
// (CPU only), else float32.
inline DType flex_stats_dtype(DType io) { return io == DType::kFloat64 ? DType::kFloat64 : DType::kFloat32; }

// Output / call checks against a plan's geometry.
// `dtype_why`, when given, follows the dtype rule's message in parentheses (where the required dtype comes from).
void check_same_tensor_shape(const TensorView& t, const char* name, const int64_t* shape, int ndim, DType dtype,
                             DeviceType device, int device_id, const char* dtype_why = nullptr);
void check_last_dim_contiguous(const TensorView& t, const char* name);
void check_softmax_scale(float scale, bool want_max_logit);
// An output must not overlap itself (a zero stride, or strides that interleave): dimensions
// first_dim.. are checked (a packed THD output skips its batch dimension, addressed by offsets).
void check_no_self_overlap(const TensorView& t, const char* name, int first_dim = 0);
// Two bound tensors must not share memory: their byte spans, from the first element any stride reaches to the last,
// must not meet (conservative: two tensors interleaved in one buffer without a common element are refused too).
// For an output written while an input is still read (sdpa: dBias and the backward's inputs). Empty tensors and
// unbound ones (data NULL) pass.
void check_no_overlap(const TensorView& out, const char* out_name, const TensorView& in, const char* in_name,
                      const char* why);

// Expected shapes of q/k/v/out/lse for a geometry (BSHD or THD).
void expected_q_shape(const FlexGeometry& g, int64_t* shape, int* ndim);
void expected_k_shape(const FlexGeometry& g, int64_t* shape, int* ndim);
void expected_v_shape(const FlexGeometry& g, int64_t* shape, int* ndim);
void expected_out_shape(const FlexGeometry& g, int64_t* shape, int* ndim);
void expected_lse_shape(const FlexGeometry& g, int64_t* shape, int* ndim);

}  // namespace flashspan
