// The forward's arch-neutral kernels (fwd_split.cuh) and their launches (fwd_launch.h).
#include "kernels/common/fwd_launch.h"

#include "kernels/common/fwd_split.cuh"
#include "kernels/common/grid.h"
#include "kernels/common/launch_util.h"

namespace flashspan {
namespace {

__global__ void fill_neg_inf_kernel(float* p, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) p[i] = -INFINITY;
}

}  // namespace

void launch_max_logit_reset(float* max_logit, int heads, cudaStream_t stream) {
  fill_neg_inf_kernel<<<grid_1d((int64_t(heads) + 127) / 128, "flex forward: max_logit reset"), 128, 0, stream>>>(
      max_logit, heads);
  check_launch("flex forward: max_logit reset");
}

void launch_fwd_split_schedule(const FwdParams& p, bool items_always, cudaStream_t stream) {
  const unsigned tasks = grid_1d(p.split.num_tasks, "flex forward (tasks)");
  kern::flex_fwd_split_count_kernel<<<grid_1d((int64_t(tasks) + 255) / 256, "flex forward split count"), 256, 0,
                                      stream>>>(p);
  check_launch("flex forward split count");
  kern::split_scan_kernel<true><<<1, kern::kSplitScanThreads, 0, stream>>>(p.split);
  check_launch("flex forward split scan");
  if (items_always) {
    kern::flex_fwd_split_items_kernel<true><<<tasks, 256, 0, stream>>>(p);
  } else {
    kern::flex_fwd_split_items_kernel<false><<<tasks, 256, 0, stream>>>(p);
  }
  check_launch("flex forward split items");
}

void launch_fwd_split_combine(const FwdParams& p, DType dtype, cudaStream_t stream) {
  const unsigned tasks = grid_1d(p.split.num_tasks, "flex forward (tasks)");
  with_element_type(dtype, "flex forward split combine", [&](auto e) {
    kern::flex_fwd_split_combine_kernel<decltype(e)><<<tasks, 256, 0, stream>>>(p);
  });
  check_launch("flex forward split combine");
}

}  // namespace flashspan
