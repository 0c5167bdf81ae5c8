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
// additive bias (any broadcast form, float32 or q's dtype) and dBias (not together with softcap);
// dropout (Philox from device seed / offset, or the caller's mask) and rng_dump.
// Every other feature is refused by sdpa_check_features_gpu with an error naming it.
#pragma once

#include <cstddef>

#include "core/sdpa_problem.h"
#include "kernels/params.h"

namespace flashspan {

// Host rules only (no CUDA call; CPU-testable): throws Error(kNotSupported) naming the first
// argument or feature of the call the GPU kernels do not run, and the rule.
void sdpa_check_features_gpu(const sdpa::Problem& p);

// sdpa_check_features_gpu, then the device's rules (compute capability 8.0 or newer, shared
// memory per block): what check_support() runs for CUDA tensors.
void sdpa_check_support_gpu(const sdpa::Problem& p);

// Bytes of workspace of one call (pure functions of the problem's sizes): the forward needs
// none; the backward keeps D and LSE log2(e) ([H_q, B * S_q] fp32 each), unless
// deterministic the fp32 dQ accumulator [H_q, B * S_q, D_qk], with dBias the fp32 dS
// [B, H_q, S_q, S_kv rounded up to even], and with the output gate dO * sigmoid(G)
// [H_q, B * S_q, D_v] in the input dtype.
size_t sdpa_fwd_workspace_size(const sdpa::Problem& p);
size_t sdpa_bwd_workspace_size(const sdpa::Problem& p);

// The kernels' parameters of a problem whose tensors are bound (host only, sdpa_params.cpp):
// what launch_sdpa_fwd / launch_sdpa_bwd pass to the sm80 launchers. The backward binds its
// workspace (checked: size and 16-byte alignment).
SdpaFwdParams sdpa_fwd_params(const sdpa::Problem& p);
SdpaBwdParams sdpa_bwd_params(const sdpa::Problem& p, void* workspace, size_t workspace_bytes);

// Enqueue the kernels on the stream for a problem whose tensors are bound (Problem::bind) to
// device memory. Allocate nothing, read nothing back (CUDA-graph capturable); the workspace
// must hold the size above. Throw Error(kCudaError) on a launch failure.
void launch_sdpa_fwd(const sdpa::Problem& p, void* workspace, size_t workspace_bytes, void* stream);
void launch_sdpa_bwd(const sdpa::Problem& p, void* workspace, size_t workspace_bytes, void* stream);

}  // namespace flashspan
