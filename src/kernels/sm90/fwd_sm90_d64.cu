// The sm90 forward kernels of kernel head dims (64, 64) (fwd_sm90_run.cuh): fp16 / bf16 x max_logit
// off / on x serial / overlapped consumers.
#include "kernels/sm90/fwd_sm90_run.cuh"

namespace flashspan::sm90 {
FLASHSPAN_SM90_FWD_INSTANTIATE(64, 64)
}  // namespace flashspan::sm90
