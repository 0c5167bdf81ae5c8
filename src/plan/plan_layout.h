// Internal helpers shared by the host and CUDA planners (not part of the plan contract).
//
// Both planners must lay a plan out identically so that their buffers are bitwise equal:
// the array order, the offsets (every array starts at a multiple of kPlanAlign int32
// elements, i.e. 128 bytes, so kernels may use vector loads) and the zero padding come
// from assign_plan_layout() alone.
#pragma once

#include <cstdint>
#include <vector>

#include "plan/mask_plan.h"
#include "plan/planner.h"

namespace flashspan {

constexpr int64_t kPlanAlign = 32;  // int32 elements (128 bytes)

// The plan format indexes its block lists (CSR pointers, K2Q indices, entry indices the
// kernels hold in int registers) with int32, so one list holds at most kMaxListEntries
// entries. Counts, scans, offsets and allocation sizes are computed in 64 bits everywhere
// (both planners), and a plan past this limit is refused by check_list_entries() before
// anything is allocated or written.
constexpr int64_t kMaxListEntries = (int64_t(1) << 31) - 1;

// Throws Error(kNotSupported) when `entries` > kMaxListEntries, naming the view ("forward" /
// "backward" / "backward K2Q"), the list ("partial" / "full-run"), its tile, the number of entries asked for and
// the limit. `entries` is the exact 64-bit count (never a wrapped one).
void check_list_entries(const char* view, const char* list, int64_t entries, int bq, int bk, int mask_heads);

// Prefix sums of ceil(len(b) * rows_per_position / block) over samples, [B+1]. `cu` are
// cumulative lengths; rows_per_position = G for the packed-GQA forward view, else 1.
std::vector<int32_t> block_starts(const std::vector<int32_t>& cu, int block, int rows_per_position = 1);

// Checks what both planners need from a request: geometry present, consumer tiles valid
// for the payload layout (rows % 16, cols % 32), Hmask in {1, Hq}, Hq % Hkv == 0.
// Throws Error(kInvalidArgument / kNotSupported).
void check_plan_request(const PlanRequest& req);

// Whether the plan of `req` is packed: pack_gqa requested and G > 1 (with G == 1 packing
// is the identity, and the plan is the ordinary one with signature.pack_gqa = false).
inline bool plan_is_packed(const PlanRequest& req) { return req.pack_gqa && req.geometry->group_size() > 1; }

// Fills plan.arrays and plan.buffer_elements from plan.geometry, plan.signature and
// plan.counts (fwd/bwd block, partial and full-run counts must be set). Array order:
//   cu_seqlens_q, cu_seqlens_k,
//   fwd_q_block_start, fwd_k_block_start, fwd_q2k_partial_ptr, fwd_q2k_full_ptr,
//   fwd_q2k_partial_kb, fwd_q2k_full_runs, fwd_tasks, fwd_q2k_partial_bits,
//   [bwd_q_block_start, bwd_k_block_start, bwd_q2k_partial_ptr, bwd_q2k_full_ptr,
//    bwd_q2k_partial_kb, bwd_q2k_full_runs, bwd_k2q_partial_ptr, bwd_k2q_full_ptr,
//    bwd_k2q_partial_qb, bwd_k2q_partial_idx, bwd_k2q_full_runs, bwd_tasks, bwd_q2k_partial_bits]
//   [mask_func]  (keep_mask only)
// All sizes are int64; throws Error(kNotSupported) (check_list_entries) when a list exceeds
// kMaxListEntries or a schedule has more than kMaxListEntries tasks, before anything is
// allocated.
void assign_plan_layout(MaskPlan& plan, bool keep_mask);

}  // namespace flashspan
