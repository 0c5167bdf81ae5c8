// Entry points of the sm80 (mma.sync) kernel family: the forward and backward launchers
// (launch_fwd_sm80.cu, launch_bwd_sm80.cu) of flex (plan-driven masks) and those of SDPA
// (launch_sdpa_fwd_sm80.cu, launch_sdpa_bwd_sm80.cu: the analytic mask, params.h
// AnalyticMaskParams), called by src/dispatch with filled params.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "core/tensor_view.h"
#include "kernels/common/launch_util.h"
#include "kernels/params.h"
#include "kernels/sm80/tile_sm80.h"

namespace flashspan::sm80 {

void launch_fwd_sm80(const FwdParams& p, const TileSm80& tile, DType dtype, int num_tasks, cudaStream_t stream);

// Launch sizes of the backward (the dQ mode is BwdParams::deterministic).
struct BwdLaunchSm80 {
  int num_q_blocks = 0;     // bwd view NQB (all samples)
  int num_bwd_tasks = 0;    // dK/dV CTAs (tasks, or key blocks in grid mode)
  int64_t total_q = 0;
};
void launch_bwd_sm80(const BwdParams& p, const TileSm80& tile, DType dtype, const BwdLaunchSm80& cfg,
                     cudaStream_t stream);

// SDPA with the analytic mask (p.analytic), tile_sm80(head dims): one CTA per (query block,
// query head) of every sample padded to S_q rows (forward, deterministic dQ), per (key block,
// kv head) padded to S_kv (dK/dV); no plan, no task list, no split schedule. The backward
// workspace (p.delta, p.lse2, p.dq_accum) has B * S_q rows per head (p.total_q).
void launch_sdpa_fwd_sm80(const SdpaFwdParams& p, const TileSm80& tile, DType dtype, cudaStream_t stream);
void launch_sdpa_bwd_sm80(const SdpaBwdParams& p, const TileSm80& tile, DType dtype, cudaStream_t stream);
// The FP8 backward (params.h SdpaFp8BwdParams; launch_sdpa_fp8_bwd_sm80.cu): its pre-passes, the sm80 dK/dV
// kernel with the FP8 roundings on the tile of the head dims (up to 128), the FP8 dQ. Experimental.
void launch_sdpa_fp8_bwd_sm80(const SdpaFp8BwdParams& p, const TileSm80& tile, cudaStream_t stream);
// The FP8 forward on the sm80 kernels (params.h SdpaFp8FwdSm80Params; launch_sdpa_fp8_fwd_sm80.cu): its
// widening pre-pass, then the sm80 SDPA forward's loop on the codes with the FP8 graph's
// roundings (kernel_fwd_sm80.cuh Fp8FwdSm80) on the tile of the head dims. Experimental, not yet run on a GPU.
void launch_sdpa_fp8_fwd_sm80(const SdpaFp8FwdSm80Params& p, const TileSm80& tile, cudaStream_t stream);
// The forward over paged K/V caches (p.paged_k / p.paged_v, kv_addr.cuh PagedKv): the same grid.
void launch_sdpa_fwd_paged_sm80(const SdpaPagedFwdParams& p, const TileSm80& tile, DType dtype, cudaStream_t stream);

// The SDPA decode forward (kernel_decode_sm80.cuh: packed GQA on the 16-row decode tile, the key walk
// split into items, a combine kernel; dispatch's rule: sdpa_family.cpp sdpa_decode_refusal): p.pack =
// G = p.group_size, head dims <= 128, contiguous or paged K / V (p.paged_k / p.paged_v tables), its
// slots bound at p.split.o_accum / p.split.ml with room for slot_capacity (tile_sm80.h
// decode_slot_capacity). sdpa_decode_grid: the launch's grid for `ctas` resident CTAs (decode_split).
// sdpa_decode_launches counts the calls it ran (tests).
void launch_sdpa_fwd_decode_sm80(const SdpaPagedFwdParams& p, int64_t slot_capacity, DType dtype, cudaStream_t stream);
SdpaDecodeGrid sdpa_decode_grid(const SdpaFwdParams& p, int ctas);
int64_t sdpa_decode_launches();

// Which instantiation the two SDPA launchers run (the paged forward always the features one): the
// mask-only kernels for a call without the main loops' features (params.h sdpa_fwd_has_features /
// sdpa_bwd_has_features), unless sdpa_sm80_features_forced(): FLASHSPAN_SDPA_SM80_FEATURES=1 (read per
// call; measurement only: the features kernels for every call, to time both on one call) or the test
// override set_sdpa_sm80_features_forced (1 forced, 0 not, -1 back to the environment's answer).
// sdpa_{fwd,bwd}_mask_only_launches count the calls the mask-only kernels took (tests).
bool sdpa_sm80_features_forced();
void set_sdpa_sm80_features_forced(int on);
int64_t sdpa_fwd_mask_only_launches();
int64_t sdpa_bwd_mask_only_launches();

}  // namespace flashspan::sm80
