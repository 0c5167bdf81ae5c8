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
#include "planner_masks.h"
#include "plan/payload_word.h"
#include "plan/planner.h"

namespace {

using flashspan::Consumer;
using flashspan::Error;
using flashspan::FlexGeometry;
using flashspan::MaskPlan;
using flashspan::PlanRequest;
using flashspan::Status;
using fs_test::SampleMask;

std::unique_ptr<MaskPlan> plan_host(const FlexGeometry& g, const std::vector<int32_t>& mask, Consumer c, bool bwd,
                                    bool keep_mask = false) {
  PlanRequest req;
  req.geometry = &g;
  req.consumer = c;
  req.build_backward = bwd;
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

TEST(ConsumerFor, TileTable) {
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
  try {
    flashspan::consumer_for(70, 128, 128);
    ADD_FAILURE() << "arch 70 accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), Status::kNotSupported);
  }
}

// The eight BENCHMARK.md masks at small, non-tile-multiple S, for three consumers.
class BenchmarkMasks : public ::testing::TestWithParam<std::tuple<std::string, int>> {};

TEST_P(BenchmarkMasks, MatchesBruteForce) {
  const auto& [name, S] = GetParam();
  const SampleMask m = fs_test::mask_by_name(name, S);
  ASSERT_EQ(m.ep.size(), size_t(m.nfunc) * S);
  const FlexGeometry g = fs_test::make_geometry(false, {S}, {S}, 2, 2, 1, m.nfunc);
  for (const Consumer& c : {kSm80, kSm80Big, kSm90}) {
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
      for (const Consumer& c : {kSm80, kSm90}) {
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
  req.pack_gqa = true;
  try {
    flashspan::build_mask_plan_host(req, m.ep.data(), false);
    ADD_FAILURE() << "pack_gqa accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), Status::kNotSupported);
    EXPECT_NE(std::string(e.what()).find("pack_gqa"), std::string::npos);
  }
  req.pack_gqa = false;
  req.consumer.fwd_block_k = 96;
  try {
    flashspan::build_mask_plan_host(req, m.ep.data(), false);
    ADD_FAILURE() << "96-column tile accepted";
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


// The checker itself must catch corrupted plans (a checker that cannot fail proves nothing).

TEST(PlannerChecker, DetectsCorruption) {
  const SampleMask m = fs_test::mask_causal(600);
  const FlexGeometry g = fs_test::make_geometry(false, {600}, {600}, 2, 1, 1, m.nfunc);
  for (const char* what : {"fwd_q2k_partial_bits", "bwd_q2k_partial_bits", "fwd_q2k_full_kb", "bwd_k2q_partial_idx",
                           "bwd_k2q_full_qb", "fwd_tasks", "bwd_tasks"}) {
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

// The CUDA planner's per-word payload function (host-callable) against payload_position().
TEST(PayloadWord, MatchesPayloadPosition) {
  std::mt19937_64 rng(42);
  for (auto [bq, bk] : {std::pair{128, 64}, std::pair{64, 128}, std::pair{128, 128}, std::pair{64, 64}}) {
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
            const uint32_t got = flashspan::payload_word(ep.data() + 3, T, nfunc, rows, kb * bk, bk, w);
            ASSERT_EQ(got, want[w]) << bq << "x" << bk << " nfunc " << nfunc << " kb " << kb << " word " << w;
          }
        }
      }
    }
  }
}

}  // namespace
