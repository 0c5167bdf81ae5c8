// The plan's arrays as a kernel sees them: raw pointers of one view (forward or backward)
// of a MaskPlan (src/plan/mask_plan.h documents the arrays and block indexing). Plain C++,
// no CUDA: filled on the host by MaskPlan::fwd_view()/bwd_view(), passed to kernels by value.
// Kernels read a row through kernels/common/block_range.cuh (BlockCursor / ItemCursor).
#pragma once

#include <cstdint>

namespace flashspan {

// Raw pointers of one view, as kernels see them (device or host pointers).
struct PlanViewPtrs {
  int32_t block_q = 0, block_k = 0;
  int32_t pack_group = 1;      // G of a packed forward view, else 1 (rows are packed rows)
  int32_t num_mask_heads = 0;  // CSR mask heads (Hmask, or Hmv of a packed forward view)
  int64_t num_q_blocks = 0, num_k_blocks = 0;  // NQB, NKB over all samples
  const int32_t* q_block_start = nullptr;
  const int32_t* k_block_start = nullptr;
  const int32_t* q2k_partial_ptr = nullptr;
  const int32_t* q2k_partial_kb = nullptr;
  const uint32_t* q2k_partial_bits = nullptr;
  const int32_t* q2k_full_ptr = nullptr;   // run index
  const int32_t* q2k_full_runs = nullptr;  // (first, end) pairs (plan format 2: full blocks as runs)
  const int32_t* k2q_partial_ptr = nullptr;  // backward view only
  const int32_t* k2q_partial_qb = nullptr;
  const int32_t* k2q_partial_idx = nullptr;
  const int32_t* k2q_full_ptr = nullptr;   // run index
  const int32_t* k2q_full_runs = nullptr;  // (first, end) pairs
  const int32_t* tasks = nullptr;            // fwd_tasks or bwd_tasks
  int64_t num_tasks = 0;
};

}  // namespace flashspan
