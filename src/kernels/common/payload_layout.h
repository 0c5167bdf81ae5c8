// Bit order of a partial block's packed predicate ("payload").
//
// One bit per score element of a kRows x kCols tile, placed where the consumer's
// accumulator fragment holds that element, so a kernel thread reads its own
// 32-bit words (coalesced across the warp) and tests bits with compile-time
// indices. Planner and kernels both call payload_position(); they cannot disagree.
//
// Layout kM16N64Frag (the m16n8 accumulator of mma.sync.m16n8k16, which is also
// the per-warp layout of a wgmma m64nN accumulator, HOPPER_BRIEF.md 1.3):
//   the tile is cut into 16-row x 64-column sub-tiles; sub-tile (mt, ct) is 32
//   consecutive words, word `lane` belonging to lane `lane` of the warp that owns
//   rows 16*mt .. 16*mt+15. Inside a sub-tile, element (r, c) with
//     g = r % 8, hi = (r % 16) / 8, j = c / 8 (0..7), q = (c % 8) / 2, e = c % 2
//   lives in lane 4*g + q, bit 4*j + 2*hi + e.
//   (The thread's accumulator registers of column block j are d[4j+2hi+e].)
// Requirements: kRows % 16 == 0, kCols % 32 == 0. A tile whose columns are not a multiple of
// 64 (the 96-key backward tile of the sm90 (192, 128) kernel, tile_sm90.h) has a last 64-column
// sub-tile of which only columns < kCols exist: their bits are those of the full sub-tile, the
// bits of the missing columns are 0 (so each sub-tile is still 32 words: a thread's word index
// does not depend on the tile width's remainder).
// Words per tile: kRows * round_up(kCols, 64) / 32 (payload_words).
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define FS_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define FS_HOST_DEVICE inline
#endif

namespace flashspan {

enum class PayloadLayout : int32_t { kM16N64Frag = 1 };

struct PayloadPos {
  int32_t word;  // word index inside the tile's payload
  int32_t bit;   // bit index inside that word
};

// 64-column sub-tiles of a tile with `cols` columns (the last one possibly partial).
FS_HOST_DEVICE constexpr int payload_subtiles(int cols) { return (cols + 63) >> 6; }

// Position of element (r, c) of a tile with `cols` columns (cols % 32 == 0).
FS_HOST_DEVICE PayloadPos payload_position(int r, int c, int cols) {
  const int mt = r >> 4, ct = c >> 6;
  const int rr = r & 15, cc = c & 63;
  const int g = rr & 7, hi = rr >> 3;
  const int j = cc >> 3, q = (cc & 7) >> 1, e = cc & 1;
  const int lane = 4 * g + q;
  PayloadPos p;
  p.word = (mt * payload_subtiles(cols) + ct) * 32 + lane;
  p.bit = 4 * j + 2 * hi + e;
  return p;
}

FS_HOST_DEVICE constexpr int payload_words(int rows, int cols) { return rows * payload_subtiles(cols) * 2; }

// Bit index inside a lane's word for accumulator register d[4*j + 2*hi + e] of a
// 64-column chunk: the same formula, spelled for the kernel side.
FS_HOST_DEVICE int payload_bit_of_register(int j, int hi, int e) { return 4 * j + 2 * hi + e; }

}  // namespace flashspan
