// Mask generators with block structure, for the planner tests (host and emulated CUDA planner)
// and the GPU kernel tests. Random interval masks almost never produce full blocks or blocks
// that miss a handful of elements; these generators produce them on purpose:
//
//   * full tiles, empty tiles, partial tiles, and "full minus n" tiles (n = 1..max_missing
//     elements hidden, at tile corners/edges or at random positions), on a tile grid of
//     tile_q x tile_k (128 x 128 by default: every planner / kernel tile of the project
//     divides it, so a full-minus-one 128 x 128 tile gives one full-minus-one block for each
//     consumer tile (128x64, 64x64, 128x128, 64x128, 16x64), all other sub-blocks full);
//   * fully empty rows (rows that see no key) inside otherwise long rows, so split
//     schedules meet empty rows in their combine step;
//   * whole empty query tiles.
//
// A mask is built from a per-row visibility bitmap and converted to endpoints
// ([nfunc, Sq] int32, row q sees [0,F0) U [F1,F2) U ...; nfunc = 1 + 2 * (largest number of
// intervals not starting at key 0 in any row)). Header-only, no GPU.
#pragma once

#include <algorithm>
#include <cstdint>
#include <random>
#include <vector>

#include "planner_gqa_cases.h"  // widen()
#include "planner_masks.h"

namespace fs_test {

// Row-major visibility bitmap of one sample: vis[q * lk + k] != 0 when row q sees key k.
struct Visibility {
  int64_t lq = 0, lk = 0;
  std::vector<uint8_t> vis;
  Visibility(int64_t q, int64_t k) : lq(q), lk(k), vis(static_cast<size_t>(q * k), 0) {}
  uint8_t& at(int64_t q, int64_t k) { return vis[static_cast<size_t>(q * lk + k)]; }
  uint8_t at(int64_t q, int64_t k) const { return vis[static_cast<size_t>(q * lk + k)]; }
};

// Intervals [a, e) of row q (maximal runs of visible keys).
inline std::vector<std::pair<int64_t, int64_t>> row_intervals(const Visibility& v, int64_t q) {
  std::vector<std::pair<int64_t, int64_t>> iv;
  for (int64_t k = 0; k < v.lk;) {
    if (!v.at(q, k)) {
      ++k;
      continue;
    }
    const int64_t a = k;
    while (k < v.lk && v.at(q, k)) ++k;
    iv.push_back({a, k});
  }
  return iv;
}

// Endpoints of a visibility bitmap; `min_nfunc` pads (extra empty pairs at the last endpoint).
inline SampleMask mask_from_visibility(const Visibility& v, int min_nfunc = 1) {
  std::vector<std::vector<std::pair<int64_t, int64_t>>> rows(static_cast<size_t>(v.lq));
  int nfunc = std::max(1, min_nfunc | 1);
  for (int64_t q = 0; q < v.lq; ++q) {
    auto& iv = rows[static_cast<size_t>(q)] = row_intervals(v, q);
    if (iv.empty() || iv[0].first != 0) iv.insert(iv.begin(), {0, 0});
    nfunc = std::max(nfunc, static_cast<int>(2 * iv.size() - 1));
  }
  SampleMask m{nfunc, std::vector<int32_t>(static_cast<size_t>(nfunc) * v.lq)};
  for (int64_t q = 0; q < v.lq; ++q) write_row(m, v.lq, q, rows[static_cast<size_t>(q)]);
  return m;
}

enum class TileClass { kEmpty, kFull, kFullMinus, kPartial };

struct BlockMaskSpec {
  int tile_q = 128, tile_k = 128;  // grid on which tile classes are drawn
  // Probabilities of the tile classes (the rest is partial).
  double p_full = 0.35, p_empty = 0.2, p_full_minus = 0.3;
  int max_missing = 8;             // a full-minus tile hides 1..max_missing elements
  double p_empty_row = 0.0;        // share of rows made fully empty afterwards
  double p_empty_q_tile = 0.0;     // share of query tiles made fully empty afterwards
};

// One sample's block-structured mask with lq rows and lk keys. `classes` (if given) receives
// the tile classes, row-major over the [ceil(lq/tile_q), ceil(lk/tile_k)] grid.
inline Visibility block_visibility(int64_t lq, int64_t lk, const BlockMaskSpec& s, uint64_t seed,
                                   std::vector<TileClass>* classes = nullptr) {
  std::mt19937_64 rng(seed);
  auto u01 = [&] { return static_cast<double>(rng() % 1000000) / 1e6; };
  Visibility v(lq, lk);
  const int64_t ntq = (lq + s.tile_q - 1) / s.tile_q, ntk = (lk + s.tile_k - 1) / s.tile_k;
  if (classes) classes->assign(static_cast<size_t>(ntq * ntk), TileClass::kEmpty);
  for (int64_t i = 0; i < ntq; ++i) {
    for (int64_t j = 0; j < ntk; ++j) {
      const int64_t q0 = i * s.tile_q, q1 = std::min(lq, q0 + s.tile_q);
      const int64_t k0 = j * s.tile_k, k1 = std::min(lk, k0 + s.tile_k);
      const double x = u01();
      TileClass c = x < s.p_full                           ? TileClass::kFull
                    : x < s.p_full + s.p_empty             ? TileClass::kEmpty
                    : x < s.p_full + s.p_empty + s.p_full_minus ? TileClass::kFullMinus
                                                            : TileClass::kPartial;
      if (classes) (*classes)[static_cast<size_t>(i * ntk + j)] = c;
      if (c == TileClass::kEmpty) continue;
      if (c == TileClass::kPartial) {
        // A causal-like staircase with a random offset, or a random key range per row.
        const bool stair = rng() % 2 == 0;
        const int64_t off = rand_int(rng, -(k1 - k0) / 2, (k1 - k0) / 2);
        for (int64_t q = q0; q < q1; ++q) {
          int64_t a = k0, e = k1;
          if (stair) {
            e = std::clamp<int64_t>(k0 + (q - q0) + 1 + off, k0, k1);
          } else {
            a = rand_int(rng, k0, k1);
            e = rand_int(rng, a, k1);
          }
          for (int64_t k = a; k < e; ++k) v.at(q, k) = 1;
        }
        continue;
      }
      for (int64_t q = q0; q < q1; ++q)
        for (int64_t k = k0; k < k1; ++k) v.at(q, k) = 1;
      if (c == TileClass::kFullMinus) {
        const int n = static_cast<int>(rand_int(rng, 1, s.max_missing));
        for (int e = 0; e < n; ++e) {
          // Corners and edges (first / last row and key of the tile) as well as the inside:
          // the elements a kernel's boundary handling is most likely to get wrong.
          auto pick = [&](int64_t lo, int64_t hi) {
            switch (rng() % 4) {
              case 0: return lo;
              case 1: return hi - 1;
              default: return rand_int(rng, lo, hi - 1);
            }
          };
          v.at(pick(q0, q1), pick(k0, k1)) = 0;
        }
      }
    }
  }
  for (int64_t i = 0; i < ntq; ++i) {
    if (s.p_empty_q_tile > 0 && u01() < s.p_empty_q_tile) {
      for (int64_t q = i * s.tile_q; q < std::min(lq, (i + 1) * s.tile_q); ++q)
        std::fill(v.vis.begin() + q * lk, v.vis.begin() + (q + 1) * lk, 0);
    }
  }
  if (s.p_empty_row > 0)
    for (int64_t q = 0; q < lq; ++q)
      if (u01() < s.p_empty_row) std::fill(v.vis.begin() + q * lk, v.vis.begin() + (q + 1) * lk, 0);
  return v;
}

inline SampleMask mask_blocks(int64_t lq, int64_t lk, const BlockMaskSpec& s, uint64_t seed) {
  return mask_from_visibility(block_visibility(lq, lk, s, seed));
}

// Every key visible except one element in every other tile of a checkerboard (tiles with
// (i + j) even; at a tile corner for tiles on the diagonal, elsewhere at a random position):
// every consumer block holding a hidden element is "full minus one", and full blocks remain
// for every tile size up to the generator's. Tail tiles included.
inline Visibility full_minus_one_visibility(int64_t lq, int64_t lk, int tile_q, int tile_k, uint64_t seed) {
  std::mt19937_64 rng(seed);
  Visibility v(lq, lk);
  std::fill(v.vis.begin(), v.vis.end(), 1);
  for (int64_t q0 = 0; q0 < lq; q0 += tile_q)
    for (int64_t k0 = 0; k0 < lk; k0 += tile_k) {
      const int64_t q1 = std::min(lq, q0 + tile_q), k1 = std::min(lk, k0 + tile_k);
      if ((q0 / tile_q + k0 / tile_k) % 2 != 0) continue;
      const bool corner = q0 / tile_q == k0 / tile_k;
      const int64_t q = corner ? (rng() % 2 ? q0 : q1 - 1) : rand_int(rng, q0, q1 - 1);
      const int64_t k = corner ? (rng() % 2 ? k0 : k1 - 1) : rand_int(rng, k0, k1 - 1);
      v.at(q, k) = 0;
    }
  return v;
}

// Per-(mask head, sample) block masks for a geometry, assembled as [Hmask, nfunc, total_q]
// (nfunc = the largest any (head, sample) needs, the others padded). Sets g.nfunc.
inline std::vector<int32_t> block_mask_for_geometry(flashspan::FlexGeometry& g, const BlockMaskSpec& s,
                                                    uint64_t seed) {
  std::vector<std::vector<SampleMask>> hs(static_cast<size_t>(g.num_heads_mask));
  int nfunc = 1;
  for (int hm = 0; hm < g.num_heads_mask; ++hm)
    for (int b = 0; b < g.batch; ++b) {
      hs[hm].push_back(mask_blocks(g.seqlen_q(b), g.seqlen_k(b), s, seed * 1000003 + hm * 131 + b));
      nfunc = std::max(nfunc, hs[hm].back().nfunc);
    }
  for (int hm = 0; hm < g.num_heads_mask; ++hm)
    for (int b = 0; b < g.batch; ++b) hs[hm][b] = widen(hs[hm][b], g.seqlen_q(b), nfunc);
  g.nfunc = nfunc;
  return assemble_mask(g, hs);
}

// Counts of blocks with exactly `bq * bk - missing` visible elements on a (bq, bk) grid of a
// visibility bitmap (full blocks only, tails excluded): the tests use it to prove a mask
// really holds the block kinds they are about.
inline int64_t count_blocks_missing(const Visibility& v, int bq, int bk, int64_t missing) {
  int64_t n = 0;
  for (int64_t q0 = 0; q0 + bq <= v.lq; q0 += bq)
    for (int64_t k0 = 0; k0 + bk <= v.lk; k0 += bk) {
      int64_t vis = 0;
      for (int64_t q = q0; q < q0 + bq; ++q)
        for (int64_t k = k0; k < k0 + bk; ++k) vis += v.at(q, k);
      n += vis == int64_t(bq) * bk - missing;
    }
  return n;
}

}  // namespace fs_test
