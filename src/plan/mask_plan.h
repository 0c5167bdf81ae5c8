// MaskPlan: block-sparse metadata compiled from interval endpoints for one
// consumer (kernel family + tile shape + payload layout). Immutable once built.
//
// All arrays are int32 and live in one buffer (host memory for CPU plans, device
// memory for CUDA plans); `PlanView` hands kernels raw pointers into it.
//
// Block indexing. For a view with tile Bq x Bk, sample b has
//   nqb(b) = ceil(len_q(b) / Bq) query blocks and nkb(b) = ceil(len_k(b) / Bk) key blocks.
// `q_block_start[b]` (prefix sums, [B+1]) gives the global index of sample b's first
// query block; global query block gq = q_block_start[b] + local block i. Same for keys.
// A CSR row of the Q2K relation is r = hm * NQB + gq (hm = mask head, NQB = total
// query blocks); of the K2Q relation r = hm * NKB + gk. (Packed-GQA forward views count
// query blocks over packed rows and use virtual mask heads: see "Packed GQA" below.)
//
// Classes. A (query block, key block) pair is
//   empty   — no visible, in-bounds element: never listed;
//   full    — every element (all Bq x Bk of them) is visible and inside both sequences;
//   partial — anything else: listed with a payload (payload_layout.h), bit = 1 iff the
//             element is visible and inside both sequences.
// Partial blocks are listed one entry each, sorted by ascending block index. Full blocks are
// listed as RUNS (plan format 2): maximal ranges [first, end) of consecutive full blocks,
// ascending, disjoint and non-adjacent, so a row's full blocks cost one pair per run. For an
// interval mask a query block's full key blocks are a union of at most (nfunc+1)/2 runs, so
// the Q2K full lists grow with query blocks x nfunc, not with visible blocks (a causal row
// is one run). Kernels read a row through one cursor (kernels/common/block_range.cuh): its
// partial entries first, then its full runs.
//
// Arrays of a view (prefix "fwd_" or "bwd_"):
//   q_block_start [B+1], k_block_start [B+1]
//   q2k_partial_ptr [Hmask*NQB+1], q2k_partial_kb [nnz_p]   (sample-local key block index)
//   q2k_partial_bits [nnz_p * payload_words(Bq, Bk)]          (payload of the pair, CSR order)
//   q2k_full_ptr [Hmask*NQB+1] (run index), q2k_full_runs [2 * runs_f]
//     (pairs first, end: sample-local key blocks, end exclusive)
// Backward view only (transposed relation, for dK/dV):
//   k2q_partial_ptr [Hmask*NKB+1], k2q_partial_qb [nnz_p], k2q_partial_idx [nnz_p]
//     (k2q_partial_idx = index of the same pair in q2k_partial_kb, i.e. its payload)
//   k2q_full_ptr [Hmask*NKB+1] (run index), k2q_full_runs [2 * runs_k2q]
//     (pairs first, end: sample-local query blocks; the maximal runs of query blocks whose
//     Q2K full runs contain the key block)
// Every list index (CSR pointers, entry and run indices) is int32: one list holds at most
// 2^31 - 1 entries or runs (plan_layout.h, kMaxListEntries; larger plans are refused).
// Schedules (for persistent kernels), 4 int32 per task, ordered by cost (number of
// partial + full blocks) descending, ties by (batch, head, block) ascending:
//   fwd_tasks [num_tasks*4]: {local query block, query head, batch, cost}, over all Hq heads
//     (packed plans: {packed local query block, kv head, batch, cost} over all Hkv heads)
//   bwd_tasks [num_bwd_tasks*4]: {local key block, kv head, batch, cost}; cost sums the
//     K2Q lists of the kv head's query heads
//
// Packed GQA (signature.pack_gqa; G = group_size() = Hq / Hkv > 1). Only the FORWARD view
// changes; the backward view (bwd_* arrays, K2Q, bwd_tasks) is exactly the unpacked one (the
// dK/dV kernel already shares a K/V tile across the group's query heads). A plan requested
// with pack_gqa but G == 1 is the ordinary plan with pack_gqa = false (packing is the identity).
// In the packed forward view, the G query heads of a kv head share one query tile:
//   - sample b has len_q(b) * G packed rows; packed row r = s * G + g is query position s
//     (sample-local) of query head hkv * G + g;
//   - query blocks are over packed rows: nqb(b) = ceil(len_q(b) * G / Bq), fwd_q_block_start
//     their prefix sums, counts.fwd_num_q_blocks = NQB (packed); key blocks are unchanged;
//   - the CSR has Hmv = (Hmask == 1 ? 1 : Hkv) virtual mask heads: row vm * NQB + gq, so
//     fwd_q2k_*_ptr have Hmv * NQB + 1 entries; packed row r of virtual head vm reads mask
//     head (Hmask == 1 ? 0 : vm * G + r % G), mask row q_start(b) + r / G (packed_rows.h);
//   - classes, payload bits (rows = the block's packed rows; a packed row r >= len_q * G is
//     outside the sample, so never visible) and list order are as for unpacked rows;
//   - fwd_tasks run over the Hkv heads (num_tasks = Hkv * NQB); a task's kv head hkv uses
//     CSR head vm = (Hmask == 1 ? 0 : hkv);
//   - counts.visible_pairs keeps its meaning (over the Hmask mask heads; equal to the
//     unpacked plan's value).
// fwd_mask_heads() / fwd_pack_group() below give Hmv and G (1 when unpacked) of a plan.
// Sequences:
//   cu_seqlens_q [B+1], cu_seqlens_k [B+1] (copies; BSHD: b*Sq, b*Sk)
// CPU plans also keep `mask_func` (a copy of the endpoints), which the CPU reference
// backend executes from.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/geometry.h"
#include "kernels/common/payload_layout.h"
#include "kernels/plan_view.h"

namespace flashspan {

// The kernel family a plan is laid out for.
struct Consumer {
  int32_t arch = 80;          // 80: portable mma.sync kernels; 90: Hopper wgmma kernels
  int32_t fwd_block_q = 128;  // forward tile (rows = queries)
  int32_t fwd_block_k = 64;
  int32_t bwd_block_q = 64;   // backward tile (rows = queries in the payload too)
  int32_t bwd_block_k = 128;
  PayloadLayout layout = PayloadLayout::kM16N64Frag;

  bool operator==(const Consumer& o) const {
    return arch == o.arch && fwd_block_q == o.fwd_block_q && fwd_block_k == o.fwd_block_k &&
           bwd_block_q == o.bwd_block_q && bwd_block_k == o.bwd_block_k && layout == o.layout;
  }
};

struct PlanArray {
  std::string name;
  int64_t offset = 0;  // in int32 elements from the buffer start
  int64_t count = 0;
};

struct PlanCounts {
  int64_t fwd_num_q_blocks = 0, fwd_num_k_blocks = 0;
  int64_t fwd_partial = 0, fwd_full = 0;  // blocks (summed over the view's CSR heads)
  int64_t fwd_full_runs = 0;              // entries of fwd_q2k_full_runs / 2
  int64_t bwd_num_q_blocks = 0, bwd_num_k_blocks = 0;
  int64_t bwd_partial = 0, bwd_full = 0;
  int64_t bwd_full_runs = 0, bwd_k2q_full_runs = 0;
  int64_t visible_pairs = 0;  // visible (q, k) pairs summed over mask heads (as the C ABI reports)
  int64_t num_tasks = 0, num_bwd_tasks = 0;
};

// What a plan is compatible with. Execution compares the call against it; a mismatch is
// an error, never a reinterpretation.
struct PlanSignature {
  Consumer consumer;
  bool has_backward = false;
  bool pack_gqa = false;       // packed-GQA forward view (only ever true when G > 1)
  std::string to_string(const FlexGeometry& g) const;
};

// Query heads sharing one forward row group: G when the plan is packed, else 1.
inline int fwd_pack_group(const FlexGeometry& g, bool pack_gqa) { return pack_gqa ? g.group_size() : 1; }
// Mask heads of the forward CSR: Hmask unpacked; packed (Hmask == 1 ? 1 : Hkv).
inline int fwd_mask_heads(const FlexGeometry& g, bool pack_gqa) {
  return g.num_heads_mask == 1 ? 1 : g.num_heads_mask / fwd_pack_group(g, pack_gqa);
}

class MaskPlan {
 public:
  MaskPlan() = default;
  ~MaskPlan();
  MaskPlan(const MaskPlan&) = delete;
  MaskPlan& operator=(const MaskPlan&) = delete;

  FlexGeometry geometry;    // shape of the call; cu_seqlens host copies
  PlanSignature signature;
  PlanCounts counts;
  std::vector<PlanArray> arrays;

  // Storage: exactly one of the two is used.
  std::vector<int32_t> host_buffer;   // CPU plans
  int32_t* device_buffer = nullptr;   // CUDA plans (owned, cudaFree in the destructor)
  int64_t buffer_elements = 0;

  bool on_device() const { return device_buffer != nullptr; }
  const int32_t* base() const { return on_device() ? device_buffer : host_buffer.data(); }
  // Pointer to the named array (nullptr if absent); count in *count if given.
  const int32_t* array(const std::string& name, int64_t* count = nullptr) const;
  int64_t bytes() const { return buffer_elements * int64_t(sizeof(int32_t)); }

  PlanViewPtrs fwd_view() const;
  PlanViewPtrs bwd_view() const;  // throws if the plan has no backward metadata
};

}  // namespace flashspan
