// One 32-bit payload word of a partial block, computed straight from the row endpoints
// (the CUDA planner's payload pass; host-callable so CPU tests can check it exhaustively
// against payload_position()).
#pragma once

#include <cstdint>

#include "kernels/common/payload_layout.h"
#include "plan/packed_rows.h"

namespace flashspan {

// Word w of the payload of a tile with `bk` columns (bk % 32 == 0) whose first key is
// `col0` (sample-local). Endpoint f of tile row r is ep.row(r)[f * ep.stride]
// (packed_rows.h). Rows >= `rows` (past the sample) give 0 bits.
//
// payload_layout.h inverted: word w = (mt * payload_subtiles(bk) + ct) * 32 + lane, lane = 4g + q,
// holds rows 16*mt + g (hi = 0) and 16*mt + 8 + g (hi = 1), columns 64*ct + 8*j + 2*q + e
// (j < 8, e < 2) at bit 4*j + 2*hi + e; columns >= bk (a partial last sub-tile) give 0 bits. A key is visible iff an even number of the row's
// endpoints are <= it ([0,F0) U [F1,F2) U ...), which also excludes keys >= len_k.
FS_HOST_DEVICE uint32_t payload_word(const BlockRows& ep, int nfunc, int rows, int64_t col0, int bk, int w) {
  const int per_mt = 32 * payload_subtiles(bk);
  const int mt = w / per_mt, rem = w - mt * per_mt;
  const int ct = rem >> 5, lane = rem & 31, g = lane >> 2, qd = lane & 3;
  uint32_t word = 0;
  for (int hi = 0; hi < 2; ++hi) {
    const int r = 16 * mt + 8 * hi + g;
    if (r >= rows) continue;
    const int32_t* e = ep.row(r);
    const int64_t stride = ep.stride;
    const int64_t cbase = col0 + 64 * ct + 2 * qd;
    // f = number of endpoints <= cbase (endpoints are nondecreasing).
    int lo = 0, n = nfunc;
    while (lo < n) {
      const int mid = (lo + n) >> 1;
      if (e[mid * stride] <= cbase) lo = mid + 1;
      else n = mid;
    }
    int f = lo;
    const int left = (bk - 64 * ct) >> 3, jn = left < 8 ? left : 8;  // column blocks of this sub-tile in the tile
    for (int j = 0; j < jn; ++j) {
      for (int x = 0; x < 2; ++x) {
        const int64_t c = cbase + 8 * j + x;
        while (f < nfunc && e[f * stride] <= c) ++f;
        if (!(f & 1)) word |= 1u << (4 * j + 2 * hi + x);
      }
    }
  }
  return word;
}

}  // namespace flashspan
