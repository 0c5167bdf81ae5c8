// Shared-memory tiles of 16-bit elements and the loads/fragment reads on them.
//
// A tile is kRows x kD elements (kD % 64 == 0), row major, cut into 16-byte chunks of 8
// elements; chunk c of row r is stored at chunk position c ^ (r % 8) of that row. The
// XOR swizzle puts the 8 rows an ldmatrix phase reads (same chunk column, 8 consecutive
// rows) into 8 different 16-byte bank groups, so neither cp.async writes nor ldmatrix
// reads conflict.
#pragma once

#include <cstdint>

#include "kernels/sm80/mma_sm80.cuh"

namespace flashspan::kern {

// Element offset of (row, chunk) in a swizzled tile with kD columns.
template <int kD>
__device__ __forceinline__ int swz_offset(int row, int chunk) {
  return row * kD + ((chunk ^ (row & 7)) << 3);
}

// A one-warp copy's shared-memory destinations (load_tile_async, gather_tile_async: 8 threads a row,
// 4 rows a step): rows r0 + 4 it have the swizzle key r0 (it even) or r0 ^ 4 (odd), and chunk
// c0 + 8 j of such a row lands at 8 j + (c0 ^ key). key[it & 1] + (it 4 kD + 64 j) 2 bytes is
// the address of chunk c0 + 8 j of row r0 + 4 it (c0 < 8; key[0] alone, for any r0, serves copies
// whose rows all share r0's key).
template <int kD>
__device__ __forceinline__ void swz_pair_dst(uint32_t (&key)[2], uint32_t smem_tile, int r0, int c0) {
  key[0] = smem_tile + uint32_t(swz_offset<kD>(r0, c0) * 2);
  key[1] = smem_tile + uint32_t(swz_offset<kD>(r0 + 4, c0) * 2) - uint32_t(4 * kD * 2);
}

// Asynchronously copies rows [0, rows_valid) x columns [0, d_valid) of a global matrix
// (row stride in elements, columns contiguous) into a swizzled tile; the rest of the tile
// is zero-filled without reading global memory. `gbase` (row 0 of the tile) must be a valid
// address: zero-filling copies point there and read nothing.
// A thread copies the same 16-byte column chunk of rows r0, r0 + R, r0 + 2R, ... (R = threads
// per chunk column); with R % 8 == 0 the swizzle of those rows is the same, so addresses are
// a base plus compile-time steps.
// One warp (kThreads = 32, the decode forward tile): 8 threads per row, 4 rows per step; it
// copies chunks c0, c0 + 8, ... of rows r0, r0 + 4, ... (c0 = tid % 8, r0 = tid / 8), so a
// warp's copy covers whole 128-byte lines (4 sectors an L2 request; 4 threads per row, the
// first form, asked for half lines: twice the L2 requests, L2 at 90 % of its throughput for 78 %
// of DRAM's, PERF_LOG v2.26). A thread's rows alternate between two swizzle keys (r0, r0 ^ 4):
// two shared-memory offsets per thread, one source pointer stepped by 4 rows. (The element-wise
// fallback below would make ptxas keep a 64-bit source offset per copy, 2 x 32 of them for a
// 64 x 128 tile, live across the forward's main loop: 255 registers and spills.)
template <int kRows, int kD, int kThreads>
__device__ __forceinline__ void load_tile_async(uint32_t smem_tile, const uint16_t* gbase, int64_t row_stride,
                                                int rows_valid, int d_valid, int tid) {
  constexpr int kChunksPerRow = kD / 8;
  if constexpr (kThreads == 32 && kChunksPerRow % 8 == 0 && kRows % 8 == 0) {
    constexpr int kCpt = kChunksPerRow / 8;
    const int c0 = tid % 8, r0 = tid / 8;
    const uint16_t* src = gbase + r0 * row_stride + c0 * 8;
    const int64_t step = 4 * row_stride;
    uint32_t dst[2];
    swz_pair_dst<kD>(dst, smem_tile, r0, c0);
#pragma unroll
    for (int it = 0; it < kRows / 4; ++it) {
      const bool row_ok = r0 + 4 * it < rows_valid;
#pragma unroll
      for (int j = 0; j < kCpt; ++j) {
        const bool ok = row_ok && (c0 + 8 * j) * 8 < d_valid;
        cp_async_16(dst[it & 1] + uint32_t((it * 4 * kD + 64 * j) * 2), ok ? src + 64 * j : gbase, ok);
      }
      src += step;
    }
  } else if constexpr (kThreads % kChunksPerRow == 0 && (kThreads / kChunksPerRow) % 8 == 0 &&
                       kRows % (kThreads / kChunksPerRow) == 0) {
    constexpr int kR = kThreads / kChunksPerRow;
    const int ch = tid % kChunksPerRow, r0 = tid / kChunksPerRow;
    const bool col_ok = ch * 8 < d_valid;
    const uint16_t* src = gbase + r0 * row_stride + ch * 8;
    const uint32_t dst = smem_tile + swz_offset<kD>(r0, ch) * 2;
#pragma unroll
    for (int it = 0; it < kRows / kR; ++it) {
      const bool ok = col_ok && r0 + it * kR < rows_valid;
      cp_async_16(dst + it * kR * kD * 2, ok ? src + it * kR * row_stride : gbase, ok);
    }
  } else {
    constexpr int kTotal = kRows * kChunksPerRow;
#pragma unroll
    for (int it = 0; it < (kTotal + kThreads - 1) / kThreads; ++it) {
      const int idx = it * kThreads + tid;
      if (kTotal % kThreads == 0 || idx < kTotal) {
        const int row = idx / kChunksPerRow;
        const int ch = idx % kChunksPerRow;
        const bool ok = row < rows_valid && ch * 8 < d_valid;
        cp_async_16(smem_tile + swz_offset<kD>(row, ch) * 2, ok ? gbase + row * row_stride + ch * 8 : gbase, ok);
      }
    }
  }
}

// load_tile_async's fast layout for tiles loaded again and again from one matrix (the same
// row stride and column count, a new row offset each time), with the per-thread addressing
// computed once: init(), then per tile load_full() when all kRows rows are valid (one 64-bit
// add per chunk) or load_partial() (row checks). The copies, predicates and zero fills are
// exactly load_tile_async's; only where its fast layout applies (kApplies). `gthr` = gbase +
// offset(): the thread's first source chunk when gbase is row 0 of a tile; a thread whose
// chunk lies at or past d_valid gets offset 0 and step 0, so its zero-filling copies point
// at gbase, as in load_tile_async.
template <int kRows, int kD, int kThreads>
struct TileRowLoader {
  static constexpr int kChunksPerRow = kD / 8;
  static constexpr bool kApplies = kThreads % kChunksPerRow == 0 && (kThreads / kChunksPerRow) % 8 == 0 &&
                                   kRows % (kThreads / kChunksPerRow) == 0;
  static constexpr int kR = kApplies ? kThreads / kChunksPerRow : 1;
  int64_t off, step;  // elements: the thread's first chunk; kR rows
  uint32_t dst;       // bytes from the tile start: the thread's first chunk
  bool col_ok;

  __device__ __forceinline__ void init(int64_t row_stride, int d_valid, int tid) {
    const int ch = tid % kChunksPerRow, r0 = tid / kChunksPerRow;
    col_ok = ch * 8 < d_valid;
    off = col_ok ? r0 * row_stride + ch * 8 : 0;
    step = col_ok ? kR * row_stride : 0;
    dst = uint32_t(swz_offset<kD>(r0, ch) * 2);
  }
  __device__ __forceinline__ int64_t offset() const { return off; }
  // All kRows rows of the tile valid; gthr = row 0 of the tile + offset().
  __device__ __forceinline__ void load_full(uint32_t smem_tile, const uint16_t* gthr) const {
    static_assert(kApplies);
#pragma unroll
    for (int it = 0; it < kRows / kR; ++it) {
      cp_async_16(smem_tile + dst + it * kR * kD * 2, gthr + it * step, col_ok);
    }
  }
  // Rows [0, rows_valid) valid (rows_valid < kRows): as load_full, rows at or past rows_valid
  // zero-filled with their copies pointing at gbase (row 0 of the tile), as in load_tile_async.
  __device__ __forceinline__ void load_partial(uint32_t smem_tile, const uint16_t* gthr, const uint16_t* gbase,
                                               int rows_valid, int tid) const {
    static_assert(kApplies);
    const int r0 = tid / kChunksPerRow;
#pragma unroll
    for (int it = 0; it < kRows / kR; ++it) {
      const bool ok = col_ok && r0 + it * kR < rows_valid;
      cp_async_16(smem_tile + dst + it * kR * kD * 2, ok ? gthr + it * step : gbase, ok);
    }
  }
};

// A second fast layout for tiles loaded again and again from one matrix, for tile shapes
// TileRowLoader's layout does not divide (kD = 192 or 256 with 128 threads): 8 threads per
// row, thread tid copying chunks c0, c0 + 8, ... (c0 = tid % 8) of rows r0, r0 + kR, ...
// (r0 = tid / 8, kR = kThreads / 8). With kR % 8 == 0 every row of a thread has the swizzle
// key r0 % 8, and chunk c0 + 8j lands at chunk position 8j + (c0 ^ r0 % 8): one shared-memory
// offset per thread plus compile-time steps, one 64-bit source base per row step (the chunk
// steps are immediates). Same copies, predicates and zero fills as load_tile_async (a
// chunk at or past d_valid or a row at or past rows_valid is zero-filled from gbase).
// `gthr` = row 0 of the tile + offset(); gbase = gthr - offset().
template <int kRows, int kD, int kThreads>
struct TileRowLoader8 {
  static constexpr int kChunksPerRow = kD / 8;
  static constexpr int kCpt = kChunksPerRow / 8;  // chunks of a row per thread
  static constexpr int kR = kThreads / 8;
  static constexpr bool kApplies = kThreads % 64 == 0 && kChunksPerRow % 8 == 0 && kRows % kR == 0;
  static_assert(kCpt <= 32);
  int64_t off, step;  // elements: the thread's first chunk (row r0, chunk c0); kR rows
  uint32_t dst;       // bytes from the tile start: the thread's first chunk
  uint32_t col_ok;    // bit j: chunk c0 + 8j lies below d_valid

  __device__ __forceinline__ void init(int64_t row_stride, int d_valid, int tid) {
    const int c0 = tid % 8, r0 = tid / 8;
    constexpr uint32_t kAll = kCpt == 32 ? 0xffffffffu : (1u << kCpt) - 1u;
    uint32_t m = 0;
#pragma unroll
    for (int j = 0; j < kCpt; ++j) m |= uint32_t((c0 + 8 * j) * 8 < d_valid) << j;
    col_ok = d_valid >= kD ? kAll : m;
    off = r0 * row_stride + c0 * 8;
    step = kR * row_stride;
    dst = uint32_t(swz_offset<kD>(r0, c0) * 2);
  }
  __device__ __forceinline__ int64_t offset() const { return off; }
  // All kRows rows of the tile valid.
  __device__ __forceinline__ void load_full(uint32_t smem_tile, const uint16_t* gthr) const {
    static_assert(kApplies);
    const uint16_t* gbase = gthr - off;
#pragma unroll
    for (int it = 0; it < kRows / kR; ++it) {
#pragma unroll
      for (int j = 0; j < kCpt; ++j) {
        const bool ok = (col_ok >> j) & 1u;
        cp_async_16(smem_tile + dst + it * kR * kD * 2 + j * 128, ok ? gthr + it * step + 64 * j : gbase, ok);
      }
    }
  }
  // Rows [0, rows_valid) valid (rows_valid < kRows); the rest zero-filled.
  __device__ __forceinline__ void load_partial(uint32_t smem_tile, const uint16_t* gthr, int rows_valid,
                                               int tid) const {
    static_assert(kApplies);
    const uint16_t* gbase = gthr - off;
    const int r0 = tid / 8;
#pragma unroll
    for (int it = 0; it < kRows / kR; ++it) {
      const bool row_ok = r0 + it * kR < rows_valid;
#pragma unroll
      for (int j = 0; j < kCpt; ++j) {
        const bool ok = row_ok && ((col_ok >> j) & 1u);
        cp_async_16(smem_tile + dst + it * kR * kD * 2 + j * 128, ok ? gthr + it * step + 64 * j : gbase, ok);
      }
    }
  }
};

// 16 bytes of 0xFF (NaN in fp16 / bf16) to shared memory: a tile row that must not be read from
// global memory but must not look like data either (a paged load's bad page-table entry).
__device__ __forceinline__ void st_shared_nan16(uint32_t dst) {
  asm volatile("st.shared.v4.u32 [%0], {%1, %1, %1, %1};\n" ::"r"(dst), "r"(0xffffffffu) : "memory");
}

// Gathers rows [0, rows_valid) x columns [0, d_valid) of a K or V tile whose rows lie anywhere
// (a paged cache): tile row r is key key0 + r at gbase + off, with off from the K/V address
// role, row_offset(key0 + r, off) (a functor over kv_addr.cuh PagedKv::row_offset). Rows at or past
// rows_valid are zero-filled without reading global memory and without asking the role (keys
// past a sample have no valid page-table entry); a row whose entry the role refuses (outside
// the container) reads nothing and is filled with NaN by plain shared stores, so a broken page
// table shows in the output instead of reading out of bounds. Layout of TileRowLoader8: 8
// threads per row, rows r0, r0 + kR, ... (kR = kThreads / 8; a multiple of 8 gives every row of
// a thread the swizzle key r0 % 8) and chunks c0, c0 + 8, ... of each: one address lookup
// per row and thread (kRows / kR of them), one shared-memory offset per thread. One warp (the
// decode tile): kR = 4, so a thread's rows alternate between the swizzle keys r0 and r0 ^ 4 (two
// offsets; whole 128-byte lines per copy, as load_tile_async's one-warp layout), and the lanes
// resolve the tile's rows together (one lookup a lane per 32 rows, shuffled to the row's
// threads): with a lookup per row and thread (16 of them) the paged decode ran 0.74x the dense
// one, PERF_LOG v2.26.
template <int kRows, int kD, int kThreads, class RowOffset>
__device__ __forceinline__ void gather_tile_async(uint32_t smem_tile, const uint16_t* gbase, const RowOffset& row_offset,
                                                  int key0, int rows_valid, int d_valid, int tid) {
  constexpr int kTpr = 8;                // threads per row
  constexpr int kCpt = kD / 8 / kTpr;     // chunks of a row per thread
  constexpr int kR = kThreads / kTpr;     // rows per step: 4 (one warp) or a multiple of 8
  static_assert(kD % (8 * kTpr) == 0 && (kR == 4 || kR % 8 == 0) && kRows % kR == 0, "gather tile geometry");
  const int c0 = tid % kTpr, r0 = tid / kTpr;
  // Steps it with key r0 (every step when kR % 8 == 0: key[0]) and r0 ^ 4 (odd steps when kR = 4).
  uint32_t dsts[2];
  swz_pair_dst<kD>(dsts, smem_tile, r0, c0);
  // One warp: lane l resolves rows l, l + 32, ... at once (kRows / 32 lookups in flight, rather than
  // kRows / 4 one after the other), the thread of row r takes its offset from lane r % 32;
  // -1: a row past rows_valid, -2: a refused entry.
  [[maybe_unused]] int64_t lane_off[kThreads == 32 ? kRows / 32 : 1];
  if constexpr (kThreads == 32) {
    static_assert(kRows % 32 == 0, "gather tile geometry");
#pragma unroll
    for (int q = 0; q < kRows / 32; ++q) {
      const int r = tid + 32 * q;
      int64_t off = -1;
      if (r < rows_valid && !row_offset(key0 + r, off)) off = -2;
      lane_off[q] = off;
    }
  }
#pragma unroll
  for (int it = 0; it < kRows / kR; ++it) {
    const uint32_t dst = dsts[kR == 4 ? (it & 1) : 0];
    const int r = r0 + it * kR;
    int64_t off = 0;
    bool row_ok, bad;
    if constexpr (kThreads == 32) {
      // Row r0 + 4 it sits in lane_off[it / 8] of lane r0 + 4 (it % 8).
      const int src_lane = r0 + 4 * (it % 8);
      // Two 32-bit shuffles (the long long overload of __shfl_sync added 192 instructions to the paged
      // decode kernels).
      const int64_t x = lane_off[it / 8];
      off = int64_t((uint64_t(uint32_t(__shfl_sync(0xffffffffu, int32_t(x >> 32), src_lane))) << 32) |
                    uint32_t(__shfl_sync(0xffffffffu, int32_t(x), src_lane)));
      bad = off == -2;
      row_ok = off >= 0;
      if (!row_ok) off = 0;
    } else {
      row_ok = r < rows_valid;
      bad = false;
      if (row_ok) {
        bad = !row_offset(key0 + r, off);
        row_ok = !bad;
      }
    }
    const uint16_t* src = gbase + off + c0 * 8;
#pragma unroll
    for (int j = 0; j < kCpt; ++j) {
      // Chunk c0 + 8 j keeps the swizzle's low bits, so dst + a compile-time step.
      const uint32_t d = dst + uint32_t((it * kR * kD + 64 * j) * 2);
      if (bad) {
        st_shared_nan16(d);
      } else {
        const bool ok = row_ok && (c0 + kTpr * j) * 8 < d_valid;
        cp_async_16(d, ok ? src + 8 * kTpr * j : gbase, ok);
      }
    }
  }
}

// Per-thread ldmatrix addresses into a swizzled tile, with the swizzle folded so that every
// fragment of an unrolled loop is one register plus an immediate offset.
//
// A fragment read touches, for 16-column step j (columns cb*8 + 16j ..), the thread's chunk
// u = cb + 2j + c (c = 0 or 1, cb even) of row r0 + dr, where r0 is the thread's row and dr a
// multiple of 8 (so the row's swizzle key r0 % 8 is fixed). Its physical chunk is
//   u ^ (r0 % 8) = (u & ~7) + ((u & 7) ^ (r0 % 8)),
// and u + 8 maps to that + 8, so four per-thread values (j = 0..3) cover every j; the rest
// is compile-time.
template <int kD>
struct LdsmAddr {
  uint32_t sw[4];
  __device__ __forceinline__ void init(uint32_t tile, int r0, int c, int cb = 0) {
    const uint32_t base = tile + uint32_t(r0 * kD * 2);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int u = cb + 2 * j + c;
      sw[j] = base + uint32_t(((u & ~7) + ((u & 7) ^ (r0 & 7))) << 4);
    }
  }
  __device__ __forceinline__ uint4 pack() const { return make_uint4(sw[0], sw[1], sw[2], sw[3]); }
  __device__ __forceinline__ static LdsmAddr unpack(const uint4& v) { return LdsmAddr{{v.x, v.y, v.z, v.w}}; }
  // Byte address for 16-column step j and row offset dr (a multiple of 8).
  __device__ __forceinline__ uint32_t at(int j, int dr) const {
    return sw[j & 3] + uint32_t((j >> 2) * 128 + dr * kD * 2);
  }
};

// The four fragment kinds (ptx.cuh has the register layouts; ldmatrix matrix i is given by
// lanes 8i..8i+7):
//   A        16x16 A fragment of rows m0.., columns k0.. (ldmatrix):
//            matrices (rows, cols) = (0-7, 0-7), (8-15, 0-7), (0-7, 8-15), (8-15, 8-15);
//            r0 = lane % 16, c = lane / 16;                                  at(k0/16, m0)
//   A trans  A(m, k) = tile(k0 + k, m0 + m) (ldmatrix.trans):
//            r0 = lane % 8 + 8 (lane / 16), c = (lane / 8) % 2;              at(m0/16, k0)
//   B nk     B fragments of n8 blocks n0, n0+8 with B(k, n) = tile(n, k) (ldmatrix; regs
//            0,1 = block n0, regs 2,3 = block n0+8): r0 = lane % 8 + 8 (lane / 16),
//            c = (lane / 8) % 2;                                              at(k0/16, n0)
//   B kn     the same with B(k, n) = tile(k, n) (ldmatrix.trans):
//            r0 = lane % 8 + 8 ((lane / 8) % 2), c = lane / 16;               at(n0/16, k0)
// `cb` (even) shifts the column steps by cb chunks (a warp's column range inside the tile).
template <int kD>
__device__ __forceinline__ LdsmAddr<kD> ldsm_a(uint32_t tile, int lane, int cb = 0) {
  LdsmAddr<kD> a;
  a.init(tile, lane & 15, lane >> 4, cb);
  return a;
}
template <int kD>
__device__ __forceinline__ LdsmAddr<kD> ldsm_a_trans(uint32_t tile, int lane, int cb = 0) {
  LdsmAddr<kD> a;
  a.init(tile, (lane & 7) + ((lane >> 4) << 3), (lane >> 3) & 1, cb);
  return a;
}
template <int kD>
__device__ __forceinline__ LdsmAddr<kD> ldsm_b_nk(uint32_t tile, int lane, int cb = 0) {
  LdsmAddr<kD> a;
  a.init(tile, (lane & 7) + ((lane >> 4) << 3), (lane >> 3) & 1, cb);
  return a;
}
template <int kD>
__device__ __forceinline__ LdsmAddr<kD> ldsm_b_kn(uint32_t tile, int lane, int cb = 0) {
  LdsmAddr<kD> a;
  a.init(tile, (lane & 7) + (((lane >> 3) & 1) << 3), lane >> 4, cb);
  return a;
}

// acc[n] += A * B for one warp's 16 rows: A (16 x 16*kSteps) from `a` (an ldsm_a address),
// B (16*kSteps x 8*kN) from `b` (an ldsm_b_nk address), one k16 step at a time. Steps at or
// past `k_valid` columns (a run-time head dim smaller than the tile's) are skipped unless
// kExact. kN is even: each B fragment read serves two n8 blocks.
template <int kSteps, int kN, bool kExact, class E, int kDa, int kDb>
__device__ __forceinline__ void warp_mma_a_bnk(float (&acc)[kN][4], const LdsmAddr<kDa>& a, const LdsmAddr<kDb>& b,
                                               int k_valid) {
  static_assert(kN % 2 == 0, "two n8 blocks per B fragment");
#pragma unroll
  for (int kk = 0; kk < kSteps; ++kk) {
    if (kExact || kk * 16 < k_valid) {
      uint32_t af[4];
      ldmatrix_x4(af, a.at(kk, 0));
#pragma unroll
      for (int n = 0; n < kN; n += 2) {
        uint32_t bf[4];
        ldmatrix_x4(bf, b.at(kk, n * 8));
        mma_16816<E>(acc[n], af, bf[0], bf[1]);
        mma_16816<E>(acc[n + 1], af, bf[2], bf[3]);
      }
    }
  }
}

}  // namespace flashspan::kern
