// CPU reference of SDPA (see sdpa_reference.h for the semantics).
//
// Work layout: one task per (sample, query head). A task converts the rows its sample uses
// (Q of its head, K/V of the head's K/V heads, gathered through the page tables when paged)
// into contiguous Acc buffers, walks every query row over the candidate columns of the
// diagonal band, and writes its rows of the outputs. Backward tasks also keep their
// partial dK/dV (and dBias) contributions; those are reduced afterwards in a fixed order
// (query heads ascending, samples ascending), so the results do not depend on the number
// of threads. Cost: O(len_q * len_kv * (D_qk + D_v)) per task, memory for the backward
// partials B * H_q * S_kv * (D_qk + D_v) accumulators (+ B * H_q * S_q * S_kv with dBias).
#include "reference/sdpa_reference.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "core/error.h"
#include "core/fp8_conv.h"
#include "core/half_conv.h"
#include "core/philox.h"
#include "reference/parallel_for.h"

namespace flashspan::reference {
namespace {

using sdpa::Problem;
using sdpa::Runtime;

constexpr int64_t kBlockMaskTile = 128;

// The larger of a and b, NaN if either is (std::max drops a NaN b): a row whose logits hold a NaN (a NaN or Inf in q,
// a NaN bias) has a NaN max, LSE and output, as PyTorch's math SDPA and the flex reference give, not the zeros and
// -inf of a row that sees no key.
template <typename Acc>
Acc max_nan(Acc a, Acc b) {
  return (b > a || b != b) ? b : a;
}

// ---------------------------------------------------------------------------
// Element conversion
// ---------------------------------------------------------------------------

template <typename Acc>
Acc load_one(const TensorView& t, int64_t off) {
  switch (t.dtype) {
    case DType::kFloat16: return static_cast<Acc>(half_bits_to_float(t.ptr<const uint16_t>()[off]));
    case DType::kBFloat16: return static_cast<Acc>(bf16_bits_to_float(t.ptr<const uint16_t>()[off]));
    case DType::kFloat32: return static_cast<Acc>(t.ptr<const float>()[off]);
    case DType::kFloat64: return static_cast<Acc>(t.ptr<const double>()[off]);
    case DType::kUInt8: return static_cast<Acc>(t.ptr<const uint8_t>()[off]);
    case DType::kFloat8E4M3:
    case DType::kFloat8E5M2: return static_cast<Acc>(fp8_bits_to_float(t.ptr<const uint8_t>()[off], fp8_format(t.dtype)));
    default: throw Error(Status::kInternal, "sdpa reference: unexpected dtype in load_one");
  }
}

template <typename Acc>
void load_row(const TensorView& t, int64_t off, int64_t n, Acc* dst) {
  for (int64_t i = 0; i < n; ++i) dst[i] = load_one<Acc>(t, off + i);
}

template <typename Acc>
void store_one(const TensorView& t, int64_t off, Acc value) {
  const float f = static_cast<float>(value);
  switch (t.dtype) {
    case DType::kFloat16: t.ptr<uint16_t>()[off] = float_to_half_bits(f); break;
    case DType::kBFloat16: t.ptr<uint16_t>()[off] = float_to_bf16_bits(f); break;
    case DType::kFloat32: t.ptr<float>()[off] = f; break;
    case DType::kFloat64: t.ptr<double>()[off] = static_cast<double>(value); break;
    case DType::kUInt8: t.ptr<uint8_t>()[off] = static_cast<uint8_t>(f); break;
    case DType::kFloat8E4M3:
    case DType::kFloat8E5M2: t.ptr<uint8_t>()[off] = float_to_fp8_bits(f, fp8_format(t.dtype)); break;
    default: throw Error(Status::kInternal, "sdpa reference: unexpected dtype in store_one");
  }
}

template <typename Acc>
void store_row(const TensorView& t, int64_t off, int64_t n, const Acc* src) {
  for (int64_t i = 0; i < n; ++i) store_one<Acc>(t, off + i, src[i]);
}

template <typename Acc>
void fill_row(const TensorView& t, int64_t off, int64_t n, Acc value) {
  for (int64_t i = 0; i < n; ++i) store_one<Acc>(t, off + i, value);
}

template <typename Acc>
Acc dot(const Acc* a, const Acc* b, int64_t n) {
  Acc s[8] = {};
  for (int64_t d = 0; d < n; d += 8) {  // head dims are multiples of 8
    for (int l = 0; l < 8; ++l) s[l] += a[d + l] * b[d + l];
  }
  return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
}

template <typename Acc>
void axpy(Acc* y, Acc a, const Acc* x, int64_t n) {
  for (int64_t d = 0; d < n; ++d) y[d] += a * x[d];
}

template <typename Acc>
Acc sigmoid(Acc x) {
  return Acc(1) / (Acc(1) + std::exp(-x));
}

// FP8: x * scale rounded to `format` (as the kernels quantize an fp32 value: through float), times descale.
template <typename Acc>
Acc fp8_quantize(DType format, Acc x, Acc scale, Acc descale) {
  return static_cast<Acc>(fp8_round(format, static_cast<float>(x * scale))) * descale;
}

// FP8 output rows: descale the accumulated raw products, track the amax of the result (the value before the
// output scale, Transformer Engine's convention), then apply the output scale (the store rounds to FP8).
template <typename Acc>
void fp8_output(Acc* v, int64_t n, Acc descale, Acc scale, Acc* amax) {
  for (int64_t d = 0; d < n; ++d) {
    v[d] *= descale;
    *amax = std::max(*amax, std::fabs(v[d]));
    v[d] *= scale;
  }
}

// ---------------------------------------------------------------------------
// Addressing and the score function shared by forward and backward
// ---------------------------------------------------------------------------

template <typename Acc>
struct Context {
  const Problem& p;
  const Runtime& rt;

  // FP8 scale factor of a slot (1 when not bound).
  Acc f(int slot) const { return static_cast<Acc>(rt.factor[slot]); }

  // Element offset of (b, h, s, 0) of a sequence tensor slot (ragged or strided).
  // Slots that cannot be packed (score_max, score_sum_exp) have no row_start: batch stride.
  int64_t seq(int slot, int64_t b, int64_t h, int64_t s) const {
    const TensorView& t = p.t(slot);
    const int64_t start = rt.row_start[slot].empty() ? b * t.stride(0) : rt.row_start[slot][b];
    return start + h * t.stride(1) + s * t.stride(2);
  }
  // K or V row (b, h, s), through the page table when the side is paged.
  int64_t kv(int slot, int64_t b, int64_t h, int64_t s) const {
    const int table = slot == FS_SDPA_K ? FS_SDPA_PAGE_TABLE_K : FS_SDPA_PAGE_TABLE_V;
    if (!p.has(table)) return seq(slot, b, h, s);
    const int64_t bs = slot == FS_SDPA_K ? p.page_size_k : p.page_size_v;
    const TensorView& pt = p.t(table);
    const int64_t block = pt.ptr<const int32_t>()[rt.row_start[table][b] + (s / bs) * pt.stride(2)];
    const TensorView& t = p.t(slot);
    return block * t.stride(0) + h * t.stride(1) + (s % bs) * t.stride(2);
  }
  // Offset of element (b, h, i, j) of a tensor broadcast over dims of size 1.
  static int64_t bcast(const TensorView& t, int64_t b, int64_t h, int64_t i, int64_t j) {
    return (t.size(0) == 1 ? 0 : b * t.stride(0)) + (t.size(1) == 1 ? 0 : h * t.stride(1)) +
           (t.size(2) == 1 ? 0 : i * t.stride(2)) + (t.size(3) == 1 ? 0 : j * t.stride(3));
  }
  bool block_visible(int64_t b, int64_t h, int64_t i, int64_t j) const {
    if (!p.has(FS_SDPA_BLOCK_MASK)) return true;
    const TensorView& m = p.t(FS_SDPA_BLOCK_MASK);
    const int64_t kb = j / kBlockMaskTile;
    const int64_t off = (m.size(0) == 1 ? 0 : b * m.stride(0)) + (m.size(1) == 1 ? 0 : h * m.stride(1)) +
                        (i / kBlockMaskTile) * m.stride(2) + (kb / 8) * m.stride(3);
    return (m.ptr<const uint8_t>()[off] >> (kb % 8)) & 1u;
  }
  int64_t shift(int64_t lq, int64_t lk) const { return p.band().shift(lq, lk); }
  // Candidate columns [lo, hi) of row i (the diagonal band within the sample).
  void band(int64_t i, int64_t lq, int64_t lk, int64_t* lo, int64_t* hi) const { p.band().columns(i, lq, lk, lo, hi); }
  // Dropout multiplier of element (b, h, i, j): keep / (1 - p), mask * scale, or 1.
  Acc dropout_mult(int64_t b, int64_t h, int64_t i, int64_t j) const {
    if (p.dropout) {
      const uint32_t bh = static_cast<uint32_t>(b * p.Hq + h);
      return dropout_keep(rt.dropout_seed, rt.dropout_offset, bh, static_cast<uint32_t>(i), static_cast<uint32_t>(j),
                          p.dropout_threshold)
                 ? static_cast<Acc>(p.dropout_scale)
                 : Acc(0);
    }
    if (p.has(FS_SDPA_DROPOUT_MASK)) {
      const TensorView& m = p.t(FS_SDPA_DROPOUT_MASK);
      return load_one<Acc>(m, bcast(m, b, h, i, j)) * static_cast<Acc>(rt.dropout_mask_scale);
    }
    return Acc(1);
  }
};

// Per-task buffers of one (sample, query head): Q/K/V rows as Acc, and the score function.
template <typename Acc>
struct Task {
  const Context<Acc>& c;
  int64_t b, h, hk, hv, lq, lk;
  Acc attn_scale, scale, slope = 0, softcap = 0;  // scale: of q.k (FP8: attn_scale descale_q descale_k)
  std::vector<Acc> q, k, v;

  Task(const Context<Acc>& ctx, int64_t b_, int64_t h_) : c(ctx), b(b_), h(h_) {
    const Problem& p = c.p;
    hk = h / p.group_k();
    hv = h / p.group_v();
    lq = c.rt.len_q[b];
    lk = c.rt.len_kv[b];
    attn_scale = static_cast<Acc>(c.rt.attn_scale);
    scale = attn_scale * c.f(FS_SDPA_DESCALE_Q) * c.f(FS_SDPA_DESCALE_K);
    if (p.a.alibi) slope = static_cast<Acc>(sdpa::alibi_slope(h, p.Hq));
    if (p.a.softcap) softcap = static_cast<Acc>(*p.a.softcap);
    q.resize(lq * p.Dqk);
    k.resize(lk * p.Dqk);
    v.resize(lk * p.Dv);
    for (int64_t i = 0; i < lq; ++i) load_row(p.t(FS_SDPA_Q), c.seq(FS_SDPA_Q, b, h, i), p.Dqk, &q[i * p.Dqk]);
    for (int64_t j = 0; j < lk; ++j) {
      load_row(p.t(FS_SDPA_K), c.kv(FS_SDPA_K, b, hk, j), p.Dqk, &k[j * p.Dqk]);
      load_row(p.t(FS_SDPA_V), c.kv(FS_SDPA_V, b, hv, j), p.Dv, &v[j * p.Dv]);
    }
  }
  const Acc* qi(int64_t i) const { return &q[i * c.p.Dqk]; }
  const Acc* kj(int64_t j) const { return &k[j * c.p.Dqk]; }
  const Acc* vj(int64_t j) const { return &v[j * c.p.Dv]; }

  // Final logit x_ij; *tanh_out gets tanh(pre / softcap) (for the softcap derivative).
  Acc logit(int64_t i, int64_t j, Acc* tanh_out = nullptr) const {
    const Problem& p = c.p;
    Acc x = scale * dot(qi(i), kj(j), p.Dqk);
    if (softcap > 0) {
      const Acc t = std::tanh(x / softcap);
      if (tanh_out) *tanh_out = t;
      x = softcap * t;
    }
    if (p.has(FS_SDPA_BIAS)) x += load_one<Acc>(p.t(FS_SDPA_BIAS), Context<Acc>::bcast(p.t(FS_SDPA_BIAS), b, h, i, j));
    if (p.a.alibi) x += slope * static_cast<Acc>(j - i - c.shift(lq, lk));
    return x;
  }
  template <typename Fn>
  void for_each_visible(int64_t i, Fn&& fn) const {
    int64_t lo, hi;
    c.band(i, lq, lk, &lo, &hi);
    for (int64_t j = lo; j < hi; ++j) {
      if (c.block_visible(b, h, i, j)) fn(j);
    }
  }
};

// Writes the padding rows [from, S) of a non-ragged sequence output with `value`.
template <typename Acc>
void fill_padding_rows(const Context<Acc>& c, int slot, int64_t b, int64_t h, int64_t from, int64_t rows,
                       int64_t cols, Acc value) {
  if (!c.p.has(slot) || c.p.ragged(slot)) return;
  for (int64_t s = from; s < rows; ++s) fill_row(c.p.t(slot), c.seq(slot, b, h, s), cols, value);
}

// ---------------------------------------------------------------------------
// Forward
// ---------------------------------------------------------------------------

template <typename Acc>
void forward_impl(const Problem& p, const Runtime& rt) {
  const Context<Acc> c{p, rt};
  constexpr Acc kNegInf = -std::numeric_limits<Acc>::infinity();
  const Acc log2e = static_cast<Acc>(1.4426950408889634);
  std::vector<Acc> task_max(p.B * p.Hq, kNegInf);
  // FP8: amax of the probabilities and of O, per task (reduced below).
  std::vector<Acc> task_amax_s(p.fp8 ? p.B * p.Hq : 0), task_amax_o(p.fp8 ? p.B * p.Hq : 0);
  const Acc scale_s = c.f(FS_SDPA_SCALE_S), descale_s = c.f(FS_SDPA_DESCALE_S);

  parallel_for(p.B * p.Hq, [&](int64_t ti) {
    const int64_t b = ti / p.Hq, h = ti % p.Hq;
    const Task<Acc> t(c, b, h);
    const bool sink = p.has(FS_SDPA_SINK_TOKEN);
    const Acc sink_logit = sink ? static_cast<Acc>(rt.sinks[h]) : kNegInf;
    std::vector<Acc> x(t.lk), o(p.Dv), g(p.Dv);
    std::vector<char> vis(t.lk);
    Acc head_max = kNegInf, amax_s = 0, amax_o = 0;
    for (int64_t i = 0; i < t.lq; ++i) {
      std::fill(vis.begin(), vis.end(), 0);
      Acc m = kNegInf;
      t.for_each_visible(i, [&](int64_t j) {
        vis[j] = 1;
        x[j] = t.logit(i, j);
        m = max_nan(m, x[j]);
      });
      head_max = max_nan(head_max, m);
      const Acc mall = max_nan(m, sink_logit);
      Acc sum = 0, lse = kNegInf;
      std::fill(o.begin(), o.end(), Acc(0));
      if (mall != kNegInf) {  // a visible key or a sink (NaN: a NaN row, computed as NaN)
        for (int64_t j = 0; j < t.lk; ++j) {
          if (vis[j]) sum += std::exp(x[j] - mall);
        }
        if (sink) sum += std::exp(sink_logit - mall);
        lse = mall + std::log(sum);
        for (int64_t j = 0; j < t.lk; ++j) {
          if (!vis[j]) continue;
          Acc pd = std::exp(x[j] - lse) * c.dropout_mult(b, h, i, j);
          if (p.fp8) {  // S = softmax, quantized to q's format with scale_s (amax of the unscaled S)
            amax_s = std::max(amax_s, pd);
            pd = fp8_quantize(p.dtype, pd, scale_s, descale_s);
          }
          if (pd != Acc(0)) axpy(o.data(), pd, t.vj(j), p.Dv);
        }
      }
      if (p.has(FS_SDPA_GATE)) {
        load_row(p.t(FS_SDPA_GATE), c.seq(FS_SDPA_GATE, b, h, i), p.Dv, g.data());
        for (int64_t d = 0; d < p.Dv; ++d) o[d] *= sigmoid(g[d]);
      }
      if (p.fp8) fp8_output(o.data(), p.Dv, c.f(FS_SDPA_DESCALE_V), c.f(FS_SDPA_SCALE_O), &amax_o);
      store_row(p.t(FS_SDPA_O), c.seq(FS_SDPA_O, b, h, i), p.Dv, o.data());
      if (p.has(FS_SDPA_STATS))
        store_one(p.t(FS_SDPA_STATS), c.seq(FS_SDPA_STATS, b, h, i), p.a.stats_use_log2 ? lse * log2e : lse);
      if (p.has(FS_SDPA_SCORE_MAX)) store_one(p.t(FS_SDPA_SCORE_MAX), c.seq(FS_SDPA_SCORE_MAX, b, h, i), mall);
      if (p.has(FS_SDPA_SCORE_SUM_EXP)) store_one(p.t(FS_SDPA_SCORE_SUM_EXP), c.seq(FS_SDPA_SCORE_SUM_EXP, b, h, i), sum);
    }
    fill_padding_rows<Acc>(c, FS_SDPA_O, b, h, t.lq, p.Sq, p.Dv, Acc(0));
    fill_padding_rows<Acc>(c, FS_SDPA_STATS, b, h, t.lq, p.Sq, 1, kNegInf);
    fill_padding_rows<Acc>(c, FS_SDPA_SCORE_MAX, b, h, t.lq, p.Sq, 1, kNegInf);
    fill_padding_rows<Acc>(c, FS_SDPA_SCORE_SUM_EXP, b, h, t.lq, p.Sq, 1, Acc(0));
    if (p.has(FS_SDPA_RNG_DUMP)) {
      const TensorView& d = p.t(FS_SDPA_RNG_DUMP);
      for (int64_t i = 0; i < p.Sq; ++i) {
        for (int64_t j = 0; j < p.Skv; ++j) {
          const Acc keep = (i < t.lq && j < t.lk && c.dropout_mult(b, h, i, j) != Acc(0)) ? Acc(1) : Acc(0);
          store_one(d, b * d.stride(0) + h * d.stride(1) + i * d.stride(2) + j * d.stride(3), keep);
        }
      }
    }
    task_max[ti] = head_max;
    if (p.fp8) {
      task_amax_s[ti] = amax_s;
      task_amax_o[ti] = amax_o;
    }
  });

  if (p.fp8) {
    store_one(p.t(FS_SDPA_AMAX_S), 0, *std::max_element(task_amax_s.begin(), task_amax_s.end()));
    store_one(p.t(FS_SDPA_AMAX_O), 0, *std::max_element(task_amax_o.begin(), task_amax_o.end()));
  }

  if (p.has(FS_SDPA_MAX_LOGIT)) {
    const TensorView& ml = p.t(FS_SDPA_MAX_LOGIT);
    for (int64_t h = 0; h < p.Hq; ++h) {
      Acc m = kNegInf;
      for (int64_t b = 0; b < p.B; ++b) m = max_nan(m, task_max[b * p.Hq + h]);
      ml.ptr<float>()[h] = static_cast<float>(m);
    }
  }
}

// ---------------------------------------------------------------------------
// Backward
// ---------------------------------------------------------------------------

template <typename Acc>
void backward_impl(const Problem& p, const Runtime& rt) {
  const Context<Acc> c{p, rt};
  constexpr Acc kNegInf = -std::numeric_limits<Acc>::infinity();
  const int64_t ntasks = p.B * p.Hq;
  const bool want_dbias = p.has(FS_SDPA_DBIAS), want_dsink = p.has(FS_SDPA_DSINK_TOKEN);
  const bool gate = p.has(FS_SDPA_GATE);
  // Per-task partial sums, reduced in a fixed order below.
  std::vector<std::vector<Acc>> dk_part(ntasks), dv_part(ntasks), ds_part(want_dbias ? ntasks : 0);
  std::vector<Acc> dsink_part(ntasks, Acc(0));
  // FP8 (docs/SDPA.md "FP8 SDPA"): the factors, and per-task amax of dP and dQ.
  std::vector<Acc> amax_dp_part(p.fp8 ? ntasks : 0), amax_dq_part(p.fp8 ? ntasks : 0);
  const Acc scale_s = c.f(FS_SDPA_SCALE_S), descale_s = c.f(FS_SDPA_DESCALE_S);
  const Acc scale_dp = c.f(FS_SDPA_SCALE_DP), descale_dp = c.f(FS_SDPA_DESCALE_DP);
  const Acc do_v = c.f(FS_SDPA_DESCALE_DO) * c.f(FS_SDPA_DESCALE_V);  // of dO . v_j
  const DType dp_format = p.fp8 ? p.t(FS_SDPA_DO).dtype : p.dtype;     // dP is quantized to dO's format

  parallel_for(ntasks, [&](int64_t ti) {
    const int64_t b = ti / p.Hq, h = ti % p.Hq;
    const Task<Acc> t(c, b, h);
    const int64_t lq = t.lq, lk = t.lk, dqk = p.Dqk, dv = p.Dv;
    std::vector<Acc> o(dv), dout(dv), dou(lq * dv), g(dv), dq(lq * dqk, Acc(0)), dgate(dv);
    std::vector<Acc> dk(lk * dqk, Acc(0)), dvv(lk * dv, Acc(0)), delta(lq), lse(lq);
    std::vector<Acc>* ds = want_dbias ? &ds_part[ti] : nullptr;
    if (ds) ds->assign(lq * lk, Acc(0));
    for (int64_t i = 0; i < lq; ++i) {
      load_row(p.t(FS_SDPA_O), c.seq(FS_SDPA_O, b, h, i), dv, o.data());
      load_row(p.t(FS_SDPA_DO), c.seq(FS_SDPA_DO, b, h, i), dv, dout.data());
      lse[i] = load_one<Acc>(p.t(FS_SDPA_STATS), c.seq(FS_SDPA_STATS, b, h, i));
      Acc di = 0;
      for (int64_t d = 0; d < dv; ++d) di += dout[d] * o[d];
      delta[i] = di * c.f(FS_SDPA_DESCALE_DO) * c.f(FS_SDPA_DESCALE_O);
      if (gate) {
        load_row(p.t(FS_SDPA_GATE), c.seq(FS_SDPA_GATE, b, h, i), dv, g.data());
        for (int64_t d = 0; d < dv; ++d) {
          const Acc s = sigmoid(g[d]);
          dou[i * dv + d] = dout[d] * s;
          dgate[d] = dout[d] * o[d] * (Acc(1) - s);
        }
        if (p.has(FS_SDPA_DGATE)) store_row(p.t(FS_SDPA_DGATE), c.seq(FS_SDPA_DGATE, b, h, i), dv, dgate.data());
      } else {
        std::copy(dout.begin(), dout.end(), dou.begin() + i * dv);
      }
    }
    const Acc softcap = t.softcap;
    for (int64_t i = 0; i < lq; ++i) {
      if (lse[i] == kNegInf) continue;  // the row saw nothing: P = 0 (a NaN LSE: NaN gradients)
      const Acc* doi = &dou[i * dv];
      Acc* dqi = &dq[i * dqk];
      t.for_each_visible(i, [&](int64_t j) {
        Acc th = 0;
        const Acc x = t.logit(i, j, &th);
        const Acc prob = std::exp(x - lse[i]);
        if (p.fp8) {
          // dP = attn_scale P (dS - D), dS = dO . v_j (descaled): the gradient of the scaled scores, quantized to
          // dO's format for dQ = dP K and dK = dP^T Q; dV = S^T dO with S quantized as in the forward.
          const Acc dp = t.attn_scale * prob * (dot(doi, t.vj(j), dv) * do_v - delta[i]);
          amax_dp_part[ti] = std::max(amax_dp_part[ti], std::fabs(dp));
          const Acc dpq = fp8_quantize(dp_format, dp, scale_dp, descale_dp);
          axpy(dqi, dpq, t.kj(j), dqk);
          axpy(&dk[j * dqk], dpq, t.qi(i), dqk);
          axpy(&dvv[j * dv], fp8_quantize(p.dtype, prob, scale_s, descale_s), doi, dv);
          return;
        }
        const Acc mult = c.dropout_mult(b, h, i, j);
        const Acc dpv = dot(doi, t.vj(j), dv) * mult;
        const Acc dx = prob * (dpv - delta[i]);
        if (ds) (*ds)[i * lk + j] = dx;
        const Acc dpre = softcap > 0 ? dx * (Acc(1) - th * th) : dx;
        axpy(dqi, t.scale * dpre, t.kj(j), dqk);
        axpy(&dk[j * dqk], t.scale * dpre, t.qi(i), dqk);
        axpy(&dvv[j * dv], prob * mult, doi, dv);
      });
      if (want_dsink) dsink_part[ti] -= std::exp(static_cast<Acc>(rt.sinks[h]) - lse[i]) * delta[i];
    }
    for (int64_t i = 0; i < lq; ++i) {
      if (p.fp8) fp8_output(&dq[i * dqk], dqk, c.f(FS_SDPA_DESCALE_K), c.f(FS_SDPA_SCALE_DQ), &amax_dq_part[ti]);
      store_row(p.t(FS_SDPA_DQ), c.seq(FS_SDPA_DQ, b, h, i), dqk, &dq[i * dqk]);
    }
    fill_padding_rows<Acc>(c, FS_SDPA_DQ, b, h, lq, p.Sq, dqk, Acc(0));
    fill_padding_rows<Acc>(c, FS_SDPA_DGATE, b, h, lq, p.Sq, dv, Acc(0));
    dk_part[ti] = std::move(dk);
    dv_part[ti] = std::move(dvv);
  });

  // dK / dV: sum over the query heads of each K/V head, in ascending head order.
  for (int side = 0; side < 2; ++side) {
    const int slot = side == 0 ? FS_SDPA_DK : FS_SDPA_DV;
    const int64_t heads = side == 0 ? p.Hk : p.Hv, group = side == 0 ? p.group_k() : p.group_v();
    const int64_t dim = side == 0 ? p.Dqk : p.Dv;
    auto& part = side == 0 ? dk_part : dv_part;
    // FP8: dK = (sum dP_q^T q) descale_q, dV = (sum S_q^T dO) descale_dO (dP_q, S_q carry their descales).
    const Acc descale = c.f(side == 0 ? FS_SDPA_DESCALE_Q : FS_SDPA_DESCALE_DO);
    const Acc scale = c.f(side == 0 ? FS_SDPA_SCALE_DK : FS_SDPA_SCALE_DV);
    std::vector<Acc> amax_part(p.fp8 ? p.B * heads : 0);
    parallel_for(p.B * heads, [&](int64_t ti) {
      const int64_t b = ti / heads, hk = ti % heads, lk = rt.len_kv[b];
      std::vector<Acc> acc(lk * dim, Acc(0));
      for (int64_t h = hk * group; h < (hk + 1) * group; ++h) {
        const std::vector<Acc>& src = part[b * p.Hq + h];
        for (size_t e = 0; e < acc.size(); ++e) acc[e] += src[e];
      }
      if (p.fp8) fp8_output(acc.data(), lk * dim, descale, scale, &amax_part[ti]);
      for (int64_t j = 0; j < lk; ++j) store_row(p.t(slot), c.seq(slot, b, hk, j), dim, &acc[j * dim]);
      fill_padding_rows<Acc>(c, slot, b, hk, lk, p.Skv, dim, Acc(0));
    });
    if (p.fp8) {
      store_one(p.t(side == 0 ? FS_SDPA_AMAX_DK : FS_SDPA_AMAX_DV), 0,
                *std::max_element(amax_part.begin(), amax_part.end()));
    }
  }
  if (p.fp8) {
    store_one(p.t(FS_SDPA_AMAX_DQ), 0, *std::max_element(amax_dq_part.begin(), amax_dq_part.end()));
    store_one(p.t(FS_SDPA_AMAX_DP), 0, *std::max_element(amax_dp_part.begin(), amax_dp_part.end()));
  }

  if (want_dsink) {
    const TensorView& out = p.t(FS_SDPA_DSINK_TOKEN);
    for (int64_t h = 0; h < p.Hq; ++h) {
      Acc s = 0;
      for (int64_t b = 0; b < p.B; ++b) s += dsink_part[b * p.Hq + h];
      store_one(out, h, s);
    }
  }

  if (want_dbias) {
    // Each dBias slice (bb, hb) sums the tasks that broadcast onto it, samples then heads
    // ascending; positions no sample covers get 0.
    const TensorView& db = p.t(FS_SDPA_DBIAS);
    const int64_t nb = db.size(0), nh = db.size(1), ni = db.size(2), nj = db.size(3);
    parallel_for(nb * nh, [&](int64_t si) {
      const int64_t bb = si / nh, hb = si % nh;
      std::vector<Acc> acc(ni * nj, Acc(0));
      for (int64_t b = 0; b < p.B; ++b) {
        if (nb != 1 && b != bb) continue;
        for (int64_t h = 0; h < p.Hq; ++h) {
          if (nh != 1 && h != hb) continue;
          const int64_t lq = rt.len_q[b], lk = rt.len_kv[b];
          const std::vector<Acc>& ds = ds_part[b * p.Hq + h];
          for (int64_t i = 0; i < lq; ++i) {
            for (int64_t j = 0; j < lk; ++j) acc[(ni == 1 ? 0 : i) * nj + (nj == 1 ? 0 : j)] += ds[i * lk + j];
          }
        }
      }
      for (int64_t i = 0; i < ni; ++i) {
        for (int64_t j = 0; j < nj; ++j)
          store_one(db, bb * db.stride(0) + hb * db.stride(1) + i * db.stride(2) + j * db.stride(3), acc[i * nj + j]);
      }
    });
  }
}

void check_host(const Problem& p) {
  FS_CHECK_TYPE(p.device == DeviceType::kCPU, "q: the CPU reference needs CPU tensors, got a CUDA tensor");
}

// An empty batch (B = 0): no task; only the identity values of the outputs reduced over the batch
// (sdpa::empty_batch_fills, the rule the GPU dispatch follows too), stored at every element of each (any strides).
void fill_empty_batch(const Problem& p) {
  for (const sdpa::EmptyBatchFill& f : sdpa::empty_batch_fills(p)) {
    const TensorView& t = p.t(f.slot);
    int64_t idx[kMaxDims] = {};
    for (int64_t e = 0; e < t.numel(); ++e) {
      int64_t off = 0;
      for (int d = 0; d < t.ndim; ++d) off += idx[d] * t.strides[d];
      store_one<double>(t, off, static_cast<double>(f.value));
      for (int d = t.ndim - 1; d >= 0 && ++idx[d] == t.shape[d]; --d) idx[d] = 0;
    }
  }
}

}  // namespace

void sdpa_forward(const Problem& p, bool accumulate_double) {
  check_host(p);
  const Runtime rt = sdpa::read_runtime_host(p);  // (an empty batch's runtime values are checked too)
  if (p.empty_batch()) {
    fill_empty_batch(p);
    return;
  }
  // FP8 computes in double from the dequantized inputs (the oracle of the FP8 kernels; docs/SDPA.md "FP8 SDPA").
  if (accumulate_double || p.dtype == DType::kFloat64 || p.fp8) forward_impl<double>(p, rt);
  else forward_impl<float>(p, rt);
}

void sdpa_backward(const Problem& p, bool accumulate_double) {
  check_host(p);
  const Runtime rt = sdpa::read_runtime_host(p);  // (an empty batch's runtime values are checked too)
  if (p.empty_batch()) {
    fill_empty_batch(p);
    return;
  }
  if (accumulate_double || p.dtype == DType::kFloat64 || p.fp8) backward_impl<double>(p, rt);
  else backward_impl<float>(p, rt);
}

}  // namespace flashspan::reference
