// The one plan-reading cursor of the kernels (both families): walks one CSR row of a plan
// (plan format 2, mask_plan.h) -- a Q2K row (query block -> key blocks) or a K2Q row (key
// block -> query blocks). Order: first the row's partial entries (ascending block index,
// one entry each, entry index = payload index for Q2K), then the blocks of its full runs
// (ascending). The order is a fixed function of the plan, so the floating-point accumulation
// order is too (bitwise reproducible).
//
// State (4 ints, as the earlier merge of two entry lists): [pos, end) is the current
// segment -- partial entry indices while run < 0, else the blocks of the current run;
// run = ~(first run index) in the partial phase, then the next run index; run_end = the
// row's end in the run list. Runs are non-empty (planner guarantee), so one run load
// always yields a block.
#pragma once

#include <cstdint>

namespace flashspan::kern {

struct BlockCursor {
  const int32_t* partial_blk;  // q2k_partial_kb / k2q_partial_qb
  const int32_t* runs;         // q2k_full_runs / k2q_full_runs: (first, end) pairs
  int pos, end, run, run_end;

  // Row with partial entries [ip, ip_end) and full runs [jr, jr_end).
  __device__ __forceinline__ static BlockCursor make(const int32_t* partial_blk, const int32_t* runs, int ip,
                                                     int ip_end, int jr, int jr_end) {
    return BlockCursor{partial_blk, runs, ip, ip_end, ~jr, jr_end};
  }

  // CSR row r of a view: ptr arrays [rows + 1].
  __device__ __forceinline__ static BlockCursor row(const int32_t* partial_ptr, const int32_t* partial_blk,
                                                    const int32_t* full_ptr, const int32_t* runs, int64_t r) {
    return make(partial_blk, runs, __ldg(partial_ptr + r), __ldg(partial_ptr + r + 1), __ldg(full_ptr + r),
                __ldg(full_ptr + r + 1));
  }

  __device__ __forceinline__ bool in_partial_phase() const { return run < 0; }

  // Moves to the next run when the current segment is exhausted; false at the row's end.
  __device__ __forceinline__ bool refill() {
    if (pos < end) return true;
    if (run < 0) run = ~run;
    if (run >= run_end) return false;
    const int2 r = __ldg(reinterpret_cast<const int2*>(runs) + run);
    ++run;
    pos = r.x;
    end = r.y;
    return true;
  }

  // Next block: its index, whether it is partial, and (partial only) its entry index in the
  // partial list (the payload index of a Q2K entry; K2Q maps it through k2q_partial_idx).
  // False when the row is exhausted.
  __device__ __forceinline__ bool next(int& blk, bool& partial, int& entry) {
    if (!refill()) return false;
    partial = run < 0;
    entry = pos;
    blk = partial ? __ldg(partial_blk + pos) : pos;
    ++pos;
    return true;
  }

  // True when next() would return false (constant time).
  __device__ __forceinline__ bool done() const { return pos >= end && (run < 0 ? ~run : run) >= run_end; }

  // Blocks left (partial entries + full blocks of the remaining runs); loops over the runs.
  __device__ __forceinline__ int remaining() const {
    int n = end - pos;
    for (int j = run < 0 ? ~run : run; j < run_end; ++j) {
      const int2 r = __ldg(reinterpret_cast<const int2*>(runs) + j);
      n += r.y - r.x;
    }
    return n;
  }

  // Skips the next j blocks, so that next() continues exactly where j calls of next() would
  // have left it. O(runs skipped).
  __device__ __forceinline__ void skip(int j) {
    while (j > 0) {
      const int avail = end - pos;
      if (j <= avail) {
        pos += j;
        return;
      }
      j -= avail;
      pos = end;
      if (!refill()) return;
    }
  }
};

// A BlockCursor restricted to blocks [begin, begin + count) of its row (a work item of a
// split task): skips `begin`, then stops after `count` blocks (`left` more).
struct ItemCursor {
  BlockCursor cur;
  int left;

  __device__ __forceinline__ static ItemCursor make(BlockCursor row, int begin, int count) {
    if (begin > 0) row.skip(begin);
    return ItemCursor{row, count};
  }
  __device__ __forceinline__ bool next(int& blk, bool& partial, int& entry) {
    if (left <= 0) return false;
    --left;
    return cur.next(blk, partial, entry);
  }
  __device__ __forceinline__ bool done() const { return left <= 0 || cur.done(); }
  __device__ __forceinline__ int remaining() const {
    const int n = cur.remaining();
    return n < left ? n : left;
  }
};

// Sample owning global block `blk` given the prefix sums start[0..batch] (empty samples
// have start[b] == start[b+1] and own nothing): the last b with start[b] <= blk.
__device__ __forceinline__ int find_block_owner(const int32_t* __restrict__ start, int batch, int blk) {
  int lo = 0, hi = batch - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) >> 1;
    if (__ldg(start + mid) <= blk) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  return lo;
}

}  // namespace flashspan::kern
