// Tests of src/core/validation.cpp and tensor_view_from_fs: every rule raises an Error
// with the right status and a message naming the argument. Views are built by hand
// (shape only; validation never reads q/k/v/mask data, and never dereferences CUDA
// pointers, so CUDA views carry a null pointer).
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <vector>

#include "core/validation.h"
#include "dispatch/family.h"
#include "test_util.h"

namespace flashspan::test {
namespace {

constexpr Status kArg = Status::kInvalidArgument;
constexpr Status kType = Status::kTypeError;
constexpr Status kUnsupported = Status::kNotSupported;

// ---------------------------------------------------------------------------
// Valid base problems, modified one rule at a time
// ---------------------------------------------------------------------------

// BSHD: B=2, Sq=5, Sk=7, Hq=4, Hkv=2, Dqk=16, Dv=8, Hmask=1, nfunc=3.
PlanInputs bshd_inputs() {
  PlanInputs in;
  in.q = shape_view(DType::kFloat16, {2, 5, 4, 16});
  in.k = shape_view(DType::kFloat16, {2, 7, 2, 16});
  in.v = shape_view(DType::kFloat16, {2, 7, 2, 8});
  in.mask_func = shape_view(DType::kInt32, {1, 3, 10});
  return in;
}

// THD: two samples, q lengths {4, 5}, k lengths {6, 5}, Hq=4, Hkv=2, Hmask=4, nfunc=1.
struct ThdInputs {
  std::vector<int32_t> cu_q{0, 4, 9}, cu_k{0, 6, 11};
  PlanInputs in;
  ThdInputs() {
    in.q = shape_view(DType::kBFloat16, {9, 4, 16});
    in.k = shape_view(DType::kBFloat16, {11, 2, 16});
    in.v = shape_view(DType::kBFloat16, {11, 2, 8});
    in.mask_func = shape_view(DType::kInt32, {4, 1, 9});
    in.max_seqlen_q = 5;
    in.max_seqlen_k = 6;
    bind();
  }
  // (Re)points the cu_seqlens views at the vectors: call after editing them.
  void bind() {
    in.cu_seqlens_q = shape_view(DType::kInt32, {int64_t(cu_q.size())}, DeviceType::kCPU, cu_q.data());
    in.cu_seqlens_k = shape_view(DType::kInt32, {int64_t(cu_k.size())}, DeviceType::kCPU, cu_k.data());
  }
  FlexGeometry validate() const { return validate_plan_inputs(in); }
};

template <typename Modify>
::testing::AssertionResult bshd_error(Modify&& modify, Status status, const std::string& needle) {
  PlanInputs in = bshd_inputs();
  modify(in);
  return throws_error([&] { validate_plan_inputs(in); }, status, needle);
}

template <typename Modify>
::testing::AssertionResult thd_error(Modify&& modify, Status status, const std::string& needle) {
  ThdInputs t;
  modify(t);
  return throws_error([&] { t.validate(); }, status, needle);
}

TensorView on_cuda(TensorView v, int device_id = 0) {
  v.device = DeviceType::kCUDA;
  v.device_id = device_id;
  v.data = nullptr;
  return v;
}

// Last-dim stride 2 (the view's other strides stay as they are).
TensorView last_dim_strided(TensorView v) {
  v.strides[v.ndim - 1] = 2;
  return v;
}

// ---------------------------------------------------------------------------
// validate_plan_inputs: valid inputs
// ---------------------------------------------------------------------------

TEST(Validation, BshdGeometry) {
  const FlexGeometry g = validate_plan_inputs(bshd_inputs());
  EXPECT_FALSE(g.varlen);
  EXPECT_EQ(g.batch, 2);
  EXPECT_EQ(g.max_seqlen_q, 5);
  EXPECT_EQ(g.max_seqlen_k, 7);
  EXPECT_EQ(g.total_q, 10);
  EXPECT_EQ(g.total_k, 14);
  EXPECT_EQ(g.num_heads_q, 4);
  EXPECT_EQ(g.num_heads_kv, 2);
  EXPECT_EQ(g.num_heads_mask, 1);
  EXPECT_EQ(g.nfunc, 3);
  EXPECT_EQ(g.head_dim_qk, 16);
  EXPECT_EQ(g.head_dim_v, 8);
  EXPECT_EQ(g.dtype, DType::kFloat16);
  EXPECT_EQ(g.group_size(), 2);
  EXPECT_EQ(g.mask_head(3), 0);
  EXPECT_EQ(g.cu_seqlens_q, (std::vector<int32_t>{0, 5, 10}));
  EXPECT_EQ(g.cu_seqlens_k, (std::vector<int32_t>{0, 7, 14}));
}

TEST(Validation, ThdGeometry) {
  ThdInputs t;
  const FlexGeometry g = t.validate();
  EXPECT_TRUE(g.varlen);
  EXPECT_EQ(g.batch, 2);
  EXPECT_EQ(g.total_q, 9);
  EXPECT_EQ(g.total_k, 11);
  EXPECT_EQ(g.num_heads_mask, 4);
  EXPECT_EQ(g.mask_head(3), 3);
  EXPECT_EQ(g.seqlen_q(1), 5);
  EXPECT_EQ(g.seqlen_k(0), 6);
  // The geometry owns copies: later edits of the caller's arrays change nothing.
  t.cu_q[1] = 3;
  EXPECT_EQ(g.cu_seqlens_q, (std::vector<int32_t>{0, 4, 9}));
}

TEST(Validation, ThdOnCudaReadsTheHostCopies) {
  ThdInputs t;
  t.in.q = on_cuda(t.in.q, 1);
  t.in.k = on_cuda(t.in.k, 1);
  t.in.v = on_cuda(t.in.v, 1);
  t.in.mask_func = on_cuda(t.in.mask_func, 1);
  const std::vector<int32_t> host_q{0, 4, 9}, host_k{0, 6, 11};
  PlanInputs in = t.in;
  in.cu_seqlens_q = on_cuda(in.cu_seqlens_q, 1);
  in.cu_seqlens_k = on_cuda(in.cu_seqlens_k, 1);
  const FlexGeometry g = validate_plan_inputs(in, host_q.data(), host_k.data());
  EXPECT_EQ(g.device, DeviceType::kCUDA);
  EXPECT_EQ(g.device_id, 1);
  EXPECT_EQ(g.cu_seqlens_k, host_k);
  EXPECT_TRUE(throws_error([&] { validate_plan_inputs(in); }, Status::kInternal, "cu_seqlens_q: host copy"));
}

TEST(Validation, NoOverlapComparesByteRanges) {
  // check_no_overlap: the byte ranges every stride reaches (negative strides below the first element), not the
  // first elements alone; empty or unbound tensors pass.
  alignas(16) static uint16_t buf[4096];
  auto at = [](int64_t elem, std::vector<int64_t> shape, std::vector<int64_t> strides = {}) {
    TensorView t = shape_view(DType::kBFloat16, std::move(shape));
    for (size_t i = 0; i < strides.size(); ++i) t.strides[i] = strides[i];
    t.data = buf + elem;
    return t;
  };
  auto meets = [](const TensorView& a, const TensorView& b) {
    try {
      check_no_overlap(a, "out", b, "in", "why");
      return false;
    } catch (const Error& e) {
      EXPECT_EQ(e.status(), kArg);
      const std::string w = e.what();
      EXPECT_NE(w.find("out: shares memory with in ("), std::string::npos) << w;
      EXPECT_NE(w.find("why)"), std::string::npos) << w;
      return true;
    }
  };
  EXPECT_FALSE(meets(at(0, {4, 8}), at(32, {4, 8})));     // adjacent
  EXPECT_TRUE(meets(at(0, {4, 8}), at(31, {4, 8})));      // one element shared
  EXPECT_TRUE(meets(at(100, {2, 3}), at(100, {2, 3})));   // the same tensor
  EXPECT_TRUE(meets(at(0, {2, 8}, {64, 1}), at(70, {1, 1})));  // inside the strided span (a gap's element counts)
  EXPECT_FALSE(meets(at(0, {2, 8}, {64, 1}), at(72, {1, 1})));
  EXPECT_TRUE(meets(at(200, {4}, {-10}), at(170, {1})));  // a negative stride reaches below the first element
  EXPECT_FALSE(meets(at(200, {4}, {-10}), at(169, {1})));
  EXPECT_FALSE(meets(at(0, {0, 8}), at(0, {4, 8})));      // empty
  TensorView unbound = at(0, {4, 8});
  unbound.data = nullptr;
  EXPECT_FALSE(meets(unbound, at(0, {4, 8})));
}

TEST(Validation, HmaskEqualToHqAndZeroLengthSamplesAreAccepted) {
  PlanInputs in = bshd_inputs();
  in.mask_func = shape_view(DType::kInt32, {4, 1, 10});
  EXPECT_EQ(validate_plan_inputs(in).num_heads_mask, 4);
  ThdInputs t;
  t.cu_q = {0, 0, 9};
  t.cu_k = {0, 11, 11};
  t.in.max_seqlen_q = 9;
  t.in.max_seqlen_k = 11;
  t.bind();
  EXPECT_EQ(t.validate().seqlen_q(0), 0);
}

// ---------------------------------------------------------------------------
// validate_plan_inputs: one rule at a time
// ---------------------------------------------------------------------------

TEST(Validation, RequiredTensors) {
  EXPECT_TRUE(bshd_error([](PlanInputs& in) { in.q = TensorView(); }, kArg, "q: is required"));
  EXPECT_TRUE(bshd_error([](PlanInputs& in) { in.k = TensorView(); }, kArg, "k: is required"));
  EXPECT_TRUE(bshd_error([](PlanInputs& in) { in.v = TensorView(); }, kArg, "v: is required"));
  EXPECT_TRUE(bshd_error([](PlanInputs& in) { in.mask_func = TensorView(); }, kArg, "mask_func: is required"));
  EXPECT_TRUE(thd_error([](ThdInputs& t) { t.in.cu_seqlens_k = TensorView(); }, kArg,
                        "cu_seqlens_q, cu_seqlens_k: give both"));
}

TEST(Validation, Ranks) {
  EXPECT_TRUE(bshd_error([](PlanInputs& in) { in.q = shape_view(DType::kFloat16, {10, 4, 16}); }, kArg,
                         "q: must have rank 4"));
  EXPECT_TRUE(bshd_error([](PlanInputs& in) { in.k = shape_view(DType::kFloat16, {1, 2, 7, 2, 16}); }, kArg,
                         "k: must have rank 4"));
  EXPECT_TRUE(bshd_error([](PlanInputs& in) { in.v = shape_view(DType::kFloat16, {14, 2, 8}); }, kArg,
                         "v: must have rank 4"));
  EXPECT_TRUE(thd_error([](ThdInputs& t) { t.in.q = shape_view(DType::kBFloat16, {1, 9, 4, 16}); }, kArg,
                        "q: must have rank 3"));
  EXPECT_TRUE(bshd_error([](PlanInputs& in) { in.mask_func = shape_view(DType::kInt32, {3, 10}); }, kArg,
                         "mask_func: must have rank 3"));
}

TEST(Validation, Dtypes) {
  EXPECT_TRUE(bshd_error([](PlanInputs& in) { in.q.dtype = DType::kInt32; }, kType, "q: dtype"));
  EXPECT_TRUE(bshd_error([](PlanInputs& in) { in.q.dtype = DType::kFloat8E4M3; }, kType,
                         "q: dtype must be float16, bfloat16, float32 or float64, got "));
  // float64 runs on the CPU reference only: accepted on CPU tensors, refused on CUDA ones (before any kernel).
  PlanInputs f64 = bshd_inputs();
  f64.q.dtype = f64.k.dtype = f64.v.dtype = DType::kFloat64;
  EXPECT_EQ(validate_plan_inputs(f64).dtype, DType::kFloat64);
  EXPECT_EQ(flex_stats_dtype(DType::kFloat64), DType::kFloat64);
  EXPECT_EQ(flex_stats_dtype(DType::kBFloat16), DType::kFloat32);
  EXPECT_TRUE(bshd_error(
      [](PlanInputs& in) {
        in.q = on_cuda(in.q), in.k = on_cuda(in.k), in.v = on_cuda(in.v), in.mask_func = on_cuda(in.mask_func);
        in.q.dtype = in.k.dtype = in.v.dtype = DType::kFloat64;
      },
      kUnsupported, "q: float64 runs on CPU tensors only"));
  EXPECT_TRUE(bshd_error([](PlanInputs& in) { in.k.dtype = DType::kBFloat16; }, kType, "k: dtype"));
  EXPECT_TRUE(bshd_error([](PlanInputs& in) { in.v.dtype = DType::kFloat32; }, kType, "v: dtype"));
  EXPECT_TRUE(bshd_error([](PlanInputs& in) { in.mask_func.dtype = DType::kInt64; }, kType, "mask_func: dtype"));
  EXPECT_TRUE(thd_error([](ThdInputs& t) { t.in.cu_seqlens_q.dtype = DType::kInt64; }, kType, "cu_seqlens_q: dtype"));
}

TEST(Validation, Devices) {
  EXPECT_TRUE(bshd_error([](PlanInputs& in) { in.k = on_cuda(in.k); }, kType, "k: must be on the same device"));
  EXPECT_TRUE(bshd_error([](PlanInputs& in) { in.v = on_cuda(in.v); }, kType, "v: must be on the same device"));
  EXPECT_TRUE(bshd_error([](PlanInputs& in) { in.mask_func = on_cuda(in.mask_func); }, kType,
                         "mask_func: must be on the same device"));
  // Same kind, other device id.
  EXPECT_TRUE(bshd_error(
      [](PlanInputs& in) {
        in.q = on_cuda(in.q, 0), in.k = on_cuda(in.k, 1), in.v = on_cuda(in.v, 0);
        in.mask_func = on_cuda(in.mask_func, 0);
      },
      kType, "k: must be on the same device"));
  ThdInputs t;
  t.in.cu_seqlens_q = on_cuda(t.in.cu_seqlens_q);
  EXPECT_TRUE(throws_error([&] { validate_plan_inputs(t.in); }, kType, "cu_seqlens_q: must be on the same device"));
  ThdInputs t2;
  t2.in.cu_seqlens_k = on_cuda(t2.in.cu_seqlens_k);
  EXPECT_TRUE(throws_error([&] { validate_plan_inputs(t2.in); }, kType, "cu_seqlens_k: must be on the same device"));
}

TEST(Validation, LastDimMustBeContiguous) {
  EXPECT_TRUE(bshd_error([](PlanInputs& in) { in.q = last_dim_strided(in.q); }, kArg,
                         "q: last dimension must be contiguous"));
  EXPECT_TRUE(bshd_error([](PlanInputs& in) { in.k = last_dim_strided(in.k); }, kArg,
                         "k: last dimension must be contiguous"));
  EXPECT_TRUE(thd_error([](ThdInputs& t) { t.in.v = last_dim_strided(t.in.v); }, kArg,
                        "v: last dimension must be contiguous"));
  // Other strides are free.
  PlanInputs in = bshd_inputs();
  in.q.strides = {16 * 4 * 9, 16, 16 * 9, 1};  // [B, S, H, D] stored as [B, H, S+pad, D]
  EXPECT_NO_THROW(validate_plan_inputs(in));
}

TEST(Validation, HeadCounts) {
  EXPECT_TRUE(bshd_error([](PlanInputs& in) { in.q = shape_view(DType::kFloat16, {2, 5, 0, 16}); }, kArg,
                         "q: number of heads"));
  EXPECT_TRUE(bshd_error(
      [](PlanInputs& in) {
        in.k = shape_view(DType::kFloat16, {2, 7, 0, 16});
        in.v = shape_view(DType::kFloat16, {2, 7, 0, 8});
      },
      kArg, "k: number of heads"));
  EXPECT_TRUE(bshd_error([](PlanInputs& in) { in.v = shape_view(DType::kFloat16, {2, 7, 1, 8}); }, kArg,
                         "v: number of heads 1 differs from k's"));
  EXPECT_TRUE(bshd_error(
      [](PlanInputs& in) {
        in.k = shape_view(DType::kFloat16, {2, 7, 3, 16});
        in.v = shape_view(DType::kFloat16, {2, 7, 3, 8});
      },
      kArg, "Hq % Hkv must be 0"));
  EXPECT_TRUE(bshd_error([](PlanInputs& in) { in.mask_func = shape_view(DType::kInt32, {2, 3, 10}); }, kArg,
                         "mask_func: Hmask"));
  EXPECT_TRUE(bshd_error([](PlanInputs& in) { in.mask_func = shape_view(DType::kInt32, {5, 3, 10}); }, kArg,
                         "mask_func: Hmask"));
}

TEST(Validation, HeadDims) {
  EXPECT_TRUE(bshd_error([](PlanInputs& in) { in.k = shape_view(DType::kFloat16, {2, 7, 2, 24}); }, kArg,
                         "k: head dim 24"));
  auto set_dqk = [](int64_t d) {
    return [d](PlanInputs& in) {
      in.q = shape_view(DType::kFloat16, {2, 5, 4, d});
      in.k = shape_view(DType::kFloat16, {2, 7, 2, d});
    };
  };
  auto set_dv = [](int64_t d) { return [d](PlanInputs& in) { in.v = shape_view(DType::kFloat16, {2, 7, 2, d}); }; };
  EXPECT_TRUE(bshd_error(set_dqk(12), kUnsupported, "head_dim_qk"));
  EXPECT_TRUE(bshd_error(set_dqk(264), kUnsupported, "head_dim_qk"));
  EXPECT_TRUE(bshd_error(set_dqk(0), kUnsupported, "head_dim_qk"));
  EXPECT_TRUE(bshd_error(set_dv(4), kUnsupported, "head_dim_v"));
  EXPECT_TRUE(bshd_error(set_dv(272), kUnsupported, "head_dim_v"));
  PlanInputs in = bshd_inputs();
  set_dqk(256)(in);
  set_dv(8)(in);
  EXPECT_NO_THROW(validate_plan_inputs(in));

  EXPECT_NO_THROW(check_head_dims_reference(8, 256));
  EXPECT_TRUE(throws_error([] { check_head_dims_reference(20, 64); }, kUnsupported, "head_dim_qk"));
  for (auto [dqk, dv] : {std::pair{8, 8}, {128, 128}, {64, 8}, {192, 128}, {256, 256}}) {
    EXPECT_NO_THROW(check_head_dims_gpu(dqk, dv)) << dqk << "x" << dv;
  }
  for (auto [dqk, dv] : {std::pair{136, 128}, {192, 192}, {256, 128}, {128, 256}, {192, 64}}) {
    EXPECT_TRUE(throws_error([=] { check_head_dims_gpu(dqk, dv); }, kUnsupported, "not supported on the GPU"))
        << dqk << "x" << dv;
  }
  EXPECT_TRUE(throws_error([] { check_head_dims_gpu(100, 64); }, kUnsupported, "head_dim_qk"));
}

TEST(Validation, BshdBatchAndLengths) {
  EXPECT_TRUE(bshd_error(
      [](PlanInputs& in) {
        in.k = shape_view(DType::kFloat16, {3, 7, 2, 16});
      },
      kArg, "k: batch 3"));
  EXPECT_TRUE(bshd_error([](PlanInputs& in) { in.v = shape_view(DType::kFloat16, {1, 7, 2, 8}); }, kArg, "v: batch 1"));
  EXPECT_TRUE(bshd_error([](PlanInputs& in) { in.v = shape_view(DType::kFloat16, {2, 6, 2, 8}); }, kArg,
                         "v: sequence length 6"));
  // Totals at or past 2^31 rows are rejected (views carry no data, nothing is read).
  EXPECT_TRUE(bshd_error(
      [](PlanInputs& in) {
        in.q = shape_view(DType::kFloat16, {2, int64_t(1) << 30, 4, 16});
        in.mask_func = shape_view(DType::kInt32, {1, 3, int64_t(1) << 31});
      },
      kArg, "below 2^31"));
}

TEST(Validation, MaskShape) {
  EXPECT_TRUE(bshd_error([](PlanInputs& in) { in.mask_func = shape_view(DType::kInt32, {1, 2, 10}); }, kArg,
                         "nfunc (dim 1) must be positive and odd, got 2"));
  EXPECT_TRUE(bshd_error([](PlanInputs& in) { in.mask_func = shape_view(DType::kInt32, {1, 0, 10}); }, kArg,
                         "nfunc (dim 1) must be positive and odd, got 0"));
  EXPECT_TRUE(bshd_error([](PlanInputs& in) { in.mask_func = shape_view(DType::kInt32, {1, 3, 9}); }, kArg,
                         "mask_func: length (dim 2) must be B*Sq = 10"));
  EXPECT_TRUE(thd_error([](ThdInputs& t) { t.in.mask_func = shape_view(DType::kInt32, {4, 1, 10}); }, kArg,
                        "mask_func: length (dim 2) must be Tq = 9"));
  EXPECT_TRUE(bshd_error(
      [](PlanInputs& in) {
        in.mask_func.strides = {40, 1, 3};  // last dim strided
      },
      kArg, "mask_func: must be contiguous"));
}

TEST(Validation, ThdShapes) {
  EXPECT_TRUE(thd_error([](ThdInputs& t) { t.in.v = shape_view(DType::kBFloat16, {10, 2, 8}); }, kArg,
                        "v: total length 10"));
  EXPECT_TRUE(thd_error([](ThdInputs& t) { t.cu_q = {0}; t.cu_k = {0}; t.bind(); }, kArg, "cu_seqlens_q: must be a 1-D"));
  {
    ThdInputs t;
    t.in.cu_seqlens_q = shape_view(DType::kInt32, {1, 3}, DeviceType::kCPU, t.cu_q.data());
    EXPECT_TRUE(throws_error([&] { validate_plan_inputs(t.in); }, kArg, "cu_seqlens_q: must be a 1-D"));
  }
  EXPECT_TRUE(thd_error([](ThdInputs& t) { t.cu_k = {0, 6, 9, 11}; t.bind(); }, kArg, "cu_seqlens_k: must be a 1-D int32 tensor"));
  {
    ThdInputs t;
    std::vector<int32_t> spaced = {0, -1, 4, -1, 9};
    t.in.cu_seqlens_q = shape_view(DType::kInt32, {3}, DeviceType::kCPU, spaced.data());
    t.in.cu_seqlens_q.strides[0] = 2;
    EXPECT_TRUE(throws_error([&] { validate_plan_inputs(t.in); }, kArg, "cu_seqlens_q: must be contiguous"));
  }
  EXPECT_TRUE(thd_error([](ThdInputs& t) { t.in.max_seqlen_q = 0; }, kArg, "longer than max_seqlen_q = 0"));
  EXPECT_TRUE(thd_error([](ThdInputs& t) { t.in.max_seqlen_k = -3; }, kArg, "max_seqlen_k: must be >= 0"));
}

TEST(Validation, CuSeqlensValues) {
  EXPECT_TRUE(thd_error([](ThdInputs& t) { t.cu_q = {1, 4, 9}; t.bind(); }, kArg, "cu_seqlens_q: must start at 0, got 1"));
  EXPECT_TRUE(thd_error([](ThdInputs& t) { t.cu_k = {0, 6, 10}; t.bind(); }, kArg,
                        "cu_seqlens_k: must end at the total length 11, got 10"));
  EXPECT_TRUE(thd_error([](ThdInputs& t) { t.cu_q = {0, 5, 4}; t.bind(); }, kArg, "cu_seqlens_q: must be nondecreasing"));
  EXPECT_TRUE(thd_error([](ThdInputs& t) { t.cu_q = {0, 6, 9}; t.bind(); }, kArg,
                        "cu_seqlens_q: sample 0 has length 6, longer than max_seqlen_q = 5"));
  EXPECT_TRUE(thd_error([](ThdInputs& t) { t.cu_k = {0, 4, 11}; t.bind(); }, kArg,
                        "cu_seqlens_k: sample 1 has length 7, longer than max_seqlen_k = 6"));
}

// ---------------------------------------------------------------------------
// validate_endpoints_host
// ---------------------------------------------------------------------------

TEST(Validation, EndpointRules) {
  // THD, Hmask = 4, nfunc = 1: mask [4, 1, 9]; sample 0 rows 0..3 (Sk 6), sample 1 rows 4..8 (Sk 5).
  ThdInputs t;
  const FlexGeometry g = t.validate();
  std::vector<int32_t> mask(4 * 9, 5);
  EXPECT_NO_THROW(validate_endpoints_host(mask.data(), g));
  mask[2] = 6;  // Sk of sample 0: allowed
  EXPECT_NO_THROW(validate_endpoints_host(mask.data(), g));
  mask[2 * 9 + 6] = -1;  // head 2, row 6 = sample 1, query 2
  EXPECT_TRUE(throws_error([&] { validate_endpoints_host(mask.data(), g); }, kArg,
                           "mask_func[2, 0, 6] (sample 1, query 2) = -1 is negative"));
  mask[2 * 9 + 6] = 6;  // past sample 1's key length 5
  EXPECT_TRUE(throws_error([&] { validate_endpoints_host(mask.data(), g); }, kArg,
                           "past the sample's key length 5"));

  // nfunc = 3, BSHD: decreasing endpoints within a row.
  HeadConfig h;
  h.nfunc = 3;
  const FlexGeometry gb = make_bshd_geometry(2, 2, 4, h);  // mask [1, 3, 4]
  std::vector<int32_t> m = {1, 1, 1, 1, /* F1 */ 2, 2, 2, 2, /* F2 */ 4, 4, 3, 4};
  EXPECT_NO_THROW(validate_endpoints_host(m.data(), gb));
  m[4 + 3] = 0;  // row 3 (sample 1, query 1): F1 = 0 < F0 = 1
  EXPECT_TRUE(throws_error([&] { validate_endpoints_host(m.data(), gb); }, kArg,
                           "nondecreasing within a row, but mask_func[0, 1, 3] (sample 1, query 1) = 0 < previous"));
}

TEST(Validation, EndpointErrorLocatesRowsAfterEmptySamples) {
  ThdInputs t;
  t.cu_q = {0, 0, 9};
  t.cu_k = {0, 5, 11};
  t.in.max_seqlen_q = 9;
  t.bind();
  const FlexGeometry g = t.validate();
  std::vector<int32_t> mask(4 * 9, 0);
  mask[3] = 7;  // row 3 belongs to sample 1 (sample 0 is empty), Sk = 6
  EXPECT_TRUE(throws_error([&] { validate_endpoints_host(mask.data(), g); }, kArg, "(sample 1, query 3) = 7"));
}

// ---------------------------------------------------------------------------
// Call checks
// ---------------------------------------------------------------------------

TEST(Validation, SoftmaxScale) {
  EXPECT_NO_THROW(check_softmax_scale(0.125f, true));
  EXPECT_NO_THROW(check_softmax_scale(0.0f, true));
  EXPECT_NO_THROW(check_softmax_scale(-0.5f, false));
  EXPECT_TRUE(throws_error([] { check_softmax_scale(-0.5f, true); }, kArg,
                           "softmax_scale: must be non-negative when max_logit is requested"));
  EXPECT_TRUE(throws_error([] { check_softmax_scale(INFINITY, false); }, kArg, "softmax_scale: must be finite"));
  EXPECT_TRUE(throws_error([] { check_softmax_scale(NAN, false); }, kArg, "softmax_scale: must be finite"));
  EXPECT_FLOAT_EQ(default_softmax_scale(64), 0.125f);
}

TEST(Validation, SameTensorShape) {
  const int64_t shape[3] = {4, 9, 8};
  const TensorView ok = shape_view(DType::kFloat16, {4, 9, 8});
  EXPECT_NO_THROW(check_same_tensor_shape(ok, "out", shape, 3, DType::kFloat16, DeviceType::kCPU, 0));
  EXPECT_TRUE(throws_error([&] { check_same_tensor_shape(TensorView(), "out", shape, 3, DType::kFloat16, DeviceType::kCPU, 0); },
                           kArg, "out: is required"));
  EXPECT_TRUE(throws_error([&] { check_same_tensor_shape(ok, "out", shape, 3, DType::kBFloat16, DeviceType::kCPU, 0); },
                           kType, "out: dtype must be bfloat16, got float16"));
  EXPECT_TRUE(throws_error(
      [&] { check_same_tensor_shape(ok, "out", shape, 3, DType::kBFloat16, DeviceType::kCPU, 0, "the plan's"); }, kType,
      "out: dtype must be bfloat16, got float16 (the plan's)"));
  EXPECT_TRUE(throws_error([&] { check_same_tensor_shape(ok, "out", shape, 3, DType::kFloat16, DeviceType::kCUDA, 0); },
                           kType, "out: must be on cuda:0, got cpu:0"));
  const TensorView wrong = shape_view(DType::kFloat16, {4, 8, 8});
  EXPECT_TRUE(throws_error([&] { check_same_tensor_shape(wrong, "lse", shape, 3, DType::kFloat16, DeviceType::kCPU, 0); },
                           kArg, "lse: shape must be [4, 9, 8], got [4, 8, 8]"));
  EXPECT_TRUE(throws_error([&] { check_same_tensor_shape(ok, "out", shape, 2, DType::kFloat16, DeviceType::kCPU, 0); },
                           kArg, "out: shape must be [4, 9]"));
  EXPECT_TRUE(throws_error(
      [&] { check_same_tensor_shape(last_dim_strided(ok), "dq", shape, 3, DType::kFloat16, DeviceType::kCPU, 0); },
      kArg, "dq: last dimension must be contiguous"));
}

TEST(Validation, LastDimContiguousCheck) {
  TensorView v = shape_view(DType::kFloat32, {3, 1});
  v.strides[1] = 7;  // a size-1 last dim may have any stride
  EXPECT_NO_THROW(check_last_dim_contiguous(v, "x"));
  EXPECT_TRUE(throws_error([] { check_last_dim_contiguous(TensorView(), "x"); }, kArg, "x: last dimension"));
  EXPECT_TRUE(throws_error([] { check_last_dim_contiguous(last_dim_strided(shape_view(DType::kFloat32, {3, 2})), "x"); },
                           kArg, "x: last dimension must be contiguous (stride 1), got stride 2"));
}

TEST(Validation, ExpectedShapes) {
  const FlexGeometry gb = validate_plan_inputs(bshd_inputs());
  ThdInputs t;
  const FlexGeometry gt = t.validate();
  auto shape = [](void (*fn)(const FlexGeometry&, int64_t*, int*), const FlexGeometry& g) { return shape_vec(fn, g); };
  using V = std::vector<int64_t>;
  EXPECT_EQ(shape(expected_q_shape, gb), (V{2, 5, 4, 16}));
  EXPECT_EQ(shape(expected_k_shape, gb), (V{2, 7, 2, 16}));
  EXPECT_EQ(shape(expected_v_shape, gb), (V{2, 7, 2, 8}));
  EXPECT_EQ(shape(expected_out_shape, gb), (V{2, 5, 4, 8}));
  EXPECT_EQ(shape(expected_lse_shape, gb), (V{2, 4, 5}));
  EXPECT_EQ(shape(expected_q_shape, gt), (V{9, 4, 16}));
  EXPECT_EQ(shape(expected_k_shape, gt), (V{11, 2, 16}));
  EXPECT_EQ(shape(expected_v_shape, gt), (V{11, 2, 8}));
  EXPECT_EQ(shape(expected_out_shape, gt), (V{9, 4, 8}));
  EXPECT_EQ(shape(expected_lse_shape, gt), (V{4, 9}));
}

// ---------------------------------------------------------------------------
// tensor_view_from_fs (core/tensor_view.h)
// ---------------------------------------------------------------------------

TEST(Validation, TensorViewFromFs) {
  float buf[24] = {};
  int64_t shape[3] = {2, 3, 4};
  fs_tensor_t t{};
  t.data = buf;
  t.device = {FS_DEVICE_CPU, 0};
  t.ndim = 3;
  t.dtype = {FS_DTYPE_FLOAT, 32, 1};
  t.shape = shape;
  t.strides = nullptr;
  t.byte_offset = 8;
  TensorView v = tensor_view_from_fs(&t, "q");
  EXPECT_EQ(v.dtype, DType::kFloat32);
  EXPECT_EQ(v.strides[0], 12);
  EXPECT_EQ(v.strides[1], 4);
  EXPECT_EQ(v.strides[2], 1);
  EXPECT_EQ(v.data, static_cast<void*>(buf + 2));
  EXPECT_TRUE(v.is_contiguous());
  EXPECT_FALSE(tensor_view_from_fs(nullptr, "lse").defined());

  int64_t strides[3] = {40, 8, 1};
  t.strides = strides;
  EXPECT_EQ(tensor_view_from_fs(&t, "q").strides[0], 40);
  EXPECT_FALSE(tensor_view_from_fs(&t, "q").is_contiguous());

  fs_tensor_t bad = t;
  bad.ndim = 7;
  EXPECT_TRUE(throws_error([&] { tensor_view_from_fs(&bad, "q"); }, kArg, "q: rank 7"));
  bad = t;
  bad.shape = nullptr;
  EXPECT_TRUE(throws_error([&] { tensor_view_from_fs(&bad, "k"); }, kArg, "k: shape pointer is NULL"));
  bad = t;
  bad.dtype = {FS_DTYPE_FLOAT, 8, 1};
  EXPECT_TRUE(throws_error([&] { tensor_view_from_fs(&bad, "v"); }, kType, "v: unsupported dtype"));
  bad = t;
  bad.dtype = {FS_DTYPE_FLOAT, 16, 2};
  EXPECT_TRUE(throws_error([&] { tensor_view_from_fs(&bad, "v"); }, kType, "v: unsupported dtype"));
  bad = t;
  bad.device = {3, 0};
  EXPECT_TRUE(throws_error([&] { tensor_view_from_fs(&bad, "out"); }, kType, "out: unsupported device type 3"));
  int64_t neg[3] = {2, -1, 4};
  bad = t;
  bad.shape = neg;
  EXPECT_TRUE(throws_error([&] { tensor_view_from_fs(&bad, "dq"); }, kArg, "dq: negative extent -1 in dimension 1"));

  EXPECT_EQ(dtype_from_fs({FS_DTYPE_BFLOAT, 16, 1}), DType::kBFloat16);
  EXPECT_EQ(dtype_from_fs(dtype_to_fs(DType::kFloat16)), DType::kFloat16);
  EXPECT_EQ(dtype_from_fs(dtype_to_fs(DType::kInt32)), DType::kInt32);
}

}  // namespace
}  // namespace flashspan::test
