// The kernels' plan-reading cursor (kernels/common/block_range.cuh: BlockCursor, ItemCursor)
// run on the CPU over real host plans (plan format 2): for every Q2K row of both views and
// every K2Q row, next() must yield the row's partial entries (block, entry) and then the
// blocks of its full runs, and skip / remaining / done / ItemCursor (split items) must agree
// with that sequence for every begin and several counts. The device code is compiled here
// with __device__ / __ldg shims (the cursor is plain integer code).
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <tuple>
#include <vector>

#define __device__
#define __forceinline__ inline
struct int2 {
  int x, y;
};
template <class T>
inline T __ldg(const T* p) {
  return *p;
}
#include "kernels/common/block_range.cuh"

#include "dispatch/family.h"
#include "planner_masks.h"
#include "plan/planner.h"

namespace {

using flashspan::kern::BlockCursor;
using flashspan::kern::ItemCursor;
using Step = std::tuple<int, bool, int>;  // block, partial, entry (entries of partial steps only)

// The row's blocks in cursor order, from the arrays directly.
std::vector<Step> expected_row(const int32_t* pptr, const int32_t* pblk, const int32_t* fptr, const int32_t* runs,
                               int64_t r) {
  std::vector<Step> out;
  for (int e = pptr[r]; e < pptr[r + 1]; ++e) out.emplace_back(pblk[e], true, e);
  for (int j = fptr[r]; j < fptr[r + 1]; ++j)
    for (int x = runs[2 * j]; x < runs[2 * j + 1]; ++x) out.emplace_back(x, false, 0);
  return out;
}

template <class Cursor>
std::vector<Step> walk(Cursor c) {
  std::vector<Step> out;
  int blk = 0, entry = 0;
  bool partial = false;
  while (c.next(blk, partial, entry)) out.emplace_back(blk, partial, partial ? entry : 0);
  return out;
}

void check_rows(const int32_t* pptr, const int32_t* pblk, const int32_t* fptr, const int32_t* runs, int64_t rows,
                const char* what) {
  int failures = 0;
  for (int64_t r = 0; r < rows && failures < 5; ++r) {
    SCOPED_TRACE(::testing::Message() << what << " row " << r);
    const std::vector<Step> want = expected_row(pptr, pblk, fptr, runs, r);
    const BlockCursor row = BlockCursor::row(pptr, pblk, fptr, runs, r);
    const int n = int(want.size());
    EXPECT_EQ(row.remaining(), n);
    EXPECT_EQ(row.done(), n == 0);
    if (walk(row) != want) {
      ADD_FAILURE() << "next() order differs";
      ++failures;
      continue;
    }
    for (int begin = 0; begin <= n; ++begin) {
      BlockCursor c = row;
      c.skip(begin);
      EXPECT_EQ(c.remaining(), n - begin) << "skip(" << begin << ")";
      EXPECT_EQ(c.done(), begin == n) << "skip(" << begin << ")";
      const std::vector<Step> rest(want.begin() + begin, want.end());
      EXPECT_TRUE(walk(c) == rest) << "skip(" << begin << ") then next()";
      for (int count : {0, 1, 2, 3, n - begin, 0x7fffffff}) {
        if (count < 0) continue;
        const ItemCursor it = ItemCursor::make(row, begin, count);
        const int m = std::min(count, n - begin);
        EXPECT_EQ(it.remaining(), m);
        const std::vector<Step> slice(want.begin() + begin, want.begin() + begin + m);
        EXPECT_TRUE(walk(it) == slice) << "item [" << begin << ", +" << count << ")";
        // done() after each step is "that was the item's last block".
        ItemCursor c2 = it;
        int blk = 0, entry = 0, steps = 0;
        bool partial = false;
        while (c2.next(blk, partial, entry)) {
          ++steps;
          EXPECT_EQ(c2.done(), steps == m) << "done() after step " << steps;
        }
      }
    }
  }
}

TEST(BlockCursor, WalksPlansOfManyRunsMasks) {
  for (int nfunc : {1, 7, 31}) {
    SCOPED_TRACE("nfunc " + std::to_string(nfunc));
    const flashspan::FlexGeometry g = fs_test::make_geometry(true, {300, 90}, {1800, 700}, 2, 1, 2, nfunc);
    std::vector<std::vector<fs_test::SampleMask>> hs(2);
    uint64_t seed = 900 + nfunc;
    for (auto& h : hs) {
      h.push_back(fs_test::mask_many_runs(300, 1800, nfunc, seed++));
      h.push_back(fs_test::mask_many_runs(90, 700, nfunc, seed++));
    }
    const auto mask = fs_test::assemble_mask(g, hs);
    flashspan::PlanRequest req;
    req.geometry = &g;
    req.consumer = flashspan::consumer_for(80, 128, 128);
    req.build_backward = true;
    const auto plan = flashspan::build_mask_plan_host(req, mask.data(), false);
    const auto f = plan->fwd_view();
    check_rows(f.q2k_partial_ptr, f.q2k_partial_kb, f.q2k_full_ptr, f.q2k_full_runs, 2 * f.num_q_blocks, "fwd Q2K");
    const auto b = plan->bwd_view();
    check_rows(b.q2k_partial_ptr, b.q2k_partial_kb, b.q2k_full_ptr, b.q2k_full_runs, 2 * b.num_q_blocks, "bwd Q2K");
    check_rows(b.k2q_partial_ptr, b.k2q_partial_qb, b.k2q_full_ptr, b.k2q_full_runs, 2 * b.num_k_blocks, "K2Q");
    EXPECT_GT(plan->counts.fwd_full_runs, 0);
    EXPECT_GT(plan->counts.bwd_k2q_full_runs, 0);
  }
}

}  // namespace
