// The FP8 SDPA pre-passes (fp8_prepass.cu): arch-neutral kernels of the FP8 launchers that run 16-bit kernels on
// bf16 copies of the FP8 codes (exact: every E4M3 / E5M2 value is a bf16 value). The widening, shared by both
// FP8 launchers of the sm80 family (kernels/sm80/launch_sdpa_fp8_{fwd,bwd}_sm80.cu) and the backward's pre-pass;
// the FP8 backward's pre-pass, shared by the sm80 FP8 backward and the sm90 one
// (kernels/sm90/sdpa_fp8_bwd_sm90.cu). Host code.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/params.h"

namespace flashspan {

// Job i (of num_jobs <= 4) of launch_fp8_widen widens the codes of an FP8 tensor [batch, heads, rows, cols] (byte
// strides; cols even) to bf16 [batch, heads, rows, cols] contiguous at dst.
struct Fp8WidenJob {
  SdpaFp8Tensor src;
  uint32_t* dst = nullptr;  // bf16 pairs
  int batch = 0, heads = 0, rows = 0, cols = 0;
  int e5m2 = 0;
  // A ragged (packed THD) source (fp8_widen_job_ragged; the sm80 FP8 forward's packed inputs, whose GPU tests passed
  // on an H200): sample b starts at start's element (byte) offset and holds the rows below its length (seq_len /
  // cu_seq_len, clamped to rows), the copy's rows past it are zeros (never read from the source). ragged = 0: sample
  // b at b * src.batch_stride, every row read.
  int ragged = 0;
  SampleStart start;
  IndexArray seq_len, cu_seq_len;
};
struct Fp8WidenJobs {
  Fp8WidenJob job[4];
};

// The widening job of one FP8 tensor [batch, heads, rows, cols] (format: 1 E4M3, 2 E5M2) into its bf16 copy dst
// (the FP8 launchers' workspace copies).
Fp8WidenJob fp8_widen_job(const SdpaFp8Tensor& src, const void* dst, int batch, int heads, int rows, int cols,
                          int format);
// The job of a ragged source (Fp8WidenJob::ragged): its samples' starts and lengths.
Fp8WidenJob fp8_widen_job_ragged(Fp8WidenJob job, const SampleStart& start, const IndexArray& seq_len,
                                 const IndexArray& cu_seq_len);
// On `stream`: jobs 0 .. num_jobs - 1, one grid (blockIdx.y the job); with a ragged job, every job through the
// ragged form of the kernel.
void launch_fp8_widen(const Fp8WidenJobs& jobs, int num_jobs, cudaStream_t stream);

// The widening with eight codes a thread where every job's source is 8-byte aligned (else two a thread). On by
// default since its GPU tests passed (H100, PERF_LOG v2.40) and the FP8 backward ran 4-24 % faster with it and the
// sm90 FP8 backward's own stores (H200, v2.42); FLASHSPAN_FP8_WIDEN_VEC=0 (read per launch) turns it off, unless
// set_fp8_widen_vec_enabled overrides it (tests: 1 on, 0 off, -1 the environment's answer).
bool fp8_widen_vec_enabled();
void set_fp8_widen_vec_enabled(int on);

// The FP8 backward's pre-pass, on `stream`: the derived factors into p.derived (params.h Fp8BwdDerived) and the
// four amax outputs zeroed; the codes of q, k, v, dO widened to bf16 at p.q, p.k, p.v, p.dout ([B, H, S, D]
// contiguous, the workspace's copies); D = descale_dO descale_o dO . o and lse2 = stats log2(e) (+inf for a row
// without keys) into p.delta / p.lse2, the 16-bit backward's workspace rows (h total_q + b S_q + i).
void launch_sdpa_fp8_bwd_prepass(const SdpaFp8BwdParams& p, cudaStream_t stream);

}  // namespace flashspan
