// The analytic mask of the SDPA kernels (kernels/common/analytic_mask.h), compiled for the host
// as the kernels compile it, against a dense brute-force mask built from the band rule of
// core/sdpa_band.h (the rule the CPU reference applies): for every sample shape, band and tile
// size below, every tile's class (empty / partial / full), every Q2K and K2Q cursor (exactly
// the non-empty blocks, ascending, full ones flagged), the element test of every tile (also from
// the QueryBlockMask / KeyBlockMask terms the kernels keep), and the K2Q walk over a kv group's
// heads (seek / next, as the dK/dV kernel uses it).
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "core/sdpa_band.h"
#include "kernels/common/analytic_mask.h"

namespace {

using flashspan::kern::AnalyticCursor;
using flashspan::kern::AnalyticK2QWalk;
using flashspan::kern::AnalyticSample;
using flashspan::kern::KeyBlockMask;
using flashspan::kern::QueryBlockMask;
using flashspan::kern::TileClass;
using flashspan::kern::TileMask;
using flashspan::kern::sdpa_bwd_grid_heads_slowest;
using flashspan::sdpa::Band;

// Row i sees column j: the reference's rule (Band::columns), written out densely.
std::vector<char> dense_mask(const Band& band, int64_t lq, int64_t lk) {
  std::vector<char> m(size_t(lq * lk), 0);
  for (int64_t i = 0; i < lq; ++i) {
    int64_t lo = 0, hi = 0;
    band.columns(i, lq, lk, &lo, &hi);
    for (int64_t j = lo; j < hi; ++j) m[size_t(i * lk + j)] = 1;
  }
  return m;
}

struct Case {
  Band band;
  int64_t lq, lk;
  std::string name() const {
    return "lq " + std::to_string(lq) + " lk " + std::to_string(lk) + " left " +
           (band.has_left ? std::to_string(band.left) : "-") + " right " +
           (band.has_right ? std::to_string(band.right) : "-") + (band.bottom_right ? " BR" : " TL");
  }
};

// Brute-force class of a tile from the dense mask.
TileClass brute_class(const std::vector<char>& m, const Case& c, int64_t r0, int bq, int64_t c0, int bk) {
  int64_t seen = 0;
  for (int64_t i = r0; i < r0 + bq; ++i)
    for (int64_t j = c0; j < c0 + bk; ++j) seen += (i < c.lq && j < c.lk && m[size_t(i * c.lk + j)]) ? 1 : 0;
  if (seen == 0) return TileClass::kEmpty;
  return seen == int64_t(bq) * bk ? TileClass::kFull : TileClass::kPartial;
}

using Step = std::pair<int, bool>;  // block, partial

std::vector<Step> walk(AnalyticCursor cur) {
  std::vector<Step> out;
  int blk = 0, entry = 0;
  bool partial = false;
  while (cur.next(blk, partial, entry)) {
    EXPECT_EQ(entry, blk);
    out.emplace_back(blk, partial);
  }
  return out;
}

// Checks every tile, cursor and element of one sample for one tile size. Returns the number
// of failures (stops early).
int check_case(const Case& c, int bq, int bk) {
  SCOPED_TRACE(c.name() + " tile " + std::to_string(bq) + "x" + std::to_string(bk));
  const std::vector<char> m = dense_mask(c.band, c.lq, c.lk);
  const AnalyticSample s = AnalyticSample::make(c.band, c.lq, c.lk);
  // The sample's element rule is the dense mask.
  for (int64_t i = 0; i < c.lq; ++i)
    for (int64_t j = 0; j < c.lk; ++j)
      if (s.visible(i, j) != bool(m[size_t(i * c.lk + j)])) {
        ADD_FAILURE() << "visible(" << i << ", " << j << ")";
        return 1;
      }
  // One block past the sample on each side: cursors and classes must give nothing there.
  const int nqb = int((c.lq + bq - 1) / bq) + 1, nkb = int((c.lk + bk - 1) / bk) + 1;
  std::vector<TileClass> cls(size_t(nqb * nkb));
  for (int qb = 0; qb < nqb; ++qb)
    for (int kb = 0; kb < nkb; ++kb) {
      const TileClass want = brute_class(m, c, int64_t(qb) * bq, bq, int64_t(kb) * bk, bk);
      cls[size_t(qb * nkb + kb)] = want;
      const TileClass got = classify_tile(s, int64_t(qb) * bq, bq, int64_t(kb) * bk, bk);
      if (got != want) {
        ADD_FAILURE() << "classify_tile(" << qb << ", " << kb << ") = " << int(got) << ", brute force " << int(want);
        return 1;
      }
      // The element test of the tile (tile-local coordinates; all bq x bk elements), also as the
      // kernels form it from their fixed block's terms.
      const TileMask tm = TileMask::make(s, int64_t(qb) * bq, int64_t(kb) * bk);
      const TileMask by_q = QueryBlockMask::make(s, int64_t(qb) * bq).tile(int64_t(kb) * bk);
      const TileMask by_k = KeyBlockMask::make(s, int64_t(kb) * bk).tile(int64_t(qb) * bq);
      for (const TileMask& other : {by_q, by_k}) {
        if (other.rows != tm.rows || other.cols != tm.cols || other.d_lo != tm.d_lo || other.d_hi != tm.d_hi) {
          ADD_FAILURE() << "block-mask terms of tile (" << qb << ", " << kb << ") differ from TileMask::make";
          return 1;
        }
      }
      for (int r = 0; r < bq; ++r)
        for (int col = 0; col < bk; ++col) {
          const int64_t i = int64_t(qb) * bq + r, j = int64_t(kb) * bk + col;
          const bool want_vis = i < c.lq && j < c.lk && m[size_t(i * c.lk + j)];
          if (tm.visible(r, col) != want_vis) {
            ADD_FAILURE() << "TileMask of tile (" << qb << ", " << kb << ") at (" << r << ", " << col << ")";
            return 1;
          }
        }
    }
  for (int qb = 0; qb < nqb; ++qb) {
    std::vector<Step> want;
    for (int kb = 0; kb < nkb; ++kb) {
      const TileClass t = cls[size_t(qb * nkb + kb)];
      if (t != TileClass::kEmpty) want.emplace_back(kb, t == TileClass::kPartial);
    }
    const AnalyticCursor cur = q2k_cursor(s, qb, bq, bk);
    EXPECT_EQ(cur.remaining(), int(want.size())) << "q2k row " << qb;
    EXPECT_EQ(cur.done(), want.empty()) << "q2k row " << qb;
    if (walk(cur) != want) {
      ADD_FAILURE() << "q2k_cursor(" << qb << ") walks other blocks than the brute force";
      return 1;
    }
    for (int j = 0; j <= int(want.size()) + 1; ++j) {
      AnalyticCursor k = cur;
      k.skip(j);
      const std::vector<Step> rest(want.begin() + std::min<size_t>(j, want.size()), want.end());
      if (walk(k) != rest) {
        ADD_FAILURE() << "q2k_cursor(" << qb << ").skip(" << j << ")";
        return 1;
      }
    }
  }
  for (int kb = 0; kb < nkb; ++kb) {
    std::vector<Step> want;
    for (int qb = 0; qb < nqb; ++qb) {
      const TileClass t = cls[size_t(qb * nkb + kb)];
      if (t != TileClass::kEmpty) want.emplace_back(qb, t == TileClass::kPartial);
    }
    const AnalyticCursor cur = k2q_cursor(s, kb, bq, bk);
    if (walk(cur) != want) {
      ADD_FAILURE() << "k2q_cursor(" << kb << ") walks other blocks than the brute force";
      return 1;
    }
    // The dK/dV kernel's walk over a kv group of 3 query heads: every (head, block) pair in
    // order, from any start, at most `count` of them.
    std::vector<std::tuple<int, int, int>> pairs;
    for (int h = 5; h < 8; ++h)
      for (const Step& st : want) pairs.emplace_back(h, st.first, st.second ? 0 : -1);
    for (int begin = 0; begin <= int(pairs.size()); ++begin)
      for (int count : {1, 2, 5, 0x7fffffff}) {
        AnalyticK2QWalk w{5, 8, count, cur, cur};
        w.seek(begin);
        std::vector<std::tuple<int, int, int>> got;
        int h = 0, qb = 0, payload = 0;
        while (w.next(h, qb, payload)) got.emplace_back(h, qb, payload);
        const size_t end = std::min(pairs.size(), size_t(begin) + size_t(std::min(count, 1 << 20)));
        const std::vector<std::tuple<int, int, int>> expect(pairs.begin() + begin, pairs.begin() + end);
        if (got != expect) {
          ADD_FAILURE() << "K2Q walk of key block " << kb << " from " << begin << ", count " << count;
          return 1;
        }
      }
  }
  return 0;
}

// Bands of every kind: none, causal, bands, windows, bounds of 0 / 1 / huge (clamped).
std::vector<Band> bands() {
  std::vector<Band> out;
  for (int br = 0; br < 2; ++br) {
    const std::vector<std::pair<int, int64_t>> lefts = {{0, 0}, {1, 1}, {1, 2}, {1, 5}, {1, 17}, {1, 1000}};
    const std::vector<std::pair<int, int64_t>> rights = {{0, 0}, {1, 0}, {1, 1}, {1, 3}, {1, 16}, {1, 1000}};
    for (const auto& l : lefts)
      for (const auto& r : rights) {
        if (br && !l.first && !r.first) continue;  // BOTTOM_RIGHT needs a band (validation)
        Band b;
        b.has_left = l.first;
        b.left = l.second;
        b.has_right = r.first;
        b.right = r.second;
        b.bottom_right = br;
        out.push_back(b);
      }
  }
  return out;
}

TEST(AnalyticMask, SmallTilesExhaustive) {
  // Every band on sample shapes around the tile sizes, Sq < Skv, Sq > Skv and empty sides.
  const std::vector<int64_t> lens = {0, 1, 3, 4, 7, 8, 9, 16, 23};
  int failures = 0;
  for (const Band& band : bands())
    for (int64_t lq : lens)
      for (int64_t lk : lens)
        for (const auto& t : {std::pair<int, int>{4, 4}, {4, 8}, {8, 4}, {16, 8}}) {
          failures += check_case(Case{band, lq, lk}, t.first, t.second);
          if (failures > 3) return;
        }
}

TEST(AnalyticMask, KernelTilesRandomShapes) {
  // The sm80 kernels' tiles (128x64 and 64x64 forward, 64x128 and 64x64 backward) on random
  // lengths up to a few blocks, every band.
  std::mt19937 rng(24);
  std::uniform_int_distribution<int64_t> len(0, 300);
  const std::vector<Band> all = bands();
  int failures = 0;
  for (int it = 0; it < 60 && failures <= 3; ++it) {
    const Case c{all[size_t(it) % all.size()], len(rng), len(rng)};
    for (const auto& t : {std::pair<int, int>{128, 64}, {64, 64}, {64, 128}}) failures += check_case(c, t.first, t.second);
  }
}

TEST(AnalyticMask, FarBandsAndLongSamples) {
  // Bands far off the sample (every tile empty or full), and the clamped "unbounded" bounds of
  // validation (S_q + S_kv) on long samples: no overflow, same answers.
  int failures = 0;
  for (int64_t off : {-400, -130, -64, 0, 64, 130, 400}) {
    Band b;
    b.has_left = 1;
    b.left = 10;
    b.has_right = 1;
    b.right = 0;
    b.bottom_right = 1;
    // len_kv - len_q = off moves the bottom-right diagonal by off columns.
    failures += check_case(Case{b, 200, 200 + off > 0 ? 200 + off : 0}, 64, 64);
  }
  Band wide;
  wide.has_left = 1;
  wide.left = (int64_t(1) << 31) + (int64_t(1) << 30);
  wide.has_right = 1;
  wide.right = wide.left;
  failures += check_case(Case{wide, 200, 333}, 128, 64);
  EXPECT_EQ(failures, 0);
}

TEST(AnalyticMask, TileMaskOffsetsStayInIntRange) {
  // A tile far from the diagonal of a long sample: the clamped offsets keep every answer.
  Band b;
  b.has_right = 1;
  b.right = 0;
  const AnalyticSample s = AnalyticSample::make(b, int64_t(1) << 31, int64_t(1) << 31);
  const TileMask below = TileMask::make(s, int64_t(1) << 30, 0);  // far below the diagonal: all visible
  const TileMask above = TileMask::make(s, 0, int64_t(1) << 30);  // far above: nothing visible
  for (int r = 0; r < 128; ++r)
    for (int col = 0; col < 128; ++col) {
      EXPECT_TRUE(below.visible(r, col));
      EXPECT_FALSE(above.visible(r, col));
    }
  EXPECT_EQ(classify_tile(s, int64_t(1) << 30, 128, 0, 128), TileClass::kFull);
  EXPECT_EQ(classify_tile(s, 0, 128, int64_t(1) << 30, 128), TileClass::kEmpty);
}

// q2k_cursor_rows (the SDPA decode forward's packed blocks, kernel_decode_sm80.cuh): for every band,
// sample shape and row range [r0, r1) inside the sample, the cursor walks exactly the key blocks
// some row of the range sees, ascending, and flags full exactly those each row sees whole (a
// partial one is masked element by element, so full must never be claimed wrongly; a block it
// calls partial that is full would only cost time, and the brute force allows neither); with r1 =
// r0 + bq it is q2k_cursor's row.
TEST(AnalyticMask, RowRangeCursor) {
  const std::vector<int64_t> lens = {0, 1, 2, 5, 8, 13, 64, 65, 130};
  int failures = 0;
  for (const Band& band : bands())
    for (int64_t lq : {int64_t(1), int64_t(2), int64_t(3), int64_t(7), int64_t(16)})
      for (int64_t lk : lens)
        for (int bk : {4, 64}) {
          const Case c{band, lq, lk};
          SCOPED_TRACE(c.name() + " bk " + std::to_string(bk));
          const std::vector<char> m = dense_mask(band, lq, lk);
          const AnalyticSample s = AnalyticSample::make(band, lq, lk);
          const int nkb = int((lk + bk - 1) / bk) + 1;
          for (int64_t r0 = 0; r0 <= lq; ++r0)
            for (int64_t r1 = r0; r1 <= lq; ++r1) {
              std::vector<Step> want;
              for (int kb = 0; kb < nkb; ++kb) {
                int64_t seen = 0;
                for (int64_t i = r0; i < r1; ++i)
                  for (int64_t j = int64_t(kb) * bk; j < int64_t(kb + 1) * bk; ++j)
                    seen += (j < lk && m[size_t(i * lk + j)]) ? 1 : 0;
                if (seen > 0) want.emplace_back(kb, seen != (r1 - r0) * bk);
              }
              if (walk(q2k_cursor_rows(s, r0, r1, bk)) != want) {
                ADD_FAILURE() << "q2k_cursor_rows(" << r0 << ", " << r1 << ") walks other blocks than the brute force";
                if (++failures > 3) return;
              }
              if (r1 - r0 == 4 && r0 % 4 == 0 && walk(q2k_cursor_rows(s, r0, r1, bk)) != walk(q2k_cursor(s, int(r0 / 4), 4, bk))) {
                ADD_FAILURE() << "q2k_cursor_rows(" << r0 << ", " << r1 << ") differs from q2k_cursor";
                if (++failures > 3) return;
              }
            }
        }
}

// The SDPA backward grid's order, both families (sdpa_bwd_grid_heads_slowest): heads slowest
// without a band only (windows and causal bands: key blocks ascending, heads fastest; PERF_LOG
// v2.2, v2.10).
TEST(AnalyticMask, BackwardGridOrderRule) {
  EXPECT_TRUE(sdpa_bwd_grid_heads_slowest(false, false));
  EXPECT_FALSE(sdpa_bwd_grid_heads_slowest(true, true));   // a window
  EXPECT_FALSE(sdpa_bwd_grid_heads_slowest(false, true));  // causal
  EXPECT_FALSE(sdpa_bwd_grid_heads_slowest(true, false));  // a left bound alone
}

}  // namespace
