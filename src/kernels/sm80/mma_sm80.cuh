// mma.sync wrappers of the sm80 family (the fragment-level PTX); the ldmatrix wrappers it uses are
// common/ptx.cuh's (the sm90 backward reads its staged bias with them too).
//
//   mma_16816        mma.sync.aligned.m16n8k16.row.col.f32.{bf16,f16}.{bf16,f16}.f32
//
// Fragment layouts (PTX ISA, "Matrix fragments for mma.m16n8k16"), g = lane / 4, t = lane % 4:
//   A (16x16, row major), 4 x .b32 of two 16-bit values each:
//     a0 = (g, 2t..2t+1)  a1 = (g+8, 2t..)  a2 = (g, 2t+8..)  a3 = (g+8, 2t+8..)
//   B (16x8, "col": element (k, n)), 2 x .b32:  b0 = (k = 2t..2t+1, n = g)  b1 = (k = 2t+8.., n = g)
//   C/D (16x8 fp32): d0,d1 = (g, 2t..2t+1)   d2,d3 = (g+8, 2t..2t+1)
#pragma once

#include <cstdint>

#include "kernels/common/ptx.cuh"

namespace flashspan::kern {

// D = A * B + D in fp32; the element type E (core/element_type.h) picks the input type.
template <class E>
__device__ __forceinline__ void mma_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  static_assert(E::kDType == DType::kBFloat16 || E::kDType == DType::kFloat16, "mma_16816: fp16/bf16 inputs only");
  if constexpr (E::kDType == DType::kBFloat16) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

}  // namespace flashspan::kern
