// Declaration of the per-head-dim sm90 SDPA backward entry point (sdpa_bwd_sm90_run.cuh,
// instantiated in sdpa_bwd_sm90_d{64,128,192,256}.cu, with score modifiers in
// sdpa_bwd_mods_sm90_d{64,128}.cu, with dropout besides in sdpa_bwd_drop_sm90_d{64,128}.cu), so that
// launch_bwd_sm90.cu compiles none of the SDPA kernels itself.
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include "core/element_type.h"
#include "kernels/params.h"

namespace flashspan::sm90 {

// Launches the SDPA (analytic mask) backward kernel of kernel head dims (kD, kDv): (64, 64),
// (128, 128), (192, 128) or (256, 256) (kernel_bwd_sm90.cuh sdpa_bwd_kernel_sm90), then its dQ
// convert: p as launch_sdpa_bwd_sm90 completes it (the preprocess has run; dq_accum tiles
// cleared; tile counts set; with the gate, dout the preprocess's gated dO). kWideTile: (192, 128) on
// the 64 x 96 tile (the three-warpgroup consumers). kMods: the kernel with score modifiers (softcap,
// ALiBi, the bias and dBias's dS; kernel_bwd_mods_sm90.cuh sdpa_bwd_mods_kernel_sm90), (64, 64) and
// (128, 128) only; kDropout (with kMods): the one with dropout besides (sdpa_bwd_mods_kernel_sm90<..., true>) or,
// for Philox dropout without modifiers, the Philox-only one (sdpa_bwd_drop_kernel_sm90; launch_sm90.h
// sdpa_bwd_dropout_philox_kernel).
// What every SDPA backward on the sm90 kernel (launch_sdpa_bwd_sm90, the FP8 one's launch_sdpa_fp8_bwd_sm90)
// sets up on `stream` before its kernel: p's grid fields for the kernel's tile (kBq x kBk: num_q_blocks /
// num_k_blocks, the dQ tiles' view, grid mode), the dQ tiles (kernel head dim kd) and, deterministic, their
// counters cleared; with `slots`, every work item's dK / dV slot (item_heads a sample, kd / kdv columns)
// cleared for the epilogue's atomic additions (p.split.dk_accum / dv_accum, checked against the workspace's
// sdpa_bwd_slot_floats_sm90).
void prepare_sdpa_bwd_sm90(SdpaBwdParams& p, int kBq, int kBk, int kd, int kdv, int64_t item_heads, bool slots,
                           cudaStream_t stream);

template <int kD, int kDv, bool kWideTile = false, bool kMods = false, bool kDropout = false>
void run_sdpa_bwd_sm90(const SdpaBwdParams& p, DType dtype, const CUtensorMap& mq, const CUtensorMap& mk,
                       const CUtensorMap& mv, const CUtensorMap& mdo, cudaStream_t s);

}  // namespace flashspan::sm90
