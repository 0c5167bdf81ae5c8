// 64-bit size arithmetic of the plan layout (issue 17), CPU only: synthetic block counts just
// below and above 2^31 and 2^32 go through assign_plan_layout() (offsets and sizes, nothing
// allocated) and check_list_entries(). A count past the format's int32 limit must raise
// Error(kNotSupported) naming the exact 64-bit size and the limit -- never wrap to a small
// count (which is what made the CUDA planner allocate too little and write out of bounds).
#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <string>

#include "core/error.h"
#include "dispatch/family.h"
#include "planner_masks.h"
#include "plan/plan_layout.h"
#include "plan/planner.h"

namespace {

using flashspan::Error;
using flashspan::kMaxListEntries;
using flashspan::kPlanAlign;
using flashspan::MaskPlan;
using flashspan::PlanArray;
using flashspan::Status;

constexpr int64_t k2p31 = int64_t(1) << 31;
constexpr int64_t k2p32 = int64_t(1) << 32;

// A plan shell (no buffer) for B=1, Sq=Sk=2^20, Hq=Hmask=64: the block counts are consistent
// with the geometry; the list sizes are set by each test.
std::unique_ptr<MaskPlan> shell(bool backward) {
  auto owned = std::make_unique<MaskPlan>();
  MaskPlan& plan = *owned;
  plan.geometry = fs_test::make_geometry(false, {1 << 20}, {1 << 20}, 64, 64, 64, 1);
  plan.signature.consumer = flashspan::consumer_for(80, 128, 128);  // 128x64 / 64x128
  plan.signature.has_backward = backward;
  plan.counts.fwd_num_q_blocks = (1 << 20) / 128;
  plan.counts.fwd_num_k_blocks = (1 << 20) / 64;
  plan.counts.num_tasks = 64 * plan.counts.fwd_num_q_blocks;
  if (backward) {
    plan.counts.bwd_num_q_blocks = (1 << 20) / 64;
    plan.counts.bwd_num_k_blocks = (1 << 20) / 128;
    plan.counts.num_bwd_tasks = 64 * plan.counts.bwd_num_k_blocks;
  }
  return owned;
}

const PlanArray& find(const MaskPlan& plan, const std::string& name) {
  for (const PlanArray& a : plan.arrays)
    if (a.name == name) return a;
  ADD_FAILURE() << "no array " << name;
  return plan.arrays.front();
}

int64_t padded(int64_t n) { return (n + kPlanAlign - 1) / kPlanAlign * kPlanAlign; }

// The layout's arrays are contiguous, aligned, in order, and the buffer size is their sum.
void expect_consistent_layout(const MaskPlan& plan) {
  int64_t off = 0;
  for (const PlanArray& a : plan.arrays) {
    EXPECT_EQ(a.offset, off) << a.name;
    EXPECT_EQ(a.offset % kPlanAlign, 0) << a.name;
    EXPECT_GE(a.count, 0) << a.name;
    off += padded(a.count);
  }
  EXPECT_EQ(plan.buffer_elements, off);
  EXPECT_EQ(plan.bytes(), off * 4);
}

// The error message of assign_plan_layout, or "" when it accepts the counts.
std::string layout_error(MaskPlan& plan, Status* status = nullptr) {
  try {
    flashspan::assign_plan_layout(plan, false);
  } catch (const Error& e) {
    if (status) *status = e.status();
    return e.what();
  }
  return "";
}

TEST(PlanSizes, LimitIsInt32Max) { EXPECT_EQ(kMaxListEntries, k2p31 - 1); }

TEST(PlanSizes, ListsJustBelowTheLimitGetExact64BitOffsets) {
  auto owned = shell(true);
  MaskPlan& plan = *owned;
  plan.counts.fwd_full_runs = kMaxListEntries;
  plan.counts.fwd_partial = kMaxListEntries;
  plan.counts.bwd_full_runs = kMaxListEntries;
  plan.counts.bwd_k2q_full_runs = kMaxListEntries;
  plan.counts.bwd_partial = kMaxListEntries;
  plan.counts.fwd_full = plan.counts.bwd_full = int64_t(1) << 40;  // full blocks: not list entries
  ASSERT_EQ(layout_error(plan), "");
  expect_consistent_layout(plan);
  // Runs are (first, end) pairs: 2 (2^31 - 1) elements, past 2^32.
  EXPECT_EQ(find(plan, "fwd_q2k_full_runs").count, 2 * kMaxListEntries);
  EXPECT_EQ(find(plan, "bwd_k2q_full_runs").count, 2 * kMaxListEntries);
  // 128x64 payloads: 256 words per partial block -> (2^31 - 1) * 256 elements (> 2^38).
  EXPECT_EQ(find(plan, "fwd_q2k_partial_bits").count, kMaxListEntries * 256);
  EXPECT_EQ(find(plan, "bwd_q2k_partial_bits").count, kMaxListEntries * 256);
  EXPECT_EQ(find(plan, "bwd_k2q_partial_idx").count, kMaxListEntries);
  // Arrays after the first big list start past 2^31 and 2^32 elements.
  EXPECT_GT(find(plan, "fwd_tasks").offset, k2p31);
  EXPECT_GT(find(plan, "bwd_q_block_start").offset, k2p32);
  EXPECT_GT(plan.bytes(), int64_t(4) * 2 * kMaxListEntries * 256);  // two payload arrays, 4 bytes each
}

TEST(PlanSizes, EveryListPastTheLimitIsRefusedWithItsExactSize) {
  // Which count to set: 0 fwd_partial, 1 fwd_full_runs, 2 bwd_partial, 3 bwd_full_runs,
  // 4 bwd_k2q_full_runs.
  const char* views[5] = {"forward", "forward", "backward", "backward", "backward K2Q"};
  const char* lists[5] = {"partial", "full-run", "partial", "full-run", "full-run"};
  const char* tiles[5] = {"128x64", "128x64", "64x128", "64x128", "64x128"};
  for (int which = 0; which < 5; ++which) {
    for (int64_t n : {k2p31, k2p31 + 1, k2p32 - 1, k2p32, k2p32 + 5, int64_t(1) << 40}) {
      auto owned = shell(true);
  MaskPlan& plan = *owned;
      int64_t* field[5] = {&plan.counts.fwd_partial, &plan.counts.fwd_full_runs, &plan.counts.bwd_partial,
                           &plan.counts.bwd_full_runs, &plan.counts.bwd_k2q_full_runs};
      *field[which] = n;
      Status st = Status::kSuccess;
      const std::string msg = layout_error(plan, &st);
      ASSERT_NE(msg, "") << views[which] << " " << lists[which] << " " << n << " accepted";
      EXPECT_EQ(st, Status::kNotSupported);
      // The exact 64-bit count (not the wrapped low 32 bits), the limit, the view, list and tile.
      EXPECT_NE(msg.find(std::to_string(n) + " " + lists[which] + " entries"), std::string::npos) << msg;
      EXPECT_NE(msg.find("2147483647"), std::string::npos) << msg;
      EXPECT_NE(msg.find(std::string("the ") + views[which] + " view"), std::string::npos) << msg;
      EXPECT_NE(msg.find(tiles[which]), std::string::npos) << msg;
      EXPECT_NE(msg.find("64 mask heads"), std::string::npos) << msg;
    }
  }
}

TEST(PlanSizes, ForwardOnlyPlanIgnoresBackwardCounts) {
  auto owned = shell(false);
  MaskPlan& plan = *owned;
  plan.counts.fwd_full_runs = kMaxListEntries;
  plan.counts.bwd_full_runs = k2p32;  // not part of a forward-only plan
  plan.counts.bwd_k2q_full_runs = k2p32;
  EXPECT_EQ(layout_error(plan), "");
  expect_consistent_layout(plan);
  for (const PlanArray& a : plan.arrays) EXPECT_EQ(a.name.rfind("bwd_", 0), std::string::npos) << a.name;
}

TEST(PlanSizes, WrappedOrNegativeCountsAreRefused) {
  // A count that wrapped through int32 arithmetic shows up negative: refused, not allocated.
  for (int64_t n : {int64_t(-1), -k2p31}) {
    auto owned = shell(true);
  MaskPlan& plan = *owned;
    plan.counts.fwd_full_runs = n;
    EXPECT_NE(layout_error(plan), "") << n;
  }
  EXPECT_THROW(flashspan::check_list_entries("forward", "full", -5, 128, 64, 1), Error);
  EXPECT_NO_THROW(flashspan::check_list_entries("forward", "full", 0, 128, 64, 1));
  EXPECT_NO_THROW(flashspan::check_list_entries("forward", "full", kMaxListEntries, 128, 64, 1));
}

TEST(PlanSizes, SchedulesPastTheLimitAreRefused) {
  for (bool bwd : {false, true}) {
    auto owned = shell(true);
  MaskPlan& plan = *owned;
    (bwd ? plan.counts.num_bwd_tasks : plan.counts.num_tasks) = k2p32 + 7;
    Status st = Status::kSuccess;
    const std::string msg = layout_error(plan, &st);
    EXPECT_EQ(st, Status::kNotSupported);
    EXPECT_NE(msg.find("4294967303"), std::string::npos) << msg;
    EXPECT_NE(msg.find("2147483647"), std::string::npos) << msg;
  }
  auto owned = shell(true);
  MaskPlan& plan = *owned;
  plan.counts.num_tasks = kMaxListEntries;
  EXPECT_EQ(layout_error(plan), "");
  EXPECT_EQ(find(plan, "fwd_tasks").count, 4 * kMaxListEntries);  // > 2^32 elements
}

}  // namespace
