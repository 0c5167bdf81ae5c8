// From tensor views to the kernels' addressing (TensorAddr, kernels/params.h), and the
// alignment rule of the 16-byte vector loads every kernel family uses.
#pragma once

#include <cstdint>

#include "core/error.h"
#include "core/tensor_view.h"
#include "kernels/params.h"

namespace flashspan {

// Strides of a q/k/v/o-like tensor: BSHD [B,S,H,D] or THD [T,H,D].
inline TensorAddr qkv_addr(const TensorView& t, bool varlen) {
  TensorAddr a;
  if (varlen) {
    a.batch_stride = 0;
    a.row_stride = t.stride(0);
    a.head_stride = t.stride(1);
  } else {
    a.batch_stride = t.stride(0);
    a.row_stride = t.stride(1);
    a.head_stride = t.stride(2);
  }
  return a;
}

// Strides of an LSE-like fp32 tensor: BSHD [B,Hq,Sq] or THD [Hq,Tq].
inline TensorAddr lse_addr(const TensorView& t, bool varlen) {
  TensorAddr a;
  if (varlen) {
    a.batch_stride = 0;
    a.head_stride = t.stride(0);
    a.row_stride = t.stride(1);
  } else {
    a.batch_stride = t.stride(0);
    a.head_stride = t.stride(1);
    a.row_stride = t.stride(2);
  }
  return a;
}

// The kernels move 16-byte chunks (8 elements): data pointers must be 16-byte aligned and
// every stride but the last a multiple of 8 elements.
inline void check_vec_aligned(const TensorView& t, const char* name) {
  FS_CHECK_SUPPORTED(reinterpret_cast<uintptr_t>(t.data) % 16 == 0, name,
                     ": data pointer must be 16-byte aligned for the GPU kernels");
  for (int d = 0; d + 1 < t.ndim; ++d) {
    FS_CHECK_SUPPORTED(t.shape[d] <= 1 || t.strides[d] % 8 == 0, name, ": stride ", t.strides[d], " of dimension ",
                       d, " must be a multiple of 8 elements for the GPU kernels");
  }
}

}  // namespace flashspan
