// Launch grids that no problem size can push past a CUDA limit (issue 18).
//
// gridDim.y and gridDim.z stop at 65,535 while gridDim.x reaches 2^31 - 1, so every kernel of
// the library takes a one-dimensional grid from grid_1d() and recovers its coordinates with
// fold_2d()/unfold (x fastest, the order a 2-D grid would run in), or loops inside the kernel
// (grid-stride) over a 64-bit extent. A batch of 300,000 samples, 100,000 THD samples or 256
// query heads then only lengthen gridDim.x; an extent that would still exceed gridDim.x is
// refused before launch by an error that names the launch and the limit.
#pragma once

#include <cstdint>

#include "core/error.h"

#if defined(__CUDACC__)
#define FS_GRID_HD __host__ __device__ __forceinline__
#else
#define FS_GRID_HD inline
#endif

namespace flashspan {

// The largest gridDim.x of every architecture since sm_30.
inline constexpr int64_t kMaxGridX = 2147483647;
// CTAs of a grid-stride launch: enough to fill any current GPU many times over; each CTA
// loops over the rest (kernels written for it take any extent).
inline constexpr int64_t kGridStrideCtas = 65536;

// gridDim.x for `ctas` CTAs (one per work unit). Throws Error(kNotSupported) naming `what`
// when ctas exceeds 2^31 - 1; returns at least 1 (callers skip empty launches themselves).
inline unsigned grid_1d(int64_t ctas, const char* what) {
  FS_CHECK_SUPPORTED(ctas <= kMaxGridX, what, ": needs ", ctas,
                     " CTAs, past the CUDA grid limit of 2^31 - 1 (gridDim.x); split the call (fewer samples or heads)");
  return static_cast<unsigned>(ctas < 1 ? 1 : ctas);
}

// gridDim.x of an nx x ny grid folded into x (cell (ix, iy) is CTA iy * nx + ix).
inline unsigned grid_2d_folded(int64_t nx, int64_t ny, const char* what) {
  FS_CHECK_SUPPORTED(nx <= kMaxGridX && ny <= kMaxGridX && (nx == 0 || ny <= kMaxGridX / nx), what, ": needs ", nx,
                     " x ", ny, " CTAs, past the CUDA grid limit of 2^31 - 1 (gridDim.x); split the call");
  return grid_1d(nx * ny, what);
}

// gridDim.x of a grid-stride launch over `units` work units of `units_per_cta` each: one CTA
// per group of units up to kGridStrideCtas CTAs (the kernel loops over the rest).
inline unsigned grid_stride_1d(int64_t units, int units_per_cta) {
  const int64_t ctas = (units + units_per_cta - 1) / units_per_cta;
  return static_cast<unsigned>(ctas < 1 ? 1 : (ctas < kGridStrideCtas ? ctas : kGridStrideCtas));
}

// Coordinates of folded CTA `cta` of an nx-wide 2-D grid (grid_2d_folded).
struct GridCell {
  int x, y;
};
FS_GRID_HD GridCell unfold_2d(unsigned cta, int nx) {
  GridCell c;
  c.y = static_cast<int>(cta / static_cast<unsigned>(nx));
  c.x = static_cast<int>(cta - static_cast<unsigned>(c.y) * static_cast<unsigned>(nx));
  return c;
}

}  // namespace flashspan
