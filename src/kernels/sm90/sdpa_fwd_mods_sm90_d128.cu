// The sm90 SDPA forward kernels with score modifiers, sinks and the epilogue options
// (kernel_fwd_sm90.cuh sdpa_fwd_kernel_sm90 with AnalyticModSourceSm90, fwd_sm90_run.cuh
// run_sdpa_fwd_sm90<..., true>) of
// kernel head dims (128, 128): fp16 / bf16, with the bias's code or without (AnalyticModNoBiasSourceSm90). A
// unit of their own, beside the pure-mask kernels'
// (sdpa_fwd_sm90_d128.cu), so that the CI's two cores compile them side by side.
#include "kernels/sm90/fwd_sm90_run.cuh"

namespace flashspan::sm90 {
FLASHSPAN_SM90_SDPA_FWD_INSTANTIATE(128, 128, true)
}  // namespace flashspan::sm90
