// The sm90 SDPA FP8 forward kernels (kernel_fwd_sm90.cuh sdpa_fp8_fwd_kernel_sm90,
// fwd_sm90_run.cuh run_sdpa_fp8_fwd_sm90; experimental) of kernel head dims (128, 128): E4M3 / E5M2.
#include "kernels/sm90/fwd_sm90_run.cuh"

namespace flashspan::sm90 {
FLASHSPAN_SM90_SDPA_FP8_FWD_INSTANTIATE(128)
}  // namespace flashspan::sm90
