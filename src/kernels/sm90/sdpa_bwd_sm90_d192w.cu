// The sm90 SDPA backward kernels (analytic mask: kernel_bwd_sm90.cuh sdpa_bwd_kernel_sm90,
// sdpa_bwd_sm90_run.cuh run_sdpa_bwd_sm90) of head dims (192, 128) on the 64 x 96 tile (the
// three-warpgroup consumers; sm90::bwd_wide192_enabled): fp16 / bf16. A unit of its own, beside the
// 64 x 64 kernels' (sdpa_bwd_sm90_d192.cu), so that the CI's two cores compile them side by side.
#include "kernels/sm90/sdpa_bwd_sm90_run.cuh"

namespace flashspan::sm90 {
FLASHSPAN_SM90_SDPA_BWD_INSTANTIATE(192, 128, true)
}  // namespace flashspan::sm90
