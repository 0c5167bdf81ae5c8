// Walks one CSR row of a plan's partial and full block lists in ascending block order
// (both lists are sorted; a block is in at most one of them). Ascending order makes the
// floating-point accumulation order a fixed function of the plan (bitwise reproducible)
// and keeps neighbouring CTAs on neighbouring blocks.
#pragma once

#include <cstdint>

namespace flashspan::kern {

struct BlockCursor {
  const int32_t* partial_blk;
  const int32_t* full_blk;
  int ip, ip_end, jf, jf_end;

  // Next block: its index, whether it is partial, and (partial only) its entry index in the
  // partial list, which is also its payload index. False when both lists are exhausted.
  __device__ __forceinline__ bool next(int& blk, bool& partial, int& entry) {
    const bool has_p = ip < ip_end, has_f = jf < jf_end;
    if (!has_p && !has_f) return false;
    const int bp = has_p ? __ldg(partial_blk + ip) : 0x7fffffff;
    const int bf = has_f ? __ldg(full_blk + jf) : 0x7fffffff;
    if (bp < bf) {
      blk = bp;
      partial = true;
      entry = ip++;
    } else {
      blk = bf;
      partial = false;
      entry = jf++;
    }
    return true;
  }

  __device__ __forceinline__ int remaining() const { return (ip_end - ip) + (jf_end - jf); }

  // Skips the first j blocks of the merged order, so that next() continues exactly where j
  // calls of next() would have left it. Merge-path binary search for a = the number of
  // partial blocks among the j smallest (the lists are sorted and disjoint):
  // P[mid] < F[j-mid-1] implies a > mid, otherwise a <= mid.
  __device__ __forceinline__ void skip(int j) {
    const int np = ip_end - ip, nf = jf_end - jf;
    if (j >= np + nf) {
      ip = ip_end;
      jf = jf_end;
      return;
    }
    int lo = j - nf > 0 ? j - nf : 0, hi = j < np ? j : np;
    while (lo < hi) {
      const int mid = (lo + hi) >> 1;
      if (__ldg(partial_blk + ip + mid) < __ldg(full_blk + jf + (j - mid - 1))) {
        lo = mid + 1;
      } else {
        hi = mid;
      }
    }
    ip += lo;
    jf += j - lo;
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
