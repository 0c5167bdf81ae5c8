// Endpoint generators for the planner tests and the planner benchmark: the eight masks of
// docs/BENCHMARK.md (causal, document_causal, local, sink_local, tree_dfs, tree_bfs,
// longformer, hstu) and random masks, plus a geometry maker. Header-only, no GPU.
//
// A generator returns one head's endpoints of one sample with Sq = Sk = S, laid out
// [nfunc, S] (int32); row q sees keys [0,F0) U [F1,F2) U ... . Sizes that BENCHMARK.md
// fixes for S = 32K/128K (window 512, documents of 4K..16K, ...) are scaled down for small
// S so that test masks keep their shape.
#pragma once

#include <algorithm>
#include <cstdint>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "core/geometry.h"

namespace fs_test {

struct SampleMask {
  int nfunc = 1;
  std::vector<int32_t> ep;  // [nfunc, S]
};

// Deterministic integer in [lo, hi] (std distributions differ between library versions).
inline int64_t rand_int(std::mt19937_64& rng, int64_t lo, int64_t hi) {
  if (hi <= lo) return lo;
  return lo + static_cast<int64_t>(rng() % static_cast<uint64_t>(hi - lo + 1));
}

// Writes row q's intervals (sorted, disjoint, each [a, e)) as nfunc endpoints: the first
// interval must start at 0 (pass {0, 0} for "none"); unused slots repeat the last endpoint.
inline void write_row(SampleMask& m, int64_t S, int64_t q, const std::vector<std::pair<int64_t, int64_t>>& iv) {
  int f = 0;
  auto put = [&](int64_t v) { m.ep[static_cast<size_t>(f++) * S + q] = static_cast<int32_t>(v); };
  put(iv.empty() ? 0 : iv[0].second);
  for (size_t i = 1; i < iv.size(); ++i) {
    put(iv[i].first);
    put(iv[i].second);
  }
  const int32_t last = f > 0 ? m.ep[static_cast<size_t>(f - 1) * S + q] : 0;
  while (f < m.nfunc) put(last);
}

inline SampleMask mask_causal(int64_t S) {
  SampleMask m{1, std::vector<int32_t>(S)};
  for (int64_t q = 0; q < S; ++q) m.ep[q] = static_cast<int32_t>(q + 1);
  return m;
}

inline int64_t window_size(int64_t S) { return std::min<int64_t>(512, std::max<int64_t>(24, S / 16)); }

// Documents packed back to back; lengths uniform in [lo, hi], the last one truncated.
inline std::vector<int64_t> doc_starts(int64_t S, int64_t lo, int64_t hi, std::mt19937_64& rng) {
  std::vector<int64_t> starts;
  for (int64_t s = 0; s < S; s += rand_int(rng, lo, hi)) starts.push_back(s);
  starts.push_back(S);
  return starts;
}

inline SampleMask mask_document_causal(int64_t S, uint64_t seed = 1) {
  std::mt19937_64 rng(seed);
  const int64_t lo = S >= 32768 ? 4096 : std::max<int64_t>(8, S / 8);
  const int64_t hi = S >= 32768 ? 16384 : std::max<int64_t>(lo, S / 2);
  const auto st = doc_starts(S, lo, hi, rng);
  SampleMask m{3, std::vector<int32_t>(3 * S)};
  for (size_t d = 0; d + 1 < st.size(); ++d)
    for (int64_t q = st[d]; q < st[d + 1]; ++q) write_row(m, S, q, {{0, 0}, {st[d], q + 1}});
  return m;
}

inline SampleMask mask_local(int64_t S) {
  const int64_t w = window_size(S);
  SampleMask m{3, std::vector<int32_t>(3 * S)};
  for (int64_t q = 0; q < S; ++q) write_row(m, S, q, {{0, 0}, {std::max<int64_t>(0, q - w), q + 1}});
  return m;
}

inline SampleMask mask_sink_local(int64_t S) {
  const int64_t w = window_size(S), sink = 4;
  SampleMask m{3, std::vector<int32_t>(3 * S)};
  for (int64_t q = 0; q < S; ++q) {
    const int64_t f0 = std::min(q + 1, sink);
    const int64_t f1 = std::min(std::max(q - w, sink), q + 1);  // >= f0
    write_row(m, S, q, {{0, f0}, {f1, q + 1}});
  }
  return m;
}

// Complete binary tree of depth 7 (127 nodes, heap numbering: children of k are 2k+1,
// 2k+2), nodes laid out in DFS (preorder) or BFS (heap) order with lengths S/127 jittered
// by +-20%. A token sees every ancestor node's whole span plus its own node causally.
inline SampleMask mask_tree(int64_t S, bool dfs, uint64_t seed = 2) {
  constexpr int kNodes = 127;
  std::mt19937_64 rng(seed);
  std::vector<int> order;  // layout position -> node
  if (dfs) {
    std::vector<int> stack{0};
    while (!stack.empty()) {
      const int k = stack.back();
      stack.pop_back();
      order.push_back(k);
      if (2 * k + 2 < kNodes) {
        stack.push_back(2 * k + 2);
        stack.push_back(2 * k + 1);
      }
    }
  } else {
    for (int k = 0; k < kNodes; ++k) order.push_back(k);
  }
  std::vector<double> w(kNodes);
  double total = 0;
  for (auto& x : w) total += (x = 0.8 + 0.4 * static_cast<double>(rng() % 1000001) / 1e6);
  std::vector<int64_t> start(kNodes), end(kNodes);
  double acc = 0;
  for (int p = 0; p < kNodes; ++p) {
    const int k = order[p];
    start[k] = static_cast<int64_t>(S * acc / total);
    acc += w[p];
    end[k] = p + 1 == kNodes ? S : static_cast<int64_t>(S * acc / total);
  }
  SampleMask m{13, std::vector<int32_t>(13 * S)};
  for (int k = 0; k < kNodes; ++k) {
    std::vector<int> anc;  // root first
    for (int a = k; a > 0;) anc.insert(anc.begin(), a = (a - 1) / 2);
    for (int64_t q = start[k]; q < end[k]; ++q) {
      std::vector<std::pair<int64_t, int64_t>> iv;
      for (int a : anc) iv.push_back({start[a], end[a]});
      iv.push_back({start[k], q + 1});
      if (iv[0].first != 0) iv.insert(iv.begin(), {0, 0});  // cannot happen: the root starts at 0
      write_row(m, S, q, iv);
    }
  }
  return m;
}

// Window radius 256 plus 8 global tokens at (i+0.5)*S/8; global tokens see everything.
inline SampleMask mask_longformer(int64_t S) {
  const int64_t radius = std::min<int64_t>(256, std::max<int64_t>(12, S / 32));
  std::vector<int64_t> globals;
  for (int i = 0; i < 8; ++i) globals.push_back(static_cast<int64_t>((i + 0.5) * S / 8));
  SampleMask m{19, std::vector<int32_t>(19 * S)};
  for (int64_t q = 0; q < S; ++q) {
    if (std::find(globals.begin(), globals.end(), q) != globals.end()) {
      write_row(m, S, q, {{0, 0}, {0, S}});
      continue;
    }
    std::vector<std::pair<int64_t, int64_t>> iv;
    for (int64_t gk : globals) iv.push_back({gk, gk + 1});
    iv.push_back({std::max<int64_t>(0, q - radius), std::min<int64_t>(S, q + radius + 1)});
    std::sort(iv.begin(), iv.end());
    std::vector<std::pair<int64_t, int64_t>> merged{{0, 0}};
    for (auto [a, e] : iv) {
      if (merged.size() > 1 && a <= merged.back().second) merged.back().second = std::max(merged.back().second, e);
      else merged.push_back({a, e});
    }
    write_row(m, S, q, merged);
  }
  return m;
}

// Documents of 8K..16K split in a context half and a target half.
inline SampleMask mask_hstu(int64_t S, uint64_t seed = 3) {
  std::mt19937_64 rng(seed);
  const int64_t lo = S >= 32768 ? 8192 : std::max<int64_t>(8, S / 6);
  const int64_t hi = S >= 32768 ? 16384 : std::max<int64_t>(lo, S / 3);
  const auto st = doc_starts(S, lo, hi, rng);
  SampleMask m{5, std::vector<int32_t>(5 * S)};
  for (size_t d = 0; d + 1 < st.size(); ++d) {
    const int64_t ctx_end = st[d] + (st[d + 1] - st[d]) / 2;
    for (int64_t q = st[d]; q < st[d + 1]; ++q) {
      if (q < ctx_end) write_row(m, S, q, {{0, 0}, {st[d], q + 1}});
      else write_row(m, S, q, {{0, 0}, {st[d], ctx_end}, {q, q + 1}});
    }
  }
  return m;
}

// Random masks over a sample with Sk = lk keys and Sq = lq rows: sorted random endpoints.
// With `blocky`, endpoints snap to multiples of 32 and rows mostly repeat the previous row
// (redrawn at some 64-row boundaries and rarely elsewhere), which yields full blocks as
// well as partial ones.
inline SampleMask mask_random(int64_t lq, int64_t lk, int nfunc, bool blocky, uint64_t seed) {
  std::mt19937_64 rng(seed);
  SampleMask m{nfunc, std::vector<int32_t>(static_cast<size_t>(nfunc) * lq)};
  std::vector<int64_t> e(nfunc);
  for (int64_t q = 0; q < lq; ++q) {
    const bool redraw = !blocky || q == 0 || (q % 64 == 0 && rng() % 2 == 0) || rng() % 256 == 0;
    if (redraw) {
      for (auto& x : e) {
        x = rand_int(rng, 0, lk);
        if (blocky && rng() % 4 != 0) x = std::min<int64_t>(lk, x / 32 * 32);
      }
      std::sort(e.begin(), e.end());
    }
    for (int f = 0; f < nfunc; ++f) m.ep[static_cast<size_t>(f) * lq + q] = static_cast<int32_t>(e[f]);
  }
  return m;
}

// Many full runs per row (issue 17): (nfunc + 1) / 2 alternating visible / hidden intervals.
// Row q's intervals are [start_j, start_j + width_j) with gaps between them; widths and gaps
// are multiples of `unit` (64: whole key blocks of every tile, so most query blocks have
// (nfunc + 1) / 2 full runs) drawn per band of `band` rows, shifted by a per-band offset;
// every third band is jittered by q % 5 keys per row (partial blocks at the run edges).
// The first interval starts at 0 for even bands (endpoint 0 is its end), else is empty.
inline SampleMask mask_many_runs(int64_t lq, int64_t lk, int nfunc, uint64_t seed, int64_t unit = 64,
                                 int64_t band = 128) {
  std::mt19937_64 rng(seed);
  SampleMask m{nfunc, std::vector<int32_t>(static_cast<size_t>(nfunc) * lq)};
  const int nint = (nfunc + 1) / 2;
  std::vector<int64_t> widths(nint), gaps(nint);
  int64_t offset = 0;
  bool jitter = false, first_at_zero = true;
  for (int64_t q = 0; q < lq; ++q) {
    if (q % band == 0) {
      for (int j = 0; j < nint; ++j) {
        widths[j] = unit * rand_int(rng, 1, 3);
        gaps[j] = unit * rand_int(rng, 1, 2);
      }
      offset = unit * rand_int(rng, 1, 2);
      jitter = (q / band) % 3 == 2;
      first_at_zero = (q / band) % 2 == 0;
    }
    const int64_t wiggle = jitter ? q % 5 : 0;  // < unit: keeps the intervals ordered
    std::vector<std::pair<int64_t, int64_t>> iv;
    if (!first_at_zero) iv.push_back({0, 0});  // first interval empty: nint - 1 real ones
    int64_t pos = first_at_zero ? 0 : offset;
    for (int j = first_at_zero ? 0 : 1; j < nint; ++j) {
      const int64_t a = std::min(lk, pos + (j > 0 ? wiggle : 0));
      const int64_t e = std::min(lk, pos + widths[j] + wiggle);
      if (j == 0) iv.push_back({0, e});
      else if (a < e) iv.push_back({a, e});
      pos += widths[j] + gaps[j];  // gaps >= unit > wiggle: the intervals stay ordered
    }
    write_row(m, lq, q, iv);
  }
  return m;
}

inline SampleMask mask_by_name(const std::string& name, int64_t S) {
  if (name == "causal") return mask_causal(S);
  if (name == "document_causal") return mask_document_causal(S);
  if (name == "local") return mask_local(S);
  if (name == "sink_local") return mask_sink_local(S);
  if (name == "tree_dfs") return mask_tree(S, true);
  if (name == "tree_bfs") return mask_tree(S, false);
  if (name == "longformer") return mask_longformer(S);
  if (name == "hstu") return mask_hstu(S);
  return {};
}

inline const std::vector<std::string>& benchmark_mask_names() {
  static const std::vector<std::string> names{"causal",   "document_causal", "local",      "sink_local",
                                              "tree_dfs", "tree_bfs",        "longformer", "hstu"};
  return names;
}

// Geometry for planner tests (device CPU; dtype bf16; head dims 128). `lq`, `lk` give the
// per-sample lengths; BSHD needs equal lengths across samples.
inline flashspan::FlexGeometry make_geometry(bool varlen, const std::vector<int64_t>& lq,
                                             const std::vector<int64_t>& lk, int hq, int hkv, int hmask, int nfunc) {
  flashspan::FlexGeometry g;
  g.varlen = varlen;
  g.batch = static_cast<int>(lq.size());
  g.num_heads_q = hq;
  g.num_heads_kv = hkv;
  g.num_heads_mask = hmask;
  g.nfunc = nfunc;
  g.head_dim_qk = g.head_dim_v = 128;
  g.dtype = flashspan::DType::kBFloat16;
  g.cu_seqlens_q.assign(1, 0);
  g.cu_seqlens_k.assign(1, 0);
  for (size_t b = 0; b < lq.size(); ++b) {
    g.cu_seqlens_q.push_back(static_cast<int32_t>(g.cu_seqlens_q.back() + lq[b]));
    g.cu_seqlens_k.push_back(static_cast<int32_t>(g.cu_seqlens_k.back() + lk[b]));
    g.max_seqlen_q = std::max(g.max_seqlen_q, lq[b]);
    g.max_seqlen_k = std::max(g.max_seqlen_k, lk[b]);
  }
  g.total_q = g.cu_seqlens_q.back();
  g.total_k = g.cu_seqlens_k.back();
  return g;
}

// Assembles a [Hmask, nfunc, total_q] mask from per-(head, sample) masks (same nfunc).
inline std::vector<int32_t> assemble_mask(const flashspan::FlexGeometry& g,
                                          const std::vector<std::vector<SampleMask>>& per_head_sample) {
  std::vector<int32_t> out(static_cast<size_t>(g.num_heads_mask) * g.nfunc * g.total_q);
  for (int hm = 0; hm < g.num_heads_mask; ++hm)
    for (int b = 0; b < g.batch; ++b) {
      const SampleMask& s = per_head_sample[hm][b];
      const int64_t lq = g.seqlen_q(b);
      for (int f = 0; f < g.nfunc; ++f)
        for (int64_t q = 0; q < lq; ++q)
          out[(static_cast<size_t>(hm) * g.nfunc + f) * g.total_q + g.cu_seqlens_q[b] + q] =
              s.ep[static_cast<size_t>(f) * lq + q];
    }
  return out;
}

}  // namespace fs_test
