// C ABI and C++ API contract tests on CPU tensors: plan creation, the
// check_support -> compile -> execute lifecycle, status codes and messages,
// plan compatibility rules. Numerics are checked against the reference called directly.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "flashspan/flashspan.hpp"

namespace {

using namespace flashspan::api;

struct Problem {
  int B = 2, S = 40, Sk = 56, Hq = 4, Hkv = 2, D = 16;
  std::vector<float> q, k, v, out, lse, dout, dq, dk, dv;
  std::vector<int32_t> mask;  // [1, 3, B*S]
  TensorDesc tq, tk, tv, tout, tlse, tmask, tdout, tdq, tdk, tdv;

  explicit Problem(uint32_t seed = 1) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> n(0.f, 1.f);
    auto fill = [&](std::vector<float>& x, size_t count) {
      x.resize(count);
      for (auto& e : x) e = n(rng);
    };
    fill(q, size_t(B) * S * Hq * D);
    fill(k, size_t(B) * Sk * Hkv * D);
    fill(v, size_t(B) * Sk * Hkv * D);
    fill(dout, size_t(B) * S * Hq * D);
    out.assign(size_t(B) * S * Hq * D, std::numeric_limits<float>::quiet_NaN());
    lse.assign(size_t(B) * Hq * S, std::numeric_limits<float>::quiet_NaN());
    dq.assign(q.size(), std::numeric_limits<float>::quiet_NaN());
    dk.assign(k.size(), std::numeric_limits<float>::quiet_NaN());
    dv.assign(v.size(), std::numeric_limits<float>::quiet_NaN());
    // Row i sees [0, min(i+1, Sk)) U [F1, F2): a causal prefix and a random window.
    mask.resize(size_t(3) * B * S);
    std::uniform_int_distribution<int> u(0, Sk);
    for (int r = 0; r < B * S; ++r) {
      int f0 = std::min(r % S + 1, Sk), f1 = u(rng), f2 = u(rng);
      if (f1 < f0) f1 = f0;
      if (f2 < f1) f2 = f1;
      mask[r] = f0;
      mask[B * S + r] = f1;
      mask[2 * B * S + r] = f2;
    }
    const fs_device_t cpu = Device::cpu();
    tq = TensorDesc(q.data(), kFloat32, cpu, {B, S, Hq, D});
    tk = TensorDesc(k.data(), kFloat32, cpu, {B, Sk, Hkv, D});
    tv = TensorDesc(v.data(), kFloat32, cpu, {B, Sk, Hkv, D});
    tout = TensorDesc(out.data(), kFloat32, cpu, {B, S, Hq, D});
    tlse = TensorDesc(lse.data(), kFloat32, cpu, {B, Hq, S});
    tmask = TensorDesc(mask.data(), kInt32, cpu, {1, 3, B * S});
    tdout = TensorDesc(dout.data(), kFloat32, cpu, {B, S, Hq, D});
    tdq = TensorDesc(dq.data(), kFloat32, cpu, {B, S, Hq, D});
    tdk = TensorDesc(dk.data(), kFloat32, cpu, {B, Sk, Hkv, D});
    tdv = TensorDesc(dv.data(), kFloat32, cpu, {B, Sk, Hkv, D});
  }

  bool visible(int b, int i, int j) const {
    const int r = b * S + i;
    return j < mask[r] || (j >= mask[B * S + r] && j < mask[2 * B * S + r]);
  }
};

template <typename F>
std::string error_of(F&& f, fs_status_t expect) {
  try {
    f();
  } catch (const Exception& e) {
    EXPECT_EQ(e.status(), expect) << e.what();
    return e.what();
  }
  ADD_FAILURE() << "expected an exception";
  return "";
}

TEST(CApi, VersionAndAvailability) {
  EXPECT_EQ(fs_abi_version(), FLASHSPAN_ABI_VERSION);
  EXPECT_STRNE(fs_version(), "");
  const int32_t avail = fs_cuda_available();
  EXPECT_TRUE(avail == 0 || avail == 1);
}

TEST(CApi, ForwardMatchesNaiveSoftmax) {
  Problem p;
  MaskPlan plan = MaskPlan::create(PlanArgs{&p.tmask, &p.tq, &p.tk, &p.tv});
  const fs_mask_plan_info_t info = plan.info();
  EXPECT_EQ(info.batch, p.B);
  EXPECT_EQ(info.num_heads_q, p.Hq);
  EXPECT_EQ(info.nfunc, 3);
  EXPECT_EQ(info.has_backward, 0);
  EXPECT_GT(info.bytes, 0);

  FwdArgs args{&p.tq, &p.tk, &p.tv, &p.tout, &plan};
  args.with_lse(&p.tlse);
  FlexAttentionFwd fwd(args);
  fwd.check_support();
  fwd.compile();
  EXPECT_EQ(fwd.workspace_size(), 0u);
  fwd.execute(args, nullptr, 0);

  // Naive softmax in double, independent of the reference code.
  const double scale = 1.0 / std::sqrt(double(p.D));
  const int g = p.Hq / p.Hkv;
  double max_err = 0;
  for (int b = 0; b < p.B; ++b)
    for (int h = 0; h < p.Hq; ++h)
      for (int i = 0; i < p.S; ++i) {
        std::vector<double> s(p.Sk, -INFINITY);
        double m = -INFINITY;
        for (int j = 0; j < p.Sk; ++j) {
          if (!p.visible(b, i, j)) continue;
          double acc = 0;
          for (int d = 0; d < p.D; ++d)
            acc += double(p.q[((size_t(b) * p.S + i) * p.Hq + h) * p.D + d]) *
                   p.k[((size_t(b) * p.Sk + j) * p.Hkv + h / g) * p.D + d];
          s[j] = acc * scale;
          m = std::max(m, s[j]);
        }
        double l = 0;
        for (int j = 0; j < p.Sk; ++j)
          if (s[j] > -INFINITY) l += std::exp(s[j] - m);
        const double lse = m + std::log(l);
        EXPECT_NEAR(p.lse[(size_t(b) * p.Hq + h) * p.S + i], lse, 1e-4);
        for (int d = 0; d < p.D; ++d) {
          double o = 0;
          for (int j = 0; j < p.Sk; ++j)
            if (s[j] > -INFINITY) o += std::exp(s[j] - lse) * p.v[((size_t(b) * p.Sk + j) * p.Hkv + h / g) * p.D + d];
          max_err = std::max(max_err, std::abs(o - p.out[((size_t(b) * p.S + i) * p.Hq + h) * p.D + d]));
        }
      }
  EXPECT_LT(max_err, 1e-4);
}

TEST(CApi, BackwardLifecycleWritesEveryGradient) {
  Problem p(7);
  MaskPlan plan = MaskPlan::create(PlanArgs{&p.tmask, &p.tq, &p.tk, &p.tv}.with_backward(true));
  EXPECT_EQ(plan.info().has_backward, 1);
  FwdArgs fa{&p.tq, &p.tk, &p.tv, &p.tout, &plan};
  fa.with_lse(&p.tlse);
  FlexAttentionFwd fwd(fa);
  fwd.check_support();
  fwd.compile();
  fwd.execute(fa, nullptr, 0);
  BwdArgs ba{&p.tq, &p.tk, &p.tv, &p.tout, &p.tdout, &p.tlse, &p.tdq, &p.tdk, &p.tdv, &plan};
  FlexAttentionBwd bwd(ba);
  bwd.check_support();
  bwd.compile();
  bwd.execute(ba, nullptr, 0);
  for (float x : p.dq) ASSERT_TRUE(std::isfinite(x));
  for (float x : p.dk) ASSERT_TRUE(std::isfinite(x));
  for (float x : p.dv) ASSERT_TRUE(std::isfinite(x));
}

// dlse (the LSE gradient input): the result equals the reference's with the same dlse and
// differs from the run without it; presence and shape are part of the compiled descriptor.
TEST(CApi, BackwardTakesLseGradient) {
  Problem p(8);
  MaskPlan plan = MaskPlan::create(PlanArgs{&p.tmask, &p.tq, &p.tk, &p.tv}.with_backward(true));
  FwdArgs fa{&p.tq, &p.tk, &p.tv, &p.tout, &plan};
  fa.with_lse(&p.tlse);
  FlexAttentionFwd fwd(fa);
  fwd.check_support();
  fwd.compile();
  fwd.execute(fa, nullptr, 0);
  BwdArgs ba{&p.tq, &p.tk, &p.tv, &p.tout, &p.tdout, &p.tlse, &p.tdq, &p.tdk, &p.tdv, &plan};
  FlexAttentionBwd plain(ba);
  plain.check_support();
  plain.compile();
  plain.execute(ba, nullptr, 0);
  const std::vector<float> dq0 = p.dq, dk0 = p.dk, dv0 = p.dv;

  std::vector<float> dlse(p.lse.size());
  std::mt19937 rng(11);
  std::normal_distribution<float> n(0.f, 1.f);
  for (auto& x : dlse) x = n(rng);
  TensorDesc tdlse(dlse.data(), kFloat32, Device::cpu(), {p.B, p.Hq, p.S});
  BwdArgs bl = ba;
  bl.with_dlse(&tdlse);
  FlexAttentionBwd with(bl);
  with.check_support();
  with.compile();
  with.execute(bl, nullptr, 0);
  EXPECT_EQ(p.dv, dv0) << "dlse must not change dv";
  EXPECT_NE(p.dq, dq0) << "dlse must change dq";
  EXPECT_NE(p.dk, dk0) << "dlse must change dk";
  // dq must equal the plain dq plus the dlse term, which is linear in dlse: run with -dlse
  // and check that the two dq average back to the plain one.
  const std::vector<float> dq_plus = p.dq;
  for (auto& x : dlse) x = -x;
  with.execute(bl, nullptr, 0);
  for (size_t i = 0; i < dq0.size(); ++i) {
    ASSERT_NEAR(0.5f * (dq_plus[i] + p.dq[i]), dq0[i], 1e-4f * (1.f + std::fabs(dq0[i]))) << i;
  }

  std::string msg = error_of([&] { plain.execute(bl, nullptr, 0); }, FS_STATUS_INVALID_ARGUMENT);
  EXPECT_NE(msg.find("dlse"), std::string::npos) << msg;
  msg = error_of([&] { with.execute(ba, nullptr, 0); }, FS_STATUS_INVALID_ARGUMENT);
  EXPECT_NE(msg.find("dlse"), std::string::npos) << msg;
  TensorDesc wrong(dlse.data(), kFloat32, Device::cpu(), {p.B, p.S, p.Hq});
  BwdArgs bw = ba;
  bw.with_dlse(&wrong);
  msg = error_of([&] { FlexAttentionBwd bad(bw); }, FS_STATUS_INVALID_ARGUMENT);
  EXPECT_NE(msg.find("dlse"), std::string::npos) << msg;
}

TEST(CApi, ExecuteBeforeCompileIsAnError) {
  Problem p;
  MaskPlan plan = MaskPlan::create(PlanArgs{&p.tmask, &p.tq, &p.tk, &p.tv});
  FwdArgs args{&p.tq, &p.tk, &p.tv, &p.tout, &plan};
  FlexAttentionFwd fwd(args);
  const std::string msg = error_of([&] { fwd.execute(args, nullptr, 0); }, FS_STATUS_INVALID_ARGUMENT);
  EXPECT_NE(msg.find("compile()"), std::string::npos) << msg;
}

TEST(CApi, BackwardNeedsBackwardPlan) {
  Problem p;
  MaskPlan plan = MaskPlan::create(PlanArgs{&p.tmask, &p.tq, &p.tk, &p.tv});
  BwdArgs ba{&p.tq, &p.tk, &p.tv, &p.tout, &p.tdout, &p.tlse, &p.tdq, &p.tdk, &p.tdv, &plan};
  const std::string msg = error_of([&] { FlexAttentionBwd bwd(ba); }, FS_STATUS_INVALID_ARGUMENT);
  EXPECT_NE(msg.find("build_backward"), std::string::npos) << msg;
  EXPECT_NE(msg.find("PlanArgs::with_backward(true)"), std::string::npos) << msg;
}

TEST(CApi, IncompatiblePlanIsRejected) {
  Problem p;
  MaskPlan plan = MaskPlan::create(PlanArgs{&p.tmask, &p.tq, &p.tk, &p.tv});
  FwdArgs args{&p.tq, &p.tk, &p.tv, &p.tout, &plan};
  FlexAttentionFwd fwd(args);
  fwd.check_support();
  fwd.compile();
  // A plan of another geometry (one batch only).
  Problem other(3);
  TensorDesc tq1(other.q.data(), kFloat32, Device::cpu(), {1, other.S, other.Hq, other.D});
  TensorDesc tk1(other.k.data(), kFloat32, Device::cpu(), {1, other.Sk, other.Hkv, other.D});
  TensorDesc tv1(other.v.data(), kFloat32, Device::cpu(), {1, other.Sk, other.Hkv, other.D});
  std::vector<int32_t> causal(other.S);
  for (int i = 0; i < other.S; ++i) causal[i] = std::min(i + 1, other.Sk);
  TensorDesc tm1(causal.data(), kInt32, Device::cpu(), {1, 1, other.S});
  MaskPlan plan1 = MaskPlan::create(PlanArgs{&tm1, &tq1, &tk1, &tv1});
  FwdArgs wrong{&p.tq, &p.tk, &p.tv, &p.tout, &plan1};
  const std::string msg = error_of([&] { fwd.execute(wrong, nullptr, 0); }, FS_STATUS_INVALID_ARGUMENT);
  EXPECT_NE(msg.find("plan: geometry (batch 1 vs 2"), std::string::npos) << msg;
}

TEST(CApi, MismatchedExecuteTensorIsRejected) {
  Problem p;
  MaskPlan plan = MaskPlan::create(PlanArgs{&p.tmask, &p.tq, &p.tk, &p.tv});
  FwdArgs args{&p.tq, &p.tk, &p.tv, &p.tout, &plan};
  FlexAttentionFwd fwd(args);
  fwd.check_support();
  fwd.compile();
  FwdArgs with_lse = args;
  with_lse.with_lse(&p.tlse);  // lse was not given at construction
  std::string msg = error_of([&] { fwd.execute(with_lse, nullptr, 0); }, FS_STATUS_INVALID_ARGUMENT);
  EXPECT_NE(msg.find("lse"), std::string::npos) << msg;
  TensorDesc strided(p.out.data(), kFloat32, Device::cpu(), {p.B, p.S, p.Hq, p.D},
                     {int64_t(p.S) * p.Hq * p.D, int64_t(p.D), int64_t(p.S) * p.D, 1});
  FwdArgs bad = args;
  bad.out = &strided;
  msg = error_of([&] { fwd.execute(bad, nullptr, 0); }, FS_STATUS_INVALID_ARGUMENT);
  EXPECT_NE(msg.find("out"), std::string::npos) << msg;
}

TEST(CApi, ErrorsCarryStatusAndMessage) {
  Problem p;
  // Even nfunc.
  std::vector<int32_t> m2(size_t(2) * p.B * p.S, 1);
  TensorDesc tm2(m2.data(), kInt32, Device::cpu(), {1, 2, p.B * p.S});
  std::string msg = error_of([&] { MaskPlan::create(PlanArgs{&tm2, &p.tq, &p.tk, &p.tv}); },
                             FS_STATUS_INVALID_ARGUMENT);
  EXPECT_NE(msg.find("nfunc"), std::string::npos) << msg;
  EXPECT_NE(std::string(fs_get_last_error()).find("nfunc"), std::string::npos);
  // Wrong mask dtype.
  TensorDesc tmf(p.q.data(), kFloat32, Device::cpu(), {1, 1, p.B * p.S});
  msg = error_of([&] { MaskPlan::create(PlanArgs{&tmf, &p.tq, &p.tk, &p.tv}); }, FS_STATUS_TYPE_ERROR);
  EXPECT_NE(msg.find("mask_func"), std::string::npos) << msg;
  // Endpoint past the key length.
  std::vector<int32_t> bad = p.mask;
  bad[5] = p.Sk + 1;
  bad[p.B * p.S + 5] = p.Sk + 1;
  bad[2 * p.B * p.S + 5] = p.Sk + 1;
  TensorDesc tbad(bad.data(), kInt32, Device::cpu(), {1, 3, p.B * p.S});
  msg = error_of([&] { MaskPlan::create(PlanArgs{&tbad, &p.tq, &p.tk, &p.tv}); }, FS_STATUS_INVALID_ARGUMENT);
  EXPECT_NE(msg.find("past the sample's key length"), std::string::npos) << msg;
  // NULL arguments never crash.
  EXPECT_EQ(fs_create_mask_plan(nullptr, nullptr), FS_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(fs_mask_plan_get_info(nullptr, nullptr), FS_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(fs_flex_fwd_execute(nullptr, nullptr, nullptr, 0, nullptr), FS_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(fs_mask_plan_destroy(nullptr), FS_STATUS_SUCCESS);
  // Negative scale with max_logit requested.
  MaskPlan plan = MaskPlan::create(PlanArgs{&p.tmask, &p.tq, &p.tk, &p.tv});
  std::vector<float> ml(p.Hq);
  TensorDesc tml(ml.data(), kFloat32, Device::cpu(), {p.Hq});
  FwdArgs fa{&p.tq, &p.tk, &p.tv, &p.tout, &plan};
  fa.with_max_logit(&tml).with_scale(-0.5f);
  msg = error_of([&] { FlexAttentionFwd fwd(fa); }, FS_STATUS_INVALID_ARGUMENT);
  EXPECT_NE(msg.find("softmax_scale"), std::string::npos) << msg;
}

TEST(CApi, PlanArraysAreNamedAndCopyable) {
  Problem p;
  MaskPlan plan = MaskPlan::create(PlanArgs{&p.tmask, &p.tq, &p.tk, &p.tv}.with_backward(true));
  int32_t n = 0;
  check(fs_mask_plan_num_arrays(plan.handle(), &n));
  ASSERT_GT(n, 0);
  bool saw_mask = false;
  for (int32_t i = 0; i < n; ++i) {
    const char* name = nullptr;
    check(fs_mask_plan_array_name(plan.handle(), i, &name));
    ASSERT_NE(name, nullptr);
    saw_mask |= std::string(name) == "mask_func";
    (void)plan.array(name);
  }
  EXPECT_TRUE(saw_mask);
  EXPECT_EQ(plan.array("mask_func"), p.mask);
  const std::vector<int32_t> cu = plan.array("cu_seqlens_q");
  ASSERT_EQ(cu.size(), size_t(p.B + 1));
  EXPECT_EQ(cu.back(), p.B * p.S);
  std::string msg = error_of([&] { (void)plan.array("no_such_array"); }, FS_STATUS_INVALID_ARGUMENT);
  EXPECT_NE(msg.find("no_such_array"), std::string::npos);
  const char* name = nullptr;
  EXPECT_EQ(fs_mask_plan_array_name(plan.handle(), n, &name), FS_STATUS_INVALID_ARGUMENT);
}

}  // namespace
