// The analytic mask of SDPA (causal top-left / bottom-right, diagonal bands, sliding windows,
// padding and ragged lengths) as the kernels see it: tiles classified empty / partial / full
// from positions, block cursors with the interface of the plan's BlockCursor, and the element
// test of a partial tile. No plan, no payload: everything follows from the sample's lengths
// and the band (core/sdpa_band.h, the rule the CPU reference applies too).
//
// Arch-neutral integer code for host and device (the host tests compile it as it is and
// check it exhaustively against a dense brute-force mask, tests/cpp/test_analytic_mask.cpp).
//
// Element (i, j) of a sample (query row i, key column j) is visible when
//   i < len_q,  j < len_kv,  d_min <= j - i - shift <= d_max       (AnalyticSample)
// A tile is query rows [r0, r0 + bq) x key columns [c0, c0 + bk) of one sample:
//   empty    no visible element;
//   full     every element visible (so every row and column is inside the sample: the
//            kernels skip the element test, and out-of-sample rows/columns, which they
//            zero-fill instead of reading, are never left unmasked);
//   partial  otherwise.
// Visible columns of rows [r0, r1) are one interval (each row's band has d_max - d_min + 1
// >= 1 offsets and moves by one column per row), and so are the visible rows of columns
// [c0, c1): the cursors walk exactly the non-empty blocks, in ascending order, and the full
// blocks among them are one sub-interval.
#pragma once

#include <cstdint>

#include "core/sdpa_band.h"

#if defined(__CUDACC__)
#define FS_MASK_HD __host__ __device__ __forceinline__
#else
#define FS_MASK_HD inline
#endif

namespace flashspan::kern {

FS_MASK_HD int64_t floor_div(int64_t a, int64_t b) { return a >= 0 ? a / b : -((-a + b - 1) / b); }
FS_MASK_HD int64_t ceil_div_signed(int64_t a, int64_t b) { return -floor_div(-a, b); }
FS_MASK_HD int64_t clamp64(int64_t x, int64_t lo, int64_t hi) { return x < lo ? lo : (x > hi ? hi : x); }

// One sample of the mask: its lengths and the visible diagonal offsets.
struct AnalyticSample {
  int64_t len_q, len_kv, shift, d_min, d_max;

  FS_MASK_HD static AnalyticSample make(const sdpa::Band& band, int64_t len_q, int64_t len_kv) {
    return AnalyticSample{len_q, len_kv, band.shift(len_q, len_kv), band.d_min(), band.d_max()};
  }
  FS_MASK_HD bool visible(int64_t i, int64_t j) const {
    const int64_t d = j - i - shift;
    return i >= 0 && i < len_q && j >= 0 && j < len_kv && d >= d_min && d <= d_max;
  }
};

enum class TileClass : int { kEmpty = 0, kPartial = 1, kFull = 2 };

// Class of the tile rows [r0, r0 + bq) x columns [c0, c0 + bk) (r0, c0 >= 0).
FS_MASK_HD TileClass classify_tile(const AnalyticSample& s, int64_t r0, int bq, int64_t c0, int bk) {
  const int64_t r1 = r0 + bq < s.len_q ? r0 + bq : s.len_q;
  const int64_t c1 = c0 + bk < s.len_kv ? c0 + bk : s.len_kv;
  if (r1 <= r0 || c1 <= c0) return TileClass::kEmpty;
  // The tile's offsets j - i - shift cover [c0 - (r1 - 1), (c1 - 1) - r0] - shift, every value.
  if (c0 - (r1 - 1) - s.shift > s.d_max || (c1 - 1) - r0 - s.shift < s.d_min) return TileClass::kEmpty;
  const bool inside = r0 + bq <= s.len_q && c0 + bk <= s.len_kv;
  if (inside && (c0 + bk - 1) - r0 - s.shift <= s.d_max && c0 - (r0 + bq - 1) - s.shift >= s.d_min) {
    return TileClass::kFull;
  }
  return TileClass::kPartial;
}

// Blocks [pos, end) of one Q2K row (query block -> key blocks) or K2Q row (key block ->
// query blocks), all non-empty; those in [full_lo, full_hi) are full, the others partial.
// next(blk, partial, entry) as BlockCursor::next (block_range.cuh): entry is the block index
// (there is no payload to index).
struct AnalyticCursor {
  int pos, end, full_lo, full_hi;

  FS_MASK_HD bool next(int& blk, bool& partial, int& entry) {
    if (pos >= end) return false;
    blk = pos;
    partial = pos < full_lo || pos >= full_hi;
    entry = pos;
    ++pos;
    return true;
  }
  FS_MASK_HD bool done() const { return pos >= end; }
  FS_MASK_HD int remaining() const { return pos < end ? end - pos : 0; }
  FS_MASK_HD void skip(int j) { pos = j < end - pos ? pos + j : (pos < end ? end : pos); }
};

namespace detail {
// Cursor over block indices [lo, hi) (element positions, sample-local, half-open) of blocks
// of `b` elements, with full blocks those whose first element lies in [full_first, full_last]
// (element positions, inclusive; empty when full_first > full_last). `limit` caps the block
// count (blocks past it do not exist).
FS_MASK_HD AnalyticCursor make_cursor(int64_t lo, int64_t hi, int64_t full_first, int64_t full_last, int b) {
  if (hi <= lo) return AnalyticCursor{0, 0, 0, 0};
  const int64_t blo = floor_div(lo, b), bhi = ceil_div_signed(hi, b);
  int64_t flo = ceil_div_signed(full_first, b), fhi = floor_div(full_last, b) + 1;
  flo = clamp64(flo, blo, bhi);
  fhi = clamp64(fhi, flo, bhi);
  return AnalyticCursor{int(blo), int(bhi), int(flo), int(fhi)};
}
}  // namespace detail

// Q2K row of query block qb (rows [qb * bq, qb * bq + bq)): the key blocks of bk columns the
// block's rows see, ascending.
FS_MASK_HD AnalyticCursor q2k_cursor(const AnalyticSample& s, int qb, int bq, int bk) {
  const int64_t r0 = int64_t(qb) * bq;
  const int64_t r1 = r0 + bq < s.len_q ? r0 + bq : s.len_q;
  if (r1 <= r0 || s.len_kv <= 0) return AnalyticCursor{0, 0, 0, 0};
  // Row i sees columns [i + shift + d_min, i + shift + d_max] within [0, len_kv).
  const int64_t lo = clamp64(r0 + s.shift + s.d_min, 0, s.len_kv);
  const int64_t hi = clamp64(r1 - 1 + s.shift + s.d_max + 1, 0, s.len_kv);
  // Full: all bq rows inside the sample, and first column c0 with
  //   c0 >= (r0 + bq - 1) + shift + d_min,  c0 + bk - 1 <= r0 + shift + d_max,  c0 + bk <= len_kv.
  int64_t full_first = 1, full_last = 0;
  if (r0 + bq <= s.len_q) {
    full_first = r0 + bq - 1 + s.shift + s.d_min;
    const int64_t by_band = r0 + s.shift + s.d_max - (bk - 1);
    full_last = by_band < s.len_kv - bk ? by_band : s.len_kv - bk;
  }
  return detail::make_cursor(lo, hi, full_first, full_last, bk);
}

// Q2K row of query rows [r0, r1) of any count, every one inside the sample (0 <= r0 <= r1 <=
// len_q): the key blocks of bk columns those rows see, ascending; a block is full when each of the
// rows sees all of its columns. The SDPA decode forward's packed blocks ask it with the positions
// their rows hold (kernel_decode_sm80.cuh); q2k_cursor with r0 + bq <= len_q is the same cursor.
FS_MASK_HD AnalyticCursor q2k_cursor_rows(const AnalyticSample& s, int64_t r0, int64_t r1, int bk) {
  if (r1 <= r0 || s.len_kv <= 0) return AnalyticCursor{0, 0, 0, 0};
  const int64_t lo = clamp64(r0 + s.shift + s.d_min, 0, s.len_kv);
  const int64_t hi = clamp64(r1 - 1 + s.shift + s.d_max + 1, 0, s.len_kv);
  const int64_t full_first = r1 - 1 + s.shift + s.d_min;
  const int64_t by_band = r0 + s.shift + s.d_max - (bk - 1);
  const int64_t full_last = by_band < s.len_kv - bk ? by_band : s.len_kv - bk;
  return detail::make_cursor(lo, hi, full_first, full_last, bk);
}

// K2Q row of key block kb (columns [kb * bk, kb * bk + bk)): the query blocks of bq rows
// that see any of its columns, ascending.
FS_MASK_HD AnalyticCursor k2q_cursor(const AnalyticSample& s, int kb, int bq, int bk) {
  const int64_t c0 = int64_t(kb) * bk;
  const int64_t c1 = c0 + bk < s.len_kv ? c0 + bk : s.len_kv;
  if (c1 <= c0 || s.len_q <= 0) return AnalyticCursor{0, 0, 0, 0};
  // Column j is seen by rows [j - shift - d_max, j - shift - d_min] within [0, len_q).
  const int64_t lo = clamp64(c0 - s.shift - s.d_max, 0, s.len_q);
  const int64_t hi = clamp64(c1 - 1 - s.shift - s.d_min + 1, 0, s.len_q);
  // Full: all bk columns inside the sample, and first row r0 with
  //   r0 >= c0 + bk - 1 - shift - d_max,  r0 + bq - 1 <= c0 - shift - d_min,  r0 + bq <= len_q.
  int64_t full_first = 1, full_last = 0;
  if (c0 + bk <= s.len_kv) {
    full_first = c0 + bk - 1 - s.shift - s.d_max;
    const int64_t by_band = c0 - s.shift - s.d_min - (bq - 1);
    full_last = by_band < s.len_q - bq ? by_band : s.len_q - bq;
  }
  return detail::make_cursor(lo, hi, full_first, full_last, bq);
}

// SDPA's block_mask (uint8, one bit per 128 x 128 block of sample positions: byte
// (i / 128, (j / 128) / 8), bit (j / 128) % 8; core/sdpa_problem.h kBlockMaskTile), combined
// with the analytic mask on tiles that lie inside one 128 x 128 block (every tile of the
// kernels: block sizes dividing 128): a tile of a 0 bit is empty, a tile of a 1 bit keeps its
// analytic class (a partial one still applies the element mask).
constexpr int kBlockMaskShift = 7;  // log2 of the block_mask's 128

// Bit of the tile at (row r0, column c0) of one (sample, head) of the mask (`base`: its byte
// (0, 0); row_stride: bytes per 128-row block).
FS_MASK_HD bool block_mask_bit(const uint8_t* base, int64_t row_stride, int64_t r0, int64_t c0) {
  const int64_t c = c0 >> kBlockMaskShift;
  return (base[(r0 >> kBlockMaskShift) * row_stride + (c >> 3)] >> (c & 7)) & 1;
}

// A Q2K cursor (q2k_cursor) over the key blocks of `bk` columns whose block_mask bit is set, for
// one query block: `row` is the byte row of its 128-row block (null: no block mask, every block).
// next() as AnalyticCursor::next; skip / remaining / done count the blocks before the filter
// (persistent kernels only; the SDPA kernels walk whole rows).
struct BlockMaskedCursor {
  AnalyticCursor cur;
  const uint8_t* row;
  int bk;

  FS_MASK_HD bool next(int& blk, bool& partial, int& entry) {
    while (cur.next(blk, partial, entry)) {
      if (row == nullptr) return true;
      const int64_t c = (int64_t(blk) * bk) >> kBlockMaskShift;
      if ((row[c >> 3] >> (c & 7)) & 1) return true;
    }
    return false;
  }
  FS_MASK_HD bool done() const { return cur.done(); }
  FS_MASK_HD int remaining() const { return cur.remaining(); }
  FS_MASK_HD void skip(int j) { cur.skip(j); }
};

// The analytic K2Q walk of one key block: every query head of the kv group, each over the
// same AnalyticCursor (k2q_cursor) in ascending query blocks; payload 0 for a partial block,
// -1 for a full one. With a block_mask (bm set: the byte of the key block's 128-column block in
// the mask's row 0 of head 0), query blocks whose bit is 0 are left out; `left` counts the
// blocks returned, seek() the blocks before the filter (begin = 0 in the SDPA kernels).
struct AnalyticK2QWalk {
  int h, h_end, left;
  AnalyticCursor row, cur;  // the head's row from its start, and the position in it
  const uint8_t* bm = nullptr;
  int64_t bm_head_stride = 0, bm_row_stride = 0;
  int bm_bit = 0, bq = 0;

  FS_MASK_HD void seek(int begin) {
    const int n = row.remaining();
    if (n > 0 && begin >= n) {
      h += begin / n;
      begin %= n;
    }
    cur.skip(begin);
  }
  FS_MASK_HD bool next(int& head, int& qb, int& payload) {
    if (left <= 0) return false;
    int blk = 0, entry = 0;
    bool partial = false;
    while (h < h_end) {
      if (cur.next(blk, partial, entry)) {
        if (bm != nullptr &&
            !((bm[h * bm_head_stride + ((int64_t(blk) * bq) >> kBlockMaskShift) * bm_row_stride] >> bm_bit) & 1)) {
          continue;
        }
        --left;
        head = h;
        qb = blk;
        payload = partial ? 0 : -1;
        return true;
      }
      ++h;
      cur = row;
    }
    return false;
  }
};

// The order of the SDPA backward's dK/dV grid, both families (tile_scheduler.cuh AnalyticBwdGrid:
// the sm90 kernel's AnalyticSourceBwdSm90 and the sm80 sdpa_bwd_dkdv_kernel_sm80 ask it with the
// call's band): heads slowest -- every key block of one head before the next, so that the CTAs of a
// wave share one head's Q / dO in L2 -- without a band, else key blocks ascending, heads fastest (a
// causal band: the longest walks first; the flex route's task list, cost order, is the same order
// for causal masks). Measured on the H200 with the sm90 kernels (B=1 H=16 D=128): no band S=32768
// 483 (heads fastest) -> 531 TFLOP/s (PERF_LOG v2.2); causal 469 -> 422. Windows (a band bounded on
// both sides, walks of one length too) lost with heads slowest, and so did the forward's windows
// (PERF_LOG v2.10: S=8192 window backward 482 -> 380, forward 595 -> 468; S=32768 forward 597 ->
// 536; the forward without a band 581 -> 586, noise), so the forward's grid keeps its one order
// (AnalyticGrid: the last query block first).
FS_MASK_HD constexpr bool sdpa_bwd_grid_heads_slowest(bool has_left, bool has_right) { return !has_left && !has_right; }

// Whether the SDPA forward's cells differ in cost (a band or a block mask): the sm90 forward then claims its L2
// groups through a counter in the workspace (dispatch sdpa_fwd_sm90_counter_bytes reserves it; launch_fwd_sm90.cu
// set_sdpa_fwd_l2_group), where cells of one cost run in static snake waves (PERF_LOG v2.60). The backward's
// counterpart is !sdpa_bwd_grid_heads_slowest: its heads-fastest cells are the ones it groups and claims.
FS_MASK_HD constexpr bool sdpa_fwd_cells_unequal(bool has_left, bool has_right, bool block_mask) {
  return has_left || has_right || block_mask;
}

// The element test of one tile, in tile-local coordinates (row r < bq, column c < bk): what a
// kernel applies to a partial tile's score fragment. Offsets are clamped to +-kClamp, past
// every c - r of a tile, so they fit in int.
struct TileMask {
  static constexpr int kClamp = 1 << 20;
  int rows, cols;  // rows [0, rows) and columns [0, cols) lie inside the sample
  int d_lo, d_hi;  // visible offsets c - r

  FS_MASK_HD static TileMask make(const AnalyticSample& s, int64_t r0, int64_t c0) {
    const int64_t base = c0 - r0 - s.shift;  // d = base + (c - r)
    return TileMask{int(clamp64(s.len_q - r0, 0, kClamp)), int(clamp64(s.len_kv - c0, 0, kClamp)),
                    int(clamp64(s.d_min - base, -kClamp, kClamp)), int(clamp64(s.d_max - base, -kClamp, kClamp))};
  }
  FS_MASK_HD bool visible(int r, int c) const {
    const int d = c - r;
    return r < rows && c < cols && d >= d_lo && d <= d_hi;
  }
};

// The tile masks of one block against the blocks of the other side, with the fixed block's
// terms formed once (what a kernel keeps through its walk: 2 ints and 2 int64):
// QueryBlockMask::make(s, r0).tile(c0) == TileMask::make(s, r0, c0), and
// KeyBlockMask::make(s, c0).tile(r0) == TileMask::make(s, r0, c0) (test_analytic_mask.cpp).
struct QueryBlockMask {
  int rows, len_kv;  // the block's rows inside the sample; the sample's keys
  int64_t lo0, hi0;  // visible c - r of the tile at key c0: [lo0 - c0, hi0 - c0]

  FS_MASK_HD static QueryBlockMask make(const AnalyticSample& s, int64_t r0) {
    return QueryBlockMask{int(clamp64(s.len_q - r0, 0, TileMask::kClamp)), int(s.len_kv), s.d_min + r0 + s.shift,
                          s.d_max + r0 + s.shift};
  }
  FS_MASK_HD TileMask tile(int64_t c0) const {
    return TileMask{rows, int(clamp64(len_kv - c0, 0, TileMask::kClamp)),
                    int(clamp64(lo0 - c0, -TileMask::kClamp, TileMask::kClamp)),
                    int(clamp64(hi0 - c0, -TileMask::kClamp, TileMask::kClamp))};
  }
};

struct KeyBlockMask {
  int cols, len_q;   // the block's keys inside the sample; the sample's query rows
  int64_t lo0, hi0;  // visible c - r of the tile at row r0: [lo0 + r0, hi0 + r0]

  FS_MASK_HD static KeyBlockMask make(const AnalyticSample& s, int64_t c0) {
    return KeyBlockMask{int(clamp64(s.len_kv - c0, 0, TileMask::kClamp)), int(s.len_q), s.d_min + s.shift - c0,
                        s.d_max + s.shift - c0};
  }
  FS_MASK_HD TileMask tile(int64_t r0) const {
    return TileMask{int(clamp64(len_q - r0, 0, TileMask::kClamp)), cols,
                    int(clamp64(lo0 + r0, -TileMask::kClamp, TileMask::kClamp)),
                    int(clamp64(hi0 + r0, -TileMask::kClamp, TileMask::kClamp))};
  }
};

}  // namespace flashspan::kern
