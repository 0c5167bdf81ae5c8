// Host mask planner (CPU, no GPU needed): every class, list, payload bit, K2Q entry and
// schedule entry is checked against brute force over the elements (planner_check.h).
#include <gtest/gtest.h>
#include <gtest/gtest-spi.h>

#include <algorithm>
#include <chrono>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "planner_check.h"
#include "planner_gqa_cases.h"
#include "mask_gen.h"
#include "planner_masks.h"
#include "plan/payload_word.h"
#include "plan/plan_layout.h"
#include "dispatch/family.h"
#include "kernels/sm90/tile_sm90.h"
#include "plan/planner.h"
#ifdef FLASHSPAN_WITH_CUDA
#include "kernels/sm90/launch_sm90.h"  // sm90::set_bwd_wide64_enabled
#endif

namespace {

using flashspan::Consumer;
using flashspan::Error;
using flashspan::FlexGeometry;
using flashspan::MaskPlan;
using flashspan::PlanRequest;
using flashspan::Status;
using fs_test::SampleMask;

std::unique_ptr<MaskPlan> plan_host(const FlexGeometry& g, const std::vector<int32_t>& mask, Consumer c, bool bwd,
                                    bool keep_mask = false, bool pack_gqa = false) {
  PlanRequest req;
  req.geometry = &g;
  req.consumer = c;
  req.build_backward = bwd;
  req.pack_gqa = pack_gqa;
  return flashspan::build_mask_plan_host(req, mask.data(), keep_mask);
}

// The error a host plan build raises (message), or "" when it succeeds.
std::string host_error(const FlexGeometry& g, const std::vector<int32_t>& mask, Status* status = nullptr) {
  try {
    plan_host(g, mask, flashspan::consumer_for(80, 128, 128), true);
  } catch (const Error& e) {
    if (status) *status = e.status();
    return e.what();
  }
  return "";
}

const Consumer kSm80 = flashspan::consumer_for(80, 128, 128);    // 128x64 / 64x128
const Consumer kSm80Big = flashspan::consumer_for(80, 256, 256); // 64x64 / 64x128
const Consumer kSm90 = flashspan::consumer_for(90, 128, 128);    // 128x128 / 64x128
// (64, 64) sm90 plans with the wide backward tile (tile_sm90.h kTileSm90Wide64; by default,
// sm90::bwd_wide64_enabled): 128x128 / 128x128.
const Consumer kSm90Wide = [] {
  Consumer c = flashspan::consumer_for(90, 128, 128);
  c.bwd_block_q = flashspan::sm90::kTileSm90Wide64.bwd_bq;
  c.bwd_block_k = flashspan::sm90::kTileSm90Wide64.bwd_bk;
  return c;
}();
// (192, 128) sm90 plans with the wide backward tile (tile_sm90.h kTileSm90Wide192;
// sm90::bwd_wide192_enabled, by default): 128x128 / 64x96 (payload sub-tiles of 32 columns).
const Consumer kSm90Wide192 = [] {
  Consumer c = flashspan::consumer_for(90, 128, 128);
  c.bwd_block_q = flashspan::sm90::kTileSm90Wide192.bwd_bq;
  c.bwd_block_k = flashspan::sm90::kTileSm90Wide192.bwd_bk;
  return c;
}();
// Packed decode plans (consumer_for_plan): 16x64 forward / 64x128 backward.
const Consumer kSm80Decode = [] {
  Consumer c = flashspan::consumer_for(80, 128, 128);
  c.fwd_block_q = flashspan::kDecodeBlockQ;
  return c;
}();

// Overrides sm90::bwd_wide64_enabled and bwd_wide192_enabled for a scope (builds with CUDA;
// without, the wide tiles are never chosen).
struct WideTiles {
  explicit WideTiles(int on64, int on192) {
#ifdef FLASHSPAN_WITH_CUDA
    flashspan::sm90::set_bwd_wide64_enabled(on64);
    flashspan::sm90::set_bwd_wide192_enabled(on192);
#else
    (void)on64;
    (void)on192;
#endif
  }
  ~WideTiles() {
#ifdef FLASHSPAN_WITH_CUDA
    flashspan::sm90::set_bwd_wide64_enabled(-1);
    flashspan::sm90::set_bwd_wide192_enabled(-1);
#endif
  }
};

TEST(ConsumerFor, TileTable) {
  WideTiles off(0, 0);  // the narrow tiles, whatever FLASHSPAN_EXPERIMENTAL says
  EXPECT_EQ(kSm80.fwd_block_q, 128);
  EXPECT_EQ(kSm80.fwd_block_k, 64);
  EXPECT_EQ(kSm80.bwd_block_q, 64);
  EXPECT_EQ(kSm80.bwd_block_k, 128);
  const Consumer c192 = flashspan::consumer_for(80, 192, 128);
  EXPECT_EQ(c192.fwd_block_q, 128);
  EXPECT_EQ(c192.fwd_block_k, 64);
  EXPECT_EQ(kSm80Big.fwd_block_q, 64);
  EXPECT_EQ(kSm80Big.fwd_block_k, 64);
  EXPECT_EQ(kSm90.arch, 90);
  EXPECT_EQ(kSm90.fwd_block_q, 128);
  EXPECT_EQ(kSm90.fwd_block_k, 128);
  EXPECT_EQ(kSm90.bwd_block_q, 64);
  EXPECT_EQ(kSm90.bwd_block_k, 128);
  // sm90 forward tiles by head dims (tile_sm90.h): 128 x 128 up to D = 128 and for (192, 128),
  // 128 x 64 for (256, 256); the backward tile is the one the plan's backward kernel runs
  // (64 x 128 up to D = 128; the sm80 backward's 64 x 64 for (192, 128) and (256, 256)).
  for (const auto& d : std::vector<std::pair<int, int>>{{8, 8}, {40, 72}, {64, 64}, {128, 40}, {128, 128}}) {
    const Consumer c = flashspan::consumer_for(90, d.first, d.second);
    EXPECT_EQ(c.fwd_block_q, 128);
    EXPECT_EQ(c.fwd_block_k, 128);
    EXPECT_EQ(c.bwd_block_q, 64);
    EXPECT_EQ(c.bwd_block_k, 128);
  }
  const Consumer s192 = flashspan::consumer_for(90, 192, 128), s256 = flashspan::consumer_for(90, 256, 256);
  EXPECT_EQ(s192.fwd_block_q, 128);
  EXPECT_EQ(s192.fwd_block_k, 128);
  EXPECT_EQ(s256.fwd_block_q, 128);
  EXPECT_EQ(s256.fwd_block_k, 64);
  const std::pair<Consumer, Consumer> bwd_pairs[] = {{s192, flashspan::consumer_for(80, 192, 128)},
                                                     {s256, flashspan::consumer_for(80, 256, 256)}};
  for (const auto& [c90, c80] : bwd_pairs) {
    EXPECT_EQ(c90.bwd_block_q, c80.bwd_block_q);
    EXPECT_EQ(c90.bwd_block_k, c80.bwd_block_k);
  }
  try {
    flashspan::consumer_for(70, 128, 128);
    ADD_FAILURE() << "arch 70 accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), Status::kNotSupported);
  }
}

// The wide backward tile (tile_sm90.h kTileSm90Wide64) goes to sm90 plans of head dims (64, 64)
// exactly while sm90::bwd_wide64_enabled(); no other dims or family change.
TEST(ConsumerFor, WideBackwardTile64) {
#ifndef FLASHSPAN_WITH_CUDA
  GTEST_SKIP() << "no CUDA in this build: the wide tile is never chosen";
#endif
  {
    WideTiles on(1, 0);
    const Consumer w = flashspan::consumer_for(90, 64, 64);
    EXPECT_EQ(w.fwd_block_q, 128);
    EXPECT_EQ(w.fwd_block_k, 128);
    EXPECT_EQ(w.bwd_block_q, 128);
    EXPECT_EQ(w.bwd_block_k, 128);
    EXPECT_TRUE(w == kSm90Wide);
    EXPECT_TRUE(flashspan::sm90::bwd_wide_tile_sm90(64, 64, w.bwd_block_q, w.bwd_block_k));
    for (const auto& d : std::vector<std::pair<int, int>>{{8, 8}, {32, 64}, {64, 32}, {128, 128}, {192, 128}}) {
      const Consumer c = flashspan::consumer_for(90, d.first, d.second);
      EXPECT_EQ(c.bwd_block_q, 64) << d.first << "x" << d.second;
    }
    const Consumer c80 = flashspan::consumer_for(80, 64, 64);
    EXPECT_EQ(c80.bwd_block_q, 64);
    EXPECT_EQ(c80.bwd_block_k, 128);
  }
  WideTiles off(0, 0);
  const Consumer n = flashspan::consumer_for(90, 64, 64);
  EXPECT_EQ(n.bwd_block_q, 64);
  EXPECT_EQ(n.bwd_block_k, 128);
  EXPECT_FALSE(flashspan::sm90::bwd_wide_tile_sm90(64, 64, n.bwd_block_q, n.bwd_block_k));
}

// The 64 x 96 backward tile (tile_sm90.h kTileSm90Wide192) goes to sm90 plans of head dims
// (192, 128) exactly while sm90::bwd_wide192_enabled(); no other dims or family change.
TEST(ConsumerFor, WideBackwardTile192) {
#ifndef FLASHSPAN_WITH_CUDA
  GTEST_SKIP() << "no CUDA in this build: the wide tile is never chosen";
#endif
  {
    WideTiles on(0, 1);
    const Consumer w = flashspan::consumer_for(90, 192, 128);
    EXPECT_EQ(w.fwd_block_q, 128);
    EXPECT_EQ(w.fwd_block_k, 128);
    EXPECT_EQ(w.bwd_block_q, 64);
    EXPECT_EQ(w.bwd_block_k, 96);
    EXPECT_TRUE(flashspan::sm90::bwd_wide_tile_sm90(192, 128, w.bwd_block_q, w.bwd_block_k));
    for (const auto& d : std::vector<std::pair<int, int>>{{64, 64}, {128, 128}, {256, 256}}) {
      const Consumer c = flashspan::consumer_for(90, d.first, d.second);
      EXPECT_NE(c.bwd_block_k, 96) << d.first << "x" << d.second;
    }
    const Consumer c80 = flashspan::consumer_for(80, 192, 128);
    EXPECT_EQ(c80.bwd_block_q, 64);
    EXPECT_EQ(c80.bwd_block_k, 64);
  }
  WideTiles off(0, 0);
  const Consumer n = flashspan::consumer_for(90, 192, 128);
  EXPECT_EQ(n.bwd_block_k, 64);
  EXPECT_FALSE(flashspan::sm90::bwd_wide_tile_sm90(192, 128, n.bwd_block_q, n.bwd_block_k));
}

// The eight BENCHMARK.md masks at small, non-tile-multiple S, for three consumers.
class BenchmarkMasks : public ::testing::TestWithParam<std::tuple<std::string, int>> {};

TEST_P(BenchmarkMasks, MatchesBruteForce) {
  const auto& [name, S] = GetParam();
  const SampleMask m = fs_test::mask_by_name(name, S);
  ASSERT_EQ(m.ep.size(), size_t(m.nfunc) * S);
  const FlexGeometry g = fs_test::make_geometry(false, {S}, {S}, 2, 2, 1, m.nfunc);
  for (const Consumer& c : {kSm80, kSm80Big, kSm90, kSm90Wide, kSm90Wide192}) {
    SCOPED_TRACE("consumer fwd " + std::to_string(c.fwd_block_q) + "x" + std::to_string(c.fwd_block_k));
    auto plan = plan_host(g, m.ep, c, true);
    fs_test::check_plan(*plan, m.ep.data());
    EXPECT_GT(plan->counts.fwd_partial + plan->counts.fwd_full, 0);
  }
}

INSTANTIATE_TEST_SUITE_P(Planner, BenchmarkMasks,
                         ::testing::Combine(::testing::ValuesIn(fs_test::benchmark_mask_names()),
                                            ::testing::Values(300, 1000)),
                         [](const auto& info) {
                           return std::get<0>(info.param) + "_S" + std::to_string(std::get<1>(info.param));
                         });

TEST(Planner, CausalBlockCountsAreExact) {
  // S = 512: 4 query blocks x 8 key blocks (128x64). Query block i has full key blocks
  // 0 .. 2i-1 and partial blocks 2i, 2i+1 (the diagonal).
  const SampleMask m = fs_test::mask_causal(512);
  const FlexGeometry g = fs_test::make_geometry(false, {512}, {512}, 1, 1, 1, 1);
  auto plan = plan_host(g, m.ep, kSm80, false);
  EXPECT_EQ(plan->counts.fwd_partial, 8);
  EXPECT_EQ(plan->counts.fwd_full, 0 + 2 + 4 + 6);
  EXPECT_EQ(plan->counts.visible_pairs, 512 * 513 / 2);
  const auto v = plan->fwd_view();
  EXPECT_EQ(v.q2k_partial_kb[v.q2k_partial_ptr[2]], 4);
  EXPECT_EQ(v.q2k_partial_kb[v.q2k_partial_ptr[2] + 1], 5);
  // Longest task first: query block 3 (8 blocks).
  EXPECT_EQ(v.tasks[0], 3);
  EXPECT_EQ(v.tasks[3], 8);
  fs_test::check_plan(*plan, m.ep.data());
}

TEST(Planner, RandomMasksGqaPerHead) {
  // BSHD, B = 2, Sq != Sk, Hmask = Hq = 4, Hkv = 2; each (head, sample) its own mask.
  for (int nfunc : {1, 3, 7}) {
    for (bool blocky : {false, true}) {
      SCOPED_TRACE("nfunc " + std::to_string(nfunc) + (blocky ? " blocky" : " uniform"));
      const FlexGeometry g = fs_test::make_geometry(false, {333, 333}, {517, 517}, 4, 2, 4, nfunc);
      std::vector<std::vector<SampleMask>> hs(4);
      uint64_t seed = 100 + nfunc * 10 + blocky;
      for (auto& s : hs)
        for (int b = 0; b < 2; ++b) s.push_back(fs_test::mask_random(333, 517, nfunc, blocky, seed++));
      const auto mask = fs_test::assemble_mask(g, hs);
      for (const Consumer& c : {kSm80, kSm90, kSm90Wide, kSm90Wide192}) {
        auto plan = plan_host(g, mask, c, true);
        fs_test::check_plan(*plan, mask.data());
        if (blocky) {
          EXPECT_GT(plan->counts.fwd_full, 0);
        }
      }
    }
  }
}

TEST(Planner, ThdWithEmptySamples) {
  // Empty query samples, empty key samples (all endpoints 0) and both empty.
  const std::vector<int64_t> lq{0, 200, 130, 0, 64, 77}, lk{50, 0, 260, 0, 129, 64};
  for (int hmask : {1, 3}) {
    const FlexGeometry g = fs_test::make_geometry(true, lq, lk, 3, 1, hmask, 5);
    std::vector<std::vector<SampleMask>> hs(hmask);
    uint64_t seed = 7;
    for (auto& s : hs)
      for (size_t b = 0; b < lq.size(); ++b) s.push_back(fs_test::mask_random(lq[b], lk[b], 5, b % 2 == 0, seed++));
    const auto mask = fs_test::assemble_mask(g, hs);
    auto plan = plan_host(g, mask, kSm80, true, true);
    fs_test::check_plan(*plan, mask.data());
    int64_t n = 0;
    const int32_t* kept = plan->array("mask_func", &n);
    ASSERT_EQ(n, int64_t(mask.size()));
    EXPECT_TRUE(std::equal(mask.begin(), mask.end(), kept));
  }
}

TEST(Planner, ThdBenchmarkMasksPerSample) {
  // Two samples of different lengths, each with its own causal / tree mask.
  const FlexGeometry g = fs_test::make_geometry(true, {700, 390}, {700, 390}, 4, 4, 1, 13);
  const SampleMask a = fs_test::mask_tree(700, true), b = fs_test::mask_tree(390, false);
  const auto mask = fs_test::assemble_mask(g, {{a, b}});
  auto plan = plan_host(g, mask, kSm80, true);
  fs_test::check_plan(*plan, mask.data());
}

TEST(Planner, ForwardOnlyPlan) {
  const SampleMask m = fs_test::mask_local(777);
  const FlexGeometry g = fs_test::make_geometry(false, {777}, {777}, 1, 1, 1, m.nfunc);
  auto plan = plan_host(g, m.ep, kSm80, false);
  EXPECT_FALSE(plan->signature.has_backward);
  EXPECT_EQ(plan->counts.bwd_partial, 0);
  EXPECT_EQ(plan->counts.num_bwd_tasks, 0);
  EXPECT_EQ(plan->array("mask_func"), nullptr);
  fs_test::check_plan(*plan, m.ep.data());
  try {
    plan->bwd_view();
    ADD_FAILURE() << "bwd_view of a forward-only plan did not throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("build_backward"), std::string::npos) << e.what();
  }
  const std::string sig = plan->signature.to_string(g);
  EXPECT_LT(sig.size(), 256u);
  EXPECT_NE(sig.find("fwd 128x64"), std::string::npos) << sig;
}

TEST(Planner, FullyVisibleAndFullyMasked) {
  // Every key visible: all blocks full except the tails; no key visible: empty plan.
  const int S = 300;
  const FlexGeometry g = fs_test::make_geometry(false, {S}, {S}, 1, 1, 1, 1);
  std::vector<int32_t> all(S, S), none(S, 0);
  auto p1 = plan_host(g, all, kSm80, true);
  fs_test::check_plan(*p1, all.data());
  EXPECT_EQ(p1->counts.fwd_full, 2 * 4);  // rows 0..255 x keys 0..255
  EXPECT_EQ(p1->counts.fwd_partial, 3 * 5 - 8);
  auto p0 = plan_host(g, none, kSm80, true);
  fs_test::check_plan(*p0, none.data());
  EXPECT_EQ(p0->counts.fwd_partial + p0->counts.fwd_full + p0->counts.bwd_partial + p0->counts.bwd_full, 0);
  EXPECT_EQ(p0->counts.visible_pairs, 0);
}

// Blocks with all but one (or a few) elements visible must be partial, not full (a planner
// that called them full would skip the mask on the hidden elements): masks made of tiles
// that miss exactly one element, and block-structured masks mixing full, empty, partial and
// full-minus-n tiles, for every consumer tile, tails included.
TEST(Planner, FullMinusOneBlocksArePartial) {
  const int64_t lq = 512 + 37, lk = 640 + 11;
  const fs_test::Visibility vis = fs_test::full_minus_one_visibility(lq, lk, 128, 128, 5);
  const SampleMask m = fs_test::mask_from_visibility(vis);
  const FlexGeometry g = fs_test::make_geometry(false, {lq}, {lk}, 2, 1, 1, m.nfunc);
  for (const Consumer& c : {kSm80, kSm80Big, kSm90, kSm90Wide, kSm90Wide192}) {
    SCOPED_TRACE("consumer fwd " + std::to_string(c.fwd_block_q) + "x" + std::to_string(c.fwd_block_k));
    // The mask really has full-minus-one blocks of this consumer's tiles, and full ones.
    ASSERT_GT(fs_test::count_blocks_missing(vis, c.fwd_block_q, c.fwd_block_k, 1), 0);
    ASSERT_GT(fs_test::count_blocks_missing(vis, c.bwd_block_q, c.bwd_block_k, 1), 0);
    auto plan = plan_host(g, m.ep, c, true);
    fs_test::check_plan(*plan, m.ep.data());
    EXPECT_GT(plan->counts.fwd_full, 0);
    EXPECT_GT(plan->counts.bwd_full, 0);
  }
}

TEST(Planner, BlockStructuredMasks) {
  // BSHD and THD (an empty sample included), per-head masks, GQA; tiles of 128 x 128 and of
  // 64 x 64; empty rows and empty query tiles in some cases.
  struct Shape {
    bool varlen;
    std::vector<int64_t> lq, lk;
    int hq, hkv, hmask;
  };
  const std::vector<Shape> shapes{{false, {300, 300}, {520, 520}, 4, 2, 4},
                                  {true, {0, 257, 128, 70}, {130, 384, 0, 200}, 2, 1, 1},
                                  {false, {256}, {1024}, 3, 3, 3}};
  uint64_t seed = 11;
  for (const Shape& sh : shapes) {
    for (int tile : {128, 64}) {
      for (double empty_rows : {0.0, 0.1}) {
        SCOPED_TRACE("tile " + std::to_string(tile) + " empty rows " + std::to_string(empty_rows) + " seed " +
                     std::to_string(seed));
        fs_test::BlockMaskSpec spec;
        spec.tile_q = spec.tile_k = tile;
        spec.p_empty_row = empty_rows;
        spec.p_empty_q_tile = empty_rows;
        FlexGeometry g = fs_test::make_geometry(sh.varlen, sh.lq, sh.lk, sh.hq, sh.hkv, sh.hmask, 1);
        const auto mask = fs_test::block_mask_for_geometry(g, spec, seed++);
        for (const Consumer& c : {kSm80, kSm80Big, kSm90, kSm90Wide, kSm90Wide192}) {
          auto plan = plan_host(g, mask, c, true);
          fs_test::check_plan(*plan, mask.data());
          if (empty_rows == 0.0 && tile == 128) {
            EXPECT_GT(plan->counts.fwd_full, 0);
            EXPECT_GT(plan->counts.fwd_partial, 0);
          }
        }
      }
    }
  }
}

// The generator itself: a full-minus-one tile grid hides exactly one element per tile, and
// block-structured masks hold every tile class.
TEST(MaskGen, BlockClassesArePresent) {
  const fs_test::Visibility v = fs_test::full_minus_one_visibility(256, 256, 128, 128, 1);
  EXPECT_EQ(fs_test::count_blocks_missing(v, 128, 128, 1), 2);
  EXPECT_EQ(fs_test::count_blocks_missing(v, 128, 128, 0), 2);
  EXPECT_EQ(fs_test::count_blocks_missing(v, 128, 64, 0) + fs_test::count_blocks_missing(v, 128, 64, 1), 8);
  std::vector<fs_test::TileClass> classes;
  fs_test::BlockMaskSpec spec;
  const fs_test::Visibility b = fs_test::block_visibility(1024, 1024, spec, 3, &classes);
  int seen[4] = {};
  for (auto c : classes) ++seen[int(c)];
  for (int k = 0; k < 4; ++k) EXPECT_GT(seen[k], 0) << "tile class " << k;
  EXPECT_GT(fs_test::count_blocks_missing(b, 128, 128, 0), 0);
  int64_t minus_few = 0;
  for (int n = 1; n <= spec.max_missing; ++n) minus_few += fs_test::count_blocks_missing(b, 128, 128, n);
  EXPECT_GT(minus_few, 0);
  // Endpoints reproduce the bitmap.
  const SampleMask m = fs_test::mask_from_visibility(b);
  const FlexGeometry g = fs_test::make_geometry(false, {1024}, {1024}, 1, 1, 1, m.nfunc);
  int64_t diff = 0;
  for (int64_t q = 0; q < 1024; q += 7)
    for (int64_t k = 0; k < 1024; ++k) diff += fs_test::visible(m.ep.data(), g, 0, q, k) != bool(b.at(q, k));
  EXPECT_EQ(diff, 0);
}

TEST(Planner, MalformedEndpoints) {
  // BSHD B = 2, S = 40, Hmask = 2, nfunc = 3: rows of sample 1 are 40..79.
  const FlexGeometry g = fs_test::make_geometry(false, {40, 40}, {40, 40}, 2, 2, 2, 3);
  const SampleMask ok = fs_test::mask_local(40);
  auto mask = fs_test::assemble_mask(g, {{ok, ok}, {ok, ok}});
  ASSERT_EQ(host_error(g, mask), "");
  auto at = [&](int hm, int f, int row) -> int32_t& { return mask[(size_t(hm) * 3 + f) * 80 + row]; };

  auto m1 = mask;
  mask[(size_t(0) * 3 + 1) * 80 + 45] = -3;  // hm 0, endpoint 1, row 45 (sample 1, query 5)
  Status st = Status::kSuccess;
  EXPECT_EQ(host_error(g, mask, &st),
            "mask_func: endpoint mask_func[0, 1, 45] (sample 1, query 5) = -3 is negative; endpoints must be in "
            "[0, Sk]");
  EXPECT_EQ(st, Status::kInvalidArgument);
  mask = m1;
  at(1, 2, 3) = 41;
  EXPECT_EQ(host_error(g, mask),
            "mask_func: endpoint mask_func[1, 2, 3] (sample 0, query 3) = 41 is past the sample's key length 40; "
            "endpoints must be in [0, Sk]");
  mask = m1;
  at(0, 0, 10) = 0;
  at(0, 1, 10) = 5;
  at(0, 2, 10) = 4;
  EXPECT_EQ(host_error(g, mask),
            "mask_func: endpoints must be nondecreasing within a row, but mask_func[0, 2, 10] (sample 0, query 10) "
            "= 4 < previous endpoint 5");
  // The first error in (mask head, row, endpoint) order wins.
  mask = m1;
  at(1, 0, 0) = -1;
  at(0, 2, 70) = 99;
  at(0, 1, 70) = -5;
  EXPECT_EQ(host_error(g, mask),
            "mask_func: endpoint mask_func[0, 1, 70] (sample 1, query 30) = -5 is negative; endpoints must be in "
            "[0, Sk]");
}

TEST(Planner, RejectsBadRequests) {
  const SampleMask m = fs_test::mask_causal(64);
  const FlexGeometry g = fs_test::make_geometry(false, {64}, {64}, 1, 1, 1, 1);
  PlanRequest req;
  req.geometry = &g;
  req.consumer = kSm80;
  req.consumer.fwd_block_k = 80;  // columns % 32 != 0 (96 is a tile: the sm90 (192, 128) backward's)
  try {
    flashspan::build_mask_plan_host(req, m.ep.data(), false);
    ADD_FAILURE() << "80-column tile accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), Status::kInvalidArgument);
  }
}

TEST(Planner, LargeSequencePlansFast) {
  // S = 32768 with backward on one core: the planner is linear in blocks, not elements.
  for (const char* name : {"causal", "tree_bfs", "longformer"}) {
    const SampleMask m = fs_test::mask_by_name(name, 32768);
    const FlexGeometry g = fs_test::make_geometry(false, {32768}, {32768}, 4, 4, 1, m.nfunc);
    const auto t0 = std::chrono::steady_clock::now();
    auto plan = plan_host(g, m.ep, kSm80, true);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("[ planner ] host plan %s S=32768 fwd+bwd: %.3f s, %lld bytes\n", name, s,
                static_cast<long long>(plan->bytes()));
    EXPECT_LT(s, 10.0) << name;  // generous: the CI machine is shared
    // Spot check: visible pairs equal the sum of interval lengths.
    int64_t vis = 0;
    for (int64_t q = 0; q < 32768; ++q) {
      vis += m.ep[q];
      for (int f = 1; f + 1 < m.nfunc; f += 2) vis += m.ep[(f + 1) * 32768 + q] - m.ep[f * 32768 + q];
    }
    EXPECT_EQ(plan->counts.visible_pairs, vis) << name;
  }
}

// ---------------------------------------------------------------------------
// Packed GQA (mask_plan.h): the forward view over packed rows, the backward view unchanged.
// ---------------------------------------------------------------------------

// The backward arrays and counts of two plans are identical.
void expect_same_backward(const MaskPlan& a, const MaskPlan& b) {
  EXPECT_EQ(a.counts.bwd_num_q_blocks, b.counts.bwd_num_q_blocks);
  EXPECT_EQ(a.counts.bwd_num_k_blocks, b.counts.bwd_num_k_blocks);
  EXPECT_EQ(a.counts.bwd_partial, b.counts.bwd_partial);
  EXPECT_EQ(a.counts.bwd_full, b.counts.bwd_full);
  EXPECT_EQ(a.counts.num_bwd_tasks, b.counts.num_bwd_tasks);
  int compared = 0;
  for (const flashspan::PlanArray& x : a.arrays) {
    if (x.name.rfind("bwd_", 0) != 0) continue;
    int64_t n = 0;
    const int32_t* q = b.array(x.name, &n);
    ASSERT_NE(q, nullptr) << x.name;
    ASSERT_EQ(n, x.count) << x.name;
    const int32_t* p = a.base() + x.offset;
    EXPECT_TRUE(std::equal(p, p + n, q)) << x.name << " differs";
    ++compared;
  }
  EXPECT_EQ(compared, 13);
}

TEST(PackGqa, MatchesBruteForceAndKeepsBackward) {
  const auto cases = fs_test::packed_gqa_cases();
  ASSERT_GT(cases.size(), 50u);
  for (const fs_test::GqaCase& t : cases) {
    SCOPED_TRACE(t.name);
    const FlexGeometry& g = t.g;
    const int G = g.group_size();
    ASSERT_GT(G, 1);
    for (const Consumer& c : {kSm80, kSm80Big, kSm90, kSm90Wide, kSm90Wide192, kSm80Decode}) {
      SCOPED_TRACE("consumer fwd " + std::to_string(c.fwd_block_q) + "x" + std::to_string(c.fwd_block_k));
      auto packed = plan_host(g, t.mask, c, true, false, true);
      auto plain = plan_host(g, t.mask, c, true, false, false);
      ASSERT_TRUE(packed->signature.pack_gqa);
      EXPECT_FALSE(plain->signature.pack_gqa);
      fs_test::check_plan(*packed, t.mask.data());
      int64_t nqb = 0;
      for (int b = 0; b < g.batch; ++b) nqb += (g.seqlen_q(b) * G + c.fwd_block_q - 1) / c.fwd_block_q;
      EXPECT_EQ(packed->counts.fwd_num_q_blocks, nqb);
      EXPECT_EQ(packed->counts.fwd_num_k_blocks, plain->counts.fwd_num_k_blocks);
      EXPECT_EQ(packed->counts.num_tasks, int64_t(g.num_heads_kv) * nqb);
      EXPECT_EQ(packed->counts.visible_pairs, plain->counts.visible_pairs);
      expect_same_backward(*packed, *plain);
      EXPECT_NE(packed->signature.to_string(g).find("packgqa"), std::string::npos);
      EXPECT_EQ(plain->signature.to_string(g).find("packgqa"), std::string::npos);
    }
    // Forward-only packed plan: the same forward arrays, no backward ones.
    auto fwd_only = plan_host(g, t.mask, kSm80, false, false, true);
    fs_test::check_plan(*fwd_only, t.mask.data());
  }
}

TEST(PackGqa, GroupOfOneIsTheOrdinaryPlan) {
  const FlexGeometry g = fs_test::make_geometry(true, {5, 0, 140}, {70, 9, 300}, 3, 3, 3, 5);
  const auto mask = fs_test::random_gqa_case("g1", true, {5, 0, 140}, {70, 9, 300}, 3, 3, 3, 5, 77).mask;
  auto packed = plan_host(g, mask, kSm80, true, false, true);
  auto plain = plan_host(g, mask, kSm80, true, false, false);
  EXPECT_FALSE(packed->signature.pack_gqa);
  EXPECT_TRUE(packed->host_buffer == plain->host_buffer);
  EXPECT_EQ(packed->counts.num_tasks, plain->counts.num_tasks);
  EXPECT_EQ(packed->counts.fwd_num_q_blocks, plain->counts.fwd_num_q_blocks);
}

TEST(PackGqa, HandCheckedDecodeStep) {
  // One query, G = 4 heads of one kv head, 256 keys, sm80 128x64 tiles. Mask head g sees
  // keys [0, 64 (g + 1)): packed rows 0..3 (= heads 0..3) of the single packed query block.
  const FlexGeometry g = fs_test::make_geometry(false, {1}, {256}, 4, 1, 4, 1);
  const std::vector<int32_t> mask{64, 128, 192, 256};  // [Hmask = 4, nfunc = 1, T = 1]
  auto plan = plan_host(g, mask, kSm80, true, false, true);
  fs_test::check_plan(*plan, mask.data());
  const auto v = plan->fwd_view();
  EXPECT_EQ(v.num_q_blocks, 1);
  EXPECT_EQ(v.num_mask_heads, 1);
  EXPECT_EQ(v.pack_group, 4);
  ASSERT_EQ(plan->counts.fwd_partial, 4);  // 4 of 128 rows: never full
  EXPECT_EQ(plan->counts.fwd_full, 0);
  for (int kb = 0; kb < 4; ++kb) EXPECT_EQ(v.q2k_partial_kb[kb], kb);
  const int words = flashspan::payload_words(128, 64);
  auto bit = [&](int entry, int r, int c) {
    const auto p = flashspan::payload_position(r, c, 64);
    return (v.q2k_partial_bits[int64_t(entry) * words + p.word] >> p.bit) & 1u;
  };
  for (int kb = 0; kb < 4; ++kb)
    for (int r = 0; r < 8; ++r)
      for (int c : {0, 31, 63}) EXPECT_EQ(bit(kb, r, c), r < 4 && r >= kb ? 1u : 0u) << kb << " " << r << " " << c;
  EXPECT_EQ(plan->counts.visible_pairs, 64 + 128 + 192 + 256);
  ASSERT_EQ(v.num_tasks, 1);
  EXPECT_EQ(v.tasks[0], 0);
  EXPECT_EQ(v.tasks[1], 0);
  EXPECT_EQ(v.tasks[2], 0);
  EXPECT_EQ(v.tasks[3], 4);

  // Hmask = 1: every packed row reads mask head 0 ([0, 64)); visible pairs are not multiplied by G.
  const FlexGeometry g1 = fs_test::make_geometry(false, {1}, {256}, 4, 1, 1, 1);
  const std::vector<int32_t> mask1{64};
  auto plan1 = plan_host(g1, mask1, kSm80, false, false, true);
  fs_test::check_plan(*plan1, mask1.data());
  EXPECT_EQ(plan1->counts.fwd_partial, 1);
  EXPECT_EQ(plan1->counts.visible_pairs, 64);
}

TEST(PackGqa, PackedRowsFillFullBlocks) {
  // Sq = 16, G = 8: the 128 packed rows of each sample fill one 128-row tile, so fully
  // visible key blocks become full blocks (unpacked, 16 rows of 128 are always partial).
  const FlexGeometry g = fs_test::make_geometry(false, {16, 16}, {200, 200}, 8, 1, 1, 1);
  const std::vector<int32_t> mask(32, 200);
  auto packed = plan_host(g, mask, kSm80, false, false, true);
  auto plain = plan_host(g, mask, kSm80, false, false, false);
  fs_test::check_plan(*packed, mask.data());
  EXPECT_EQ(packed->counts.fwd_full, 2 * 3);  // keys 0..191 of both samples
  EXPECT_EQ(packed->counts.fwd_partial, 2 * 1);
  EXPECT_EQ(plain->counts.fwd_full, 0);
  EXPECT_EQ(packed->counts.num_tasks, 2);
  EXPECT_EQ(plain->counts.num_tasks, 8 * 2);
  EXPECT_EQ(packed->counts.visible_pairs, 32 * 200);
}

TEST(PackGqa, BlockStartsOverflowIsAnError) {
  // 2^31 - 1 queries x G = 64 in 16-row blocks: more query blocks than int32 indexes.
  const std::vector<int32_t> cu{0, 2147483647};
  EXPECT_EQ(flashspan::block_starts(cu, 128, 1).back(), 16777216);
  try {
    flashspan::block_starts(cu, 16, 64);
    ADD_FAILURE() << "overflowing block starts accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), Status::kNotSupported);
    EXPECT_NE(std::string(e.what()).find("pack_gqa=False"), std::string::npos) << e.what();
  }
}

TEST(PackGqa, ChooseDefault) {
  const Consumer c = kSm80;  // fwd_block_q 128
  auto geo = [](int64_t sq, int hq, int hkv) { return fs_test::make_geometry(false, {sq, sq}, {500, 500}, hq, hkv, 1, 1); };
  EXPECT_TRUE(flashspan::choose_pack_gqa(geo(1, 8, 1), c));
  EXPECT_TRUE(flashspan::choose_pack_gqa(geo(127, 4, 2), c));
  EXPECT_FALSE(flashspan::choose_pack_gqa(geo(128, 4, 2), c));
  EXPECT_FALSE(flashspan::choose_pack_gqa(geo(1, 4, 4), c));  // G = 1: packing is the identity
  EXPECT_TRUE(flashspan::choose_pack_gqa(geo(63, 2, 1), kSm80Big));  // fwd_block_q 64
  EXPECT_FALSE(flashspan::choose_pack_gqa(geo(64, 2, 1), kSm80Big));
  // THD: the longest sample decides.
  const FlexGeometry thd = fs_test::make_geometry(true, {1, 200}, {500, 500}, 8, 2, 1, 1);
  EXPECT_FALSE(flashspan::choose_pack_gqa(thd, c));
}

// The decode shapes (is_decode_shape: G > 1 and max_seqlen_q * G <= 16), which the automatic family
// choice keeps on the sm80 decode tile, and the G the sm90 forward packs (fwd_runs_pack_sm90: a
// power of two dividing its 128 rows).
TEST(PackGqa, DecodeShapesAndSm90Groups) {
  auto geo = [](int64_t sq, int hq, int hkv) { return fs_test::make_geometry(false, {sq, sq}, {500, 500}, hq, hkv, 1, 1); };
  EXPECT_TRUE(flashspan::is_decode_shape(geo(1, 8, 2)));    // 4 rows
  EXPECT_TRUE(flashspan::is_decode_shape(geo(2, 8, 1)));    // 16 rows
  EXPECT_FALSE(flashspan::is_decode_shape(geo(3, 8, 1)));   // 24 rows
  EXPECT_FALSE(flashspan::is_decode_shape(geo(1, 32, 1)));  // 32 rows
  EXPECT_FALSE(flashspan::is_decode_shape(geo(1, 4, 4)));   // G = 1
  EXPECT_TRUE(flashspan::is_decode_shape(fs_test::make_geometry(true, {1, 4, 0}, {500, 500, 9}, 8, 2, 1, 1)));
  EXPECT_FALSE(flashspan::is_decode_shape(fs_test::make_geometry(true, {1, 5, 0}, {500, 500, 9}, 8, 2, 1, 1)));
  for (int G : {1, 2, 4, 8, 16, 32, 64, 128}) EXPECT_TRUE(flashspan::sm90::fwd_runs_pack_sm90(G)) << G;
  for (int G : {0, 3, 6, 12, 256}) EXPECT_FALSE(flashspan::sm90::fwd_runs_pack_sm90(G)) << G;
}

// consumer_for_plan: the 16-row decode forward tile exactly for arch-80 packed plans with
// max_seqlen_q * G <= 16 and head dims <= 128; everything else is consumer_for's tile.
TEST(PackGqa, DecodeTileChoice) {
  using flashspan::consumer_for;
  using flashspan::consumer_for_plan;
  auto geo = [](int64_t sq, int hq, int hkv, int dqk = 128, int dv = 128) {
    FlexGeometry g = fs_test::make_geometry(false, {sq, sq}, {500, 500}, hq, hkv, 1, 1);
    g.head_dim_qk = dqk;
    g.head_dim_v = dv;
    return g;
  };
  EXPECT_TRUE(consumer_for_plan(80, geo(1, 8, 2), true) == kSm80Decode);   // 4 rows
  EXPECT_TRUE(consumer_for_plan(80, geo(2, 8, 1), true) == kSm80Decode);   // 16 rows
  EXPECT_TRUE(consumer_for_plan(80, geo(8, 4, 2), true) == kSm80Decode);   // 16 rows
  EXPECT_TRUE(consumer_for_plan(80, geo(1, 16, 1), true) == kSm80Decode);  // 16 rows
  EXPECT_TRUE(consumer_for_plan(80, geo(9, 4, 2), true) == kSm80);         // 18 rows
  EXPECT_TRUE(consumer_for_plan(80, geo(1, 32, 1), true) == kSm80);        // 32 rows
  EXPECT_TRUE(consumer_for_plan(80, geo(1, 8, 2), false) == kSm80);        // not packed
  EXPECT_TRUE(consumer_for_plan(80, geo(1, 4, 4), true) == kSm80);         // G = 1: never packed
  EXPECT_TRUE(consumer_for_plan(90, geo(1, 8, 2), true) == kSm90);         // sm90 family: its own tile
  // Head dims: the decode kernel runs on the 128 head-dim tile (predicated below 128).
  for (auto [dqk, dv] : {std::pair{64, 64}, {72, 72}, {128, 64}, {8, 16}}) {
    const Consumer d = consumer_for_plan(80, geo(1, 8, 2, dqk, dv), true);
    EXPECT_EQ(d.fwd_block_q, flashspan::kDecodeBlockQ) << dqk << "/" << dv;
    EXPECT_EQ(d.fwd_block_k, 64);
    const Consumer base = consumer_for(80, dqk, dv);
    EXPECT_EQ(d.bwd_block_q, base.bwd_block_q);  // backward tile unchanged
    EXPECT_EQ(d.bwd_block_k, base.bwd_block_k);
  }
  EXPECT_TRUE(consumer_for_plan(80, geo(1, 8, 2, 192, 128), true) == consumer_for(80, 192, 128));
  EXPECT_TRUE(consumer_for_plan(80, geo(1, 8, 2, 256, 256), true) == kSm80Big);
  // THD: the longest sample decides.
  FlexGeometry thd = fs_test::make_geometry(true, {1, 4, 0}, {500, 500, 9}, 8, 2, 1, 1);
  EXPECT_TRUE(consumer_for_plan(80, thd, true) == kSm80Decode);
  thd = fs_test::make_geometry(true, {1, 5, 0}, {500, 500, 9}, 8, 2, 1, 1);
  EXPECT_TRUE(consumer_for_plan(80, thd, true) == kSm80);
  // The signature shows the tile.
  const fs_test::GqaCase t = fs_test::random_gqa_case("dec", false, {1, 1}, {500, 500}, 8, 2, 1, 1, 5);
  auto plan = plan_host(t.g, t.mask, consumer_for_plan(80, t.g, true), true, false, true);
  EXPECT_NE(plan->signature.to_string(t.g).find("fwd 16x64 bwd 64x128"), std::string::npos)
      << plan->signature.to_string(t.g);
  EXPECT_EQ(plan->counts.fwd_num_q_blocks, 2);  // one 16-row block of 4 packed rows per sample
  fs_test::check_plan(*plan, t.mask.data());
}


// Issue 17: masks with many full runs per row (up to (31 + 1) / 2 = 16 intervals, alternating
// visible / hidden, per-head, two samples of different lengths): lists, runs, payloads, K2Q
// runs and schedules checked against brute force for every consumer tile, and the runs are
// really many (a planner storing one run per row would fail the brute force).
TEST(Planner, ManyRunsPerRowMatchBruteForce) {
  for (int nfunc : {1, 3, 7, 15, 31}) {
    SCOPED_TRACE("nfunc " + std::to_string(nfunc));
    const FlexGeometry g = fs_test::make_geometry(true, {260, 130}, {2200, 1500}, 2, 1, 2, nfunc);
    std::vector<std::vector<SampleMask>> hs(2);
    uint64_t seed = 1700 + nfunc;
    for (auto& h : hs) {
      h.push_back(fs_test::mask_many_runs(260, 2200, nfunc, seed++));
      h.push_back(fs_test::mask_many_runs(130, 1500, nfunc, seed++));
    }
    const auto mask = fs_test::assemble_mask(g, hs);
    for (const Consumer& c : {kSm80, kSm90, kSm80Big, kSm90Wide, kSm90Wide192}) {
      SCOPED_TRACE(::testing::Message() << "tile " << c.fwd_block_q << "x" << c.fwd_block_k);
      auto plan = plan_host(g, mask, c, true);
      fs_test::check_plan(*plan, mask.data());
      const auto v = plan->fwd_view();
      int32_t max_runs = 0;
      for (int64_t r = 0; r < 2 * v.num_q_blocks; ++r)
        max_runs = std::max(max_runs, v.q2k_full_ptr[r + 1] - v.q2k_full_ptr[r]);
      if (nfunc >= 15) {
        EXPECT_GE(max_runs, 6) << "the mask should give many full runs per query block";
      }
      EXPECT_EQ(plan->counts.fwd_full_runs, v.q2k_full_ptr[2 * v.num_q_blocks]);
      if (nfunc >= 7 && c.fwd_block_k == 64) {  // intervals of 64..192 keys: runs of 1..3 blocks
        EXPECT_LT(plan->counts.fwd_full_runs, plan->counts.fwd_full) << "runs should merge full blocks";
      }
    }
  }
}

// The checker itself must catch corrupted plans (a checker that cannot fail proves nothing).

TEST(PlannerChecker, DetectsCorruption) {
  const SampleMask m = fs_test::mask_causal(600);
  const FlexGeometry g = fs_test::make_geometry(false, {600}, {600}, 2, 1, 1, m.nfunc);
  for (const char* what : {"fwd_q2k_partial_bits", "bwd_q2k_partial_bits", "fwd_q2k_full_runs", "bwd_k2q_partial_idx",
                           "bwd_k2q_full_runs", "bwd_q2k_full_runs", "fwd_tasks", "bwd_tasks"}) {
    SCOPED_TRACE(what);
    auto plan = plan_host(g, m.ep, kSm80, true);
    int64_t n = 0;
    int32_t* a = const_cast<int32_t*>(plan->array(what, &n));
    ASSERT_GT(n, 1);
    if (std::string(what).find("tasks") != std::string::npos) std::swap(a[0], a[n - 4]);  // reorder two tasks
    else a[n / 2] ^= 1;
    ::testing::TestPartResultArray results;
    {
      ::testing::ScopedFakeTestPartResultReporter reporter(
          ::testing::ScopedFakeTestPartResultReporter::INTERCEPT_ONLY_CURRENT_THREAD, &results);
      fs_test::check_plan(*plan, m.ep.data());
    }
    EXPECT_GT(results.size(), 0) << "corrupted " << what << " was not detected";
  }
}

// The packed-view checker must catch a wrong row mapping: a plan built from one mask checked
// against the same endpoints with the heads of a group swapped (or with two kv groups
// swapped) must fail, and so must a corrupted packed payload.
TEST(PlannerChecker, DetectsWrongPackedMapping) {
  const auto t = fs_test::random_gqa_case("swap", false, {40}, {300}, 4, 2, 4, 3, 5);
  auto plan = plan_host(t.g, t.mask, kSm80, true, false, true);
  fs_test::check_plan(*plan, t.mask.data());
  const size_t head = size_t(t.g.nfunc) * t.g.total_q;
  auto permuted = [&](std::vector<int> perm) {
    std::vector<int32_t> m(t.mask.size());
    for (int h = 0; h < 4; ++h)
      std::copy(t.mask.begin() + perm[h] * head, t.mask.begin() + (perm[h] + 1) * head, m.begin() + h * head);
    return m;
  };
  auto fails = [&](const MaskPlan& p, const std::vector<int32_t>& m) {
    ::testing::TestPartResultArray results;
    {
      ::testing::ScopedFakeTestPartResultReporter reporter(
          ::testing::ScopedFakeTestPartResultReporter::INTERCEPT_ONLY_CURRENT_THREAD, &results);
      fs_test::check_plan(p, m.data());
    }
    return results.size() > 0;
  };
  EXPECT_TRUE(fails(*plan, permuted({1, 0, 3, 2}))) << "heads swapped inside a group not detected";
  EXPECT_TRUE(fails(*plan, permuted({2, 3, 0, 1}))) << "kv groups swapped not detected";
  EXPECT_FALSE(fails(*plan, t.mask));
  int64_t n = 0;
  uint32_t* bits = reinterpret_cast<uint32_t*>(const_cast<int32_t*>(plan->array("fwd_q2k_partial_bits", &n)));
  ASSERT_GT(n, 0);
  bits[n / 2] ^= 1u << 7;
  EXPECT_TRUE(fails(*plan, t.mask)) << "corrupted packed payload not detected";
}

// The CUDA planner's per-word payload function (host-callable) against payload_position().
TEST(PayloadWord, MatchesPayloadPosition) {
  std::mt19937_64 rng(42);
  for (auto [bq, bk] : {std::pair{128, 64}, std::pair{64, 128}, std::pair{128, 128}, std::pair{64, 64}, std::pair{64, 96}}) {
    for (int nfunc : {1, 3, 5, 19}) {
      for (int trial = 0; trial < 6; ++trial) {
        const int64_t lk = fs_test::rand_int(rng, 1, 700);
        const int64_t T = bq + 7;  // rows of the block start at row 3 of a longer mask
        const int rows = static_cast<int>(fs_test::rand_int(rng, 1, bq));
        std::vector<int32_t> ep(static_cast<size_t>(nfunc) * T, 0);
        for (int r = 0; r < rows; ++r) {
          std::vector<int64_t> e(nfunc);
          for (auto& x : e) x = fs_test::rand_int(rng, 0, lk);
          std::sort(e.begin(), e.end());
          for (int f = 0; f < nfunc; ++f) ep[static_cast<size_t>(f) * T + 3 + r] = static_cast<int32_t>(e[f]);
        }
        const int64_t nkb = (lk + bk - 1) / bk;
        for (int64_t kb = 0; kb < nkb; ++kb) {
          std::vector<uint32_t> want(flashspan::payload_words(bq, bk), 0u);
          for (int r = 0; r < rows; ++r)
            for (int c = 0; c < bk; ++c) {
              const int64_t k = kb * bk + c;
              bool vis = k < ep[3 + r];
              for (int f = 1; f + 1 < nfunc; f += 2)
                vis = vis || (ep[static_cast<size_t>(f) * T + 3 + r] <= k && k < ep[static_cast<size_t>(f + 1) * T + 3 + r]);
              if (vis && k < lk) {
                const auto p = flashspan::payload_position(r, c, bk);
                want[p.word] |= 1u << p.bit;
              }
            }
          for (int w = 0; w < int(want.size()); ++w) {
            const flashspan::BlockRows br = flashspan::block_rows(ep.data(), T, nfunc, 1, true, 0, 3, 0);
            const uint32_t got = flashspan::payload_word(br, nfunc, rows, kb * bk, bk, w);
            ASSERT_EQ(got, want[w]) << bq << "x" << bk << " nfunc " << nfunc << " kb " << kb << " word " << w;
          }
        }
      }
    }
  }
}

// block_rows() (the row mapping both planners use) against the packed-row formula.
TEST(BlockRows, PackedRowMapping) {
  const int64_t T = 50;
  const int nfunc = 3;
  for (int group : {1, 2, 4, 8}) {
    for (bool shared : {false, true}) {
      const int hmask = shared ? 1 : 2 * group;
      std::vector<int32_t> mask(size_t(hmask) * nfunc * T);
      for (size_t x = 0; x < mask.size(); ++x) mask[x] = static_cast<int32_t>(x);  // element index
      for (int vm = 0; vm < (shared ? 1 : 2); ++vm)
        for (int64_t q_start : {0, 7})
          for (int64_t row0 : {0, 16, 48, 64}) {
            const flashspan::BlockRows br = flashspan::block_rows(mask.data(), T, nfunc, group, shared, vm, q_start, row0);
            for (int r = 0; r < 40; ++r) {
              const int64_t P = row0 + r;
              if (q_start + P / group >= T) break;
              const int64_t mh = shared ? 0 : vm * group + P % group;
              for (int f = 0; f < nfunc; ++f)
                ASSERT_EQ(br.row(r)[f * br.stride], (mh * nfunc + f) * T + q_start + P / group)
                    << "G " << group << " shared " << shared << " vm " << vm << " row0 " << row0 << " r " << r;
            }
          }
    }
  }
}

}  // namespace

// The sm90 backward's cell-order rule (tile_sm90.h bwd_cell_order_sm90) at the H200's reported L2
// (60 MiB): on for the big head dims from S = 32768 and D = 128 above S = 36864, off below; off
// without an L2 size.
TEST(TileSm90, BwdCellOrderRule) {
  using flashspan::sm90::bwd_cell_order_sm90;
  constexpr int64_t l2 = 60ll << 20;
  EXPECT_FALSE(bwd_cell_order_sm90(32768, 128, 128, 2, l2));  // 32 MiB: the list (PERF_LOG v2.8)
  EXPECT_FALSE(bwd_cell_order_sm90(36864, 128, 128, 2, l2));  // exactly 3/5
  EXPECT_TRUE(bwd_cell_order_sm90(40960, 128, 128, 2, l2));
  EXPECT_TRUE(bwd_cell_order_sm90(131072, 128, 128, 2, l2));
  EXPECT_TRUE(bwd_cell_order_sm90(32768, 192, 128, 2, l2));  // 44 MiB
  EXPECT_TRUE(bwd_cell_order_sm90(32768, 256, 256, 2, l2));
  EXPECT_FALSE(bwd_cell_order_sm90(16384, 192, 128, 2, l2));
  EXPECT_FALSE(bwd_cell_order_sm90(32768, 64, 64, 2, l2));
  EXPECT_FALSE(bwd_cell_order_sm90(1 << 20, 128, 128, 2, 0));
}
