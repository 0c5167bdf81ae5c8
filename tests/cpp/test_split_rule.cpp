// The split schedule's chunk rules (kernels/common/split_rule.h) on the CPU: the plan-only rule
// of the deterministic sm90 backward on step counts shaped like the benchmark masks (one task per
// (key block, kv head) cell in descending key-block order, steps = (query head, query block)
// pairs of the cell's K2Q walk at the sm90 backward tile 64 x 128), its bounds, the workspace's
// room for its items and slots (dispatch/workspace.h), and known values of the per-grid rule.
// The scan kernel (split_schedule.cuh) runs the same functions on the device.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "dispatch/family.h"
#include "dispatch/workspace.h"
#include "kernels/common/split_rule.h"
#include "kernels/sm90/launch_sm90.h"  // the deterministic cut's switches
#include "scoped_env.h"
#include "plan/planner.h"
#include "planner_masks.h"

namespace flashspan {
namespace {

// The schedule the scan and items kernels build from task_iters with the plan-only rule.
struct PlanOnlySchedule {
  int64_t total = 0, chunk = 0, above = 0, items = 0, split_items = 0, split_tasks = 0;
  int64_t min_split_item = INT64_MAX;  // fewest steps of an item of a split task
};

PlanOnlySchedule plan_only(const std::vector<int32_t>& iters, int64_t above_mean = 2) {
  PlanOnlySchedule s;
  for (int32_t it : iters) s.total += it;
  const int64_t tasks = int64_t(iters.size());
  const kern::SplitCut first = kern::split_cut_plan_only_first(s.total, tasks, above_mean);
  int64_t at_first = 0;
  for (int32_t it : iters) {
    if (it > first.above) at_first += kern::split_items(it, first);
  }
  const kern::SplitCut cut = kern::split_cut_plan_only(s.total, tasks, first, at_first, above_mean);
  s.chunk = cut.chunk;
  s.above = cut.above;
  EXPECT_GE(cut.above, cut.chunk);
  for (int32_t it : iters) {
    const int64_t n = kern::split_items(it, cut);
    s.items += n;
    if (it > cut.above) {
      s.split_items += n;
      ++s.split_tasks;
      // Items [i it / n, (i + 1) it / n) (write_split_items): the shortest is floor(it / n).
      s.min_split_item = std::min<int64_t>(s.min_split_item, it / n);
    }
  }
  return s;
}

// Steps of every cell (descending key blocks, heads fastest) of an S-long sample, H heads (MHA),
// tile 64 x 128, for a mask given as "query blocks that see key block kb".
template <class F>
std::vector<int32_t> cells(int64_t s, int heads, F walk) {
  const int64_t nkb = s / 128, nqb = s / 64;
  std::vector<int32_t> v;
  for (int64_t kb = nkb - 1; kb >= 0; --kb) {
    for (int h = 0; h < heads; ++h) v.push_back(int32_t(walk(kb, nqb)));
  }
  return v;
}

std::vector<int32_t> mask_cells(const std::string& m, int64_t s, int heads) {
  const int64_t win = 16;  // a 1024-key window: about 16 + 2 query blocks per key block
  if (m == "causal") return cells(s, heads, [](int64_t kb, int64_t nqb) { return nqb - 2 * kb; });
  if (m == "sink_local") {
    return cells(s, heads, [&](int64_t kb, int64_t nqb) { return kb == 0 ? nqb : std::min(nqb - 2 * kb, win + 2); });
  }
  if (m == "longformer") {  // 8 global tokens (one key block and one query block each), window 2 x 256
    const int64_t nkb = s / 128;
    return cells(s, heads, [&](int64_t kb, int64_t nqb) {
      const bool global = kb % (nkb / 8) == nkb / 16;
      return global ? nqb : 8 + std::min<int64_t>(nqb - 2 * kb, 10);
    });
  }
  if (m == "dense") return cells(s, heads, [](int64_t, int64_t nqb) { return nqb; });
  ADD_FAILURE() << "unknown mask " << m;
  return {};
}

FlexGeometry geometry(int64_t s, int heads) {
  FlexGeometry g;
  g.batch = 1;
  g.max_seqlen_q = g.max_seqlen_k = s;
  g.total_q = g.total_k = s;
  g.num_heads_q = g.num_heads_kv = heads;
  g.num_heads_mask = 1;
  g.nfunc = 1;
  g.head_dim_qk = g.head_dim_v = 128;
  g.dtype = DType::kBFloat16;
  return g;
}

TEST(SplitRule, PlanOnlyBoundsAndWorkspace) {
  PlanSignature sig;
  sig.consumer.arch = 90;  // the sm90 backward tile 64 x 128
  for (const char* m : {"causal", "sink_local", "longformer", "dense"}) {
    for (int64_t s : {2048, 8192, 32768, 131072}) {
      for (int heads : {1, 4, 16}) {
        SCOPED_TRACE(testing::Message() << m << " S=" << s << " H=" << heads);
        const std::vector<int32_t> it = mask_cells(m, s, heads);
        const PlanOnlySchedule p = plan_only(it);
        const int64_t n = int64_t(it.size());
        EXPECT_GE(p.chunk, SplitSchedule::kChunkMin);
        EXPECT_LE(p.items, n + kern::kPlanOnlyItemsPerCta * kern::kPlanOnlyCtas);
        EXPECT_LT(p.split_items, SplitSchedule::kMaxSplit);
        if (p.split_tasks > 0) {
          EXPECT_GE(p.min_split_item, 8);
        }
        const BwdWorkspaceLayout w = bwd_workspace_layout(geometry(s, heads), sig, true);
        EXPECT_GE(w.max_tasks, n);
        EXPECT_GE(w.max_items, p.items);
        EXPECT_GE(w.max_split, p.split_items);
        EXPECT_GT(w.dq_sem, w.dq_accum);
        EXPECT_GT(w.dk_accum, w.items);
      }
    }
  }
}

// The sm90 backward runs head dims below its kernels' on the (64, 64) / (128, 128) kernel, whose dQ
// tiles are the kernel's width: the workspace holds them (64 x kd floats per query block and head),
// deterministic or not, while the split slots stay rows of the call's dims.
TEST(SplitRule, SmallerHeadDimsGetKernelWideDqTiles) {
  PlanSignature sig;
  sig.consumer.arch = 90;
  sig.consumer.bwd_block_q = 64;
  sig.consumer.bwd_block_k = 128;
  for (const auto& d : {std::pair{96, 96}, std::pair{40, 72}, std::pair{8, 8}, std::pair{128, 64}}) {
    FlexGeometry g = geometry(1000, 3);
    g.head_dim_qk = d.first;
    g.head_dim_v = d.second;
    const int kd = d.first <= 64 && d.second <= 64 ? 64 : 128;
    ASSERT_TRUE(sm90::bwd_runs_head_dims_sm90(d.first, d.second));
    EXPECT_EQ(sm90::bwd_kernel_dims_sm90(d.first, d.second).dqk, kd);
    const size_t tiles = sizeof(float) * 3 * ((1000 + 63) / 64) * 64 * size_t(kd);
    for (bool det : {false, true}) {
      SCOPED_TRACE(testing::Message() << d.first << "x" << d.second << " det " << det);
      const BwdWorkspaceLayout w = bwd_workspace_layout(g, sig, det);
      const size_t dq_end = det ? w.dq_sem : w.split_at;
      EXPECT_GE(dq_end - w.dq_accum, tiles);
      EXPECT_EQ(w.dv_accum - w.dk_accum, ws_align(sizeof(float) * size_t(w.max_split) * 128 * size_t(d.first)));
    }
  }
}

// What the rule is for: sink_local's key block 0 (every query block, the last cells of the
// descending order) is cut into kChunkMin-step items, longformer's 8 global key blocks too, while
// the window cells (under twice the mean) and causal walks stay whole at the benchmark's sizes.
TEST(SplitRule, PlanOnlySplitsSinksNotCausal) {
  {
    const PlanOnlySchedule p = plan_only(mask_cells("sink_local", 32768, 4));
    EXPECT_EQ(p.chunk, SplitSchedule::kChunkMin);
    EXPECT_EQ(p.split_tasks, 4);         // key block 0 of each head
    EXPECT_EQ(p.split_items, 4 * 32);    // 512 query blocks / 16
  }
  {
    const PlanOnlySchedule p = plan_only(mask_cells("longformer", 32768, 4));
    EXPECT_EQ(p.split_tasks, 4 * 8);  // the 8 global key blocks of each head
    EXPECT_LE(p.chunk, 20);           // total / 2112 steps: 512-step walks in about 30 items
  }
  for (int64_t s : {8192, 32768, 131072}) {
    const PlanOnlySchedule p = plan_only(mask_cells("causal", s, 4));
    EXPECT_EQ(p.split_tasks, 0) << "S=" << s << " chunk " << p.chunk;
  }
}

// The plan-only rule reads no grid: the same counts give the same chunk whatever the GPU (the
// rule takes no CTA count at all); the per-grid rule's known values (split_rule.h comments).
TEST(SplitRule, PerGridRuleKnownValues) {
  // Packed decode: 32 tasks of 512 steps on 792 CTAs -> at most one item per CTA: chunk 22.
  EXPECT_EQ(kern::split_chunk(32 * 512, 32, 792), 22);
  // Enough tasks: walks under twice the mean stay whole.
  EXPECT_EQ(kern::split_chunk(1000 * 40, 1000, 132), 80);
  // Floor.
  EXPECT_EQ(kern::split_chunk(100, 200, 132), SplitSchedule::kChunkMin);
  EXPECT_EQ(kern::split_items(16, kern::SplitCut{16, 16}), 1);
  EXPECT_EQ(kern::split_items(17, kern::SplitCut{16, 16}), 2);
  EXPECT_EQ(kern::split_items(40, kern::SplitCut{16, 40}), 1);  // not above: whole
  EXPECT_EQ(kern::split_items(512, kern::SplitCut{16, 40}), 32);
}

// Steps of every cell of a real host plan (sm90 consumer, one sample, Hmask = 1) in the
// deterministic list's order (descending key blocks, kv heads fastest): the K2Q row's partial
// entries and full-run blocks, times the group's query heads.
std::vector<int32_t> plan_cells(const std::string& mask, int64_t s, int hq, int hkv, int d = 128) {
  const FlexGeometry g = fs_test::make_geometry(false, {s}, {s}, hq, hkv, 1, 0);
  const fs_test::SampleMask m = fs_test::mask_by_name(mask, s);
  FlexGeometry g2 = g;
  g2.nfunc = m.nfunc;
  const std::vector<int32_t> ep = fs_test::assemble_mask(g2, {{m}});
  PlanRequest req;
  req.geometry = &g2;
  req.consumer = consumer_for(90, d, d);  // d = 64: the wide 128 x 128 tile when it is on
  req.build_backward = true;
  const auto plan = build_mask_plan_host(req, ep.data(), false);
  const auto b = plan->bwd_view();
  std::vector<int32_t> v;
  for (int64_t kb = b.num_k_blocks - 1; kb >= 0; --kb) {
    int32_t n = b.k2q_partial_ptr[kb + 1] - b.k2q_partial_ptr[kb];
    for (int j = b.k2q_full_ptr[kb]; j < b.k2q_full_ptr[kb + 1]; ++j) {
      n += b.k2q_full_runs[2 * j + 1] - b.k2q_full_runs[2 * j];
    }
    for (int h = 0; h < hkv; ++h) v.push_back(n * (hq / hkv));
  }
  return v;
}

// The cases of FlexGpuSm90.BwdDeterministic split (their plans, on the CPU), and the benchmark's
// S = 32768 plans split where the synthetic counts above say (causal whole; document_causal's
// longest walks, the first key blocks of long documents, are cut).
TEST(SplitRule, PlanOnlyOnRealPlans) {
  {
    const PlanOnlySchedule p = plan_only(plan_cells("sink_local", 2048, 4, 2));
    EXPECT_GT(p.split_tasks, 0) << "chunk " << p.chunk << " above " << p.above;
  }
  {
    const PlanOnlySchedule p = plan_only(plan_cells("sink_local", 2048, 4, 1, 64));  // D = 64
    EXPECT_GT(p.split_tasks, 0) << "chunk " << p.chunk << " above " << p.above;
  }
  {
    const PlanOnlySchedule p = plan_only(plan_cells("sink_local", 1024, 2, 1));  // BwdSanitizerSmall
    EXPECT_GT(p.split_tasks, 0) << "chunk " << p.chunk << " above " << p.above;
  }
  {
    const PlanOnlySchedule p = plan_only(plan_cells("longformer", 4096, 2, 1));
    EXPECT_GT(p.split_tasks, 0) << "chunk " << p.chunk << " above " << p.above;
  }
  {
    const PlanOnlySchedule p = plan_only(plan_cells("sink_local", 32768, 4, 4));
    EXPECT_EQ(p.split_tasks, 4) << "chunk " << p.chunk << " above " << p.above;
    EXPECT_EQ(p.chunk, SplitSchedule::kChunkMin);
  }
  {
    const PlanOnlySchedule p = plan_only(plan_cells("longformer", 32768, 4, 4));
    EXPECT_EQ(p.split_tasks, 4 * 8) << "chunk " << p.chunk << " above " << p.above;
  }
  {
    const PlanOnlySchedule p = plan_only(plan_cells("causal", 32768, 4, 4));
    EXPECT_EQ(p.split_tasks, 0) << "chunk " << p.chunk << " above " << p.above;
  }
  {
    // The first key blocks of the long documents (walks over 2x the mean) are cut.
    const PlanOnlySchedule p = plan_only(plan_cells("document_causal", 32768, 4, 4));
    EXPECT_LT(p.split_items, SplitSchedule::kMaxSplit);
    EXPECT_LE(p.items, 4 * 256 + kern::kPlanOnlyItemsPerCta * kern::kPlanOnlyCtas);
  }
}

// The deterministic backward's order rule on the benchmark plans: causal (and local, whose walks are all
// equal) keep the snake waves, the six others are uneven and claim their items in list order.
TEST(SplitRule, UnevenWalksOnBenchmarkPlans) {
  for (const char* m : {"causal", "document_causal", "local", "sink_local", "tree_dfs", "tree_bfs", "longformer",
                        "hstu"}) {
    for (int64_t s : {8192, 32768}) {
      const std::vector<int32_t> cells = plan_cells(m, s, 4, 4);
      int64_t total = 0, longest = 0;
      for (int32_t it : cells) {
        total += it;
        longest = std::max<int64_t>(longest, it);
      }
      const std::string name = m;
      EXPECT_EQ(kern::split_walks_uneven(longest, int64_t(cells.size()), total), name != "causal" && name != "local")
          << m << " S=" << s << ": longest " << longest << " of " << cells.size() << " tasks, " << total << " steps";
    }
  }
}

// The deterministic sm90 backward's default cut (sm90::bwd_det_split_above_mean: m = 4 since PERF_LOG v2.50,
// 16 from v2.32) on the eight benchmark masks' real plans at S = 32768, H = 4: sink_local's key block 0,
// tree_dfs's and tree_bfs's upper-level spans and longformer's global key blocks are that far above the mean
// (longformer's at ~15x, which m = 16 left whole: its deterministic backward 17.6 -> 62.8 TFLOP/s on an H100),
// so those are cut; causal, document_causal, local and hstu (longest walks 1-3x the mean) keep every cell one
// item; and the switch's answer without the environment variables.
TEST(SplitRule, DeterministicDefaultCutsSinkAndRootColumns) {
  for (const char* m : {"causal", "document_causal", "local", "sink_local", "tree_dfs", "tree_bfs", "longformer",
                        "hstu"}) {
    const PlanOnlySchedule p = plan_only(plan_cells(m, 32768, 4, 4), 4);
    const std::string name = m;
    EXPECT_EQ(p.split_tasks, name == "sink_local" ? 4 : name == "tree_dfs" ? 60 : name == "tree_bfs" ? 44 : name == "longformer" ? 32 : 0)
        << m << ": chunk " << p.chunk << " above " << p.above;
  }
#ifdef FLASHSPAN_WITH_CUDA  // (the sm90 backward's switches, dispatch/family.cpp, exist in CUDA builds only)
  if (std::getenv("FLASHSPAN_SM90_BWD_DET_SPLIT_ABOVE") == nullptr && std::getenv("FLASHSPAN_SM90_BWD_DET_SPLIT") == nullptr) {
    EXPECT_TRUE(sm90::bwd_det_split_enabled());
    EXPECT_EQ(sm90::bwd_det_split_above_mean(), experimental_from_env() ? 2 : 4);
    sm90::set_bwd_det_split_above_mean(5);
    EXPECT_EQ(sm90::bwd_det_split_above_mean(), 5);
    sm90::set_bwd_det_split_above_mean(-1);
    EXPECT_EQ(sm90::bwd_det_split_above_mean(), experimental_from_env() ? 2 : 4);
  }
#endif
}

#ifdef FLASHSPAN_WITH_CUDA
// The deterministic backward's cell list in bands (experimental, BwdParams::det_band): FLASHSPAN_SM90_BWD_DET_BAND an
// integer 1 .. kDetBandAll or "all", whatever FLASHSPAN_EXPERIMENTAL says; unset, the L2 rule (0) with
// FLASHSPAN_EXPERIMENTAL=1, else 1 (heads fastest); anything else 1; the override wins, -1 gives the environment's
// answer back.
TEST(SplitRule, DeterministicBandSwitch) {
  using flashspan::test::ScopedEnv;
  sm90::set_bwd_det_band(-1);
  ScopedEnv var("FLASHSPAN_SM90_BWD_DET_BAND", nullptr);
  ScopedEnv experimental("FLASHSPAN_EXPERIMENTAL", nullptr);
  EXPECT_EQ(sm90::bwd_det_band_forced(), 1);
  experimental.set("1");
  EXPECT_EQ(sm90::bwd_det_band_forced(), 0);
  var.set("16");
  EXPECT_EQ(sm90::bwd_det_band_forced(), 16);
  var.set("all");
  EXPECT_EQ(sm90::bwd_det_band_forced(), kDetBandAll);
  experimental.set(nullptr);
  EXPECT_EQ(sm90::bwd_det_band_forced(), kDetBandAll);
  for (const char* bad : {"0", "-3", "8x", "", "yes"}) {
    var.set(bad);
    EXPECT_EQ(sm90::bwd_det_band_forced(), 1) << "\"" << bad << "\"";
  }
  sm90::set_bwd_det_band(32);
  EXPECT_EQ(sm90::bwd_det_band_forced(), 32);
  sm90::set_bwd_det_band(0);
  EXPECT_EQ(sm90::bwd_det_band_forced(), 0);
  sm90::set_bwd_det_band(-1);
  EXPECT_EQ(sm90::bwd_det_band_forced(), 1);
}

// The deterministic schedule's launcher switches (switches_sm90.cpp): own split slots on unless "0"
// (FLASHSPAN_EXPERIMENTAL changes it not), the relaxed dQ hand-off (measurement only) on only with "1", the dQ tiles
// in two halves unless "1", the item order forced by "1" / "0" only.
TEST(SplitRule, DeterministicLauncherSwitches) {
  using flashspan::test::ScopedEnv;
  ScopedEnv own("FLASHSPAN_SM90_BWD_DET_OWN_SLOTS", nullptr);
  ScopedEnv relaxed("FLASHSPAN_SM90_BWD_DET_RELAXED", nullptr);
  ScopedEnv chunks("FLASHSPAN_SM90_BWD_DET_DQ_CHUNKS", nullptr);
  ScopedEnv claim("FLASHSPAN_SM90_BWD_DET_CLAIM", nullptr);
  ScopedEnv experimental("FLASHSPAN_EXPERIMENTAL", nullptr);
  EXPECT_TRUE(sm90::bwd_det_own_slots());
  EXPECT_FALSE(sm90::bwd_det_relaxed());
  EXPECT_EQ(sm90::bwd_det_dq_chunks(), 2);
  EXPECT_EQ(sm90::bwd_det_claim(), -1);
  own.set("0");
  EXPECT_FALSE(sm90::bwd_det_own_slots());
  experimental.set("1");
  EXPECT_FALSE(sm90::bwd_det_own_slots());
  own.set("1");
  EXPECT_TRUE(sm90::bwd_det_own_slots());
  experimental.set(nullptr);
  relaxed.set("1");
  EXPECT_TRUE(sm90::bwd_det_relaxed());
  relaxed.set("yes");
  EXPECT_FALSE(sm90::bwd_det_relaxed());
  chunks.set("1");
  EXPECT_EQ(sm90::bwd_det_dq_chunks(), 1);
  chunks.set("4");
  EXPECT_EQ(sm90::bwd_det_dq_chunks(), 2);
  experimental.set("1");
  EXPECT_EQ(sm90::bwd_det_dq_chunks(), 2);
  experimental.set(nullptr);
  claim.set("1");
  EXPECT_EQ(sm90::bwd_det_claim(), 1);
  claim.set("0");
  EXPECT_EQ(sm90::bwd_det_claim(), 0);
  claim.set("2");
  EXPECT_EQ(sm90::bwd_det_claim(), -1);
}

// The sm90 SDPA forward's item groups (experimental, AnalyticMaskParams::l2_group): FLASHSPAN_SM90_FWD_L2_GROUP a
// positive integer gives that many (sample, head) pairs a group whatever FLASHSPAN_EXPERIMENTAL says; "0", a
// non-number or a negative one gives 0 (one group); unset, the automatic size (the pairs whose K and V fit 25 MB, at
// least 1) with FLASHSPAN_EXPERIMENTAL=1, else 0.
TEST(SplitRule, ForwardL2GroupSwitch) {
  using flashspan::test::ScopedEnv;
  ScopedEnv own("FLASHSPAN_SM90_FWD_L2_GROUP", nullptr);
  ScopedEnv claim("FLASHSPAN_SM90_FWD_CLAIM", nullptr);
  const int64_t mb = int64_t(1) << 20;
  // Grouped by default (no left bound, no block mask): K / V of 16 MiB a group.
  EXPECT_EQ(sm90::fwd_l2_group(4 * mb, true), 4);   // 16 MiB / 4 MiB
  EXPECT_EQ(sm90::fwd_l2_group(1 * mb, true), 16);
  EXPECT_EQ(sm90::fwd_l2_group(64 * mb, true), 1);  // at least one pair
  EXPECT_EQ(sm90::fwd_l2_group(0, true), 0);
  EXPECT_EQ(sm90::fwd_l2_group(4 * mb, false), 0);  // a window, a block mask: one group
  // Claimed where the workspace holds the counter (calls whose cells' costs differ), snake waves elsewhere.
  EXPECT_TRUE(sm90::fwd_claim(true));
  EXPECT_FALSE(sm90::fwd_claim(false));
  // The variable forces a size for both kinds: a positive integer that many pairs, anything else one group.
  own.set("0");
  EXPECT_EQ(sm90::fwd_l2_group(4 * mb, true), 0);
  own.set("-3");
  EXPECT_EQ(sm90::fwd_l2_group(4 * mb, true), 0);
  own.set("x");
  EXPECT_EQ(sm90::fwd_l2_group(4 * mb, true), 0);
  own.set("8");
  EXPECT_EQ(sm90::fwd_l2_group(4 * mb, false), 8);
  EXPECT_EQ(sm90::fwd_l2_group(4 * mb, true), 8);
  // FLASHSPAN_SM90_FWD_CLAIM forces the claims either way.
  claim.set("0");
  EXPECT_FALSE(sm90::fwd_claim(true));
  claim.set("1");
  EXPECT_TRUE(sm90::fwd_claim(false));
}
TEST(SplitRule, BackwardL2GroupSwitch) {
  // The non-deterministic SDPA backward's heads-fastest cells: pairs whose Q, dO and fp32 dQ tiles fit 16 MiB where
  // grouped by default (no left bound), forced by FLASHSPAN_SM90_BWD_L2_GROUP; the forward's variable not read.
  using flashspan::test::ScopedEnv;
  ScopedEnv own("FLASHSPAN_SM90_BWD_L2_GROUP", nullptr);
  ScopedEnv fwd("FLASHSPAN_SM90_FWD_L2_GROUP", "5");
  const int64_t mb = int64_t(1) << 20;
  EXPECT_EQ(sm90::bwd_l2_group(8 * mb, true), 2);  // S = 8192, D = 128: 8192 x (2 x 256 + 4 x 128) bytes
  EXPECT_EQ(sm90::bwd_l2_group(2 * mb, true), 8);
  EXPECT_EQ(sm90::bwd_l2_group(32 * mb, true), 1);
  EXPECT_EQ(sm90::bwd_l2_group(8 * mb, false), 0);  // a window: one group
  own.set("3");
  EXPECT_EQ(sm90::bwd_l2_group(8 * mb, false), 3);
  own.set("0");
  EXPECT_EQ(sm90::bwd_l2_group(8 * mb, true), 0);
}
TEST(SplitRule, BackwardDeterministicL2GroupSwitch) {
  // The deterministic SDPA backward's cells: the same rule as the non-deterministic one's for lists of at least 12
  // waves of the grid (cells >= 12 ctas), else one group; forced by FLASHSPAN_SM90_BWD_DET_L2_GROUP whatever the
  // list; the non-deterministic backward's variable not read, nor this one by it.
  using flashspan::test::ScopedEnv;
  ScopedEnv own("FLASHSPAN_SM90_BWD_DET_L2_GROUP", nullptr);
  ScopedEnv nondet("FLASHSPAN_SM90_BWD_L2_GROUP", "5");
  const int64_t mb = int64_t(1) << 20;
  const int ctas = 132;
  EXPECT_EQ(sm90::bwd_det_l2_group(8 * mb, true, 4096, ctas), 2);
  EXPECT_EQ(sm90::bwd_det_l2_group(32 * mb, true, 4096, ctas), 1);
  EXPECT_EQ(sm90::bwd_det_l2_group(8 * mb, false, 4096, ctas), 0);
  EXPECT_EQ(sm90::bwd_det_l2_group(8 * mb, true, 12 * ctas, ctas), 2);  // 12 waves: grouped
  EXPECT_EQ(sm90::bwd_det_l2_group(8 * mb, true, 12 * ctas - 1, ctas), 0);
  EXPECT_EQ(sm90::bwd_det_l2_group(8 * mb, true, 2048, ctas), 2);  // B=2 H=16 S=8192: 15.5 waves
  EXPECT_EQ(sm90::bwd_det_l2_group(8 * mb, true, 1024, ctas), 0);  // B=1 H=16 S=8192: 7.8 waves
  EXPECT_EQ(sm90::bwd_det_l2_group(8 * mb, true, 16, 0), 2);       // (no CTA count: 1)
  own.set("3");
  EXPECT_EQ(sm90::bwd_det_l2_group(8 * mb, false, 4096, ctas), 3);
  EXPECT_EQ(sm90::bwd_det_l2_group(8 * mb, true, 1024, ctas), 3);
  EXPECT_EQ(sm90::bwd_l2_group(8 * mb, true), 5);
  own.set("0");
  EXPECT_EQ(sm90::bwd_det_l2_group(8 * mb, true, 4096, ctas), 0);
}
#endif

}  // namespace
}  // namespace flashspan
