// Declarations of the per-head-dim sm90 forward entry points (fwd_sm90_run.cuh, instantiated in
// fwd_sm90_d{64,128,192,256}.cu for the kernel head dims (kDqk, kDv) of tile_sm90.h), so that
// launch_fwd_sm90.cu compiles none of the kernels itself.
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include "core/tensor_view.h"
#include "kernels/params.h"

namespace flashspan::sm90 {

// Consumer schedule of every sm90 forward kernel: intra-warpgroup overlap of the softmax with the
// P V GEMM plus ping-pong of the two consumer warpgroups (kOverlap), or serial.
// FLASHSPAN_SM90_OVERLAP: unset or 1 = overlapped (the default since PERF_LOG v2.0: S=32768
// causal on the H200, D = 128 608 -> 655, D = 64 383 -> 422, (192, 128) 595 -> 647, (256, 256)
// 564 -> 586 TFLOP/s), 0 = serial (comparison; the gpu_check "sm90 no-overlap" step tests it).
// Read once per process.
bool fwd_overlap_sm90();

// Launches the (kDqk, kDv) kernel (the kernel head dims of tile_sm90(p.head_dqk, p.head_dv)).
template <int kDqk, int kDv>
void run_fwd_sm90(const FwdParams& p, DType dtype, const CUtensorMap& mq, const CUtensorMap& mk, const CUtensorMap& mv,
                  cudaStream_t s);
// Launches the SDPA (analytic mask) instantiation of the (kDqk, kDv) kernel, (64, 64) or
// (128, 128): p as launch_sdpa_fwd_sm90 completes it (num_q_blocks, batch strides). kMods: the
// instantiation with score modifiers, sinks and the epilogue options (sdpa_fwd_kernel_sm90 with
// AnalyticModSourceSm90; units sdpa_fwd_mods_sm90_d{64,128}.cu), with kDropout too the one with
// dropout besides (AnalyticDropSourceSm90; units sdpa_fwd_drop_sm90_d{64,128}.cu, experimental), else
// the pure-mask one (with AnalyticSourceSm90; sdpa_fwd_sm90_d{64,128}.cu). mbias: the map of a
// 16-bit bias the producer stages (make_tensor_map_bias_sm90, when SdpaBiasParams::chunks is set).
template <int kDqk, int kDv, bool kMods = false, bool kDropout = false>
void run_sdpa_fwd_sm90(const SdpaFwdParams& p, DType dtype, const CUtensorMap& mq, const CUtensorMap& mk,
                       const CUtensorMap& mv, const CUtensorMap& mbias, cudaStream_t s);
// Launches the SDPA forward over paged K/V caches of kernel head dims (kD, kD), 64 or 128 (units
// sdpa_fwd_paged_sm90_d{64,128}.cu; kernel_fwd_sm90.cuh sdpa_fwd_paged_kernel_sm90, experimental): p as
// launch_sdpa_fwd_paged_sm90 completes it, mk / mv the containers' maps (or a contiguous side's own), mbias a staged
// 16-bit bias's map (experimental; when SdpaBiasParams::chunks is set, else any bytes).
template <int kDqk, int kDv>
void run_sdpa_fwd_paged_sm90(const SdpaPagedFwdSm90Params& p, DType dtype, const CUtensorMap& mq,
                             const CUtensorMap& mk, const CUtensorMap& mv, const CUtensorMap& mbias, cudaStream_t s);
// Launches the SDPA FP8 forward kernel of kernel head dims (kD, kD), 64 or 128 (units
// sdpa_fp8_fwd_sm90_d{64,128}.cu): p as launch_sdpa_fp8_fwd_sm90 completes it, mvt the map of the
// V^T workspace the pre-pass wrote (launch_sdpa_fp8_vt_sm90, before it on the stream).
template <int kDqk, int kDv>
void run_sdpa_fp8_fwd_sm90(const SdpaFp8FwdParams& p, const CUtensorMap& mq, const CUtensorMap& mk,
                           const CUtensorMap& mvt, cudaStream_t s);
// Enqueues the FP8 forward's V^T pre-pass (fp8_vt_sm90.cuh): p.fp8.v_t of
// tile_sm90.h fp8_vt_bytes_sm90(B, H_v, D_v, S_kv) bytes from p.v (unit fp8_vt_sm90.cu).
void launch_sdpa_fp8_vt_sm90(const SdpaFp8FwdParams& p, cudaStream_t s);
// Dynamic shared memory of the (kDqk, kDv) kernel (bytes).
template <int kDqk, int kDv>
int fwd_smem_bytes_of();
// The binary version the runtime loads for the current device's (kDqk, kDv) kernel (90 when
// sm_90a code was built for it), -1 when it has none.
template <int kDqk, int kDv>
int fwd_binary_version_of();

}  // namespace flashspan::sm90
