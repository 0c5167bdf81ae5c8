// The SDPA dispatch on the host (dispatch/sdpa_params.cpp): the parameters the analytic-mask
// kernels get for a call (strides, per-tensor sample starts, lengths, band, workspace rows),
// run through a scalar model of the sm80 kernels' block structure (kernel_fwd_sm80.cuh fwd_item,
// kernel_bwd_sm80.cuh dkdv_item and the dQ kernel, bwd_prepost.cuh) built from the kernels' own
// device helpers compiled for the host (analytic_seqlen.cuh, analytic_mask.h: lengths, sample
// starts, rows a block stores, the Q2K / K2Q cursors and walk, the block-mask terms), against
// the SDPA CPU reference on the same inputs. It checks, without a GPU, everything of the
// native path but the mma fragments (whose (row, col) mapping is the payload's, and which the
// GPU tests cover): random cases of sdpa_case.h (padding NaN-poisoned, THD with gaps and empty
// samples, GQA, both alignments, every layout), outputs NaN-poisoned, padded rows 0 / -inf,
// gaps untouched.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <vector>

#include "core/half_conv.h"
#include "core/philox.h"
#include "core/sdpa_problem.h"
#include "dispatch/sdpa_launch.h"
#include "error_criteria.h"
#include "kernels/sm80/tile_sm80.h"
#include "reference/sdpa_reference.h"
#include "sdpa_case.h"
#include "scoped_env.h"

// The analytic kernels' device helpers, compiled for the host (plain integer code and loads).
#define __device__
#define __forceinline__ inline
template <class T>
inline T __ldg(const T* p) {
  return *p;
}
#include "kernels/common/analytic_seqlen.cuh"
#undef __device__
#undef __forceinline__

namespace flashspan::test {
namespace {

using namespace sdpa_case;
using kern::AnalyticCursor;
using kern::AnalyticK2QWalk;
using kern::AnalyticSeqlen;
using kern::KeyBlockMask;
using kern::QueryBlockMask;
using kern::TileMask;

constexpr double kLn2 = 0.6931471805599453, kLog2e = 1.4426950408889634;

// ---------------------------------------------------------------------------
// One call on host memory: storages, index arrays, the validated sdpa::Problem
// ---------------------------------------------------------------------------

struct Index {
  std::vector<int64_t> v;
  bool is64 = false;
  std::vector<uint8_t> bytes;
  void make(const std::vector<int64_t>& values, bool i64) {
    v = values;
    is64 = i64;
    bytes.resize(std::max<size_t>(v.size(), 1) * (i64 ? 8 : 4));
    for (size_t i = 0; i < v.size(); ++i) {
      if (i64) {
        std::memcpy(bytes.data() + 8 * i, &v[i], 8);
      } else {
        const int32_t x = int32_t(v[i]);
        std::memcpy(bytes.data() + 4 * i, &x, 4);
      }
    }
  }
  bool defined() const { return !v.empty(); }
  TensorView view() const {
    TensorView t;
    t.data = nullptr;
    t.dtype = is64 ? DType::kInt64 : DType::kInt32;
    t.ndim = 1;
    t.shape[0] = int64_t(v.size());
    t.strides[0] = 1;
    return t;
  }
};

struct Call {
  Case c;
  std::vector<int64_t> len_q, len_kv;
  Storage q, k, v, o, stats, dO, dq, dk, dv;
  Storage gate, smax, ssum, dgate;  // Case::gate, Case::score_stats (the reference's outputs)
  Storage bias, dbias;              // Case::bias, Case::dbias (the reference's dBias)
  BlockMaskBits bm;                 // Case::block_mask
  Index seq_q, seq_kv, cu_q, cu_kv, rag_q, rag_kv;
  Index drop_seed, drop_offset;  // Case::dropout_p > 0
};

std::unique_ptr<Call> make_call(const Case& c) {
  auto p = std::make_unique<Call>();
  p->c = c;
  std::mt19937_64 rng(c.seed * 7919 + 17);
  sample_lengths(c, rng, p->len_q, p->len_kv);
  const bool pad = c.lengths != 0 || c.kind_q == Kind::kThd || c.kind_kv == Kind::kThd;
  const bool gaps = c.lengths != 2;
  const std::vector<int64_t> tq = token_offsets(p->len_q, gaps, rng), tk = token_offsets(p->len_kv, gaps, rng);
  p->q.alloc_host(make_layout(c.kind_q, c.B, c.Hq, c.Sq, c.Dqk, tq), c.dtype);
  p->dq.alloc_host(p->q.lay, c.dtype);
  p->o.alloc_host(make_layout(c.kind_q, c.B, c.Hq, c.Sq, c.Dv, tq), c.dtype);
  p->dO.alloc_host(p->o.lay, c.dtype);
  p->stats.alloc_host(make_layout(c.kind_q == Kind::kThd ? Kind::kThd : Kind::kBhsd, c.B, c.Hq, c.Sq, 1, tq),
                      DType::kFloat32);
  p->k.alloc_host(make_layout(c.kind_kv, c.B, c.Hk, c.Skv, c.Dqk, tk), c.dtype);
  p->dk.alloc_host(p->k.lay, c.dtype);
  p->v.alloc_host(make_layout(c.kind_kv, c.B, c.Hk, c.Skv, c.Dv, tk), c.dtype);
  p->dv.alloc_host(p->v.lay, c.dtype);
  fill_valid(p->q, p->len_q, rng);
  fill_valid(p->k, p->len_kv, rng);
  fill_valid(p->v, p->len_kv, rng);
  fill_valid(p->dO, p->len_q, rng);
  if (c.gate) {
    p->gate.alloc_host(p->o.lay, c.dtype);
    p->dgate.alloc_host(p->o.lay, c.dtype);
    fill_valid(p->gate, p->len_q, rng, 2.0);
  }
  if (c.score_stats) {
    p->smax.alloc_host(make_layout(Kind::kBhsd, c.B, c.Hq, c.Sq, 1, tq), DType::kFloat32);
    p->ssum.alloc_host(p->smax.lay, DType::kFloat32);
  }
  if (c.block_mask) p->bm.make(c, rng);
  if (c.bias) {
    p->bias.alloc_host(bias_layout(c), c.bias_f32 ? DType::kFloat32 : c.dtype);
    fill_bias(p->bias, c, p->len_q, p->len_kv, rng);
    if (c.dbias) p->dbias.alloc_host(p->bias.lay, p->bias.dtype);
  }
  if (c.lengths == 2) {
    p->cu_q.make(prefix_sums(p->len_q), c.lengths64);
    p->cu_kv.make(prefix_sums(p->len_kv), c.lengths64);
  } else if (pad) {
    p->seq_q.make(p->len_q, c.lengths64);
    p->seq_kv.make(p->len_kv, c.lengths64);
  }
  if (c.kind_q == Kind::kThd) p->rag_q.make(tq, !c.lengths64);
  if (c.kind_kv == Kind::kThd) p->rag_kv.make(tk, c.lengths64);
  if (c.dropout_p > 0) {
    p->drop_seed.make({c.dropout_seed}, c.dropout_i64);
    p->drop_offset.make({c.dropout_offset}, c.dropout_i64);
  }
  return p;
}

TensorView view_of(const Storage& s) {
  TensorView t;
  t.dtype = s.dtype;
  t.ndim = 4;
  const int64_t shape[4] = {s.lay.B, s.lay.H, s.lay.S, s.lay.D};
  for (int d = 0; d < 4; ++d) {
    t.shape[d] = shape[d];
    t.strides[d] = s.lay.strides[size_t(d)];
  }
  return t;
}

// The validated problem of the call, bound to the given storages of its outputs (the inputs
// are the call's): ep = {score_max, score_sum_exp} (forward) or {dgate} (backward) when the
// case has them.
sdpa::Problem problem(Call& p, bool backward, Storage& o, Storage& stats, Storage* dq, Storage* dk, Storage* dv,
                      std::vector<Storage*> ep = {}, Storage* dbias = nullptr) {
  const Case& c = p.c;
  sdpa::Attributes a;
  a.backward = backward;
  std::vector<std::pair<int, Storage*>> ts = {{FS_SDPA_Q, &p.q}, {FS_SDPA_K, &p.k}, {FS_SDPA_V, &p.v},
                                              {FS_SDPA_O, &o},   {FS_SDPA_STATS, &stats}};
  if (backward) {
    ts.insert(ts.end(), {{FS_SDPA_DO, &p.dO}, {FS_SDPA_DQ, dq}, {FS_SDPA_DK, dk}, {FS_SDPA_DV, dv}});
  }
  if (c.gate) ts.push_back({FS_SDPA_GATE, &p.gate});
  if (c.gate && backward) ts.push_back({FS_SDPA_DGATE, ep.at(0)});
  if (c.score_stats && !backward) ts.insert(ts.end(), {{FS_SDPA_SCORE_MAX, ep.at(0)}, {FS_SDPA_SCORE_SUM_EXP, ep.at(1)}});
  if (c.bias) ts.push_back({FS_SDPA_BIAS, &p.bias});
  if (c.bias && c.dbias && backward) ts.push_back({FS_SDPA_DBIAS, dbias});
  void* pack[sdpa::kNumSlots] = {};
  for (auto& [slot, s] : ts) {
    a.tensors[size_t(slot)] = view_of(*s);
    pack[slot] = s->host.data();
    if (s->lay.ragged()) {
      const bool q_side = slot == FS_SDPA_Q || slot == FS_SDPA_O || slot == FS_SDPA_STATS || slot == FS_SDPA_DO ||
                          slot == FS_SDPA_DQ || slot == FS_SDPA_GATE || slot == FS_SDPA_DGATE;
      const Index& r = q_side ? p.rag_q : p.rag_kv;
      const int rs = sdpa::ragged_slot_of(slot);
      a.tensors[size_t(rs)] = r.view();
      a.ragged_multiplier[size_t(rs)] = s->lay.strides[2];
      pack[rs] = const_cast<uint8_t*>(r.bytes.data());
    }
  }
  for (auto [slot, idx] : {std::pair<int, Index*>{FS_SDPA_SEQ_LEN_Q, &p.seq_q}, {FS_SDPA_SEQ_LEN_KV, &p.seq_kv},
                           {FS_SDPA_CU_SEQ_LEN_Q, &p.cu_q}, {FS_SDPA_CU_SEQ_LEN_KV, &p.cu_kv}}) {
    if (!idx->defined()) continue;
    a.tensors[size_t(slot)] = idx->view();
    pack[slot] = idx->bytes.data();
    a.padding_mask = true;
  }
  if (c.block_mask) {
    TensorView m;
    m.dtype = DType::kUInt8;
    m.ndim = 4;
    const std::vector<int64_t> str = p.bm.strides();
    for (int d = 0; d < 4; ++d) {
      m.shape[d] = p.bm.shape[d];
      m.strides[d] = str[size_t(d)];
    }
    a.tensors[size_t(FS_SDPA_BLOCK_MASK)] = m;
    pack[FS_SDPA_BLOCK_MASK] = p.bm.bytes.data();
  }
  if (c.dropout_p > 0) {
    a.dropout_probability = c.dropout_p;
    for (auto [slot, idx] :
         {std::pair<int, Index*>{FS_SDPA_DROPOUT_SEED, &p.drop_seed}, {FS_SDPA_DROPOUT_OFFSET, &p.drop_offset}}) {
      a.tensors[size_t(slot)] = idx->view();
      pack[slot] = idx->bytes.data();
    }
  }
  a.attn_scale_value = c.scale;
  a.alignment = c.bottom_right ? FS_SDPA_BOTTOM_RIGHT : FS_SDPA_TOP_LEFT;
  if (c.has_left) a.left_bound = c.left;
  if (c.has_right) a.right_bound = c.right;
  if (!backward) {
    a.generate_stats = true;
    a.stats_use_log2 = c.log2_stats;
  }
  a.deterministic = c.deterministic;
  sdpa::Problem pr = backward ? sdpa::validate_backward(a) : sdpa::validate_forward(a);
  pr.bind(pack, sdpa::kNumSlots);
  return pr;
}

// ---------------------------------------------------------------------------
// The scalar model of the kernels, on the parameters dispatch gives them
// ---------------------------------------------------------------------------

double ld(DType t, const void* base, int64_t off) {
  const uint16_t x = static_cast<const uint16_t*>(base)[off];
  return t == DType::kBFloat16 ? bf16_bits_to_float(x) : half_bits_to_float(x);
}
void st(DType t, void* base, int64_t off, double x) {
  static_cast<uint16_t*>(base)[off] =
      t == DType::kBFloat16 ? float_to_bf16_bits(float(x)) : float_to_half_bits(float(x));
}

// The bias of element (b, h, i, j) in natural units as the kernels read it (SdpaBiasParams; 0
// without a bias).
double bias_at(const SdpaBiasParams& bp, int b, int h, int64_t i, int64_t j) {
  if (bp.bias == nullptr) return 0.0;
  const int64_t off = b * bp.batch_stride + h * bp.head_stride + i * bp.row_stride + j * bp.col_stride;
  if (bp.dtype == kSdpaBiasF32) return static_cast<const float*>(bp.bias)[off];
  return ld(bp.dtype == kSdpaBiasBF16 ? DType::kBFloat16 : DType::kFloat16, bp.bias, off);
}

// The dropout multiplier of element (b, h, i, j) as the kernels form it (SdpaDropoutParams, Philox
// form: core/philox.h with the seed / offset read through the kernels' load_index); 1 without.
double drop_at(const SdpaDropoutParams& dp, int b, int h, int num_heads, int64_t i, int64_t j) {
  if (dp.mode == 0) return 1.0;
  const uint64_t seed = uint64_t(kern::load_index(dp.seed, 0)), offset = uint64_t(kern::load_index(dp.offset, 0));
  const bool keep = dropout_keep(seed, offset, uint32_t(b * num_heads + h), uint32_t(i), uint32_t(j), dp.threshold);
  return keep ? dp.scale : 0.0;
}

// Element of (sample b, row, head h, column d) of one tensor, as the kernels address it.
int64_t at(const AnalyticMaskParams& a, int x, const TensorAddr& ad, int b, int64_t row, int h, int d) {
  return kern::sample_start(a.start[x], b) + row * ad.row_stride + int64_t(h) * ad.head_stride + d;
}

// A row of q / k / v / dO of a sample, zero past the sample's length (the kernels zero-fill).
std::vector<double> row_of(DType t, const void* base, const AnalyticMaskParams& a, int x, const TensorAddr& ad, int b,
                           int64_t row, int64_t len, int h, int dim) {
  std::vector<double> r(size_t(dim), 0.0);
  if (row < len)
    for (int d = 0; d < dim; ++d) r[size_t(d)] = ld(t, base, at(a, x, ad, b, row, h, d));
  return r;
}

double dot(const std::vector<double>& x, const std::vector<double>& y) {
  double s = 0;
  for (size_t i = 0; i < x.size(); ++i) s += x[i] * y[i];
  return s;
}

// fwd_item over the grid of sdpa_fwd_kernel_sm80 (tile bq x bk).
void model_forward(const SdpaFwdParams& p, DType t, int bq, int bk) {
  const AnalyticMaskParams& a = p.analytic;
  const int nqb = (a.max_q + bq - 1) / bq;
  for (int b = 0; b < p.batch; ++b)
    for (int h = 0; h < p.num_heads_q; ++h)
      for (int qb = 0; qb < nqb; ++qb) {
        const AnalyticSeqlen sl(a, b);
        const int row0 = qb * bq, rows_valid = std::min(bq, sl.len_q - row0);
        const int rows_store = kern::rows_to_store(a, kSdpaO, row0, bq, rows_valid + row0, a.max_q);
        if (rows_store <= 0) continue;
        const int hkv = h / p.group_size;
        const QueryBlockMask qm = QueryBlockMask::make(sl.mask, row0);
        for (int r = 0; r < rows_store; ++r) {
          const std::vector<double> qi = row_of(t, p.q, a, kSdpaQ, p.qa, b, row0 + r, sl.len_q, h, p.head_dqk);
          std::vector<std::pair<double, int>> xs;  // (logit, key) of the visible keys
          kern::BlockMaskedCursor cur = kern::masked_q2k_cursor(a, sl, h, qb, bq, bk);
          int blk = 0, entry = 0;
          bool partial = false;
          while (cur.next(blk, partial, entry)) {
            const TileMask tm = qm.tile(int64_t(blk) * bk);
            for (int col = 0; col < bk; ++col) {
              if (partial && !tm.visible(r, col)) continue;
              const int key = blk * bk + col;
              const std::vector<double> kj = row_of(t, p.k, a, kSdpaK, p.ka, b, key, sl.len_k, hkv, p.head_dqk);
              xs.emplace_back(double(p.scale) * dot(qi, kj) + bias_at(a.bias, b, h, row0 + r, key), key);
            }
          }
          double m = -INFINITY, l = 0;
          for (auto& x : xs) m = std::max(m, x.first);
          for (auto& x : xs) l += std::exp(x.first - m);
          const SdpaEpilogueParams& ep = a.epi;  // fwd_store_rows_sm80 / sdpa_fwd_row_epilogue
          for (int d = 0; d < p.head_dv; ++d) {
            double o = 0;
            for (auto& x : xs)
              o += std::exp(x.first - m) / l * drop_at(a.dropout, b, h, p.num_heads_q, row0 + r, x.second) *
                   ld(t, p.v, at(a, kSdpaV, p.va, b, x.second, hkv, d));
            if (ep.gate != nullptr && !xs.empty()) o /= 1.0 + std::exp(-ld(t, ep.gate, at(a, kSdpaGate, ep.ga, b, row0 + r, h, d)));
            st(t, p.o, at(a, kSdpaO, p.oa, b, row0 + r, h, d), xs.empty() ? 0.0 : o);
          }
          if (ep.score_max != nullptr) ep.score_max[at(a, kSdpaScoreMax, ep.sma, b, row0 + r, h, 0)] = float(m);
          if (ep.score_sum_exp != nullptr) ep.score_sum_exp[at(a, kSdpaScoreSumExp, ep.ssa, b, row0 + r, h, 0)] = float(l);
          if (p.lse != nullptr) {
            const double lse = xs.empty() ? -INFINITY : (m + std::log(l)) * (double(a.lse_unit) / kLn2);
            p.lse[at(a, kSdpaStats, p.lsea, b, row0 + r, h, 0)] = float(lse);
          }
        }
      }
}

// The backward kernels (preprocess, dK/dV with dQ atomics or the dQ kernel, dQ convert) on
// their grids (tile bq x bk).
// The preprocess (bwd_prepost.cuh): rows of every sample padded to S_q; with the gate, dgate and
// dO * sigmoid(G) into the workspace.
void model_preprocess(const SdpaBwdParams& p, DType t) {
  const AnalyticMaskParams& a = p.analytic;
  const SdpaEpilogueParams& ep = a.epi;
  const int Dv = p.head_dv;
  for (int h = 0; h < p.num_heads_q; ++h)
    for (int64_t tq = 0; tq < p.total_q; ++tq) {
      const int b = int(tq / p.seqlen_q), i = int(tq % p.seqlen_q);
      const int64_t w = int64_t(h) * p.total_q + tq;
      if (i >= AnalyticSeqlen(a, b).len_q) {
        p.delta[w] = 0.0f;
        p.lse2[w] = INFINITY;
        if (ep.dgate != nullptr && a.start[kSdpaDGate].ragged.ptr == nullptr)
          for (int d = 0; d < Dv; ++d) st(t, ep.dgate, at(a, kSdpaDGate, ep.dga, b, i, h, d), 0.0);
        continue;
      }
      double acc = 0;
      for (int d = 0; d < Dv; ++d) {
        const double o = ld(t, p.o, at(a, kSdpaO, p.oa, b, i, h, d)), dO = ld(t, p.dout, at(a, kSdpaDO, p.doa, b, i, h, d));
        acc += o * dO;
        if (ep.gate != nullptr) {
          const double s = 1.0 / (1.0 + std::exp(-ld(t, ep.gate, at(a, kSdpaGate, ep.ga, b, i, h, d))));
          if (ep.dgate != nullptr) st(t, ep.dgate, at(a, kSdpaDGate, ep.dga, b, i, h, d), dO * o * (1.0 - s));
          st(t, ep.do_gated, w * Dv + d, dO * s);
        }
      }
      p.delta[w] = float(acc);
      const float lse = p.lse[at(a, kSdpaStats, p.lsea, b, i, h, 0)];
      p.lse2[w] = lse == -INFINITY ? INFINITY : float(double(lse) * kLog2e);
    }
}

void model_backward(const SdpaBwdParams& p_in, DType t, int bq, int bk) {
  model_preprocess(p_in, t);
  const SdpaBwdParams p = sdpa_bwd_main_params(p_in);  // the launcher's parameters of the kernels after it
  const AnalyticMaskParams& a = p.analytic;
  const int Dqk = p.head_dqk, Dv = p.head_dv, G = p.group_size;
  if (!p.deterministic) std::fill(p.dq_accum, p.dq_accum + size_t(p.num_heads_q) * size_t(p.total_q) * Dqk, 0.0f);
  // One (query row i, key j) pair of head h: P and dS (0 when P is 0).
  auto pair = [&](int b, int h, int hkv, int i, int j, const AnalyticSeqlen& sl, double& P, double& dS) {
    const int64_t w = int64_t(h) * p.total_q + sl.q_start + i;
    const std::vector<double> qi = row_of(t, p.q, a, kSdpaQ, p.qa, b, i, sl.len_q, h, Dqk);
    const std::vector<double> kj = row_of(t, p.k, a, kSdpaK, p.ka, b, j, sl.len_k, hkv, Dqk);
    const std::vector<double> doi = row_of(t, p.dout, a, kSdpaDO, p.doa, b, i, sl.len_q, h, Dv);
    const std::vector<double> vj = row_of(t, p.v, a, kSdpaV, p.va, b, j, sl.len_k, hkv, Dv);
    const double lse2 = i < sl.len_q ? p.lse2[w] : INFINITY, delta = i < sl.len_q ? p.delta[w] : 0.0;
    P = std::exp2((dot(qi, kj) * p.scale + bias_at(a.bias, b, h, i, j)) * kLog2e - lse2);
    dS = P * (drop_at(a.dropout, b, h, p.num_heads_q, i, j) * dot(doi, vj) - delta);
  };
  // dBias: the dS workspace (SdpaBiasParams::ds) cleared by the launcher, written by the dK/dV kernel.
  const SdpaBiasParams& bp = a.bias;
  if (bp.ds != nullptr)
    std::fill(bp.ds, bp.ds + size_t(p.batch) * size_t(p.num_heads_q) * size_t(a.max_q) * size_t(bp.ds_ld), 0.0f);
  // dK/dV: one item per (key block of a sample padded to S_kv, kv head).
  const int nkb = (a.max_kv + bk - 1) / bk;
  for (int b = 0; b < p.batch; ++b)
    for (int hkv = 0; hkv < p.num_heads_q / G; ++hkv)
      for (int kb = 0; kb < nkb; ++kb) {
        const AnalyticSeqlen sl(a, b);
        const int key0 = kb * bk, keys_valid = std::min(bk, sl.len_k - key0);
        const int keys_store = kern::rows_to_store(a, kSdpaDK, key0, bk, keys_valid + key0, a.max_kv);
        if (keys_store <= 0) continue;
        AnalyticK2QWalk walk = kern::masked_k2q_walk(a, sl, hkv * G, (hkv + 1) * G, 0x7fffffff, kb, bq, bk);
        walk.seek(0);
        const KeyBlockMask km = KeyBlockMask::make(sl.mask, key0);
        std::vector<double> dk(size_t(bk * Dqk), 0.0), dv(size_t(bk * Dv), 0.0);
        int h = 0, qb = 0, payload = 0;
        while (walk.next(h, qb, payload)) {
          const TileMask tm = km.tile(int64_t(qb) * bq);
          for (int r = 0; r < bq; ++r)
            for (int col = 0; col < bk; ++col) {
              if (payload >= 0 && !tm.visible(r, col)) continue;
              const int i = qb * bq + r, j = key0 + col;
              double P = 0, dS = 0;
              pair(b, h, hkv, i, j, sl, P, dS);
              if (P == 0) continue;
              if (bp.ds != nullptr) bp.ds[((int64_t(b) * p.num_heads_q + h) * a.max_q + i) * bp.ds_ld + j] = float(dS);
              const std::vector<double> qi = row_of(t, p.q, a, kSdpaQ, p.qa, b, i, sl.len_q, h, Dqk);
              const std::vector<double> doi = row_of(t, p.dout, a, kSdpaDO, p.doa, b, i, sl.len_q, h, Dv);
              for (int d = 0; d < Dqk; ++d) dk[size_t(col * Dqk + d)] += dS * qi[size_t(d)];
              const double pm = P * drop_at(a.dropout, b, h, p.num_heads_q, i, j);  // dV takes P times the multiplier
              for (int d = 0; d < Dv; ++d) dv[size_t(col * Dv + d)] += pm * doi[size_t(d)];
              if (!p.deterministic) {
                const std::vector<double> kj = row_of(t, p.k, a, kSdpaK, p.ka, b, j, sl.len_k, hkv, Dqk);
                float* acc = p.dq_accum + (int64_t(h) * p.total_q + sl.q_start + i) * Dqk;
                for (int d = 0; d < Dqk; ++d) acc[d] += float(dS * kj[size_t(d)]);
              }
            }
        }
        for (int col = 0; col < keys_store; ++col) {
          for (int d = 0; d < Dqk; ++d) {
            st(t, p.dk, at(a, kSdpaDK, p.dka, b, key0 + col, hkv, d), dk[size_t(col * Dqk + d)] * p.scale);
          }
          for (int d = 0; d < Dv; ++d) st(t, p.dv, at(a, kSdpaDV, p.dva, b, key0 + col, hkv, d), dv[size_t(col * Dv + d)]);
        }
      }
  if (bp.dbias != nullptr) {
    // sdpa_dbias_reduce / sdpa_dbias_reduce_cols (bwd_prepost.cuh): each dBias element sums the workspace
    // over the broadcast dimensions (the order aside: the kernels' is a fixed lane split and shuffle tree,
    // or fixed runs of terms).
    const int64_t* n = bp.dbias_size;
    for (int64_t b1 = 0; b1 < n[0]; ++b1)
      for (int64_t h1 = 0; h1 < n[1]; ++h1)
        for (int64_t i1 = 0; i1 < n[2]; ++i1)
          for (int64_t j1 = 0; j1 < n[3]; ++j1) {
            double acc = 0;
            for (int64_t b0 = 0; b0 < (n[0] == 1 ? p.batch : 1); ++b0)
              for (int64_t h0 = 0; h0 < (n[1] == 1 ? p.num_heads_q : 1); ++h0)
                for (int64_t i0 = 0; i0 < (n[2] == 1 ? a.max_q : 1); ++i0)
                  for (int64_t j0 = 0; j0 < (n[3] == 1 ? a.max_kv : 1); ++j0) {
                    const int64_t b = n[0] == 1 ? b0 : b1, h = n[1] == 1 ? h0 : h1;
                    const int64_t i = n[2] == 1 ? i0 : i1, j = n[3] == 1 ? j0 : j1;
                    acc += bp.ds[((b * p.num_heads_q + h) * a.max_q + i) * bp.ds_ld + j];
                  }
            const int64_t off = b1 * bp.dbias_stride[0] + h1 * bp.dbias_stride[1] + i1 * bp.dbias_stride[2] +
                                j1 * bp.dbias_stride[3];
            if (bp.dbias_dtype == kSdpaBiasF32) {
              static_cast<float*>(bp.dbias)[off] = float(acc);
            } else {
              st(bp.dbias_dtype == kSdpaBiasBF16 ? DType::kBFloat16 : DType::kFloat16, bp.dbias, off, acc);
            }
          }
  }
  if (!p.deterministic) {
    // dQ convert: rows of every sample padded to S_q; a ragged dQ skips the rows past a sample.
    for (int h = 0; h < p.num_heads_q; ++h)
      for (int64_t tq = 0; tq < p.total_q; ++tq) {
        const int b = int(tq / p.seqlen_q), i = int(tq % p.seqlen_q);
        if (a.start[kSdpaDQ].ragged.ptr != nullptr && i >= AnalyticSeqlen(a, b).len_q) continue;
        const float* acc = p.dq_accum + (int64_t(h) * p.total_q + tq) * Dqk;
        for (int d = 0; d < Dqk; ++d) st(t, p.dq, at(a, kSdpaDQ, p.dqa, b, i, h, d), double(acc[d]) * p.scale);
      }
    return;
  }
  // The deterministic dQ kernel: one item per (query block of a sample padded to S_q, head).
  const int nqb = (a.max_q + bq - 1) / bq;
  for (int b = 0; b < p.batch; ++b)
    for (int h = 0; h < p.num_heads_q; ++h)
      for (int qb = 0; qb < nqb; ++qb) {
        const AnalyticSeqlen sl(a, b);
        const int row0 = qb * bq, rows_valid = std::min(bq, sl.len_q - row0);
        const int rows_store = kern::rows_to_store(a, kSdpaDQ, row0, bq, rows_valid + row0, a.max_q);
        if (rows_store <= 0) continue;
        const QueryBlockMask qm = QueryBlockMask::make(sl.mask, row0);
        std::vector<double> dq(size_t(bq * Dqk), 0.0);
        kern::BlockMaskedCursor cur = kern::masked_q2k_cursor(a, sl, h, qb, bq, bk);
        int kb = 0, entry = 0;
        bool partial = false;
        while (cur.next(kb, partial, entry)) {
          const TileMask tm = qm.tile(int64_t(kb) * bk);
          for (int r = 0; r < bq; ++r)
            for (int col = 0; col < bk; ++col) {
              if (partial && !tm.visible(r, col)) continue;
              const int i = row0 + r, j = kb * bk + col;
              double P = 0, dS = 0;
              pair(b, h, h / G, i, j, sl, P, dS);
              if (P == 0) continue;
              const std::vector<double> kj = row_of(t, p.k, a, kSdpaK, p.ka, b, j, sl.len_k, h / G, Dqk);
              for (int d = 0; d < Dqk; ++d) dq[size_t(r * Dqk + d)] += dS * kj[size_t(d)];
            }
        }
        for (int r = 0; r < rows_store; ++r)
          for (int d = 0; d < Dqk; ++d) st(t, p.dq, at(a, kSdpaDQ, p.dqa, b, row0 + r, h, d), dq[size_t(r * Dqk + d)] * p.scale);
      }
}

// ---------------------------------------------------------------------------
// Model against the reference
// ---------------------------------------------------------------------------

::testing::AssertionResult same(const Storage& ref, const Storage& got, bool stat) {
  const std::vector<double> r = Storage::values(ref.host, ref.dtype), g = Storage::values(got.host, got.dtype);
  for (size_t i = 0; i < r.size(); ++i)
    if (std::isnan(r[i]) && !std::isnan(g[i]))
      return ::testing::AssertionFailure() << "element " << i << " outside the samples was written: " << g[i];
  return stat ? fs_test::stat_close(g, r) : fs_test::tensor_close(g, r, ref.dtype);
}

void run_case(const Case& c) {
  SCOPED_TRACE(c.str());
  auto call = make_call(c);
  Call& p = *call;
  const sm80::TileSm80 tile = sm80::tile_sm80(int(c.Dqk), int(c.Dv));
  // Forward: the reference into (o, stats), the model into fresh NaN storages.
  Storage o_m, st_m, smax_m, ssum_m, dgate_m;
  o_m.alloc_host(p.o.lay, p.o.dtype);
  st_m.alloc_host(p.stats.lay, p.stats.dtype);
  if (c.score_stats) {
    smax_m.alloc_host(p.smax.lay, DType::kFloat32);
    ssum_m.alloc_host(p.ssum.lay, DType::kFloat32);
  }
  reference::sdpa_forward(problem(p, false, p.o, p.stats, nullptr, nullptr, nullptr, {&p.smax, &p.ssum}));
  const sdpa::Problem fwd = problem(p, false, o_m, st_m, nullptr, nullptr, nullptr, {&smax_m, &ssum_m});
  EXPECT_EQ(sdpa_fwd_workspace_size(fwd), 0u);
  const SdpaFwdParams fp = sdpa_fwd_params(fwd);
  // The sm80 instantiation (params.h): mask-only unless the main loop needs a feature (of those
  // this model's cases have: the bias, dropout, the block_mask; the gate and the statistics are
  // the epilogue's).
  const bool loop_features = c.bias != 0 || c.dropout_p > 0 || c.block_mask != 0;
  EXPECT_EQ(sdpa_fwd_has_features(fp), loop_features);
  model_forward(fp, c.dtype, tile.fwd_bq, tile.fwd_bk);
  EXPECT_TRUE(same(p.o, o_m, false)) << "O";
  EXPECT_TRUE(same(p.stats, st_m, true)) << "stats";
  if (c.score_stats) {
    EXPECT_TRUE(same(p.smax, smax_m, true)) << "score_max";
    EXPECT_TRUE(same(p.ssum, ssum_m, true)) << "score_sum_exp";
  }
  if (c.log2_stats) return;  // the backward takes natural-log stats
  // Backward on the reference's O / LSE with their padding NaN again (never read).
  poison_padding(p.o, p.len_q);
  poison_padding(p.stats, p.len_q);
  Storage dq_m, dk_m, dv_m, dbias_m;
  if (c.bias && c.dbias) dbias_m.alloc_host(p.dbias.lay, p.dbias.dtype);
  dq_m.alloc_host(p.dq.lay, c.dtype);
  dk_m.alloc_host(p.dk.lay, c.dtype);
  dv_m.alloc_host(p.dv.lay, c.dtype);
  if (c.gate) dgate_m.alloc_host(p.dgate.lay, c.dtype);
  reference::sdpa_backward(problem(p, true, p.o, p.stats, &p.dq, &p.dk, &p.dv, {&p.dgate}, &p.dbias));
  const sdpa::Problem bwd = problem(p, true, p.o, p.stats, &dq_m, &dk_m, &dv_m, {&dgate_m}, &dbias_m);
  std::vector<uint8_t> ws(sdpa_bwd_workspace_size(bwd) + 16);
  void* w = ws.data() + (16 - reinterpret_cast<uintptr_t>(ws.data()) % 16) % 16;
  std::fill(ws.begin(), ws.end(), 0xff);
  const SdpaBwdParams bp = sdpa_bwd_params(bwd, w, ws.size() - 16);
  EXPECT_EQ(sdpa_bwd_has_features(sdpa_bwd_main_params(bp)), loop_features);
  model_backward(bp, c.dtype, tile.bwd_bq, tile.bwd_bk);
  EXPECT_TRUE(same(p.dq, dq_m, false)) << "dQ";
  EXPECT_TRUE(same(p.dk, dk_m, false)) << "dK";
  EXPECT_TRUE(same(p.dv, dv_m, false)) << "dV";
  if (c.gate) {
    EXPECT_TRUE(same(p.dgate, dgate_m, false)) << "dgate";
  }
  if (c.bias && c.dbias) {
    // dBias: the criterion of q's dtype (also for a float32 dBias), with a floor for sums over
    // broadcast rows, whose exact value can be 0 (sum_j dS_ij = 0): the rounding of dP - D
    // (grad_floor without the scale and K) times the rows summed into one element.
    auto max_abs = [](const Storage& t) {
      double m = 0;
      for (double x : Storage::values(t.host, t.dtype))
        if (std::isfinite(x)) m = std::max(m, std::abs(x));
      return m;
    };
    const std::vector<int64_t> bs = c.bias_shape();
    const double rows = double(bs[0] == 1 ? c.B : 1) * double(bs[1] == 1 ? c.Hq : 1) * double(bs[2] == 1 ? c.Sq : 1);
    const double floor = 4.0 * rows * fs_test::grad_floor(1.0, c.Dv, max_abs(p.dO), max_abs(p.v), 1.0);
    const std::vector<double> r = Storage::values(p.dbias.host, p.dbias.dtype);
    const std::vector<double> g = Storage::values(dbias_m.host, dbias_m.dtype);
    EXPECT_TRUE(fs_test::tensor_close(g, r, c.dtype, floor)) << "dBias";
  }
}

TEST(SdpaParams, KernelModelMatchesReference) {
  // The GPU tests' random cases, shortened (the model is a scalar loop).
  for (uint64_t seed = 1; seed <= 40; ++seed) {
    Case c = random_case(seed);
    c.Sq = 1 + c.Sq % 140;
    c.Skv = 1 + c.Skv % 140;
    c.max_logit = false;
    run_case(c);
    if (::testing::Test::HasFailure()) return;
  }
}

// The forward problem of case c over fresh host O and stats, for checks of the parameters alone (no kernel runs;
// the problem points into the object's storages, so it stays in place).
struct HostForward {
  std::unique_ptr<Call> call;
  Storage o, stats;
  sdpa::Problem pr;
  explicit HostForward(const Case& c) : call(make_call(c)) {
    o.alloc_host(call->o.lay, call->o.dtype);
    stats.alloc_host(call->stats.lay, call->stats.dtype);
    pr = problem(*call, false, o, stats, nullptr, nullptr, nullptr);
  }
  HostForward(const HostForward&) = delete;
  HostForward& operator=(const HostForward&) = delete;
};

TEST(SdpaParams, HugeSoftcapRunsAsNone) {
  // softcap * log2(e) past 2^100 is the identity to float precision for every score below 2^88, and the
  // kernels' 1 / c2 (rcp.approx.ftz) flushes to 0 past 2^126 (3e38 * log2(e) overflows to inf): no softcap.
  for (const float cap : {30.0f, 1e29f, 1e31f, 1e38f, 3e38f}) {
    HostForward f(random_case(7));
    f.pr.a.softcap = cap;  // (this file's cases carry no softcap: the model has none)
    const SdpaFwdParams fp = sdpa_fwd_params(f.pr);
    const float c2 = cap * 1.4426950408889634f;
    EXPECT_EQ(fp.analytic.score.softcap2, cap < 1e30f ? c2 : 0.0f) << "softcap " << cap;
  }
}

TEST(SdpaParams, FusedSoftcapFollowsItsSwitch) {
  // SdpaScoreParams::fused_softcap (the sm90 forward's fused softcap path): set for a call with softcap
  // while sdpa_sm90_fused_softcap_enabled, never without softcap.
  HostForward f(random_case(7));
  sdpa::Problem& pr = f.pr;
  for (const int on : {0, 1}) {
    const ScopedSwitch fused(set_sdpa_sm90_fused_softcap_enabled, on);
    pr.a.softcap = 30.0f;
    EXPECT_EQ(sdpa_fwd_params(pr).analytic.score.fused_softcap, on) << "switch " << on;
    pr.a.softcap.reset();
    EXPECT_EQ(sdpa_fwd_params(pr).analytic.score.fused_softcap, 0) << "switch " << on << ", no softcap";
  }
}

TEST(SdpaParams, EpilogueOptions) {
  // The output gate (forward epilogue; dgate and dO * sigmoid(G) from the preprocess, read by the
  // kernels after it through sdpa_bwd_main_params) and score_max / score_sum_exp (padded O).
  for (uint64_t seed = 300; seed < 330; ++seed) {
    Case c = random_case(seed);
    c.Sq = 1 + c.Sq % 100;
    c.Skv = 1 + c.Skv % 100;
    c.max_logit = false;
    c.gate = seed % 3 != 2;
    c.score_stats = seed % 3 != 0 && c.kind_q != Kind::kThd;
    run_case(c);
    if (::testing::Test::HasFailure()) return;
  }
}

TEST(SdpaParams, BlockMask) {
  // block_mask with the analytic mask: every broadcast form, over random cases (bits about 2 in 3
  // set; the cursors of the forward and dQ kernels and the dK/dV walk leave the 0 blocks out).
  for (uint64_t seed = 400; seed < 424; ++seed) {
    Case c = random_case(seed);
    c.Sq = 1 + c.Sq % 300;
    c.Skv = 1 + c.Skv % 300;
    c.max_logit = false;
    c.block_mask = 1 + int(seed % 4);
    run_case(c);
    if (::testing::Test::HasFailure()) return;
  }
}

TEST(SdpaParams, AdditiveBiasAndDBias) {
  // The additive bias (forward and the backward's recomputation; every broadcast form, float32 or
  // q's dtype, contiguous or padded strides, NaN where no sample reads it) and dBias (the dS
  // workspace, summed over the broadcast dimensions) over random cases.
  for (uint64_t seed = 500; seed < 532; ++seed) {
    Case c = random_case(seed);
    c.Sq = 1 + c.Sq % 100;
    c.Skv = 1 + c.Skv % 100;
    c.max_logit = false;
    c.bias = 1 + int(seed % 16);
    c.bias_f32 = seed % 3 == 0;
    c.bias_strided = seed % 5 < 2;
    c.dbias = seed % 4 != 3;
    run_case(c);
    if (::testing::Test::HasFailure()) return;
  }
}

TEST(SdpaParams, DbiasMustNotShareTheBiasMemory) {
  // Problem::bind refuses a dBias whose memory meets the bias's (the sm90 backward's direct form clears dBias and
  // stores into it while it still reads the bias); a dBias of its own binds.
  Case c = random_case(500);
  c.max_logit = false;
  c.bias = 1;
  c.dbias = true;
  c.log2_stats = false;
  auto call = make_call(c);
  Call& p = *call;
  EXPECT_NO_THROW(problem(p, true, p.o, p.stats, &p.dq, &p.dk, &p.dv, {&p.dgate}, &p.dbias));
  try {
    problem(p, true, p.o, p.stats, &p.dq, &p.dk, &p.dv, {&p.dgate}, &p.bias);
    ADD_FAILURE() << "dBias aliasing the bias was bound";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), Status::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("dBias: shares memory with bias"), std::string::npos) << e.what();
  }
}

TEST(SdpaParams, PhiloxDropout) {
  // Philox dropout (int32 / int64 seed and offset, negative seeds) in the forward's P V product and
  // the backward's dV and dS, with the bias on half the cases.
  for (uint64_t seed = 600; seed < 624; ++seed) {
    Case c = random_case(seed);
    c.Sq = 1 + c.Sq % 100;
    c.Skv = 1 + c.Skv % 100;
    c.max_logit = false;
    c.dropout_p = 0.1f * float(1 + seed % 5);
    c.dropout_seed = int64_t(seed * 7919) - (seed % 3 == 0 ? 100000 : 0);
    c.dropout_offset = int64_t(seed % 17);
    c.dropout_i64 = seed % 2;
    if (seed % 2) {
      c.bias = 1 + int(seed % 16);
      c.dbias = true;
    }
    run_case(c);
    if (::testing::Test::HasFailure()) return;
  }
}

TEST(SdpaParams, MainLoopFeaturesRule) {
  // Which calls the sm80 launchers run on the features instantiation (params.h
  // sdpa_fwd_has_features / sdpa_bwd_has_features), field by field; run_case checks the
  // parameters dispatch fills for its cases.
  SdpaFwdParams f;
  f.group_size = 2;
  f.analytic.score.group_v = 2;
  SdpaBwdParams b;
  b.group_size = 2;
  b.analytic.score.group_v = 2;
  EXPECT_FALSE(sdpa_fwd_has_features(f));
  EXPECT_FALSE(sdpa_bwd_has_features(b));
  const float sink[1] = {0.0f};
  const float bias[1] = {0.0f};
  const uint8_t bits[1] = {1};
  float dbias[1] = {0.0f};
  for (int k = 0; k < 8; ++k) {
    SCOPED_TRACE(k);
    SdpaFwdParams fk = f;
    SdpaBwdParams bk = b;
    for (AnalyticMaskParams* a : {&fk.analytic, &bk.analytic}) {
      switch (k) {
        case 0: a->score.softcap2 = 1.0f; break;
        case 1: a->score.alibi_n = 4; break;
        case 2: a->bias.bias = bias; break;
        case 3: a->bias.dbias = dbias; break;  // (dBias: the direct form has no ds)
        case 4: a->dropout.mode = 1; break;
        case 5: a->block_mask.bits = bits; break;
        case 6: a->score.group_v = 1; break;  // H_k != H_v
        default: a->score.sink = sink; break;
      }
    }
    EXPECT_TRUE(sdpa_fwd_has_features(fk));
    EXPECT_EQ(sdpa_bwd_has_features(bk), k != 7);  // sinks: the backward's main loops never see them
  }
  // The epilogue options and max_logit run on the mask-only kernels too.
  SdpaFwdParams e = f;
  const uint16_t gate[1] = {0};
  float stat[1] = {0.0f};
  e.analytic.epi.gate = gate;
  e.analytic.epi.score_max = stat;
  e.analytic.epi.score_sum_exp = stat;
  e.max_logit = stat;
  e.analytic.lse_unit = 1.0f;
  EXPECT_FALSE(sdpa_fwd_has_features(e));
}

TEST(SdpaParams, LayoutsPerSide) {
  uint64_t seed = 500;
  for (Kind kq : kAllKinds)
    for (Kind kkv : kAllKinds) {
      run_case(layout_case(++seed, kq, kkv));
      if (::testing::Test::HasFailure()) return;
    }
}

}  // namespace
}  // namespace flashspan::test
