// The sm90 SDPA backward kernels with score modifiers (kernel_bwd_mods_sm90.cuh
// sdpa_bwd_mods_kernel_sm90, sdpa_bwd_sm90_run.cuh run_sdpa_bwd_sm90<..., true>) of kernel head dims
// (64, 64): fp16 / bf16, with softcap or without (with the dQ convert: 6 kernels). A unit of their
// own, beside the pure-mask kernels' (sdpa_bwd_sm90_d64.cu), so that the CI's two cores compile them
// side by side.
#include "kernels/sm90/sdpa_bwd_sm90_run.cuh"

namespace flashspan::sm90 {
FLASHSPAN_SM90_SDPA_BWD_MODS_INSTANTIATE(64)
}  // namespace flashspan::sm90
