// Packed-GQA planner test cases shared by the host planner tests (brute force) and the
// CUDA planner tests (bitwise against the host planner): group sizes G in {2, 4, 8},
// Hmask = 1 and Hmask = Hq, BSHD decode-like (Sq = 1 .. 17) and longer queries, THD with
// uneven and empty samples, random interval masks and the benchmark masks.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "planner_masks.h"

namespace fs_test {

struct GqaCase {
  std::string name;
  flashspan::FlexGeometry g;
  std::vector<int32_t> mask;  // [Hmask, nfunc, total_q]
};

// Rows [q0, q0 + n) of a mask (keys unchanged): the last rows of a benchmark mask are what a
// decode step with a KV cache of Sk keys sees.
inline SampleMask slice_rows(const SampleMask& m, int64_t S, int64_t q0, int64_t n) {
  SampleMask out{m.nfunc, std::vector<int32_t>(static_cast<size_t>(m.nfunc) * n)};
  for (int f = 0; f < m.nfunc; ++f)
    for (int64_t q = 0; q < n; ++q) out.ep[static_cast<size_t>(f) * n + q] = m.ep[static_cast<size_t>(f) * S + q0 + q];
  return out;
}

// The same rows with `nfunc` >= m.nfunc endpoints (odd): extra endpoints repeat the last one,
// which adds only empty intervals.
inline SampleMask widen(const SampleMask& m, int64_t lq, int nfunc) {
  SampleMask out{nfunc, std::vector<int32_t>(static_cast<size_t>(nfunc) * lq)};
  for (int f = 0; f < nfunc; ++f)
    for (int64_t q = 0; q < lq; ++q)
      out.ep[static_cast<size_t>(f) * lq + q] = m.ep[static_cast<size_t>(std::min(f, m.nfunc - 1)) * lq + q];
  return out;
}

// Random masks, one per (mask head, sample).
inline GqaCase random_gqa_case(const std::string& name, bool varlen, const std::vector<int64_t>& lq,
                               const std::vector<int64_t>& lk, int hq, int hkv, int hmask, int nfunc, uint64_t seed) {
  GqaCase c{name, make_geometry(varlen, lq, lk, hq, hkv, hmask, nfunc), {}};
  std::vector<std::vector<SampleMask>> hs(hmask);
  for (auto& s : hs)
    for (size_t b = 0; b < lq.size(); ++b) {
      s.push_back(mask_random(lq[b], lk[b], nfunc, (seed + b) % 2 == 0, seed));
      ++seed;
    }
  c.mask = assemble_mask(c.g, hs);
  return c;
}

// Benchmark masks over S keys; Sq = S (the full mask) or the last Sq rows (decode). With
// Hmask = Hq every head gets a different benchmark mask (widened to a common nfunc).
inline GqaCase benchmark_gqa_case(int first_mask, int64_t S, int64_t sq, int hq, int hkv, int hmask) {
  const auto& names = benchmark_mask_names();
  std::vector<SampleMask> rows;
  int nfunc = 1;
  for (int h = 0; h < hmask; ++h) {
    rows.push_back(slice_rows(mask_by_name(names[(first_mask + h) % names.size()], S), S, S - sq, sq));
    nfunc = std::max(nfunc, rows.back().nfunc);
  }
  GqaCase c{"bench_" + names[first_mask] + "_S" + std::to_string(S) + "_Sq" + std::to_string(sq) + "_Hm" +
                std::to_string(hmask),
            make_geometry(false, {sq}, {S}, hq, hkv, hmask, nfunc),
            {}};
  std::vector<std::vector<SampleMask>> hs;
  for (const SampleMask& m : rows) hs.push_back({widen(m, sq, nfunc)});
  c.mask = assemble_mask(c.g, hs);
  return c;
}

// All packed-GQA cases (a few dozen small problems).
inline std::vector<GqaCase> packed_gqa_cases() {
  std::vector<GqaCase> cases;
  uint64_t seed = 1000;
  for (int G : {2, 4, 8}) {
    const int hkv = G == 8 ? 1 : 2, hq = G * hkv;
    for (int hmask : {1, hq}) {
      const std::string tag = "_G" + std::to_string(G) + "_Hm" + std::to_string(hmask);
      for (int64_t sq : {1, 3, 16, 17})
        cases.push_back(random_gqa_case("bshd_decode_Sq" + std::to_string(sq) + tag, false, {sq, sq, sq},
                                        {200, 200, 200}, hq, hkv, hmask, 3, seed += 10));
      cases.push_back(random_gqa_case("bshd_Sq150" + tag, false, {150, 150}, {333, 333}, hq, hkv, hmask, 5,
                                      seed += 10));
      cases.push_back(random_gqa_case("thd_uneven_empty" + tag, true, {0, 5, 17, 1, 0, 40, 130},
                                      {50, 0, 260, 129, 0, 64, 190}, hq, hkv, hmask, 5, seed += 10));
    }
  }
  for (int m = 0; m < int(benchmark_mask_names().size()); ++m) {
    for (int hmask : {1, 8}) {
      cases.push_back(benchmark_gqa_case(m, 300, 300, 8, 2, hmask));  // G = 4, full mask
      cases.push_back(benchmark_gqa_case(m, 300, 9, 8, 1, hmask));    // G = 8, decode of 9 rows
    }
  }
  return cases;
}

}  // namespace fs_test
