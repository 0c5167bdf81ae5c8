// The FP8 SDPA backward's pre-pass (launch_sdpa_fp8_bwd_sm80.cu, steps 1-3 there), shared by the two FP8
// backwards: the sm80 one (launch_sdpa_fp8_bwd_sm80) and the sm90 one (kernels/sm90/sdpa_fp8_bwd_sm90.cu), which
// both run 16-bit kernels on bf16 copies of the FP8 codes; and the switch of its widening kernel (below). Host code.
#pragma once

#include <cuda_runtime.h>

#include "kernels/params.h"
#include "kernels/sm80/launch_sm80.h"  // Fp8WidenJob

namespace flashspan::sm80 {

// On `stream`: the derived factors into p.derived (params.h Fp8BwdDerived) and the four amax outputs zeroed;
// the codes of q, k, v, dO widened to bf16 at p.q, p.k, p.v, p.dout ([B, H, S, D] contiguous, the
// workspace's copies); D = descale_dO descale_o dO . o and lse2 = stats log2(e) (+inf for a row without
// keys) into p.delta / p.lse2, the 16-bit backward's workspace rows (h total_q + b S_q + i).
void launch_sdpa_fp8_bwd_prepass(const SdpaFp8BwdParams& p, cudaStream_t stream);

// The widening pre-pass (fp8_widen_sm80.cu, both FP8 launchers of the sm80 family and this pre-pass) with eight
// codes a thread where every job's source is 8-byte aligned (else two, as before). Experimental, not yet run on a
// GPU: on with FLASHSPAN_EXPERIMENTAL=1 (read per launch) unless set_fp8_widen_vec_enabled overrides it (tests:
// 1 on, 0 off, -1 the environment's answer).
bool fp8_widen_vec_enabled();
void set_fp8_widen_vec_enabled(int on);

// The widening job of one FP8 tensor [batch, heads, rows, cols] (format: 1 E4M3, 2 E5M2) into its bf16 copy dst
// (the FP8 launchers' workspace copies: launch_fp8_widen_sm80).
Fp8WidenJob fp8_widen_job(const SdpaFp8Tensor& src, const void* dst, int batch, int heads, int rows, int cols,
                          int format);

}  // namespace flashspan::sm80
