// The sm90 SDPA forward kernels (analytic mask: kernel_fwd_sm90.cuh sdpa_fwd_kernel_sm90,
// fwd_sm90_run.cuh run_sdpa_fwd_sm90) of kernel head dims (192, 128): fp16 / bf16.
#include "kernels/sm90/fwd_sm90_run.cuh"

namespace flashspan::sm90 {
FLASHSPAN_SM90_SDPA_FWD_INSTANTIATE(192, 128, false)
}  // namespace flashspan::sm90
