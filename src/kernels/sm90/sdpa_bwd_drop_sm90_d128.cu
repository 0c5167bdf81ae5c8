// The sm90 SDPA backward kernels with dropout of kernel head dims (128, 128) (sdpa_bwd_sm90_run.cuh
// run_sdpa_bwd_sm90<..., true, true>): with score modifiers besides (kernel_bwd_mods_sm90.cuh
// sdpa_bwd_mods_kernel_sm90<..., true>) and, for Philox dropout without modifiers, the Philox-only kernel
// (sdpa_bwd_drop_kernel_sm90, launch_sm90.h sdpa_bwd_dropout_philox_kernel); fp16 / bf16 (with the dQ convert:
// 6 kernels). A unit of their own, beside the modifiers' kernels (sdpa_bwd_mods_sm90_d128.cu), so that the CI's
// two cores compile them side by side.
#include "kernels/sm90/sdpa_bwd_sm90_run.cuh"

namespace flashspan::sm90 {
FLASHSPAN_SM90_SDPA_BWD_DROP_INSTANTIATE(128)
}  // namespace flashspan::sm90
