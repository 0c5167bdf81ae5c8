// The host rules of SDPA on the GPU (sdpa_launch.h, sdpa_check_features_gpu): which features
// the analytic-mask kernels run, checked on the descriptors alone, so that CPU builds and CPU
// tests see the same messages a GPU call gets.
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>

#include "core/error.h"
#include "dispatch/family.h"
#include "dispatch/sdpa_launch.h"
#include "kernels/sm80/tile_sm80.h"

namespace flashspan {

namespace {

using sdpa::Problem;

// The message of a feature the GPU kernels do not run yet, and why / what to do instead.
[[noreturn]] void not_native(const char* feature, const char* why) {
  throw Error(Status::kNotSupported, detail::concat(feature, ": not supported on CUDA tensors yet (", why,
                                                    "); CPU tensors run it on the CPU reference"));
}

// A feature pair (sdpa_feature_pairs_enabled, sdpa_launch.h): refused only when FLASHSPAN_SDPA_FEATURE_PAIRS=0
// turned the pairs off.
void switched_pair(const char* feature) {
  if (sdpa_feature_pairs_enabled()) return;
  throw Error(Status::kNotSupported,
              detail::concat(feature, ": turned off on CUDA tensors by FLASHSPAN_SDPA_FEATURE_PAIRS=0; CPU tensors "
                                      "run it on the CPU reference"));
}

// 16-bit tensors move 16-byte chunks: a packed tensor's sample must start on 8 elements, which
// the host can only guarantee through the multiplier (the offsets live in device memory).
void check_ragged_multiplier(const Problem& p, int slot) {
  if (!p.has(slot) || !p.ragged(slot)) return;
  const int64_t m = p.ragged_multiplier(slot);
  FS_CHECK_SUPPORTED(m % 8 == 0, sdpa::slot_name(sdpa::ragged_slot_of(slot)), ": the multiplier ", m,
                     " must be a multiple of 8 on CUDA tensors (samples must start on 16-byte boundaries; e.g. token "
                     "offsets with the multiplier H * D, the row stride of a packed (T, H, D) tensor)");
}

// One row limit per forward epilogue: O with its stats, both packed or both padded (the 16-bit and the FP8 forwards).
void check_o_stats_packing(const Problem& p) {
  FS_CHECK_SUPPORTED(!p.has(FS_SDPA_STATS) || p.ragged(FS_SDPA_O) == p.ragged(FS_SDPA_STATS),
                     "o, stats: one is packed (ragged offsets) and the other padded; on CUDA tensors both must be "
                     "packed or both padded");
}

// The kernels' vector rule on a descriptor's strides (check_vec_aligned checks the data
// pointers at execute).
void check_strides(const Problem& p, int slot) {
  if (!p.has(slot)) return;
  const TensorView& t = p.t(slot);
  for (int d = 0; d + 1 < t.ndim; ++d) {
    if (d == 0 && p.ragged(slot)) continue;  // a packed tensor's batch dimension is addressed by its offsets
    FS_CHECK_SUPPORTED(t.shape[d] <= 1 || t.strides[d] % 8 == 0, sdpa::slot_name(slot), ": stride ", t.strides[d],
                       " of dimension ", d, " must be a multiple of 8 elements for the GPU kernels");
  }
}

std::atomic<int> g_paged_override{-1};

// Paged K/V on CUDA tensors: set_sdpa_paged_enabled's override, else on unless FLASHSPAN_SDPA_PAGED=0
// (read at each check).
bool paged_enabled() {
  const int o = g_paged_override.load(std::memory_order_relaxed);
  if (o >= 0) return o == 1;
  return !env_flag_off("FLASHSPAN_SDPA_PAGED");
}

// Paged K/V caches (forward only: the C layer refuses a paged backward, as the seed): the
// gathers of kernel_fwd_sm80.cuh (PagedKv; on by default since PERF_LOG v2.26, after their GPU tests
// passed in three sessions). Page rows are int32 in the kernels (key & (page_size - 1)); page-table
// entries are int32 already.
void check_paged(const Problem& p) {
  FS_CHECK_SUPPORTED(paged_enabled(), "paged_attention_k_table, paged_attention_v_table: paged K/V caches on CUDA "
                     "tensors are turned off by FLASHSPAN_SDPA_PAGED=0: unset it to run them, or "
                     "pass CPU tensors (the CPU reference)");
  for (int side = 0; side < 2; ++side) {
    const int table = side == 0 ? FS_SDPA_PAGE_TABLE_K : FS_SDPA_PAGE_TABLE_V;
    if (!p.has(table)) continue;
    const int64_t page_size = side == 0 ? p.page_size_k : p.page_size_v;
    const TensorView& c = p.t(side == 0 ? FS_SDPA_K : FS_SDPA_V);
    FS_CHECK_SUPPORTED(page_size <= (int64_t(1) << 30) && c.size(0) <= std::numeric_limits<int32_t>::max(),
                       sdpa::slot_name(side == 0 ? FS_SDPA_K : FS_SDPA_V), ": a paged container of ", c.size(0),
                       " pages of ", page_size, " rows: the GPU kernels take at most 2^31 - 1 pages of at most 2^30 "
                       "rows");
  }
}

// Packed (THD) tensors in the FP8 forwards (the sm80 one with sdpa_fp8_thd_enabled, the sm90 one with
// sdpa_fp8_sm90_thd_enabled; their refusals say when they are taken): o and stats both packed or both padded (one row
// limit per epilogue, as the 16-bit forward's), o's samples on 2-byte boundaries (both epilogues store code pairs:
// an even multiplier), and no score_max / score_sum_exp beside a packed o (the 16-bit forward's fill of their padded
// rows is not the FP8 launchers').
void check_fp8_packed(const Problem& p) {
  check_o_stats_packing(p);
  if (p.ragged(FS_SDPA_O)) {
    FS_CHECK_SUPPORTED(p.ragged_multiplier(FS_SDPA_O) % 2 == 0, sdpa::slot_name(sdpa::ragged_slot_of(FS_SDPA_O)),
                       ": the multiplier ", p.ragged_multiplier(FS_SDPA_O), " must be even for an FP8 o on CUDA "
                       "tensors (its samples start on 2-byte boundaries: the epilogue stores code pairs)");
    FS_CHECK_SUPPORTED(!p.has(FS_SDPA_SCORE_MAX) && !p.has(FS_SDPA_SCORE_SUM_EXP),
                       "score_max, score_sum_exp: with a packed FP8 o not supported on CUDA tensors yet (give o "
                       "padded); CPU tensors run it on the CPU reference");
  }
}

// FP8 on CUDA tensors (docs/SDPA.md "FP8 SDPA"): the forward on the sm90 FP8 forward (sdpa_fp8_fwd_sm90_refusal,
// sdpa_family.cpp), on unless FLASHSPAN_SM90_SDPA_FP8=0 (sdpa_fp8_sm90_enabled), whose TMA boxes need q, k, v
// strides of 16 bytes (= elements), or on the sm80 kernels (unless FLASHSPAN_SDPA_FP8_SM80=0) (sdpa_fp8_fwd_sm80_refusal: any
// strides); the backward on the sm80 kernels (sdpa_fp8_bwd_refusal), on unless FLASHSPAN_SDPA_FP8_BWD=0
// (sdpa_fp8_bwd_enabled), whose FP8 tensors are read and written a byte at a time by its pre-pass and
// epilogues, so any strides (the last dim contiguous, the validation's rule) do. The device (sm_90 with this
// build's sm_90a code for the forward, sm_80 or newer for the backward) is sdpa_check_support_gpu's.
void check_fp8(const Problem& p) {
  if (p.a.backward) {
    FS_CHECK_SUPPORTED(sdpa_fp8_bwd_enabled(), "dQ, dK, dV: the FP8 backward on CUDA tensors is turned off "
                       "(FLASHSPAN_SDPA_FP8_BWD=0); CPU tensors run sdpa_fp8_backward on the CPU reference");
    const char* r = sdpa_fp8_bwd_refusal(p);
    FS_CHECK_SUPPORTED(r == nullptr, r, ": not supported by the FP8 backward on CUDA tensors yet (it runs each head "
                       "dim a multiple of 16 up to 128; H_k != H_v unless FLASHSPAN_SDPA_FP8_HK_NE_HV=0); CPU tensors "
                       "run it on the CPU reference");
  } else if (sdpa_fp8_fwd_sm80_enabled()) {
    // The FP8 forward on the sm80 kernels takes a call wherever the sm90 one does not (the
    // device, its head dims, strides or switch): its widening pre-pass reads any strides. What it refuses the
    // sm90 one refuses too (the same options, its head dims a subset), but packed (THD) tensors, each forward's
    // under its own switch (sdpa_fp8_thd_enabled: on unless FLASHSPAN_SDPA_FP8_THD=0; sdpa_fp8_sm90_thd_enabled: on
    // with FLASHSPAN_EXPERIMENTAL=1): a call the sm90 one's rules take passes (sdpa_check_support_gpu: it runs
    // there or is refused).
    const char* r = sdpa_fp8_fwd_sm80_refusal(p);
    const bool sm90_takes = sdpa_fp8_sm90_enabled() && sdpa_fp8_fwd_sm90_refusal(p) == nullptr &&
                            sdpa_fp8_fwd_sm90_stride_fault(p).slot < 0;
    FS_CHECK_SUPPORTED(r == nullptr || sm90_takes, r, ": not supported with FP8 inputs on CUDA tensors yet (the FP8 "
                       "forwards run padded q, k, v, o, the causal and padding masks, GQA / MQA; the sm80 one head "
                       "dims in {8, 16, ..., 128}, (192, 128) or (256, 256)); CPU tensors run it on the CPU reference");
    check_fp8_packed(p);
  } else {
    FS_CHECK_SUPPORTED(sdpa_fp8_sm90_enabled(), "q: FP8 inputs (", dtype_name(p.dtype), ") on CUDA tensors run on the "
                       "sm90 FP8 forward, which FLASHSPAN_SM90_SDPA_FP8=0 turns off: unset it to run them (H100 / H200), "
                       "or pass CPU tensors (the CPU reference runs sdpa_fp8 and sdpa_fp8_backward)");
    const char* r = sdpa_fp8_fwd_sm90_refusal(p);
    FS_CHECK_SUPPORTED(r == nullptr, r, ": not supported with FP8 inputs on CUDA tensors yet (the sm90 FP8 forward runs "
                       "padded or packed q, k, v, o, each head dim a multiple of 16 up to "
                       "128, the causal and padding masks, GQA / MQA; the sm80 FP8 forward, which "
                       "FLASHSPAN_SDPA_FP8_SM80=0 turned off, more head dims); CPU tensors run it on the CPU "
                       "reference");
    check_fp8_packed(p);
    const Fp8StrideFault f = sdpa_fp8_fwd_sm90_stride_fault(p);
    if (f.slot >= 0) {
      throw Error(Status::kNotSupported, detail::concat(sdpa::slot_name(f.slot), ": stride ", p.t(f.slot).strides[f.dim],
                                                        " of dimension ", f.dim, " must be a multiple of 16 elements "
                                                        "for the FP8 kernel (TMA)"));
    }
  }
  // attn_scale as a device tensor: the FP8 kernels read it as one of their factors (kFp8AttnScale /
  // kFp8BwdAttnScale), beside the descales; unless FLASHSPAN_SDPA_FP8_DEVICE_ATTN_SCALE=0
  // (sdpa_fp8_device_attn_scale_enabled).
  FS_CHECK_SUPPORTED(!p.has(FS_SDPA_ATTN_SCALE) || p.t(FS_SDPA_ATTN_SCALE).device == DeviceType::kCPU ||
                         sdpa_fp8_device_attn_scale_enabled(),
                     "attn_scale as a device tensor: turned off in FP8 calls on CUDA tensors by "
                     "FLASHSPAN_SDPA_FP8_DEVICE_ATTN_SCALE=0: pass it as a float or a host tensor, or unset the "
                     "variable");
  constexpr int64_t kMaxRows = std::numeric_limits<int32_t>::max();
  FS_CHECK_SUPPORTED(p.Sq <= kMaxRows && p.Skv <= kMaxRows && p.B <= kMaxRows / std::max<int64_t>(p.Sq, 1),
                     "q, k: B * S_q = ", p.B, " * ", p.Sq, " and S_kv = ", p.Skv,
                     " must stay below 2^31 for the GPU kernels (int32 row indices)");
  if (p.a.backward) return;
  check_strides(p, FS_SDPA_O);
}

}  // namespace

void set_sdpa_paged_enabled(int on) { g_paged_override.store(on < 0 ? -1 : (on ? 1 : 0), std::memory_order_relaxed); }

void sdpa_check_features_gpu(const Problem& p) {
  const sdpa::Attributes& a = p.a;
  // FP8 (docs/SDPA.md "FP8 SDPA"): the forward and backward
  // families of check_fp8 (its own rules below).
  if (p.fp8) {
    check_fp8(p);
    return;
  }
  // The additive bias runs natively (sdpa_score_mod.cuh SdpaBiasFrag), and dBias through the dS
  // workspace (SdpaBiasParams) from the dK/dV kernel's P (dP - D). With softcap the sm80 kernels hold P
  // times softcap's derivative there instead (the fp32 P kept until then cost 72-124 B of spills in their
  // D = 128 loop, PERF_LOG v2.35; the 16-bit P stored for dV is too coarse), so dBias with softcap runs on
  // the sm90 backward, or on the sm80 one through the dS workspace (its fp32 P stored there at the logits step;
  // the device rule: sdpa_dispatch.cu check_dbias_with_softcap), and with dropout on the sm80 backward
  // (sdpa_dbias_softcap_dropout_enabled, by default: the sm90 kernel's softcap factor is formed per element, after
  // which P (dP - D) is gone; sm90_refusal sends the triple to the sm80 one).
  FS_CHECK_SUPPORTED(!p.has(FS_SDPA_DBIAS) || !a.softcap || !(p.dropout || a.dropout_mask_form) ||
                         sdpa_dbias_softcap_dropout_enabled(),
                     "dBias together with softcap and dropout: turned off on CUDA tensors by "
                     "FLASHSPAN_SDPA_DBIAS_SOFTCAP_DROPOUT=0 (unset, the sm80 backward runs it); CPU tensors run it on "
                     "the CPU reference");
  // softcap, ALiBi and sinks (dSink) run natively (sdpa_score_mod.cuh); max_logit excludes the
  // sink, which the kernels' running max includes: with max_logit the prefill kernels fold the sink
  // into the row statistics after the walk instead (the decode kernel's combine always does; sdpa_feature_pairs_enabled).
  if (p.has(FS_SDPA_SINK_TOKEN) && p.has(FS_SDPA_MAX_LOGIT)) switched_pair("max_logit together with sink_token");
  // Dropout runs natively (Philox in the kernels from core/philox.h, or the caller's mask;
  // sdpa_score_mod.cuh sdpa_dropout_apply), and so does rng_dump; float64 masks and dumps do not.
  for (int s : {FS_SDPA_DROPOUT_MASK, FS_SDPA_RNG_DUMP}) {
    if (p.has(s) && p.t(s).dtype == DType::kFloat64) {
      throw Error(Status::kNotSupported,
                  detail::concat(sdpa::slot_name(s), ": float64 is not supported on CUDA tensors (uint8, float16, "
                                                     "bfloat16 or float32)"));
    }
  }
  if (p.paged) {
    // The paged forward kernel (sdpa_fwd_paged_kernel_sm80) compiles the features of the unpaged one
    // (AnalyticMaskSm80); the bias and dropout on it, and its rng_dump, run unless FLASHSPAN_SDPA_FEATURE_PAIRS=0.
    if (p.has(FS_SDPA_BIAS)) switched_pair("bias together with paged K/V caches");
    if (p.dropout || a.dropout_mask_form) switched_pair("dropout together with paged K/V caches");
    check_paged(p);
  }
  // block_mask runs natively (analytic_mask.h: every sm80 tile lies inside one 128 x 128 block).
  // The output gate (forward epilogue, backward preprocess) and the score_max / score_sum_exp
  // outputs run natively (SdpaEpilogueParams). The statistics are never packed: their rows
  // past a sample are written by the blocks of a padded O; with a packed O by a fill kernel of
  // their own (launch_sdpa_fwd_stats_padding; sdpa_feature_pairs_enabled).
  if (p.ragged(FS_SDPA_O)) {
    if (p.has(FS_SDPA_SCORE_MAX)) switched_pair("score_max together with a packed o (ragged offsets)");
    if (p.has(FS_SDPA_SCORE_SUM_EXP)) switched_pair("score_sum_exp together with a packed o (ragged offsets)");
  }
  // A host scalar attn_scale is read at execute (the seed's pass-by-value scale); a device one
  // would need a read of device memory on the host (the 16-bit kernels take the scale as a float; the FP8
  // ones read it from device memory: check_fp8, by default).
  if (p.has(FS_SDPA_ATTN_SCALE) && p.t(FS_SDPA_ATTN_SCALE).device != DeviceType::kCPU) {
    not_native("attn_scale as a device tensor", "the 16-bit kernels take the scale as a float: pass it as a float or "
               "a host tensor; flashspan.sdpa reads a device one on the host");
  }
  FS_CHECK_SUPPORTED(p.dtype == DType::kFloat16 || p.dtype == DType::kBFloat16,
                     "q: the GPU kernels take float16 or bfloat16, got ", dtype_name(p.dtype));
  FS_CHECK_SUPPORTED(sm80::runs_head_dims_sm80(static_cast<int>(p.Dqk), static_cast<int>(p.Dv)),
                     "q, v: head dims (D_qk, D_v) = (", p.Dqk, ", ", p.Dv,
                     ") are not supported on CUDA tensors: the GPU kernels run each in {8, 16, ..., 128}, or (192, "
                     "128), or (256, 256)");
  // Positions and workspace rows are int32 in the kernels.
  constexpr int64_t kMaxRows = std::numeric_limits<int32_t>::max();
  FS_CHECK_SUPPORTED(p.Sq <= kMaxRows && p.Skv <= kMaxRows && p.B <= kMaxRows / std::max<int64_t>(p.Sq, 1),
                     "q, k: B * S_q = ", p.B, " * ", p.Sq, " and S_kv = ", p.Skv,
                     " must stay below 2^31 for the GPU kernels (int32 row indices)");
  for (int s : {FS_SDPA_Q, FS_SDPA_K, FS_SDPA_V, FS_SDPA_O, FS_SDPA_DO, FS_SDPA_DQ, FS_SDPA_DK, FS_SDPA_DV, FS_SDPA_GATE,
                FS_SDPA_DGATE}) {
    check_strides(p, s);
    check_ragged_multiplier(p, s);
  }
  // One row limit per epilogue: O with its stats, dK with dV.
  if (!a.backward) check_o_stats_packing(p);
  if (a.backward) {
    FS_CHECK_SUPPORTED(p.ragged(FS_SDPA_DK) == p.ragged(FS_SDPA_DV),
                       "dK, dV: one is packed (ragged offsets) and the other padded; on CUDA tensors both must be "
                       "packed or both padded");
  }
}

}  // namespace flashspan
