// FP8 SDPA (docs/SDPA.md "FP8 SDPA") through the C++ API on CPU tensors: every FP8 rule of the validation with
// the argument it names; the CPU reference against the 16-bit path's reference on the same (FP8-representable)
// values, within the bound of the FP8 quantization; what the scale factors do (stored inputs x 2 with their
// descale / 2 give bitwise the same results; scale_o scales the stored O); the amax outputs against the outputs
// themselves; and the rules of CUDA tensors by check_support (no GPU needed): the sm90 FP8 forward's refusals,
// the FP8 forward on the sm80 kernels (its switch, FLASHSPAN_SDPA_FP8_SM80, and its rule) and the FP8 backward on
// the sm80 kernels (on by default: its switch, FLASHSPAN_SDPA_FP8_BWD, sdpa_fp8_bwd_refusal's rule, the messages).
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/fp8_conv.h"
#include "core/sdpa_problem.h"
#include "dispatch/sdpa_launch.h"  // set_sdpa_fp8_sm90_enabled, sdpa_fp8_bwd_refusal, sdpa_check_features_gpu
#include "flashspan/flashspan.hpp"
#include "kernels/sm90/tile_sm90.h"  // sample_maps_bytes
#include "scoped_env.h"
#ifdef FLASHSPAN_WITH_CUDA
#include "kernels/common/fp8_prepass.h"  // fp8_widen_vec_enabled
#include "kernels/sm90/sdpa_fp8_bwd_sm90.h"     // sdpa_fp8_bwd_sm90_store_enabled
#endif

namespace {

using namespace flashspan::api;
using flashspan::DType;
using flashspan::test::ScopedEnv;
using flashspan::test::ScopedSwitch;

constexpr fs_dtype_t kF64{FS_DTYPE_FLOAT, 64, 1};
fs_device_t cpu() { return {FS_DEVICE_CPU, 0}; }
fs_device_t cuda() { return {FS_DEVICE_CUDA, 0}; }

DType dtype_of(fs_dtype_t t) { return t.code == FS_DTYPE_FLOAT8_E5M2 ? DType::kFloat8E5M2 : DType::kFloat8E4M3; }

std::vector<uint8_t> encode(const std::vector<double>& x, fs_dtype_t t) {
  std::vector<uint8_t> b(x.size());
  for (size_t i = 0; i < x.size(); ++i)
    b[i] = flashspan::float_to_fp8_bits(float(x[i]), flashspan::fp8_format(dtype_of(t)));
  return b;
}

std::vector<double> decode(const std::vector<uint8_t>& b, fs_dtype_t t) {
  std::vector<double> x(b.size());
  for (size_t i = 0; i < b.size(); ++i) x[i] = flashspan::fp8_bits_to_float(b[i], flashspan::fp8_format(dtype_of(t)));
  return x;
}

double max_abs(const std::vector<double>& x) {
  double m = 0;
  for (double e : x) m = std::max(m, std::fabs(e));
  return m;
}

std::vector<double> randn(size_t n, uint64_t seed, double mag) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> d;
  std::vector<double> x(n);
  for (auto& e : x) e = std::clamp(d(rng) * mag, -4 * mag, 4 * mag);
  return x;
}

enum FwdScale { kDescaleQ, kDescaleK, kDescaleV, kDescaleS, kScaleS, kScaleO, kNumFwdScales };

// One FP8 forward call: [B, H, S, D] CPU tensors, scale factors, outputs.
struct Fwd {
  int64_t B = 2, Hq = 4, Hk = 2, Sq = 9, Skv = 13, D = 32, Dv = 16;
  fs_dtype_t in = kFloat8E4M3, out = kFloat8E4M3;
  bool causal = false;
  float attn_scale = 0.2f;
  std::array<float, kNumFwdScales> scale{1.0f, 1.0f, 1.0f, 1.0f / 448, 448.0f, 1.0f};
  std::array<bool, kNumFwdScales> bind{true, true, true, true, true, true};
  bool bind_amax_s = true;
  fs_device_t dev = cpu();
  std::vector<uint8_t> q, k, v, o;
  std::vector<float> stats, score_max, amax{-1.0f, -1.0f};

  Fwd() { fill(1, 1.0); }
  void fill(uint64_t seed, double mag) {
    q = encode(randn(B * Hq * Sq * D, seed, mag), in);
    k = encode(randn(B * Hk * Skv * D, seed + 1, mag), in);
    v = encode(randn(B * Hk * Skv * Dv, seed + 2, mag), in);
  }
  // Creates the operation (validation); `extra` adds options.
  std::unique_ptr<SdpaFwd> create(const std::function<void(SdpaAttributes&)>& extra = {}) {
    o.assign(B * Hq * Sq * Dv, 0xff);
    stats.assign(B * Hq * Sq, NAN);
    score_max.assign(B * Hq * Sq, NAN);
    TensorDesc qd(nullptr, in, dev, {B, Hq, Sq, D}), kd(nullptr, in, dev, {B, Hk, Skv, D}),
        vd(nullptr, in, dev, {B, Hk, Skv, Dv}), od(nullptr, out, dev, {B, Hq, Sq, Dv}),
        sd(nullptr, kFloat32, dev, {B, Hq, Sq, 1});
    const TensorDesc one(nullptr, kFloat32, dev, {1, 1, 1, 1});
    SdpaAttributes a;
    a.set_attn_scale(attn_scale).set_generate_stats(true).set_causal_mask(causal).set_logit_max(sd);
    if (bind[kDescaleQ]) a.set_descale_q(one);
    if (bind[kDescaleK]) a.set_descale_k(one);
    if (bind[kDescaleV]) a.set_descale_v(one);
    if (bind[kDescaleS]) a.set_descale_s(one);
    if (bind[kScaleS]) a.set_scale_s(one);
    if (bind[kScaleO]) a.set_scale_o(one);
    if (bind_amax_s) a.set_amax_s(one);
    a.set_amax_o(one);
    if (extra) extra(a);
    return std::make_unique<SdpaFwd>(qd, kd, vd, od, &sd, a);
  }
  SdpaVariantPack pack() {
    SdpaVariantPack p;
    p.set(FS_SDPA_Q, q.data()).set(FS_SDPA_K, k.data()).set(FS_SDPA_V, v.data()).set(FS_SDPA_O, o.data());
    p.set(FS_SDPA_STATS, stats.data()).set(FS_SDPA_SCORE_MAX, score_max.data());
    const fs_sdpa_slot_t slots[] = {FS_SDPA_DESCALE_Q, FS_SDPA_DESCALE_K, FS_SDPA_DESCALE_V,
                                    FS_SDPA_DESCALE_S, FS_SDPA_SCALE_S,   FS_SDPA_SCALE_O};
    for (int i = 0; i < kNumFwdScales; ++i)
      if (bind[i]) p.set(slots[i], &scale[i]);
    if (bind_amax_s) p.set(FS_SDPA_AMAX_S, &amax[0]);
    p.set(FS_SDPA_AMAX_O, &amax[1]);
    return p;
  }
  void run() {
    auto op = create();
    op->check_support();
    op->compile();
    op->execute(pack(), nullptr, 0);
  }
};

enum BwdScale {
  kBDescaleQ, kBDescaleK, kBDescaleV, kBDescaleO, kBDescaleDO, kBDescaleS, kBDescaleDP,
  kBScaleS, kBScaleDQ, kBScaleDK, kBScaleDV, kBScaleDP, kNumBwdScales
};

// One FP8 backward call on a forward's tensors.
struct Bwd {
  const Fwd& f;
  fs_dtype_t grad = kFloat8E5M2, dout = kFloat8E5M2;
  std::array<float, kNumBwdScales> scale{};
  std::vector<uint8_t> q, k, v, o, dO, dq, dk, dv;
  std::vector<float> stats, amax{-1, -1, -1, -1};  // dQ, dK, dV, dP

  explicit Bwd(const Fwd& fwd, uint64_t seed = 5) : f(fwd), q(fwd.q), k(fwd.k), v(fwd.v), o(fwd.o), stats(fwd.stats) {
    scale.fill(1.0f);
    scale[kBDescaleQ] = fwd.scale[kDescaleQ];
    scale[kBDescaleK] = fwd.scale[kDescaleK];
    scale[kBDescaleV] = fwd.scale[kDescaleV];
    scale[kBDescaleO] = 1.0f / fwd.scale[kScaleO];
    scale[kBDescaleS] = fwd.scale[kDescaleS];
    scale[kBScaleS] = fwd.scale[kScaleS];
    scale[kBScaleDP] = 4096.0f;  // |dP| is small: scale it into E5M2's normal range
    scale[kBDescaleDP] = 1.0f / 4096;
    dO = encode(randn(f.B * f.Hq * f.Sq * f.Dv, seed, 1.0), dout);
  }
  std::unique_ptr<SdpaBwd> create(const std::function<void(SdpaBackwardAttributes&)>& extra = {}) {
    dq.assign(f.B * f.Hq * f.Sq * f.D, 0xff);
    dk.assign(f.B * f.Hk * f.Skv * f.D, 0xff);
    dv.assign(f.B * f.Hk * f.Skv * f.Dv, 0xff);
    const fs_device_t dev = f.dev;
    TensorDesc qd(nullptr, f.in, dev, {f.B, f.Hq, f.Sq, f.D}), kd(nullptr, f.in, dev, {f.B, f.Hk, f.Skv, f.D}),
        vd(nullptr, f.in, dev, {f.B, f.Hk, f.Skv, f.Dv}), od(nullptr, f.out, dev, {f.B, f.Hq, f.Sq, f.Dv}),
        dod(nullptr, dout, dev, {f.B, f.Hq, f.Sq, f.Dv}), sd(nullptr, kFloat32, dev, {f.B, f.Hq, f.Sq, 1}),
        dqd(nullptr, grad, dev, {f.B, f.Hq, f.Sq, f.D}), dkd(nullptr, grad, dev, {f.B, f.Hk, f.Skv, f.D}),
        dvd(nullptr, grad, dev, {f.B, f.Hk, f.Skv, f.Dv});
    const TensorDesc one(nullptr, kFloat32, dev, {1, 1, 1, 1});
    SdpaBackwardAttributes a;
    a.set_attn_scale(f.attn_scale).set_causal_mask(f.causal);
    a.set_descale_q(one).set_descale_k(one).set_descale_v(one).set_descale_o(one).set_descale_dO(one);
    a.set_descale_s(one).set_descale_dP(one).set_scale_s(one).set_scale_dQ(one).set_scale_dK(one);
    a.set_scale_dV(one).set_scale_dP(one).set_amax_dQ(one).set_amax_dK(one).set_amax_dV(one).set_amax_dP(one);
    if (extra) extra(a);
    return std::make_unique<SdpaBwd>(qd, kd, vd, od, dod, sd, dqd, dkd, dvd, a);
  }
  void run() {
    auto op = create();
    op->check_support();
    op->compile();
    SdpaVariantPack p;
    p.set(FS_SDPA_Q, q.data()).set(FS_SDPA_K, k.data()).set(FS_SDPA_V, v.data()).set(FS_SDPA_O, o.data());
    p.set(FS_SDPA_DO, dO.data()).set(FS_SDPA_STATS, stats.data()).set(FS_SDPA_DQ, dq.data());
    p.set(FS_SDPA_DK, dk.data()).set(FS_SDPA_DV, dv.data());
    const fs_sdpa_slot_t slots[] = {FS_SDPA_DESCALE_Q, FS_SDPA_DESCALE_K,  FS_SDPA_DESCALE_V, FS_SDPA_DESCALE_O,
                                    FS_SDPA_DESCALE_DO, FS_SDPA_DESCALE_S, FS_SDPA_DESCALE_DP, FS_SDPA_SCALE_S,
                                    FS_SDPA_SCALE_DQ,  FS_SDPA_SCALE_DK,   FS_SDPA_SCALE_DV,  FS_SDPA_SCALE_DP};
    for (int i = 0; i < kNumBwdScales; ++i) p.set(slots[i], &scale[i]);
    p.set(FS_SDPA_AMAX_DQ, &amax[0]).set(FS_SDPA_AMAX_DK, &amax[1]).set(FS_SDPA_AMAX_DV, &amax[2]);
    p.set(FS_SDPA_AMAX_DP, &amax[3]);
    op->execute(p, nullptr, 0);
  }
};

// The exception of `fn` ("" when none), its status in *status.
std::string error_of(const std::function<void()>& fn, fs_status_t* status = nullptr) {
  try {
    fn();
  } catch (const Exception& e) {
    if (status) *status = e.status();
    return e.what();
  }
  return "";
}

bool starts_with(const std::string& s, const std::string& prefix) { return s.rfind(prefix, 0) == 0; }

#define EXPECT_STARTS(msg, prefix) EXPECT_TRUE(starts_with(msg, prefix)) << "got: " << (msg)

// The FP8 rules' refusal of H_k != H_v with its switch off (both directions; sdpa_family.cpp kFp8HkNeHvOff).
const std::string kHkNeHvOff = "H_k != H_v (FLASHSPAN_SDPA_FP8_HK_NE_HV=0)";

// check_support's refusal of every FP8 backward on CUDA tensors with its switch off (sdpa_support.cpp check_fp8).
const std::string kFp8BwdOff =
    "dQ, dK, dV: the FP8 backward on CUDA tensors is turned off (FLASHSPAN_SDPA_FP8_BWD=0); CPU tensors run "
    "sdpa_fp8_backward on the CPU reference";

// The FP8 backward's switch (dispatch/sdpa_launch.h sdpa_fp8_bwd_enabled: on unless FLASHSPAN_SDPA_FP8_BWD=0,
// unless overridden) forced for a scope (1 on, 0 off), the environment's answer back after it.
struct Fp8BwdSwitch {
  explicit Fp8BwdSwitch(int on) { flashspan::set_sdpa_fp8_bwd_enabled(on); }
  ~Fp8BwdSwitch() { flashspan::set_sdpa_fp8_bwd_enabled(-1); }
  Fp8BwdSwitch(const Fp8BwdSwitch&) = delete;
  Fp8BwdSwitch& operator=(const Fp8BwdSwitch&) = delete;
};

// The sm90 FP8 forward's switch (sdpa_fp8_sm90_enabled) likewise.
struct Fp8ForwardSwitch {
  explicit Fp8ForwardSwitch(int on) { flashspan::set_sdpa_fp8_sm90_enabled(on); }
  ~Fp8ForwardSwitch() { flashspan::set_sdpa_fp8_sm90_enabled(-1); }
  Fp8ForwardSwitch(const Fp8ForwardSwitch&) = delete;
  Fp8ForwardSwitch& operator=(const Fp8ForwardSwitch&) = delete;
};

// The sm80 FP8 forward's switch (dispatch/sdpa_launch.h sdpa_fp8_fwd_sm80_enabled: on unless
// FLASHSPAN_SDPA_FP8_SM80=0, unless overridden) for a scope.
struct Fp8FwdSm80Switch {
  explicit Fp8FwdSm80Switch(int on) { flashspan::set_sdpa_fp8_fwd_sm80_enabled(on); }
  ~Fp8FwdSm80Switch() { flashspan::set_sdpa_fp8_fwd_sm80_enabled(-1); }
  Fp8FwdSm80Switch(const Fp8FwdSm80Switch&) = delete;
  Fp8FwdSm80Switch& operator=(const Fp8FwdSm80Switch&) = delete;
};
// Packed (THD) tensors in the sm80 FP8 forward (sdpa_fp8_thd_enabled, on unless FLASHSPAN_SDPA_FP8_THD=0) forced
// for a scope.
struct Fp8ThdSwitch {
  explicit Fp8ThdSwitch(int on) { flashspan::set_sdpa_fp8_thd_enabled(on); }
  ~Fp8ThdSwitch() { flashspan::set_sdpa_fp8_thd_enabled(-1); }
  Fp8ThdSwitch(const Fp8ThdSwitch&) = delete;
  Fp8ThdSwitch& operator=(const Fp8ThdSwitch&) = delete;
};
// attn_scale as a device tensor in FP8 calls (sdpa_fp8_device_attn_scale_enabled, on unless
// FLASHSPAN_SDPA_FP8_DEVICE_ATTN_SCALE=0) forced for a scope.
struct Fp8DeviceAttnScaleSwitch {
  explicit Fp8DeviceAttnScaleSwitch(int on) { flashspan::set_sdpa_fp8_device_attn_scale_enabled(on); }
  ~Fp8DeviceAttnScaleSwitch() { flashspan::set_sdpa_fp8_device_attn_scale_enabled(-1); }
  Fp8DeviceAttnScaleSwitch(const Fp8DeviceAttnScaleSwitch&) = delete;
  Fp8DeviceAttnScaleSwitch& operator=(const Fp8DeviceAttnScaleSwitch&) = delete;
};
// H_k != H_v in FP8 calls (sdpa_fp8_hk_ne_hv_enabled, on unless FLASHSPAN_SDPA_FP8_HK_NE_HV=0) forced for a scope.
struct Fp8HkNeHvSwitch {
  explicit Fp8HkNeHvSwitch(int on) { flashspan::set_sdpa_fp8_hk_ne_hv_enabled(on); }
  ~Fp8HkNeHvSwitch() { flashspan::set_sdpa_fp8_hk_ne_hv_enabled(-1); }
  Fp8HkNeHvSwitch(const Fp8HkNeHvSwitch&) = delete;
  Fp8HkNeHvSwitch& operator=(const Fp8HkNeHvSwitch&) = delete;
};

// ---------------------------------------------------------------------------
// Validation: every FP8 rule, named
// ---------------------------------------------------------------------------

std::string fwd_error(Fwd f, const std::function<void(SdpaAttributes&)>& extra = {}, fs_status_t* st = nullptr) {
  return error_of([&] { f.create(extra); }, st);
}

TEST(SdpaFp8, ValidCallsPass) {
  EXPECT_EQ(fwd_error(Fwd{}), "");
  Fwd f;
  f.out = kFloat8E5M2;  // o has a format of its own
  EXPECT_EQ(fwd_error(f), "");
  f.in = kFloat8E5M2;
  f.fill(2, 1.0);
  EXPECT_EQ(fwd_error(f), "");
  f.causal = true;
  EXPECT_EQ(fwd_error(f, [](SdpaAttributes& a) { a.set_diagonal_band_right_bound(0); }), "");
}

TEST(SdpaFp8, EveryScaleFactorAndAmaxIsRequired) {
  const char* names[] = {"descale_q", "descale_k", "descale_v", "descale_s", "scale_s", "scale_o"};
  for (int i = 0; i < kNumFwdScales; ++i) {
    Fwd f;
    f.bind[i] = false;
    fs_status_t st{};
    const std::string msg = fwd_error(f, {}, &st);
    EXPECT_STARTS(msg, std::string(names[i]) + ": is required with FP8 inputs");
    EXPECT_EQ(st, FS_STATUS_INVALID_ARGUMENT);
  }
  Fwd f;
  f.bind_amax_s = false;
  EXPECT_STARTS(fwd_error(f), "amax_s: is required with FP8 inputs");
}

TEST(SdpaFp8, ScaleTensorsAreOneFloat32) {
  fs_status_t st{};
  const TensorDesc half(nullptr, kFloat16, cpu(), {1, 1, 1, 1}), two(nullptr, kFloat32, cpu(), {2});
  EXPECT_STARTS(fwd_error(Fwd{}, [&](SdpaAttributes& a) { a.set_descale_q(half); }, &st),
                "descale_q: dtype must be float32");
  EXPECT_EQ(st, FS_STATUS_TYPE_ERROR);
  EXPECT_STARTS(fwd_error(Fwd{}, [&](SdpaAttributes& a) { a.set_scale_s(two); }), "scale_s: must have 1 element(s)");
  EXPECT_STARTS(fwd_error(Fwd{}, [&](SdpaAttributes& a) { a.set_amax_o(two); }), "amax_o: must have 1 element(s)");
  // A scalar (0-d) descriptor is one element too.
  const TensorDesc scalar(nullptr, kFloat32, cpu(), {});
  EXPECT_EQ(fwd_error(Fwd{}, [&](SdpaAttributes& a) { a.set_descale_v(scalar); }), "");
}

TEST(SdpaFp8, FormatsAndHeadDims) {
  fs_status_t st{};
  Fwd f;
  f.D = 24;  // a multiple of 8, not of 16
  EXPECT_STARTS(fwd_error(f, {}, &st), "q: head dim D_qk = 24 must be a multiple of 16 with FP8 inputs");
  EXPECT_EQ(st, FS_STATUS_INVALID_ARGUMENT);
  Fwd g;
  g.Dv = 40;
  EXPECT_STARTS(fwd_error(g), "v: head dim D_v = 40 must be a multiple of 16 with FP8 inputs");
  // q, k, v share one format; o must be FP8.
  const TensorDesc one(nullptr, kFloat32, cpu(), {1, 1, 1, 1});
  auto mixed = [&](fs_dtype_t kt, fs_dtype_t ot) {
    return error_of([&] {
      TensorDesc q(nullptr, kFloat8E4M3, cpu(), {1, 1, 4, 16}), k(nullptr, kt, cpu(), {1, 1, 4, 16}),
          v(nullptr, kFloat8E4M3, cpu(), {1, 1, 4, 16}), o(nullptr, ot, cpu(), {1, 1, 4, 16});
      SdpaAttributes at;
      at.set_descale_q(one).set_descale_k(one).set_descale_v(one).set_descale_s(one).set_scale_s(one);
      at.set_scale_o(one).set_amax_s(one).set_amax_o(one);
      SdpaFwd fwd(q, k, v, o, nullptr, at);
    }, &st);
  };
  EXPECT_STARTS(mixed(kFloat8E5M2, kFloat8E4M3),
                "k: dtype float8_e5m2 differs from q's float8_e4m3fn (q, k and v share one FP8 format)");
  EXPECT_EQ(st, FS_STATUS_TYPE_ERROR);
  EXPECT_STARTS(mixed(kFloat8E4M3, kBFloat16), "o: dtype must be float8_e4m3fn ([B, H_q, S_q, D_v], an FP8 format)");
  EXPECT_EQ(mixed(kFloat8E4M3, kFloat8E5M2), "");
}

TEST(SdpaFp8, OptionsFp8DoesNotTakeAreNamed) {
  const std::string tail = ": not supported with FP8 inputs";
  const TensorDesc bias(nullptr, kFloat32, cpu(), {1, 1, 9, 13}), sinks(nullptr, kFloat32, cpu(), {4}),
      bm(nullptr, kUInt8, cpu(), {1, 1, 1, 1}), gate(nullptr, kFloat8E4M3, cpu(), {2, 4, 9, 16}),
      ml(nullptr, kFloat32, cpu(), {4}), seed(nullptr, kInt64, cpu(), {1}), dump(nullptr, kUInt8, cpu(), {2, 4, 9, 13}),
      table(nullptr, kInt32, cpu(), {2, 1, 4, 1});
  struct Case {
    const char* option;
    std::function<void(SdpaAttributes&)> set;
  };
  const Case cases[] = {
      {"bias", [&](SdpaAttributes& a) { a.set_bias(bias); }},
      {"use_alibi_mask", [](SdpaAttributes& a) { a.set_causal_mask(true).set_alibi_mask(true); }},
      {"softcap", [](SdpaAttributes& a) { a.set_softcap(30.0f); }},
      {"sink_token", [&](SdpaAttributes& a) { a.set_sink_token(sinks); }},
      {"block_mask", [&](SdpaAttributes& a) { a.set_block_mask(bm); }},
      {"gate", [&](SdpaAttributes& a) { a.set_gate(gate); }},
      {"max_logit", [&](SdpaAttributes& a) { a.set_max_logit(ml); }},
      {"dropout", [&](SdpaAttributes& a) { a.set_dropout(0.1f, seed, seed); }},
      {"rng_dump", [&](SdpaAttributes& a) { a.set_rng_dump(dump); }},
      {"paged_attention_k_table", [&](SdpaAttributes& a) { a.set_paged_attention_k_table(table); }},
      {"diagonal_band_left_bound", [](SdpaAttributes& a) { a.set_diagonal_band_left_bound(4); }},
      {"diagonal_band_right_bound", [](SdpaAttributes& a) { a.set_diagonal_band_right_bound(2); }},
      {"diagonal_alignment", [](SdpaAttributes& a) { a.set_causal_mask_bottom_right(true); }},
  };
  for (const Case& c : cases) {
    fs_status_t st{};
    const std::string msg = fwd_error(Fwd{}, c.set, &st);
    EXPECT_STARTS(msg, std::string(c.option) + (c.option == std::string("paged_attention_k_table")
                                                    ? ", paged_attention_v_table" + tail
                                                    : tail));
    EXPECT_EQ(st, FS_STATUS_INVALID_ARGUMENT) << c.option;
  }
}

TEST(SdpaFp8, ScaleFactorsNeedFp8Inputs) {
  std::vector<double> x(16, 0.0);
  const TensorDesc q(x.data(), kBFloat16, cpu(), {1, 1, 1, 16}), one(nullptr, kFloat32, cpu(), {1, 1, 1, 1});
  SdpaAttributes a;
  a.set_descale_q(one);
  EXPECT_STARTS(error_of([&] { SdpaFwd(q, q, q, q, nullptr, a); }),
                "descale_q: FP8 scale factors and amax outputs apply to FP8 inputs only (q is bfloat16)");
  // Direction: the forward's scale_o is not a backward attribute (and the C layer says so).
  SdpaBackwardAttributes b;
  EXPECT_NE(fs_sdpa_attributes_set_scale_o(b.handle(), one.get()), FS_STATUS_SUCCESS);
  EXPECT_STARTS(std::string(fs_get_last_error()), "set_scale_o: is a forward attribute");
  EXPECT_NE(fs_sdpa_attributes_set_amax_dp(a.handle(), one.get()), FS_STATUS_SUCCESS);
  EXPECT_STARTS(std::string(fs_get_last_error()), "set_amax_dp: is a backward attribute");
}

TEST(SdpaFp8, BackwardRules) {
  Fwd f;
  f.causal = true;
  f.run();
  Bwd b(f);
  EXPECT_EQ(error_of([&] { b.create(); }), "");
  const TensorDesc lens(nullptr, kInt32, cpu(), {2});
  EXPECT_STARTS(error_of([&] { b.create([&](SdpaBackwardAttributes& a) {
                  a.set_padding_mask(true).set_seq_len_q(lens).set_seq_len_kv(lens);
                }); }),
                "seq_len_q: not supported with FP8 inputs (the seed's sdpa_fp8_backward takes a causal mask only)");
  EXPECT_STARTS(error_of([&] { b.create([](SdpaBackwardAttributes& a) { a.set_padding_mask(true); }); }),
                "use_padding_mask: not supported with FP8 inputs");
  const TensorDesc mask(nullptr, kUInt8, cpu(), {1, 1, 9, 13}), sc(nullptr, kFloat32, cpu(), {1});
  EXPECT_STARTS(error_of([&] { b.create([&](SdpaBackwardAttributes& a) { a.set_dropout(mask, sc, sc); }); }),
                "dropout: not supported with FP8 inputs");
  // dQ, dK, dV share one FP8 format.
  b.grad = kFloat8E4M3;
  EXPECT_EQ(error_of([&] { b.create(); }), "");
  fs_status_t st{};
  EXPECT_STARTS(error_of([&] {
                  const TensorDesc one(nullptr, kFloat32, cpu(), {1, 1, 1, 1});
                  TensorDesc q(nullptr, f.in, cpu(), {f.B, f.Hq, f.Sq, f.D}), k(nullptr, f.in, cpu(), {f.B, f.Hk, f.Skv, f.D}),
                      v(nullptr, f.in, cpu(), {f.B, f.Hk, f.Skv, f.Dv}), o(nullptr, f.out, cpu(), {f.B, f.Hq, f.Sq, f.Dv}),
                      s(nullptr, kFloat32, cpu(), {f.B, f.Hq, f.Sq, 1}),
                      dq(nullptr, kFloat8E5M2, cpu(), {f.B, f.Hq, f.Sq, f.D}),
                      dk(nullptr, kFloat8E4M3, cpu(), {f.B, f.Hk, f.Skv, f.D}),
                      dv(nullptr, kFloat8E5M2, cpu(), {f.B, f.Hk, f.Skv, f.Dv});
                  SdpaBackwardAttributes a;
                  a.set_descale_q(one).set_descale_k(one).set_descale_v(one).set_descale_o(one).set_descale_dO(one);
                  a.set_descale_s(one).set_descale_dP(one).set_scale_s(one).set_scale_dQ(one).set_scale_dK(one);
                  a.set_scale_dV(one).set_scale_dP(one).set_amax_dQ(one).set_amax_dK(one).set_amax_dV(one);
                  a.set_amax_dP(one);
                  SdpaBwd bwd(q, k, v, o, o, s, dq, dk, dv, a);
                }, &st),
                "dK: dtype must be float8_e5m2 (shape of k, dQ's FP8 format)");
  EXPECT_EQ(st, FS_STATUS_TYPE_ERROR);
  // Every backward scale factor is required: here the last one.
  EXPECT_STARTS(error_of([&] {
                  const TensorDesc one(nullptr, kFloat32, cpu(), {1, 1, 1, 1});
                  TensorDesc q(nullptr, f.in, cpu(), {f.B, f.Hq, f.Sq, f.D}), k(nullptr, f.in, cpu(), {f.B, f.Hk, f.Skv, f.D}),
                      v(nullptr, f.in, cpu(), {f.B, f.Hk, f.Skv, f.Dv}), o(nullptr, f.out, cpu(), {f.B, f.Hq, f.Sq, f.Dv}),
                      s(nullptr, kFloat32, cpu(), {f.B, f.Hq, f.Sq, 1});
                  SdpaBackwardAttributes a;
                  a.set_descale_q(one).set_descale_k(one).set_descale_v(one).set_descale_o(one).set_descale_dO(one);
                  a.set_descale_s(one).set_descale_dP(one).set_scale_s(one).set_scale_dQ(one).set_scale_dK(one);
                  a.set_scale_dV(one);
                  SdpaBwd bwd(q, k, v, o, o, s, q, k, v, a);
                }),
                "scale_dP: is required with FP8 inputs (the seed's sdpa_fp8_backward takes every scale factor");
}

// An empty batch (B = 0; sdpa::empty_batch_fills): valid both ways on the CPU reference; every amax output, a max
// of absolute values over no element, is 0 (they start at -1 here).
TEST(SdpaFp8, EmptyBatchGivesZeroAmax) {
  Fwd f;
  f.B = 0;
  f.fill(3, 1.0);
  f.run();
  EXPECT_EQ(f.amax, (std::vector<float>{0.0f, 0.0f}));
  Bwd b(f);
  b.run();
  EXPECT_EQ(b.amax, (std::vector<float>{0.0f, 0.0f, 0.0f, 0.0f}));
}

TEST(SdpaFp8, ScaleValuesMustBeFinite) {
  Fwd f;
  f.scale[kDescaleK] = INFINITY;
  auto op = f.create();
  op->check_support();
  op->compile();
  EXPECT_STARTS(error_of([&] { op->execute(f.pack(), nullptr, 0); }), "descale_k: must be finite, got inf");
}

TEST(SdpaFp8, CudaTensorsAreRefusedByCheckSupport) {
  // With the FP8 kernel's switch off (dispatch/sdpa_launch.h sdpa_fp8_sm90_enabled) CUDA tensors are
  // refused; with it the sm90 FP8 forward's host rules refuse what it does not run (the device is checked
  // after them: sdpa_check_support_gpu). The backward is not the sm90 FP8 forward's: its own switch
  // (sdpa_fp8_bwd_enabled) answers it, whatever the forward's says (BackwardOnCuda* below).
  Fwd f;
  f.dev = cuda();
  auto op = f.create();  // the descriptors validate: the Problem carries everything a launcher needs
  fs_status_t st{};
  flashspan::set_sdpa_fp8_fwd_sm80_enabled(0);  // (the sm80 FP8 forward: ForwardOnSm80Rule)
  flashspan::set_sdpa_fp8_sm90_enabled(0);
  EXPECT_STARTS(error_of([&] { op->check_support(); }, &st),
                "q: FP8 inputs (float8_e4m3fn) on CUDA tensors run on the sm90 FP8 forward, which "
                "FLASHSPAN_SM90_SDPA_FP8=0 turns off: unset it to run them");
  EXPECT_EQ(st, FS_STATUS_NOT_SUPPORTED);
  flashspan::set_sdpa_fp8_sm90_enabled(1);
  {
    Fwd big;
    big.dev = cuda();
    big.D = big.Dv = 144;
    auto op2 = big.create();
    EXPECT_STARTS(error_of([&] { op2->check_support(); }, &st),
                  "head dims (multiples of 16 up to 128): not supported with FP8 inputs on CUDA tensors yet");
    EXPECT_EQ(st, FS_STATUS_NOT_SUPPORTED);
    Fwd b;
    b.dev = cuda();
    b.o.assign(b.B * b.Hq * b.Sq * b.Dv, 0);
    Bwd bwd(b);
    auto op3 = bwd.create();
    const Fp8BwdSwitch off(0);
    EXPECT_EQ(error_of([&] { op3->check_support(); }, &st), kFp8BwdOff);
    EXPECT_EQ(st, FS_STATUS_NOT_SUPPORTED);
  }
  flashspan::set_sdpa_fp8_sm90_enabled(-1);
  flashspan::set_sdpa_fp8_fwd_sm80_enabled(-1);
  // Host scale factors with CUDA tensors validate too (the seed's pass-by-value form); amax outputs must be on
  // q's device.
  Fwd g;
  g.dev = cuda();
  const TensorDesc host(nullptr, kFloat32, cpu(), {1, 1, 1, 1});
  EXPECT_EQ(fwd_error(g, [&](SdpaAttributes& a) { a.set_descale_q(host).set_scale_s(host); }), "");
  EXPECT_STARTS(fwd_error(g, [&](SdpaAttributes& a) { a.set_amax_s(host); }), "amax_s: must be on the device of q");
}

// ---------------------------------------------------------------------------
// The FP8 backward on CUDA tensors (the sm80 backward on bf16 copies of the codes; on unless
// FLASHSPAN_SDPA_FP8_BWD=0)
// ---------------------------------------------------------------------------

// An FP8 call on CUDA descriptors (no data, no device): by default the backward B = 2, H_q = 4,
// H_k = H_v = 2, S_q = 100, S_kv = 130, head dims (64, 128), causal, E4M3 inputs with E5M2 dO and
// gradients: one the FP8 backward covers. problem() is its sdpa::Problem (core/sdpa_problem.h, as the
// C layer validates it), create() the same call through the C++ API.
struct CudaCall {
  int64_t B = 2, Hq = 4, Hk = 2, Hv = 2, Sq = 100, Skv = 130, D = 64, Dv = 128;
  bool backward = true, causal = true, deterministic = false;
  DType in = DType::kFloat8E4M3;           // q, k, v (a 16-bit dtype: no FP8 slots)
  DType grad = DType::kFloat8E5M2;         // o, dO, dQ, dK, dV (16-bit calls: q's)
  int64_t row_pad = 0;                     // elements past D in each row of q, k, v, o, dO, dQ, dK, dV
  int attn_scale = 0;                      // 0 a float, 1 a host tensor, 2 a device tensor
  bool thd = false;                        // forward: packed (THD) q, k, v, o, stats (ragged offsets, seq_len)
  int64_t o_mult = 0;                      // thd: o's ragged multiplier (0: H_q D_v, its packed row stride)
  int64_t q_mult = 0;                      // thd: q's ragged multiplier (0: H_q D, its packed row stride)

  bool fp8() const { return in == DType::kFloat8E4M3 || in == DType::kFloat8E5M2; }
  DType out() const { return fp8() ? grad : in; }
  flashspan::TensorView view(std::vector<int64_t> shape, DType t, bool pad, bool on_cuda = true) const {
    flashspan::TensorView v;
    v.dtype = t;
    v.device = on_cuda ? flashspan::DeviceType::kCUDA : flashspan::DeviceType::kCPU;
    v.ndim = int(shape.size());
    int64_t stride = 1;
    for (int d = v.ndim - 1; d >= 0; --d) {
      v.shape[d] = shape[d];
      v.strides[d] = stride;
      stride *= shape[d] + (pad && d == v.ndim - 1 ? row_pad : 0);
    }
    return v;
  }
  std::vector<int> fp8_slots() const {
    if (!fp8()) return {};
    if (!backward) {
      return {FS_SDPA_DESCALE_Q, FS_SDPA_DESCALE_K, FS_SDPA_DESCALE_V, FS_SDPA_DESCALE_S,
              FS_SDPA_SCALE_S,   FS_SDPA_SCALE_O,   FS_SDPA_AMAX_S,    FS_SDPA_AMAX_O};
    }
    return {FS_SDPA_DESCALE_Q, FS_SDPA_DESCALE_K, FS_SDPA_DESCALE_V, FS_SDPA_DESCALE_O, FS_SDPA_DESCALE_DO,
            FS_SDPA_DESCALE_S, FS_SDPA_DESCALE_DP, FS_SDPA_SCALE_S,  FS_SDPA_SCALE_DQ,  FS_SDPA_SCALE_DK,
            FS_SDPA_SCALE_DV,  FS_SDPA_SCALE_DP,  FS_SDPA_AMAX_DQ,   FS_SDPA_AMAX_DK,   FS_SDPA_AMAX_DV,
            FS_SDPA_AMAX_DP};
  }
  flashspan::sdpa::Problem problem() const {
    flashspan::sdpa::Attributes a;
    a.backward = backward;
    a.tensors[FS_SDPA_Q] = view({B, Hq, Sq, D}, in, true);
    a.tensors[FS_SDPA_K] = view({B, Hk, Skv, D}, in, true);
    a.tensors[FS_SDPA_V] = view({B, Hv, Skv, Dv}, in, true);
    a.tensors[FS_SDPA_O] = view({B, Hq, Sq, Dv}, out(), true);
    a.tensors[FS_SDPA_STATS] = view({B, Hq, Sq, 1}, DType::kFloat32, false);
    if (backward) {
      a.tensors[FS_SDPA_DO] = view({B, Hq, Sq, Dv}, out(), true);
      a.tensors[FS_SDPA_DQ] = view({B, Hq, Sq, D}, out(), true);
      a.tensors[FS_SDPA_DK] = view({B, Hk, Skv, D}, out(), true);
      a.tensors[FS_SDPA_DV] = view({B, Hv, Skv, Dv}, out(), true);
      a.deterministic = deterministic;
    } else {
      a.generate_stats = true;
    }
    if (attn_scale == 0) {
      a.attn_scale_value = 0.125f;
    } else {
      a.tensors[FS_SDPA_ATTN_SCALE] = view({1}, DType::kFloat32, false, attn_scale == 2);
    }
    if (causal) a.right_bound = 0;
    for (int s : fp8_slots()) a.tensors[size_t(s)] = view({1, 1, 1, 1}, DType::kFloat32, false);
    if (thd && !backward) {
      // Packed [B, S, H, D] storage (row stride H D) behind the [B, H, S, D] descriptors; offsets in tokens times the
      // multiplier H D (o: o_mult); the padding mask with seq_len.
      auto packed = [&](int slot, int64_t H, int64_t S, int64_t d, DType t) {
        flashspan::TensorView v = view({B, H, S, d}, t, false);
        v.strides = {S * H * d, d, H * d, 1};
        a.tensors[size_t(slot)] = v;
      };
      packed(FS_SDPA_Q, Hq, Sq, D, in);
      packed(FS_SDPA_K, Hk, Skv, D, in);
      packed(FS_SDPA_V, Hv, Skv, Dv, in);
      packed(FS_SDPA_O, Hq, Sq, Dv, out());
      packed(FS_SDPA_STATS, Hq, Sq, 1, DType::kFloat32);
      const struct { int slot, off; int64_t mult; } sides[] = {
          {FS_SDPA_Q, FS_SDPA_RAGGED_OFFSET_Q, q_mult ? q_mult : Hq * D}, {FS_SDPA_K, FS_SDPA_RAGGED_OFFSET_K, Hk * D},
          {FS_SDPA_V, FS_SDPA_RAGGED_OFFSET_V, Hv * Dv},     {FS_SDPA_O, FS_SDPA_RAGGED_OFFSET_O, o_mult ? o_mult : Hq * Dv},
          {FS_SDPA_STATS, FS_SDPA_RAGGED_OFFSET_STATS, Hq}};
      for (const auto& s : sides) {
        a.tensors[size_t(s.off)] = view({B + 1, 1, 1, 1}, DType::kInt32, false);
        a.ragged_multiplier[size_t(s.off)] = s.mult;
      }
      a.padding_mask = true;
      a.tensors[FS_SDPA_SEQ_LEN_Q] = view({B, 1, 1, 1}, DType::kInt32, false);
      a.tensors[FS_SDPA_SEQ_LEN_KV] = view({B, 1, 1, 1}, DType::kInt32, false);
    }
    return backward ? flashspan::sdpa::validate_backward(a) : flashspan::sdpa::validate_forward(a);
  }
  std::unique_ptr<SdpaBwd> create() const {
    auto api_dtype = [](DType t) {
      return t == DType::kFloat8E4M3 ? kFloat8E4M3 : t == DType::kFloat8E5M2 ? kFloat8E5M2 : kBFloat16;
    };
    auto desc = [&](int64_t H, int64_t S, int64_t d, DType t) {
      return TensorDesc(nullptr, api_dtype(t), cuda(), {B, H, S, d},
                        {H * S * (d + row_pad), S * (d + row_pad), d + row_pad, 1});
    };
    const TensorDesc one(nullptr, kFloat32, cuda(), {1, 1, 1, 1}), stats(nullptr, kFloat32, cuda(), {B, Hq, Sq, 1});
    SdpaBackwardAttributes a;
    a.set_causal_mask(causal).set_deterministic_algorithm(deterministic);
    if (attn_scale == 0) {
      a.set_attn_scale(0.125f);
    } else {
      a.set_attn_scale(TensorDesc(nullptr, kFloat32, attn_scale == 2 ? cuda() : cpu(), {1}));
    }
    if (fp8()) {
      a.set_descale_q(one).set_descale_k(one).set_descale_v(one).set_descale_o(one).set_descale_dO(one);
      a.set_descale_s(one).set_descale_dP(one).set_scale_s(one).set_scale_dQ(one).set_scale_dK(one);
      a.set_scale_dV(one).set_scale_dP(one).set_amax_dQ(one).set_amax_dK(one).set_amax_dV(one).set_amax_dP(one);
    }
    return std::make_unique<SdpaBwd>(desc(Hq, Sq, D, in), desc(Hk, Skv, D, in), desc(Hv, Skv, Dv, in),
                                     desc(Hq, Sq, Dv, out()), desc(Hq, Sq, Dv, out()), stats, desc(Hq, Sq, D, out()),
                                     desc(Hk, Skv, D, out()), desc(Hv, Skv, Dv, out()), a);
  }
  // check_support's message ("" when it passes), its status in *st.
  std::string check_support_error(fs_status_t* st = nullptr) const {
    auto op = create();
    return error_of([&] { op->check_support(); }, st);
  }
};

std::string bwd_refusal(const CudaCall& c) {
  const char* r = flashspan::sdpa_fp8_bwd_refusal(c.problem());
  return r == nullptr ? "" : r;
}

// The host rules of CUDA calls (sdpa_check_features_gpu) on c's Problem: "" when they pass, else the message.
std::string host_rules_error(const CudaCall& c) {
  const flashspan::sdpa::Problem p = c.problem();
  try {
    flashspan::sdpa_check_features_gpu(p);
  } catch (const flashspan::Error& e) {
    return e.what();
  }
  return "";
}

// sdpa_fp8_bwd_refusal (dispatch/sdpa_family.cpp): nullptr for an FP8 backward with each head dim a multiple of 16
// up to 128 (H_k != H_v too, unless its switch is off), deterministic or not (the ordered dQ kernel with the FP8
// steps); else the first thing it does not cover, in that order.
TEST(SdpaFp8, BackwardOnCudaRefusalRule) {
  // Covered: GQA, S not a multiple of any tile, unequal head dims, causal or no mask, both formats, padded
  // rows (the widening pre-pass and the FP8 stores take any strides), deterministic or not.
  EXPECT_EQ(bwd_refusal(CudaCall{}), "");
  const int64_t dims[][2] = {{64, 128}, {128, 64}, {16, 16}, {128, 128}, {32, 64}, {48, 112}, {16, 128}};
  for (const auto& d : dims) {
    for (bool causal : {true, false}) {
      for (bool deterministic : {false, true}) {
        CudaCall c;
        c.D = d[0];
        c.Dv = d[1];
        c.causal = causal;
        c.deterministic = deterministic;
        c.in = causal ? DType::kFloat8E4M3 : DType::kFloat8E5M2;
        c.grad = causal ? DType::kFloat8E5M2 : DType::kFloat8E4M3;
        EXPECT_EQ(bwd_refusal(c), "") << d[0] << "/" << d[1] << " causal " << causal << " deterministic "
                                      << deterministic;
      }
    }
  }
  for (bool deterministic : {false, true}) {
    CudaCall c;
    c.Hq = 8;
    c.Hk = c.Hv = 1;  // MQA
    c.row_pad = 7;    // odd row strides (rows at unaligned addresses)
    c.attn_scale = 1;
    c.deterministic = deterministic;
    EXPECT_EQ(bwd_refusal(c), "") << "deterministic " << deterministic;
  }
  // Not an FP8 call; the FP8 forward (deterministic changes neither).
  for (bool deterministic : {false, true}) {
    CudaCall c;
    c.in = DType::kBFloat16;
    c.deterministic = deterministic;
    EXPECT_EQ(bwd_refusal(c), "q (not an FP8 call)");
    CudaCall f;
    f.backward = false;
    EXPECT_EQ(bwd_refusal(f), "the FP8 forward");
  }
  // Head dims: multiples of 16 (the FP8 validation's rule) above 128 either way, deterministic or not.
  for (const auto& d : {std::array<int64_t, 2>{144, 64}, std::array<int64_t, 2>{64, 144},
                        std::array<int64_t, 2>{256, 256}, std::array<int64_t, 2>{192, 128}}) {
    for (bool deterministic : {false, true}) {
      CudaCall c;
      c.D = d[0];
      c.Dv = d[1];
      c.deterministic = deterministic;
      EXPECT_EQ(bwd_refusal(c), "head dims (multiples of 16 up to 128)") << d[0] << "/" << d[1];
    }
  }
  // H_k != H_v: taken with its switch on (the default: the sm90 FP8 backward's items where one group is a multiple
  // of the other, else the sm80 one's passes), refused with it off (pinned), naming FLASHSPAN_SDPA_FP8_HK_NE_HV.
  for (bool deterministic : {false, true}) {
    CudaCall c;
    c.deterministic = deterministic;
    // H_k = 2 != H_v = 4, then H_k = 4 != H_v = 1 (each divides H_q).
    for (const auto& [hk, hv] : {std::pair<int64_t, int64_t>{2, 4}, {4, 1}}) {
      c.Hk = hk;
      c.Hv = hv;
      {
        const Fp8HkNeHvSwitch off(0);
        EXPECT_EQ(bwd_refusal(c), kHkNeHvOff) << hk << "/" << hv;
      }
      const Fp8HkNeHvSwitch on(1);
      EXPECT_EQ(bwd_refusal(c), "") << hk << "/" << hv;
    }
  }
  // The first refusal in the rule's order: not FP8, the forward, head dims, then H_k != H_v (switch off).
  {
    const Fp8HkNeHvSwitch hk_ne_hv_off(0);
    CudaCall c;
    c.D = 144;
    c.Hv = 4;
    c.deterministic = true;
    EXPECT_EQ(bwd_refusal(c), "head dims (multiples of 16 up to 128)");
    c.D = 64;
    EXPECT_EQ(bwd_refusal(c), kHkNeHvOff);
    c.Hv = 2;
    EXPECT_EQ(bwd_refusal(c), "");
    CudaCall f = c;  // the forward with a head dim and H_k != H_v the backward refuses: the forward first
    f.backward = false;
    f.deterministic = false;
    f.D = 144;
    f.Hv = 4;
    EXPECT_EQ(bwd_refusal(f), "the FP8 forward");
    CudaCall n = c;  // not FP8 first
    n.in = DType::kBFloat16;
    n.D = 144;
    n.Hv = 4;
    EXPECT_EQ(bwd_refusal(n), "q (not an FP8 call)");
  }
}

// check_support on CUDA descriptors (sdpa_check_features_gpu, no GPU needed): with the switch off every FP8
// backward is refused as turned off (kFp8BwdOff, naming FLASHSPAN_SDPA_FP8_BWD=0; before its rule); with it on,
// the rule's refusal r with the message "<r>: not supported by the FP8 backward on CUDA tensors yet (it runs each
// head dim a multiple of 16 up to 128; H_k != H_v unless FLASHSPAN_SDPA_FP8_HK_NE_HV=0); CPU tensors run it on the
// CPU reference"; a covered call
// (deterministic or not) passes the host rules; attn_scale as a device tensor is refused ("attn_scale as a device
// tensor") with its switch off (on by default: the FP8 kernels read it as one of their factors, kFp8BwdAttnScale).
TEST(SdpaFp8, BackwardOnCudaCheckSupportMessages) {
  const auto refused = [](const std::string& r) {
    return r + ": not supported by the FP8 backward on CUDA tensors yet (it runs each head dim a multiple of 16 up "
               "to 128; H_k != H_v unless FLASHSPAN_SDPA_FP8_HK_NE_HV=0); CPU tensors run it on the CPU reference";
  };
  fs_status_t st{};
  CudaCall big;
  big.D = 144;
  CudaCall big_det = big;
  big_det.deterministic = true;
  CudaCall hkv;
  hkv.Hv = 4;
  CudaCall hkv_det = hkv;
  hkv_det.deterministic = true;
  CudaCall det;
  det.deterministic = true;
  CudaCall dev_scale;
  dev_scale.attn_scale = 2;
  {
    const Fp8BwdSwitch off(0);
    for (const CudaCall& c : {CudaCall{}, big, hkv, det, dev_scale}) {
      EXPECT_EQ(c.check_support_error(&st), kFp8BwdOff);
      EXPECT_EQ(st, FS_STATUS_NOT_SUPPORTED);
      EXPECT_EQ(host_rules_error(c), kFp8BwdOff);
    }
    // Neither FP8 forward's switch answers for the backward.
    const Fp8ForwardSwitch fwd_on(1);
    const Fp8FwdSm80Switch sm80_on(1);
    EXPECT_EQ(CudaCall{}.check_support_error(), kFp8BwdOff);
    EXPECT_EQ(det.check_support_error(), kFp8BwdOff);
  }
  const Fp8BwdSwitch on(1);
  const Fp8HkNeHvSwitch hk_ne_hv_off(0);  // (pinned off: HkNeHvSwitchReadsTheEnvironment checks it on)
  const std::string dims = refused("head dims (multiples of 16 up to 128)"), heads = refused(kHkNeHvOff);
  for (const auto& [c, want] : {std::pair<CudaCall, std::string>{big, dims}, {big_det, dims}, {hkv, heads},
                                {hkv_det, heads}}) {
    EXPECT_EQ(host_rules_error(c), want);
    EXPECT_EQ(c.check_support_error(&st), want);
    EXPECT_EQ(st, FS_STATUS_NOT_SUPPORTED);
  }
  {
    CudaCall fwd_dev_scale = dev_scale;  // the forwards too (kFp8AttnScale)
    fwd_dev_scale.backward = false;
    for (const CudaCall& c : {dev_scale, fwd_dev_scale}) {
      {
        const Fp8DeviceAttnScaleSwitch off(0);
        EXPECT_STARTS(c.check_support_error(&st), "attn_scale as a device tensor");
        EXPECT_EQ(st, FS_STATUS_NOT_SUPPORTED);
      }
      const Fp8DeviceAttnScaleSwitch on(1);
      EXPECT_EQ(host_rules_error(c), "");
    }
  }
  {
    // The sm90 FP8 forward's switch off does not refuse the backward either.
    const Fp8ForwardSwitch fwd_off(0);
    EXPECT_EQ(big.check_support_error(), dims);
    EXPECT_EQ(host_rules_error(det), "");
  }
  // Covered calls pass the host rules (what follows them is the device's: compute capability 8.0, shared
  // memory; without a GPU, or in a build without CUDA, check_support fails there, not on an FP8 rule).
  // Deterministic ones too: the deterministic dQ kernel has the FP8 steps.
  CudaCall pad;
  pad.row_pad = 8;  // strides the sm90 FP8 forward refuses (not multiples of 16 elements)
  pad.attn_scale = 1;
  CudaCall odd;
  odd.row_pad = 1;  // odd row strides: rows at unaligned addresses (no vector rule for the FP8 backward)
  odd.deterministic = true;
  CudaCall mqa;
  mqa.Hq = 8;
  mqa.Hk = mqa.Hv = 1;
  mqa.causal = false;
  mqa.D = mqa.Dv = 16;
  CudaCall mqa_det = mqa;
  mqa_det.deterministic = true;
  CudaCall wide_det;
  wide_det.D = wide_det.Dv = 128;
  wide_det.deterministic = true;
  wide_det.attn_scale = 1;
  for (const CudaCall& c : {CudaCall{}, pad, det, odd, mqa, mqa_det, wide_det}) {
    EXPECT_EQ(host_rules_error(c), "");
    const std::string msg = c.check_support_error();
    EXPECT_EQ(msg.find("FP8"), std::string::npos) << msg;
    EXPECT_EQ(msg.find("attn_scale"), std::string::npos) << msg;
    EXPECT_EQ(msg.find("deterministic"), std::string::npos) << msg;
    EXPECT_EQ(msg.find("align"), std::string::npos) << msg;
  }
  {
    CudaCall f = pad;  // the forward with the same strides: the sm90 FP8 forward's TMA rule
    f.backward = false;
    f.attn_scale = 0;
    const Fp8ForwardSwitch fwd_on(1);
    const Fp8FwdSm80Switch sm80_off(0);
    EXPECT_STARTS(host_rules_error(f), "q: stride 72 of dimension 2 must be a multiple of 16 elements");
  }
}

// The FP8 forward on the sm80 kernels (dispatch/sdpa_launch.h sdpa_fp8_fwd_sm80_enabled: on unless
// FLASHSPAN_SDPA_FP8_SM80=0; ForwardOnSm80SwitchReadsTheEnvironment): with it, the host rules take the FP8
// forwards the sm90 one refuses for its head dims, strides or switch, and refuse by its own rule
// (sdpa_fp8_fwd_sm80_refusal) what neither runs; without it, the sm90 one's rules as before. The one rule of
// which runs: sdpa_fp8_fwd_runs_sm90 where it can (an sm_90 device: none in CI, the GPU suite's H200), else
// sdpa_fp8_fwd_runs_sm80.
TEST(SdpaFp8, ForwardOnSm80Rule) {
  auto fwd_call = [](int64_t d, int64_t dv, int64_t row_pad = 0, int64_t hv = 2) {
    CudaCall c;
    c.backward = false;
    c.D = d;
    c.Dv = dv;
    c.row_pad = row_pad;
    c.Hv = hv;
    return c;
  };
  const CudaCall wide = fwd_call(256, 256), d192 = fwd_call(192, 128);
  const CudaCall padded = fwd_call(64, 64, 8), dims144 = fwd_call(144, 144), hkv = fwd_call(64, 64, 0, 4);
  {
    const Fp8FwdSm80Switch off(0);
    const Fp8ForwardSwitch sm90_on(1);
    EXPECT_STARTS(host_rules_error(wide), "head dims (multiples of 16 up to 128): not supported with FP8 inputs");
    EXPECT_STARTS(host_rules_error(d192), "head dims (multiples of 16 up to 128): not supported with FP8 inputs");
    EXPECT_STARTS(host_rules_error(padded), "q: stride 72 of dimension 2 must be a multiple of 16 elements");
    EXPECT_EQ(host_rules_error(fwd_call(64, 128)), "");
  }
  const Fp8FwdSm80Switch on(1);
  for (int sm90 : {1, 0}) {
    const Fp8ForwardSwitch sw(sm90);
    // H_k != H_v (hkv: H_k 2, H_v 4) on both forwards too (V by h / group_v), with its switch on (the default).
    const Fp8HkNeHvSwitch hk_ne_hv(1);
    for (const CudaCall& c : {wide, d192, padded, fwd_call(64, 128), fwd_call(16, 48), hkv}) {
      EXPECT_EQ(host_rules_error(c), "") << c.D << "/" << c.Dv << " pad " << c.row_pad << " sm90 " << sm90;
      flashspan::sdpa::Problem p = c.problem();
      EXPECT_EQ(flashspan::sdpa_fp8_fwd_sm80_refusal(p), nullptr);
      // One of the two runs it: the sm90 one where it can (an sm_90 device with this build's sm_90a code: the
      // GPU suite's machine), never for what its rule refuses (head dims, strides) or with its switch off.
      const bool sm90_can = sm90 == 1 && c.D <= 128 && c.Dv <= 128 && c.row_pad == 0;
      if (!sm90_can) {
        EXPECT_FALSE(flashspan::sdpa_fp8_fwd_runs_sm90(p)) << c.D << "/" << c.Dv;
      }
      EXPECT_NE(flashspan::sdpa_fp8_fwd_runs_sm80(p), flashspan::sdpa_fp8_fwd_runs_sm90(p)) << c.D << "/" << c.Dv;
      // A family fixed by an operation's check_support wins over the switches (Problem::fp8_fwd_family).
      p.fp8_fwd_family = 80;
      EXPECT_TRUE(flashspan::sdpa_fp8_fwd_runs_sm80(p));
      EXPECT_FALSE(flashspan::sdpa_fp8_fwd_runs_sm90(p));
      p.fp8_fwd_family = 90;
      EXPECT_FALSE(flashspan::sdpa_fp8_fwd_runs_sm80(p));
      EXPECT_TRUE(flashspan::sdpa_fp8_fwd_runs_sm90(p));
    }
    EXPECT_STARTS(host_rules_error(dims144),
                  "head dims ({8, 16, ..., 128}, (192, 128) or (256, 256)): not supported with FP8 inputs on CUDA "
                  "tensors yet (the FP8 forwards run");
    EXPECT_FALSE(flashspan::sdpa_fp8_fwd_runs_sm80(dims144.problem()));
  }
  // H_k != H_v with its switch off (FLASHSPAN_SDPA_FP8_HK_NE_HV=0): refused by both forwards, naming the variable.
  {
    const Fp8HkNeHvSwitch off(0);
    for (int sm90 : {1, 0}) {
      const Fp8ForwardSwitch sw(sm90);
      EXPECT_STARTS(host_rules_error(hkv), kHkNeHvOff + ": not supported with FP8 inputs on CUDA tensors yet");
      EXPECT_FALSE(flashspan::sdpa_fp8_fwd_runs_sm80(hkv.problem()));
      EXPECT_FALSE(flashspan::sdpa_fp8_fwd_runs_sm90(hkv.problem()));
    }
  }
  // The backward is not this forward's: its own switch answers (BackwardOnCuda*).
  const Fp8BwdSwitch bwd_off(0);
  EXPECT_EQ(host_rules_error(CudaCall{}), kFp8BwdOff);
  EXPECT_EQ(flashspan::sdpa_fp8_fwd_sm80_refusal(CudaCall{}.problem()), std::string("the FP8 backward"));
}

// The packed (THD) FP8 forward call of the THD rule tests: q, k, v, o, stats packed, D = D_v = 64.
CudaCall packed_forward_call() {
  CudaCall c;
  c.backward = false;
  c.thd = true;
  c.D = c.Dv = 64;
  return c;
}

// Packed (THD) tensors in the FP8 forward: the sm80 FP8 forward takes them with its switch on (sdpa_fp8_thd_enabled,
// the default: Fp8ThdSwitchReadsTheEnvironment), the sm90 one with its own (sdpa_fp8_sm90_thd_enabled, the default
// too: Sm90ThdSwitchReadsTheEnvironment, ForwardThdSm90Rule; pinned off here), refused by both without them, the sm80
// one naming FLASHSPAN_SDPA_FP8_THD=0 (kFp8ThdOff), the sm90 one FLASHSPAN_SM90_SDPA_FP8_THD=0 (kFp8Packed); with them
// an odd o multiplier and score_max / score_sum_exp beside a packed o are refused, naming the rule.
const std::string kFp8Packed = "ragged (packed THD) q, k, v, o or stats (FLASHSPAN_SM90_SDPA_FP8_THD=0)";
const std::string kFp8ThdOff = "ragged (packed THD) q, k, v, o or stats (FLASHSPAN_SDPA_FP8_THD=0)";

TEST(SdpaFp8, ForwardThdRule) {
  const CudaCall c = packed_forward_call();
  const std::string& packed = kFp8Packed;
  const ScopedSwitch sm90_thd_off(flashspan::set_sdpa_fp8_sm90_thd_enabled, 0);
  {
    const Fp8ThdSwitch off(0);
    EXPECT_EQ(flashspan::sdpa_fp8_fwd_sm80_refusal(c.problem()), kFp8ThdOff);
    EXPECT_EQ(flashspan::sdpa_fp8_fwd_sm90_refusal(c.problem()), packed);
    EXPECT_STARTS(host_rules_error(c), kFp8ThdOff + ": not supported with FP8 inputs on CUDA tensors yet");
  }
  const Fp8ThdSwitch on(1);
  const Fp8FwdSm80Switch sm80_on(1);
  EXPECT_EQ(flashspan::sdpa_fp8_fwd_sm80_refusal(c.problem()), nullptr);
  EXPECT_EQ(flashspan::sdpa_fp8_fwd_sm90_refusal(c.problem()), packed);  // (its own switch off)
  EXPECT_FALSE(flashspan::sdpa_fp8_fwd_runs_sm90(c.problem()));
  EXPECT_EQ(host_rules_error(c), "");
  CudaCall odd = c;
  odd.o_mult = c.Hq * c.Dv + 1;
  EXPECT_STARTS(host_rules_error(odd), "ragged offset of o: the multiplier ");
}

// Packed (THD) q, k, v, o, stats on the sm90 FP8 forward (sdpa_fp8_sm90_thd_enabled, its own switch, on unless
// FLASHSPAN_SM90_SDPA_FP8_THD=0): its rule takes them with the switch on -- each head-dim kernel, GQA,
// both formats -- when q's, k's and v's ragged multipliers are multiples of 16 (its TMA boxes and 16-byte loads; else
// the sm80 one takes them), and refuses them, naming them, with it off, whatever the 16-bit sm90 forward's switch
// (sdpa_sm90_thd_enabled) says; its host rules are check_fp8_packed's (an odd o multiplier refused). The workspace of
// a call it runs (Problem::fp8_fwd_family = 90) holds the V^T and, packed q or k, the per-sample maps after it
// (sm90::sample_maps_bytes(B, 3) + 128 bytes) whatever the switch says; the sm80 one's none of them. The host rules
// let the call through also with the sm80 one on and its own packed switch off.
TEST(SdpaFp8, ForwardThdSm90Rule) {
  const CudaCall c = packed_forward_call();
  {
    const ScopedSwitch off(flashspan::set_sdpa_fp8_sm90_thd_enabled, 0);
    for (int bf16 : {0, 1}) {  // (the 16-bit sm90 forward's switch does not change it)
      const ScopedSwitch sm90_thd(flashspan::set_sdpa_sm90_thd_enabled, bf16);
      EXPECT_EQ(flashspan::sdpa_fp8_fwd_sm90_refusal(c.problem()), kFp8Packed) << "16-bit switch " << bf16;
    }
    const Fp8FwdSm80Switch sm80_off(0);
    const Fp8ForwardSwitch sm90_on(1);
    EXPECT_STARTS(host_rules_error(c), kFp8Packed + ": not supported with FP8 inputs on CUDA tensors yet (the sm90 "
                                                    "FP8 forward runs padded or packed q, k, v, o");
  }
  const ScopedSwitch on(flashspan::set_sdpa_fp8_sm90_thd_enabled, 1);
  {
    const ScopedSwitch sm90_thd_off(flashspan::set_sdpa_sm90_thd_enabled, 0);  // (not the FP8 forward's)
    EXPECT_EQ(flashspan::sdpa_fp8_fwd_sm90_refusal(c.problem()), nullptr);
  }
  for (int64_t d : {64, 128, 48}) {
    for (DType t : {DType::kFloat8E4M3, DType::kFloat8E5M2}) {
      CudaCall x = c;
      x.D = x.Dv = d;
      x.in = t;
      x.causal = t == DType::kFloat8E4M3;
      EXPECT_EQ(flashspan::sdpa_fp8_fwd_sm90_refusal(x.problem()), nullptr) << d;
    }
  }
  for (int sm80 : {0, 1}) {
    // The host rules with the sm80 one off (the sm90 one's), or on with its own packed switch off (the sm90 one's
    // rule takes the call: on an sm_90 device it runs there).
    const Fp8FwdSm80Switch sm80_sw(sm80);
    const Fp8ThdSwitch sm80_thd_off(0);
    const Fp8ForwardSwitch sm90_on(1);
    EXPECT_EQ(host_rules_error(c), "") << "sm80 " << sm80;
    EXPECT_FALSE(flashspan::sdpa_fp8_fwd_runs_sm80(c.problem()));
    CudaCall odd = c;
    odd.o_mult = c.Hq * c.Dv + 1;
    EXPECT_STARTS(host_rules_error(odd), "ragged offset of o: the multiplier ");
  }
  // A q multiplier that is not a multiple of 16 (8 elements more: 16-byte rows would still be 8-aligned): the sm90 one
  // refuses it, naming the rule; the sm80 one takes the call (byte reads).
  CudaCall m = c;
  m.q_mult = c.Hq * c.D + 8;
  EXPECT_EQ(std::string(flashspan::sdpa_fp8_fwd_sm90_refusal(m.problem())),
            "ragged offsets of q, k or v with a multiplier that is not a multiple of 16 (the sm90 FP8 forward's "
            "samples start on 16-byte boundaries)");
  EXPECT_FALSE(flashspan::sdpa_fp8_fwd_runs_sm90(m.problem()));
  {
    const Fp8ThdSwitch sm80_thd(1);
    const Fp8FwdSm80Switch sm80_on(1);
    EXPECT_EQ(flashspan::sdpa_fp8_fwd_sm80_refusal(m.problem()), nullptr);
  }
  // The workspace: V^T (the padded twin's bytes), then the maps of a packed q / k, with the switch on or off.
  CudaCall padded = c;
  padded.thd = false;
  flashspan::sdpa::Problem pp = padded.problem(), p = c.problem();
  pp.fp8_fwd_family = p.fp8_fwd_family = 90;
  const size_t vt = flashspan::sdpa_fwd_workspace_size(pp);
  EXPECT_GT(vt, 0u);
  EXPECT_EQ(flashspan::sdpa_fwd_sm90_maps_bytes(pp), 0u);
  const size_t maps = flashspan::sm90::sample_maps_bytes(c.B, flashspan::sm90::kSampleMapsFwd) +
                      flashspan::sm90::kTensorMapBytes;
  for (int sw : {1, 0}) {
    const ScopedSwitch thd(flashspan::set_sdpa_fp8_sm90_thd_enabled, sw);
    EXPECT_EQ(flashspan::sdpa_fwd_sm90_maps_bytes(p), maps) << "switch " << sw;
    EXPECT_EQ(flashspan::sdpa_fwd_workspace_size(p), vt + maps) << "switch " << sw;
  }
  p.fp8_fwd_family = 80;
  EXPECT_EQ(flashspan::sdpa_fwd_sm90_maps_bytes(p), 0u);
}

// The FP8 backward on the sm90 backward kernel (dispatch/sdpa_launch.h sdpa_fp8_bwd_runs_sm90; its own switch, on
// unless FLASHSPAN_SM90_SDPA_FP8_BWD is exactly "0", FLASHSPAN_EXPERIMENTAL ignored): never where the FP8 backward's rule refuses or its switch is off, never off an sm_90 device (this
// machine has none: the rule's device answer is false here, true on the GPU suite's H200 when switched on); a
// family fixed by an operation's check_support (Problem::fp8_bwd_family) wins over the switches, and the
// workspace follows it (the sm90 kernel's dQ tiles and dK / dV slots besides the copies).
TEST(SdpaFp8, BackwardOnSm90Rule) {
  const Fp8BwdSwitch on(1);
  CudaCall c;
  flashspan::sdpa::Problem p = c.problem();
  ASSERT_EQ(flashspan::sdpa_fp8_bwd_refusal(p), nullptr);
  for (int sm90 : {0, 1}) {
    flashspan::set_sdpa_fp8_bwd_sm90_enabled(sm90);
    if (sm90 == 0) {
      EXPECT_FALSE(flashspan::sdpa_fp8_bwd_runs_sm90(p));
    }
    CudaCall hkv = c;
    hkv.Hv = 4;
    const Fp8HkNeHvSwitch hk_ne_hv_off(0);
    EXPECT_FALSE(flashspan::sdpa_fp8_bwd_runs_sm90(hkv.problem()));  // (H_k != H_v: refused, or the sm80 one's)
    CudaCall big = c;
    big.D = big.Dv = 144;
    EXPECT_FALSE(flashspan::sdpa_fp8_bwd_runs_sm90(big.problem()));
  }
  {
    const Fp8BwdSwitch off(0);  // the FP8 backward off: neither family
    EXPECT_FALSE(flashspan::sdpa_fp8_bwd_runs_sm90(p));
  }
  flashspan::set_sdpa_fp8_bwd_sm90_enabled(-1);
  {
    ScopedEnv experimental("FLASHSPAN_EXPERIMENTAL", nullptr);
    ScopedEnv var("FLASHSPAN_SM90_SDPA_FP8_BWD", nullptr);
    EXPECT_TRUE(flashspan::sdpa_fp8_bwd_sm90_enabled());
    var.set("0");
    EXPECT_FALSE(flashspan::sdpa_fp8_bwd_sm90_enabled());
    experimental.set("1");
    EXPECT_FALSE(flashspan::sdpa_fp8_bwd_sm90_enabled());
    var.set("1");
    EXPECT_TRUE(flashspan::sdpa_fp8_bwd_sm90_enabled());
    flashspan::set_sdpa_fp8_bwd_sm90_enabled(0);
    EXPECT_FALSE(flashspan::sdpa_fp8_bwd_sm90_enabled());
    flashspan::set_sdpa_fp8_bwd_sm90_enabled(-1);
  }
  for (bool det : {false, true}) {
    c.deterministic = det;
    p = c.problem();
    p.fp8_bwd_family = 90;
    EXPECT_TRUE(flashspan::sdpa_fp8_bwd_runs_sm90(p));
    const size_t ws90 = flashspan::sdpa_bwd_workspace_size(p);
    p.fp8_bwd_family = 80;
    EXPECT_FALSE(flashspan::sdpa_fp8_bwd_runs_sm90(p));
    const size_t ws80 = flashspan::sdpa_bwd_workspace_size(p);
    // The sm90 layout holds at least the dK and dV slots (2 x B H_k ceil(S_kv / 128) 128 x 128 fp32) more.
    const size_t slots = 2 * size_t(c.B * c.Hk * ((c.Skv + 127) / 128) * 128 * 128) * sizeof(float);
    EXPECT_GE(ws90, ws80 + slots) << "deterministic " << det;
  }
}

#ifdef FLASHSPAN_WITH_CUDA
// The widening pre-pass's eight-code kernel (kernels/common/fp8_prepass.h) and the sm90 FP8 backward's own dK / dV
// stores (kernels/sm90/sdpa_fp8_bwd_sm90.h): on by default, each off with its variable "0" (expect_off_switch: read
// per launch, FLASHSPAN_EXPERIMENTAL ignored, the override wins both ways).
TEST(SdpaFp8, WidenEightCodesSwitch) {
  flashspan::test::expect_off_switch("FLASHSPAN_FP8_WIDEN_VEC", flashspan::set_fp8_widen_vec_enabled,
                                     flashspan::fp8_widen_vec_enabled);
}

TEST(SdpaFp8, Sm90StoreInKernelSwitch) {
  flashspan::test::expect_off_switch("FLASHSPAN_SM90_SDPA_FP8_BWD_STORE",
                                     flashspan::sm90::set_sdpa_fp8_bwd_sm90_store_enabled,
                                     flashspan::sm90::sdpa_fp8_bwd_sm90_store_enabled);
}
#endif

// An FP8 feature's switch on by default (expect_off_switch: read per call, FLASHSPAN_EXPERIMENTAL ignored, the
// override wins both ways) and what it changes: each of `calls` passes the host rules with it on and is refused with
// a message that starts with `off` with it off, whichever FP8 forward the sm90 one's switch leaves a forward to (the
// FP8 backward and the sm80 FP8 forward forced on).
[[maybe_unused]] void expect_fp8_feature_switch(const char* var, void (*set)(int), bool (*enabled)(),
                                                const std::vector<CudaCall>& calls, const std::string& off) {
  const Fp8BwdSwitch bwd_on(1);
  const Fp8FwdSm80Switch sm80_on(1);
  for (int sm90 : {1, 0}) {
    const Fp8ForwardSwitch sw(sm90);
    flashspan::test::expect_off_switch(var, set, enabled, [&](bool on, const std::string& where) {
      for (const CudaCall& c : calls) {
        const std::string e = host_rules_error(c);
        if (on) {
          EXPECT_EQ(e, "") << where << ", backward " << c.backward << ", sm90 " << sm90;
        } else {
          EXPECT_STARTS(e, off) << where << ", backward " << c.backward << ", sm90 " << sm90;
        }
      }
    });
  }
}

// The FP8 backward's switch: on by default (since its GPU tests passed on an H200), off when
// FLASHSPAN_SDPA_FP8_BWD is exactly "0" (core/env_switch.h env_flag_off; unset, empty or any other value: on), read per
// call; FLASHSPAN_EXPERIMENTAL (its switch before) no longer changes it; set_sdpa_fp8_bwd_enabled(1 / 0) wins over
// the environment both ways, -1 gives the environment back.
TEST(SdpaFp8, BackwardOnCudaSwitchReadsTheEnvironment) {
  flashspan::set_sdpa_fp8_bwd_enabled(-1);
  ScopedEnv var("FLASHSPAN_SDPA_FP8_BWD", nullptr);
  ScopedEnv experimental("FLASHSPAN_EXPERIMENTAL", nullptr);
  EXPECT_TRUE(flashspan::sdpa_fp8_bwd_enabled());
  EXPECT_EQ(host_rules_error(CudaCall{}), "");  // the covered call: on by default
  experimental.set("0");
  EXPECT_TRUE(flashspan::sdpa_fp8_bwd_enabled());
  EXPECT_EQ(host_rules_error(CudaCall{}), "");
  var.set("0");
  EXPECT_FALSE(flashspan::sdpa_fp8_bwd_enabled());
  EXPECT_EQ(host_rules_error(CudaCall{}), kFp8BwdOff);
  EXPECT_EQ(CudaCall{}.check_support_error(), kFp8BwdOff);
  experimental.set("1");
  EXPECT_FALSE(flashspan::sdpa_fp8_bwd_enabled());
  EXPECT_EQ(CudaCall{}.check_support_error(), kFp8BwdOff);
  for (const char* other : {"1", "", "00", " 0", "off", "false"}) {  // anything but "0" leaves it on
    var.set(other);
    EXPECT_TRUE(flashspan::sdpa_fp8_bwd_enabled()) << '"' << other << '"';
    EXPECT_EQ(host_rules_error(CudaCall{}), "") << '"' << other << '"';
  }
  var.set("0");
  flashspan::set_sdpa_fp8_bwd_enabled(1);
  EXPECT_TRUE(flashspan::sdpa_fp8_bwd_enabled());
  EXPECT_EQ(host_rules_error(CudaCall{}), "");
  var.set(nullptr);
  experimental.set(nullptr);
  flashspan::set_sdpa_fp8_bwd_enabled(0);
  EXPECT_FALSE(flashspan::sdpa_fp8_bwd_enabled());
  EXPECT_EQ(host_rules_error(CudaCall{}), kFp8BwdOff);
  flashspan::set_sdpa_fp8_bwd_enabled(-1);
  EXPECT_TRUE(flashspan::sdpa_fp8_bwd_enabled());
  var.set("0");
  EXPECT_FALSE(flashspan::sdpa_fp8_bwd_enabled());
}

// The sm80 FP8 forward's switch: on by default (since its GPU tests passed on an H200), off when
// FLASHSPAN_SDPA_FP8_SM80 is exactly "0", read per call; FLASHSPAN_EXPERIMENTAL no longer changes it; the
// override (set_sdpa_fp8_fwd_sm80_enabled) wins both ways. What it changes: an FP8 forward only it runs
// ((256, 256) head dims) passes the host rules with it on and gets the sm90 FP8 forward's refusal with it off.
TEST(SdpaFp8, ForwardOnSm80SwitchReadsTheEnvironment) {
  flashspan::set_sdpa_fp8_fwd_sm80_enabled(-1);
  const Fp8ForwardSwitch sm90_on(1);
  ScopedEnv var("FLASHSPAN_SDPA_FP8_SM80", nullptr);
  ScopedEnv experimental("FLASHSPAN_EXPERIMENTAL", nullptr);
  CudaCall wide;
  wide.backward = false;
  wide.D = wide.Dv = 256;
  const std::string sm90_refusal = "head dims (multiples of 16 up to 128): not supported with FP8 inputs";
  EXPECT_TRUE(flashspan::sdpa_fp8_fwd_sm80_enabled());
  EXPECT_EQ(host_rules_error(wide), "");
  EXPECT_TRUE(flashspan::sdpa_fp8_fwd_runs_sm80(wide.problem()));
  experimental.set("0");
  EXPECT_TRUE(flashspan::sdpa_fp8_fwd_sm80_enabled());
  EXPECT_EQ(host_rules_error(wide), "");
  var.set("0");
  EXPECT_FALSE(flashspan::sdpa_fp8_fwd_sm80_enabled());
  EXPECT_STARTS(host_rules_error(wide), sm90_refusal);
  EXPECT_FALSE(flashspan::sdpa_fp8_fwd_runs_sm80(wide.problem()));
  experimental.set("1");
  EXPECT_FALSE(flashspan::sdpa_fp8_fwd_sm80_enabled());
  EXPECT_STARTS(host_rules_error(wide), sm90_refusal);
  for (const char* other : {"1", "", "00", " 0", "off", "false"}) {  // anything but "0" leaves it on
    var.set(other);
    EXPECT_TRUE(flashspan::sdpa_fp8_fwd_sm80_enabled()) << '"' << other << '"';
    EXPECT_EQ(host_rules_error(wide), "") << '"' << other << '"';
  }
  var.set("0");
  flashspan::set_sdpa_fp8_fwd_sm80_enabled(1);
  EXPECT_TRUE(flashspan::sdpa_fp8_fwd_sm80_enabled());
  EXPECT_EQ(host_rules_error(wide), "");
  var.set(nullptr);
  experimental.set(nullptr);
  flashspan::set_sdpa_fp8_fwd_sm80_enabled(0);
  EXPECT_FALSE(flashspan::sdpa_fp8_fwd_sm80_enabled());
  EXPECT_STARTS(host_rules_error(wide), sm90_refusal);
  flashspan::set_sdpa_fp8_fwd_sm80_enabled(-1);
  EXPECT_TRUE(flashspan::sdpa_fp8_fwd_sm80_enabled());
  var.set("0");
  EXPECT_FALSE(flashspan::sdpa_fp8_fwd_sm80_enabled());
}

// H_k != H_v in FP8 calls (sdpa_fp8_hk_ne_hv_enabled): on by default since its GPU tests passed on an H100, off when
// FLASHSPAN_SDPA_FP8_HK_NE_HV is exactly "0" (expect_fp8_feature_switch: read per call, FLASHSPAN_EXPERIMENTAL
// ignored, the override wins both ways). What it changes: an FP8 forward (either forward) and backward with H_k 2,
// H_v 4 pass the host rules with it on, and are refused naming the variable with it off.
TEST(SdpaFp8, HkNeHvSwitchReadsTheEnvironment) {
  CudaCall bwd;
  bwd.Hv = 4;
  CudaCall fwd = bwd;
  fwd.backward = false;
  expect_fp8_feature_switch("FLASHSPAN_SDPA_FP8_HK_NE_HV", flashspan::set_sdpa_fp8_hk_ne_hv_enabled,
                            flashspan::sdpa_fp8_hk_ne_hv_enabled, {fwd, bwd}, kHkNeHvOff);
}

// attn_scale as a device tensor in FP8 calls (sdpa_fp8_device_attn_scale_enabled): on by default since its GPU test
// passed on an H100, off when FLASHSPAN_SDPA_FP8_DEVICE_ATTN_SCALE is exactly "0" (expect_fp8_feature_switch: read
// per call, FLASHSPAN_EXPERIMENTAL ignored, the override wins both ways). What it changes: FP8 forwards (either
// forward) and backwards with a device attn_scale pass the host rules with it on and are refused naming the variable
// with it off (the whole message); a host attn_scale tensor passes either way.
TEST(SdpaFp8, DeviceAttnScaleSwitchReadsTheEnvironment) {
  CudaCall bwd;
  bwd.attn_scale = 2;
  CudaCall fwd = bwd;
  fwd.backward = false;
  const std::string off = "attn_scale as a device tensor: turned off in FP8 calls on CUDA tensors by "
                          "FLASHSPAN_SDPA_FP8_DEVICE_ATTN_SCALE=0: pass it as a float or a host tensor, or unset the "
                          "variable";
  expect_fp8_feature_switch("FLASHSPAN_SDPA_FP8_DEVICE_ATTN_SCALE", flashspan::set_sdpa_fp8_device_attn_scale_enabled,
                            flashspan::sdpa_fp8_device_attn_scale_enabled, {fwd, bwd}, off);
  {
    const ScopedSwitch device_off(flashspan::set_sdpa_fp8_device_attn_scale_enabled, 0);
    EXPECT_EQ(host_rules_error(fwd), off);  // (the whole message)
    CudaCall host = bwd;
    host.attn_scale = 1;
    EXPECT_EQ(host_rules_error(host), "");
    host.backward = false;
    EXPECT_EQ(host_rules_error(host), "");
  }
}

// Packed (THD) tensors in the sm90 FP8 forward (sdpa_fp8_sm90_thd_enabled): on by default since its GPU tests passed
// on an H200, off when FLASHSPAN_SM90_SDPA_FP8_THD is exactly "0" (expect_off_switch: read per call,
// FLASHSPAN_EXPERIMENTAL ignored, the override wins both ways), and its own: the 16-bit sm90 forward's switch
// (sdpa_sm90_thd_enabled: its variable FLASHSPAN_SM90_SDPA_THD unset or "0", its override -1, 0 or 1) changes neither
// its answer nor the rule. What it changes: the sm90 FP8 forward's rule takes a packed call with it on and refuses
// it, naming the variable (kFp8Packed), with it off.
TEST(SdpaFp8, Sm90ThdSwitchReadsTheEnvironment) {
  const CudaCall c = packed_forward_call();
  const flashspan::sdpa::Problem p = c.problem();
  ScopedEnv thd16("FLASHSPAN_SM90_SDPA_THD", nullptr);
  for (const char* v16 : {static_cast<const char*>(nullptr), "0"}) {
    thd16.set(v16);
    for (int bf16 : {-1, 0, 1}) {
      const ScopedSwitch sm90_thd(flashspan::set_sdpa_sm90_thd_enabled, bf16);
      const auto effect = [&](bool on, const std::string& where) {
        const char* r = flashspan::sdpa_fp8_fwd_sm90_refusal(p);
        EXPECT_EQ(r == nullptr ? std::string() : std::string(r), on ? std::string() : kFp8Packed)
            << where << ", FLASHSPAN_SM90_SDPA_THD=" << (v16 ? v16 : "(unset)") << ", 16-bit override " << bf16;
      };
      flashspan::test::expect_off_switch("FLASHSPAN_SM90_SDPA_FP8_THD", flashspan::set_sdpa_fp8_sm90_thd_enabled,
                                         flashspan::sdpa_fp8_sm90_thd_enabled, effect);
    }
  }
}

// Packed (THD) tensors in the sm80 FP8 forward (sdpa_fp8_thd_enabled): on by default since its GPU tests passed on an
// H200, off when FLASHSPAN_SDPA_FP8_THD is exactly "0" (expect_off_switch: read per call, FLASHSPAN_EXPERIMENTAL
// ignored, the override wins both ways). What it changes, with the sm80 FP8 forward on and the sm90 one off (its
// packed tensors are its own switch's: ForwardThdSm90Rule): packed FP8 forwards (head dims 64, and (256, 256), which
// only the sm80 one runs) pass the host rules with it on and are refused naming the variable with it off.
TEST(SdpaFp8, Fp8ThdSwitchReadsTheEnvironment) {
  const CudaCall c = packed_forward_call();
  CudaCall wide = c;
  wide.D = wide.Dv = 256;
  const Fp8FwdSm80Switch sm80_on(1);
  const Fp8ForwardSwitch sm90_off(0);
  const auto effect = [&](bool on, const std::string& where) {
    for (const CudaCall& x : {c, wide}) {
      const std::string e = host_rules_error(x);
      if (on) {
        EXPECT_EQ(e, "") << where << ", D " << x.D;
      } else {
        EXPECT_STARTS(e, kFp8ThdOff + ": not supported with FP8 inputs on CUDA tensors yet") << where << ", D " << x.D;
      }
    }
  };
  flashspan::test::expect_off_switch("FLASHSPAN_SDPA_FP8_THD", flashspan::set_sdpa_fp8_thd_enabled,
                                     flashspan::sdpa_fp8_thd_enabled, effect);
}

// ---------------------------------------------------------------------------
// The CPU reference
// ---------------------------------------------------------------------------

// The 16-bit path's reference on float64 tensors holding the FP8 values (dequantized): O and stats.
void reference_f64(const Fwd& f, std::vector<double>& o, std::vector<float>& stats) {
  std::vector<double> q = decode(f.q, f.in), k = decode(f.k, f.in), v = decode(f.v, f.in);
  for (auto& e : q) e *= f.scale[kDescaleQ];
  for (auto& e : k) e *= f.scale[kDescaleK];
  for (auto& e : v) e *= f.scale[kDescaleV];
  o.assign(f.B * f.Hq * f.Sq * f.Dv, NAN);
  stats.assign(f.B * f.Hq * f.Sq, NAN);
  TensorDesc qd(q.data(), kF64, cpu(), {f.B, f.Hq, f.Sq, f.D}), kd(k.data(), kF64, cpu(), {f.B, f.Hk, f.Skv, f.D}),
      vd(v.data(), kF64, cpu(), {f.B, f.Hk, f.Skv, f.Dv}), od(o.data(), kF64, cpu(), {f.B, f.Hq, f.Sq, f.Dv}),
      sd(stats.data(), kFloat32, cpu(), {f.B, f.Hq, f.Sq, 1});
  SdpaAttributes a;
  a.set_attn_scale(f.attn_scale).set_causal_mask(f.causal).set_generate_stats(true);
  SdpaFwd fwd(qd, kd, vd, od, &sd, a);
  fwd.check_support();
  fwd.compile();
  SdpaVariantPack p;
  p.set(FS_SDPA_Q, q.data()).set(FS_SDPA_K, k.data()).set(FS_SDPA_V, v.data()).set(FS_SDPA_O, o.data());
  p.set(FS_SDPA_STATS, stats.data());
  fwd.execute(p, nullptr, 0);
}

// Forward against the 16-bit path on the same values: the stats agree to float rounding (they do not depend
// on the quantization of S), O within the bound of the quantizations: |dS| <= 2^-4 S (E4M3 normal) + 2^-10 /
// scale_s (subnormal) per element, so |dO| <= max|v| (2^-4 + S_kv 2^-10 / scale_s), plus O's own rounding.
TEST(SdpaFp8, ForwardMatchesTheSixteenBitPathWithinTheQuantization) {
  for (int variant = 0; variant < 4; ++variant) {
    Fwd f;
    f.causal = variant % 2 == 1;
    f.scale = {0.5f, 0.25f, 2.0f, 1.0f / 448, 448.0f, 1.0f};
    if (variant >= 2) {
      f.in = kFloat8E5M2;
      f.scale = {1.5f, 0.75f, 0.3f, 1.0f / 1000, 1000.0f, 4.0f};
    }
    f.fill(10 + variant, 3.0);
    f.run();
    std::vector<double> o_ref;
    std::vector<float> st_ref;
    reference_f64(f, o_ref, st_ref);
    for (size_t i = 0; i < st_ref.size(); ++i) EXPECT_NEAR(f.stats[i], st_ref[i], 1e-5) << variant << " row " << i;
    const std::vector<double> o = decode(f.o, f.out);
    const double vmax = max_abs(decode(f.v, f.in)) * f.scale[kDescaleV];
    const double half_ulp = 0.0625;  // E4M3: 2^-4 relative; E5M2 has 2^-3
    const double rel = f.in.code == FS_DTYPE_FLOAT8_E5M2 ? 0.125 : half_ulp;
    const double bound_s = vmax * (rel + double(f.Skv) * std::ldexp(1.0, -10) / f.scale[kScaleS]);
    double worst = 0, sum_err = 0, sum_ref = 0;
    for (size_t i = 0; i < o.size(); ++i) {
      const double got = o[i] / f.scale[kScaleO];
      const double tol = bound_s + half_ulp * (std::fabs(o_ref[i]) + bound_s) + 1e-3;
      EXPECT_LE(std::fabs(got - o_ref[i]), tol) << "variant " << variant << " element " << i;
      worst = std::max(worst, std::fabs(got - o_ref[i]) / tol);
      sum_err += (got - o_ref[i]) * (got - o_ref[i]);
      sum_ref += o_ref[i] * o_ref[i];
    }
    // The typical error is far below the bound (a test that cannot fail otherwise would be no test).
    EXPECT_LT(std::sqrt(sum_err / sum_ref), 0.08) << variant;
  }
}

TEST(SdpaFp8, AmaxOutputsAreOfTheUnscaledTensors) {
  for (bool causal : {false, true}) {
    Fwd f;
    f.causal = causal;
    f.scale[kScaleO] = 8.0f;
    f.fill(21, 2.0);
    f.run();
    // amax_s = max over rows of the largest probability, exp(row max logit - LSE).
    double amax_s = 0;
    for (size_t i = 0; i < f.stats.size(); ++i)
      amax_s = std::max(amax_s, std::exp(double(f.score_max[i]) - double(f.stats[i])));
    EXPECT_NEAR(f.amax[0], amax_s, 1e-5 * amax_s);
    // Rounding is monotonic: the largest stored |O| is amax_o * scale_o rounded.
    EXPECT_EQ(max_abs(decode(f.o, f.out)),
              double(flashspan::fp8_round(dtype_of(f.out), f.amax[1] * f.scale[kScaleO])));
    Bwd b(f);
    b.scale[kBScaleDQ] = 16.0f;
    b.scale[kBScaleDK] = 0.5f;
    b.run();
    EXPECT_EQ(max_abs(decode(b.dq, b.grad)), double(flashspan::fp8_round(dtype_of(b.grad), b.amax[0] * 16.0f)));
    EXPECT_EQ(max_abs(decode(b.dk, b.grad)), double(flashspan::fp8_round(dtype_of(b.grad), b.amax[1] * 0.5f)));
    EXPECT_EQ(max_abs(decode(b.dv, b.grad)), double(flashspan::fp8_round(dtype_of(b.grad), b.amax[2])));
    EXPECT_GT(b.amax[3], 0.0f);
  }
}

// Stored inputs times 2 with their descale / 2 give bitwise the same results (every product is exact: the
// values stay normal and below the format's maximum); scale_o scales the stored O.
TEST(SdpaFp8, ScaleFactorsCompensateExactly) {
  Fwd base;
  base.causal = true;
  base.fill(31, 0.5);  // |x| <= 2: doubling stays exact in E4M3
  base.run();
  auto twice = [](std::vector<uint8_t>& bits, fs_dtype_t t) {
    std::vector<double> x = decode(bits, t);
    for (auto& e : x) e *= 2;
    bits = encode(x, t);
  };
  for (int which = 0; which < 3; ++which) {
    Fwd f = base;
    twice(which == 0 ? f.q : which == 1 ? f.k : f.v, f.in);
    f.scale[which] *= 0.5f;
    f.run();
    EXPECT_EQ(f.o, base.o) << "input " << which;
    EXPECT_EQ(f.stats, base.stats) << "input " << which;
    EXPECT_EQ(f.amax, base.amax) << "input " << which;
  }
  Fwd s = base;
  s.scale[kScaleO] = 2.0f;
  s.run();
  EXPECT_EQ(s.amax, base.amax) << "amax_o is taken before scale_o";
  const std::vector<double> o1 = decode(base.o, base.out), o2 = decode(s.o, s.out);
  int normal = 0;
  for (size_t i = 0; i < o1.size(); ++i) {
    // Subnormal (2^-6 itself may be a rounded-up subnormal) or saturating values do not scale exactly.
    if (std::fabs(o1[i]) <= 0.015625 || std::fabs(o1[i]) > 200) continue;
    EXPECT_EQ(o2[i], 2 * o1[i]) << i;
    ++normal;
  }
  EXPECT_GT(normal, int(o1.size()) / 2);

  // Backward: dO (and k) times 2 with descale / 2: bitwise the same gradients and amax values.
  Bwd b0(base);
  b0.run();
  for (int which = 0; which < 2; ++which) {  // dO, then k
    Bwd b(base);
    twice(which == 0 ? b.dO : b.k, which == 0 ? b.dout : base.in);
    b.scale[which == 0 ? kBDescaleDO : kBDescaleK] *= 0.5f;
    b.run();
    EXPECT_EQ(b.dq, b0.dq) << which;
    EXPECT_EQ(b.dk, b0.dk) << which;
    EXPECT_EQ(b.dv, b0.dv) << which;
    EXPECT_EQ(b.amax, b0.amax) << which;
  }
}

// Backward against the 16-bit path's backward (float64 tensors of the dequantized q, k, v, o, dO, the same
// stats), with E4M3 gradients and dP: relative L2 within the quantization of dP and S (2^-4 per element).
TEST(SdpaFp8, BackwardMatchesTheSixteenBitPathWithinTheQuantization) {
  for (bool causal : {false, true}) {
    Fwd f;
    f.causal = causal;
    f.fill(41, 1.0);
    f.run();
    Bwd b(f);
    b.grad = kFloat8E4M3;
    b.dout = kFloat8E4M3;
    b.dO = encode(randn(f.B * f.Hq * f.Sq * f.Dv, 43, 1.0), b.dout);
    b.scale[kBScaleDP] = 256.0f;
    b.scale[kBDescaleDP] = 1.0f / 256;
    b.scale[kBScaleDQ] = b.scale[kBScaleDK] = b.scale[kBScaleDV] = 64.0f;
    b.run();
    // The reference on dequantized tensors.
    std::vector<double> q = decode(f.q, f.in), k = decode(f.k, f.in), v = decode(f.v, f.in), o = decode(f.o, f.out),
                        dO = decode(b.dO, b.dout);
    for (auto& e : o) e /= f.scale[kScaleO];
    std::vector<double> dq(q.size()), dk(k.size()), dv(v.size());
    TensorDesc qd(q.data(), kF64, cpu(), {f.B, f.Hq, f.Sq, f.D}), kd(k.data(), kF64, cpu(), {f.B, f.Hk, f.Skv, f.D}),
        vd(v.data(), kF64, cpu(), {f.B, f.Hk, f.Skv, f.Dv}), od(o.data(), kF64, cpu(), {f.B, f.Hq, f.Sq, f.Dv}),
        dod(dO.data(), kF64, cpu(), {f.B, f.Hq, f.Sq, f.Dv}), sd(b.stats.data(), kFloat32, cpu(), {f.B, f.Hq, f.Sq, 1}),
        dqd(dq.data(), kF64, cpu(), {f.B, f.Hq, f.Sq, f.D}), dkd(dk.data(), kF64, cpu(), {f.B, f.Hk, f.Skv, f.D}),
        dvd(dv.data(), kF64, cpu(), {f.B, f.Hk, f.Skv, f.Dv});
    SdpaBackwardAttributes a;
    a.set_attn_scale(f.attn_scale).set_causal_mask(causal);
    SdpaBwd bwd(qd, kd, vd, od, dod, sd, dqd, dkd, dvd, a);
    bwd.check_support();
    bwd.compile();
    SdpaVariantPack p;
    p.set(FS_SDPA_Q, q.data()).set(FS_SDPA_K, k.data()).set(FS_SDPA_V, v.data()).set(FS_SDPA_O, o.data());
    p.set(FS_SDPA_DO, dO.data()).set(FS_SDPA_STATS, b.stats.data()).set(FS_SDPA_DQ, dq.data());
    p.set(FS_SDPA_DK, dk.data()).set(FS_SDPA_DV, dv.data());
    bwd.execute(p, nullptr, 0);
    const std::vector<uint8_t>* got[] = {&b.dq, &b.dk, &b.dv};
    const std::vector<double>* want[] = {&dq, &dk, &dv};
    for (int g = 0; g < 3; ++g) {
      const std::vector<double> x = decode(*got[g], b.grad);
      double err = 0, ref = 0;
      for (size_t i = 0; i < x.size(); ++i) {
        const double d = x[i] / 64.0 - (*want[g])[i];
        err += d * d;
        ref += (*want[g])[i] * (*want[g])[i];
      }
      EXPECT_LT(std::sqrt(err / ref), 0.1) << "causal " << causal << " gradient " << g;
      EXPECT_GT(ref, 0.0);
    }
    // amax of the gradients: the unscaled maxima of the reference, within the quantization.
    EXPECT_NEAR(b.amax[0], max_abs(dq), 0.15 * max_abs(dq));
    EXPECT_NEAR(b.amax[1], max_abs(dk), 0.15 * max_abs(dk));
    EXPECT_NEAR(b.amax[2], max_abs(dv), 0.15 * max_abs(dv));
  }
}

}  // namespace
