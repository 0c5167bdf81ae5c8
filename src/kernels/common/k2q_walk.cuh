// The K2Q walk of a dK/dV work item (kernels of every family): the (query head, query block)
// pairs of one key block over the K2Q rows of its kv group's query heads (plan format 2,
// mask_plan.h), in the order the split schedule counts steps (bwd_split.cuh).
#pragma once

#include <cstdint>

#include "kernels/common/block_range.cuh"
#include "kernels/params.h"

namespace flashspan::kern {

// Iterates (query head of the kv group, query block) pairs over the K2Q rows of one key block:
// head by head, each head's row in BlockCursor order (partial entries, then full runs).
// seek(begin) then next() visits pairs begin, begin + 1, ... of that order, at most `left` of
// them. The cursor's next block is read one step ahead (nb, ne), so the block next() returns
// never waits on a global load: the dK/dV loop computes the next Q/dO tile's address from it
// right away.
struct K2QWalk {
  static constexpr int kNone = 0x7fffffff;  // head's row exhausted
  const BwdParams* p;
  int h, h_end, b, kb;
  int left;
  BlockCursor cur;
  int nb = kNone, ne = -1;  // next block of the cursor and its partial entry index (-1: full)

  __device__ __forceinline__ void open_head() {
    const int hm = p->mask_per_head ? h : 0;
    const int64_t r = int64_t(hm) * p->view.num_k_blocks + __ldg(p->view.k_block_start + b) + kb;
    cur = BlockCursor::row(p->view.k2q_partial_ptr, p->view.k2q_partial_qb, p->view.k2q_full_ptr,
                           p->view.k2q_full_runs, r);
  }
  __device__ __forceinline__ void peek() {
    int blk = 0, entry = 0;
    bool partial = false;
    if (cur.next(blk, partial, entry)) {
      nb = blk;
      ne = partial ? entry : -1;
    } else {
      nb = kNone;
    }
  }
  // Opens the head holding pair `begin` (heads before it are skipped whole) and positions
  // the cursor on that pair.
  __device__ __forceinline__ void seek(int begin) {
    open_head();
    while (true) {
      const int n = cur.remaining();
      if (begin < n || h + 1 >= h_end) break;
      begin -= n;
      ++h;
      open_head();
    }
    cur.skip(begin);
    peek();
  }
  // Next pair; payload = payload index of a partial pair (-1 for a full one).
  __device__ __forceinline__ bool next(int& head, int& qb, int& payload) {
    if (left <= 0) return false;
    while (true) {
      if (nb != kNone) {
        --left;
        head = h;
        qb = nb;
        payload = ne >= 0 ? __ldg(p->view.k2q_partial_idx + ne) : -1;
        peek();
        return true;
      }
      if (++h >= h_end) return false;
      open_head();
      peek();
    }
  }
};

// The same pairs as K2QWalk, each head's query blocks in ascending order (its partial entries
// and full runs merged), for walks whose order is a schedule, not only a summation order: the
// deterministic sm90 backward adds a query block's dQ in descending key-block order, and with
// ascending walks a larger key block (whose walk starts at a later query block in causal-like
// masks) reaches each query block first, so that order costs no waiting. (BlockCursor order
// visits every partial entry first: a document's last, partial query block would be the second
// step of every key block of the document, all waiting on each other there.)
struct K2QWalkAscending {
  static constexpr int kEnd = 0x7fffffff;
  const BwdParams* p;
  int h, h_end, b, kb;
  int left;
  int ip = 0, ip_end = 0;  // the head's partial entries [ip, ip_end)
  int pb = kEnd;           // query block of entry ip (kEnd past the end), read one entry ahead
  int jr = 0, jr_end = 0;  // the head's full runs not yet opened [jr, jr_end)
  int rf = 0, re = 0;      // the open run's blocks [rf, re)

  __device__ __forceinline__ void read_pb() { pb = ip < ip_end ? __ldg(p->view.k2q_partial_qb + ip) : kEnd; }
  __device__ __forceinline__ void open_run() {
    if (rf >= re && jr < jr_end) {
      const int2 r = __ldg(reinterpret_cast<const int2*>(p->view.k2q_full_runs) + jr);
      ++jr;
      rf = r.x;
      re = r.y;
    }
  }
  __device__ __forceinline__ void open_head() {
    const int hm = p->mask_per_head ? h : 0;
    const int64_t r = int64_t(hm) * p->view.num_k_blocks + __ldg(p->view.k_block_start + b) + kb;
    ip = __ldg(p->view.k2q_partial_ptr + r);
    ip_end = __ldg(p->view.k2q_partial_ptr + r + 1);
    jr = __ldg(p->view.k2q_full_ptr + r);
    jr_end = __ldg(p->view.k2q_full_ptr + r + 1);
    rf = re = 0;
    read_pb();
    open_run();
  }
  // Pairs of the open head's row not yet visited: its partial entries and the blocks of its
  // full runs (reads the runs; used by seek only).
  __device__ __forceinline__ int head_pairs() const {
    int n = (ip_end - ip) + (re - rf);
    for (int j = jr; j < jr_end; ++j) {
      const int2 r = __ldg(reinterpret_cast<const int2*>(p->view.k2q_full_runs) + j);
      n += r.y - r.x;
    }
    return n;
  }
  // Partial entries in [ip, ip_end) whose query block is below qb (binary search: the entries
  // ascend).
  __device__ __forceinline__ int partial_below(int qb) const {
    int lo = ip, hi = ip_end;
    while (lo < hi) {
      const int mid = (lo + hi) >> 1;
      if (__ldg(p->view.k2q_partial_qb + mid) < qb) {
        lo = mid + 1;
      } else {
        hi = mid;
      }
    }
    return lo - ip;
  }
  // Positions the walk on pair `begin` (split items start inside walks): whole heads skipped by
  // their pair counts, then, in the head, run by run -- the partial entries below the run's
  // first block (binary search), then the run's blocks (partial and full blocks are disjoint,
  // so no partial entry lies inside a run). O(heads + runs + log(partial entries)) loads, not
  // O(begin): a split item of a 512-step sink walk seeks without walking.
  __device__ __forceinline__ void seek(int begin) {
    open_head();
    while (h + 1 < h_end) {
      const int n = head_pairs();
      if (begin < n) break;
      begin -= n;
      ++h;
      open_head();
    }
    while (begin > 0) {
      const int fb = rf < re ? rf : kEnd;
      const int np = fb == kEnd ? ip_end - ip : partial_below(fb);
      if (begin < np || fb == kEnd) {
        ip += min(begin, ip_end - ip);
        break;
      }
      begin -= np;
      ip += np;
      if (begin < re - rf) {
        rf += begin;
        break;
      }
      begin -= re - rf;
      rf = re;
      open_run();
    }
    read_pb();
  }
  // Next pair; payload = payload index of a partial pair (-1 for a full one).
  __device__ __forceinline__ bool next(int& head, int& qb, int& payload) {
    if (left <= 0) return false;
    while (true) {
      const int fb = rf < re ? rf : kEnd;
      if (pb != kEnd || fb != kEnd) {
        --left;
        head = h;
        if (pb < fb) {
          qb = pb;
          payload = __ldg(p->view.k2q_partial_idx + ip);
          ++ip;
          read_pb();
        } else {
          qb = fb;
          payload = -1;
          ++rf;
          open_run();
        }
        return true;
      }
      if (++h >= h_end) return false;
      open_head();
    }
  }
};

}  // namespace flashspan::kern
