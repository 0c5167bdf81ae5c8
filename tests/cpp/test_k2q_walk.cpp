// The deterministic backward's K2Q walk (kernels/common/k2q_walk.cuh: K2QWalkAscending) run on
// the CPU over real host plans: for every (key block, kv head, sample) and every begin, seek(begin)
// then next() must give the pairs begin, begin + 1, ... of the walk from 0 (the split items of the
// deterministic sm90 backward start inside walks; seek skips heads by their pair counts and runs
// by binary search instead of walking). The device code is compiled here with __device__ /
// __ldg shims (plain integer code), as test_block_cursor.cpp does for the cursor.
#include <gtest/gtest.h>

#include <algorithm>
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
using std::min;
#include "kernels/common/k2q_walk.cuh"

#include "dispatch/family.h"
#include "planner_masks.h"
#include "plan/planner.h"

namespace {

using Pair = std::tuple<int, int, int>;  // query head, query block, payload index

std::vector<Pair> walk(const flashspan::BwdParams& p, int kb, int hkv, int b, int begin, int count) {
  flashspan::kern::K2QWalkAscending w{&p, hkv * p.group_size, (hkv + 1) * p.group_size, b, kb, count};
  w.seek(begin);
  std::vector<Pair> out;
  int h = 0, qb = 0, payload = -1;
  while (w.next(h, qb, payload)) out.emplace_back(h, qb, payload);
  return out;
}

void check_plan(const flashspan::FlexGeometry& g, const std::vector<int32_t>& mask, const char* what) {
  flashspan::PlanRequest req;
  req.geometry = &g;
  req.consumer = flashspan::consumer_for(90, 128, 128);
  req.build_backward = true;
  const auto plan = flashspan::build_mask_plan_host(req, mask.data(), false);
  flashspan::BwdParams p;
  p.view = plan->bwd_view();
  p.group_size = g.num_heads_q / g.num_heads_kv;
  p.mask_per_head = g.num_heads_mask == 1 ? 0 : 1;
  p.batch = g.batch;
  int checked = 0, failures = 0;
  for (int b = 0; b < g.batch && failures < 5; ++b) {
    const int nkb = p.view.k_block_start[b + 1] - p.view.k_block_start[b];
    for (int kb = 0; kb < nkb && failures < 5; ++kb) {
      for (int hkv = 0; hkv < g.num_heads_kv && failures < 5; ++hkv) {
        SCOPED_TRACE(::testing::Message() << what << " sample " << b << " kb " << kb << " hkv " << hkv);
        const std::vector<Pair> all = walk(p, kb, hkv, b, 0, 0x7fffffff);
        // Ascending query blocks within each head.
        for (size_t i = 1; i < all.size(); ++i) {
          if (std::get<0>(all[i]) == std::get<0>(all[i - 1])) {
            EXPECT_LT(std::get<1>(all[i - 1]), std::get<1>(all[i]));
          }
        }
        const int n = int(all.size());
        for (int begin = 0; begin <= n + 1; ++begin) {
          for (int count : {1, 3, 16, 0x7fffffff}) {
            const std::vector<Pair> got = walk(p, kb, hkv, b, begin, count);
            const int lo = std::min(begin, n), hi = int(std::min<int64_t>(int64_t(begin) + count, n));
            const std::vector<Pair> want(all.begin() + lo, all.begin() + hi);
            if (got != want) {
              ADD_FAILURE() << "seek(" << begin << ") + " << count << " pairs differ from the walk's slice";
              ++failures;
            }
            ++checked;
          }
        }
      }
    }
  }
  EXPECT_GT(checked, 0);
}

TEST(K2QWalkAscendingCpu, SeekEqualsWalk) {
  // Benchmark masks with long partial walks (sink_local's key block 0), runs and global rows
  // (longformer), GQA groups of 2.
  for (const char* m : {"sink_local", "longformer", "tree_bfs", "document_causal"}) {
    const int64_t s = 2048;
    flashspan::FlexGeometry g = fs_test::make_geometry(false, {s}, {s}, 4, 2, 1, 0);
    const fs_test::SampleMask sm = fs_test::mask_by_name(m, s);
    g.nfunc = sm.nfunc;
    check_plan(g, fs_test::assemble_mask(g, {{sm}}), m);
  }
  // Many full runs per row, THD with two samples, per-head masks (Hmask = Hq), GQA 2.
  for (int nfunc : {7, 31}) {
    const flashspan::FlexGeometry g = fs_test::make_geometry(true, {300, 900}, {1800, 700}, 4, 2, 4, nfunc);
    std::vector<std::vector<fs_test::SampleMask>> hs(4);
    uint64_t seed = 1300 + nfunc;
    for (auto& h : hs) {
      h.push_back(fs_test::mask_many_runs(300, 1800, nfunc, seed++));
      h.push_back(fs_test::mask_many_runs(900, 700, nfunc, seed++));
    }
    check_plan(g, fs_test::assemble_mask(g, hs), "many_runs");
  }
}

}  // namespace
