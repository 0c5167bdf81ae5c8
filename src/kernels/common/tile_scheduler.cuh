// The tile scheduler role of the kernels of every family (arch-neutral): which (block, head,
// sample) a CTA works on, from the plan's task list.
#pragma once

#include <cstdint>


namespace flashspan::kern {

// An entry of a view's task list (mask_plan.h: {block, head, sample, cost}, longest first):
// forward {local query block, query head (the kv head when packed), sample}, backward
// {local key block, kv head, sample}.
struct Task {
  int block, head, batch;
};

// `tasks` is the view's pointer (view.tasks), taken by value: binding a reference to a kernel
// parameter struct changed the sm80 kernels' code.
__device__ __forceinline__ Task load_task(const int32_t* tasks, int64_t t) {
  const int32_t* e = tasks + 4 * t;
  return Task{__ldg(e + 0), __ldg(e + 1), __ldg(e + 2)};
}

}  // namespace flashspan::kern
