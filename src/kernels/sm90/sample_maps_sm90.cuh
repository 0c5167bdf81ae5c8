// The device half of the per-sample tensor maps of packed SDPA tensors (sample_maps_sm90.h): how an sm90
// producer picks the map a TMA load of sample b goes through. The producer keeps one int, its batch
// coordinate, in a coded form: b >= 0 the kernel's own map at batch coordinate b (padded tensors, as
// before), or -1 - b sample b's own maps (packed calls) at batch coordinate 0.
#pragma once

#include <cuda.h>

#include <cstdint>

#include "kernels/sm90/ptx_sm90.cuh"

namespace flashspan::kern90 {

#if defined(__CUDA_ARCH__)

// The coded batch coordinate of sample b: b, or -1 - b when the call's maps are per sample (maps != null).
__device__ __forceinline__ int sample_coord(const void* maps, int b) { return maps != nullptr ? -1 - b : b; }
// The sample of a coded coordinate, either form (c, or ~c = -1 - c when c < 0): for a load that takes no sample
// map (the FP8 forward's V^T, a padded workspace).
__device__ __forceinline__ int sample_of_coord(int coord) { return coord ^ (coord >> 31); }

// Acquires the first kUsed of sample b's kTensors maps (written by the pre-pass earlier on the stream) for this
// thread's TMA loads through them.
template <int kTensors, int kUsed = kTensors>
__device__ __forceinline__ void acquire_sample_maps(const void* maps, int b) {
  static_assert(kUsed >= 1 && kUsed <= kTensors, "acquire_sample_maps: maps of the sample's slots");
  const CUtensorMap* m = static_cast<const CUtensorMap*>(maps) + kTensors * int64_t(b);
#pragma unroll
  for (int x = 0; x < kUsed; ++x) tensormap_acquire(m + x);
}

// Issues the loads of two tensors xa, xb (their map indices) loaded together through issue(map a, map b, batch
// coordinate): the kernel's `ta`, `tb` at batch coordinate `coord` (coord >= 0), or sample -1 - coord's own maps
// of `maps` (kTensors maps a sample) at 0. kOn = false (a kernel without packed calls): always the first. Two
// issue sites, so that the kernel's maps keep their constant-bank form in uniform registers (no register of a
// producer held across its loops for them), and a sample's maps are formed at the load (the empty asm keeps
// them from being hoisted out of the producer's loop: pointers held there spilled on the forward's 24 registers).
template <bool kOn, int kTensors, class F>
__device__ __forceinline__ void with_sample_maps(const void* maps, int coord, const CUtensorMap* ta, int xa,
                                                 const CUtensorMap* tb, int xb, F&& issue) {
  if constexpr (kOn) {
    if (coord < 0) {
      int b = -1 - coord;
      asm volatile("" : "+r"(b));
      const CUtensorMap* m = static_cast<const CUtensorMap*>(maps) + kTensors * int64_t(b);
      issue(m + xa, m + xb, 0);
      return;
    }
  }
  issue(ta, tb, coord);
}

// The same for one tensor x: issue(map, batch coordinate).
template <bool kOn, int kTensors, class F>
__device__ __forceinline__ void with_sample_map(const void* maps, int coord, const CUtensorMap* tm, int x,
                                                F&& issue) {
  with_sample_maps<kOn, kTensors>(maps, coord, tm, x, tm, x,
                                  [&](const CUtensorMap* m, const CUtensorMap*, int batch) { issue(m, batch); });
}

#endif  // __CUDA_ARCH__

}  // namespace flashspan::kern90
