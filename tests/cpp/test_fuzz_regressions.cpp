// Regression tests of the bugs the libFuzzer targets found (tests/fuzz; the inputs that found
// them are in tests/fuzz/regressions/). Each was a sanitizer report; each is now a clear
// FS_STATUS_INVALID_ARGUMENT naming the argument and the rule.
#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "flashspan/flashspan.h"

namespace {

fs_tensor_t describe(void* data, fs_dtype_t dt, const std::vector<int64_t>& shape, uint64_t byte_offset = 0) {
  fs_tensor_t t{};
  t.data = data;
  t.device = {FS_DEVICE_CPU, 0};
  t.ndim = int32_t(shape.size());
  t.dtype = dt;
  t.shape = shape.data();
  t.strides = nullptr;
  t.byte_offset = byte_offset;
  return t;
}

constexpr fs_dtype_t kF32{FS_DTYPE_FLOAT, 32, 1};
constexpr fs_dtype_t kI32{FS_DTYPE_INT, 32, 1};

// Plan arguments over (q, k, v, mask_func) with pack_gqa left to the library (-1).
fs_mask_plan_args_t plan_args(const fs_tensor_t* m, const fs_tensor_t* q, const fs_tensor_t* k, const fs_tensor_t* v) {
  fs_mask_plan_args_t a{};
  a.mask_func = m;
  a.q = q;
  a.k = k;
  a.v = v;
  a.pack_gqa = -1;
  return a;
}

// fuzz_plan: a shape whose element count overflows int64 made the compact strides overflow
// (signed overflow in tensor_view_from_fs, UBSan).
TEST(FuzzRegressions, ShapeWithMoreThan2To63ElementsIsRejected) {
  const int64_t big = std::numeric_limits<int64_t>::max();
  std::vector<int64_t> qs{1, 8, big, 192}, ks{1, 8, 1, 192}, ms{1, 1, 8};
  std::vector<int32_t> mask(8, 1);
  fs_tensor_t q = describe(nullptr, kF32, qs), k = describe(nullptr, kF32, ks), v = describe(nullptr, kF32, ks);
  fs_tensor_t m = describe(mask.data(), kI32, ms);
  fs_mask_plan_args_t a = plan_args(&m, &q, &k, &v);
  fs_mask_plan_t plan = nullptr;
  EXPECT_EQ(fs_create_mask_plan(&a, &plan), FS_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(plan, nullptr);
  EXPECT_NE(std::string(fs_get_last_error()).find("q: shape has more than 2^63 elements"), std::string::npos)
      << fs_get_last_error();
}

// fuzz_ops: a data pointer that is not a multiple of the element size (byte_offset 1) was
// accepted and the reference stored floats to a misaligned address (UBSan).
TEST(FuzzRegressions, MisalignedDataPointerIsRejected) {
  const int64_t B = 1, S = 8, H = 1, D = 8;
  std::vector<int64_t> qs{B, S, H, D}, ls{B, H, S}, ms{1, 1, B * S};
  std::vector<float> q(B * S * H * D, 0.5f), out(q.size() + 4), lse(B * H * S);
  std::vector<int32_t> mask(B * S, S);
  fs_tensor_t tq = describe(q.data(), kF32, qs), tm = describe(mask.data(), kI32, ms);
  fs_mask_plan_args_t a = plan_args(&tm, &tq, &tq, &tq);
  fs_mask_plan_t plan = nullptr;
  ASSERT_EQ(fs_create_mask_plan(&a, &plan), FS_STATUS_SUCCESS) << fs_get_last_error();
  fs_tensor_t to = describe(out.data(), kF32, qs, /*byte_offset=*/1), tl = describe(lse.data(), kF32, ls);
  fs_flex_fwd_args_t fa{&tq, &tq, &tq, &to, plan, &tl, nullptr, 0.f, 0};
  fs_flex_fwd_t op = nullptr;
  EXPECT_EQ(fs_flex_fwd_create(&fa, &op), FS_STATUS_INVALID_ARGUMENT);
  EXPECT_NE(std::string(fs_get_last_error()).find("out: data pointer (data + byte_offset) must be aligned"),
            std::string::npos)
      << fs_get_last_error();
  to.byte_offset = 4;  // aligned: accepted
  ASSERT_EQ(fs_flex_fwd_create(&fa, &op), FS_STATUS_SUCCESS) << fs_get_last_error();
  fs_flex_fwd_destroy(op);
  fs_mask_plan_destroy(plan);
}

// Found reading the code the fuzzer pointed at: heads, head dims and B were cast to int
// without a range check (Hq = 2^32 + 2 became 2).
TEST(FuzzRegressions, ExtentsBeyondIntAreRejectedNotTruncated) {
  const int64_t huge = (int64_t(1) << 32) + 2;
  std::vector<int64_t> qs{1, 8, huge, 16}, ks{1, 8, 2, 16}, ms{1, 1, 8};
  std::vector<int32_t> mask(8, 1);
  fs_tensor_t q = describe(nullptr, kF32, qs), k = describe(nullptr, kF32, ks), v = describe(nullptr, kF32, ks);
  fs_tensor_t m = describe(mask.data(), kI32, ms);
  fs_mask_plan_args_t a = plan_args(&m, &q, &k, &v);
  fs_mask_plan_t plan = nullptr;
  EXPECT_EQ(fs_create_mask_plan(&a, &plan), FS_STATUS_INVALID_ARGUMENT);
  EXPECT_NE(std::string(fs_get_last_error()).find("the number of heads must be below 2^31"), std::string::npos)
      << fs_get_last_error();
  qs = {huge, 8, 2, 16};
  ks = {huge, 8, 2, 16};
  EXPECT_EQ(fs_create_mask_plan(&a, &plan), FS_STATUS_INVALID_ARGUMENT);
  EXPECT_NE(std::string(fs_get_last_error()).find("q: batch size B (dim 0) must be in [1, 2^31)"), std::string::npos)
      << fs_get_last_error();
}

// fuzz_ops oracle: an output whose strides overlap (stride 0 on a dimension of extent > 1) was
// accepted; every result of that dimension but one was lost without an error.
TEST(FuzzRegressions, SelfOverlappingOutputIsRejected) {
  const int64_t B = 1, S = 8, H = 2, D = 8;
  std::vector<int64_t> qs{B, S, H, D}, ls{B, H, S}, ms{1, 1, B * S};
  std::vector<float> q(B * S * H * D, 0.5f), out(q.size()), lse(B * H * S);
  std::vector<int32_t> mask(B * S, S);
  fs_tensor_t tq = describe(q.data(), kF32, qs), tm = describe(mask.data(), kI32, ms);
  fs_mask_plan_args_t a = plan_args(&tm, &tq, &tq, &tq);
  fs_mask_plan_t plan = nullptr;
  ASSERT_EQ(fs_create_mask_plan(&a, &plan), FS_STATUS_SUCCESS) << fs_get_last_error();
  const int64_t overlapping[4] = {S * H * D, 0, D, 1};  // every query position writes the same row
  fs_tensor_t to = describe(out.data(), kF32, qs), tl = describe(lse.data(), kF32, ls);
  to.strides = overlapping;
  fs_flex_fwd_args_t fa{&tq, &tq, &tq, &to, plan, &tl, nullptr, 0.f, 0};
  fs_flex_fwd_t op = nullptr;
  EXPECT_EQ(fs_flex_fwd_create(&fa, &op), FS_STATUS_INVALID_ARGUMENT);
  EXPECT_NE(std::string(fs_get_last_error()).find("out: strides make different elements share memory"),
            std::string::npos)
      << fs_get_last_error();
  const int64_t permuted[4] = {S * H * D, D, S * D, 1};  // heads-major: no overlap, accepted
  to.strides = permuted;
  ASSERT_EQ(fs_flex_fwd_create(&fa, &op), FS_STATUS_SUCCESS) << fs_get_last_error();
  fs_flex_fwd_destroy(op);
  fs_mask_plan_destroy(plan);
}

}  // namespace
