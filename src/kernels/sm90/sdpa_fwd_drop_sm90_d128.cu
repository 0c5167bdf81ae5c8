// The sm90 SDPA forward kernels with score modifiers and dropout (kernel_fwd_sm90.cuh
// sdpa_fwd_kernel_sm90 with AnalyticDropSourceSm90, fwd_sm90_run.cuh run_sdpa_fwd_sm90<..., true, true>;
// experimental, FLASHSPAN_EXPERIMENTAL=1) of kernel head dims (128, 128): fp16 / bf16. A unit of their own,
// beside the modifiers' kernels (sdpa_fwd_mods_sm90_d128.cu), so that the CI's two cores compile them side by side.
#include "kernels/sm90/fwd_sm90_run.cuh"

namespace flashspan::sm90 {
FLASHSPAN_SM90_SDPA_FWD_DROP_INSTANTIATE(128)
}  // namespace flashspan::sm90
