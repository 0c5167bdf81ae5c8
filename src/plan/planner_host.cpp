// Host mask planner: the CPU-plan builder and the oracle of the CUDA planner.
//
// Per (mask head, sample, query block) the Bq rows' visible key counts per key block are
// accumulated in a difference array: a row's visible set is a union of at most
// (nfunc+1)/2 disjoint intervals, and an interval adds its overlap to its first and last
// key block and Bk to every block strictly between (O(1) per interval via the difference
// array). One prefix sum over the sample's key blocks then gives every block's count:
// O(rows * nfunc + query blocks * key blocks) per view. A block is full iff its count is
// Bq*Bk (visible keys are always inside the sample, so this also means "inside both
// sequences"), empty iff 0, partial otherwise. Only partial blocks touch elements: their
// payload bits are set from the row intervals clipped to the block. Full blocks are stored
// as maximal runs (mask_plan.h); the K2Q full runs come from the Q2K runs by the events of
// plan_runs.h.
//
// The packed-GQA forward view (mask_plan.h) runs the same code over packed rows: a block's
// rows come from block_rows() (packed_rows.h), the mapping the CUDA planner also uses.
#include <algorithm>
#include <cstring>
#include <numeric>

#include "core/validation.h"
#include "core/error.h"
#include "plan/packed_rows.h"
#include "plan/plan_layout.h"
#include "plan/plan_runs.h"
#include "plan/planner.h"

namespace flashspan {
namespace {

// One Q2K relation at one tile shape (CSR over rows hm * NQB + gq; hm a virtual mask head
// of a packed view).
struct HostRelation {
  int bq = 0, bk = 0;
  std::vector<int32_t> qbs, kbs;            // block starts [B+1]
  std::vector<int32_t> p_ptr, f_ptr;        // [heads*NQB + 1]
  std::vector<int32_t> p_kb;                // sample-local key blocks
  std::vector<int32_t> f_runs;              // (first, end) pairs of full key blocks
  int64_t full_blocks = 0;
  std::vector<uint32_t> bits;               // payloads, CSR order
  int64_t visible = 0;                      // visible pairs summed over the CSR's (virtual) heads
};

// Adds the overlap of key interval [a, e) with every key block to `diff` (difference
// array over the sample's key blocks, size nkb + 1).
inline void add_interval(std::vector<int32_t>& diff, int64_t a, int64_t e, int bk) {
  if (a >= e) return;
  const int64_t ka = a / bk, ke = (e - 1) / bk;
  if (ka == ke) {
    diff[ka] += static_cast<int32_t>(e - a);
    diff[ka + 1] -= static_cast<int32_t>(e - a);
    return;
  }
  const int32_t first = static_cast<int32_t>((ka + 1) * bk - a);
  const int32_t last = static_cast<int32_t>(e - ke * bk);
  diff[ka] += first;
  diff[ka + 1] -= first;
  diff[ka + 1] += bk;  // blocks ka+1 .. ke-1 are fully covered by this row
  diff[ke] -= bk;
  diff[ke] += last;
  diff[ke + 1] -= last;
}

// `group` = G for the packed-GQA forward view, 1 otherwise.
// `view` ("forward" / "backward") names the view in the error raised when a list would pass
// kMaxListEntries (checked per query block, before the lists grow further).
void build_relation(const int32_t* mask, const FlexGeometry& g, int bq, int bk, int group, const char* view,
                    HostRelation& rel) {
  rel.bq = bq;
  rel.bk = bk;
  rel.qbs = block_starts(g.cu_seqlens_q, bq, group);
  rel.kbs = block_starts(g.cu_seqlens_k, bk);
  const int64_t nqb_all = rel.qbs.back();
  const int64_t T = g.total_q;
  const int nf = g.nfunc;
  const int words = payload_words(bq, bk);
  const int32_t full_count = bq * bk;
  const bool shared = g.num_heads_mask == 1;
  const int heads = shared ? 1 : g.num_heads_mask / group;
  rel.p_ptr.assign(heads * nqb_all + 1, 0);
  rel.f_ptr.assign(heads * nqb_all + 1, 0);
  rel.p_kb.clear();
  rel.f_runs.clear();
  rel.full_blocks = 0;
  rel.bits.clear();
  rel.visible = 0;

  std::vector<int32_t> diff;
  std::vector<int32_t> partial;  // partial key blocks of the current query block
  std::vector<int32_t> ep(nf);
  for (int hm = 0; hm < heads; ++hm) {
    for (int b = 0; b < g.batch; ++b) {
      const int64_t lq = g.seqlen_q(b) * group;  // (packed) rows of the sample
      const int64_t nkb = rel.kbs[b + 1] - rel.kbs[b];
      const int64_t nqb = rel.qbs[b + 1] - rel.qbs[b];
      for (int64_t i = 0; i < nqb; ++i) {
        const BlockRows br = block_rows(mask, T, nf, group, shared, hm, g.cu_seqlens_q[b], i * bq);
        const int64_t rows = std::min<int64_t>(bq, lq - i * bq);
        diff.assign(nkb + 1, 0);
        for (int64_t r = 0; r < rows; ++r) {
          const int32_t* e = br.row(static_cast<int>(r));
          add_interval(diff, 0, e[0], bk);
          for (int f = 1; f + 1 < nf; f += 2) add_interval(diff, e[int64_t(f) * T], e[int64_t(f + 1) * T], bk);
        }
        partial.clear();
        const int64_t csr_row = hm * nqb_all + rel.qbs[b] + i;
        int32_t count = 0;
        bool in_run = false;
        for (int64_t kb = 0; kb < nkb; ++kb) {
          count += diff[kb];
          rel.visible += count;
          const bool full = count == full_count;
          if (full) {
            ++rel.full_blocks;
            if (!in_run) rel.f_runs.push_back(static_cast<int32_t>(kb));
          } else {
            if (in_run) rel.f_runs.push_back(static_cast<int32_t>(kb));
            if (count > 0) partial.push_back(static_cast<int32_t>(kb));
          }
          in_run = full;
        }
        if (in_run) rel.f_runs.push_back(static_cast<int32_t>(nkb));
        check_list_entries(view, "full-run", int64_t(rel.f_runs.size() / 2), bq, bk, heads);
        check_list_entries(view, "partial", int64_t(rel.p_kb.size() + partial.size()), bq, bk, heads);
        rel.p_kb.insert(rel.p_kb.end(), partial.begin(), partial.end());
        rel.p_ptr[csr_row + 1] = static_cast<int32_t>(partial.size());
        rel.f_ptr[csr_row + 1] = static_cast<int32_t>(rel.f_runs.size() / 2);  // running total

        // Payloads: bit = 1 iff the element is visible (visible keys are in bounds).
        if (partial.empty()) continue;
        const size_t base = rel.bits.size();
        rel.bits.resize(base + partial.size() * words, 0u);
        uint32_t* out = rel.bits.data() + base;
        for (int64_t r = 0; r < rows; ++r) {
          const int32_t* e = br.row(static_cast<int>(r));
          for (int f = 0; f < nf; ++f) ep[f] = e[int64_t(f) * T];
          for (int f = -1; f + 1 < nf; f += 2) {
            const int64_t a = f < 0 ? 0 : ep[f], e = ep[f + 1];
            if (a >= e) continue;
            // First partial block that ends after a.
            auto it = std::lower_bound(partial.begin(), partial.end(), static_cast<int32_t>(a / bk));
            for (; it != partial.end() && int64_t(*it) * bk < e; ++it) {
              const int64_t c0 = int64_t(*it) * bk;
              const int64_t lo = std::max(a, c0), hi = std::min(e, c0 + bk);
              uint32_t* payload = out + (it - partial.begin()) * words;
              for (int64_t c = lo; c < hi; ++c) {
                const PayloadPos p = payload_position(static_cast<int>(r), static_cast<int>(c - c0), bk);
                payload[p.word] |= 1u << p.bit;
              }
            }
          }
        }
      }
    }
  }
  // Rows were filled in CSR order: partial sizes -> prefix sums; full holds running totals.
  for (size_t r = 1; r < rel.p_ptr.size(); ++r) rel.p_ptr[r] += rel.p_ptr[r - 1];
  // f_ptr[r+1] was set to the running total after row r; rows without query blocks do not
  // exist (every CSR row is a real query block), so it is already the CSR pointer.
}

// Fills a schedule: tasks enumerated in (batch, head, block) order with their cost, then
// stably sorted by cost descending. `cost(b, h, blk)`.
template <typename CostFn>
void build_schedule(int batch, int heads, const std::vector<int32_t>& starts, CostFn cost, int32_t* out) {
  struct Task {
    int32_t blk, head, b, cost;
  };
  std::vector<Task> tasks;
  tasks.reserve(static_cast<size_t>(heads) * starts.back());
  for (int b = 0; b < batch; ++b)
    for (int h = 0; h < heads; ++h)
      for (int32_t blk = 0; blk < starts[b + 1] - starts[b]; ++blk) tasks.push_back({blk, h, b, cost(b, h, blk)});
  std::stable_sort(tasks.begin(), tasks.end(), [](const Task& x, const Task& y) { return x.cost > y.cost; });
  for (size_t t = 0; t < tasks.size(); ++t) {
    out[4 * t + 0] = tasks[t].blk;
    out[4 * t + 1] = tasks[t].head;
    out[4 * t + 2] = tasks[t].b;
    out[4 * t + 3] = tasks[t].cost;
  }
}

int32_t* arr(MaskPlan& plan, const char* name) { return const_cast<int32_t*>(plan.array(name)); }

template <typename T>
void put(MaskPlan& plan, const char* name, const std::vector<T>& v) {
  int64_t count = 0;
  int32_t* dst = const_cast<int32_t*>(plan.array(name, &count));
  FS_CHECK(dst != nullptr && count == int64_t(v.size()), Status::kInternal, "planner: array ", name,
           " has the wrong size");
  if (!v.empty()) std::memcpy(dst, v.data(), v.size() * sizeof(int32_t));
}

}  // namespace

std::unique_ptr<MaskPlan> build_mask_plan_host(const PlanRequest& req, const int32_t* mask, bool keep_mask) {
  check_plan_request(req);
  const FlexGeometry& g = *req.geometry;
  FS_CHECK_ARG(mask != nullptr || g.total_q == 0, "mask_func: host endpoints are required");
  validate_endpoints_host(mask, g);

  auto plan = std::make_unique<MaskPlan>();
  plan->geometry = g;
  plan->signature.consumer = req.consumer;
  plan->signature.has_backward = req.build_backward;
  plan->signature.pack_gqa = plan_is_packed(req);
  const Consumer& c = req.consumer;
  const int pack = fwd_pack_group(g, plan->signature.pack_gqa);

  HostRelation fwd, bwd;
  build_relation(mask, g, c.fwd_block_q, c.fwd_block_k, pack, "forward", fwd);
  PlanCounts& n = plan->counts;
  n.fwd_num_q_blocks = fwd.qbs.back();
  n.fwd_num_k_blocks = fwd.kbs.back();
  n.fwd_partial = int64_t(fwd.p_kb.size());
  n.fwd_full = fwd.full_blocks;
  n.fwd_full_runs = int64_t(fwd.f_runs.size() / 2);
  // A packed view with one shared mask head holds every query row G times.
  n.visible_pairs = g.num_heads_mask == 1 ? fwd.visible / pack : fwd.visible;
  n.num_tasks = int64_t(g.num_heads_q / pack) * n.fwd_num_q_blocks;

  // K2Q (backward): transpose of the backward Q2K, rows hm * NKB + gk. Iterating Q2K rows in
  // ascending order keeps every K2Q row sorted by query block. Full runs: per Q2K row, the
  // K2Q run starts (runs(i) \ runs(i-1)) and ends (runs(i) \ runs(i+1)) of plan_runs.h.
  std::vector<int32_t> k2q_p_ptr, k2q_f_ptr, k2q_p_qb, k2q_p_idx, k2q_f_runs;
  if (req.build_backward) {
    build_relation(mask, g, c.bwd_block_q, c.bwd_block_k, 1, "backward", bwd);
    n.bwd_num_q_blocks = bwd.qbs.back();
    n.bwd_num_k_blocks = bwd.kbs.back();
    n.bwd_partial = int64_t(bwd.p_kb.size());
    n.bwd_full = bwd.full_blocks;
    n.bwd_full_runs = int64_t(bwd.f_runs.size() / 2);
    n.num_bwd_tasks = int64_t(g.num_heads_kv) * n.bwd_num_k_blocks;
    const int64_t NQB = n.bwd_num_q_blocks, NKB = n.bwd_num_k_blocks;
    k2q_p_ptr.assign(g.num_heads_mask * NKB + 1, 0);
    k2q_f_ptr.assign(g.num_heads_mask * NKB + 1, 0);
    k2q_p_qb.resize(bwd.p_kb.size());
    k2q_p_idx.resize(bwd.p_kb.size());

    // Pass 1: count per K2Q row; pass 2: scatter with per-row cursors.
    for (int pass = 0; pass < 2; ++pass) {
      std::vector<int32_t> pcur, fcur;
      if (pass == 1) {
        for (size_t r = 1; r < k2q_p_ptr.size(); ++r) k2q_p_ptr[r] += k2q_p_ptr[r - 1];
        for (size_t r = 1; r < k2q_f_ptr.size(); ++r) k2q_f_ptr[r] += k2q_f_ptr[r - 1];
        n.bwd_k2q_full_runs = k2q_f_ptr.back();
        check_list_entries("backward K2Q", "full-run", n.bwd_k2q_full_runs, c.bwd_block_q, c.bwd_block_k,
                           g.num_heads_mask);
        k2q_f_runs.assign(2 * size_t(n.bwd_k2q_full_runs), 0);
        pcur.assign(k2q_p_ptr.begin(), k2q_p_ptr.end() - 1);
        fcur.assign(k2q_f_ptr.begin(), k2q_f_ptr.end() - 1);
      }
      for (int hm = 0; hm < g.num_heads_mask; ++hm) {
        for (int b = 0; b < g.batch; ++b) {
          for (int32_t i = 0; i < bwd.qbs[b + 1] - bwd.qbs[b]; ++i) {
            const int64_t row = hm * NQB + bwd.qbs[b] + i;
            for (int32_t e = bwd.p_ptr[row]; e < bwd.p_ptr[row + 1]; ++e) {
              const int64_t kr = hm * NKB + bwd.kbs[b] + bwd.p_kb[e];
              if (pass == 0) {
                ++k2q_p_ptr[kr + 1];
              } else {
                k2q_p_qb[pcur[kr]] = i;
                k2q_p_idx[pcur[kr]++] = e;
              }
            }
            const int32_t nqb = bwd.qbs[b + 1] - bwd.qbs[b];
            const int32_t* runs = bwd.f_runs.data();
            const int64_t j0 = bwd.f_ptr[row], j1 = bwd.f_ptr[row + 1];
            const int64_t prev0 = i > 0 ? bwd.f_ptr[row - 1] : j0, next1 = i + 1 < nqb ? bwd.f_ptr[row + 2] : j1;
            const int64_t kr0 = hm * NKB + bwd.kbs[b];
            // Starts: one K2Q run per key block of runs(i) \ runs(i-1).
            runs_minus(runs + 2 * j0, j1 - j0, runs + 2 * prev0, j0 - prev0, [&](int32_t lo, int32_t hi) {
              for (int32_t kb = lo; kb < hi; ++kb) {
                if (pass == 0) {
                  ++k2q_f_ptr[kr0 + kb + 1];
                } else {
                  k2q_f_runs[2 * int64_t(fcur[kr0 + kb])] = i;  // the end is set by its end event
                }
              }
            });
            if (pass == 0) continue;
            // Ends: runs(i) \ runs(i+1); the run being closed is the last one started.
            runs_minus(runs + 2 * j0, j1 - j0, runs + 2 * j1, next1 - j1, [&](int32_t lo, int32_t hi) {
              for (int32_t kb = lo; kb < hi; ++kb) k2q_f_runs[2 * int64_t(fcur[kr0 + kb]++) + 1] = i + 1;
            });
          }
        }
      }
    }
  }

  assign_plan_layout(*plan, keep_mask);
  plan->host_buffer.assign(plan->buffer_elements, 0);
  put(*plan, "cu_seqlens_q", g.cu_seqlens_q);
  put(*plan, "cu_seqlens_k", g.cu_seqlens_k);
  put(*plan, "fwd_q_block_start", fwd.qbs);
  put(*plan, "fwd_k_block_start", fwd.kbs);
  put(*plan, "fwd_q2k_partial_ptr", fwd.p_ptr);
  put(*plan, "fwd_q2k_full_ptr", fwd.f_ptr);
  put(*plan, "fwd_q2k_partial_kb", fwd.p_kb);
  put(*plan, "fwd_q2k_full_runs", fwd.f_runs);
  put(*plan, "fwd_q2k_partial_bits", fwd.bits);
  {
    // Tasks over query heads, or kv heads of a packed view (CSR head 0 when Hmask == 1).
    const int64_t NQB = n.fwd_num_q_blocks;
    build_schedule(g.batch, g.num_heads_q / pack, fwd.qbs,
                   [&](int b, int h, int32_t i) {
                     const int64_t r = g.mask_head(h) * NQB + fwd.qbs[b] + i;
                     return int32_t(fwd.p_ptr[r + 1] - fwd.p_ptr[r] +
                                    run_blocks(fwd.f_runs.data(), fwd.f_ptr[r], fwd.f_ptr[r + 1]));
                   },
                   arr(*plan, "fwd_tasks"));
  }
  if (req.build_backward) {
    put(*plan, "bwd_q_block_start", bwd.qbs);
    put(*plan, "bwd_k_block_start", bwd.kbs);
    put(*plan, "bwd_q2k_partial_ptr", bwd.p_ptr);
    put(*plan, "bwd_q2k_full_ptr", bwd.f_ptr);
    put(*plan, "bwd_q2k_partial_kb", bwd.p_kb);
    put(*plan, "bwd_q2k_full_runs", bwd.f_runs);
    put(*plan, "bwd_q2k_partial_bits", bwd.bits);
    put(*plan, "bwd_k2q_partial_ptr", k2q_p_ptr);
    put(*plan, "bwd_k2q_full_ptr", k2q_f_ptr);
    put(*plan, "bwd_k2q_partial_qb", k2q_p_qb);
    put(*plan, "bwd_k2q_partial_idx", k2q_p_idx);
    put(*plan, "bwd_k2q_full_runs", k2q_f_runs);
    const int64_t NKB = n.bwd_num_k_blocks;
    const int group = g.group_size();
    build_schedule(g.batch, g.num_heads_kv, bwd.kbs,
                   [&](int b, int kvh, int32_t kb) {
                     int32_t cost = 0;
                     for (int h = kvh * group; h < (kvh + 1) * group; ++h) {
                       const int64_t r = g.mask_head(h) * NKB + bwd.kbs[b] + kb;
                       cost += int32_t(k2q_p_ptr[r + 1] - k2q_p_ptr[r] +
                                       run_blocks(k2q_f_runs.data(), k2q_f_ptr[r], k2q_f_ptr[r + 1]));
                     }
                     return cost;
                   },
                   arr(*plan, "bwd_tasks"));
  }
  if (keep_mask) {
    int64_t count = 0;
    int32_t* dst = const_cast<int32_t*>(plan->array("mask_func", &count));
    if (count > 0) std::memcpy(dst, mask, count * sizeof(int32_t));
  }
  return plan;
}

}  // namespace flashspan
