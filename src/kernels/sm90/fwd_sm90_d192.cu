// The sm90 forward kernels of kernel head dims (192, 128) (fwd_sm90_run.cuh): fp16 / bf16 x max_logit
// off / on x serial / overlapped consumers.
#include "kernels/sm90/fwd_sm90_run.cuh"

namespace flashspan::sm90 {
FLASHSPAN_SM90_FWD_INSTANTIATE(192, 128)
}  // namespace flashspan::sm90
