// Device passes of the CUDA mask planner (host orchestration: planner_cuda.cu).
//
// Every pass is deterministic (integer atomics only where the result is order-free), and
// the outputs equal the host planner's bit for bit (planner_host.cpp is the oracle).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <cub/block/block_scan.cuh>

#include "kernels/common/payload_layout.h"
#include "plan/packed_rows.h"
#include "plan/payload_word.h"
#include "plan/plan_runs.h"

namespace flashspan {
namespace plan_gpu {

constexpr int kThreads = 256;
// Key blocks per shared-memory pass of the classifier: 4096 keeps the difference array at
// 16 KB (S = 262144 at 64-column tiles in one pass); longer key sequences loop over passes.
constexpr int kChunk = 4096;
constexpr int kItems = kChunk / kThreads;  // key blocks per thread in the block scan
// Partial blocks whose payloads one CTA of the payload pass writes (a contiguous range, so
// the CSR row of the next entry is found by stepping, not searching).
constexpr int kPayloadEntriesPerCta = 8;

// Read back once per plan. The list totals are 64-bit (scans of 64-bit per-row counts), so a
// plan past the format's int32 limit is seen with its true size and refused before any
// list is written. err_key = (hm * total_q + row) * nfunc + f of the first bad
// endpoint in host-planner order, or ~0 when the endpoints are valid.
struct Header {
  unsigned long long err_key;
  unsigned long long visible;
  long long err_kind, err_hm, err_row, err_index, err_value, err_limit;
  long long fwd_partial, fwd_full, bwd_partial, bwd_full;  // list entries: partial blocks, full runs
  unsigned long long fwd_full_blocks, bwd_full_blocks;     // full blocks (sums of run lengths)
  long long k2q_starts, k2q_ends;                         // K2Q full-run events (second read-back)
};

// Largest b in [0, n-1] with scale * starts[b] <= x (starts nondecreasing, starts[0] = 0).
__device__ __forceinline__ int find_segment(const int32_t* starts, int n, long long x, long long scale = 1) {
  int lo = 0, hi = n - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) >> 1;
    if (scale * starts[mid] <= x) lo = mid;
    else hi = mid - 1;
  }
  return lo;
}

__global__ void init_header_kernel(Header* h) {
  h->err_key = ~0ull;
  h->visible = 0;
  h->err_kind = h->err_hm = h->err_row = h->err_index = h->err_value = h->err_limit = 0;
  h->fwd_partial = h->fwd_full = h->bwd_partial = h->bwd_full = 0;
  h->fwd_full_blocks = h->bwd_full_blocks = 0;
  h->k2q_starts = h->k2q_ends = 0;
}

// One thread per (mask head, row): the row's first bad endpoint (host check order: negative,
// past len_k, decreasing) competes for the smallest key.
__global__ void validate_kernel(const int32_t* __restrict__ mask, long long T, int nfunc, int hmask, int batch,
                                const int32_t* __restrict__ cu_q, const int32_t* __restrict__ cu_k, Header* h) {
  const long long n = (long long)hmask * T;
  for (long long x = (long long)blockIdx.x * blockDim.x + threadIdx.x; x < n; x += (long long)gridDim.x * blockDim.x) {
    const long long hm = x / T, row = x - hm * T;
    const int b = find_segment(cu_q, batch, row);
    const long long lk = cu_k[b + 1] - cu_k[b];
    long long prev = 0;
    const int32_t* p = mask + hm * nfunc * T + row;
    for (int f = 0; f < nfunc; ++f) {
      const long long e = p[(long long)f * T];
      if (e < 0 || e > lk || e < prev) {
        atomicMin(&h->err_key, (unsigned long long)((hm * T + row) * nfunc + f));
        break;
      }
      prev = e;
    }
  }
}

// Decodes the first error and copies the CSR totals (last entries of the scans).
__global__ void finalize_header_kernel(Header* h, const int32_t* __restrict__ mask, long long T, int nfunc, int batch,
                                       const int32_t* __restrict__ cu_q, const int32_t* __restrict__ cu_k,
                                       const long long* fwd_p_end, const long long* fwd_f_end,
                                       const long long* bwd_p_end, const long long* bwd_f_end) {
  h->fwd_partial = *fwd_p_end;
  h->fwd_full = *fwd_f_end;
  h->bwd_partial = bwd_p_end ? *bwd_p_end : 0;
  h->bwd_full = bwd_f_end ? *bwd_f_end : 0;
  const unsigned long long key = h->err_key;
  if (key == ~0ull) return;
  const long long f = (long long)(key % (unsigned long long)nfunc);
  const long long rest = (long long)(key / (unsigned long long)nfunc);
  const long long row = rest % T, hm = rest / T;
  const int b = find_segment(cu_q, batch, row);
  const long long lk = cu_k[b + 1] - cu_k[b];
  const int32_t* p = mask + hm * nfunc * T + row;
  const long long e = p[f * T];
  const long long prev = f > 0 ? p[(f - 1) * T] : 0;
  h->err_hm = hm;
  h->err_row = row;
  h->err_index = f;
  h->err_value = e;
  if (e < 0) {
    h->err_kind = 1;
    h->err_limit = lk;
  } else if (e > lk) {
    h->err_kind = 2;
    h->err_limit = lk;
  } else {
    h->err_kind = 3;
    h->err_limit = prev;
  }
}

// Arguments of the per-query-block classifier (one CTA per CSR row hm * NQB + gq; hm is a
// virtual mask head of a packed view).
struct RelationArgs {
  const int32_t* mask;  // [Hmask, nfunc, T]
  long long T;
  int nfunc, batch;
  int group;            // G of the packed-GQA forward view, else 1 (packed_rows.h)
  bool shared_mask;     // Hmask == 1
  const int32_t* cu_q;  // [B+1] device copies
  const int32_t* cu_k;
  const int32_t* qbs;   // block starts [B+1] of this view
  const int32_t* kbs;
  int bq, bk;
  long long nqb_all, nkb_all;
  int chunk;            // key blocks per pass (<= kChunk); sizes the shared difference array
  // Count pass.
  long long* p_cnt;     // [Hmask*NQB] partial blocks / full runs per CSR row (64-bit: scanned
  long long* f_cnt;     //  into 64-bit pointers, so totals past 2^31 are exact)
  unsigned long long* visible;      // optional: visible pairs
  unsigned long long* full_blocks;  // full blocks of the view
  // Materialise pass.
  const long long* p_ptr;  // scanned counts (totals checked <= kMaxListEntries)
  const long long* f_ptr;
  int32_t* p_kb;
  int32_t* f_runs;      // (first, end) pairs
  uint32_t* p_key;      // optional (backward): K2Q row of each partial entry, and its local query block
  int32_t* p_qb;
};

// Adds [a, e) (columns relative to the pass start, a < e) to the pass's difference array.
__device__ __forceinline__ void add_interval_shared(int32_t* diff, long long a, long long e, int bk) {
  const int ka = (int)(a / bk), ke = (int)((e - 1) / bk);
  if (ka == ke) {
    atomicAdd(&diff[ka], (int)(e - a));
    atomicAdd(&diff[ka + 1], -(int)(e - a));
    return;
  }
  const int first = (int)((long long)(ka + 1) * bk - a), last = (int)(e - (long long)ke * bk);
  atomicAdd(&diff[ka], first);
  atomicAdd(&diff[ka + 1], bk - first);  // blocks ka+1 .. ke-1 are fully covered
  atomicAdd(&diff[ke], last - bk);
  atomicAdd(&diff[ke + 1], -last);
}

// Classifies the key blocks of one (mask head, query block): per pass of `chunk` key blocks,
// the rows' intervals fill a shared difference array (one thread per (row, interval); each
// endpoint is read once per pass, coalesced over rows), a block scan turns it into
// per-block visible counts (full = Bq*Bk, empty = 0, else partial). A full run starts at a
// full block whose predecessor is not full and ends at the first non-full block after it
// (or the row's end); the predecessor of a thread's first block is the exclusive scan value
// (the visible count of the block before it), of a pass's first block the carry s_carry.
// kMaterialize = false: partial blocks and full runs per CSR row (+ visible pairs and full
// blocks). true: writes the ascending partial list and the runs at the scanned offsets
// (payloads: payload_kernel). Endpoints are clamped to
// [0, len_k] so that invalid input (rejected after the count pass) cannot index out of
// bounds.
template <bool kMaterialize>
__global__ void __launch_bounds__(kThreads) relation_kernel(RelationArgs a) {
  using BlockScan = cub::BlockScan<int32_t, kThreads>;
  __shared__ typename BlockScan::TempStorage scan_tmp;
  __shared__ long long s_p, s_f;
  __shared__ unsigned long long s_vis, s_full;
  __shared__ int s_carry[2];  // by pass parity: is the last block of the previous pass full?
  extern __shared__ int32_t diff[];  // [chunk + 1]: difference array of one pass

  const long long csr_row = blockIdx.x;
  const int hm = (int)(csr_row / a.nqb_all);
  const long long gq = csr_row - hm * a.nqb_all;
  const int b = find_segment(a.qbs, a.batch, gq);
  const long long i = gq - a.qbs[b];
  const long long lq = (long long)(a.cu_q[b + 1] - a.cu_q[b]) * a.group;  // (packed) rows of the sample
  const int rows = (int)min((long long)a.bq, lq - i * a.bq);
  const long long lk = a.cu_k[b + 1] - a.cu_k[b];
  const long long nkb = a.kbs[b + 1] - a.kbs[b];
  const int tid = threadIdx.x;

  // Endpoint f of row r of this query block: ep.row(r)[f * T].
  const BlockRows ep = block_rows(a.mask, a.T, a.nfunc, a.group, a.shared_mask, hm, a.cu_q[b], i * a.bq);
  const long long stride = a.T;
  if (tid == 0) {
    s_p = 0;
    s_f = 0;
    s_vis = 0;
    s_full = 0;
    s_carry[0] = 0;
  }
  __syncthreads();

  const int nint = (a.nfunc + 1) / 2;
  const int32_t full = a.bq * a.bk;
  long long p_base = 0, f_base = 0;
  if (kMaterialize) {
    p_base = a.p_ptr[csr_row];
    f_base = a.f_ptr[csr_row];
  }
  int32_t run_p = 0, run_f = 0;  // list entries written by earlier passes (uniform)
  int32_t my_p = 0, my_f = 0;
  long long my_vis = 0, my_full = 0;
  int pass = 0;
  for (long long c0 = 0; c0 < nkb; c0 += a.chunk, ++pass) {
    const int C = (int)min((long long)a.chunk, nkb - c0);
    for (int x = tid; x <= C; x += kThreads) diff[x] = 0;
    __syncthreads();
    const long long lo_col = c0 * a.bk, hi_col = min(lk, (c0 + C) * a.bk);
    for (long long x = tid; x < (long long)rows * nint; x += kThreads) {
      const int j = (int)(x / rows), r = (int)(x - (long long)j * rows);
      const int32_t* er = ep.row(r);
      long long s = j == 0 ? 0 : er[(2 * j - 1) * stride];
      long long e = er[2 * j * stride];
      s = max(lo_col, min(s, hi_col));
      e = max(lo_col, min(e, hi_col));
      if (s < e) add_interval_shared(diff, s - lo_col, e - lo_col, a.bk);
    }
    __syncthreads();
    int32_t cnt[kItems];
    int32_t tsum = 0;
#pragma unroll
    for (int k = 0; k < kItems; ++k) {
      const int x = tid * kItems + k;
      cnt[k] = x < C ? diff[x] : 0;
      tsum += cnt[k];
    }
    int32_t run;
    BlockScan(scan_tmp).ExclusiveSum(tsum, run);
    // Is the block before this thread's first block full? (a pass's first: the carry)
    const bool first_prev_full = tid == 0 ? s_carry[pass & 1] != 0 : run == full;
    int32_t np = 0, nf = 0;  // partial blocks, run starts
    bool prev_full = first_prev_full;
#pragma unroll
    for (int k = 0; k < kItems; ++k) {
      run += cnt[k];
      cnt[k] = run;  // visible elements of key block c0 + tid*kItems + k
      const int x = tid * kItems + k;
      if (x < C) {
        const bool f = run == full;
        my_vis += run;
        my_full += f;
        np += run > 0 && !f;
        nf += f && !prev_full;
        prev_full = f;
        if (x == C - 1) s_carry[(pass + 1) & 1] = f;
      }
    }
    if (!kMaterialize) {
      my_p += np;
      my_f += nf;
    } else {
      __syncthreads();  // scan_tmp reuse
      int32_t excl, total;
      BlockScan(scan_tmp).ExclusiveSum((np << 16) | nf, excl, total);  // per pass: <= 4096 each
      // fp = runs started before the current block (the open run, if any, is fp - 1).
      long long pp = p_base + run_p + (excl >> 16), fp = f_base + run_f + (excl & 0xffff);
      bool pf = first_prev_full;
#pragma unroll
      for (int k = 0; k < kItems; ++k) {
        const int x = tid * kItems + k;
        if (x >= C) continue;
        const int32_t kb = (int32_t)(c0 + x);
        const bool f = cnt[k] == full;
        if (f && !pf) a.f_runs[2 * fp++] = kb;
        if (!f && pf) a.f_runs[2 * (fp - 1) + 1] = kb;
        if (f && c0 + x == nkb - 1) a.f_runs[2 * (fp - 1) + 1] = (int32_t)nkb;
        pf = f;
        if (cnt[k] == 0 || f) continue;
        {
          a.p_kb[pp] = kb;
          if (a.p_key) {
            a.p_key[pp] = (uint32_t)(hm * a.nkb_all + a.kbs[b] + kb);
            a.p_qb[pp] = (int32_t)i;
          }
          ++pp;
        }
      }
      run_p += total >> 16;
      run_f += total & 0xffff;
    }
    __syncthreads();  // diff and scan_tmp are reused by the next pass
  }

  if (!kMaterialize) {
    if (my_p) atomicAdd(reinterpret_cast<unsigned long long*>(&s_p), (unsigned long long)my_p);
    if (my_f) atomicAdd(reinterpret_cast<unsigned long long*>(&s_f), (unsigned long long)my_f);
    if (a.visible && my_vis) atomicAdd(&s_vis, (unsigned long long)my_vis);
    if (my_full) atomicAdd(&s_full, (unsigned long long)my_full);
    __syncthreads();
    if (tid == 0) {
      a.p_cnt[csr_row] = s_p;
      a.f_cnt[csr_row] = s_f;
      if (a.visible && s_vis) atomicAdd(a.visible, s_vis);
      if (s_full) atomicAdd(a.full_blocks, s_full);
    }
  }
}

struct PayloadArgs {
  const int32_t* mask;  // [Hmask, nfunc, T]
  long long T;
  int nfunc, batch;
  int group;            // as in RelationArgs
  bool shared_mask;
  const int32_t* cu_q;
  const int32_t* qbs;
  int bq, bk;
  long long nqb_all, rows_all;  // rows_all = Hmask * NQB (CSR rows)
  const int32_t* p_ptr;
  const int32_t* p_kb;
  long long num_partial;
  uint32_t* bits;
};

// Payloads of partial blocks [blockIdx.x * E, (blockIdx.x + 1) * E), E =
// kPayloadEntriesPerCta; one thread per payload word (coalesced stores). Balanced over
// entries, so a query block with thousands of partial blocks (a global-token row) does not
// serialize on one CTA. Endpoints are read from global memory: the few rows a warp touches
// share sectors and stay in L1.
__global__ void __launch_bounds__(kThreads) payload_kernel(PayloadArgs a) {
  const long long e0 = (long long)blockIdx.x * kPayloadEntriesPerCta;
  const long long e1 = min(a.num_partial, e0 + kPayloadEntriesPerCta);
  if (e0 >= e1) return;
  const int words = payload_words(a.bq, a.bk);
  long long row = find_segment(a.p_ptr, (int)a.rows_all, e0);
  for (long long e = e0; e < e1; ++e) {
    while (a.p_ptr[row + 1] <= e) ++row;  // uniform across the CTA
    const int hm = (int)(row / a.nqb_all);
    const long long gq = row - hm * a.nqb_all;
    const int b = find_segment(a.qbs, a.batch, gq);
    const long long i = gq - a.qbs[b];
    const long long lq = (long long)(a.cu_q[b + 1] - a.cu_q[b]) * a.group;
    const int rows = (int)min((long long)a.bq, lq - i * a.bq);
    const BlockRows ep = block_rows(a.mask, a.T, a.nfunc, a.group, a.shared_mask, hm, a.cu_q[b], i * a.bq);
    const long long col0 = (long long)a.p_kb[e] * a.bk;
    for (int w = threadIdx.x; w < words; w += kThreads)
      a.bits[e * words + w] = payload_word(ep, a.nfunc, rows, col0, a.bk, w);
  }
}

// Up to kMaxSegments device-to-device int32 copies in one launch (blockIdx.y = segment).
// A segment with src64 set narrows 64-bit values (CSR pointers checked <= kMaxListEntries).
constexpr int kMaxSegments = 12;
struct Segments {
  const int32_t* src[kMaxSegments];
  const long long* src64[kMaxSegments];
  int32_t* dst[kMaxSegments];
  long long n[kMaxSegments];
  int count;
};

__global__ void copy_segments_kernel(Segments s) {
  const int k = blockIdx.y;
  for (long long x = (long long)blockIdx.x * blockDim.x + threadIdx.x; x < s.n[k]; x += (long long)gridDim.x * blockDim.x)
    s.dst[k][x] = s.src64[k] ? (int32_t)s.src64[k][x] : s.src[k][x];
}

__global__ void iota_kernel(int32_t* v, long long n) {
  for (long long x = (long long)blockIdx.x * blockDim.x + threadIdx.x; x < n; x += (long long)gridDim.x * blockDim.x)
    v[x] = (int32_t)x;
}

// K2Q row pointers from the sorted keys: ptr[r] = number of keys < r, r in [0, rows].
__global__ void lower_bound_ptr_kernel(const uint32_t* __restrict__ keys, long long n, int32_t* ptr, long long rows) {
  for (long long r = (long long)blockIdx.x * blockDim.x + threadIdx.x; r <= rows; r += (long long)gridDim.x * blockDim.x) {
    long long lo = 0, hi = n;
    while (lo < hi) {
      const long long mid = (lo + hi) >> 1;
      if ((long long)keys[mid] < r) lo = mid + 1;
      else hi = mid;
    }
    ptr[r] = (int32_t)lo;
  }
}

// k2q_partial_qb[s] = query block of Q2K entry k2q_partial_idx[s].
__global__ void gather_kernel(const int32_t* __restrict__ idx, const int32_t* __restrict__ qb_of, int32_t* out,
                              long long n) {
  for (long long x = (long long)blockIdx.x * blockDim.x + threadIdx.x; x < n; x += (long long)gridDim.x * blockDim.x)
    out[x] = qb_of[idx[x]];
}

// K2Q full runs from the backward Q2K runs (plan_runs.h): one thread per Q2K row (hm, gq),
// query block i of sample b. Starts are the key blocks of runs(i) \ runs(i-1), ends those of
// runs(i) \ runs(i+1) (neighbours within the sample only). kEmit = false: counts per row
// (s_cnt, e_cnt). true: writes each event's K2Q row key and value (start: i, end: i + 1) at
// the scanned offsets, in (row, key block) order, so that a stable sort by key keeps each
// K2Q row's events in ascending query-block order and the k-th start pairs with the k-th end.
struct K2QEventArgs {
  int batch;
  const int32_t* qbs;  // backward block starts [B+1]
  const int32_t* kbs;
  long long nqb_all, nkb_all, rows;  // rows = Hmask * NQB
  const long long* f_ptr;             // Q2K full-run pointers (64-bit scratch) [rows + 1]
  const int32_t* runs;                // Q2K full runs (pairs)
  long long* s_cnt;                   // count pass
  long long* e_cnt;
  const long long* s_off;             // emit pass
  const long long* e_off;
  uint32_t* s_key;
  int32_t* s_val;
  uint32_t* e_key;
  int32_t* e_val;
};

template <bool kEmit>
__global__ void k2q_events_kernel(K2QEventArgs a) {
  for (long long row = (long long)blockIdx.x * blockDim.x + threadIdx.x; row < a.rows;
       row += (long long)gridDim.x * blockDim.x) {
    const long long hm = row / a.nqb_all, gq = row - hm * a.nqb_all;
    const int b = find_segment(a.qbs, a.batch, gq);
    const long long i = gq - a.qbs[b], nqb = a.qbs[b + 1] - a.qbs[b];
    const long long j0 = a.f_ptr[row], j1 = a.f_ptr[row + 1];
    const long long p0 = i > 0 ? a.f_ptr[row - 1] : j0;
    const long long n1 = i + 1 < nqb ? a.f_ptr[row + 2] : j1;
    const uint32_t key0 = (uint32_t)(hm * a.nkb_all + a.kbs[b]);
    if (!kEmit) {
      long long ns = 0, ne = 0;
      runs_minus(a.runs + 2 * j0, j1 - j0, a.runs + 2 * p0, j0 - p0, [&](int32_t lo, int32_t hi) { ns += hi - lo; });
      runs_minus(a.runs + 2 * j0, j1 - j0, a.runs + 2 * j1, n1 - j1, [&](int32_t lo, int32_t hi) { ne += hi - lo; });
      a.s_cnt[row] = ns;
      a.e_cnt[row] = ne;
    } else {
      long long s = a.s_off[row], e = a.e_off[row];
      runs_minus(a.runs + 2 * j0, j1 - j0, a.runs + 2 * p0, j0 - p0, [&](int32_t lo, int32_t hi) {
        for (int32_t kb = lo; kb < hi; ++kb, ++s) {
          a.s_key[s] = key0 + (uint32_t)kb;
          a.s_val[s] = (int32_t)i;
        }
      });
      runs_minus(a.runs + 2 * j0, j1 - j0, a.runs + 2 * j1, n1 - j1, [&](int32_t lo, int32_t hi) {
        for (int32_t kb = lo; kb < hi; ++kb, ++e) {
          a.e_key[e] = key0 + (uint32_t)kb;
          a.e_val[e] = (int32_t)(i + 1);
        }
      });
    }
  }
}

// K2Q run k = (sorted start value k, sorted end value k).
__global__ void interleave_runs_kernel(const int32_t* __restrict__ starts, const int32_t* __restrict__ ends,
                                       int32_t* runs, long long n) {
  for (long long x = (long long)blockIdx.x * blockDim.x + threadIdx.x; x < n; x += (long long)gridDim.x * blockDim.x) {
    runs[2 * x] = starts[x];
    runs[2 * x + 1] = ends[x];
  }
}

// Copies the K2Q event totals (last entries of the scans) into the header.
__global__ void finalize_k2q_header_kernel(Header* h, const long long* s_end, const long long* e_end) {
  h->k2q_starts = *s_end;
  h->k2q_ends = *e_end;
}

// Schedules. Task t enumerates (batch, head, block) in ascending order:
//   t = heads * starts[b] + head * nblk(b) + blk.
// Its cost sums the CSR row lengths (partial entries + full blocks of the runs) of rows
//   mask_head(h) * nblk_all + starts[b] + blk for h in [head*group, (head+1)*group).
struct ScheduleArgs {
  int batch, heads, group;
  bool shared_mask;  // Hmask == 1
  const int32_t* starts;
  long long nblk_all;
  const int32_t* p_ptr;
  const int32_t* f_ptr;  // run pointers
  const int32_t* runs;   // full runs (pairs)
  long long num_tasks;
};

__device__ __forceinline__ void decode_task(const ScheduleArgs& a, long long t, int* b, int* head, int* blk) {
  *b = find_segment(a.starts, a.batch, t, a.heads);
  const long long rem = t - (long long)a.heads * a.starts[*b];
  const int n = a.starts[*b + 1] - a.starts[*b];
  *head = (int)(rem / n);
  *blk = (int)(rem - (long long)(*head) * n);
}

// Sort key: (0xFFFFFFFF - cost) << 32 | t, so an ascending sort gives cost descending, then
// (batch, head, block) ascending.
__global__ void schedule_keys_kernel(ScheduleArgs a, unsigned long long* keys) {
  for (long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x; t < a.num_tasks;
       t += (long long)gridDim.x * blockDim.x) {
    int b, head, blk;
    decode_task(a, t, &b, &head, &blk);
    int32_t cost = 0;
    for (int h = head * a.group; h < (head + 1) * a.group; ++h) {
      const long long r = (a.shared_mask ? 0 : (long long)h) * a.nblk_all + a.starts[b] + blk;
      cost += (int32_t)(a.p_ptr[r + 1] - a.p_ptr[r] + run_blocks(a.runs, a.f_ptr[r], a.f_ptr[r + 1]));
    }
    keys[t] = ((unsigned long long)(0xFFFFFFFFu - (uint32_t)cost) << 32) | (unsigned long long)t;
  }
}

__global__ void schedule_write_kernel(ScheduleArgs a, const unsigned long long* __restrict__ keys, int32_t* tasks) {
  for (long long s = (long long)blockIdx.x * blockDim.x + threadIdx.x; s < a.num_tasks;
       s += (long long)gridDim.x * blockDim.x) {
    const unsigned long long k = keys[s];
    int b, head, blk;
    decode_task(a, (long long)(k & 0xFFFFFFFFull), &b, &head, &blk);
    tasks[4 * s + 0] = blk;
    tasks[4 * s + 1] = head;
    tasks[4 * s + 2] = b;
    tasks[4 * s + 3] = (int32_t)(0xFFFFFFFFu - (uint32_t)(k >> 32));
  }
}

}  // namespace plan_gpu
}  // namespace flashspan
