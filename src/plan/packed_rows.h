// The row mapping of a plan view: which endpoints a view row reads. Shared by the host
// planner, the CUDA planner (device code) and payload_word(), so that they cannot disagree.
//
// Unpacked view (group = 1): row r of query block i of sample b is query q_start(b) + i*Bq + r
// of mask head vm (vm = the CSR's mask head).
// Packed-GQA forward view (group = G = Hq / Hkv, mask_plan.h): packed row P = i*Bq + r of
// sample b is query position s = P / G of query head hkv*G + g, g = P % G, with hkv = vm;
// it reads mask head (Hmask == 1 ? 0 : vm*G + g), mask row q_start(b) + s.
#pragma once

#include <cstdint>

#include "kernels/common/payload_layout.h"

namespace flashspan {

// The endpoint rows of one query block. Endpoint f of block row r is row(r)[f * stride].
struct BlockRows {
  const int32_t* base = nullptr;  // endpoint 0 of block row 0's query position, head g = 0
  int64_t stride = 0;             // T = total_q (mask_func [Hmask, nfunc, T])
  int64_t head_stride = 0;        // nfunc * T between mask heads g, g+1 (0 when Hmask == 1)
  int g0 = 0;                     // head index g of block row 0 (packed row i*Bq mod G)
  int group = 1;                  // G (1: unpacked)

  FS_HOST_DEVICE const int32_t* row(int r) const {
    const int t = g0 + r;  // < Bq + G: 32-bit division
    const int s = t / group, g = t - s * group;
    return base + s + g * head_stride;
  }
};

// Rows of the query block whose first (packed) row is `row0` (sample-local) in sample b
// starting at query `q_start`, for CSR mask head `vm`; `shared_mask` = (Hmask == 1).
// group = 1 gives the unpacked mapping (mask head vm, or 0 when shared).
FS_HOST_DEVICE BlockRows block_rows(const int32_t* mask, int64_t T, int nfunc, int group, bool shared_mask, int vm,
                                    int64_t q_start, int64_t row0) {
  BlockRows br;
  const int64_t s0 = row0 / group;
  br.g0 = static_cast<int>(row0 - s0 * group);
  br.group = group;
  br.stride = T;
  br.head_stride = shared_mask ? 0 : int64_t(nfunc) * T;
  const int64_t head0 = shared_mask ? 0 : int64_t(vm) * group;
  br.base = mask + head0 * nfunc * T + q_start + s0;
  return br;
}

}  // namespace flashspan
