// CPU reference of SDPA forward and backward: the oracle of the SDPA GPU kernels and the
// backend that runs flashspan.sdpa on CPU tensors. The semantics are those of docs/SDPA.md;
// in short, for sample b, query head h, sample-local query row i < len_q[b] and key column
// j < len_kv[b] (K/V head h / (H_q / H_k) and h / (H_q / H_v)):
//
//   x_ij = attn_scale * q_i . k_j
//   x_ij = softcap * tanh(x_ij / softcap)                        (softcap set)
//   x_ij += bias[b|0, h|0, i|0, j|0]                             (bias set)
//   x_ij += slope_h * (j - i - shift)                            (ALiBi; sdpa::alibi_slope)
//   visible(i, j): band (left/right bounds around column i + shift, shift = len_kv - len_q
//                  for BOTTOM_RIGHT, 0 for TOP_LEFT) and the 128x128 block-mask bit
//   LSE_i = log(exp(sink_h) + sum_{visible j} exp(x_ij))         (-inf when nothing is seen)
//   P_ij  = exp(x_ij - LSE_i);  Pd_ij = P_ij * keep_ij / (1 - p)  (Philox, core/philox.h)
//                                      or P_ij * mask_ij * scale  (caller dropout mask)
//   O_i   = sigmoid(G_i) * sum_j Pd_ij v_j                        (gate optional)
//
// Backward (FlashAttention-2 with the extensions): D_i = dO_i . O_i (gated O and dO: the gate
// cancels), dOu_i = dO_i * sigmoid(G_i), dV_j = sum_i Pd_ij dOu_i, dP_ij = (dOu_i . v_j) *
// keep/scale, dX_ij = P_ij (dP_ij - D_i) (= dBias, reduced over broadcast dims), the
// softcap derivative 1 - tanh^2, dQ = attn_scale dS K, dK = attn_scale dS^T Q (summed over
// each K/V head's query heads), dSink_h = -sum_{b,i} exp(sink_h - LSE_i) D_i,
// dG = dO * O * (1 - sigmoid(G)).
//
// FP8 (q, k, v float8_e4m3fn / float8_e5m2; docs/SDPA.md "FP8 SDPA"), in double from the raw FP8 values:
// x_ij = attn_scale descale_q descale_k q_i . k_j; S_ij = exp(x_ij - LSE_i), amax_s = max S,
// S8 = fp8_q(S scale_s); O = (S8 V) descale_s descale_v, amax_o = max |O|, stored fp8_o(O scale_o).
// Backward: D_i = descale_dO descale_o dO_i . O_i, dP_ij = attn_scale S_ij (descale_dO descale_v dO_i . v_j
// - D_i), amax_dP = max |dP|, dP8 = fp8_dO(dP scale_dP); dQ = (dP8 K) descale_dP descale_k, dK = (dP8^T Q)
// descale_dP descale_q, dV = (S8^T dO) descale_s descale_dO, each with its amax, stored fp8(x scale_x).
// fp8_f(x): x rounded to the format of tensor f through float (nearest even, saturating).
//
// Rows and columns past a sample's lengths are never read; in non-ragged (padded) outputs
// they are written as 0 (O, dQ, dK, dV, dgate), -inf (stats, score_max) and 0 (score_sum_exp).
// Ragged outputs are written only at the samples' rows. An empty batch (B = 0) runs no task: only the
// identity values of sdpa::empty_batch_fills (max_logit -inf, dSink / broadcast dBias / FP8 amax 0). Accumulation is in float (double
// for float64 tensors or when asked); results are bitwise deterministic. Work is split over
// (sample, query head) across hardware threads.
#pragma once

#include "core/sdpa_problem.h"

namespace flashspan::reference {

// The problem's tensors must be bound (Problem::bind) to host memory.
void sdpa_forward(const sdpa::Problem& p, bool accumulate_double = false);
void sdpa_backward(const sdpa::Problem& p, bool accumulate_double = false);

}  // namespace flashspan::reference
