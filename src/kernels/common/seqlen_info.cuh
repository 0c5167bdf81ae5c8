// Sequence lengths of one sample (kernels of every family). The plan's device copies of
// cu_seqlens hold b * S for BSHD, so start and length read the same way in both layouts
// (params.h): a THD tensor's sample starts at row `start`, a BSHD one at batch b, row 0.
#pragma once

#include <cstdint>

#include "kernels/params.h"

namespace flashspan::kern {

struct SeqlenInfo {
  int q_start, len_q, k_start, len_k;

  // Loads, in this order, cu_seqlens_q[b], cu_seqlens_q[b + 1], cu_seqlens_k[b], cu_seqlens_k[b + 1].
  __device__ __forceinline__ SeqlenInfo(const QkvParams& p, int b)
      : q_start(__ldg(p.cu_seqlens_q + b)),
        len_q(__ldg(p.cu_seqlens_q + b + 1) - q_start),
        k_start(__ldg(p.cu_seqlens_k + b)),
        len_k(__ldg(p.cu_seqlens_k + b + 1) - k_start) {}
};

}  // namespace flashspan::kern
