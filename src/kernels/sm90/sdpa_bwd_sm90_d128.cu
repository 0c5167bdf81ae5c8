// The sm90 SDPA backward kernels (analytic mask: kernel_bwd_sm90.cuh sdpa_bwd_kernel_sm90,
// sdpa_bwd_sm90_run.cuh run_sdpa_bwd_sm90) of kernel head dims (128, 128): fp16 / bf16.
#include "kernels/sm90/sdpa_bwd_sm90_run.cuh"

namespace flashspan::sm90 {
FLASHSPAN_SM90_SDPA_BWD_INSTANTIATE(128, 128, false)
}  // namespace flashspan::sm90
