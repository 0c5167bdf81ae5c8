// Tensor maps (TMA descriptors) of the sm90 kernels' Q/K/V-like inputs, encoded on the host
// per call (cuTensorMapEncodeTiled through the runtime's driver entry point: no -lcuda, no
// stream operation, so capture-safe).
#pragma once

#include <cuda.h>

#include "core/tensor_view.h"

namespace flashspan::sm90 {

// Tensor map of a BSHD [B, S, H, D] or THD [T, H, D] tensor (16-bit elements, last dimension
// contiguous, other strides multiples of 16 bytes) as a 4-D map {D, rows, H, B} (THD: B = 1),
// box {64, box_rows, 1, 1} (one 128-byte column slab of box_rows rows), 128B swizzle, zero
// fill out of bounds. `name` is the argument named in errors.
// pack > 1 (packed GQA, Q only; fwd_runs_pack_sm90 in tile_sm90.h): the map is {D, H, rows, B}
// and the box {64, pack, box_rows / pack, 1}: box_rows packed rows (pack heads of box_rows / pack
// positions), which land in shared memory in packed-row order (row r = position r / pack, head
// r % pack), 128 bytes a row as the unpacked box. Coordinates then are (column, first head,
// first row, sample).
CUtensorMap make_tensor_map_sm90(const TensorView& t, bool varlen, DType dtype, int box_rows, const char* name,
                                 int pack = 1);

// The same map of a BSHD tensor of FP8 (one byte an element; strides multiples of 16 elements):
// UINT8 elements, box {box_cols, box_rows, 1, 1} with the swizzle span of its rows, 128B
// (box_cols 128) or 64B (box_cols 64: head dim 64), zero fill out of bounds. The FP8 forward's Q,
// K, and V^T (the pre-pass's workspace as a BSHD-shaped view [B, D_v, H_k, keys]).
CUtensorMap make_tensor_map_fp8_sm90(const TensorView& t, int box_cols, int box_rows, const char* name);

// The map of SDPA's 16-bit additive bias [B|1, H|1, S_q|1, S_kv] (last dimension contiguous, the base
// and the other strides multiples of 16 bytes: params.h SdpaBiasParams::chunks) for the sm90 forward's
// staged tiles (kernel_fwd_sm90.cuh load_bias): a 4-D map {S_kv, S_q, H, B} of extent 1 along every
// dimension the bias broadcasts (size 1, or stride 0: an expanded tensor; the kernel's coordinate
// there is 0), box {64, box_rows, 1, 1} (the forward's 128 query rows, or 1 for a bias broadcast over
// rows), 128B swizzle, zero fill out of bounds. Returns false, *m untouched, when the driver refuses
// the map; the forward then reads that bias element by element.
bool make_tensor_map_bias_sm90(const TensorView& bias, int box_rows, CUtensorMap* m);

// The BSHD view [B, S, H, D] of an SDPA [B, H, S, D] descriptor (make_tensor_map_sm90's form):
// the SDPA launchers' tensor maps (launch_sdpa_fwd_sm90, launch_sdpa_bwd_sm90).
inline TensorView bshd_of_bhsd(const TensorView& t) {
  TensorView v = t;
  v.ndim = 4;
  v.shape = {t.size(0), t.size(2), t.size(1), t.size(3)};
  v.strides = {t.stride(0), t.stride(2), t.stride(1), 1};
  return v;
}

}  // namespace flashspan::sm90
