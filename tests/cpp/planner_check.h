// Brute-force checker of a host MaskPlan against its endpoints (planner tests, CPU and GPU).
//
// Independent of the planner: visibility is tested per element by walking the row's
// intervals, blocks are classified by counting their elements, and the CSR lists, payload
// bits, K2Q transpose, schedules and counts are rebuilt and compared. Packed-GQA forward
// views (mask_plan.h) are checked with the packed-row mapping written out here again
// (packed row P of CSR head vm = query P / G of mask head (Hmask == 1 ? 0 : vm*G + P % G)),
// not with the planner's packed_rows.h.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <tuple>
#include <vector>

#include "plan/mask_plan.h"
#include "plan/plan_runs.h"

namespace fs_test {

// Is key k visible for `row` of mask head hm? (interval walk, no parity trick)
inline bool visible(const int32_t* mask, const flashspan::FlexGeometry& g, int hm, int64_t row, int64_t k) {
  auto ep = [&](int f) { return int64_t(mask[(int64_t(hm) * g.nfunc + f) * g.total_q + row]); };
  if (k < ep(0)) return true;
  for (int f = 1; f + 1 < g.nfunc; f += 2)
    if (ep(f) <= k && k < ep(f + 1)) return true;
  return false;
}

// Expands runs [j0, j1) of a (first, end) pair list into blocks, checking that the runs are
// canonical: non-empty, ascending, disjoint and non-adjacent (maximal). `what` names the row.
inline std::vector<int32_t> expand_runs(const int32_t* runs, int64_t j0, int64_t j1, const std::string& what) {
  std::vector<int32_t> out;
  int64_t prev_end = -2;
  for (int64_t j = j0; j < j1; ++j) {
    const int32_t first = runs[2 * j], end = runs[2 * j + 1];
    EXPECT_LT(first, end) << what << ": empty run " << j;
    EXPECT_GT(first, prev_end) << what << ": run " << j << " not after (or adjacent to) the previous one";
    for (int32_t x = first; x < end; ++x) out.push_back(x);
    prev_end = end;
  }
  return out;
}

struct ViewNames {
  const char* prefix;
  int bq, bk;
};

// Query heads packed into one forward row group (G), 1 for unpacked views.
inline int packed_group(const flashspan::MaskPlan& plan, bool bwd) {
  return !bwd && plan.signature.pack_gqa ? plan.geometry.num_heads_q / plan.geometry.num_heads_kv : 1;
}

// Checks one view's Q2K (classes, order, payloads); returns the brute-force visible count
// over the view's rows (a packed view with Hmask == 1 counts every query row G times).
inline int64_t check_q2k_view(const flashspan::MaskPlan& plan, const int32_t* mask, bool bwd) {
  using namespace flashspan;
  const FlexGeometry& g = plan.geometry;
  const PlanViewPtrs v = bwd ? plan.bwd_view() : plan.fwd_view();
  const int bq = v.block_q, bk = v.block_k;
  const int words = payload_words(bq, bk);
  const int G = packed_group(plan, bwd);
  const bool shared = g.num_heads_mask == 1;
  const int heads = shared ? 1 : g.num_heads_mask / G;  // CSR (virtual) mask heads
  EXPECT_EQ(v.pack_group, G);
  EXPECT_EQ(v.num_mask_heads, heads);
  int64_t visible_total = 0;
  // Block starts.
  for (int b = 0; b <= g.batch; ++b) {
    int64_t sq = 0, sk = 0;
    for (int bb = 0; bb < b; ++bb) {
      sq += (g.seqlen_q(bb) * G + bq - 1) / bq;
      sk += (g.seqlen_k(bb) + bk - 1) / bk;
    }
    EXPECT_EQ(v.q_block_start[b], sq) << "q_block_start[" << b << "]";
    EXPECT_EQ(v.k_block_start[b], sk) << "k_block_start[" << b << "]";
  }
  EXPECT_EQ(v.num_q_blocks, v.q_block_start[g.batch]);
  EXPECT_EQ(v.num_k_blocks, v.k_block_start[g.batch]);
  EXPECT_EQ(v.q2k_partial_ptr[0], 0);
  EXPECT_EQ(v.q2k_full_ptr[0], 0);
  int failures = 0;
  for (int hm = 0; hm < heads && failures < 10; ++hm) {
    for (int b = 0; b < g.batch; ++b) {
      const int64_t lq = g.seqlen_q(b) * G, lk = g.seqlen_k(b);  // (packed) rows, keys
      const int64_t nqb = (lq + bq - 1) / bq, nkb = (lk + bk - 1) / bk;
      for (int64_t i = 0; i < nqb; ++i) {
        const int64_t r = hm * v.num_q_blocks + v.q_block_start[b] + i;
        std::vector<int32_t> exp_p, exp_f;
        std::vector<std::vector<uint32_t>> exp_bits;
        for (int64_t kb = 0; kb < nkb; ++kb) {
          std::vector<uint32_t> bits(words, 0u);
          int64_t n = 0;
          for (int rr = 0; rr < bq; ++rr) {
            const int64_t q = i * bq + rr;  // packed row when G > 1
            if (q >= lq) continue;
            const int mh = shared ? 0 : hm * G + int(q % G);
            for (int cc = 0; cc < bk; ++cc) {
              const int64_t k = kb * bk + cc;
              if (k >= lk) continue;
              if (visible(mask, g, mh, g.cu_seqlens_q[b] + q / G, k)) {
                ++n;
                const PayloadPos p = payload_position(rr, cc, bk);
                bits[p.word] |= 1u << p.bit;
              }
            }
          }
          visible_total += n;
          if (n == int64_t(bq) * bk) {
            exp_f.push_back(int32_t(kb));
          } else if (n > 0) {
            exp_p.push_back(int32_t(kb));
            exp_bits.push_back(bits);
          }
        }
        const std::vector<int32_t> got_p(v.q2k_partial_kb + v.q2k_partial_ptr[r],
                                         v.q2k_partial_kb + v.q2k_partial_ptr[r + 1]);
        const std::vector<int32_t> got_f =
            expand_runs(v.q2k_full_runs, v.q2k_full_ptr[r], v.q2k_full_ptr[r + 1], "Q2K full runs");
        if (got_p != exp_p || got_f != exp_f) {
          ADD_FAILURE() << (bwd ? "bwd" : "fwd") << " Q2K row hm=" << hm << " b=" << b << " qb=" << i
                        << ": partial/full lists differ from brute force (" << got_p.size() << "/" << got_f.size()
                        << " vs " << exp_p.size() << "/" << exp_f.size() << ")";
          ++failures;
          continue;
        }
        for (size_t e = 0; e < exp_p.size(); ++e) {
          const uint32_t* got = v.q2k_partial_bits + int64_t(v.q2k_partial_ptr[r] + e) * words;
          if (!std::equal(exp_bits[e].begin(), exp_bits[e].end(), got)) {
            ADD_FAILURE() << (bwd ? "bwd" : "fwd") << " payload of hm=" << hm << " b=" << b << " qb=" << i
                          << " kb=" << exp_p[e] << " differs from the endpoints";
            ++failures;
          }
        }
      }
    }
  }
  EXPECT_EQ(v.q2k_partial_ptr[heads * v.num_q_blocks], plan.counts.fwd_partial * !bwd + plan.counts.bwd_partial * bwd);
  EXPECT_EQ(v.q2k_full_ptr[heads * v.num_q_blocks],
            plan.counts.fwd_full_runs * !bwd + plan.counts.bwd_full_runs * bwd);
  EXPECT_EQ(flashspan::run_blocks(v.q2k_full_runs, 0, v.q2k_full_ptr[heads * v.num_q_blocks]),
            plan.counts.fwd_full * !bwd + plan.counts.bwd_full * bwd);
  int64_t n = 0;
  plan.array(bwd ? "bwd_q2k_partial_ptr" : "fwd_q2k_partial_ptr", &n);
  EXPECT_EQ(n, heads * v.num_q_blocks + 1);
  return visible_total;
}

// K2Q must be the transpose of the backward Q2K, each row ascending, idx pointing at the pair.
inline void check_k2q(const flashspan::MaskPlan& plan) {
  using namespace flashspan;
  const FlexGeometry& g = plan.geometry;
  const PlanViewPtrs v = plan.bwd_view();
  const int64_t NQB = v.num_q_blocks, NKB = v.num_k_blocks;
  std::vector<std::vector<std::pair<int32_t, int32_t>>> tp(g.num_heads_mask * NKB), tf(g.num_heads_mask * NKB);
  for (int hm = 0; hm < g.num_heads_mask; ++hm)
    for (int b = 0; b < g.batch; ++b)
      for (int32_t i = 0; i < v.q_block_start[b + 1] - v.q_block_start[b]; ++i) {
        const int64_t r = hm * NQB + v.q_block_start[b] + i;
        for (int32_t e = v.q2k_partial_ptr[r]; e < v.q2k_partial_ptr[r + 1]; ++e)
          tp[hm * NKB + v.k_block_start[b] + v.q2k_partial_kb[e]].push_back({i, e});
        for (int32_t kb : expand_runs(v.q2k_full_runs, v.q2k_full_ptr[r], v.q2k_full_ptr[r + 1], "Q2K full runs"))
          tf[hm * NKB + v.k_block_start[b] + kb].push_back({i, 0});
      }
  int failures = 0;
  for (int64_t kr = 0; kr < g.num_heads_mask * NKB && failures < 10; ++kr) {
    std::vector<std::pair<int32_t, int32_t>> gp, gf;
    for (int32_t s = v.k2q_partial_ptr[kr]; s < v.k2q_partial_ptr[kr + 1]; ++s)
      gp.push_back({v.k2q_partial_qb[s], v.k2q_partial_idx[s]});
    for (int32_t qb : expand_runs(v.k2q_full_runs, v.k2q_full_ptr[kr], v.k2q_full_ptr[kr + 1], "K2Q full runs"))
      gf.push_back({qb, 0});
    if (gp != tp[kr] || gf != tf[kr]) {
      ADD_FAILURE() << "K2Q row " << kr << " is not the transpose of Q2K";
      ++failures;
    }
  }
  EXPECT_EQ(v.k2q_partial_ptr[0], 0);
  EXPECT_EQ(v.k2q_full_ptr[0], 0);
  EXPECT_EQ(v.k2q_full_ptr[g.num_heads_mask * NKB], plan.counts.bwd_k2q_full_runs);
}

// A schedule must list every (batch, head, block) once, with the right cost, sorted by cost
// descending then (batch, head, block) ascending.
template <typename CostFn>
void check_schedule(const int32_t* tasks, int64_t num_tasks, const flashspan::FlexGeometry& g, int heads,
                    const int32_t* starts, CostFn cost, const char* what) {
  int64_t expected = 0;
  for (int b = 0; b < g.batch; ++b) expected += int64_t(heads) * (starts[b + 1] - starts[b]);
  ASSERT_EQ(num_tasks, expected) << what;
  std::vector<std::tuple<int32_t, int32_t, int32_t, int32_t>> seen;
  std::vector<std::tuple<int32_t, int32_t, int32_t, int32_t>> want;
  for (int64_t t = 0; t < num_tasks; ++t) {
    const int32_t blk = tasks[4 * t], h = tasks[4 * t + 1], b = tasks[4 * t + 2], c = tasks[4 * t + 3];
    ASSERT_TRUE(b >= 0 && b < g.batch && h >= 0 && h < heads && blk >= 0 && blk < starts[b + 1] - starts[b])
        << what << " task " << t << " out of range";
    EXPECT_EQ(c, cost(b, h, blk)) << what << " task " << t << " cost";
    seen.push_back({-c, b, h, blk});
  }
  for (int b = 0; b < g.batch; ++b)
    for (int h = 0; h < heads; ++h)
      for (int32_t blk = 0; blk < starts[b + 1] - starts[b]; ++blk) want.push_back({-cost(b, h, blk), b, h, blk});
  std::sort(want.begin(), want.end());
  EXPECT_TRUE(seen == want) << what << ": not sorted by (cost desc, batch, head, block) or incomplete";
}

// Full check of a host plan against its endpoints.
inline void check_plan(const flashspan::MaskPlan& plan, const int32_t* mask) {
  using namespace flashspan;
  ASSERT_FALSE(plan.on_device());
  const FlexGeometry& g = plan.geometry;
  int64_t n = 0;
  const int32_t* cq = plan.array("cu_seqlens_q", &n);
  ASSERT_EQ(n, g.batch + 1);
  EXPECT_TRUE(std::equal(g.cu_seqlens_q.begin(), g.cu_seqlens_q.end(), cq));
  const int32_t* ck = plan.array("cu_seqlens_k", &n);
  ASSERT_EQ(n, g.batch + 1);
  EXPECT_TRUE(std::equal(g.cu_seqlens_k.begin(), g.cu_seqlens_k.end(), ck));
  for (const PlanArray& a : plan.arrays) {
    EXPECT_EQ(a.offset % 32, 0) << a.name;
    EXPECT_LE(a.offset + a.count, plan.buffer_elements) << a.name;
  }

  // Packed plans only exist for G > 1.
  if (plan.signature.pack_gqa) {
    EXPECT_GT(g.num_heads_q / g.num_heads_kv, 1);
  }
  const int G = packed_group(plan, false);
  const int64_t vis = check_q2k_view(plan, mask, false);
  // visible_pairs counts over the Hmask mask heads, packed or not.
  EXPECT_EQ(plan.counts.visible_pairs * (g.num_heads_mask == 1 ? G : 1), vis);
  const PlanViewPtrs f = plan.fwd_view();
  // Packed: tasks over the Hkv heads, kv head h on CSR head (Hmask == 1 ? 0 : h).
  check_schedule(f.tasks, f.num_tasks, g, g.num_heads_q / G, f.q_block_start,
                 [&](int b, int h, int32_t i) {
                   const int64_t r = g.mask_head(h) * f.num_q_blocks + f.q_block_start[b] + i;
                   return int32_t(f.q2k_partial_ptr[r + 1] - f.q2k_partial_ptr[r] +
                                  flashspan::run_blocks(f.q2k_full_runs, f.q2k_full_ptr[r], f.q2k_full_ptr[r + 1]));
                 },
                 "fwd_tasks");
  if (!plan.signature.has_backward) {
    EXPECT_THROW(plan.bwd_view(), Error);
    EXPECT_EQ(plan.array("bwd_tasks"), nullptr);
    return;
  }
  EXPECT_EQ(check_q2k_view(plan, mask, true), plan.counts.visible_pairs);
  check_k2q(plan);
  const PlanViewPtrs bv = plan.bwd_view();
  const int group = g.group_size();
  check_schedule(bv.tasks, bv.num_tasks, g, g.num_heads_kv, bv.k_block_start,
                 [&](int b, int kvh, int32_t kb) {
                   int32_t c = 0;
                   for (int h = kvh * group; h < (kvh + 1) * group; ++h) {
                     const int64_t r = g.mask_head(h) * bv.num_k_blocks + bv.k_block_start[b] + kb;
                     c += int32_t(bv.k2q_partial_ptr[r + 1] - bv.k2q_partial_ptr[r] +
                                  flashspan::run_blocks(bv.k2q_full_runs, bv.k2q_full_ptr[r], bv.k2q_full_ptr[r + 1]));
                   }
                   return c;
                 },
                 "bwd_tasks");
}

}  // namespace fs_test
