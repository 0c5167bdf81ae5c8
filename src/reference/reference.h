// CPU reference backend: the oracle every GPU kernel is checked against, and the
// backend that runs flex attention on CPU tensors.
//
// Semantics (seeds/flex_attention.txt): query row i of sample b, mask head hm, sees
// key j (sample-local) iff j lies in [0,F0) U [F1,F2) U ... with F = mask[hm, :, row].
//   S_ij  = scale * q_i . k_j                        (visible pairs only)
//   LSE_i = max_j S_ij + ln(sum_j exp(S_ij - max))   (natural log; -inf for an empty row)
//   O_i   = sum_j exp(S_ij - LSE_i) v_j              (0 for an empty row)
//   max_logit[h] = max over batches and visible pairs of S_ij (-inf if none)
// Backward (FlashAttention-2, Dao 2023): P = exp(S - LSE), D_i = dO_i . O_i,
//   dV = P^T dO, dP = dO V^T, dS = P * (dP - D), dQ = scale dS K, dK = scale dS^T Q;
// GQA gradients of a kv head are summed over its query heads. Empty rows give zero
// gradient.
//
// Accumulation is in float (double when accumulate_double, and always for float64 inputs). Work is
// split over (batch, head) across hardware threads. All tensors are CPU, strided, last dim
// contiguous, dtype float16 / bfloat16 / float32 / float64 (LSE, dlse and max_logit float32; float64
// for float64 inputs, core/validation.h flex_stats_dtype).
#pragma once

#include <cstdint>

#include "core/geometry.h"
#include "core/tensor_view.h"

namespace flashspan::reference {

struct FlexForwardArgs {
  const FlexGeometry* geometry = nullptr;
  const int32_t* mask = nullptr;  // host, contiguous [Hmask, nfunc, total_q]
  TensorView q, k, v;
  TensorView out;                 // written
  TensorView lse;                 // optional, written
  TensorView max_logit;           // optional, written
  float softmax_scale = 0.0f;
  bool accumulate_double = false;
};

struct FlexBackwardArgs {
  const FlexGeometry* geometry = nullptr;
  const int32_t* mask = nullptr;
  TensorView q, k, v, out, dout;
  TensorView lse;                 // float32 (float64 inputs: float64), as produced by flex_forward
  TensorView dlse;                // optional, lse's dtype and shape: gradient w.r.t. lse
                                  // (adds dlse_i * P_ij to dS_ij, i.e. D_i -= dlse_i)
  TensorView dq, dk, dv;          // written
  float softmax_scale = 0.0f;
  bool accumulate_double = false;
};

void flex_forward(const FlexForwardArgs& args);
void flex_backward(const FlexBackwardArgs& args);

// Number of visible (query, key) pairs of one mask head (for FLOP counts and tests).
int64_t count_visible_pairs(const FlexGeometry& g, const int32_t* mask, int mask_head);

}  // namespace flashspan::reference
