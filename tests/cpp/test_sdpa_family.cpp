// CPU tests of the SDPA forward's and backward's kernel-family rule (dispatch/sdpa_family.cpp,
// sdpa_launch.h): which calls the sm90 forward and backward with the analytic mask cover
// (sdpa_fwd_sm90_refusal, sdpa_bwd_sm90_refusal), the switches that turn them on
// (sdpa_fwd_sm90_enabled, sdpa_bwd_sm90_enabled) and their modifier parts (sdpa_fwd_sm90_mods_enabled,
// sdpa_bwd_sm90_mods_enabled: on by default, FLASHSPAN_SM90_SDPA_MODS=0 / FLASHSPAN_SM90_SDPA_BWD_MODS=0
// off), dropout on both (sdpa_sm90_dropout_enabled: FLASHSPAN_EXPERIMENTAL=1), the environment's off
// switches (env_flag_off), and the workspace a covered backward gets.
// Descriptors only: no data, no device.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "core/sdpa_problem.h"
#include "dispatch/family.h"
#include "dispatch/sdpa_launch.h"
#include "kernels/sm80/tile_sm80.h"
#include "kernels/sm90/launch_sm90.h"
#include "kernels/sm90/tile_sm90.h"
#include "scoped_env.h"

namespace flashspan::test {
namespace {

TensorView desc(int64_t B, int64_t H, int64_t S, int64_t D, DType t = DType::kBFloat16) {
  TensorView v;
  v.dtype = t;
  v.device = DeviceType::kCUDA;
  v.ndim = 4;
  v.shape = {B, H, S, D};
  v.strides = {H * S * D, S * D, D, 1};
  return v;
}

TensorView vec(int64_t n, DType t) {
  TensorView v;
  v.dtype = t;
  v.device = DeviceType::kCUDA;
  v.ndim = 1;
  v.shape = {n};
  v.strides = {1};
  return v;
}

// A forward call: B = 2, H_q = 4, H_k = H_v = 2, S_q = 300, S_kv = 500, causal.
struct Call {
  sdpa::Attributes a;
  int64_t dqk = 128, dv = 128, hv = 2, hq = 4, hk = 2;
  int64_t sq = 300, skv = 500;
  DType dtype = DType::kBFloat16;
  std::vector<std::pair<int, TensorView>> grads;  // backward-only tensors (dBias, dSink, dgate): backward_problem's

  sdpa::Problem problem() {
    a.tensors[FS_SDPA_Q] = desc(2, hq, sq, dqk, dtype);
    a.tensors[FS_SDPA_K] = desc(2, hk, skv, dqk, dtype);
    a.tensors[FS_SDPA_V] = desc(2, hv, skv, dv, dtype);
    a.tensors[FS_SDPA_O] = desc(2, hq, sq, dv, dtype);
    a.tensors[FS_SDPA_STATS] = desc(2, hq, sq, 1, DType::kFloat32);
    a.generate_stats = true;
    a.attn_scale_value = 0.125f;
    if (!a.right_bound) a.right_bound = 0;
    return sdpa::validate_forward(a);
  }
};

std::string refusal(Call c) {
  const char* r = sdpa_fwd_sm90_refusal(c.problem());
  return r == nullptr ? "" : r;
}

// A call with packed Q / O / stats (THD): ragged offsets and cumulative lengths (both
// directions refuse it on sm90 with their packed switch off, FLASHSPAN_SM90_SDPA_THD=0).
Call packed_thd_call() {
  Call c;
  for (int s : {FS_SDPA_RAGGED_OFFSET_Q, FS_SDPA_RAGGED_OFFSET_O, FS_SDPA_RAGGED_OFFSET_STATS}) {
    c.a.tensors[size_t(s)] = vec(3, DType::kInt32);
  }
  c.a.tensors[FS_SDPA_CU_SEQ_LEN_Q] = vec(3, DType::kInt32);
  c.a.tensors[FS_SDPA_CU_SEQ_LEN_KV] = vec(3, DType::kInt32);
  c.a.padding_mask = true;
  return c;
}

TEST(SdpaFamily, Sm90ForwardCoversThePureMaskSubset) {
  EXPECT_EQ(refusal(Call{}), "");
  // Dims up to 128 and the two big pairs (the backward's too: Sm90BackwardCoversTheForwardsSubset).
  for (auto [dqk, dv] :
       {std::pair<int64_t, int64_t>{64, 64}, {8, 16}, {128, 64}, {40, 120}, {96, 96}, {192, 128}, {256, 256}}) {
    Call c;
    c.dqk = dqk;
    c.dv = dv;
    EXPECT_EQ(refusal(c), "") << dqk << "," << dv;
  }
  {
    Call c;  // padding, bottom-right band, base-2 stats, max_logit
    c.a.tensors[FS_SDPA_SEQ_LEN_Q] = vec(2, DType::kInt32);
    c.a.tensors[FS_SDPA_SEQ_LEN_KV] = vec(2, DType::kInt32);
    c.a.padding_mask = true;
    c.a.alignment = FS_SDPA_BOTTOM_RIGHT;
    c.a.left_bound = 64;
    c.a.stats_use_log2 = true;
    c.a.tensors[FS_SDPA_MAX_LOGIT] = vec(4, DType::kFloat32);
    EXPECT_EQ(refusal(c), "");
  }
  {
    Call c;
    c.dtype = DType::kFloat16;
    EXPECT_EQ(refusal(c), "");
  }
}

// Forces the sm90 forward's kernel with score modifiers on or off for a scope (FLASHSPAN_SM90_SDPA_MODS's
// answer after it), so that the refusals tested do not depend on the environment.
struct ModsSwitch {
  explicit ModsSwitch(int on) { set_sdpa_fwd_sm90_mods_enabled(on); }
  ~ModsSwitch() { set_sdpa_fwd_sm90_mods_enabled(-1); }
};

// Forces dropout on the sm90 kernels (sdpa_sm90_dropout_enabled, both directions) on or off for a scope
// (FLASHSPAN_EXPERIMENTAL's answer after it).
struct DropoutSwitch {
  explicit DropoutSwitch(int on) { set_sdpa_sm90_dropout_enabled(on); }
  ~DropoutSwitch() { set_sdpa_sm90_dropout_enabled(-1); }
};

// Forces packed (THD) tensors on the sm90 forward and backward (sdpa_sm90_thd_enabled, on unless
// FLASHSPAN_SM90_SDPA_THD=0) on or off for a scope (the environment's answer after it).
struct ThdSwitch {
  explicit ThdSwitch(int on) { set_sdpa_sm90_thd_enabled(on); }
  ~ThdSwitch() { set_sdpa_sm90_thd_enabled(-1); }
};

TEST(SdpaFamily, Sm90ForwardLeavesTheRestToSm80) {
  const ModsSwitch off(0);
  const ThdSwitch thd_off(0);
  // Head dims the sm90 forward has no kernel for: (192, 192), (256, 128), a dim past 256.
  for (auto [dqk, dv] : {std::pair<int64_t, int64_t>{192, 192}, {256, 128}, {136, 136}}) {
    Call c;
    c.dqk = dqk;
    c.dv = dv;
    EXPECT_NE(refusal(c).find("head dims"), std::string::npos) << dqk << "," << dv;
  }
  {
    Call c;
    c.a.softcap = 5.0f;
    EXPECT_NE(refusal(c).find("softcap"), std::string::npos);
  }
  {
    Call c;
    c.a.alibi = true;
    EXPECT_NE(refusal(c).find("ALiBi"), std::string::npos);
  }
  {
    Call c;
    c.a.tensors[FS_SDPA_SINK_TOKEN] = vec(4, DType::kFloat32);
    EXPECT_EQ(refusal(c), sdpa::slot_name(FS_SDPA_SINK_TOKEN));
  }
  {
    Call c;
    c.a.tensors[FS_SDPA_GATE] = desc(2, 4, 300, 128);
    EXPECT_EQ(refusal(c), sdpa::slot_name(FS_SDPA_GATE));
  }
  {
    const Call c = packed_thd_call();
    EXPECT_NE(refusal(c).find("ragged"), std::string::npos);
  }
}


// The calls the sm90 forward's kernel with score modifiers takes (sdpa_fwd_kernel_sm90 with
// AnalyticModSourceSm90), each feature alone and all together, with what still makes a call refuse it.
std::vector<std::pair<std::string, Call>> modifier_calls() {
  std::vector<std::pair<std::string, Call>> calls;
  auto add = [&](const std::string& name, auto&& f) {
    Call c;
    f(c);
    calls.emplace_back(name, c);
  };
  auto softcap = [](Call& c) { c.a.softcap = 30.0f; };
  auto alibi = [](Call& c) { c.a.alibi = true; };
  auto sinks = [](Call& c) { c.a.tensors[FS_SDPA_SINK_TOKEN] = vec(4, DType::kFloat32); };
  auto bias = [](Call& c) {
    TensorView b = desc(1, 4, 300, 500, DType::kFloat32);  // broadcast over B
    b.strides[0] = 0;
    c.a.tensors[FS_SDPA_BIAS] = b;
  };
  auto gate = [](Call& c) { c.a.tensors[FS_SDPA_GATE] = desc(2, 4, 300, c.dv); };
  auto stats = [](Call& c) {
    c.a.tensors[FS_SDPA_SCORE_MAX] = desc(2, 4, 300, 1, DType::kFloat32);
    c.a.tensors[FS_SDPA_SCORE_SUM_EXP] = desc(2, 4, 300, 1, DType::kFloat32);
  };
  auto block_mask = [](Call& c) { c.a.tensors[FS_SDPA_BLOCK_MASK] = desc(2, 4, 3, 1, DType::kUInt8); };
  add("softcap", softcap);
  add("alibi", alibi);
  add("sinks", sinks);
  add("bias", bias);
  add("gate", gate);
  add("score_max / score_sum_exp", stats);
  add("block_mask", block_mask);
  add("all", [&](Call& c) {
    c.dqk = c.dv = 96;
    softcap(c);
    alibi(c);
    sinks(c);
    bias(c);
    gate(c);
    stats(c);
    block_mask(c);
    c.a.tensors[FS_SDPA_SEQ_LEN_Q] = vec(2, DType::kInt64);
    c.a.tensors[FS_SDPA_SEQ_LEN_KV] = vec(2, DType::kInt64);
    c.a.padding_mask = true;
  });
  return calls;
}

TEST(SdpaFamily, Sm90ForwardThdSwitch) {
  // Packed (THD) q, o, stats (and k, v, a packed gate with the modifiers' kernel): the sm90 forward takes them
  // with its switch on (per-sample tensor maps; the default, Sm90ThdSwitchReadsTheEnvironment; the backward:
  // Sm90BackwardThdRule); off, the sm80 forward.
  Call c = packed_thd_call();
  for (int s : {FS_SDPA_RAGGED_OFFSET_K, FS_SDPA_RAGGED_OFFSET_V}) c.a.tensors[size_t(s)] = vec(3, DType::kInt32);
  {
    const ThdSwitch on(1);
    EXPECT_EQ(refusal(c), "");
    Call g = c;
    g.a.tensors[FS_SDPA_GATE] = desc(2, 4, 300, 128);
    g.a.tensors[FS_SDPA_RAGGED_OFFSET_GATE] = vec(3, DType::kInt32);
    {
      const ModsSwitch mods(1);
      EXPECT_EQ(refusal(g), "");
    }
    {
      const ModsSwitch mods(0);
      EXPECT_NE(refusal(g), "");
    }
  }
  {
    const ThdSwitch off(0);
    EXPECT_NE(refusal(c).find("ragged"), std::string::npos);
  }
}

TEST(SdpaFamily, Sm90ForwardWithModifiersSwitch) {
  // On (the default, or the override): the forward takes each call; off (FLASHSPAN_SM90_SDPA_MODS=0,
  // or the override): each is refused with the message of the pure-mask rule.
  for (auto& [name, c] : modifier_calls()) {
    std::string off_msg;
    {
      const ModsSwitch off(0);
      off_msg = refusal(c);
    }
    EXPECT_NE(off_msg, "") << name;
    const ModsSwitch on(1);
    EXPECT_EQ(refusal(c), "") << name;
  }
  {
    const ModsSwitch off(0);
    Call c;
    c.a.softcap = 5.0f;
    EXPECT_EQ(refusal(c), "score modifiers (softcap, ALiBi)");
    Call s;
    s.a.tensors[FS_SDPA_SINK_TOKEN] = vec(4, DType::kFloat32);
    EXPECT_EQ(refusal(s), sdpa::slot_name(FS_SDPA_SINK_TOKEN));
  }
  // What the modifiers' kernel does not run still goes to sm80 with it on: packed THD (its switch off), (192,
  // 128), dropout (Philox), a packed gate (H_k != H_v it runs: Sm90ForwardTakesHkNeHvTheBackwardDoesNot).
  const ModsSwitch on(1);
  const ThdSwitch thd_off(0);
  {
    Call c = packed_thd_call();
    c.a.softcap = 5.0f;
    EXPECT_NE(refusal(c).find("ragged"), std::string::npos);
  }
  {
    Call c;  // (192, 128) runs on sm90 without modifiers; the modifiers' kernels stop at 128
    c.a.softcap = 5.0f;
    c.dqk = 192;
    EXPECT_EQ(refusal(c), "score modifiers (softcap, ALiBi)");
    Call s;
    s.a.tensors[FS_SDPA_SINK_TOKEN] = vec(4, DType::kFloat32);
    s.dqk = s.dv = 256;
    EXPECT_EQ(refusal(s), sdpa::slot_name(FS_SDPA_SINK_TOKEN));
  }
  {
    Call c;
    const DropoutSwitch dropout_off(0);  // (with it: Sm90DropoutSwitch)
    c.a.dropout_probability = 0.25f;
    c.a.tensors[FS_SDPA_DROPOUT_SEED] = vec(1, DType::kInt64);
    c.a.tensors[FS_SDPA_DROPOUT_OFFSET] = vec(1, DType::kInt64);
    EXPECT_NE(refusal(c).find("dropout"), std::string::npos);
  }
  {
    Call c;
    c.a.tensors[FS_SDPA_GATE] = desc(2, 4, 300, 128);
    c.a.tensors[FS_SDPA_RAGGED_OFFSET_GATE] = vec(3, DType::kInt32);
    c.a.tensors[FS_SDPA_CU_SEQ_LEN_Q] = vec(3, DType::kInt32);
    c.a.tensors[FS_SDPA_CU_SEQ_LEN_KV] = vec(3, DType::kInt32);
    c.a.padding_mask = true;
    EXPECT_EQ(refusal(c), sdpa::slot_name(FS_SDPA_RAGGED_OFFSET_GATE));
  }
}

// A modifier switch's environment rule (one direction's: set / enabled its override and answer,
// refused the refusal of that direction): without the override, on unless `var` is "0" (unset, empty
// or any other value: on), read per call; FLASHSPAN_EXPERIMENTAL (the switch before it) no longer
// changes it; the override wins over the environment both ways. c: a call refused with the modifiers'
// message when the switch is off.
template <class Set, class Enabled, class Refused>
void check_mods_switch_env(const char* var, Set set, Enabled enabled, Refused refused, const Call& c) {
  set(-1);
  ScopedEnv mods(var, nullptr);
  ScopedEnv experimental("FLASHSPAN_EXPERIMENTAL", nullptr);
  EXPECT_TRUE(enabled());
  EXPECT_EQ(refused(c), "");
  experimental.set("0");
  EXPECT_TRUE(enabled());
  mods.set("0");
  EXPECT_FALSE(enabled());
  EXPECT_EQ(refused(c), "score modifiers (softcap, ALiBi)");
  experimental.set("1");
  EXPECT_FALSE(enabled());
  for (const char* on : {"1", "", "yes"}) {  // anything but "0" leaves it on
    mods.set(on);
    EXPECT_TRUE(enabled()) << var << "=\"" << on << '"';
  }
  set(0);
  EXPECT_FALSE(enabled());
  mods.set("0");
  set(1);
  EXPECT_TRUE(enabled());
  EXPECT_EQ(refused(c), "");
  set(-1);
}

TEST(SdpaFamily, Sm90ForwardModifiersSwitchReadsTheEnvironment) {
  // FLASHSPAN_SM90_SDPA_MODS (since PERF_LOG v2.13; before, FLASHSPAN_EXPERIMENTAL=1).
  Call c;
  c.a.softcap = 5.0f;
  check_mods_switch_env("FLASHSPAN_SM90_SDPA_MODS", set_sdpa_fwd_sm90_mods_enabled, sdpa_fwd_sm90_mods_enabled,
                        [](const Call& x) { return refusal(x); }, c);
}

// A backward call on the same shapes: O and the stats as inputs, dO, dQ, dK, dV.
sdpa::Problem backward_problem(Call c, bool deterministic = false) {
  c.problem();  // fills the forward tensors
  sdpa::Attributes& a = c.a;
  for (const auto& [slot, t] : c.grads) a.tensors[size_t(slot)] = t;
  a.tensors[FS_SDPA_DO] = desc(2, c.hq, 300, c.dv, c.dtype);
  a.tensors[FS_SDPA_DQ] = desc(2, c.hq, 300, c.dqk, c.dtype);
  a.tensors[FS_SDPA_DK] = desc(2, c.hk, 500, c.dqk, c.dtype);
  a.tensors[FS_SDPA_DV] = desc(2, c.hv, 500, c.dv, c.dtype);
  a.generate_stats = false;
  a.backward = true;
  a.deterministic = deterministic;
  return sdpa::validate_backward(a);
}

std::string bwd_refusal(Call c, bool deterministic = false) {
  const char* r = sdpa_bwd_sm90_refusal(backward_problem(c, deterministic));
  return r == nullptr ? "" : r;
}

TEST(SdpaFamily, Sm90BackwardThdRule) {
  // Packed tensors on the sm90 backward (the forward's switch): every tensor of the THD call packed,
  // dK and dV both packed; one of them padded refuses (the epilogue writes one row count for both); the switch off
  // refuses them all; the layout's refusal takes them whatever the switch says.
  Call c = packed_thd_call();
  for (int s : {FS_SDPA_RAGGED_OFFSET_K, FS_SDPA_RAGGED_OFFSET_V}) c.a.tensors[size_t(s)] = vec(3, DType::kInt32);
  // (the gradients' offsets: backward-only tensors, bound after the forward's validation)
  for (int s : {FS_SDPA_RAGGED_OFFSET_DO, FS_SDPA_RAGGED_OFFSET_DQ, FS_SDPA_RAGGED_OFFSET_DK}) {
    c.grads.emplace_back(s, vec(3, DType::kInt32));
  }
  {
    const ThdSwitch on(1);
    EXPECT_EQ(bwd_refusal(c), "dK and dV one packed, the other padded");
    c.grads.emplace_back(FS_SDPA_RAGGED_OFFSET_DV, vec(3, DType::kInt32));
    EXPECT_EQ(bwd_refusal(c), "");
  }
  {
    const ThdSwitch off(0);
    EXPECT_NE(bwd_refusal(c).find("ragged"), std::string::npos);
    EXPECT_EQ(sdpa_bwd_sm90_layout_refusal(backward_problem(c)), nullptr);
  }
}

// Packed (THD) tensors on the sm90 forward and backward (sdpa_sm90_thd_enabled): on by default since its GPU tests
// passed, off when FLASHSPAN_SM90_SDPA_THD is exactly "0" (expect_off_switch: read per call, unset, empty or any other
// value on, FLASHSPAN_EXPERIMENTAL -- its switch before -- ignored, the override wins both ways). What it changes:
// a packed call passes both directions' refusals with it on; with it off both refuse it, naming the variable, and
// the sm80 kernels take it; the backward workspace's layout (sdpa_bwd_sm90_layout_refusal) takes it either way.
TEST(SdpaFamily, Sm90ThdSwitchReadsTheEnvironment) {
  Call c = packed_thd_call();
  for (int s : {FS_SDPA_RAGGED_OFFSET_K, FS_SDPA_RAGGED_OFFSET_V}) c.a.tensors[size_t(s)] = vec(3, DType::kInt32);
  for (int s : {FS_SDPA_RAGGED_OFFSET_DO, FS_SDPA_RAGGED_OFFSET_DQ, FS_SDPA_RAGGED_OFFSET_DK,
                FS_SDPA_RAGGED_OFFSET_DV}) {
    c.grads.emplace_back(s, vec(3, DType::kInt32));
  }
  const std::string off = "ragged (packed) q, k, v, o, stats or gradients (FLASHSPAN_SM90_SDPA_THD=0)";
  expect_off_switch("FLASHSPAN_SM90_SDPA_THD", set_sdpa_sm90_thd_enabled, sdpa_sm90_thd_enabled,
                    [&](bool on, const std::string& where) {
                      EXPECT_EQ(refusal(c), on ? "" : off) << where;
                      EXPECT_EQ(bwd_refusal(c), on ? "" : off) << where;
                      EXPECT_EQ(sdpa_bwd_sm90_layout_refusal(backward_problem(c)), nullptr) << where;
                    });
}

TEST(SdpaFamily, Sm90BackwardCoversTheForwardsSubset) {
  // The forward's calls, deterministic or not (the same rule, sdpa_family.cpp sm90_refusal).
  EXPECT_EQ(bwd_refusal(Call{}), "");
  EXPECT_EQ(bwd_refusal(Call{}, true), "");
  for (auto [dqk, dv] :
       {std::pair<int64_t, int64_t>{64, 64}, {8, 16}, {128, 64}, {40, 120}, {96, 96}, {192, 128}, {256, 256}}) {
    Call c;
    c.dqk = dqk;
    c.dv = dv;
    EXPECT_EQ(bwd_refusal(c), "") << dqk << "," << dv;
    EXPECT_EQ(bwd_refusal(c, true), "") << dqk << "," << dv << " deterministic";
  }
  {
    Call c;  // padding, bottom-right band, fp16
    c.a.tensors[FS_SDPA_SEQ_LEN_Q] = vec(2, DType::kInt32);
    c.a.tensors[FS_SDPA_SEQ_LEN_KV] = vec(2, DType::kInt64);
    c.a.padding_mask = true;
    c.a.alignment = FS_SDPA_BOTTOM_RIGHT;
    c.a.left_bound = 64;
    c.dtype = DType::kFloat16;
    EXPECT_EQ(bwd_refusal(c), "");
  }
  // The forward's refusal of a backward call names a backward tensor (each direction its own list).
  EXPECT_NE(sdpa_fwd_sm90_refusal(backward_problem(Call{})), nullptr);
}

// Forces the sm90 backward's modifiers (sdpa_bwd_sm90_mods_enabled, its own switch) on or off for a
// scope (FLASHSPAN_SM90_SDPA_BWD_MODS's answer after it), so that the refusals tested do not depend on
// the environment.
struct BwdModsSwitch {
  explicit BwdModsSwitch(int on) { set_sdpa_bwd_sm90_mods_enabled(on); }
  ~BwdModsSwitch() { set_sdpa_bwd_sm90_mods_enabled(-1); }
};

// dBias's workspace form pinned (sdpa_dbias_ds_form: the accumulator and direct forms off), for tests of the
// workspace layout that must read the same on a machine whose sm_90 device would take the other forms.
struct DbiasWorkspaceForm {
  ScopedSwitch acc{set_sdpa_dbias_acc_enabled, 0};
  ScopedSwitch direct{set_sdpa_dbias_direct_enabled, 0};
};

TEST(SdpaFamily, Sm90BackwardLeavesTheRestToSm80) {
  const ModsSwitch on(1);  // the forward's kernel with modifiers changes nothing in the backward's rule
  const BwdModsSwitch bwd_off(0);  // (the backward's own: Sm90BackwardWithModifiersSwitch)
  for (auto [dqk, dv] : {std::pair<int64_t, int64_t>{192, 192}, {256, 128}, {136, 136}}) {
    Call c;  // dims without an sm90 kernel
    c.dqk = dqk;
    c.dv = dv;
    EXPECT_NE(bwd_refusal(c).find("head dims"), std::string::npos) << dqk << "," << dv;
  }
  {
    Call c;  // H_k != H_v with neither a multiple of the other (H_q = 6: groups 2 and 3)
    c.hq = 6;
    c.hk = 3;
    c.hv = 2;
    EXPECT_NE(bwd_refusal(c).find("H_k != H_v"), std::string::npos);
  }
  {
    Call c;
    c.a.softcap = 5.0f;
    EXPECT_NE(bwd_refusal(c).find("softcap"), std::string::npos);
  }
  {
    Call c;  // sinks
    c.a.tensors[FS_SDPA_SINK_TOKEN] = vec(4, DType::kFloat32);
    EXPECT_EQ(bwd_refusal(c), sdpa::slot_name(FS_SDPA_SINK_TOKEN));
  }
  {
    const ThdSwitch thd_off(0);
    const Call c = packed_thd_call();
    EXPECT_NE(bwd_refusal(c).find("ragged"), std::string::npos);
  }
}

TEST(SdpaFamily, Sm90TakesHkNeHvBothDirections) {
  // H_k != H_v (H_q = 4, H_k = 2, H_v = 1 or 4): the forward covers it (V of each query head's own V head), and
  // so does the backward (its work items' query heads share one K head and one V head; their partial dK / dV
  // summed per head: kernel_bwd_sm90.cuh AnalyticSourceBwdSm90), pure-mask and with modifiers, every head-dim
  // kernel, padded, deterministic or not, the modifiers' switches on or off.
  for (int64_t hv : {1, 4}) {
    for (auto [dqk, dv] : {std::pair<int64_t, int64_t>{128, 128}, {64, 64}, {40, 40}, {72, 128}, {192, 128}, {256, 256}}) {
      for (int mods : {0, 1}) {
        const ModsSwitch fwd_mods(mods);
        const BwdModsSwitch bwd_mods(mods);
        Call c;
        c.hv = hv;
        c.dqk = dqk;
        c.dv = dv;
        c.a.tensors[FS_SDPA_SEQ_LEN_Q] = vec(2, DType::kInt32);
        c.a.tensors[FS_SDPA_SEQ_LEN_KV] = vec(2, DType::kInt32);
        c.a.padding_mask = true;
        const std::string at = "H_v " + std::to_string(hv) + " D " + std::to_string(dqk) + "," + std::to_string(dv) +
                               " modifiers " + std::to_string(mods);
        EXPECT_EQ(refusal(c), "") << at;
        EXPECT_EQ(bwd_refusal(c), "") << at;
        EXPECT_EQ(bwd_refusal(c, true), "") << at << " deterministic";
        if (dqk <= 128 && dv <= 128) {
          c.a.softcap = 5.0f;
          c.a.tensors[FS_SDPA_SINK_TOKEN] = vec(4, DType::kFloat32);
          const std::string want = mods ? "" : "score modifiers (softcap, ALiBi)";
          EXPECT_EQ(refusal(c), want) << at << " softcap, sinks";
          EXPECT_EQ(bwd_refusal(c), want) << at << " softcap, sinks";
          EXPECT_EQ(bwd_refusal(c, true), want) << at << " softcap, sinks, deterministic";
        }
      }
    }
  }
  // Every nested pair of H_q = 8 (MQA-like to MHA-like on either side) runs on both.
  for (auto [hk, hv] : {std::pair<int64_t, int64_t>{1, 2}, {2, 4}, {4, 1}, {8, 2}, {2, 8}, {1, 8}, {8, 1}, {4, 8}}) {
    Call c;
    c.hq = 8;
    c.hk = hk;
    c.hv = hv;
    const std::string at = "H_k " + std::to_string(hk) + " H_v " + std::to_string(hv);
    EXPECT_EQ(refusal(c), "") << at;
    EXPECT_EQ(bwd_refusal(c), "") << at;
    EXPECT_EQ(bwd_refusal(c, true), "") << at << " deterministic";
  }
  // Neither group a multiple of the other (H_q = 6, H_k = 3, H_v = 2: groups 2 and 3; H_q = 12, H_k = 4,
  // H_v = 6): the forward takes it, the backward keeps the sm80 kernels' two dK/dV passes.
  for (auto [hq, hk, hv] : {std::tuple<int64_t, int64_t, int64_t>{6, 3, 2}, {12, 4, 6}, {6, 2, 3}}) {
    Call c;
    c.hq = hq;
    c.hk = hk;
    c.hv = hv;
    const std::string at = "H_q " + std::to_string(hq) + " H_k " + std::to_string(hk) + " H_v " + std::to_string(hv);
    EXPECT_EQ(refusal(c), "") << at;
    EXPECT_EQ(bwd_refusal(c), "H_k != H_v (neither of H_k, H_v a multiple of the other)") << at;
  }
  // What the rule refuses otherwise it still refuses with H_k != H_v (dropout: with its switch off).
  const DropoutSwitch dropout_off(0);
  Call c;
  c.hv = 1;
  c.a.dropout_probability = 0.25f;
  c.a.tensors[FS_SDPA_DROPOUT_SEED] = vec(1, DType::kInt64);
  c.a.tensors[FS_SDPA_DROPOUT_OFFSET] = vec(1, DType::kInt64);
  EXPECT_NE(refusal(c).find("dropout"), std::string::npos);
  EXPECT_NE(bwd_refusal(c).find("dropout"), std::string::npos);
}

// The sm90 SDPA switches (forward and backward): the in-process override (1 on, 0 off, -1 back
// to the environment's answer), and a CPU problem never takes a GPU family, switch on or not.
template <class Set, class Enabled, class Runs>
void check_sm90_switch(Set set, Enabled enabled, Runs runs, sdpa::Problem p) {
  set(1);
  EXPECT_TRUE(enabled());
  set(0);
  EXPECT_FALSE(enabled());
  set(1);
  p.device = DeviceType::kCPU;
  EXPECT_FALSE(runs(p));
  set(-1);
}

TEST(SdpaFamily, Sm90BackwardOfModifierCallsStaysOnSm80) {
  // Without the backward's own switch, the backward of the calls the forward's kernel with modifiers
  // takes keeps its rule (the sm80 kernels for the modifiers, sinks and the gate), the forward's
  // switch on or off.
  const BwdModsSwitch bwd_off(0);
  for (int on : {0, 1}) {
    const ModsSwitch sw(on);
    for (auto& [name, c] : modifier_calls()) {
      if (c.a.has(FS_SDPA_SCORE_MAX) || c.a.has(FS_SDPA_BLOCK_MASK)) continue;  // forward-only outputs / checked below
      EXPECT_NE(bwd_refusal(c), "") << name << " switch " << on;
    }
    Call bm;
    bm.a.tensors[FS_SDPA_BLOCK_MASK] = desc(2, 4, 3, 1, DType::kUInt8);
    EXPECT_EQ(bwd_refusal(bm), sdpa::slot_name(FS_SDPA_BLOCK_MASK)) << on;
  }
}

// The backward calls the sm90 backward's modifier part takes: each feature alone with its gradient,
// combinations (dBias not with softcap: the C layer's rule on CUDA tensors), padding, head dims up
// to 128.
std::vector<std::pair<std::string, Call>> backward_modifier_calls() {
  std::vector<std::pair<std::string, Call>> calls;
  auto add = [&](const std::string& name, auto&& f) {
    Call c;
    f(c);
    calls.emplace_back(name, c);
  };
  auto bias = [](Call& c, bool dbias) {
    TensorView b = desc(1, 4, 300, 500, DType::kFloat32);  // broadcast over B
    b.strides[0] = 0;
    c.a.tensors[FS_SDPA_BIAS] = b;
    if (dbias) c.grads.emplace_back(FS_SDPA_DBIAS, desc(1, 4, 300, 500, DType::kFloat32));
  };
  auto sinks = [](Call& c) {
    c.a.tensors[FS_SDPA_SINK_TOKEN] = vec(4, DType::kFloat32);
    c.grads.emplace_back(FS_SDPA_DSINK_TOKEN, vec(4, DType::kFloat32));
  };
  auto gate = [](Call& c) {
    c.a.tensors[FS_SDPA_GATE] = desc(2, 4, 300, c.dv);
    c.grads.emplace_back(FS_SDPA_DGATE, desc(2, 4, 300, c.dv));
  };
  add("softcap", [](Call& c) { c.a.softcap = 30.0f; });
  add("alibi", [](Call& c) { c.a.alibi = true; });
  add("sinks + dSink", sinks);
  add("sinks without dSink", [](Call& c) { c.a.tensors[FS_SDPA_SINK_TOKEN] = vec(4, DType::kFloat32); });
  add("bias", [&](Call& c) { bias(c, false); });
  add("bias + dBias", [&](Call& c) { bias(c, true); });
  add("gate + dgate", gate);
  add("gate without dgate", [](Call& c) { c.a.tensors[FS_SDPA_GATE] = desc(2, 4, 300, c.dv); });
  add("softcap, ALiBi, sinks, bias, gate, padding, D 96", [&](Call& c) {
    c.dqk = c.dv = 96;
    c.a.softcap = 5.0f;
    c.a.alibi = true;
    sinks(c);
    bias(c, false);
    gate(c);
    c.a.tensors[FS_SDPA_SEQ_LEN_Q] = vec(2, DType::kInt64);
    c.a.tensors[FS_SDPA_SEQ_LEN_KV] = vec(2, DType::kInt64);
    c.a.padding_mask = true;
  });
  add("ALiBi, bias + dBias, sinks, gate, D 64", [&](Call& c) {
    c.dqk = c.dv = 64;
    c.a.alibi = true;
    bias(c, true);
    sinks(c);
    gate(c);
  });
  return calls;
}

TEST(SdpaFamily, Sm90BackwardWithModifiersSwitch) {
  // On (the default, or the override): the backward takes each call, deterministic or not; off
  // (FLASHSPAN_SM90_SDPA_BWD_MODS=0, or the override): each is refused with the message of the
  // pure-mask rule, whatever the forward's switch says.
  for (auto& [name, c] : backward_modifier_calls()) {
    for (bool det : {false, true}) {
      {
        const BwdModsSwitch off(0);
        const ModsSwitch fwd_on(1);
        EXPECT_NE(bwd_refusal(c, det), "") << name;
      }
      const BwdModsSwitch on(1);
      const ModsSwitch fwd_off(0);
      EXPECT_EQ(bwd_refusal(c, det), "") << name << (det ? " deterministic" : "");
    }
  }
  {
    const BwdModsSwitch off(0);
    Call c;
    c.a.softcap = 5.0f;
    EXPECT_EQ(bwd_refusal(c), "score modifiers (softcap, ALiBi)");
    Call s;
    s.a.tensors[FS_SDPA_SINK_TOKEN] = vec(4, DType::kFloat32);
    EXPECT_EQ(bwd_refusal(s), sdpa::slot_name(FS_SDPA_SINK_TOKEN));
  }
  // What the modifiers' backward does not run still goes to sm80 with it on: the block_mask,
  // packed THD and a packed gate (their switch off: FLASHSPAN_SM90_SDPA_THD=0; with it on, the default, both run:
  // Sm90BackwardThdRule and below), (192, 128) / (256, 256) (the modifiers' kernels stop at 128), H_k != H_v with
  // neither group a multiple of the other, dropout.
  const BwdModsSwitch on(1);
  const ThdSwitch thd_off(0);
  {
    Call c;
    c.a.tensors[FS_SDPA_BLOCK_MASK] = desc(2, 4, 3, 1, DType::kUInt8);
    EXPECT_EQ(bwd_refusal(c), sdpa::slot_name(FS_SDPA_BLOCK_MASK));
  }
  {
    Call c = packed_thd_call();
    c.a.softcap = 5.0f;
    EXPECT_NE(bwd_refusal(c).find("ragged"), std::string::npos);
  }
  {
    Call c;
    c.a.softcap = 5.0f;
    c.dqk = 192;
    EXPECT_EQ(bwd_refusal(c), "score modifiers (softcap, ALiBi)");
    Call s;
    s.a.tensors[FS_SDPA_SINK_TOKEN] = vec(4, DType::kFloat32);
    s.grads.emplace_back(FS_SDPA_DSINK_TOKEN, vec(4, DType::kFloat32));
    s.dqk = s.dv = 256;
    EXPECT_EQ(bwd_refusal(s), sdpa::slot_name(FS_SDPA_SINK_TOKEN));
  }
  {
    Call c;
    c.a.tensors[FS_SDPA_SINK_TOKEN] = vec(6, DType::kFloat32);
    c.hq = 6;
    c.hk = 3;
    c.hv = 2;
    EXPECT_NE(bwd_refusal(c).find("H_k != H_v"), std::string::npos);
    c.hk = 6;  // (H_k a multiple of H_v: the sm90 backward with its modifiers)
    EXPECT_EQ(bwd_refusal(c), "");
  }
  {
    const DropoutSwitch dropout_off(0);  // (with it: Sm90DropoutSwitch)
    Call c;
    c.a.dropout_probability = 0.25f;
    c.a.tensors[FS_SDPA_DROPOUT_SEED] = vec(1, DType::kInt64);
    c.a.tensors[FS_SDPA_DROPOUT_OFFSET] = vec(1, DType::kInt64);
    EXPECT_NE(bwd_refusal(c).find("dropout"), std::string::npos);
  }
  {
    Call c;
    c.a.tensors[FS_SDPA_GATE] = desc(2, 4, 300, 128);
    c.a.tensors[FS_SDPA_RAGGED_OFFSET_GATE] = vec(3, DType::kInt32);
    c.a.tensors[FS_SDPA_CU_SEQ_LEN_Q] = vec(3, DType::kInt32);
    c.a.tensors[FS_SDPA_CU_SEQ_LEN_KV] = vec(3, DType::kInt32);
    c.a.padding_mask = true;
    EXPECT_EQ(bwd_refusal(c), sdpa::slot_name(FS_SDPA_RAGGED_OFFSET_GATE));
    set_sdpa_sm90_thd_enabled(1);  // (the default: a packed gate and dgate at their samples' starts)
    EXPECT_EQ(bwd_refusal(c), "");
    set_sdpa_sm90_thd_enabled(0);  // (thd_off's pin again)
  }
  // The forward's rule does not change with the backward's switch.
  {
    const ModsSwitch fwd_off(0);
    Call c;
    c.a.softcap = 5.0f;
    EXPECT_EQ(refusal(c), "score modifiers (softcap, ALiBi)");
  }
}

TEST(SdpaFamily, Sm90BackwardModifiersSwitchReadsTheEnvironment) {
  // FLASHSPAN_SM90_SDPA_BWD_MODS (since PERF_LOG v2.15; before, FLASHSPAN_EXPERIMENTAL=1), apart from
  // the forward's FLASHSPAN_SM90_SDPA_MODS: neither changes the other direction's rule.
  Call c;
  c.a.alibi = true;
  check_mods_switch_env("FLASHSPAN_SM90_SDPA_BWD_MODS", set_sdpa_bwd_sm90_mods_enabled, sdpa_bwd_sm90_mods_enabled,
                        [](const Call& x) { return bwd_refusal(x); }, c);
  set_sdpa_fwd_sm90_mods_enabled(-1);
  ScopedEnv bwd_mods("FLASHSPAN_SM90_SDPA_BWD_MODS", nullptr);
  ScopedEnv fwd_mods("FLASHSPAN_SM90_SDPA_MODS", "0");
  EXPECT_FALSE(sdpa_fwd_sm90_mods_enabled());
  EXPECT_TRUE(sdpa_bwd_sm90_mods_enabled());
  EXPECT_EQ(bwd_refusal(c), "");
  fwd_mods.set(nullptr);
  bwd_mods.set("0");
  EXPECT_TRUE(sdpa_fwd_sm90_mods_enabled());
  EXPECT_FALSE(sdpa_bwd_sm90_mods_enabled());
  EXPECT_EQ(refusal(c), "");
}

// Dropout calls on the shapes of Call: Philox (with rng_dump in the forward when `dump`), or the
// caller's mask (uint8, broadcast over B; with scale_inv in the backward when `inv`), with padding.
Call philox_call(bool dump = false) {
  Call c;
  c.a.dropout_probability = 0.25f;
  c.a.tensors[FS_SDPA_DROPOUT_SEED] = vec(1, DType::kInt64);
  c.a.tensors[FS_SDPA_DROPOUT_OFFSET] = vec(1, DType::kInt32);
  if (dump) c.a.tensors[FS_SDPA_RNG_DUMP] = desc(2, 4, 300, 500, DType::kUInt8);
  return c;
}

Call mask_call(bool inv = false) {
  Call c;
  c.a.dropout_mask_form = true;
  TensorView m = desc(1, 4, 300, 500, DType::kUInt8);
  c.a.tensors[FS_SDPA_DROPOUT_MASK] = m;
  c.a.tensors[FS_SDPA_DROPOUT_SCALE] = vec(1, DType::kFloat32);
  if (inv) c.grads.emplace_back(FS_SDPA_DROPOUT_SCALE_INV, vec(1, DType::kFloat32));  // (backward only)
  c.a.tensors[FS_SDPA_SEQ_LEN_Q] = vec(2, DType::kInt32);
  c.a.tensors[FS_SDPA_SEQ_LEN_KV] = vec(2, DType::kInt32);
  c.a.padding_mask = true;
  return c;
}

TEST(SdpaFamily, Sm90DropoutSwitch) {
  // Dropout runs on the sm90 kernels (their instantiations with modifiers and dropout) in both
  // directions with the switch on and the direction's modifiers on, head dims up to 128; off, or
  // with the modifiers off, or past 128, it is refused with "dropout" (the sm80 kernels).
  const ModsSwitch fwd_mods(1);
  const BwdModsSwitch bwd_mods(1);
  const std::vector<std::pair<std::string, Call>> fwd_calls = {
      {"philox", philox_call()}, {"philox + rng_dump", philox_call(true)}, {"mask", mask_call()}};
  const std::vector<std::pair<std::string, Call>> bwd_calls = {
      {"philox", philox_call()}, {"mask", mask_call()}, {"mask + scale_inv", mask_call(true)}};
  for (int on : {1, 0}) {
    const DropoutSwitch sw(on);
    EXPECT_EQ(sdpa_sm90_dropout_enabled(), on == 1);
    for (const auto& [name, c] : fwd_calls) {
      EXPECT_EQ(refusal(c), on ? "" : "dropout") << name << " forward, switch " << on;
    }
    for (const auto& [name, c] : bwd_calls) {
      for (bool det : {false, true}) {
        EXPECT_EQ(bwd_refusal(c, det), on ? "" : "dropout") << name << " backward, switch " << on;
      }
    }
  }
  const DropoutSwitch on(1);
  {
    Call c = philox_call();  // with every modifier of the kernels besides, D = 96
    c.dqk = c.dv = 96;
    c.a.softcap = 5.0f;
    c.a.alibi = true;
    c.a.tensors[FS_SDPA_SINK_TOKEN] = vec(4, DType::kFloat32);
    TensorView b = desc(1, 4, 300, 500, DType::kFloat32);
    b.strides[0] = 0;
    c.a.tensors[FS_SDPA_BIAS] = b;
    EXPECT_EQ(refusal(c), "");
    EXPECT_EQ(bwd_refusal(c), "");
  }
  for (auto [dqk, dv] : {std::pair<int64_t, int64_t>{192, 128}, {256, 256}}) {  // no dropout kernels there
    Call c = philox_call();
    c.dqk = dqk;
    c.dv = dv;
    EXPECT_EQ(refusal(c), "dropout") << dqk;
    EXPECT_EQ(bwd_refusal(c), "dropout") << dqk;
  }
  {
    Call c = mask_call();  // H_k != H_v: both directions take it with dropout (kv_addr.cuh v_head; the
    c.hv = 1;              // backward's items of shared K and V heads, kernel_bwd_sm90.cuh AnalyticSourceBwdSm90)
    EXPECT_EQ(refusal(c), "");
    EXPECT_EQ(bwd_refusal(c), "");
    Call h = philox_call(true);
    h.hv = 1;
    EXPECT_EQ(refusal(h), "");
    Call hb = philox_call();
    hb.hv = 1;
    EXPECT_EQ(bwd_refusal(hb), "");
    hb.hv = 4;
    EXPECT_EQ(bwd_refusal(hb, true), "");
    Call hn = philox_call();  // neither group a multiple of the other: the sm80 backward
    hn.hq = 6;
    hn.hk = 3;
    hn.hv = 2;
    EXPECT_NE(bwd_refusal(hn).find("H_k != H_v"), std::string::npos);
    const ThdSwitch thd_off(0);
    Call t = packed_thd_call();
    t.a.dropout_probability = 0.1f;
    t.a.tensors[FS_SDPA_DROPOUT_SEED] = vec(1, DType::kInt64);
    t.a.tensors[FS_SDPA_DROPOUT_OFFSET] = vec(1, DType::kInt64);
    EXPECT_NE(refusal(t).find("ragged"), std::string::npos);
  }
  {
    Call c = philox_call();  // a backward with rng_dump keeps the sm80 kernels (a forward output)
    c.grads.emplace_back(FS_SDPA_RNG_DUMP, desc(2, 4, 300, 500, DType::kUInt8));
    EXPECT_EQ(bwd_refusal(c), sdpa::slot_name(FS_SDPA_RNG_DUMP));
  }
  // Each direction's modifiers switch off: that direction's dropout back on sm80, the other's not.
  {
    const ModsSwitch fwd_off(0);
    EXPECT_EQ(refusal(philox_call()), "dropout");
    EXPECT_EQ(bwd_refusal(philox_call()), "");
  }
  {
    const BwdModsSwitch bwd_off(0);
    EXPECT_EQ(refusal(mask_call()), "");
    EXPECT_EQ(bwd_refusal(mask_call()), "dropout");
  }
}

TEST(SdpaFamily, Sm90DropoutSwitchReadsTheEnvironment) {
  // On unless FLASHSPAN_SM90_SDPA_DROPOUT is "0" (read per call; unset, empty or any other value: on);
  // FLASHSPAN_EXPERIMENTAL (the switch before it) no longer changes it; the override wins both ways.
  // Either modifiers switch off still refuses dropout (it runs on their kernels).
  set_sdpa_sm90_dropout_enabled(-1);
  ScopedEnv drop("FLASHSPAN_SM90_SDPA_DROPOUT", nullptr);
  ScopedEnv experimental("FLASHSPAN_EXPERIMENTAL", nullptr);
  ScopedEnv fwd_mods("FLASHSPAN_SM90_SDPA_MODS", nullptr);
  ScopedEnv bwd_mods("FLASHSPAN_SM90_SDPA_BWD_MODS", nullptr);
  set_sdpa_fwd_sm90_mods_enabled(-1);
  set_sdpa_bwd_sm90_mods_enabled(-1);
  EXPECT_TRUE(sdpa_sm90_dropout_enabled());
  EXPECT_EQ(refusal(philox_call()), "");
  EXPECT_EQ(bwd_refusal(mask_call()), "");
  experimental.set("0");
  EXPECT_TRUE(sdpa_sm90_dropout_enabled());
  drop.set("0");
  EXPECT_FALSE(sdpa_sm90_dropout_enabled());
  EXPECT_EQ(refusal(philox_call()), "dropout");
  EXPECT_EQ(bwd_refusal(mask_call()), "dropout");
  experimental.set("1");
  EXPECT_FALSE(sdpa_sm90_dropout_enabled());
  for (const char* on : {"1", "", "yes"}) {
    drop.set(on);
    EXPECT_TRUE(sdpa_sm90_dropout_enabled()) << "FLASHSPAN_SM90_SDPA_DROPOUT=\"" << on << '"';
  }
  fwd_mods.set("0");
  EXPECT_EQ(refusal(philox_call()), "dropout");
  EXPECT_EQ(bwd_refusal(mask_call()), "");
  fwd_mods.set(nullptr);
  drop.set("0");
  set_sdpa_sm90_dropout_enabled(1);
  EXPECT_TRUE(sdpa_sm90_dropout_enabled());
  EXPECT_EQ(refusal(philox_call()), "");
  drop.set(nullptr);
  set_sdpa_sm90_dropout_enabled(0);
  EXPECT_FALSE(sdpa_sm90_dropout_enabled());
  EXPECT_EQ(refusal(philox_call()), "dropout");
  set_sdpa_sm90_dropout_enabled(-1);
  EXPECT_TRUE(sdpa_sm90_dropout_enabled());
}

#ifdef FLASHSPAN_WITH_CUDA  // (the sm90 backward's switches, kernels/sm90/switches_sm90.cpp: CUDA builds only)
TEST(SdpaFamily, Sm90BackwardDropoutPhiloxKernel) {
  // The sm90 dropout backward's kernel (sm90::sdpa_bwd_dropout_philox_kernel): Philox dropout with nothing else in
  // the main loop (sinks, the gate, H_k != H_v are not the rule's) runs the Philox-only kernel while
  // sm90::bwd_dropout_philox_enabled(): on unless FLASHSPAN_SM90_BWD_DROPOUT_PHILOX is "0" (read per call;
  // FLASHSPAN_EXPERIMENTAL ignored), the override winning both ways; softcap, ALiBi, a bias, dBias, a block_mask or
  // the caller's mask: the modifiers' dropout kernel whatever the switch says.
  using flashspan::test::ScopedEnv;
  sm90::set_bwd_dropout_philox_enabled(-1);
  ScopedEnv var("FLASHSPAN_SM90_BWD_DROPOUT_PHILOX", nullptr);
  ScopedEnv experimental("FLASHSPAN_EXPERIMENTAL", nullptr);
  AnalyticMaskParams a{};
  a.dropout.mode = 1;
  a.score.group_v = 3;
  float sink = 0.0f;
  a.score.sink = &sink;
  EXPECT_TRUE(sm90::bwd_dropout_philox_enabled());
  EXPECT_TRUE(sm90::sdpa_bwd_dropout_philox_kernel(a));
  var.set("0");
  EXPECT_FALSE(sm90::bwd_dropout_philox_enabled());
  EXPECT_FALSE(sm90::sdpa_bwd_dropout_philox_kernel(a));
  experimental.set("1");
  EXPECT_FALSE(sm90::sdpa_bwd_dropout_philox_kernel(a));
  for (const char* v : {"1", "", "yes"}) {
    var.set(v);
    EXPECT_TRUE(sm90::sdpa_bwd_dropout_philox_kernel(a)) << "FLASHSPAN_SM90_BWD_DROPOUT_PHILOX=\"" << v << '"';
  }
  experimental.set(nullptr);
  sm90::set_bwd_dropout_philox_enabled(0);
  EXPECT_FALSE(sm90::sdpa_bwd_dropout_philox_kernel(a));
  var.set("0");
  sm90::set_bwd_dropout_philox_enabled(1);
  EXPECT_TRUE(sm90::sdpa_bwd_dropout_philox_kernel(a));
  int bias = 0;
  uint8_t bits = 0;
  for (int f = 0; f < 6; ++f) {
    AnalyticMaskParams m = a;
    switch (f) {
      case 0: m.score.softcap2 = 1.0f; break;
      case 1: m.score.alibi_n = 4; break;
      case 2: m.bias.bias = &bias; break;
      case 3: m.bias.dbias = &bias; break;
      case 4: m.block_mask.bits = &bits; break;
      default: m.dropout.mode = 2; break;  // the caller's mask
    }
    EXPECT_FALSE(sm90::sdpa_bwd_dropout_philox_kernel(m)) << "feature " << f;
  }
  sm90::set_bwd_dropout_philox_enabled(-1);
  var.set(nullptr);
  EXPECT_TRUE(sm90::sdpa_bwd_dropout_philox_kernel(a));
}

TEST(SdpaFamily, Sm90BackwardGemmOrderSwitch) {
  // sm90::bwd_gemm_order() (the (128, 128) backward kernels' register split, flex and SDPA; PERF_LOG v2.79): 4 unset
  // or for any value but FLASHSPAN_SM90_BWD_ORDER=0, which gives 0, and the experimental values 12, 16, 20, 28, 32,
  // 36, 44 (PERF_LOG v2.80), which need FLASHSPAN_EXPERIMENTAL=1 (read per call); set_bwd_gemm_order's override
  // winning (0 and the experimental values as they are, others 4), -1 back to the environment's answer.
  using flashspan::test::ScopedEnv;
  sm90::set_bwd_gemm_order(-1);
  ScopedEnv var("FLASHSPAN_SM90_BWD_ORDER", nullptr);
  ScopedEnv experimental("FLASHSPAN_EXPERIMENTAL", nullptr);
  for (const char* e : {static_cast<const char*>(nullptr), "1"}) {
    experimental.set(e);
    const std::string where = std::string("FLASHSPAN_EXPERIMENTAL=") + (e ? e : "(unset)");
    var.set(nullptr);
    EXPECT_EQ(sm90::bwd_gemm_order(), 4) << where;
    for (const auto& [v, order] : std::vector<std::pair<const char*, int>>{
             {"0", 0}, {"4", 4}, {"2", 4}, {"3", 4}, {"1", 4}, {"", 4}, {"00", 4}, {"x", 4}, {" 0", 4}}) {
      var.set(v);
      EXPECT_EQ(sm90::bwd_gemm_order(), order) << where << " FLASHSPAN_SM90_BWD_ORDER=\"" << v << '"';
    }
    // The experimental steps: their values with FLASHSPAN_EXPERIMENTAL=1, else 4.
    for (int x : {12, 16, 20, 28, 32, 36, 44}) {
      const std::string v = std::to_string(x);
      var.set(v.c_str());
      const int o = sm90::bwd_gemm_order();
      EXPECT_EQ(o, e ? x : 4) << where << " FLASHSPAN_SM90_BWD_ORDER=" << v;
      // Each kernel takes its own bits: (128, 128), flex and SDPA, the value with the 240-register bit, the flex
      // (64, 64) wide tile its late-dK (16) or deferred-dK (32) bit alone.
      EXPECT_EQ(sm90::bwd_gemm_order_128(o), e ? x | 4 : 4);
      EXPECT_EQ(sm90::bwd_gemm_order_wide64(o), e ? x & 48 : 0);
    }
    var.set("8");
    EXPECT_EQ(sm90::bwd_gemm_order(), 4) << where;
  }
  // The cache slots: one per kernel's order (0, 4, 12, 20, 28, 36, 44, 16, 32), all distinct and below
  // kBwdGemmOrderSlots; each order a kernel takes has one.
  std::set<int> slots;
  for (int o : {0, 4, 12, 20, 28, 36, 44, 16, 32}) {
    const int slot = sm90::bwd_gemm_order_slot(o);
    EXPECT_LT(slot, sm90::kBwdGemmOrderSlots);
    EXPECT_EQ(sm90::kBwdGemmOrders[slot], o);
    slots.insert(slot);
  }
  EXPECT_EQ(slots.size(), 9u);
  // The per-order launch counts (the GPU tests' evidence of which kernel ran): one count per kernel order.
  const int64_t n44 = sm90::bwd_order_launches(44), n32 = sm90::bwd_order_launches(32);
  sm90::count_bwd_order_launch(44);
  EXPECT_EQ(sm90::bwd_order_launches(44), n44 + 1);
  EXPECT_EQ(sm90::bwd_order_launches(32), n32);
  for (int o : {0, 4, 12, 16, 20, 28, 32, 36, 44}) {
    EXPECT_EQ(sm90::kBwdGemmOrders[sm90::bwd_gemm_order_slot(sm90::bwd_gemm_order_128(o))], sm90::bwd_gemm_order_128(o));
    EXPECT_EQ(sm90::kBwdGemmOrders[sm90::bwd_gemm_order_slot(sm90::bwd_gemm_order_wide64(o))], sm90::bwd_gemm_order_wide64(o));
  }
  EXPECT_EQ(sm90::bwd_gemm_order_wide64(0), 0);
  EXPECT_EQ(sm90::bwd_gemm_order_wide64(4), 0);
  EXPECT_EQ(sm90::bwd_gemm_order_128(0), 0);
  var.set("0");
  for (const auto& [set, order] :
       std::vector<std::pair<int, int>>{{0, 0}, {4, 4}, {2, 4}, {3, 4}, {1, 4}, {8, 4}, {12, 12}, {16, 16}, {20, 20}, {28, 28},
                                        {32, 32}, {36, 36}, {44, 44}, {48, 4}}) {
    sm90::set_bwd_gemm_order(set);
    EXPECT_EQ(sm90::bwd_gemm_order(), order) << "set_bwd_gemm_order(" << set << ")";
  }
  sm90::set_bwd_gemm_order(-1);
  EXPECT_EQ(sm90::bwd_gemm_order(), 0);
}
#endif

TEST(SdpaFamily, DropoutOScaleSwitchReadsTheEnvironment) {
  // The sm80 forward's Philox form (sdpa_dropout_o_scaled_enabled): on unless FLASHSPAN_SDPA_DROPOUT_O_SCALE is "0"
  // (read per call; unset, empty or any other value: on; FLASHSPAN_EXPERIMENTAL ignored); the override wins both
  // ways. The forward's parameters carry it (SdpaDropoutParams::o_scaled) for Philox calls.
  set_sdpa_dropout_o_scaled_enabled(-1);
  ScopedEnv var("FLASHSPAN_SDPA_DROPOUT_O_SCALE", nullptr);
  ScopedEnv experimental("FLASHSPAN_EXPERIMENTAL", nullptr);
  EXPECT_TRUE(sdpa_dropout_o_scaled_enabled());
  var.set("0");
  EXPECT_FALSE(sdpa_dropout_o_scaled_enabled());
  experimental.set("1");
  EXPECT_FALSE(sdpa_dropout_o_scaled_enabled());
  for (const char* v : {"1", "", "yes"}) {
    var.set(v);
    EXPECT_TRUE(sdpa_dropout_o_scaled_enabled()) << "FLASHSPAN_SDPA_DROPOUT_O_SCALE=\"" << v << '"';
  }
  experimental.set(nullptr);
  set_sdpa_dropout_o_scaled_enabled(0);
  EXPECT_FALSE(sdpa_dropout_o_scaled_enabled());
  var.set("0");
  set_sdpa_dropout_o_scaled_enabled(1);
  EXPECT_TRUE(sdpa_dropout_o_scaled_enabled());
  var.set(nullptr);
  const Call c = philox_call();
  for (int on : {0, 1}) {
    set_sdpa_dropout_o_scaled_enabled(on);
    const SdpaFwdParams fp = sdpa_fwd_params(Call(c).problem());
    EXPECT_EQ(fp.analytic.dropout.mode, 1);
    EXPECT_EQ(fp.analytic.dropout.o_scaled, on);
  }
  set_sdpa_dropout_o_scaled_enabled(-1);
  EXPECT_TRUE(sdpa_dropout_o_scaled_enabled());
}

TEST(SdpaFamily, Sm90DropoutWorkspace) {
  // A dropout backward the sm90 kernels take gets the sm90 layout (the dQ tiles; no workspace of its
  // own: the keep mask is regenerated), the same bytes as the call without dropout; refused, the sm80
  // layout.
  for (bool det : {false, true}) {
    const Call plain;
    const size_t sm90_bytes = sdpa_bwd_workspace_size(backward_problem(plain, det));
    for (const Call& c : {philox_call(), mask_call(true)}) {
      Call same_lengths = plain;  // mask_call has padding lengths: compare with the same lengths
      if (c.a.padding_mask) {
        same_lengths.a.tensors[FS_SDPA_SEQ_LEN_Q] = vec(2, DType::kInt32);
        same_lengths.a.tensors[FS_SDPA_SEQ_LEN_KV] = vec(2, DType::kInt32);
        same_lengths.a.padding_mask = true;
      }
      {
        const DropoutSwitch on(1);
        const BwdModsSwitch mods(1);
        ASSERT_EQ(sdpa_bwd_sm90_refusal(backward_problem(c, det)), nullptr);
        EXPECT_EQ(sdpa_bwd_workspace_size(backward_problem(c, det)),
                  sdpa_bwd_workspace_size(backward_problem(same_lengths, det)))
            << "deterministic " << det;
        EXPECT_EQ(sdpa_bwd_workspace_size(backward_problem(same_lengths, det)), sm90_bytes);
      }
      const DropoutSwitch off(0);
      EXPECT_NE(sdpa_bwd_sm90_refusal(backward_problem(c, det)), nullptr);
      EXPECT_LT(sdpa_bwd_workspace_size(backward_problem(c, det)), sm90_bytes) << "the sm80 layout, deterministic " << det;
    }
  }
}

// The decode forward (sdpa_decode_refusal, sdpa_fwd_runs_decode; kernel_decode_sm80.cuh): calls with
// S_q H_q / H_k <= 16 and nothing per head inside the main loop; the switch; its workspace.
struct DecodeSwitch {
  explicit DecodeSwitch(int on) { set_sdpa_decode_enabled(on); }
  ~DecodeSwitch() { set_sdpa_decode_enabled(-1); }
};

Call decode_call(int64_t sq = 1, int64_t hq = 8, int64_t hk = 2) {
  Call c;
  c.sq = sq;
  c.hq = hq;
  c.hk = c.hv = hk;
  c.skv = 4096;
  return c;
}

std::string decode_refusal(Call c) {
  const char* r = sdpa_decode_refusal(c.problem());
  return r == nullptr ? "" : r;
}

TEST(SdpaFamily, DecodeTakesFewRowsPerKvHead) {
  const DecodeSwitch on(1);
  for (const auto& [sq, hq, hk] : {std::tuple<int64_t, int64_t, int64_t>{1, 8, 2}, {4, 8, 2}, {1, 16, 1}, {16, 4, 4},
                                   {2, 64, 8}, {1, 4, 4}}) {
    EXPECT_EQ(decode_refusal(decode_call(sq, hq, hk)), "") << sq << " " << hq << " " << hk;
    EXPECT_TRUE(sdpa_fwd_runs_decode(decode_call(sq, hq, hk).problem()));
  }
  EXPECT_EQ(decode_refusal(decode_call(5, 8, 2)), "S_q H_q / H_k above 16 (a prefill)");
  EXPECT_EQ(decode_refusal(decode_call(1, 32, 1)), "S_q H_q / H_k above 16 (a prefill)");
  EXPECT_EQ(decode_refusal(Call{}), "S_q H_q / H_k above 16 (a prefill)");
  // What the main loop would need per head is left to the prefill kernels.
  {
    Call c = decode_call();
    c.hv = 1;
    EXPECT_EQ(decode_refusal(c), "H_k != H_v");
  }
  {
    Call c = decode_call();
    c.dqk = 192;
    EXPECT_EQ(decode_refusal(c), "head dims above 128");
  }
  {
    // ALiBi: in the decode forward unless FLASHSPAN_SDPA_DECODE_ALIBI=0 (or the in-process switch).
    Call c = decode_call();
    c.a.alibi = true;
    set_sdpa_decode_alibi_enabled(0);
    EXPECT_EQ(decode_refusal(c), "ALiBi (FLASHSPAN_SDPA_DECODE_ALIBI=0)");
    set_sdpa_decode_alibi_enabled(1);
    EXPECT_EQ(decode_refusal(c), "");
    set_sdpa_decode_alibi_enabled(-1);
    if (std::getenv("FLASHSPAN_SDPA_DECODE_ALIBI") == nullptr) {
      EXPECT_EQ(decode_refusal(c), "") << "on by default";
    }
  }
  {
    Call c = decode_call();
    TensorView b = desc(1, 1, 1, 4096, DType::kFloat32);
    c.a.tensors[FS_SDPA_BIAS] = b;
    EXPECT_EQ(decode_refusal(c), sdpa::slot_name(FS_SDPA_BIAS));
  }
  EXPECT_EQ(decode_refusal(philox_call()), "S_q H_q / H_k above 16 (a prefill)");
  {
    Call c = philox_call();
    c.sq = 1;
    c.skv = 4096;
    EXPECT_EQ(decode_refusal(c), "dropout");
  }
  // Softcap, sinks, the gate and the statistics outputs are taken (head-independent, or the combine's).
  {
    Call c = decode_call();
    c.a.softcap = 30.0f;
    c.a.tensors[FS_SDPA_SINK_TOKEN] = vec(8, DType::kFloat32);
    c.a.tensors[FS_SDPA_GATE] = desc(2, 8, 1, 128);
    EXPECT_EQ(decode_refusal(c), "");
  }
  // The switch, and the CPU.
  {
    const DecodeSwitch off(0);
    EXPECT_FALSE(sdpa_fwd_runs_decode(decode_call().problem()));
    // No decode partials: what the prefill forward keeps (the sm90 forward's maps and item counter on an sm_90 device).
    const sdpa::Problem p = decode_call().problem();
    EXPECT_EQ(sdpa_fwd_workspace_size(p),
              sdpa_fwd_sm90_maps_bytes(p) + sdpa_fwd_sm90_paged_flags_bytes(p) + sdpa_fwd_sm90_counter_bytes(p));
  }
  Call cpu = decode_call();
  sdpa::Problem p = cpu.problem();
  p.device = DeviceType::kCPU;
  EXPECT_FALSE(sdpa_fwd_runs_decode(p));
}

TEST(SdpaFamily, DecodeWorkspaceHoldsEverySlot) {
  // [slots, 16, D_v] + [slots, 2, 16] fp32, slots from kDecodeMaxCtas, each array 256-byte aligned at least.
  const DecodeSwitch on(1);
  for (const auto& [sq, hq, hk, skv] : {std::tuple<int64_t, int64_t, int64_t, int64_t>{1, 8, 2, 4096}, {4, 8, 2, 64},
                                        {1, 64, 8, 32768}, {2, 4, 4, 1}}) {
    Call c = decode_call(sq, hq, hk);
    c.skv = skv;
    const DecodeShape s = decode_shape(2, hk, sq, hq / hk, skv);
    const long long slots = decode_slot_capacity(s);
    EXPECT_GE(slots, s.tasks);
    const size_t need = sizeof(float) * size_t(slots) * size_t(decode_slot_floats(128));
    const size_t got = sdpa_fwd_workspace_size(c.problem());
    EXPECT_GE(got, need) << sq << " " << hq << " " << hk << " " << skv;
    EXPECT_LE(got, need + 1024);
  }
}

TEST(SdpaFamily, DecodeSplitRule) {
  // decode_split: splits x chunk covers the walk with no empty item, at least kDecodeMinChunk blocks an
  // item where the walk has them, no more items than the CTAs allow (one task: one item), monotone in the
  // CTAs (the workspace's kDecodeMaxCtas bound covers every device).
  for (long long tasks : {1LL, 3LL, 64LL, 100LL, 1000LL, 5000LL})
    for (long long kb : {1LL, 2LL, 5LL, 64LL, 513LL, 4096LL}) {
      DecodeSplit prev{0, 0};
      for (long long ctas : {1LL, 100LL, 132LL, 528LL, 792LL, 1024LL}) {
        const DecodeSplit d = decode_split(tasks, kb, ctas);
        SCOPED_TRACE(std::to_string(tasks) + " tasks, " + std::to_string(kb) + " blocks, " + std::to_string(ctas));
        EXPECT_GE(d.splits, 1);
        EXPECT_GE(int64_t(d.splits) * d.chunk, kb);
        EXPECT_LT(int64_t(d.splits - 1) * d.chunk, kb);
        EXPECT_GE(d.chunk, std::min<long long>(kb, kDecodeMinChunk));
        EXPECT_LE(tasks * d.splits, std::max(tasks, ctas));
        EXPECT_GE(d.splits, prev.splits);
        prev = d;
      }
      EXPECT_LE(decode_split(tasks, kb, 792).splits, decode_split(tasks, kb, kDecodeMaxCtas).splits);
    }
}

TEST(SdpaFamily, EnvFlagOffIsTheValueZeroOnly) {
  // The reader of the default-on paths' off switches (family.h): "0" is off; unset, empty or any
  // other value is not; read at each call.
  const char* name = "FLASHSPAN_TEST_ENV_FLAG_OFF";
  ScopedEnv v(name, nullptr);
  EXPECT_FALSE(env_flag_off(name));
  v.set("0");
  EXPECT_TRUE(env_flag_off(name));
  for (const char* other : {"1", "", "00", "0 ", "off", "false"}) {
    v.set(other);
    EXPECT_FALSE(env_flag_off(name)) << '"' << other << '"';
  }
}

TEST(SdpaFamily, Fp8SwitchReadsTheEnvironment) {
  // The sm90 FP8 forward's switch: on unless FLASHSPAN_SM90_SDPA_FP8=0, read per call; the override wins.
  const char* saved = std::getenv("FLASHSPAN_SM90_SDPA_FP8");
  const std::string keep = saved == nullptr ? "" : saved;
  set_sdpa_fp8_sm90_enabled(-1);
  unsetenv("FLASHSPAN_SM90_SDPA_FP8");
  EXPECT_TRUE(sdpa_fp8_sm90_enabled());
  setenv("FLASHSPAN_SM90_SDPA_FP8", "0", 1);
  EXPECT_FALSE(sdpa_fp8_sm90_enabled());
  set_sdpa_fp8_sm90_enabled(1);
  EXPECT_TRUE(sdpa_fp8_sm90_enabled());
  setenv("FLASHSPAN_SM90_SDPA_FP8", "1", 1);
  set_sdpa_fp8_sm90_enabled(0);
  EXPECT_FALSE(sdpa_fp8_sm90_enabled());
  set_sdpa_fp8_sm90_enabled(-1);
  EXPECT_TRUE(sdpa_fp8_sm90_enabled());
  if (saved == nullptr) {
    unsetenv("FLASHSPAN_SM90_SDPA_FP8");
  } else {
    setenv("FLASHSPAN_SM90_SDPA_FP8", keep.c_str(), 1);
  }
}

TEST(SdpaFamily, Sm90Switches) {
  check_sm90_switch(set_sdpa_fwd_sm90_enabled, sdpa_fwd_sm90_enabled, sdpa_fwd_runs_sm90, Call{}.problem());
  check_sm90_switch(set_sdpa_bwd_sm90_enabled, sdpa_bwd_sm90_enabled, sdpa_bwd_runs_sm90, backward_problem(Call{}));
  {
    const BwdModsSwitch on(1);  // with the modifiers' part on, a CPU problem still takes no GPU family
    Call c;
    c.a.softcap = 5.0f;
    check_sm90_switch(set_sdpa_bwd_sm90_enabled, sdpa_bwd_sm90_enabled, sdpa_bwd_runs_sm90, backward_problem(c));
  }
}

TEST(SdpaFamily, Sm90BackwardWorkspaceHoldsItsTiles) {
  // A covered CUDA call's workspace holds the sm90 dQ tiles (64 x kD per (head, sample, query
  // block)) where the sm80 accumulator is, and when deterministic their counters after them; then the
  // cells' item counter in a 256-byte line (not deterministic: with a band, Call's bottom-right one;
  // deterministic: every call; launch_bwd_sm90.cu set_sdpa_bwd_l2_group).
  for (bool det : {false, true}) {
    for (auto [dqk, dv, kd] : {std::tuple<int64_t, int64_t, size_t>{40, 40, 64}, {96, 96, 128}, {192, 128, 192},
                               {256, 256, 256}}) {
      Call c;
      c.dqk = dqk;
      c.dv = dv;
      const sdpa::Problem p = backward_problem(c, det);
      const size_t per = (sizeof(float) * 4 * 2 * 300 + 255) / 256 * 256;  // [H_q, B S_q] fp32
      const size_t tiles = sizeof(float) * 4 * 2 * 5 * 64 * kd;             // ceil(300 / 64) = 5 blocks
      const size_t sem = (sizeof(int32_t) * kDqSemStride * 4 * 2 * 5 + 255) / 256 * 256;
      const size_t acc = det ? 2 * per + (tiles + 255) / 256 * 256 + sem
                             : 2 * per + (std::max(per * size_t(dqk), tiles) + 255) / 256 * 256;
      const size_t want = acc + 256;
      EXPECT_EQ(sdpa_bwd_workspace_size(p), want) << "deterministic " << det << " D " << dqk;
      std::vector<uint8_t> ws(want + 256);
      void* base = reinterpret_cast<void*>((reinterpret_cast<uintptr_t>(ws.data()) + 255) / 256 * 256);
      const SdpaBwdParams b = sdpa_bwd_params_sm90(p, base, want);
      EXPECT_EQ(reinterpret_cast<char*>(b.dq_accum) - static_cast<char*>(base), ptrdiff_t(2 * per));
      EXPECT_EQ(b.dq_sem != nullptr, det);
      if (det) {
        EXPECT_EQ(reinterpret_cast<char*>(b.dq_sem) - static_cast<char*>(base),
                  ptrdiff_t(2 * per + (tiles + 255) / 256 * 256));
      }
      EXPECT_EQ(b.dq_blocked, 1);
      ASSERT_NE(b.analytic.item_counter, nullptr);
      EXPECT_EQ(reinterpret_cast<char*>(b.analytic.item_counter) - static_cast<char*>(base), ptrdiff_t(acc));
    }
  }
}

// A call at D = 96 (the (128, 128) kernel) with a bias broadcast over B and its dBias (fp32), and the
// gate with dgate: the workspace's dS / gated dO parts.
Call bias_gate_call() {
  Call c;
  c.dqk = c.dv = 96;
  TensorView b = desc(1, 4, 300, 500, DType::kFloat32);
  b.strides[0] = 0;
  c.a.tensors[FS_SDPA_BIAS] = b;
  c.grads.emplace_back(FS_SDPA_DBIAS, desc(1, 4, 300, 500, DType::kFloat32));
  c.a.tensors[FS_SDPA_GATE] = desc(2, 4, 300, 96);
  c.grads.emplace_back(FS_SDPA_DGATE, desc(2, 4, 300, 96));
  return c;
}

TEST(SdpaFamily, Sm90BackwardModsWorkspaceHoldsDsAndGatedDo) {
  // A covered call with dBias and the gate (the modifiers' switch on): the sm90 layout (delta, lse2,
  // the dQ tiles and, deterministic, their counters), then dBias's dS workspace [B, H_q, S_q, S_kv
  // rounded up to even] fp32, then the gated dO [H_q, B S_q, D_v] in q's dtype, where the parameters
  // point; without the switch the sm80 layout has the same two after its accumulator.
  const auto al = [](size_t x) { return (x + 255) / 256 * 256; };
  for (bool det : {false, true}) {
    const Call c = bias_gate_call();  // the (128, 128) kernel's tiles
    const size_t per = al(sizeof(float) * 4 * 2 * 300);           // [H_q, B S_q] fp32
    const size_t tiles = sizeof(float) * 4 * 2 * 5 * 64 * 128;     // 64 x 128 per (head, sample, query block)
    const size_t sem = al(sizeof(int32_t) * kDqSemStride * 4 * 2 * 5);
    const size_t ds = al(sizeof(float) * 2 * 4 * 300 * 500);       // S_kv = 500, even
    const size_t gated = al(2 * 4 * 2 * 300 * 96);
    // (the item counter's line after the accumulator, or deterministic after the tiles' counters)
    const size_t head = det ? 2 * per + al(tiles) + sem + 256 : 2 * per + al(std::max(per * 96, tiles)) + 256;
    const BwdModsSwitch on(1);
    const DbiasWorkspaceForm workspace_form;
    const sdpa::Problem p = backward_problem(c, det);
    ASSERT_EQ(sdpa_bwd_sm90_refusal(p), nullptr);
    const size_t want = head + ds + gated;
    EXPECT_EQ(sdpa_bwd_workspace_size(p), want) << "deterministic " << det;
    std::vector<uint8_t> ws(want + 256);
    char* base = reinterpret_cast<char*>((reinterpret_cast<uintptr_t>(ws.data()) + 255) / 256 * 256);
    const SdpaBwdParams bp = sdpa_bwd_params_sm90(p, base, want);
    EXPECT_EQ(reinterpret_cast<char*>(bp.dq_accum) - base, ptrdiff_t(2 * per));
    EXPECT_EQ(reinterpret_cast<char*>(bp.analytic.bias.ds) - base, ptrdiff_t(head));
    EXPECT_EQ(bp.analytic.bias.ds_ld, 500);
    EXPECT_EQ(static_cast<char*>(bp.analytic.epi.do_gated) - base, ptrdiff_t(head + ds));
    EXPECT_EQ(bp.dq_blocked, 1);
    Call plain;  // the same call without dBias and the gate: the sm90 layout alone
    plain.dqk = plain.dv = 96;
    EXPECT_EQ(sdpa_bwd_workspace_size(backward_problem(plain, det)), head);
    // Off: the sm80 layout, dS and the gated dO after it as before.
    const BwdModsSwitch off(0);
    const sdpa::Problem p80 = backward_problem(c, det);
    EXPECT_NE(sdpa_bwd_sm90_refusal(p80), nullptr);
    plain.a.tensors[FS_SDPA_BIAS] = c.a.tensors[FS_SDPA_BIAS];  // refused too (the sm80 layout), without dBias and the gate
    EXPECT_EQ(sdpa_bwd_workspace_size(p80), sdpa_bwd_workspace_size(backward_problem(plain, det)) + ds + gated);
  }
}

// The call of the dBias form tests: B = 2, H_q = 4, S_q = 300, S_kv = 500 (bias_gate_call's heads and dims, without
// the gate), with a float32 bias and dBias of shape (n0, n1, n2, n3).
Call dbias_call(int64_t n0, int64_t n1, int64_t n2, int64_t n3) {
  Call c;
  c.dqk = c.dv = 96;
  c.a.tensors[FS_SDPA_BIAS] = desc(n0, n1, n2, n3, DType::kFloat32);
  c.grads.emplace_back(FS_SDPA_DBIAS, desc(n0, n1, n2, n3, DType::kFloat32));
  return c;
}

TEST(SdpaFamily, DbiasFormSwitchesReadTheEnvironment) {
  // FLASHSPAN_SDPA_DBIAS_ACC (on by default since PERF_LOG v2.67) and FLASHSPAN_SDPA_DBIAS_DIRECT (since v2.68; before,
  // FLASHSPAN_EXPERIMENTAL=1): each switch's rule, and what it changes -- the form of a dBias of one term an element
  // ((2, 4, 300, 500) of DbiasDsFormRules's call) outside deterministic mode, where the sm90 backward runs the call.
  const BwdModsSwitch mods(1);
  const sdpa::Problem p = backward_problem(dbias_call(2, 4, 300, 500), false);
  {
    const ScopedSwitch direct(set_sdpa_dbias_direct_enabled, 0);
    expect_off_switch("FLASHSPAN_SDPA_DBIAS_ACC", set_sdpa_dbias_acc_enabled, sdpa_dbias_acc_enabled,
                      [&](bool on, const std::string& where) {
                        EXPECT_EQ(sdpa_dbias_ds_form_rule(p, true), on ? kDbiasDsAccumulate : kDbiasDsWorkspace)
                            << where;
                      });
  }
  const ScopedSwitch acc(set_sdpa_dbias_acc_enabled, 1);
  expect_off_switch("FLASHSPAN_SDPA_DBIAS_DIRECT", set_sdpa_dbias_direct_enabled, sdpa_dbias_direct_enabled,
                    [&](bool on, const std::string& where) {
                      EXPECT_EQ(sdpa_dbias_ds_form_rule(p, true), on ? kDbiasDsDirect : kDbiasDsAccumulate) << where;
                    });
  // A form an operation's check_support fixed (Problem::dbias_ds_form) wins over the switches where the sm90 backward
  // runs the call; elsewhere (CI's machine) the workspace form.
  sdpa::Problem pinned = p;
  pinned.dbias_ds_form = kDbiasDsDirect;
  const ScopedSwitch direct_off(set_sdpa_dbias_direct_enabled, 0);
  EXPECT_EQ(sdpa_dbias_ds_form(pinned), sdpa_bwd_runs_sm90(p) ? int(kDbiasDsDirect) : int(kDbiasDsWorkspace));
  EXPECT_EQ(sdpa_dbias_ds_form(p), sdpa_bwd_runs_sm90(p) ? int(kDbiasDsAccumulate) : int(kDbiasDsWorkspace));
}

TEST(SdpaFamily, DbiasDsFormRules) {
  // sdpa_dbias_ds_form's rules (dispatch/sdpa_launch.h; sdpa_dbias_ds_form_rule on both answers of whether the sm90
  // backward runs the call) and the workspace each form takes: the direct form for a dBias of one term an element,
  // deterministic or not; else the accumulator outside deterministic mode for a dBias that keeps the keys; else the
  // workspace; and never a form but the workspace where the sm90 backward does not run the call (the sizes: the
  // workspace form's without an sm_90 device, CI's machine; a GPU machine checks the other forms').
  const auto al = [](size_t x) { return (x + 255) / 256 * 256; };
  const BwdModsSwitch mods(1);
  for (bool det : {false, true}) {
    for (int shape = 0; shape < 4; ++shape) {
      for (int acc_on : {0, 1}) {
        for (int direct_on : {0, 1}) {
          const ScopedSwitch acc(set_sdpa_dbias_acc_enabled, acc_on);
          const ScopedSwitch direct(set_sdpa_dbias_direct_enabled, direct_on);
          // dBias (B, H_q, S_q, S_kv) of the call B = 2, H_q = 4, S_q = 300, S_kv = 500: 0 (2, 4, 300, 500) one term,
          // 1 (1, 4, 300, 500), 2 (1, 1, 1, 500), 3 (2, 4, 300, 1) (keys reduced).
          const std::vector<std::vector<int64_t>> dims = {{2, 4, 300, 500}, {1, 4, 300, 500}, {1, 1, 1, 500}, {2, 4, 300, 1}};
          const std::vector<int64_t>& d = dims[size_t(shape)];
          const Call c = dbias_call(d[0], d[1], d[2], d[3]);
          const sdpa::Problem p = backward_problem(c, det);
          // The rule on both answers of sdpa_bwd_runs_sm90 (the sm90 backward runs the call or not).
          const int rule = shape == 0 && direct_on           ? kDbiasDsDirect
                           : shape != 3 && !det && acc_on ? kDbiasDsAccumulate
                                                          : kDbiasDsWorkspace;
          const std::string what = "shape " + std::to_string(shape) + " det " + std::to_string(det) + " acc " +
                                   std::to_string(acc_on) + " direct " + std::to_string(direct_on);
          EXPECT_EQ(sdpa_dbias_ds_form_rule(p, true), rule) << what;
          EXPECT_EQ(sdpa_dbias_ds_form_rule(p, false), kDbiasDsWorkspace) << what;
          const int want = sdpa_bwd_runs_sm90(p) ? rule : int(kDbiasDsWorkspace);
          EXPECT_EQ(sdpa_dbias_ds_form(p), want) << what;
          // The workspace: the dS workspace [B, H_q, S_q, 500] fp32, the accumulator of dBias's shape, or nothing.
          const size_t ws_ds = al(sizeof(float) * 2 * 4 * 300 * 500);
          const size_t acc_bytes = al(sizeof(float) * size_t(d[0] * d[1] * d[2] * d[3]));
          const size_t ds = want == kDbiasDsWorkspace ? ws_ds : want == kDbiasDsAccumulate ? acc_bytes : 0;
          Call none = c;  // the same call without dBias
          none.grads.clear();
          EXPECT_EQ(sdpa_bwd_workspace_size(p), sdpa_bwd_workspace_size(backward_problem(none, det)) + ds) << what;
        }
      }
    }
  }
}

TEST(SdpaFamily, Sm90BackwardHkNeHvItemHeadsShareKAndV) {
  // The sm90 backward's work items of H_k != H_v (kernel_bwd_sm90.cuh AnalyticSourceBwdSm90): item head u
  // covers query heads u g .. u g + g - 1, g = sdpa_bwd_item_group_sm90(H_q / H_k, H_q / H_v). Where the rule
  // takes the heads (sdpa_bwd_heads_run_sm90), every item's query heads share one K head and one V head, and
  // the items of K head hk (V head hv) are hk r .. hk r + r - 1 with r = (H_q / H_k) / g (the sum kernel's
  // ranges), each query head in exactly one item; where it does not, some item would mix heads.
  for (int hq = 1; hq <= 48; ++hq) {
    for (int hk = 1; hk <= hq; ++hk) {
      for (int hv = 1; hv <= hq; ++hv) {
        if (hq % hk != 0 || hq % hv != 0) continue;
        const int gk = hq / hk, gv = hq / hv;
        const int g = sm90::sdpa_bwd_item_group_sm90(gk, gv);
        bool share = hq % g == 0;
        for (int u = 0; share && u < hq / g; ++u) {
          for (int h = u * g; h < (u + 1) * g; ++h) share = share && h / gk == u * g / gk && h / gv == u * g / gv;
        }
        const std::string at = std::to_string(hq) + "," + std::to_string(hk) + "," + std::to_string(hv);
        EXPECT_EQ(share, sm90::sdpa_bwd_heads_run_sm90(gk, gv)) << at;
        if (!share) continue;
        EXPECT_EQ(hq / g, std::max(hk, hv)) << at;
        EXPECT_EQ(sm90::sdpa_bwd_item_heads_sm90(hq, gk, gv), std::max(hk, hv)) << at;  // the grid's item heads
        for (auto [groups, gs] : {std::pair<int, int>{hk, gk}, {hv, gv}}) {
          const int r = gs / g;
          for (int x = 0; x < groups; ++x) {
            for (int u = x * r; u < (x + 1) * r; ++u) EXPECT_EQ(u * g / gs, x) << at;
          }
        }
      }
    }
  }
}

TEST(SdpaFamily, Sm90BackwardHkNeHvWorkspaceHoldsTheSlots) {
  // H_k != H_v on the sm90 backward: after its layout (delta, lse2, the dQ tiles, deterministic their counters)
  // the dK slots, then the dV slots (one [key block, kernel head dim] fp32 slot per work item, max(H_k, H_v)
  // item heads, S_kv = 500 in four 128-key blocks), then dBias's dS and the gated dO, where the parameters
  // point; H_k = H_v has no slots (null).
  const auto al = [](size_t x) { return (x + 255) / 256 * 256; };
  for (bool det : {false, true}) {
    for (int64_t hv : {1, 4}) {
      Call c = bias_gate_call();  // the (128, 128) kernel's tiles and slots
      c.hv = hv;
      const BwdModsSwitch on(1);
      const DbiasWorkspaceForm workspace_form;
      const sdpa::Problem p = backward_problem(c, det);
      ASSERT_EQ(sdpa_bwd_sm90_refusal(p), nullptr) << hv;
      Call same_heads = c;  // H_v = H_k: the layout without slots
      same_heads.hv = 2;
      const size_t no_slots = sdpa_bwd_workspace_size(backward_problem(same_heads, det));
      const size_t item_heads = hv == 1 ? 2 : 4;
      const size_t slot = al(sizeof(float) * 2 * item_heads * 512 * 128);
      const size_t ds = al(sizeof(float) * 2 * 4 * 300 * 500);
      const size_t gated = al(2 * 4 * 2 * 300 * 96);
      const size_t want = no_slots + 2 * slot;
      EXPECT_EQ(sdpa_bwd_workspace_size(p), want) << "deterministic " << det << " H_v " << hv;
      std::vector<uint8_t> ws(want + 256);
      char* base = reinterpret_cast<char*>((reinterpret_cast<uintptr_t>(ws.data()) + 255) / 256 * 256);
      const SdpaBwdParams bp = sdpa_bwd_params_sm90(p, base, want);
      const ptrdiff_t head = ptrdiff_t(no_slots - ds - gated);
      EXPECT_EQ(reinterpret_cast<char*>(bp.split.dk_accum) - base, head);
      EXPECT_EQ(reinterpret_cast<char*>(bp.split.dv_accum) - base, head + ptrdiff_t(slot));
      EXPECT_EQ(reinterpret_cast<char*>(bp.analytic.bias.ds) - base, head + ptrdiff_t(2 * slot));
      EXPECT_EQ(static_cast<char*>(bp.analytic.epi.do_gated) - base, head + ptrdiff_t(2 * slot + ds));
      EXPECT_EQ(bp.group_size, 2);
      EXPECT_EQ(bp.analytic.score.group_v, 4 / hv);
      const SdpaBwdParams same = sdpa_bwd_params_sm90(backward_problem(same_heads, det), base, want);
      EXPECT_EQ(same.split.dk_accum, nullptr);
      EXPECT_EQ(same.split.dv_accum, nullptr);
    }
  }
  // (192, 128): slots for the larger of its key blocks (64, or the wide tile's 96): S_kv = 500 in 6 x 96 = 576 rows.
  Call c;
  c.hv = 1;
  c.dqk = 192;
  Call same_heads = c;
  same_heads.hv = 2;
  const size_t no_slots = sdpa_bwd_workspace_size(backward_problem(same_heads, false));
  EXPECT_EQ(sdpa_bwd_workspace_size(backward_problem(c, false)),
            no_slots + al(sizeof(float) * 2 * 2 * 576 * 192) + al(sizeof(float) * 2 * 2 * 576 * 128));
}

}  // namespace
}  // namespace flashspan::test
