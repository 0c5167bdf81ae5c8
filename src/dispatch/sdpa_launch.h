// Launch interface of SDPA on the GPU, between the C ABI (src/api/sdpa_c_api.cpp) and the
// sm80 kernels with the analytic mask (params.h AnalyticMaskParams): support checks, the
// workspace size and the launches of a validated sdpa::Problem (core/sdpa_problem.h).
// No CUDA headers here; streams are cudaStream_t passed as void*.
//
// What runs natively (the pure-mask configurations): causal top-left / bottom-right, diagonal
// bands and sliding windows, padding (seq_len_q / seq_len_kv or cu_seq_len_q / cu_seq_len_kv,
// read by the kernels from device memory), ragged (packed THD) tensors through ragged offsets,
// MHA / GQA / MQA with H_k = H_v, head dims the sm80 kernels run, float16 / bfloat16, the LSE
// stats (natural or base 2), max_logit, the deterministic backward; softcap, ALiBi, sinks / dSink,
// H_k != H_v; the output gate with dgate, score_max / score_sum_exp (padded O), the block_mask; the
// additive bias (any broadcast form, float32 or q's dtype) and dBias (with softcap too: FLASHSPAN_SDPA_DBIAS_SOFTCAP);
// dropout (Philox from device seed / offset, or the caller's mask) and rng_dump; paged K/V caches in the
// forward (with bias or dropout: a feature pair); FP8 (sdpa_fp8, sdpa_fp8_backward: check_fp8's rules).
// Every other feature is refused by sdpa_check_features_gpu with an error naming it.
#pragma once

#include <cstddef>

#include "core/sdpa_problem.h"
#include "kernels/params.h"

namespace flashspan {

// Host rules only (no CUDA call; CPU-testable): throws Error(kNotSupported) naming the first
// argument or feature of the call the GPU kernels do not run, and the rule.
void sdpa_check_features_gpu(const sdpa::Problem& p);

// Paged K/V caches on CUDA tensors: on unless the environment has FLASHSPAN_SDPA_PAGED=0 (read
// at each check). Tests override it in-process: on = 1 accept, 0 refuse, -1 back to the
// environment.
void set_sdpa_paged_enabled(int on);

// sdpa_check_features_gpu, then the device's rules (compute capability 8.0 or newer, shared
// memory per block): what check_support() runs for CUDA tensors.
void sdpa_check_support_gpu(const sdpa::Problem& p);

// Bytes of workspace of one call (pure functions of the problem's sizes): the 16-bit forward
// needs none but on the decode forward (sdpa_fwd_runs_decode: [slots, 16, D_v] + [slots, 2, 16] fp32,
// slots = tile_sm80.h decode_slot_capacity) and on the sm90 forward of packed q, k or v (their per-sample
// tensor maps: sdpa_fwd_sm90_maps_bytes below), an FP8 forward on CUDA tensors the V^T of the sm90 FP8 forward ([B, H_v, D_v, S_kv
// rounded up to 128] bytes, kernels/sm90/tile_sm90.h fp8_vt_bytes_sm90; then, packed q or k, their per-sample maps,
// sdpa_fwd_sm90_maps_bytes) or the sm80 one's copies; the backward keeps D and LSE log2(e) ([H_q, B * S_q] fp32 each), unless
// deterministic the fp32 dQ accumulator [H_q, B * S_q, D_qk], with dBias the fp32 dS
// [B, H_q, S_q, S_kv rounded up to even] (or its accumulator of dBias's shape, or nothing: the form
// sdpa_dbias_ds_form chooses below), and with the output gate dO * sigmoid(G)
// [H_q, B * S_q, D_v] in the input dtype. A CUDA call the sm90 backward covers
// (sdpa_bwd_sm90_refusal, whichever family then runs it) also holds that kernel's dQ tiles: the
// accumulator is max([H_q, B * S_q, D_qk], H_q B ceil(S_q / 64) 64 kD) floats, deterministic or
// not, and deterministic calls two int32 counters per tile (kDqSemStride: one per half, each on its own line) after it.
// An empty batch (Problem::empty_batch, B = 0) needs 0 bytes either way: launch_sdpa_fwd / launch_sdpa_bwd return
// before any kernel, after the identity fills of sdpa::empty_batch_fills on the stream.
size_t sdpa_fwd_workspace_size(const sdpa::Problem& p);
size_t sdpa_bwd_workspace_size(const sdpa::Problem& p);

// The sm90 forward's per-sample tensor maps of packed (THD) q, k or v (sdpa_sm90_thd_enabled, default on; the FP8 one's
// sdpa_fp8_sm90_thd_enabled, default on; kernels/sm90/sample_maps_sm90.h): their part of the forward's workspace
// (sm90::sample_maps_bytes(B, 3), and 128 bytes more so that the maps start 128-byte aligned in any workspace) for
// every call the sm90 forward may take packed (sdpa_fwd_sm90_may_take_packed: a 16-bit CUDA forward, not paged, with
// packed q, k or v, on an sm_90 device with this build's sm_90a code; a paged one with packed q that the sm90 paged
// forward may take, sdpa_fwd_sm90_may_take_paged: the maps of q alone, before its flags; an FP8 forward with packed q
// or k that the sm80 FP8 forward does not run: the sm90 FP8 forward's maps of q and k, in the same layout, after its
// V^T workspace),
// whatever its switches say, so that an operation sized with them off still runs when they are turned on before its
// execute (and the bytes, ~0.4 KB a sample, are never the difference); 0 bytes for other calls. sdpa_fwd_sm90_maps
// binds it: the 128-byte aligned start and its bytes (checked: the workspace's size), {nullptr, 0} for other calls.
bool sdpa_fwd_sm90_may_take_packed(const sdpa::Problem& p);
size_t sdpa_fwd_sm90_maps_bytes(const sdpa::Problem& p);
struct WorkspaceSlice {
  void* ptr = nullptr;
  size_t bytes = 0;
};
WorkspaceSlice sdpa_fwd_sm90_maps(const sdpa::Problem& p, void* workspace, size_t workspace_bytes);
// The same for the sm90 backward's maps of q, k, v and the main dO (sm90::sample_maps_bytes(B, 4) + 128 bytes):
// every 16-bit CUDA backward with packed q, k, v or dO that the sm90 backward covers with the switch on
// (sdpa_bwd_sm90_layout_refusal) on an sm_90 device; placed in the backward's layout after the H_k != H_v slots
// (sdpa_bwd_layout), bound by sdpa_bwd_sm90_maps.
bool sdpa_bwd_sm90_may_take_packed(const sdpa::Problem& p);
size_t sdpa_bwd_sm90_maps_bytes(const sdpa::Problem& p);
WorkspaceSlice sdpa_bwd_sm90_maps(const sdpa::Problem& p, void* workspace, size_t workspace_bytes);

// The kernels' parameters of a problem whose tensors are bound (host only, sdpa_params.cpp):
// what launch_sdpa_fwd / launch_sdpa_bwd pass to the sm80 launchers. The backward binds its
// workspace (checked: size and 16-byte alignment).
SdpaFwdParams sdpa_fwd_params(const sdpa::Problem& p);
SdpaBwdParams sdpa_bwd_params(const sdpa::Problem& p, void* workspace, size_t workspace_bytes);
// A paged forward's (p.paged): sdpa_fwd_params with each paged side's page table
// (SdpaPagedSide) and its sample starts zeroed (the head base is the container's).
SdpaPagedFwdParams sdpa_paged_fwd_params(const sdpa::Problem& p);

// The kernel family of the forward (sdpa_family.cpp, the one rule): on an sm_90 device with the
// sm_90a code built, the sm90 forward (TMA + wgmma, kernel_fwd_sm90.cuh with the analytic mask)
// runs the calls it covers when sdpa_fwd_sm90_enabled(); every other call runs the sm80 kernels.
// sdpa_fwd_sm90_refusal: nullptr when the sm90 forward covers the call (fp16 / bf16, head dims
// of tile_sm90.h sdpa_fwd_runs_head_dims_sm90, H_k = H_v or not, q / k / v / o / stats padded or dense, no score modifier,
// sink, gate, score_max / score_sum_exp, block_mask, bias, dropout or paged K/V; the switches below let
// some through), else the first
// thing it does not cover. sdpa_fwd_sm90_enabled: FLASHSPAN_KERNEL_FAMILY not sm80 (read per call;
// on by default since PERF_LOG v2.10), unless set_sdpa_fwd_sm90_enabled overrides it (tests: 1 on,
// 0 off, -1 back to the environment's answer).
// With sdpa_fwd_sm90_mods_enabled() the forward's refusal also lets through softcap, ALiBi, the
// additive bias, sinks, the output gate, score_max / score_sum_exp and the block_mask (the sm90
// forward's kernel with score modifiers, sdpa_fwd_kernel_sm90<..., AnalyticModSourceSm90>; the block_mask in both
// kernels): on by default (GPU tests passed, 1.3-1.8x the sm80 forward, PERF_LOG v2.13; before,
// FLASHSPAN_EXPERIMENTAL=1), FLASHSPAN_SM90_SDPA_MODS=0 turns it off (read per call), unless
// set_sdpa_fwd_sm90_mods_enabled overrides it (tests: 1 on, 0 off, -1 back to the environment's
// answer). The backward's refusal has its own switch (below).
const char* sdpa_fwd_sm90_refusal(const sdpa::Problem& p);
bool sdpa_fwd_sm90_enabled();
void set_sdpa_fwd_sm90_enabled(int on);
bool sdpa_fwd_sm90_mods_enabled();
void set_sdpa_fwd_sm90_mods_enabled(int on);
bool sdpa_fwd_runs_sm90(const sdpa::Problem& p);

// The kernel family of the backward, the same rule (sdpa_family.cpp): the sm90 backward
// (kernel_bwd_sm90.cuh with the analytic mask) runs the calls it covers when
// sdpa_bwd_sm90_enabled() on an sm_90 device with the sm_90a code built; the others the sm80
// kernels. sdpa_bwd_sm90_refusal: nullptr when it covers the call (the forward's subset with
// H_k = H_v: fp16 / bf16, the same head dims, every tensor padded or dense, no score
// modifier, sink / dSink, gate, bias / dBias, dropout, block_mask; deterministic or not), else the
// first thing it does not cover. sdpa_bwd_sm90_enabled: as sdpa_fwd_sm90_enabled (the same
// environment: FLASHSPAN_KERNEL_FAMILY not sm80), its own test override.
// With sdpa_bwd_sm90_mods_enabled() the backward's refusal also lets through softcap, ALiBi, the
// additive bias with dBias, sinks with dSink and the output gate with dgate, head dims up to 128
// (kernel_bwd_mods_sm90.cuh sdpa_bwd_mods_kernel_sm90 for the first three; dSink and the gated dO
// around either kernel): on by default (GPU tests passed, memcheck clean, 1.6-1.9x the sm80
// backward, PERF_LOG v2.15; before, FLASHSPAN_EXPERIMENTAL=1), FLASHSPAN_SM90_SDPA_BWD_MODS=0 turns
// it off (read per call), unless set_sdpa_bwd_sm90_mods_enabled overrides it (tests: 1 on, 0 off, -1
// back to the environment's answer). The forward's refusal is not changed by it, nor this one by the
// forward's.
const char* sdpa_bwd_sm90_refusal(const sdpa::Problem& p);
// The backward's refusal with packed (THD) tensors' switch (sdpa_sm90_thd_enabled) taken as on, whatever it says:
// what the backward workspace's layout follows (sdpa_bwd_layout), so that an operation sized with the switch off
// still runs with it on.
const char* sdpa_bwd_sm90_layout_refusal(const sdpa::Problem& p);
// Both refusals also let dropout through (Philox with seed / offset and, in the forward, rng_dump; or
// the caller's mask with its scale) when sdpa_sm90_dropout_enabled() and the direction's modifiers
// switch is on (head dims up to 128): it runs on the kernels with modifiers (a run-time flag of them,
// the keep mask the sm80 kernels' bit for bit). On unless FLASHSPAN_SM90_SDPA_DROPOUT=0 (read per
// call), unless set_sdpa_sm90_dropout_enabled overrides it (tests: 1 on, 0 off, -1 back to the
// environment's answer); off, dropout keeps the sm80 kernels.
bool sdpa_sm90_dropout_enabled();
void set_sdpa_sm90_dropout_enabled(int on);
// Philox dropout's form in the sm80 forward (SdpaDropoutParams::o_scaled; the keep mask the same either way): 1 / (1 -
// p) applied to O once after the walk instead of to each P, as the sm90 forward does. On by default since its GPU
// tests passed and it measured 2.5 % faster (H100, PERF_LOG v2.71); FLASHSPAN_SDPA_DROPOUT_O_SCALE=0 (read per call)
// keeps the multiplier form; set_sdpa_dropout_o_scaled_enabled overrides it (tests: 1 on, 0 off, -1 back to the
// environment's answer).
bool sdpa_dropout_o_scaled_enabled();
void set_sdpa_dropout_o_scaled_enabled(int on);
bool sdpa_bwd_sm90_enabled();
void set_sdpa_bwd_sm90_enabled(int on);
bool sdpa_bwd_sm90_mods_enabled();
void set_sdpa_bwd_sm90_mods_enabled(int on);
bool sdpa_bwd_runs_sm90(const sdpa::Problem& p);
// Where the sm90 backward's kernel puts dBias's dS (params.h SdpaBiasParams::ds_form; bwd_prepost.cuh), for a call
// that runs the sm90 backward (sdpa_bwd_runs_sm90; else, and without dBias, the workspace form):
//   kDbiasDsDirect      each dBias element has one dS term (dBias broadcasts nothing the problem has more than one
//                       of: (B, H_q, S_q, S_kv), or (1, H_q, S_q, S_kv) at B = 1; keys contiguous): stored into
//                       dBias itself, no workspace; deterministic or not; while sdpa_dbias_direct_enabled
//                       (on by default, PERF_LOG v2.68; FLASHSPAN_SDPA_DBIAS_DIRECT=0 turns it off)
//   kDbiasDsAccumulate  else, outside deterministic mode (the sums' order is the GPU's), a dBias that keeps the key
//                       dimension: added (red.global.add) into an fp32 buffer of dBias's shape, which the dBias step
//                       converts; the workspace holds that buffer alone (256 MB for a (1, 1, 8192, 8192) dBias where
//                       the workspace form takes 4.3 GB at H_q = 16); while sdpa_dbias_acc_enabled (on by default,
//                       PERF_LOG v2.67; FLASHSPAN_SDPA_DBIAS_ACC=0 turns it off)
//   kDbiasDsWorkspace   else: stored into the [B, H_q, S_q, S_kv] workspace, summed over the broadcast dimensions
// An operation's check_support fixes the form (Problem::dbias_ds_form; its workspace_size and execute follow it
// whatever the switches say later; a call the sm90 backward no longer runs -- its own switches changed -- takes the
// workspace form, and its execute then finds its workspace too small and says so); before that, the switches' live
// answer (a Problem not made by an operation reads them at each call); set_*_enabled are tests' overrides (1 on,
// 0 off, -1 back to the environment's answer). The direct form writes dBias while the kernel still reads its
// inputs: Problem::bind refuses a dBias whose memory meets the bias's or another input's, in every form.
int32_t sdpa_dbias_ds_form(const sdpa::Problem& p);
// The rule itself, given whether the sm90 backward runs the call (sdpa_dbias_ds_form passes sdpa_bwd_runs_sm90; tests
// pass either answer).
int32_t sdpa_dbias_ds_form_rule(const sdpa::Problem& p, bool runs_sm90);
bool sdpa_dbias_acc_enabled();
void set_sdpa_dbias_acc_enabled(int on);
bool sdpa_dbias_direct_enabled();
void set_sdpa_dbias_direct_enabled(int on);
// sdpa_bwd_params with the sm90 backward's dQ accumulator bound (dq_accum: one 64 x kD fp32 tile
// per (query head, sample, query block), kD = bwd_kernel_dim_sm90; dq_sem: their counters
// when deterministic), both in the workspace, whose size covers them for every call the sm90
// backward covers (sdpa_bwd_workspace_size).
SdpaBwdParams sdpa_bwd_params_sm90(const sdpa::Problem& p, void* workspace, size_t workspace_bytes);

// The sm90 FP8 forward (cuDNN's sdpa_fp8; kernels/sm90/launch_sm90.h launch_sdpa_fp8_fwd_sm90):
// on by default (its GPU tests passed on an H200, PERF_LOG v2.17 / v2.20): FLASHSPAN_SM90_SDPA_FP8=0 (read
// per call) turns it off, unless
// set_sdpa_fp8_sm90_enabled overrides it (tests: 1 on, 0 off, -1 back to the environment's
// answer). It is the only FP8 kernel: FP8 calls on CUDA tensors that it does not take are refused
// (sdpa_check_features_gpu: without the switch, or with sdpa_fp8_fwd_sm90_refusal's answer;
// sdpa_check_support_gpu: off an sm_90 device with this build's sm_90a code).
// sdpa_fp8_fwd_sm90_refusal: nullptr when the kernel covers an FP8 call (a forward; each head dim
// a multiple of 16 up to 128, q / k / v / o / stats padded, or packed with sdpa_fp8_sm90_thd_enabled (q, k, v ragged
// multipliers multiples of 16); score_max / score_sum_exp too; H_k != H_v with
// sdpa_fp8_hk_ne_hv_enabled), else the first thing it does not cover. sdpa_fp8_fwd_params: sdpa_fwd_params
// plus the FP8 factors (device pointers, or a host scale factor's value), the formats, the amax
// outputs and the V^T workspace (checked: size and 16-byte alignment).
bool sdpa_fp8_sm90_enabled();
void set_sdpa_fp8_sm90_enabled(int on);
const char* sdpa_fp8_fwd_sm90_refusal(const sdpa::Problem& p);
SdpaFp8FwdParams sdpa_fp8_fwd_params(const sdpa::Problem& p, void* workspace, size_t workspace_bytes);

// The FP8 backward (cuDNN's sdpa_fp8_backward; kernels/sm80/launch_sm80.h launch_sdpa_fp8_bwd_sm80): the
// 16-bit sm80 backward run on the FP8 inputs' codes widened to bf16 (exact), with the FP8 graph's roundings
// in the kernel (S8 = fp8_q(S scale_s) as dV's operand, dP8 = fp8_dO(dP scale_dP) as dK's and dQ's) and
// the factors, amax outputs and FP8 stores of dQ, dK, dV in its epilogues: every GPU from sm_80, the
// products of an FP8 GEMM at bf16 tensor-core speed. On unless FLASHSPAN_SDPA_FP8_BWD=0 (read by each
// check_support), and set_sdpa_fp8_bwd_enabled overrides both (tests: 1 on, 0 off, -1 back to the
// environment's answer). sdpa_fp8_bwd_refusal: nullptr when it covers an FP8 call
// (a backward; H_k = H_v, or H_k != H_v with sdpa_fp8_hk_ne_hv_enabled; each head dim a multiple of 16 up to 128;
// deterministic or not), else the first
// thing it does not cover. sdpa_fp8_bwd_params: sdpa_bwd_params on the workspace's bf16 copies of
// q, k, v, dO, plus the FP8 part (SdpaFp8BwdParams; the workspace checked: size and alignment).
bool sdpa_fp8_bwd_enabled();
void set_sdpa_fp8_bwd_enabled(int on);
const char* sdpa_fp8_bwd_refusal(const sdpa::Problem& p);
// The FP8 backward on the sm90 backward kernel (kernels/sm90/sdpa_fp8_bwd_sm90.h: the key-split consumers on
// the same bf16 copies, wgmma instead of mma.sync), for the calls sdpa_fp8_bwd_refusal takes, on an sm_90
// device with this build's sm_90a code. On unless FLASHSPAN_SM90_SDPA_FP8_BWD=0 (read by each check_support),
// and set_sdpa_fp8_bwd_sm90_enabled overrides both (tests: 1 on, 0 off, -1 the environment's answer). sdpa_fp8_bwd_runs_sm90: the one rule of which FP8
// backward runs (else the sm80 one); once an operation's check_support has answered, Problem::fp8_bwd_family
// holds the answer and it returns that (workspace and launch follow check_support's choice).
bool sdpa_fp8_bwd_sm90_enabled();
void set_sdpa_fp8_bwd_sm90_enabled(int on);
bool sdpa_fp8_bwd_runs_sm90(const sdpa::Problem& p);
SdpaFp8BwdParams sdpa_fp8_bwd_params(const sdpa::Problem& p, void* workspace, size_t workspace_bytes);

// The feature pairs (docs/SDPA.md "Feature pairs"): the additive
// bias or dropout with paged K/V caches (the paged forward's features, with rng_dump's launch), max_logit
// with sinks (the sink folded into the row statistics after the walk, so that max_logit keeps the scores'
// maximum), score_max / score_sum_exp with a packed O (their padded rows past each sample filled by a
// kernel of their own). On unless FLASHSPAN_SDPA_FEATURE_PAIRS=0 (read by each check_support), and
// set_sdpa_feature_pairs_enabled overrides both (tests: 1 on, 0 off, -1 back to the environment's answer);
// off, sdpa_check_features_gpu refuses them.
bool sdpa_feature_pairs_enabled();
void set_sdpa_feature_pairs_enabled(int on);

// dBias together with softcap on the sm90 backward (its kernel with modifiers stores dBias's dS before
// softcap's factor; docs/SDPA.md "With softcap"): on unless FLASHSPAN_SDPA_DBIAS_SOFTCAP=0 (read by each check and
// execute; its GPU test passed on an H100), set_sdpa_dbias_softcap_enabled overrides both (tests: 1 on, 0 off, -1
// back to the environment's answer); off, the pair is refused on CUDA tensors, naming the variable.
bool sdpa_dbias_softcap_enabled();
void set_sdpa_dbias_softcap_enabled(int on);

// dBias together with softcap on the sm80 backward, for the calls the sm90 backward does not take (its dK/dV kernel
// stores the fp32 P in the dS workspace at the logits step and P (dP - D) over it at the dS step, since its dS holds
// softcap's factor): on unless FLASHSPAN_SDPA_DBIAS_SOFTCAP=0 (the pair's one variable on both backwards, read by
// each check and execute; its GPU test passed on an H200), set_sdpa_dbias_softcap_sm80_enabled overrides both (tests:
// 1 on, 0 off, -1 back to the environment's answer); off, check_dbias_with_softcap refuses those calls, naming it.
// Under sdpa_dbias_softcap_enabled: with its override at 0 the pair is refused on CUDA tensors whatever this says.
bool sdpa_dbias_softcap_sm80_enabled();
void set_sdpa_dbias_softcap_sm80_enabled(int on);

// dBias together with softcap and dropout: on the sm80 backward (that pair's kernel; its dS step forms P (m dP - D)
// with each element's dropout multiplier m), the sm90 backward refusing the triple. On unless
// FLASHSPAN_SDPA_DBIAS_SOFTCAP_DROPOUT=0 (read by each check_support; its GPU test passed on an H100),
// set_sdpa_dbias_softcap_dropout_enabled overrides it (tests: 1 on, 0 off, -1 back to the environment's answer); off,
// sdpa_check_features_gpu refuses the triple on CUDA tensors, naming the variable. Under the pair's switches
// (sdpa_dbias_softcap_enabled, sdpa_dbias_softcap_sm80_enabled).
bool sdpa_dbias_softcap_dropout_enabled();
void set_sdpa_dbias_softcap_dropout_enabled(int on);

// H_k != H_v in FP8 calls: the FP8 forwards (V addressed by h / group_v, the sm90 one's V^T workspace and the sm80
// one's bf16 copy of V with H_v heads) and the FP8 backwards (the sm80 one: a dK pass over the K heads and a dV pass
// over the V heads; the sm90 one, where one group is a multiple of the other: the 16-bit sm90 backward's items and
// slots, its store pass summing each head's): on unless FLASHSPAN_SDPA_FP8_HK_NE_HV=0 (read by each check; its GPU
// tests passed on an H100), set_sdpa_fp8_hk_ne_hv_enabled overrides both (tests: 1 on, 0 off, -1 the environment's
// answer); off, the FP8 rules refuse H_k != H_v, naming the variable.
bool sdpa_fp8_hk_ne_hv_enabled();
void set_sdpa_fp8_hk_ne_hv_enabled(int on);

// attn_scale as a device tensor in FP8 calls on CUDA tensors (the FP8 kernels read it as one of their factors,
// params.h kFp8AttnScale / kFp8BwdAttnScale; no host read, no sync): on unless FLASHSPAN_SDPA_FP8_DEVICE_ATTN_SCALE=0
// (read by each check; its GPU test passed on an H100), set_sdpa_fp8_device_attn_scale_enabled overrides both (tests:
// 1 on, 0 off, -1 the environment's answer); off, refused, naming the variable (flashspan.sdpa_fp8 hands a device
// attn_scale to the C layer as it is).
bool sdpa_fp8_device_attn_scale_enabled();
void set_sdpa_fp8_device_attn_scale_enabled(int on);

// Packed (THD: ragged offsets) q, k, v, o, stats in the FP8 forward on the sm80 kernels (its widening reads each
// sample from its ragged start into padded bf16 copies; the epilogue writes a packed o and stats as the 16-bit
// forward's): on unless FLASHSPAN_SDPA_FP8_THD=0 (read by each check; its GPU tests passed on an H200),
// set_sdpa_fp8_thd_enabled overrides both (tests: 1 on, 0 off, -1 the environment's answer); off, the sm80 FP8
// forward refuses them, naming the variable; the sm90 FP8 forward takes them with sdpa_fp8_sm90_thd_enabled
// (below), and then runs them where it runs the call (sdpa_fp8_fwd_runs_sm90).
bool sdpa_fp8_thd_enabled();
void set_sdpa_fp8_thd_enabled(int on);

// Packed (THD: ragged offsets) q, k, v, o, stats in the 16-bit sm90 forward (per-sample tensor maps built on the
// device, kernels/sm90/sample_maps_sm90.h; a packed O / stats written at the samples' starts): on unless
// FLASHSPAN_SM90_SDPA_THD=0 (read by each check; its GPU tests passed on an H200; FLASHSPAN_EXPERIMENTAL, its
// switch before, no longer changes it), set_sdpa_sm90_thd_enabled overrides both (tests: 1 on, 0 off, -1 the
// environment's answer). Off: packed calls take the sm80 forward (the refusal names the variable). The same switch
// lets packed tensors through the sm90 backward (sm90_refusal); the sm90 FP8 forward has its own (below).
bool sdpa_sm90_thd_enabled();
void set_sdpa_sm90_thd_enabled(int on);

// Packed (THD: ragged offsets) q, k, v, o, stats in the sm90 FP8 forward (sdpa_fp8_fwd_sm90_refusal: q and k through
// the 16-bit sm90 forward's per-sample maps, v through its V^T pre-pass, o and the stats at the samples' starts): its
// own switch, so that sdpa_sm90_thd_enabled can change without taking it along; on unless
// FLASHSPAN_SM90_SDPA_FP8_THD=0 (read by each check; its GPU tests passed on an H200, 2026-12-05; FLASHSPAN_EXPERIMENTAL,
// its switch before, no longer changes it), set_sdpa_fp8_sm90_thd_enabled overrides both (tests: 1 on, 0 off, -1 the
// environment's answer). Off: packed FP8 forwards take the sm80 FP8 forward (its own switch,
// sdpa_fp8_thd_enabled) or are refused.
bool sdpa_fp8_sm90_thd_enabled();
void set_sdpa_fp8_sm90_thd_enabled(int on);
// Paged K/V caches on the 16-bit sm90 forward (kernels/sm90/launch_sm90.h launch_sdpa_fwd_paged_sm90: the sm90
// forward's kernel with the modifiers' source, K / V boxes placed through the page tables by TMA, kv_addr.cuh
// PagedKv's TMA form): on by default (its GPU tests passed on an H100, 2026-12-05); FLASHSPAN_SM90_SDPA_PAGED=0 (read
// per call) turns it off, set_sdpa_sm90_paged_enabled overrides it (tests: 1 on, 0 off, -1 the environment's
// answer). Off, or for a call it
// does not take, paged forwards keep the sm80 paged kernel (and the decode forward its calls). On an sm_90 device
// with this build's sm_90a code and sdpa_fwd_sm90_enabled(), sdpa_fwd_runs_sm90_paged answers whether it runs a
// call: sdpa_fwd_sm90_paged_refusal nullptr (a paged 16-bit forward; padded q / o / stats / gate, or packed with
// sdpa_sm90_paged_thd_enabled below; k and v without ragged offsets; head dims up
// to 128; no dropout, no bias unless sdpa_sm90_paged_bias_enabled below; each paged side's pages of 8 keys or more
// and its container not empty; the rest as
// sdpa_fwd_sm90_refusal: masks, padding, GQA / H_k != H_v, max_logit, and with sdpa_fwd_sm90_mods_enabled softcap,
// ALiBi, sinks, the gate, score_max / score_sum_exp, the block_mask), else the first thing it does not take. Its
// workspace: one int32 flag a sample (a page-table entry outside its container: NaN over the sample's O and stats
// rows), sdpa_fwd_sm90_paged_flags_bytes, for every call sdpa_fwd_sm90_may_take_paged (a 16-bit paged CUDA forward on
// an sm_90 device with the sm_90a code), whatever the switches say, after packed q's maps (sdpa_fwd_sm90_maps_bytes);
// sdpa_paged_fwd_params_sm90 binds it (checked).
// Packed (THD) q / o / stats / gate on that paged forward (launch_sdpa_fwd_paged_sm90: q through its per-sample maps,
// sdpa_fwd_sm90_maps, at the workspace's start, the flags after them; o / stats / gate at the samples' starts):
// on by default (its GPU tests passed on an H100, 2026-12-06; 1.3-1.9x the sm80 paged kernel, PERF_LOG v2.55);
// FLASHSPAN_SM90_SDPA_PAGED_THD=0 (read per call) turns it off, set_sdpa_sm90_paged_thd_enabled overrides it (tests:
// 1 on, 0 off, -1 the environment's answer). Off, sdpa_fwd_sm90_paged_refusal refuses those calls (naming the
// switch) and the sm80 paged kernel runs them.
// The additive bias on that paged forward (every broadcast form and bias dtype the unpaged sm90 forward takes, with
// the modifiers' switch; a 16-bit bias of whole aligned rows staged by TMA, keys by their position in the sample):
// on by default (its GPU tests passed on an H100, 2026-12-06; 2.2-3.3x the sm80 paged kernel, PERF_LOG v2.55);
// FLASHSPAN_SM90_SDPA_PAGED_BIAS=0 (read per call) turns it off, set_sdpa_sm90_paged_bias_enabled overrides it
// (tests: 1 on, 0 off, -1 the environment's answer). Off, sdpa_fwd_sm90_paged_refusal refuses those calls (naming
// the switch) and the sm80 paged kernel runs them.
bool sdpa_sm90_paged_enabled();
void set_sdpa_sm90_paged_enabled(int on);
// The sm90 forward's softcap without other score modifiers, on full key blocks, with softcap's tanh and the
// softmax's update in one basic block (SdpaScoreParams::fused_softcap; kernel_fwd_sm90.cuh), so that ptxas can
// issue one row's MUFU.TANH among the other row's exponentials instead of all 64 in a burst before the row max
// (PERF_LOG v2.75: the softcap forward's MIO-throttle stall 3.4x the plain forward's). By default since PERF_LOG
// v2.77 (H200, B=1 H=16 bf16 causal softcap 30: D = 128 S=8192 0.584 -> 0.541 ms, S=32768 9.00 -> 8.51 ms; D = 64
// S=8192 0.495 -> 0.477 ms); FLASHSPAN_SM90_SDPA_FUSED_SOFTCAP=0 turns it off (read per call),
// set_sdpa_sm90_fused_softcap_enabled overrides it (tests: 1 on, 0 off, -1 the environment's answer). The same
// arithmetic either way (O and the statistics bitwise equal).
bool sdpa_sm90_fused_softcap_enabled();
void set_sdpa_sm90_fused_softcap_enabled(int on);
bool sdpa_sm90_paged_thd_enabled();
void set_sdpa_sm90_paged_thd_enabled(int on);
bool sdpa_sm90_paged_bias_enabled();
void set_sdpa_sm90_paged_bias_enabled(int on);
const char* sdpa_fwd_sm90_paged_refusal(const sdpa::Problem& p);
bool sdpa_fwd_runs_sm90_paged(const sdpa::Problem& p);
bool sdpa_fwd_sm90_may_take_paged(const sdpa::Problem& p);
size_t sdpa_fwd_sm90_paged_flags_bytes(const sdpa::Problem& p);
SdpaPagedFwdSm90Params sdpa_paged_fwd_params_sm90(const sdpa::Problem& p, void* workspace, size_t workspace_bytes);
// A 16-bit CUDA forward (paged or not) on an sm_90 device with this build's sm_90a code: one the sm90 forwards may
// take, whatever their switches and refusals say (the workspace rules below).
bool sdpa_fwd_sm90_may_take(const sdpa::Problem& p);
// The 16-bit sm90 forward's item counter (AnalyticMaskParams::item_counter: grouped cells claimed in list order,
// launch_fwd_sm90.cu set_sdpa_fwd_l2_group): 32 bytes (an int32, 16-byte aligned) after the maps and a paged call's
// flags, for every call sdpa_fwd_sm90_may_take whose cells differ in cost (a band or a block_mask), whatever the
// switches say (so that an operation sized with them off still runs when they are turned on); 0 bytes for other
// calls. sdpa_fwd_sm90_counter binds it: its
// address, or null for other calls and for a workspace too small to hold it (the cells then run in snake waves).
size_t sdpa_fwd_sm90_counter_bytes(const sdpa::Problem& p);
int32_t* sdpa_fwd_sm90_counter(const sdpa::Problem& p, void* workspace, size_t workspace_bytes);

// The FP8 forward on the sm80 kernels (kernels/sm80/launch_sm80.h launch_sdpa_fp8_fwd_sm80: the 16-bit sm80
// forward's loop on the codes widened to bf16, exact, with P's FP8 rounding and O's FP8 store in the kernel):
// every GPU from sm_80, and on sm_90 the calls the sm90 FP8 forward does not take (its head dims, strides,
// switch). On unless FLASHSPAN_SDPA_FP8_SM80=0 (read by each check_support), and set_sdpa_fp8_fwd_sm80_enabled
// overrides both (tests: 1 on, 0 off, -1 the environment's answer).
// sdpa_fp8_fwd_sm80_refusal: nullptr when it covers an FP8 forward (the sm90 one's options, H_k != H_v with
// sdpa_fp8_hk_ne_hv_enabled, the sm80 forward's head dims), else the first thing it does not cover. The one rule of which FP8 forward
// runs: sdpa_fp8_fwd_runs_sm90 (enabled, covered, q / k / v strides multiples of 16, an sm_90 device with
// this build's sm_90a code), else sdpa_fp8_fwd_runs_sm80 (enabled and covered); once an operation's
// check_support has answered, its Problem::fp8_fwd_family holds the answer and both return it (the workspace
// size and the launch follow check_support's choice, whatever the switches say later). sdpa_fp8_fwd_sm80_params:
// sdpa_fp8_fwd_params on the workspace's bf16 copies of q, k, v (the workspace checked: size, alignment).
bool sdpa_fp8_fwd_sm80_enabled();
void set_sdpa_fp8_fwd_sm80_enabled(int on);
const char* sdpa_fp8_fwd_sm80_refusal(const sdpa::Problem& p);
// The first q / k / v stride (slot, dimension) the sm90 FP8 forward's TMA boxes do not take (not a multiple
// of 16 elements), or slot -1: check_support's message and sdpa_fp8_fwd_runs_sm90 read this one rule.
struct Fp8StrideFault {
  int slot = -1, dim = -1;
};
Fp8StrideFault sdpa_fp8_fwd_sm90_stride_fault(const sdpa::Problem& p);
bool sdpa_fp8_fwd_runs_sm90(const sdpa::Problem& p);
bool sdpa_fp8_fwd_runs_sm80(const sdpa::Problem& p);
SdpaFp8FwdSm80Params sdpa_fp8_fwd_sm80_params(const sdpa::Problem& p, void* workspace, size_t workspace_bytes);

// The decode forward (kernels/sm80/kernel_decode_sm80.cuh: packed GQA on the 16-row decode tile, the
// key walk split into items over the device's SMs, a combine kernel; contiguous or paged K / V; every
// GPU of the sm80 family, sm_90 too), the one rule (sdpa_family.cpp): it runs a CUDA forward that
// sdpa_decode_refusal lets through (nullptr: fp16 / bf16, head dims up to 128, H_k = H_v,
// S_q H_q / H_k <= 16, no bias, dropout, rng_dump or block_mask, ALiBi only when
// sdpa_decode_alibi_enabled(): on unless FLASHSPAN_SDPA_DECODE_ALIBI=0 (read per call), unless
// set_sdpa_decode_alibi_enabled overrides it; else the
// first thing it does not take) when sdpa_decode_enabled(): on unless FLASHSPAN_SDPA_DECODE=0 (read per
// call), unless set_sdpa_decode_enabled overrides it (tests: 1 on, 0 off, -1 back to the environment's answer). Its
// workspace (sdpa_fwd_workspace_size) holds the items' partial results; sdpa_decode_fwd_params binds
// it (checked: size, 16-byte alignment) and gives the slots it holds.
const char* sdpa_decode_refusal(const sdpa::Problem& p);
bool sdpa_decode_enabled();
void set_sdpa_decode_enabled(int on);
bool sdpa_decode_alibi_enabled();
void set_sdpa_decode_alibi_enabled(int on);
bool sdpa_fwd_runs_decode(const sdpa::Problem& p);
SdpaPagedFwdParams sdpa_decode_fwd_params(const sdpa::Problem& p, void* workspace, size_t workspace_bytes,
                                          int64_t* slot_capacity);

// Enqueue the kernels on the stream for a problem whose tensors are bound (Problem::bind) to
// device memory. Allocate nothing, read nothing back (CUDA-graph capturable); the workspace
// must hold the size above. Throw Error(kCudaError) on a launch failure. An empty batch (B = 0) returns first,
// before any parameter, workspace or kernel, after the memsets / -inf fill of sdpa::empty_batch_fills (capturable too).
void launch_sdpa_fwd(const sdpa::Problem& p, void* workspace, size_t workspace_bytes, void* stream);
void launch_sdpa_bwd(const sdpa::Problem& p, void* workspace, size_t workspace_bytes, void* stream);

}  // namespace flashspan
