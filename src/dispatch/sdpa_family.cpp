// Which kernel family runs an SDPA forward or backward on the GPU (sdpa_launch.h): the one rule. Host code
// only (no CUDA call but the device query, behind FLASHSPAN_WITH_CUDA), so CPU tests check it.
#include <atomic>

#include "dispatch/family.h"
#include "dispatch/sdpa_launch.h"
#include "kernels/sm80/tile_sm80.h"
#include "kernels/sm90/tile_sm90.h"
#ifdef FLASHSPAN_WITH_CUDA
#include "kernels/sm90/launch_sm90.h"  // sm90::device_supported
#endif

namespace flashspan {

namespace {
// A switch of this file's rules: the in-process override its set_*() stores (tests: 1 on, 0 off, -1 back to
// the environment's answer), else the environment's answer (from_env, read per call).
struct Switch {
  bool (*from_env)();
  std::atomic<int> override{-1};

  void set(int on) { override.store(on < 0 ? -1 : (on ? 1 : 0), std::memory_order_relaxed); }
  bool on() const {
    const int o = override.load(std::memory_order_relaxed);
    return o >= 0 ? o == 1 : from_env();
  }
};

bool sm90_family_from_env() { return kernel_family_from_env() == 90; }

// The device half of every sm90 rule below: an sm_90 device with this build's sm_90a code (CUDA builds).
bool on_sm90_device(const sdpa::Problem& p) {
#ifdef FLASHSPAN_WITH_CUDA
  return sm90::device_supported(p.device_id);
#else
  (void)p;
  return false;
#endif
}

// On by default where they cover a call (FLASHSPAN_KERNEL_FAMILY=sm80, read per call, keeps the sm80
// kernels), since the GPU suite passed with them and they are at least as fast as the flex route's
// (PERF_LOG v2.10). The forward's kernel with score modifiers too, since its GPU tests passed and it
// ran 1.3-1.8x the sm80 forward (PERF_LOG v2.13); FLASHSPAN_SM90_SDPA_MODS=0 (read per call) keeps
// those calls on the sm80 kernels. The backward's kernels with score modifiers too, since their GPU
// tests passed, memcheck was clean and they ran 1.6-1.9x the sm80 backward (PERF_LOG v2.15);
// FLASHSPAN_SM90_SDPA_BWD_MODS=0 (read per call) keeps those backward calls on the sm80 kernels.
Switch g_sdpa_fwd_sm90{sm90_family_from_env};
Switch g_sdpa_bwd_sm90{sm90_family_from_env};
Switch g_sdpa_fwd_sm90_mods{[] { return !env_flag_off("FLASHSPAN_SM90_SDPA_MODS"); }};
Switch g_sdpa_bwd_sm90_mods{[] { return !env_flag_off("FLASHSPAN_SM90_SDPA_BWD_MODS"); }};
// The sm90 FP8 forward too, since its GPU tests passed in two sessions (launcher, C++ API and Python levels,
// memcheck / racecheck / synccheck clean) and it runs 1.1-1.35x the bf16 forward (PERF_LOG v2.17, v2.20);
// FLASHSPAN_SM90_SDPA_FP8=0 (read per call) turns it off, and CUDA FP8 calls are then refused.
Switch g_sdpa_fp8_sm90{[] { return !env_flag_off("FLASHSPAN_SM90_SDPA_FP8"); }};
// Dropout on those kernels with modifiers too, since its GPU tests passed on an H200 in two sessions
// (memcheck / synccheck clean) and it ran 1.2x (forward) / 1.8x (backward) the sm80 kernels (PERF_LOG
// v2.22-v2.23); FLASHSPAN_SM90_SDPA_DROPOUT=0 (read per call) keeps dropout on the sm80 kernels.
Switch g_sdpa_sm90_dropout{[] { return !env_flag_off("FLASHSPAN_SM90_SDPA_DROPOUT"); }};
// Philox dropout's form in the sm80 forward (sdpa_launch.h sdpa_dropout_o_scaled_enabled): on by default.
Switch g_sdpa_dropout_o_scaled{[] { return !env_flag_off("FLASHSPAN_SDPA_DROPOUT_O_SCALE"); }};
// The decode forward (kernel_decode_sm80.cuh) for the calls sdpa_decode_refusal lets through, on every
// GPU; FLASHSPAN_SDPA_DECODE=0 (read per call) keeps those on the prefill kernels.
Switch g_sdpa_decode{[] { return !env_flag_off("FLASHSPAN_SDPA_DECODE"); }};
// ALiBi in the decode forward (each packed row's head's slope) too, since its GPU tests passed on an H200
// (SdpaGpu.DecodeAlibiRandom, memcheck of DecodeSanitizerSmall) and it runs as fast as the decode
// forward without it (PERF_LOG v2.27); FLASHSPAN_SDPA_DECODE_ALIBI=0 (read per call) sends those calls to
// the prefill kernels.
Switch g_sdpa_decode_alibi{[] { return !env_flag_off("FLASHSPAN_SDPA_DECODE_ALIBI"); }};
// The FP8 backward on the sm80 kernels (launch_sdpa_fp8_bwd_sm80), since its GPU tests passed on an H200
// (SdpaFp8Gpu.*Backward* against a float64 loop, memcheck of the small case, test_sdpa_fp8_gpu.py; PERF_LOG
// v2.36); FLASHSPAN_SDPA_FP8_BWD=0 (read by each check_support) refuses CUDA FP8 backward calls again.
Switch g_sdpa_fp8_bwd{[] { return !env_flag_off("FLASHSPAN_SDPA_FP8_BWD"); }};
// The feature pairs (sdpa_support.cpp sdpa_check_features_gpu: the additive bias or dropout with paged K/V,
// max_logit with sinks, score_max / score_sum_exp with a packed O), since their GPU tests passed on an H200
// (memcheck clean; PERF_LOG v2.36); FLASHSPAN_SDPA_FEATURE_PAIRS=0 (read by each check_support) refuses them.
Switch g_sdpa_feature_pairs{[] { return !env_flag_off("FLASHSPAN_SDPA_FEATURE_PAIRS"); }};
// The FP8 forward on the sm80 kernels (launch_sdpa_fp8_fwd_sm80), since its GPU tests passed on an H200
// (SdpaFp8Gpu.Sm80Forward*, memcheck; PERF_LOG v2.36); FLASHSPAN_SDPA_FP8_SM80=0 (read by each check_support)
// leaves FP8 forwards to the sm90 kernel alone.
Switch g_sdpa_fp8_fwd_sm80{[] { return !env_flag_off("FLASHSPAN_SDPA_FP8_SM80"); }};
// The FP8 backward on the sm90 backward kernel (sm90::launch_sdpa_fp8_bwd_sm90), since its GPU tests passed on an
// H200 (SdpaFp8Gpu.Fp8BackwardSm90*, memcheck / racecheck / synccheck clean, test_sdpa_fp8_gpu.py) and it runs
// 2.6-3.0x the sm80 one (PERF_LOG v2.36); FLASHSPAN_SM90_SDPA_FP8_BWD=0 (read by each check_support) leaves FP8
// backwards to the sm80 kernels.
Switch g_sdpa_fp8_bwd_sm90{[] { return !env_flag_off("FLASHSPAN_SM90_SDPA_FP8_BWD"); }};
// dBias together with softcap on the sm90 backward (sdpa_dispatch.cu check_dbias_with_softcap), since its GPU test
// passed on an H100 (SdpaGpu.Sm90BackwardDbiasWithSoftcap, 2026-12-05); FLASHSPAN_SDPA_DBIAS_SOFTCAP=0 (read by each
// check_support and execute) refuses the pair on CUDA tensors again.
Switch g_sdpa_dbias_softcap{[] { return !env_flag_off("FLASHSPAN_SDPA_DBIAS_SOFTCAP"); }};
// dBias together with softcap on the sm80 backward (sdpa_dispatch.cu check_dbias_with_softcap: calls the sm90 backward
// does not take; kernel_bwd_sm80.cuh stores P in the dS workspace and P (dP - D) over it), since its GPU test passed
// on an H200, 2026-12-05 (SdpaGpu.Sm80BackwardDbiasWithSoftcap); the pair's one variable,
// FLASHSPAN_SDPA_DBIAS_SOFTCAP=0 (read by each check_support and execute), refuses it on both backwards again.
Switch g_sdpa_dbias_softcap_sm80{[] { return !env_flag_off("FLASHSPAN_SDPA_DBIAS_SOFTCAP"); }};
// dBias together with softcap and dropout on the sm80 backward: the sm80 kernel of the pair above, whose dS step
// already forms P (m dP - D) with the element's dropout multiplier m; the sm90 backward refuses the triple
// (sm90_refusal: its kernel with dropout forms softcap's factor per element, after which P (dP - D) is gone). On by
// default since its GPU test passed on an H100, 2026-12-06 (SdpaGpu.Sm80BackwardDbiasSoftcapDropout, memcheck;
// PERF_LOG v2.57); FLASHSPAN_SDPA_DBIAS_SOFTCAP_DROPOUT=0 (read by each check_support) refuses the triple again.
Switch g_sdpa_dbias_softcap_dropout{[] { return !env_flag_off("FLASHSPAN_SDPA_DBIAS_SOFTCAP_DROPOUT"); }};
// H_k != H_v in FP8 calls (fp8_fwd_refusal: both forwards; sdpa_fp8_bwd_refusal: both FP8 backwards), since its GPU
// tests passed on an H100 (SdpaFp8Gpu.Sm90ForwardHkNeHv, Sm80ForwardHkNeHv, Fp8BackwardHkNeHv; 2026-12-05);
// FLASHSPAN_SDPA_FP8_HK_NE_HV=0 (read by each check_support) refuses H_k != H_v in CUDA FP8 calls again.
Switch g_sdpa_fp8_hk_ne_hv{[] { return !env_flag_off("FLASHSPAN_SDPA_FP8_HK_NE_HV"); }};
// attn_scale as a device tensor in FP8 calls (check_fp8, sdpa_support.cpp), since its GPU test passed on an H100
// (SdpaFp8Gpu.DeviceAttnScale: both FP8 forwards and both FP8 backwards; 2026-12-05);
// FLASHSPAN_SDPA_FP8_DEVICE_ATTN_SCALE=0 (read by each check_support) refuses a device attn_scale in FP8 calls again.
Switch g_sdpa_fp8_device_attn_scale{[] { return !env_flag_off("FLASHSPAN_SDPA_FP8_DEVICE_ATTN_SCALE"); }};
// Packed (THD) tensors in the sm80 FP8 forward (fp8_fwd_refusal), since its GPU tests passed on an H200, 2026-12-05
// (test_sdpa_fp8_gpu.py::test_gpu_fp8_forward_thd); FLASHSPAN_SDPA_FP8_THD=0 (read by each
// check_support) refuses them on the sm80 FP8 forward again.
Switch g_sdpa_fp8_thd{[] { return !env_flag_off("FLASHSPAN_SDPA_FP8_THD"); }};
// Packed (THD) tensors in the 16-bit sm90 forward and the sm90 backward (sm90_refusal), by default since 2026-12-05
// (their GPU tests passed on an H200: SdpaGpu.Sm90ForwardThdExperimental, Sm90BackwardThdExperimental and their
// sanitizer sets); FLASHSPAN_SM90_SDPA_THD=0 (read per call) keeps packed calls on the sm80 kernels.
// FLASHSPAN_EXPERIMENTAL (its switch before) no longer changes it.
Switch g_sdpa_sm90_thd{[] { return !env_flag_off("FLASHSPAN_SM90_SDPA_THD"); }};
// Packed (THD) tensors in the sm90 FP8 forward (sdpa_fp8_fwd_sm90_refusal): its own switch, apart from the 16-bit
// one's (FLASHSPAN_SM90_SDPA_THD does not change it), by default since 2026-12-05 (its GPU tests passed on an H200:
// SdpaFp8Gpu.Sm90ForwardThdExperimental, Sm90ForwardThdSanitizerSmall under memcheck and synccheck,
// test_sdpa_fp8_gpu.py's THD test); FLASHSPAN_SM90_SDPA_FP8_THD=0 (read per call) leaves packed FP8 forwards to the
// sm80 FP8 forward.
Switch g_sdpa_fp8_sm90_thd{[] { return !env_flag_off("FLASHSPAN_SM90_SDPA_FP8_THD"); }};
// Paged K/V caches on the 16-bit sm90 forward (sdpa_fwd_sm90_paged_refusal; kernel_fwd_sm90.cuh
// sdpa_fwd_paged_kernel_sm90), by default since 2026-12-05 (its GPU tests passed on an H100: SdpaPagedGpu.Sm90Paged*,
// every SdpaPagedGpu test with it on by default, memcheck of Sm90PagedSanitizerSmall / Sm90PagedBadEntryIsNaN;
// PERF_LOG v2.46); FLASHSPAN_SM90_SDPA_PAGED=0 (read per call) keeps paged forwards on the sm80 paged kernel.
Switch g_sdpa_sm90_paged{[] { return !env_flag_off("FLASHSPAN_SM90_SDPA_PAGED"); }};
// sdpa_launch.h sdpa_sm90_fused_softcap_enabled: by default since 2026-12-07 (PERF_LOG v2.77: its GPU test passed on
// an H200, the softcap forward 5-7 % faster at D = 128, 4 % at D = 64); FLASHSPAN_SM90_SDPA_FUSED_SOFTCAP=0 (read per
// call) keeps every softcap block on Variant::logits. FLASHSPAN_EXPERIMENTAL (its switch before) no longer changes it.
Switch g_sdpa_sm90_fused_softcap{[] { return !env_flag_off("FLASHSPAN_SM90_SDPA_FUSED_SOFTCAP"); }};
// Packed (THD) q / o / stats / gate on that paged forward (sdpa_fwd_sm90_paged_refusal: q through its per-sample maps,
// o / stats / gate at the samples' starts, K / V through the page tables), by default since 2026-12-06 (PERF_LOG
// v2.55: its GPU tests passed on an H100, SdpaPagedGpu.Sm90PagedThd*, memcheck of Sm90PagedThdSanitizerSmall 0
// errors; benchmarks/sdpa_paged_bench.py --features thd, B=4 H=16 S=8192 bf16: 267-500 TFLOP/s against the sm80 paged
// kernel's 180-312, 1.3-1.9x); FLASHSPAN_SM90_SDPA_PAGED_THD=0 (read per call) keeps those calls on the sm80 paged
// kernel. FLASHSPAN_EXPERIMENTAL (its switch before) no longer changes it.
Switch g_sdpa_sm90_paged_thd{[] { return !env_flag_off("FLASHSPAN_SM90_SDPA_PAGED_THD"); }};
// The additive bias on that paged forward (sdpa_fwd_sm90_paged_refusal; kernel_fwd_sm90.cuh
// sdpa_fwd_paged_bias_kernel_sm90, (128, 128) only: the modifiers' source with the bias, staged by TMA per key block
// as the unpaged kernel's, keys by their position in the sample):
// by default since 2026-12-06 (PERF_LOG v2.55: its GPU tests passed on an H100, SdpaPagedGpu.Sm90PagedBias*, memcheck
// of Sm90PagedBiasSanitizerSmall 0 errors; benchmarks/sdpa_paged_bench.py --features bias, a (1, 1, S, S) bf16 bias,
// B=4 H=16 S=8192: 201-446 TFLOP/s against the sm80 paged kernel's 78-151, 2.2-3.3x);
// FLASHSPAN_SM90_SDPA_PAGED_BIAS=0 (read per call) keeps those calls on the sm80 paged kernel. FLASHSPAN_EXPERIMENTAL
// (its switch before) no longer changes it.
// dBias's accumulator form on the sm90 backward (sdpa_dbias_ds_form; params.h SdpaBiasParams::ds_form), since its
// kernel stores and conversion passed their GPU tests on an H200 (SdpaGpu.DbiasReduceForms, memcheck; dispatch's
// choice with the workspace sized by the form passed on an H200 on 2026-12-06) and ran the dBias backward 2.0-4.8x as
// fast as the workspace form (PERF_LOG v2.67); FLASHSPAN_SDPA_DBIAS_ACC=0 (read by each check_support: an operation
// keeps the form it chose, Problem::dbias_ds_form) keeps the workspace form.
Switch g_sdpa_dbias_acc{[] { return !env_flag_off("FLASHSPAN_SDPA_DBIAS_ACC"); }};
// dBias's direct form on the sm90 backward (sdpa_dbias_ds_form), by default since its GPU tests passed on an H200,
// 2026-12-06 (SdpaGpu.DbiasReduceForms variant 3, memcheck; PERF_LOG v2.68: a (1, 16, 8192, 8192) dBias 11.3 -> 2.7 ms
// against the accumulator); FLASHSPAN_SDPA_DBIAS_DIRECT=0 (read by each check_support, as above) turns it off.
// FLASHSPAN_EXPERIMENTAL (its switch before) no longer changes it.
Switch g_sdpa_dbias_direct{[] { return !env_flag_off("FLASHSPAN_SDPA_DBIAS_DIRECT"); }};
Switch g_sdpa_sm90_paged_bias{[] { return !env_flag_off("FLASHSPAN_SM90_SDPA_PAGED_BIAS"); }};
}  // namespace

namespace {
// sm90_refusal asks the forward's head-dim rule for both directions: tile_sm90.h defines the
// backward's (bwd_runs_head_dims_sm90, the backward launcher's check) as the same rule. Should
// they part, this fails to compile rather than let the refusal and that check disagree.
constexpr bool sdpa_head_dim_rules_agree() {
  for (int dqk = 0; dqk <= 264; dqk += 4) {
    for (int dv = 0; dv <= 264; dv += 4) {
      if (sm90::sdpa_fwd_runs_head_dims_sm90(dqk, dv) != sm90::bwd_runs_head_dims_sm90(dqk, dv)) return false;
    }
  }
  return true;
}
static_assert(sdpa_head_dim_rules_agree(), "sm90 SDPA head dims: the forward's and backward's rules differ");

// The one rule of both directions: what the sm90 SDPA kernels (forward and backward) cover. The
// backward takes the same calls (the forward's tensors but O and the stats as inputs, plus dO,
// dQ, dK, dV; deterministic or not), max_logit being a forward output; H_k != H_v the backward
// takes when one of H_k, H_v is a multiple of the other (its work items' query heads share one K
// head and one V head: tile_sm90.h sdpa_bwd_heads_run_sm90), the forward always. The forward also takes,
// when sdpa_fwd_sm90_mods_enabled() (by default), what its kernel with score modifiers runs
// (sdpa_fwd_kernel_sm90 with AnalyticModSourceSm90): softcap, ALiBi, the additive bias, sinks, the output gate,
// score_max / score_sum_exp; and the block_mask (both forward kernels: its 128 x 128 blocks are
// the forward tile's). The backward also takes, when sdpa_bwd_sm90_mods_enabled() (by default,
// its own switch), softcap, ALiBi, the bias with dBias (its kernel with score modifiers,
// sdpa_bwd_mods_kernel_sm90), sinks with dSink and the gate with dgate (around either kernel); the
// block_mask keeps the sm80 backward. Both directions take dropout (Philox with seed / offset, and
// rng_dump in the forward; or the caller's mask with its scale, scale_inv in the backward) on their dropout
// kernels (the modifiers' with dropout; the backward's Philox calls without modifiers on its Philox-only kernel,
// kernels/sm90/launch_sm90.h sdpa_bwd_dropout_philox_kernel) when sdpa_sm90_dropout_enabled()
// (FLASHSPAN_SM90_SDPA_DROPOUT not 0) and the direction's modifiers are on (head dims up to 128).
// paged: the rule of the paged forward's kernel (sdpa_fwd_sm90_paged_refusal, which refuses what it adds first): the
// page tables and their ragged offsets taken too.
const char* sm90_refusal(const sdpa::Problem& p, bool backward, bool any_thd_switch = false, bool paged = false) {
  using namespace sdpa;
  // The modifier instantiations exist for the (64, 64) / (128, 128) kernels
  // (sdpa_{fwd,bwd}_mods_sm90_d{64,128}.cu).
  const bool mods = (backward ? sdpa_bwd_sm90_mods_enabled() : sdpa_fwd_sm90_mods_enabled()) && p.Dqk <= 128 &&
                    p.Dv <= 128;
  if (p.dtype != DType::kFloat16 && p.dtype != DType::kBFloat16) return "dtype (fp16 / bf16 only)";
  // Head dims: one rule for both directions (sdpa_head_dim_rules_agree).
  if (!sm90::sdpa_fwd_runs_head_dims_sm90(static_cast<int>(p.Dqk), static_cast<int>(p.Dv))) {
    return "head dims (multiples of 8 up to 128, (192, 128) or (256, 256))";
  }
  // The forward loads V of each query head's own V head (kv_addr.cuh v_head). The backward's work item
  // (a key block of the query heads that share one K head and one V head) adds its partial dK and dV
  // into slots that a sum kernel adds up per head (kernel_bwd_sm90.cuh AnalyticSourceBwdSm90): its
  // heads need the larger of the groups H_q / H_k, H_q / H_v a multiple of the smaller; other
  // H_k != H_v keep the sm80 backward (its two dK/dV passes).
  if (backward && p.Hk != p.Hv &&
      !sm90::sdpa_bwd_heads_run_sm90(static_cast<int>(p.Hq / p.Hk), static_cast<int>(p.Hq / p.Hv))) {
    return "H_k != H_v (neither of H_k, H_v a multiple of the other)";
  }
  if (p.paged && !paged) return "paged K/V";
  const bool dropout = p.dropout || p.a.dropout_mask_form;
  if (dropout && !(mods && sdpa_sm90_dropout_enabled())) return "dropout";
  if ((p.a.softcap || p.a.alibi) && !mods) return "score modifiers (softcap, ALiBi)";
  // dBias with softcap and dropout: its kernel with dropout forms softcap's factor per element, after which dBias's
  // P (dP - D) is gone (the sm80 backward runs the triple: sdpa_dbias_softcap_dropout_enabled).
  if (backward && dropout && p.a.softcap && p.has(FS_SDPA_DBIAS)) return "dBias together with softcap and dropout";
  // Packed (THD) tensors through per-sample tensor maps (sample_maps_sm90.h), both directions, unless
  // FLASHSPAN_SM90_SDPA_THD=0 (sdpa_sm90_thd_enabled; the refusal names the variable); the backward's dK / dV
  // epilogue writes one row count for both, so dK and dV both packed or both padded.
  // any_thd_switch: the answer with the switch on, whatever it says (the backward workspace's layout).
  const bool packed_ok = any_thd_switch || sdpa_sm90_thd_enabled();
  for (int s : {FS_SDPA_RAGGED_OFFSET_Q, FS_SDPA_RAGGED_OFFSET_K, FS_SDPA_RAGGED_OFFSET_V, FS_SDPA_RAGGED_OFFSET_O,
                FS_SDPA_RAGGED_OFFSET_STATS, FS_SDPA_RAGGED_OFFSET_DO, FS_SDPA_RAGGED_OFFSET_DQ,
                FS_SDPA_RAGGED_OFFSET_DK, FS_SDPA_RAGGED_OFFSET_DV}) {
    if (p.has(s) && !packed_ok) return "ragged (packed) q, k, v, o, stats or gradients (FLASHSPAN_SM90_SDPA_THD=0)";
  }
  if (backward && p.has(FS_SDPA_RAGGED_OFFSET_DK) != p.has(FS_SDPA_RAGGED_OFFSET_DV)) {
    return "dK and dV one packed, the other padded";
  }
  // A list of what it takes, not of what it refuses: a tensor of a feature added later (bias, sinks,
  // gate, score_max / score_sum_exp, block_mask, dropout, page tables, ...) keeps the sm80 kernels
  // until it is added here.
  for (int s = 0; s < kNumSlots; ++s) {
    switch (s) {
      case FS_SDPA_Q: case FS_SDPA_K: case FS_SDPA_V: case FS_SDPA_O: case FS_SDPA_STATS: case FS_SDPA_ATTN_SCALE:
      case FS_SDPA_SEQ_LEN_Q: case FS_SDPA_SEQ_LEN_KV: case FS_SDPA_CU_SEQ_LEN_Q: case FS_SDPA_CU_SEQ_LEN_KV:
        continue;
      case FS_SDPA_RAGGED_OFFSET_Q: case FS_SDPA_RAGGED_OFFSET_K: case FS_SDPA_RAGGED_OFFSET_V:
      case FS_SDPA_RAGGED_OFFSET_O: case FS_SDPA_RAGGED_OFFSET_STATS:
        continue;  // (taken above)
      case FS_SDPA_RAGGED_OFFSET_DO: case FS_SDPA_RAGGED_OFFSET_DQ: case FS_SDPA_RAGGED_OFFSET_DK:
      case FS_SDPA_RAGGED_OFFSET_DV:
        if (backward) continue;  // (taken above)
        break;
      case FS_SDPA_RAGGED_OFFSET_GATE:  // a packed gate (and dgate): read / written at their samples' starts
        if (mods && packed_ok) continue;
        break;
      case FS_SDPA_RAGGED_OFFSET_DGATE:
        if (mods && packed_ok && backward) continue;
        break;
      case FS_SDPA_MAX_LOGIT:
        if (!backward) continue;
        break;
      case FS_SDPA_BIAS: case FS_SDPA_SINK_TOKEN: case FS_SDPA_GATE:
        if (mods) continue;
        break;
      case FS_SDPA_SCORE_MAX: case FS_SDPA_SCORE_SUM_EXP: case FS_SDPA_BLOCK_MASK:
        if (mods && !backward) continue;
        break;
      case FS_SDPA_DBIAS: case FS_SDPA_DSINK_TOKEN: case FS_SDPA_DGATE:
        if (mods && backward) continue;
        break;
      case FS_SDPA_DO: case FS_SDPA_DQ: case FS_SDPA_DK: case FS_SDPA_DV:
        if (backward) continue;
        break;
      case FS_SDPA_DROPOUT_SEED: case FS_SDPA_DROPOUT_OFFSET: case FS_SDPA_DROPOUT_MASK: case FS_SDPA_DROPOUT_SCALE:
      case FS_SDPA_DROPOUT_SCALE_INV:
        if (dropout) continue;  // (taken above)
        break;
      case FS_SDPA_RNG_DUMP:
        if (dropout && !backward) continue;
        break;
      case FS_SDPA_PAGE_TABLE_K: case FS_SDPA_PAGE_TABLE_V: case FS_SDPA_RAGGED_OFFSET_PAGE_TABLE_K:
      case FS_SDPA_RAGGED_OFFSET_PAGE_TABLE_V:
        if (paged) continue;
        break;
      default:
        break;
    }
    if (p.has(s)) return slot_name(s);
  }
  return nullptr;
}
}  // namespace

const char* sdpa_fwd_sm90_refusal(const sdpa::Problem& p) { return sm90_refusal(p, false); }
const char* sdpa_bwd_sm90_refusal(const sdpa::Problem& p) { return sm90_refusal(p, true); }
const char* sdpa_bwd_sm90_layout_refusal(const sdpa::Problem& p) { return sm90_refusal(p, true, true); }

// The paged forward on the sm90 kernel (sdpa_fwd_paged_kernel_sm90: the modifiers' source without the bias, (64, 64)
// and (128, 128), K / V boxes from the page tables; with a bias sdpa_fwd_paged_bias_kernel_sm90, (128, 128), every
// head dim up to 128): what sm90_refusal takes of a paged forward, less what the
// kernel leaves to the sm80 paged kernel (which runs every paged call): head dims above 128, the bias unless
// sdpa_sm90_paged_bias_enabled (on by default; then as sm90_refusal takes it: the modifiers' switch), dropout,
// ragged offsets of k or v (a paged side's container has none to honour; a packed contiguous side would need a
// per-sample map of its own in the producer's page loads, load_paged_block), pages of fewer than 8 keys (a box of
// whole 128B swizzle atoms), an empty container (its map's page extent). Packed (THD) q / o / stats / gate it takes
// with sdpa_sm90_paged_thd_enabled (on by default: q through its per-sample maps, the unpaged kernel's producer path;
// o / stats / gate at the samples' starts, its epilogue's), and then as sm90_refusal takes them (the THD switch,
// FLASHSPAN_SM90_SDPA_THD; a packed gate with the modifiers' switch).
const char* sdpa_fwd_sm90_paged_refusal(const sdpa::Problem& p) {
  using namespace sdpa;
  if (!p.paged) return "K and V not paged";
  if (p.fp8 || p.a.backward) return "an FP8 call or a backward";
  if (p.Dqk > 128 || p.Dv > 128) return "head dims above 128";
  if (p.has(FS_SDPA_BIAS) && !sdpa_sm90_paged_bias_enabled()) {
    return "bias (with paged K/V: the sm80 paged kernel, FLASHSPAN_SM90_SDPA_PAGED_BIAS=0)";
  }
  if (p.dropout || p.a.dropout_mask_form) return "dropout (with paged K/V: the sm80 paged kernel)";
  if (p.has(FS_SDPA_RAGGED_OFFSET_K) || p.has(FS_SDPA_RAGGED_OFFSET_V)) {
    return "ragged (packed) k or v (with paged K/V: the sm80 paged kernel)";
  }
  if (!sdpa_sm90_paged_thd_enabled()) {
    for (int s : {FS_SDPA_RAGGED_OFFSET_Q, FS_SDPA_RAGGED_OFFSET_O, FS_SDPA_RAGGED_OFFSET_STATS,
                  FS_SDPA_RAGGED_OFFSET_GATE}) {
      if (p.has(s)) {
        return "ragged (packed) q, o, stats or gate (with paged K/V: the sm80 paged kernel, "
               "FLASHSPAN_SM90_SDPA_PAGED_THD=0)";
      }
    }
  }
  for (int side = 0; side < 2; ++side) {
    if (!p.has(side == 0 ? FS_SDPA_PAGE_TABLE_K : FS_SDPA_PAGE_TABLE_V)) continue;
    if ((side == 0 ? p.page_size_k : p.page_size_v) < 8) return "a page of fewer than 8 keys";
    if (p.t(side == 0 ? FS_SDPA_K : FS_SDPA_V).size(0) < 1) return "a page container without pages";
  }
  return sm90_refusal(p, false, false, /*paged=*/true);
}

void set_sdpa_sm90_paged_enabled(int on) { g_sdpa_sm90_paged.set(on); }
bool sdpa_sm90_paged_enabled() { return g_sdpa_sm90_paged.on(); }

void set_sdpa_sm90_fused_softcap_enabled(int on) { g_sdpa_sm90_fused_softcap.set(on); }
bool sdpa_sm90_fused_softcap_enabled() { return g_sdpa_sm90_fused_softcap.on(); }

void set_sdpa_sm90_paged_thd_enabled(int on) { g_sdpa_sm90_paged_thd.set(on); }
bool sdpa_sm90_paged_thd_enabled() { return g_sdpa_sm90_paged_thd.on(); }

void set_sdpa_sm90_paged_bias_enabled(int on) { g_sdpa_sm90_paged_bias.set(on); }
bool sdpa_sm90_paged_bias_enabled() { return g_sdpa_sm90_paged_bias.on(); }

bool sdpa_fwd_runs_sm90_paged(const sdpa::Problem& p) {
  if (p.device != DeviceType::kCUDA || !sdpa_fwd_sm90_enabled() || !sdpa_sm90_paged_enabled() ||
      sdpa_fwd_sm90_paged_refusal(p) != nullptr) {
    return false;
  }
  return on_sm90_device(p);
}

bool sdpa_fwd_sm90_may_take_paged(const sdpa::Problem& p) {
  return p.device == DeviceType::kCUDA && p.paged && !p.fp8 && !p.a.backward && on_sm90_device(p);
}

bool sdpa_fwd_sm90_may_take(const sdpa::Problem& p) {
  return p.device == DeviceType::kCUDA && !p.fp8 && !p.a.backward && on_sm90_device(p);
}

void set_sdpa_fwd_sm90_enabled(int on) { g_sdpa_fwd_sm90.set(on); }
bool sdpa_fwd_sm90_enabled() { return g_sdpa_fwd_sm90.on(); }

void set_sdpa_bwd_sm90_enabled(int on) { g_sdpa_bwd_sm90.set(on); }
bool sdpa_bwd_sm90_enabled() { return g_sdpa_bwd_sm90.on(); }

void set_sdpa_fwd_sm90_mods_enabled(int on) { g_sdpa_fwd_sm90_mods.set(on); }
bool sdpa_fwd_sm90_mods_enabled() { return g_sdpa_fwd_sm90_mods.on(); }

void set_sdpa_bwd_sm90_mods_enabled(int on) { g_sdpa_bwd_sm90_mods.set(on); }
bool sdpa_bwd_sm90_mods_enabled() { return g_sdpa_bwd_sm90_mods.on(); }

void set_sdpa_sm90_dropout_enabled(int on) { g_sdpa_sm90_dropout.set(on); }
bool sdpa_sm90_dropout_enabled() { return g_sdpa_sm90_dropout.on(); }
void set_sdpa_dropout_o_scaled_enabled(int on) { g_sdpa_dropout_o_scaled.set(on); }
bool sdpa_dropout_o_scaled_enabled() { return g_sdpa_dropout_o_scaled.on(); }

void set_sdpa_fp8_sm90_enabled(int on) { g_sdpa_fp8_sm90.set(on); }
bool sdpa_fp8_sm90_enabled() { return g_sdpa_fp8_sm90.on(); }

void set_sdpa_fp8_bwd_enabled(int on) { g_sdpa_fp8_bwd.set(on); }
bool sdpa_fp8_bwd_enabled() { return g_sdpa_fp8_bwd.on(); }

void set_sdpa_fp8_bwd_sm90_enabled(int on) { g_sdpa_fp8_bwd_sm90.set(on); }
bool sdpa_fp8_bwd_sm90_enabled() { return g_sdpa_fp8_bwd_sm90.on(); }

void set_sdpa_dbias_softcap_enabled(int on) { g_sdpa_dbias_softcap.set(on); }
void set_sdpa_fp8_hk_ne_hv_enabled(int on) { g_sdpa_fp8_hk_ne_hv.set(on); }
void set_sdpa_fp8_device_attn_scale_enabled(int on) { g_sdpa_fp8_device_attn_scale.set(on); }
void set_sdpa_fp8_thd_enabled(int on) { g_sdpa_fp8_thd.set(on); }
void set_sdpa_sm90_thd_enabled(int on) { g_sdpa_sm90_thd.set(on); }
bool sdpa_sm90_thd_enabled() { return g_sdpa_sm90_thd.on(); }
void set_sdpa_fp8_sm90_thd_enabled(int on) { g_sdpa_fp8_sm90_thd.set(on); }
bool sdpa_fp8_sm90_thd_enabled() { return g_sdpa_fp8_sm90_thd.on(); }
bool sdpa_fp8_thd_enabled() { return g_sdpa_fp8_thd.on(); }
bool sdpa_fp8_device_attn_scale_enabled() { return g_sdpa_fp8_device_attn_scale.on(); }
bool sdpa_fp8_hk_ne_hv_enabled() { return g_sdpa_fp8_hk_ne_hv.on(); }
bool sdpa_dbias_softcap_enabled() { return g_sdpa_dbias_softcap.on(); }
void set_sdpa_dbias_softcap_sm80_enabled(int on) { g_sdpa_dbias_softcap_sm80.set(on); }
bool sdpa_dbias_softcap_sm80_enabled() { return g_sdpa_dbias_softcap_sm80.on(); }
void set_sdpa_dbias_softcap_dropout_enabled(int on) { g_sdpa_dbias_softcap_dropout.set(on); }
bool sdpa_dbias_softcap_dropout_enabled() { return g_sdpa_dbias_softcap_dropout.on(); }

void set_sdpa_feature_pairs_enabled(int on) { g_sdpa_feature_pairs.set(on); }
bool sdpa_feature_pairs_enabled() { return g_sdpa_feature_pairs.on(); }

// Both FP8 directions' refusal of H_k != H_v with its switch off (sdpa_fp8_hk_ne_hv_enabled).
constexpr const char* kFp8HkNeHvOff = "H_k != H_v (FLASHSPAN_SDPA_FP8_HK_NE_HV=0)";

// The FP8 backward's rule (launch_sdpa_fp8_bwd_sm80's checks). The FP8 validation (core/sdpa_problem.cpp)
// has already refused every option outside the seed's sdpa_fp8_backward (a causal mask; no lengths, no
// ragged offsets), so what is left to say is the kernel's own reach: the (64, 64) and (128, 128)-class
// tiles of the sm80 backward (tile_sm80.h) and one K and V head per work item (its fp32 dK / dV sums over
// the query heads of a group; H_k != H_v unless FLASHSPAN_SDPA_FP8_HK_NE_HV=0: a dK pass over the K heads and a dV
// pass over the V heads, as the 16-bit SDPA backward's); deterministic or not (the ordered dQ kernel or the atomic path).
const char* sdpa_fp8_bwd_refusal(const sdpa::Problem& p) {
  if (!p.fp8) return "q (not an FP8 call)";
  if (!p.a.backward) return "the FP8 forward";
  if (p.Dqk % 16 != 0 || p.Dv % 16 != 0 || p.Dqk > 128 || p.Dv > 128) return "head dims (multiples of 16 up to 128)";
  if (p.Hk != p.Hv && !sdpa_fp8_hk_ne_hv_enabled()) return kFp8HkNeHvOff;
  return nullptr;
}

// The sm90 one takes every call the rule above takes (its (64, 64) / (128, 128) kernels cover head dims that are
// multiples of 16 up to 128; H_k != H_v when one of the groups H_q / H_k, H_q / H_v is a multiple of the other,
// the 16-bit sm90 backward's items: tile_sm90.h sdpa_bwd_heads_run_sm90), on an sm_90 device with this build's
// sm_90a code; other H_k != H_v the sm80 one.
bool sdpa_fp8_bwd_runs_sm90(const sdpa::Problem& p) {
  if (p.fp8_bwd_family != 0) return p.fp8_bwd_family == 90;  // the operation's check_support chose
  if (p.device != DeviceType::kCUDA || !p.fp8 || !p.a.backward || !sdpa_fp8_bwd_enabled() ||
      !sdpa_fp8_bwd_sm90_enabled() || sdpa_fp8_bwd_refusal(p) != nullptr ||
      !sm90::sdpa_bwd_heads_run_sm90(static_cast<int>(p.Hq / p.Hk), static_cast<int>(p.Hq / p.Hv))) {
    return false;
  }
  return on_sm90_device(p);
}

// The sm90 FP8 forward's rule (launch_sdpa_fp8_fwd_sm90's checks): a list of what it takes, as
// sm90_refusal's. The FP8 validation (core/sdpa_problem.cpp) has already refused every option
// outside the seed's FP8 subset.
namespace {
// What both FP8 forwards take besides their head dims (dims_ok; `dims`: the refusal's words otherwise) and packed
// (THD) tensors (ragged_ok; `ragged_off`: the refusal's words otherwise: the sm80 one takes them unless
// FLASHSPAN_SDPA_FP8_THD=0, sdpa_fp8_thd_enabled; the sm90 one unless FLASHSPAN_SM90_SDPA_FP8_THD=0,
// sdpa_fp8_sm90_thd_enabled): padded q, k, v, o, the causal and padding
// masks, the statistics outputs; MHA / GQA / MQA, H_k != H_v too (V addressed by h / group_v: the sm90 one's V^T
// workspace has H_v heads, the sm80 one's bf16 copy of V too; unless FLASHSPAN_SDPA_FP8_HK_NE_HV=0:
// sdpa_fp8_hk_ne_hv_enabled).
const char* fp8_fwd_refusal(const sdpa::Problem& p, bool dims_ok, const char* dims, bool ragged_ok,
                            const char* ragged_off) {
  using namespace sdpa;
  if (!p.fp8) return "q (not an FP8 call)";
  if (p.a.backward) return "the FP8 backward";
  if (!dims_ok) return dims;
  if (p.Hk != p.Hv && !sdpa_fp8_hk_ne_hv_enabled()) return kFp8HkNeHvOff;
  for (int s : {FS_SDPA_RAGGED_OFFSET_Q, FS_SDPA_RAGGED_OFFSET_K, FS_SDPA_RAGGED_OFFSET_V, FS_SDPA_RAGGED_OFFSET_O,
                FS_SDPA_RAGGED_OFFSET_STATS}) {
    if (p.has(s) && !ragged_ok) return ragged_off;
  }
  for (int s = 0; s < kNumSlots; ++s) {
    switch (s) {
      case FS_SDPA_Q: case FS_SDPA_K: case FS_SDPA_V: case FS_SDPA_O: case FS_SDPA_STATS: case FS_SDPA_ATTN_SCALE:
      case FS_SDPA_SEQ_LEN_Q: case FS_SDPA_SEQ_LEN_KV: case FS_SDPA_CU_SEQ_LEN_Q: case FS_SDPA_CU_SEQ_LEN_KV:
      case FS_SDPA_RAGGED_OFFSET_Q: case FS_SDPA_RAGGED_OFFSET_K: case FS_SDPA_RAGGED_OFFSET_V:
      case FS_SDPA_RAGGED_OFFSET_O: case FS_SDPA_RAGGED_OFFSET_STATS:
      case FS_SDPA_DESCALE_Q: case FS_SDPA_DESCALE_K: case FS_SDPA_DESCALE_V: case FS_SDPA_DESCALE_S:
      case FS_SDPA_SCALE_S: case FS_SDPA_SCALE_O: case FS_SDPA_AMAX_S: case FS_SDPA_AMAX_O:
      case FS_SDPA_SCORE_MAX: case FS_SDPA_SCORE_SUM_EXP:
        continue;
      default:
        break;
    }
    if (p.has(s)) return slot_name(s);
  }
  return nullptr;
}
}  // namespace

// Packed (THD) q, k, v in the sm90 one (sdpa_fp8_sm90_thd_enabled: its own switch, not the 16-bit sm90 forward's
// sdpa_sm90_thd_enabled, whose per-sample maps it shares): q and k through per-sample TMA maps, whose bases must be
// 16-byte aligned, and v read 16 bytes at a time by the V^T pre-pass, so their ragged multipliers must be multiples of
// 16 (a packed (T, H, D) tensor's row stride H D is: D is); others keep the sm80 one (it reads the codes a byte at a
// time). (The launcher, which cannot see the multiplier, still flags a q / k start that is not aligned on the device
// -- NaN over the sample's O and stats rows -- and reads such a v bytewise.)
const char* sdpa_fp8_fwd_sm90_refusal(const sdpa::Problem& p) {
  const char* r =
      fp8_fwd_refusal(p, sm90::sdpa_fp8_fwd_runs_head_dims_sm90(static_cast<int>(p.Dqk), static_cast<int>(p.Dv)),
                      "head dims (multiples of 16 up to 128)", sdpa_fp8_sm90_thd_enabled(),
                      "ragged (packed THD) q, k, v, o or stats (FLASHSPAN_SM90_SDPA_FP8_THD=0)");
  if (r != nullptr) return r;
  for (int s : {FS_SDPA_Q, FS_SDPA_K, FS_SDPA_V}) {
    if (p.ragged(s) && p.ragged_multiplier(s) % 16 != 0) {
      return "ragged offsets of q, k or v with a multiplier that is not a multiple of 16 (the sm90 FP8 forward's "
             "samples start on 16-byte boundaries)";
    }
  }
  return nullptr;
}

// The FP8 forward on the sm80 kernels (launch_sdpa_fp8_fwd_sm80.cu): the sm90 one's options on the sm80
// forward's head dims (its tiles, tile_sm80.h; the widening pre-pass moves code pairs: every such dim is even).
const char* sdpa_fp8_fwd_sm80_refusal(const sdpa::Problem& p) {
  return fp8_fwd_refusal(p, sm80::runs_head_dims_sm80(static_cast<int>(p.Dqk), static_cast<int>(p.Dv)),
                         "head dims ({8, 16, ..., 128}, (192, 128) or (256, 256))", sdpa_fp8_thd_enabled(),
                         "ragged (packed THD) q, k, v, o or stats (FLASHSPAN_SDPA_FP8_THD=0)");
}

void set_sdpa_fp8_fwd_sm80_enabled(int on) { g_sdpa_fp8_fwd_sm80.set(on); }
bool sdpa_fp8_fwd_sm80_enabled() { return g_sdpa_fp8_fwd_sm80.on(); }

// TMA boxes of the sm90 FP8 forward: q, k, v strides of 16 bytes (= elements); a packed tensor's batch dimension is
// its ragged offsets' (the refusal's multiplier rule).
Fp8StrideFault sdpa_fp8_fwd_sm90_stride_fault(const sdpa::Problem& p) {
  for (int s : {FS_SDPA_Q, FS_SDPA_K, FS_SDPA_V}) {
    const TensorView& t = p.t(s);
    for (int d = p.ragged(s) ? 1 : 0; d + 1 < t.ndim; ++d) {
      if (t.shape[d] > 1 && t.strides[d] % 16 != 0) return Fp8StrideFault{s, d};
    }
  }
  return Fp8StrideFault{};
}

bool sdpa_fp8_fwd_runs_sm90(const sdpa::Problem& p) {
  if (p.fp8_fwd_family != 0) return p.fp8_fwd_family == 90;  // the operation's check_support chose
  if (p.device != DeviceType::kCUDA || !p.fp8 || p.a.backward || !sdpa_fp8_sm90_enabled() ||
      sdpa_fp8_fwd_sm90_refusal(p) != nullptr || sdpa_fp8_fwd_sm90_stride_fault(p).slot >= 0) {
    return false;
  }
  return on_sm90_device(p);
}

bool sdpa_fp8_fwd_runs_sm80(const sdpa::Problem& p) {
  if (p.fp8_fwd_family != 0) return p.fp8_fwd_family == 80;  // the operation's check_support chose
  return p.device == DeviceType::kCUDA && p.fp8 && !p.a.backward && sdpa_fp8_fwd_sm80_enabled() &&
         sdpa_fp8_fwd_sm80_refusal(p) == nullptr && !sdpa_fp8_fwd_runs_sm90(p);
}

// The decode forward's rule (kernel_decode_sm80.cuh): a list of what it takes, as sm90_refusal's. Its
// blocks pack the G = H_q / H_k query heads of a kv head, so the main loop's terms must be the same
// for every head of a block: no ALiBi, bias, dropout or block_mask, and H_v = H_k (V's head is K's);
// softcap is head-independent, and sinks, the gate and the statistics outputs are the combine
// kernel's (per row). Few rows: S_q G <= kDecodeBlockQ (one packed block per kv head, where a prefill
// tile would hold at most 16 valid rows of its 128).
const char* sdpa_decode_refusal(const sdpa::Problem& p) {
  using namespace sdpa;
  if (p.fp8 || p.a.backward) return "an FP8 call or a backward";
  if (p.dtype != DType::kFloat16 && p.dtype != DType::kBFloat16) return "dtype (fp16 / bf16 only)";
  if (p.Dqk > 128 || p.Dv > 128) return "head dims above 128";
  if (p.Hk != p.Hv) return "H_k != H_v";
  if (p.Sq * (p.Hq / p.Hk) > kDecodeBlockQ) return "S_q H_q / H_k above 16 (a prefill)";
  if (p.a.alibi && !sdpa_decode_alibi_enabled()) return "ALiBi (FLASHSPAN_SDPA_DECODE_ALIBI=0)";
  if (p.dropout || p.a.dropout_mask_form) return "dropout";
  for (int s = 0; s < kNumSlots; ++s) {
    switch (s) {
      case FS_SDPA_Q: case FS_SDPA_K: case FS_SDPA_V: case FS_SDPA_O: case FS_SDPA_STATS: case FS_SDPA_ATTN_SCALE:
      case FS_SDPA_SEQ_LEN_Q: case FS_SDPA_SEQ_LEN_KV: case FS_SDPA_CU_SEQ_LEN_Q: case FS_SDPA_CU_SEQ_LEN_KV:
      case FS_SDPA_MAX_LOGIT: case FS_SDPA_SINK_TOKEN: case FS_SDPA_GATE: case FS_SDPA_SCORE_MAX:
      case FS_SDPA_SCORE_SUM_EXP: case FS_SDPA_PAGE_TABLE_K: case FS_SDPA_PAGE_TABLE_V:
      case FS_SDPA_RAGGED_OFFSET_Q: case FS_SDPA_RAGGED_OFFSET_K: case FS_SDPA_RAGGED_OFFSET_V:
      case FS_SDPA_RAGGED_OFFSET_O: case FS_SDPA_RAGGED_OFFSET_STATS: case FS_SDPA_RAGGED_OFFSET_PAGE_TABLE_K:
      case FS_SDPA_RAGGED_OFFSET_PAGE_TABLE_V: case FS_SDPA_RAGGED_OFFSET_GATE:
        continue;
      default:
        break;
    }
    if (p.has(s)) return slot_name(s);
  }
  return nullptr;
}

void set_sdpa_decode_enabled(int on) { g_sdpa_decode.set(on); }
void set_sdpa_decode_alibi_enabled(int on) { g_sdpa_decode_alibi.set(on); }
bool sdpa_decode_alibi_enabled() { return g_sdpa_decode_alibi.on(); }
bool sdpa_decode_enabled() { return g_sdpa_decode.on(); }

bool sdpa_fwd_runs_decode(const sdpa::Problem& p) {
  return p.device == DeviceType::kCUDA && sdpa_decode_enabled() && sdpa_decode_refusal(p) == nullptr;
}

bool sdpa_bwd_runs_sm90(const sdpa::Problem& p) {
  if (p.device != DeviceType::kCUDA || !sdpa_bwd_sm90_enabled() || sdpa_bwd_sm90_refusal(p) != nullptr) return false;
  return on_sm90_device(p);
}

void set_sdpa_dbias_acc_enabled(int on) { g_sdpa_dbias_acc.set(on); }
bool sdpa_dbias_acc_enabled() { return g_sdpa_dbias_acc.on(); }
void set_sdpa_dbias_direct_enabled(int on) { g_sdpa_dbias_direct.set(on); }
bool sdpa_dbias_direct_enabled() { return g_sdpa_dbias_direct.on(); }

int32_t sdpa_dbias_ds_form(const sdpa::Problem& p) {
  if (!p.has(FS_SDPA_DBIAS)) return kDbiasDsWorkspace;
  const bool runs_sm90 = sdpa_bwd_runs_sm90(p);
  // The operation's check_support chose (a call the sm90 backward no longer runs takes the workspace form: its
  // workspace_size says so, and execute then finds its workspace too small).
  if (p.dbias_ds_form >= 0) return runs_sm90 ? p.dbias_ds_form : int32_t(kDbiasDsWorkspace);
  return sdpa_dbias_ds_form_rule(p, runs_sm90);
}

int32_t sdpa_dbias_ds_form_rule(const sdpa::Problem& p, bool runs_sm90) {
  if (!p.has(FS_SDPA_DBIAS) || !runs_sm90) return kDbiasDsWorkspace;
  const TensorView& d = p.t(FS_SDPA_DBIAS);
  // One dS term per dBias element: each dimension kept, or of extent 1 in the problem; keys contiguous (the
  // kernel's stores, kernel_bwd_mods_sm90.cuh store_direct).
  const bool one_term = (d.size(0) == p.B || p.B == 1) && (d.size(1) == p.Hq || p.Hq == 1) &&
                        (d.size(2) == p.Sq || p.Sq == 1) && (d.size(3) == p.Skv || p.Skv == 1) &&
                        (d.size(3) == 1 || d.stride(3) == 1);
  const bool direct = one_term && sdpa_dbias_direct_enabled();
  const bool acc = !p.a.deterministic && d.size(3) == p.Skv && sdpa_dbias_acc_enabled();
  return direct ? kDbiasDsDirect : acc ? kDbiasDsAccumulate : kDbiasDsWorkspace;
}

bool sdpa_fwd_sm90_may_take_packed(const sdpa::Problem& p) {
  // The paged kernel's maps are q's alone (K / V go through the page tables): every paged forward with packed q that
  // it may take (sdpa_fwd_sm90_may_take_paged: whatever the switches say, as its flags).
  if (p.paged) return p.ragged(FS_SDPA_Q) && sdpa_fwd_sm90_may_take_paged(p);
  if (p.device != DeviceType::kCUDA || p.a.backward) return false;
  // The FP8 forward's maps are q's and k's (its V goes through the V^T pre-pass): every FP8 forward with packed q or
  // k that the sm80 FP8 forward does not run (an operation's check_support fixed the family), with no device query,
  // as its V^T workspace is sized.
  if (p.fp8) return (p.ragged(FS_SDPA_Q) || p.ragged(FS_SDPA_K)) && !sdpa_fp8_fwd_runs_sm80(p);
  if (!p.ragged(FS_SDPA_Q) && !p.ragged(FS_SDPA_K) && !p.ragged(FS_SDPA_V)) return false;
  return on_sm90_device(p);
}

bool sdpa_bwd_sm90_may_take_packed(const sdpa::Problem& p) {
  if (p.device != DeviceType::kCUDA || p.fp8 || !p.a.backward) return false;
  if (!p.ragged(FS_SDPA_Q) && !p.ragged(FS_SDPA_K) && !p.ragged(FS_SDPA_V) && !p.ragged(FS_SDPA_DO)) return false;
  return sdpa_bwd_sm90_layout_refusal(p) == nullptr && on_sm90_device(p);
}

bool sdpa_fwd_runs_sm90(const sdpa::Problem& p) {
  if (p.device != DeviceType::kCUDA || !sdpa_fwd_sm90_enabled() || sdpa_fwd_sm90_refusal(p) != nullptr) return false;
  return on_sm90_device(p);
}

}  // namespace flashspan
