// The sm90 SDPA forward kernels over paged K/V caches (kernel_fwd_sm90.cuh sdpa_fwd_paged_kernel_sm90,
// fwd_sm90_run.cuh run_sdpa_fwd_paged_sm90; on by default, FLASHSPAN_SM90_SDPA_PAGED=0 off:
// dispatch's sdpa_sm90_paged_enabled) of kernel head dims (128, 128): fp16 / bf16.
#include "kernels/sm90/fwd_sm90_run.cuh"

namespace flashspan::sm90 {
FLASHSPAN_SM90_SDPA_FWD_PAGED_INSTANTIATE(128)
}  // namespace flashspan::sm90
