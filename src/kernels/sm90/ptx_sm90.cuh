// Hopper (sm_90a) instruction wrappers shared by the sm90 kernels (forward and backward):
// mbarriers, the bulk tensor copy (TMA) load, bulk reduce-add, named barriers, proxy fences,
// setmaxnreg, wgmma fences / groups and the shared-memory matrix descriptor; the wgmma forms
// themselves are generated into wgmma_sm90.inc (scripts/gen_wgmma_sm90.py), 16-bit and FP8.
//
// Why raw PTX and not CuTe (nvidia-cutlass headers): the kernels use a handful of Hopper
// instructions, each checked on an H200 (HOPPER_BRIEF.md); written out, the register order of
// every fragment stays explicit, which is what lets the plan's payload words map onto the
// accumulator registers with compile-time bit indices; and the build needs none of CuTe's
// template compile time (the CPU CI builds every CUDA file on 2 cores).
//
// Every wrapper exists only in device code for sm_90 and newer (the kernels test
// __CUDA_ARCH_FEAT_SM90_ALL before using them).
#pragma once

#include <cuda.h>

#include <cstdint>

#include "kernels/common/ptx.cuh"

namespace flashspan::kern90 {

#if defined(__CUDA_ARCH__)

// ---------------------------------------------------------------------------
// mbarrier (PTX ISA 9.0 sec. 9.7.13.15). `bar` is a shared-memory address (smem_u32).
// ---------------------------------------------------------------------------

__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
// Makes the initialisation of the mbarriers visible (to the async proxy and other threads);
// one thread, after its mbar_init calls, before the CTA-wide barrier.
__device__ __forceinline__ void fence_barrier_init() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void mbar_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ bool mbar_try_wait(uint32_t bar, uint32_t parity) {
  uint32_t ok;
  asm volatile(
      "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
      : "=r"(ok)
      : "r"(bar), "r"(parity)
      : "memory");
  return ok != 0;
}
// Waits until the phase of parity `parity` of `bar` has completed. A wait that lasts more
// than ~2^33 cycles (seconds) is a protocol bug: trap rather than hang the device.
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  if (mbar_try_wait(bar, parity)) return;
  const long long t0 = clock64();
  while (!mbar_try_wait(bar, parity)) {
    if (clock64() - t0 > (1ll << 33)) __trap();
  }
}

// ---------------------------------------------------------------------------
// Bulk copies (TMA) and bulk reductions (PTX ISA 9.0 sec. 9.7.9.25)
// ---------------------------------------------------------------------------

// 4-D tile load {c0 innermost .. c3} of `map` into shared memory at `dst`, completing `bytes`
// (the whole box, also where it lies partly out of bounds) on the transaction count of `bar`.
__device__ __forceinline__ void tma_load_4d(uint32_t dst, const CUtensorMap* map, int c0, int c1, int c2, int c3,
                                            uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, "
      "%5}], [%6];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(bar)
      : "memory");
}
// Contiguous bulk load of `bytes` (a multiple of 16; 16-byte aligned addresses) from global
// memory into shared memory at `dst`, completing on the transaction count of `bar`.
__device__ __forceinline__ void bulk_load(uint32_t dst, const void* src, uint32_t bytes, uint32_t bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(dst),
      "l"(src), "r"(bytes), "r"(bar)
      : "memory");
}
__device__ __forceinline__ void prefetch_tensormap(const CUtensorMap* map) {
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
}

// ---------------------------------------------------------------------------
// Tensor maps built on the device (PTX ISA: tensormap.replace, tensormap.cp_fenceproxy,
// fence.proxy.tensormap; sm_90a): a host-encoded map copied into shared
// memory (128-byte aligned), fields replaced there by one thread, the map copied to global memory
// by a whole warp with a release of the tensormap proxy; its user acquires it before a TMA reads it.
// ---------------------------------------------------------------------------

// The map's global base address (16-byte aligned) in the shared copy at `map`.
__device__ __forceinline__ void tensormap_replace_address(uint32_t map, const void* base) {
  asm volatile("tensormap.replace.tile.global_address.shared::cta.b1024.b64 [%0], %1;\n" ::"r"(map),
               "l"(reinterpret_cast<uint64_t>(base))
               : "memory");
}
// The extent (elements, >= 1) of dimension kOrd (0 innermost) in the shared copy at `map`.
template <int kOrd>
__device__ __forceinline__ void tensormap_replace_dim(uint32_t map, uint32_t extent) {
  asm volatile("tensormap.replace.tile.global_dim.shared::cta.b1024.b32 [%0], %1, %2;\n" ::"r"(map), "n"(kOrd),
               "r"(extent)
               : "memory");
}
// The 128-byte map at shared `src` to global `dst`, released to the tensormap proxy at GPU scope;
// every lane of the warp calls it with the same operands (.sync.aligned).
__device__ __forceinline__ void tensormap_copy_release(CUtensorMap* dst, uint32_t src) {
  asm volatile(
      "tensormap.cp_fenceproxy.global.shared::cta.tensormap::generic.release.gpu.sync.aligned [%0], [%1], 128;\n" ::"l"(
          __cvta_generic_to_global(dst)),
      "r"(src)
      : "memory");
}
// Acquires a map written in global memory (tensormap_copy_release, earlier on the stream) for this
// thread's TMA copies through it.
__device__ __forceinline__ void tensormap_acquire(const CUtensorMap* map) {
  asm volatile("fence.proxy.tensormap::generic.acquire.gpu [%0], 128;\n" ::"l"(reinterpret_cast<uint64_t>(map))
               : "memory");
}
// dst[0 .. bytes/4) += src[0 .. bytes/4) in fp32, by the bulk copy engine (one thread issues
// it; 16-byte aligned addresses, bytes a multiple of 16). Completion through bulk groups.
__device__ __forceinline__ void bulk_reduce_add_f32(float* dst, uint32_t src, uint32_t bytes) {
  asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n" ::"l"(dst), "r"(src),
               "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void bulk_commit_group() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }
// Waits until at most N of the thread's bulk groups still read their shared-memory source.
template <int N>
__device__ __forceinline__ void bulk_wait_group_read() {
  asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(N) : "memory");
}
// Waits until at most N of the thread's bulk groups are incomplete (writes done).
template <int N>
__device__ __forceinline__ void bulk_wait_group() {
  asm volatile("cp.async.bulk.wait_group %0;\n" ::"n"(N) : "memory");
}

// ---------------------------------------------------------------------------
// Fences, named barriers, register reallocation
// ---------------------------------------------------------------------------

// Orders this thread's ordinary shared-memory stores before later async-proxy reads (wgmma
// operands, bulk copies); the readers still need a barrier after it.
__device__ __forceinline__ void fence_proxy_async_smem() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
// Orders this thread's async-proxy global accesses (bulk copies and reductions it has waited
// for) with its generic-proxy ones, both ways.
__device__ __forceinline__ void fence_proxy_async_global() {
  asm volatile("fence.proxy.async.global;\n" ::: "memory");
}
// GPU-scope acquire load and release increment of a global int32 counter (ordering counters
// between CTAs).
__device__ __forceinline__ int ld_acquire_gpu(const int32_t* p) {
  int v;
  asm volatile("ld.acquire.gpu.global.b32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void red_release_gpu_add(int32_t* p, int v) {
  asm volatile("red.release.gpu.global.add.s32 [%0], %1;\n" ::"l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ void red_relaxed_gpu_add(int32_t* p, int v) {
  asm volatile("red.relaxed.gpu.global.add.s32 [%0], %1;\n" ::"l"(p), "r"(v) : "memory");
}
// Named barrier `id` (1..15; 0 is __syncthreads') over `count` threads (a multiple of 32).
__device__ __forceinline__ void named_bar_sync(int id, int count) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}
__device__ __forceinline__ void named_bar_arrive(int id, int count) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}
// Register budget of the calling warpgroup (all its warps execute it). Takes effect only when
// the kernel's entry register count is fixed (__launch_bounds__(threads, 1)).
template <int kRegs>
__device__ __forceinline__ void setmaxnreg_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegs) : "memory");
}
template <int kRegs>
__device__ __forceinline__ void setmaxnreg_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegs) : "memory");
}

// ---------------------------------------------------------------------------
// wgmma ordering (PTX ISA 9.0 sec. 9.7.15.4, 9.7.15.7)
// ---------------------------------------------------------------------------

__device__ __forceinline__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wg_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// After a wgmma wait: the accumulator registers are read only after it (the compiler must not
// hoist their reads above the wait).
template <int N>
__device__ __forceinline__ void reg_fence(float (&d)[N][4]) {
#pragma unroll
  for (int i = 0; i < N; ++i) {
#pragma unroll
    for (int r = 0; r < 4; ++r) asm volatile("" : "+f"(d[i][r])::"memory");
  }
}

// 64-bit shared-memory matrix descriptor (PTX ISA 9.0 sec. 9.7.15.5.1.2.2): start address,
// leading / stride byte offsets (>> 4, 14 bits each), base offset 0 (tiles are 1024-aligned),
// swizzle mode (bits 62-63): 1 = 128B (the default, every 16-bit tile), 2 = 64B (the FP8
// forward's 64-byte rows of head dim 64).
__device__ __forceinline__ uint64_t smem_desc(uint32_t addr, uint32_t lbo, uint32_t sbo, uint32_t swizzle = 1) {
  return uint64_t((addr & 0x3FFFF) >> 4) | (uint64_t((lbo & 0x3FFFF) >> 4) << 16) |
         (uint64_t((sbo & 0x3FFFF) >> 4) << 32) | (uint64_t(swizzle) << 62);
}

// The descriptor d of a tile moved `bytes` further (a multiple of 16): only the start-address
// field (bits 0-13, the address >> 4) changes, and without a carry out of it, since every
// shared-memory address is below 256 KB. Build a tile's descriptor once (smem_desc) and step it
// with this: one add on the low word per wgmma, where smem_desc of every step's address costs a
// mask, a shift and an or on top (PERF_LOG v2.21: the descriptor arithmetic was a third of the
// backward's instructions). With a warp-uniform tile address (the warpgroup index broadcast from
// lane 0, consumer_warpgroup) the add runs on the uniform datapath.
__device__ __forceinline__ uint64_t desc_add(uint64_t d, uint32_t bytes) {
  return (d & 0xFFFFFFFF00000000ull) | uint32_t(uint32_t(d) + (bytes >> 4));
}

// The consumer warpgroup index of this thread (threads 128 .. : warpgroup 0, 1, ...), broadcast from
// lane 0 so that the compiler knows it warp-uniform: the descriptor and tile-address arithmetic
// derived from it then runs on the uniform datapath (no R2UR a wgmma), and ptxas need not
// serialise wgmma behind a branch on it (C7520, PERF_LOG v2.20).
__device__ __forceinline__ int consumer_warpgroup() {
  return __shfl_sync(0xffffffffu, int(threadIdx.x - 128) >> 7, 0);
}

// The descriptor swizzle mode of K-major rows of `row_bytes` bytes (the TMA box's inner bytes,
// its swizzle span): 128 -> 1 (128B), 64 -> 2 (64B).
constexpr uint32_t kmajor_swizzle(int row_bytes) { return row_bytes == 128 ? 1u : 2u; }

#include "kernels/sm90/wgmma_sm90.inc"

// The wgmma forms by element type and N, on accumulators held as kN / 8 n8 blocks of 4 floats
// (the m64nN fp32 accumulator, HOPPER_BRIEF.md 1.3): acc (+)= A B.
// SS, both operands K-major (kN 32, 64 or 128); scale_d = 0 overwrites acc.
template <int kN, class E>
__device__ __forceinline__ void wgmma_ss(float (&acc)[kN / 8][4], uint64_t da, uint64_t db, int scale_d) {
  static_assert(kN == 32 || kN == 64 || kN == 128, "wgmma_ss: N 32, 64 or 128");
  float(&d)[kN / 2] = *reinterpret_cast<float(*)[kN / 2]>(&acc[0][0]);
  constexpr bool bf16 = E::kDType == DType::kBFloat16;
  if constexpr (kN == 128) {
    if constexpr (bf16) wgmma_ss_m64n128k16_bf16(d, da, db, scale_d); else wgmma_ss_m64n128k16_f16(d, da, db, scale_d);
  } else if constexpr (kN == 64) {
    if constexpr (bf16) wgmma_ss_m64n64k16_bf16(d, da, db, scale_d); else wgmma_ss_m64n64k16_f16(d, da, db, scale_d);
  } else {
    if constexpr (bf16) wgmma_ss_m64n32k16_bf16(d, da, db, scale_d); else wgmma_ss_m64n32k16_f16(d, da, db, scale_d);
  }
}
// acc = A B over kK / 16 k16 steps with both operands K-major 128B-swizzled tiles stored as
// 64-column slabs of kASlab / kBSlab bytes (TMA's layout): a k16 step is 32 bytes inside a slab,
// the next slab every 4 steps. The S = Q K^T form of the forward and the S^T, dP^T forms of the
// backward.
template <int kN, int kK, int kASlab, int kBSlab, class E>
__device__ __forceinline__ void wgmma_ss_kmajor(float (&acc)[kN / 8][4], uint32_t a_tile, uint32_t b_tile) {
  const uint64_t da = smem_desc(a_tile, 16, 1024), db = smem_desc(b_tile, 16, 1024);
#pragma unroll
  for (int kk = 0; kk < kK / 16; ++kk) {
    const uint32_t offa = (kk >> 2) * kASlab + 32 * (kk & 3);
    const uint32_t offb = (kk >> 2) * kBSlab + 32 * (kk & 3);
    wgmma_ss<kN, E>(acc, desc_add(da, offa), desc_add(db, offb), kk > 0);
  }
}
// RS: A (64 x 16) from four registers, B N-major (kN 64, 128 or 256); accumulates.
template <int kN, class E>
__device__ __forceinline__ void wgmma_rs_tnspb(float (&acc)[kN / 8][4], const uint32_t (&a)[4], uint64_t db) {
  static_assert(kN == 64 || kN == 128 || kN == 256, "wgmma_rs_tnspb: N 64, 128 or 256");
  float(&d)[kN / 2] = *reinterpret_cast<float(*)[kN / 2]>(&acc[0][0]);
  constexpr bool bf16 = E::kDType == DType::kBFloat16;
  if constexpr (kN == 256) {
    if constexpr (bf16) wgmma_rs_m64n256k16_bf16_tnspb(d, a, db, 1); else wgmma_rs_m64n256k16_f16_tnspb(d, a, db, 1);
  } else if constexpr (kN == 128) {
    if constexpr (bf16) wgmma_rs_m64n128k16_bf16_tnspb(d, a, db, 1); else wgmma_rs_m64n128k16_f16_tnspb(d, a, db, 1);
  } else {
    if constexpr (bf16) wgmma_rs_m64n64k16_bf16_tnspb(d, a, db, 1); else wgmma_rs_m64n64k16_f16_tnspb(d, a, db, 1);
  }
}
// SS, A M-major and B N-major (kN 32, 64 or 128); scale_d = 0 overwrites acc.
template <int kN, class E>
__device__ __forceinline__ void wgmma_ss_tnspab(float (&acc)[kN / 8][4], uint64_t da, uint64_t db, int scale_d) {
  static_assert(kN == 32 || kN == 64 || kN == 128, "wgmma_ss_tnspab: N 32, 64 or 128");
  float(&d)[kN / 2] = *reinterpret_cast<float(*)[kN / 2]>(&acc[0][0]);
  constexpr bool bf16 = E::kDType == DType::kBFloat16;
  if constexpr (kN == 128) {
    if constexpr (bf16) wgmma_ss_m64n128k16_bf16_tnspab(d, da, db, scale_d); else wgmma_ss_m64n128k16_f16_tnspab(d, da, db, scale_d);
  } else if constexpr (kN == 64) {
    if constexpr (bf16) wgmma_ss_m64n64k16_bf16_tnspab(d, da, db, scale_d); else wgmma_ss_m64n64k16_f16_tnspab(d, da, db, scale_d);
  } else {
    if constexpr (bf16) wgmma_ss_m64n32k16_bf16_tnspab(d, da, db, scale_d); else wgmma_ss_m64n32k16_f16_tnspab(d, da, db, scale_d);
  }
}
// SS, A K-major and B N-major (kN 32, 64 or 128); scale_d = 0 overwrites acc.
template <int kN, class E>
__device__ __forceinline__ void wgmma_ss_tnspb(float (&acc)[kN / 8][4], uint64_t da, uint64_t db, int scale_d) {
  static_assert(kN == 32 || kN == 64 || kN == 128, "wgmma_ss_tnspb: N 32, 64 or 128");
  float(&d)[kN / 2] = *reinterpret_cast<float(*)[kN / 2]>(&acc[0][0]);
  constexpr bool bf16 = E::kDType == DType::kBFloat16;
  if constexpr (kN == 128) {
    if constexpr (bf16) wgmma_ss_m64n128k16_bf16_tnspb(d, da, db, scale_d); else wgmma_ss_m64n128k16_f16_tnspb(d, da, db, scale_d);
  } else if constexpr (kN == 64) {
    if constexpr (bf16) wgmma_ss_m64n64k16_bf16_tnspb(d, da, db, scale_d); else wgmma_ss_m64n64k16_f16_tnspb(d, da, db, scale_d);
  } else {
    if constexpr (bf16) wgmma_ss_m64n32k16_bf16_tnspb(d, da, db, scale_d); else wgmma_ss_m64n32k16_f16_tnspb(d, da, db, scale_d);
  }
}

// FP8 (E: Float8E4M3 / Float8E5M2; k32 steps of 32 bytes; both operands K-major, HOPPER_BRIEF.md
// 1.1): SS with kN = 128 (S = Q K^T); scale_d = 0 overwrites acc.
template <int kN, class E>
__device__ __forceinline__ void wgmma_ss_fp8(float (&acc)[kN / 8][4], uint64_t da, uint64_t db, int scale_d) {
  static_assert(kN == 128 && E::kBits == 8, "wgmma_ss_fp8: N 128, FP8 element types");
  float(&d)[kN / 2] = *reinterpret_cast<float(*)[kN / 2]>(&acc[0][0]);
  if constexpr (E::kFp8Format == 2) wgmma_ss_m64n128k32_e5m2(d, da, db, scale_d); else wgmma_ss_m64n128k32_e4m3(d, da, db, scale_d);
}
// RS: A (64 x 32 bytes) from four registers of four FP8 elements, B K-major (kN 64, 128 or 256);
// accumulates.
template <int kN, class E>
__device__ __forceinline__ void wgmma_rs_fp8(float (&acc)[kN / 8][4], const uint32_t (&a)[4], uint64_t db) {
  static_assert((kN == 64 || kN == 128 || kN == 256) && E::kBits == 8, "wgmma_rs_fp8: N 64, 128 or 256, FP8 types");
  float(&d)[kN / 2] = *reinterpret_cast<float(*)[kN / 2]>(&acc[0][0]);
  constexpr bool e5 = E::kFp8Format == 2;
  if constexpr (kN == 256) {
    if constexpr (e5) wgmma_rs_m64n256k32_e5m2(d, a, db, 1); else wgmma_rs_m64n256k32_e4m3(d, a, db, 1);
  } else if constexpr (kN == 128) {
    if constexpr (e5) wgmma_rs_m64n128k32_e5m2(d, a, db, 1); else wgmma_rs_m64n128k32_e4m3(d, a, db, 1);
  } else {
    if constexpr (e5) wgmma_rs_m64n64k32_e5m2(d, a, db, 1); else wgmma_rs_m64n64k32_e4m3(d, a, db, 1);
  }
}
// acc = A B over kKBytes / 32 k32 steps, both operands K-major swizzled FP8 tiles of rows of
// kRowBytes bytes (128: 128B swizzle; 64: 64B swizzle, the whole row of head dim 64), stored as
// column slabs of kASlab / kBSlab bytes (TMA's layout, one slab a kRowBytes-wide box): a k32 step
// is 32 bytes inside a row, the next slab every kRowBytes / 32 steps; SBO = 8 rows.
template <int kN, int kKBytes, int kRowBytes, int kASlab, int kBSlab, class E>
__device__ __forceinline__ void wgmma_ss_kmajor_fp8(float (&acc)[kN / 8][4], uint32_t a_tile, uint32_t b_tile) {
  static_assert(kRowBytes == 128 || kRowBytes == 64, "wgmma_ss_kmajor_fp8: 64- or 128-byte rows");
  constexpr int kSteps = kRowBytes / 32;  // k32 steps a slab
  constexpr uint32_t kSwz = kmajor_swizzle(kRowBytes);
  const uint64_t da = smem_desc(a_tile, 16, 8 * kRowBytes, kSwz), db = smem_desc(b_tile, 16, 8 * kRowBytes, kSwz);
#pragma unroll
  for (int kk = 0; kk < kKBytes / 32; ++kk) {
    const uint32_t offa = (kk / kSteps) * kASlab + 32 * (kk % kSteps);
    const uint32_t offb = (kk / kSteps) * kBSlab + 32 * (kk % kSteps);
    wgmma_ss_fp8<kN, E>(acc, desc_add(da, offa), desc_add(db, offb), kk > 0);
  }
}

#endif  // __CUDA_ARCH__

}  // namespace flashspan::kern90
