// Entry points of the sm80 (mma.sync) kernel family: the forward and backward launchers
// (launch_fwd_sm80.cu, launch_bwd_sm80.cu), called by src/dispatch with filled params.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "core/tensor_view.h"
#include "kernels/common/launch_util.h"
#include "kernels/params.h"
#include "kernels/sm80/tile_sm80.h"

namespace flashspan::sm80 {

void launch_fwd_sm80(const FwdParams& p, const TileSm80& tile, DType dtype, int num_tasks, cudaStream_t stream);

// Launch sizes of the backward (the dQ mode is BwdParams::deterministic).
struct BwdLaunchSm80 {
  int num_q_blocks = 0;     // bwd view NQB (all samples)
  int num_bwd_tasks = 0;    // dK/dV CTAs (tasks, or key blocks in grid mode)
  int64_t total_q = 0;
};
void launch_bwd_sm80(const BwdParams& p, const TileSm80& tile, DType dtype, const BwdLaunchSm80& cfg,
                     cudaStream_t stream);

}  // namespace flashspan::sm80
