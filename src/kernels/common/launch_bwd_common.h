// Host launchers of the backward's arch-neutral kernels (kernels/common: bwd_prepost.cuh,
// bwd_split.cuh, split_schedule.cuh), called by the backward launcher of every kernel family
// (sm80::launch_bwd_sm80, sm90::launch_bwd_sm90) around its dK/dV kernel:
//   launch_bwd_preprocess     clears dq_accum (atomic dQ path, either layout), D and lse2 into the workspace
//   launch_bwd_split_schedule count, scan and item list of the dK/dV split schedule
//                             (p.split.num_ctas: the family's persistent grid; p.deterministic:
//                             the deterministic form of bwd_split.cuh, which ignores it and cuts
//                             long walks only with cut_walks)
//   launch_bwd_split_convert  dk / dv rows of the split tasks from their fp32 slots
//   launch_bwd_dq_convert     dq = scale * dq_accum (atomic dQ path)
// and SDPA's parts of every family's backward beside its main kernels (sm80::launch_sdpa_bwd_sm80,
// sm90::launch_sdpa_bwd_sm90):
//   launch_sdpa_bwd_preprocess D and lse2 of every row padded to S_q (and the gate's dgate / gated dO)
//   launch_sdpa_bwd_dsink     dSink (p.analytic.score.dsink, else nothing) from D and lse2, after the
//                             preprocess (bwd_prepost.cuh sdpa_dsink_reduce; 0 without query rows)
//   launch_sdpa_bwd_ds_clear  zeroes where the main kernels put dBias's dS (p.analytic.bias.ds_form: the
//                             workspace or the accumulator p.analytic.bias.ds, or dBias itself; nothing
//                             without dBias) before they store (or add) the samples' visited elements
//   launch_sdpa_bwd_dbias     dBias (p.analytic.bias.dbias, else nothing) from that buffer, after them
//                             (bwd_prepost.cuh sdpa_dbias_reduce, sdpa_dbias_reduce_cols,
//                             sdpa_dbias_from_acc; nothing in the direct form)
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "core/element_type.h"
#include "kernels/params.h"

namespace flashspan {

// The preprocess kernels' form (bwd_prepost.cuh): bwd_preprocess_rows_paired when this answers true (the default
// since PERF_LOG v2.65: 17-31 % less preprocess time on an H100; FLASHSPAN_BWD_PREPROCESS_PAIRED=0, read per call,
// keeps bwd_preprocess_rows; set_bwd_preprocess_paired(1 / 0) forces it on / off for tests, -1 back to the
// environment's answer), else bwd_preprocess_rows.
bool bwd_preprocess_paired();
void set_bwd_preprocess_paired(int on);
// dBias's reduction form for a dBias that keeps the key dimension (bwd_prepost.cuh): sdpa_dbias_reduce_cols
// (a thread per element and run of terms, coalesced along the keys) when this answers true, else
// sdpa_dbias_reduce (a warp per element). On by default since PERF_LOG v2.66 (H100, B=1 H=16 S=8192 causal
// backward with dBias: (1, 1, S, S) 39.1 -> 9.2 ms, (1, 1, 1, S) 12.7 -> 7.9, (1, H, S, S) 549 -> 29.4);
// FLASHSPAN_SDPA_DBIAS_COLS=0 (read per call) keeps the warp form; set_sdpa_dbias_cols(1 / 0) forces it for
// tests, -1 back to the environment's answer.
bool sdpa_dbias_cols_enabled();
void set_sdpa_dbias_cols(int on);
// Calls whose dBias came through form `form` (params.h SdpaDbiasDsForm, dispatch's sdpa_dbias_ds_form;
// counted by launch_sdpa_bwd_dbias): for tests, which form ran.
int64_t sdpa_dbias_form_launches(int form);
// The grid of the preprocess kernels (flex and SDPA) over `units` (query row, head) units of head_dv
// columns, for the form `paired` (its warps take kPreUnits units a lane group per grid pass).
unsigned bwd_preprocess_grid(int64_t units, int head_dv, bool paired);
// Enqueues the SDPA preprocess (sdpa_bwd_preprocess_kernel, D and lse2 of every row padded to S_q; with the
// gate also dgate and the gated dO) of the form bwd_preprocess_paired answers.
void launch_sdpa_bwd_preprocess(const SdpaBwdParams& p, DType dtype, cudaStream_t stream, const char* what);

// dq_cols: the width of the dq_accum rows / tiles it clears (0: p.head_dqk; the sm90 backward's tiles are its
// kernel's head dim, which may exceed the call's).
void launch_bwd_preprocess(const BwdParams& p, DType dtype, int64_t total_q, cudaStream_t stream, int dq_cols = 0);
void launch_bwd_split_schedule(const BwdParams& p, cudaStream_t stream, bool cut_walks = true);
void launch_bwd_split_convert(const BwdParams& p, DType dtype, cudaStream_t stream);
void launch_bwd_dq_convert(const BwdParams& p, DType dtype, int64_t total_q, cudaStream_t stream);
void launch_sdpa_bwd_dsink(const SdpaBwdParams& p, cudaStream_t stream);
void launch_sdpa_bwd_ds_clear(const SdpaBwdParams& p, cudaStream_t stream);
void launch_sdpa_bwd_dbias(const SdpaBwdParams& p, cudaStream_t stream);

}  // namespace flashspan
