// CUDA mask planner vs the host planner: bitwise equal plans (every array, counts, layout)
// and equal error messages. Skips without a CUDA device (or in a CPU-only build).
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "core/error.h"
#include "planner_check.h"
#include "planner_gqa_cases.h"
#include "mask_gen.h"
#include "planner_masks.h"
#include "dispatch/family.h"
#include "kernels/sm90/tile_sm90.h"
#include "plan/planner.h"

#ifdef FLASHSPAN_WITH_CUDA
#include <cuda_runtime.h>
#endif

namespace {

using flashspan::Consumer;
using flashspan::Error;
using flashspan::FlexGeometry;
using flashspan::MaskPlan;
using flashspan::PlanRequest;
using fs_test::SampleMask;

#ifdef FLASHSPAN_WITH_CUDA

bool have_gpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

#define SKIP_WITHOUT_GPU() \
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device visible"

// Device copy of a host mask (RAII).
struct DeviceMask {
  int32_t* ptr = nullptr;
  explicit DeviceMask(const std::vector<int32_t>& m) {
    EXPECT_EQ(cudaMalloc(&ptr, std::max<size_t>(m.size(), 1) * sizeof(int32_t)), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(ptr, m.data(), m.size() * sizeof(int32_t), cudaMemcpyHostToDevice), cudaSuccess);
  }
  ~DeviceMask() { cudaFree(ptr); }
};

const Consumer kSm80 = flashspan::consumer_for(80, 128, 128);
const Consumer kSm80Big = flashspan::consumer_for(80, 256, 256);
const Consumer kSm90 = flashspan::consumer_for(90, 128, 128);
// (64, 64) sm90 plans with the wide backward tile (tile_sm90.h kTileSm90Wide64; by default,
// sm90::bwd_wide64_enabled): 128x128 / 128x128.
const Consumer kSm90Wide = [] {
  Consumer c = flashspan::consumer_for(90, 128, 128);
  c.bwd_block_q = flashspan::sm90::kTileSm90Wide64.bwd_bq;
  c.bwd_block_k = flashspan::sm90::kTileSm90Wide64.bwd_bk;
  return c;
}();
// (192, 128) sm90 plans with the 64 x 96 backward tile (kTileSm90Wide192): 128x128 / 64x96.
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

// Compares a downloaded CUDA plan with the host plan: layout, counts, every array element.
void expect_same_plan(const MaskPlan& host, const MaskPlan& dev) {
  const auto& a = host.counts;
  const auto& b = dev.counts;
  EXPECT_EQ(a.fwd_num_q_blocks, b.fwd_num_q_blocks);
  EXPECT_EQ(a.fwd_num_k_blocks, b.fwd_num_k_blocks);
  EXPECT_EQ(a.fwd_partial, b.fwd_partial);
  EXPECT_EQ(a.fwd_full, b.fwd_full);
  EXPECT_EQ(a.bwd_num_q_blocks, b.bwd_num_q_blocks);
  EXPECT_EQ(a.bwd_num_k_blocks, b.bwd_num_k_blocks);
  EXPECT_EQ(a.bwd_partial, b.bwd_partial);
  EXPECT_EQ(a.bwd_full, b.bwd_full);
  EXPECT_EQ(a.fwd_full_runs, b.fwd_full_runs);
  EXPECT_EQ(a.bwd_full_runs, b.bwd_full_runs);
  EXPECT_EQ(a.bwd_k2q_full_runs, b.bwd_k2q_full_runs);
  EXPECT_EQ(a.visible_pairs, b.visible_pairs);
  EXPECT_EQ(a.num_tasks, b.num_tasks);
  EXPECT_EQ(a.num_bwd_tasks, b.num_bwd_tasks);
  EXPECT_TRUE(host.signature.consumer == dev.signature.consumer);
  EXPECT_EQ(host.signature.has_backward, dev.signature.has_backward);
  EXPECT_EQ(host.signature.pack_gqa, dev.signature.pack_gqa);
  ASSERT_EQ(host.buffer_elements, dev.buffer_elements);
  ASSERT_EQ(host.arrays.size(), dev.arrays.size());
  for (size_t i = 0; i < host.arrays.size(); ++i) {
    const auto& x = host.arrays[i];
    const auto& y = dev.arrays[i];
    ASSERT_EQ(x.name, y.name);
    ASSERT_EQ(x.offset, y.offset) << x.name;
    ASSERT_EQ(x.count, y.count) << x.name;
    const int32_t* p = host.host_buffer.data() + x.offset;
    const int32_t* q = dev.host_buffer.data() + y.offset;
    const auto mm = std::mismatch(p, p + x.count, q);
    if (mm.first != p + x.count) {
      const int64_t at = mm.first - p;
      int64_t ndiff = 0;
      for (int64_t k = 0; k < x.count; ++k) ndiff += p[k] != q[k];
      ADD_FAILURE() << "array " << x.name << " differs first at [" << at << "] of " << x.count << ": host "
                    << *mm.first << ", cuda " << *mm.second << " (" << ndiff << " elements differ)";
    }
  }
  // Padding between arrays is zero in both.
  EXPECT_TRUE(host.host_buffer == dev.host_buffer) << "buffers differ (padding included)";
}

std::unique_ptr<MaskPlan> plan_host(const FlexGeometry& g, const std::vector<int32_t>& mask, Consumer c, bool bwd,
                                    bool pack_gqa = false) {
  PlanRequest req;
  req.geometry = &g;
  req.consumer = c;
  req.build_backward = bwd;
  req.pack_gqa = pack_gqa;
  return flashspan::build_mask_plan_host(req, mask.data(), false);
}

std::unique_ptr<MaskPlan> plan_cuda(const FlexGeometry& g, const int32_t* d_mask, Consumer c, bool bwd,
                                    cudaStream_t stream = nullptr, bool pack_gqa = false) {
  FlexGeometry gd = g;
  gd.device = flashspan::DeviceType::kCUDA;
  PlanRequest req;
  req.geometry = &gd;
  req.consumer = c;
  req.build_backward = bwd;
  req.pack_gqa = pack_gqa;
  auto plan = flashspan::build_mask_plan_cuda(req, d_mask, stream);
  EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  EXPECT_TRUE(plan->on_device());
  return plan;
}

// Host plan vs CUDA plan for one case, forward-only and with backward; `brute` also runs
// the brute-force checker on the downloaded plan.
void compare_case(const FlexGeometry& g, const std::vector<int32_t>& mask, Consumer c, bool brute,
                  bool pack_gqa = false) {
  DeviceMask dm(mask);
  for (bool bwd : {false, true}) {
    SCOPED_TRACE(bwd ? "with backward" : "forward only");
    auto hp = plan_host(g, mask, c, bwd, pack_gqa);
    auto dp = plan_cuda(g, dm.ptr, c, bwd, nullptr, pack_gqa);
    auto dl = flashspan::copy_plan_to_host(*dp);
    expect_same_plan(*hp, *dl);
    if (brute) fs_test::check_plan(*dl, mask.data());
  }
}

class GpuBenchmarkMasks : public ::testing::TestWithParam<std::tuple<std::string, int>> {};

TEST_P(GpuBenchmarkMasks, EqualsHostPlanner) {
  SKIP_WITHOUT_GPU();
  const auto& [name, S] = GetParam();
  const SampleMask m = fs_test::mask_by_name(name, S);
  const FlexGeometry g = fs_test::make_geometry(false, {S}, {S}, 4, 2, 1, m.nfunc);
  const bool brute = S <= 1000;
  std::vector<Consumer> consumers = {kSm80, kSm80Big, kSm90};
  if (S <= 1000) {  // the wide tiles at small S (CI's emulated run time)
    consumers.push_back(kSm90Wide);
    consumers.push_back(kSm90Wide192);
  }
  for (const Consumer& c : consumers) {
    SCOPED_TRACE("consumer fwd " + std::to_string(c.fwd_block_q) + "x" + std::to_string(c.fwd_block_k));
    compare_case(g, m.ep, c, brute);
    if (S > 1000) break;  // large S: the sm80 consumer only
  }
}

INSTANTIATE_TEST_SUITE_P(PlannerGpu, GpuBenchmarkMasks,
                         ::testing::Combine(::testing::ValuesIn(fs_test::benchmark_mask_names()),
                                            ::testing::Values(300, 1000, 32768)),
                         [](const auto& info) {
                           return std::get<0>(info.param) + "_S" + std::to_string(std::get<1>(info.param));
                         });

TEST(PlannerGpu, Causal131072) {
  SKIP_WITHOUT_GPU();
  const SampleMask m = fs_test::mask_causal(131072);
  const FlexGeometry g = fs_test::make_geometry(false, {131072}, {131072}, 4, 4, 1, 1);
  compare_case(g, m.ep, kSm80, false);
}

TEST(PlannerGpu, RandomMasksGqaPerHead) {
  SKIP_WITHOUT_GPU();
  for (int nfunc : {1, 3, 7, 61}) {  // 61: endpoints too many for shared memory staging
    for (bool blocky : {false, true}) {
      SCOPED_TRACE("nfunc " + std::to_string(nfunc) + (blocky ? " blocky" : " uniform"));
      const FlexGeometry g = fs_test::make_geometry(false, {333, 333}, {517, 517}, 4, 2, 4, nfunc);
      std::vector<std::vector<SampleMask>> hs(4);
      uint64_t seed = 500 + nfunc * 10 + blocky;
      for (auto& s : hs)
        for (int b = 0; b < 2; ++b) s.push_back(fs_test::mask_random(333, 517, nfunc, blocky, seed++));
      const auto mask = fs_test::assemble_mask(g, hs);
      for (const Consumer& c : {kSm80, kSm90, kSm90Wide, kSm90Wide192}) compare_case(g, mask, c, true);
    }
  }
}

// Issue 17: many full runs per row (alternating intervals, nfunc up to 31), per-head masks,
// THD with two samples: the CUDA planner's runs, K2Q runs (events) and schedules equal the
// host planner's bit for bit and pass the brute-force checker.
TEST(PlannerGpu, ManyRunsPerRow) {
  SKIP_WITHOUT_GPU();
  for (int nfunc : {7, 31}) {
    SCOPED_TRACE("nfunc " + std::to_string(nfunc));
    const FlexGeometry g = fs_test::make_geometry(true, {200, 72}, {2100, 900}, 2, 1, 2, nfunc);
    std::vector<std::vector<SampleMask>> hs(2);
    uint64_t seed = 2700 + nfunc;
    for (auto& h : hs) {
      h.push_back(fs_test::mask_many_runs(200, 2100, nfunc, seed++));
      h.push_back(fs_test::mask_many_runs(72, 900, nfunc, seed++));
    }
    const auto mask = fs_test::assemble_mask(g, hs);
    for (const Consumer& c : {kSm80, kSm90, kSm90Wide, kSm90Wide192}) compare_case(g, mask, c, true);
  }
}

// Full-minus-one tiles and block-structured masks (full, empty, partial, full-minus-n tiles,
// empty rows): the CUDA planner must classify them exactly as the host planner and the
// brute-force checker do.
TEST(PlannerGpu, FullMinusOneBlocksArePartial) {
  SKIP_WITHOUT_GPU();
  const int64_t lq = 384 + 37, lk = 512 + 11;
  const SampleMask m = fs_test::mask_from_visibility(fs_test::full_minus_one_visibility(lq, lk, 128, 128, 5));
  const FlexGeometry g = fs_test::make_geometry(false, {lq}, {lk}, 2, 1, 1, m.nfunc);
  for (const Consumer& c : {kSm80, kSm80Big, kSm90, kSm90Wide, kSm90Wide192}) compare_case(g, m.ep, c, true);
}

TEST(PlannerGpu, BlockStructuredMasks) {
  SKIP_WITHOUT_GPU();
  uint64_t seed = 21;
  for (bool varlen : {false, true}) {
    for (double empty_rows : {0.0, 0.1}) {
      SCOPED_TRACE(std::string(varlen ? "THD" : "BSHD") + " empty rows " + std::to_string(empty_rows));
      fs_test::BlockMaskSpec spec;
      spec.p_empty_row = empty_rows;
      spec.p_empty_q_tile = empty_rows;
      FlexGeometry g = varlen ? fs_test::make_geometry(true, {0, 257, 70}, {130, 384, 200}, 4, 2, 4, 1)
                              : fs_test::make_geometry(false, {300, 300}, {520, 520}, 4, 2, 4, 1);
      const auto mask = fs_test::block_mask_for_geometry(g, spec, seed++);
      compare_case(g, mask, kSm80, true);
      compare_case(g, mask, kSm90, false);
    }
  }
}

TEST(PlannerGpu, LongKeysSeveralPasses) {
  // Sk = 300000 > 4096 key blocks of 64: the classifier loops over shared-memory passes.
  const int64_t lq = 200, lk = 300000;
  SKIP_WITHOUT_GPU();
  const FlexGeometry g = fs_test::make_geometry(false, {lq}, {lk}, 1, 1, 1, 5);
  const auto mask = fs_test::assemble_mask(g, {{fs_test::mask_random(lq, lk, 5, true, 77)}});
  compare_case(g, mask, kSm80, false);
}

TEST(PlannerGpu, ThdWithEmptySamples) {
  SKIP_WITHOUT_GPU();
  const std::vector<int64_t> lq{0, 200, 130, 0, 64, 77}, lk{50, 0, 260, 0, 129, 64};
  for (int hmask : {1, 3}) {
    const FlexGeometry g = fs_test::make_geometry(true, lq, lk, 3, 1, hmask, 5);
    std::vector<std::vector<SampleMask>> hs(hmask);
    uint64_t seed = 9;
    for (auto& s : hs)
      for (size_t b = 0; b < lq.size(); ++b) s.push_back(fs_test::mask_random(lq[b], lk[b], 5, b % 2 == 0, seed++));
    const auto mask = fs_test::assemble_mask(g, hs);
    compare_case(g, mask, kSm80, true);
    compare_case(g, mask, kSm90, true);
  }
}

// Packed GQA: Hmask = 1 and Hq, G in {2, 4, 8}, BSHD decode (Sq = 1 .. 17) and longer, THD
// with uneven and empty samples, random and benchmark masks (planner_gqa_cases.h).
TEST(PlannerGpu, PackGqaEqualsHostPlanner) {
  SKIP_WITHOUT_GPU();
  for (const fs_test::GqaCase& t : fs_test::packed_gqa_cases()) {
    SCOPED_TRACE(t.name);
    for (const Consumer& c : {kSm80, kSm80Big, kSm90, kSm80Decode}) {
      SCOPED_TRACE("consumer fwd " + std::to_string(c.fwd_block_q) + "x" + std::to_string(c.fwd_block_k));
      compare_case(t.g, t.mask, c, /*brute=*/c == kSm80 || c == kSm80Decode, /*pack_gqa=*/true);
    }
  }
}

TEST(PlannerGpu, PackGqaGroupOfOneAndLongKeys) {
  SKIP_WITHOUT_GPU();
  // G = 1: packing is the identity (signature.pack_gqa false on both planners).
  const auto t1 = fs_test::random_gqa_case("g1", true, {5, 0, 140}, {70, 9, 300}, 3, 3, 3, 5, 77);
  compare_case(t1.g, t1.mask, kSm80, true, true);
  // Decode over 300000 keys (several classifier passes), G = 8, per-head masks.
  const auto t2 = fs_test::random_gqa_case("long", false, {3, 3}, {300000, 300000}, 8, 1, 8, 5, 91);
  compare_case(t2.g, t2.mask, kSm80, false, true);
}

TEST(PlannerGpu, NonDefaultStream) {
  SKIP_WITHOUT_GPU();
  const SampleMask m = fs_test::mask_hstu(5000);
  const FlexGeometry g = fs_test::make_geometry(false, {5000}, {5000}, 2, 1, 1, m.nfunc);
  DeviceMask dm(m.ep);
  cudaStream_t s = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  auto dp = plan_cuda(g, dm.ptr, kSm80, true, s);
  auto dl = flashspan::copy_plan_to_host(*dp);
  expect_same_plan(*plan_host(g, m.ep, kSm80, true), *dl);
  cudaStreamDestroy(s);
}

// THD on CUDA tensors: the cumulative lengths are read back to the host (the geometry is host
// metadata), after their dtype, rank, contiguity and device are checked by name.
TEST(PlannerGpu, CopyCuSeqlensToHost) {
  SKIP_WITHOUT_GPU();
  using flashspan::DeviceType;
  using flashspan::DType;
  using flashspan::TensorView;
  const std::vector<int32_t> cu_q{0, 0, 200, 330}, cu_k{0, 50, 50, 310};
  DeviceMask dq(cu_q), dk(cu_k);  // device copies of the int32 values
  auto view = [](int32_t* p, int64_t n) {
    TensorView t;
    t.data = p;
    t.dtype = DType::kInt32;
    t.device = DeviceType::kCUDA;
    t.ndim = 1;
    t.shape[0] = n;
    t.strides[0] = 1;
    return t;
  };
  std::vector<int32_t> hq{-7}, hk{-7};  // stale contents must be replaced
  flashspan::copy_cu_seqlens_to_host(view(dq.ptr, 4), view(dk.ptr, 4), nullptr, &hq, &hk);
  EXPECT_EQ(hq, cu_q);
  EXPECT_EQ(hk, cu_k);

  auto expect_error = [&](TensorView q, TensorView k, const std::string& msg) {
    try {
      flashspan::copy_cu_seqlens_to_host(q, k, nullptr, &hq, &hk);
      ADD_FAILURE() << "no error; expected: " << msg;
    } catch (const Error& e) {
      EXPECT_EQ(std::string(e.what()).rfind(msg, 0), 0u) << e.what();
    }
  };
  TensorView wrong_dtype = view(dq.ptr, 4);
  wrong_dtype.dtype = DType::kInt64;
  expect_error(wrong_dtype, view(dk.ptr, 4), "cu_seqlens_q: dtype must be int32, got int64");
  TensorView strided = view(dk.ptr, 2);
  strided.strides[0] = 2;
  expect_error(view(dq.ptr, 4), strided, "cu_seqlens_k: must be a contiguous 1-D int32 tensor [B+1]");
  TensorView on_host = view(dk.ptr, 4);
  on_host.device = DeviceType::kCPU;
  expect_error(view(dq.ptr, 4), on_host, "cu_seqlens_k: must be on the same device as q (a CUDA device)");
}

TEST(PlannerGpu, CopyPlanToDeviceRoundTrip) {
  SKIP_WITHOUT_GPU();
  const SampleMask m = fs_test::mask_tree(3000, true);
  const FlexGeometry g = fs_test::make_geometry(false, {3000}, {3000}, 2, 2, 1, m.nfunc);
  auto hp = plan_host(g, m.ep, kSm80, true);
  auto dp = flashspan::copy_plan_to_device(*hp);
  EXPECT_TRUE(dp->on_device());
  EXPECT_NE(dp->fwd_view().q2k_partial_ptr, nullptr);
  auto back = flashspan::copy_plan_to_host(*dp);
  expect_same_plan(*hp, *back);
  EXPECT_THROW(flashspan::copy_plan_to_device(*dp), Error);
  EXPECT_THROW(flashspan::copy_plan_to_host(*hp), Error);
}

TEST(PlannerGpu, MalformedEndpointsSameMessages) {
  SKIP_WITHOUT_GPU();
  // THD with an empty sample in the middle: rows of sample 2 are 40..79.
  const FlexGeometry g = fs_test::make_geometry(true, {40, 0, 40}, {40, 10, 40}, 2, 2, 2, 3);
  const SampleMask ok = fs_test::mask_local(40);
  const SampleMask none{3, {}};
  const auto base = fs_test::assemble_mask(g, {{ok, none, ok}, {ok, none, ok}});
  auto at = [&](std::vector<int32_t>& m, int hm, int f, int row) -> int32_t& {
    return m[(size_t(hm) * 3 + f) * 80 + row];
  };
  std::vector<std::vector<int32_t>> cases;
  auto m = base;
  at(m, 0, 1, 45) = -3;
  cases.push_back(m);
  m = base;
  at(m, 1, 2, 3) = 41;
  cases.push_back(m);
  m = base;
  at(m, 0, 0, 10) = 0;
  at(m, 0, 1, 10) = 5;
  at(m, 0, 2, 10) = 4;
  cases.push_back(m);
  m = base;
  at(m, 1, 0, 0) = -1;
  at(m, 0, 2, 70) = 99;
  at(m, 0, 1, 70) = -5;
  cases.push_back(m);
  m = base;
  at(m, 1, 0, 79) = 41;  // last row of the last head
  cases.push_back(m);
  for (size_t k = 0; k < cases.size(); ++k) {
    SCOPED_TRACE("case " + std::to_string(k));
    std::string host_msg, cuda_msg;
    flashspan::Status hs = flashspan::Status::kSuccess, cs = flashspan::Status::kSuccess;
    try {
      plan_host(g, cases[k], kSm80, true);
    } catch (const Error& e) {
      host_msg = e.what();
      hs = e.status();
    }
    DeviceMask dm(cases[k]);
    try {
      plan_cuda(g, dm.ptr, kSm80, true);
    } catch (const Error& e) {
      cuda_msg = e.what();
      cs = e.status();
    }
    EXPECT_FALSE(host_msg.empty());
    EXPECT_EQ(host_msg, cuda_msg);
    EXPECT_EQ(hs, cs);
  }
  // The planner still works after an error (no sticky CUDA state, scratch freed).
  DeviceMask ok_mask(base);
  auto dl = flashspan::copy_plan_to_host(*plan_cuda(g, ok_mask.ptr, kSm80, true));
  expect_same_plan(*plan_host(g, base, kSm80, true), *dl);
}

#else  // no CUDA in this build

TEST(PlannerGpu, Skipped) { GTEST_SKIP() << "built without CUDA (FLASHSPAN_CUDA=OFF)"; }

#endif

}  // namespace
