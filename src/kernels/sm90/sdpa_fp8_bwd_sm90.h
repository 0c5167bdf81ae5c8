// The FP8 SDPA backward on the sm90 backward kernel (kernel_bwd_fp8_sm90.cuh, sdpa_fp8_bwd_sm90.cu): host side.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

#include "kernels/params.h"

namespace flashspan::sm90 {

// The FP8 backward of p (sdpa_params.cpp sdpa_fp8_bwd_params on the sm90 layout: dq_accum the 64-row dQ
// tiles, dq_sem their counters when deterministic, split.dk_accum / dv_accum a [bk, kD] fp32 slot per
// (key block, item head, sample): tile_sm90.h sdpa_bwd_item_heads_sm90, max(H_k, H_v) item heads) on
// `stream`: the shared pre-pass (kernels/common/fp8_prepass.h), the main kernel on the (64, 64) or
// (128, 128) kernel of the head dims (multiples of 16 up to 128), then dQ, dK, dV with their amaxes as FP8
// codes (the store pass sums each K / V head's slots). H_k = H_v, or H_k != H_v where one group is a
// multiple of the other (experimental, FLASHSPAN_EXPERIMENTAL=1), the causal mask or none, padded tensors
// (the FP8 validation and dispatch/sdpa_family.cpp sdpa_fp8_bwd_refusal). An sm_90 device with this
// build's sm_90a code.
void launch_sdpa_fp8_bwd_sm90(const SdpaFp8BwdParams& p, cudaStream_t stream);
// Calls of launch_sdpa_fp8_bwd_sm90 in this process so far (tests check which family ran).
int64_t sdpa_fp8_bwd_sm90_launches();

// dK / dV stored as FP8 codes by the kernel's consumers (kernel_bwd_fp8_sm90.cuh Fp8SourceBwdSm90<..., true>:
// no slots to clear, no atomics, no store pass). On by default since its GPU tests passed (H100, PERF_LOG v2.40;
// with the eight-code widening the FP8 backward 4-24 % faster, H200, v2.42); FLASHSPAN_SM90_SDPA_FP8_BWD_STORE=0
// (read per launch) turns it off, unless set_sdpa_fp8_bwd_sm90_store_enabled overrides it (tests: 1 on, 0 off,
// -1 the environment's answer).
bool sdpa_fp8_bwd_sm90_store_enabled();
void set_sdpa_fp8_bwd_sm90_store_enabled(int on);

}  // namespace flashspan::sm90
