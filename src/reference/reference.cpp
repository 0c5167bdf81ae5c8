// CPU reference backend (see reference.h for the semantics).
//
// Layout of the work: every input is first converted once into a contiguous float (double for
// float64 inputs) buffer in head-major order [heads, rows, dim] (exact), so the inner loops run
// over contiguous elements and vectorise. Then
//   forward : tasks (query head, sample, block of kRowBlock rows);
//   backward: dQ tasks (query head, sample, block of rows) and, separately, dK/dV
//             tasks (kv head, sample, block of kKeyBlock keys) that sum over the
//             group's query heads. Every output element is written by exactly one
//             task, so no locks or atomics are needed; P and dS are recomputed by
//             both backward passes (7 instead of 5 D-length products per visible
//             pair, in exchange for parallelism that does not depend on Hkv).
// Forward and dQ tasks walk their rows key block by key block (kKeyBlock keys), so a
// block of K/V stays in cache while every row of the task uses it. Visible keys are
// walked interval by interval, never by testing every key, so a sparse mask costs in
// proportion to its visible pairs. Measured (Release, 2 busy cores, causal bf16,
// B=1, S=4096, H=4, D=128): forward about 1.3 s and backward about 5 s of CPU time.
#include "reference/reference.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "core/validation.h"
#include "core/error.h"
#include "core/half_conv.h"
#include "reference/parallel_for.h"

namespace flashspan::reference {
namespace {

constexpr int64_t kRowBlock = 32;  // query rows per forward / dQ task
constexpr int64_t kKeyBlock = 64;  // keys per cache block and per dK/dV task (its accumulators stay in L2)

// ---------------------------------------------------------------------------
// Element conversion
// ---------------------------------------------------------------------------

template <typename E>
void load_row(const TensorView& t, int64_t offset, int n, E* dst) {
  switch (t.dtype) {
    case DType::kFloat16: {
      const uint16_t* p = t.ptr<const uint16_t>() + offset;
      for (int i = 0; i < n; ++i) dst[i] = half_bits_to_float(p[i]);
      break;
    }
    case DType::kBFloat16: {
      const uint16_t* p = t.ptr<const uint16_t>() + offset;
      for (int i = 0; i < n; ++i) dst[i] = bf16_bits_to_float(p[i]);
      break;
    }
    case DType::kFloat32: {
      const float* p = t.ptr<const float>() + offset;
      std::copy(p, p + n, dst);
      break;
    }
    case DType::kFloat64: {
      const double* p = t.ptr<const double>() + offset;
      for (int i = 0; i < n; ++i) dst[i] = static_cast<E>(p[i]);
      break;
    }
    default: throw Error(Status::kInternal, "reference: unexpected dtype in load_row");
  }
}

template <typename Acc>
void store_row(const TensorView& t, int64_t offset, int n, const Acc* src, Acc mul) {
  switch (t.dtype) {
    case DType::kFloat16: {
      uint16_t* p = t.ptr<uint16_t>() + offset;
      for (int i = 0; i < n; ++i) p[i] = float_to_half_bits(static_cast<float>(src[i] * mul));
      break;
    }
    case DType::kBFloat16: {
      uint16_t* p = t.ptr<uint16_t>() + offset;
      for (int i = 0; i < n; ++i) p[i] = float_to_bf16_bits(static_cast<float>(src[i] * mul));
      break;
    }
    case DType::kFloat32: {
      float* p = t.ptr<float>() + offset;
      for (int i = 0; i < n; ++i) p[i] = static_cast<float>(src[i] * mul);
      break;
    }
    case DType::kFloat64: {
      double* p = t.ptr<double>() + offset;
      for (int i = 0; i < n; ++i) p[i] = static_cast<double>(src[i] * mul);
      break;
    }
    default: throw Error(Status::kInternal, "reference: unexpected dtype in store_row");
  }
}

// A statistic (LSE, max_logit, dlse): float32, or float64 for float64 inputs (validation.h flex_stats_dtype).
void store_stat(const TensorView& t, int64_t offset, double v) {
  if (t.dtype == DType::kFloat64) t.ptr<double>()[offset] = v;
  else t.ptr<float>()[offset] = static_cast<float>(v);
}
double load_stat(const TensorView& t, int64_t offset) {
  return t.dtype == DType::kFloat64 ? t.ptr<const double>()[offset] : double(t.ptr<const float>()[offset]);
}

void store_zero_row(const TensorView& t, int64_t offset, int n) {
  if (t.dtype == DType::kFloat32) std::fill_n(t.ptr<float>() + offset, n, 0.0f);
  else if (t.dtype == DType::kFloat64) std::fill_n(t.ptr<double>() + offset, n, 0.0);
  else std::fill_n(t.ptr<uint16_t>() + offset, n, uint16_t(0));  // +0 is all bits clear in fp16 and bf16
}

// Element offset of (flattened row, head) in a BSHD [B, S, H, D] or THD [T, H, D]
// tensor; for BSHD the flattened row is b * S + s.
struct RowIndexer {
  bool varlen = false;
  int64_t seqlen = 0;  // S of this tensor (BSHD only)
  int64_t s0 = 0, s1 = 0, s2 = 0;

  RowIndexer(const TensorView& t, bool is_varlen, int64_t s)
      : varlen(is_varlen), seqlen(s), s0(t.stride(0)), s1(t.stride(1)), s2(t.ndim > 2 ? t.stride(2) : 0) {}
  int64_t operator()(int64_t row, int64_t head) const {
    if (varlen) return row * s0 + head * s1;
    return (row / seqlen) * s0 + (row % seqlen) * s1 + head * s2;
  }
};

// Element offset of LSE (head, flattened row): BSHD [B, Hq, Sq], THD [Hq, Tq].
struct LseIndexer {
  bool varlen = false;
  int64_t seqlen = 0;
  int64_t s0 = 0, s1 = 0, s2 = 0;

  LseIndexer() = default;
  LseIndexer(const TensorView& t, bool is_varlen, int64_t sq)
      : varlen(is_varlen), seqlen(sq), s0(t.stride(0)), s1(t.stride(1)), s2(t.ndim > 2 ? t.stride(2) : 0) {}
  int64_t operator()(int64_t head, int64_t row) const {
    if (varlen) return head * s0 + row * s1;
    return (row / seqlen) * s0 + head * s1 + (row % seqlen) * s2;
  }
};

// A tensor converted to E (float, or double for float64 inputs), head-major [heads, rows, dim], contiguous.
template <typename E>
struct Heads {
  int64_t rows = 0;
  int dim = 0;
  std::vector<E> data;

  const E* at(int64_t head, int64_t row) const { return data.data() + (head * rows + row) * dim; }
};

template <typename E>
Heads<E> to_heads(const TensorView& t, bool varlen, int64_t seqlen, int heads, int64_t rows, int dim) {
  Heads<E> f;
  f.rows = rows;
  f.dim = dim;
  f.data.resize(static_cast<size_t>(heads) * rows * dim);
  const RowIndexer idx(t, varlen, seqlen);
  parallel_for(heads, [&](int64_t h) {
    for (int64_t r = 0; r < rows; ++r) load_row(t, idx(r, h), dim, f.data.data() + (h * rows + r) * dim);
  });
  return f;
}

// ---------------------------------------------------------------------------
// Inner loops (dims are multiples of 8: eight independent partial sums let the
// compiler vectorise a reduction without reassociating floating point)
// ---------------------------------------------------------------------------

template <typename Acc, typename E>
inline Acc dot(const E* a, const E* b, int n) {
  Acc acc[8] = {};
  for (int d = 0; d < n; d += 8) {
    for (int l = 0; l < 8; ++l) acc[l] += static_cast<Acc>(a[d + l]) * static_cast<Acc>(b[d + l]);
  }
  return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

template <typename Acc, typename E>
inline void axpy(Acc* y, Acc a, const E* x, int n) {
  for (int d = 0; d < n; ++d) y[d] += a * static_cast<Acc>(x[d]);
}

// dot() of `a` with the four consecutive rows b, b + stride, b + 2 stride, b + 3 stride,
// loading `a` once for all four. Same partial-sum order as dot(), so a score does not
// depend on whether its key was processed in a group of four.
template <typename Acc, typename E>
inline void dot4(const E* a, const E* b, int64_t stride, int n, Acc* out) {
  Acc acc[4][8] = {};
  for (int d = 0; d < n; d += 8) {
    for (int l = 0; l < 8; ++l) {
      const Acc x = static_cast<Acc>(a[d + l]);
      for (int i = 0; i < 4; ++i) acc[i][l] += x * static_cast<Acc>(b[i * stride + d + l]);
    }
  }
  for (int i = 0; i < 4; ++i) {
    const Acc* c = acc[i];
    out[i] = ((c[0] + c[1]) + (c[2] + c[3])) + ((c[4] + c[5]) + (c[6] + c[7]));
  }
}

// y += sum_i p[i] * x_i over the four consecutive rows x_i = x + i * stride: one
// load and store of y per four keys.
template <typename Acc, typename E>
inline void axpy4(Acc* y, const Acc* p, const E* x, int64_t stride, int n) {
  for (int d = 0; d < n; ++d) {
    y[d] += (p[0] * static_cast<Acc>(x[d]) + p[1] * static_cast<Acc>(x[stride + d])) +
            (p[2] * static_cast<Acc>(x[2 * stride + d]) + p[3] * static_cast<Acc>(x[3 * stride + d]));
  }
}

// Calls fn(lo, hi) for every nonempty visible key interval of one row, clipped to
// [clip_lo, clip_hi). `ep` points at the row's first endpoint; endpoint f is at
// ep[f * stride]. Visible interval i is [F(2i-1), F(2i)) with F(-1) = 0.
template <typename Fn>
inline void for_each_interval(const int32_t* ep, int64_t stride, int nfunc, int64_t clip_lo, int64_t clip_hi,
                              Fn&& fn) {
  for (int f = 0; f < nfunc; f += 2) {
    const int64_t lo = std::max<int64_t>(f == 0 ? 0 : ep[(f - 1) * stride], clip_lo);
    const int64_t hi = std::min<int64_t>(ep[f * stride], clip_hi);
    if (lo < hi) fn(lo, hi);
  }
}

// ---------------------------------------------------------------------------
// Argument checks
// ---------------------------------------------------------------------------

void check_tensor(const TensorView& t, const char* name, const FlexGeometry& g,
                  void (*shape_fn)(const FlexGeometry&, int64_t*, int*), DType dtype) {
  int64_t shape[kMaxDims];
  int ndim = 0;
  shape_fn(g, shape, &ndim);
  check_same_tensor_shape(t, name, shape, ndim, dtype, g.device, g.device_id);
}

void check_common(const FlexGeometry* g, const int32_t* mask, float scale, bool want_max_logit) {
  FS_CHECK_ARG(g != nullptr, "geometry: is required");
  FS_CHECK_ARG(mask != nullptr || g->total_q == 0, "mask_func: host endpoints are required");
  FS_CHECK_TYPE(g->device == DeviceType::kCPU, "q: the CPU reference needs CPU tensors, got a CUDA tensor");
  check_head_dims_reference(g->head_dim_qk, g->head_dim_v);
  check_softmax_scale(scale, want_max_logit);
  validate_endpoints_host(mask, *g);
}

void max_logit_shape(const FlexGeometry& g, int64_t* s, int* n) {
  s[0] = g.num_heads_q;
  *n = 1;
}

// ---------------------------------------------------------------------------
// Forward
// ---------------------------------------------------------------------------

template <typename Acc, typename E>
void forward_impl(const FlexForwardArgs& a) {
  const FlexGeometry& g = *a.geometry;
  const int hq = g.num_heads_q, dqk = g.head_dim_qk, dv = g.head_dim_v, group = g.group_size();
  const Heads<E> qf = to_heads<E>(a.q, g.varlen, g.max_seqlen_q, hq, g.total_q, dqk);
  const Heads<E> kf = to_heads<E>(a.k, g.varlen, g.max_seqlen_k, g.num_heads_kv, g.total_k, dqk);
  const Heads<E> vf = to_heads<E>(a.v, g.varlen, g.max_seqlen_k, g.num_heads_kv, g.total_k, dv);
  const RowIndexer out_idx(a.out, g.varlen, g.max_seqlen_q);
  const bool want_lse = a.lse.defined(), want_max = a.max_logit.defined();
  const LseIndexer lse_idx = want_lse ? LseIndexer(a.lse, g.varlen, g.max_seqlen_q) : LseIndexer();
  const Acc scale = static_cast<Acc>(a.softmax_scale);
  constexpr Acc kNegInf = -std::numeric_limits<Acc>::infinity();

  // Tasks: (head, sample, row block), flattened.
  struct Task { int h, b; int64_t r0, r1; };
  std::vector<Task> tasks;
  for (int h = 0; h < hq; ++h) {
    for (int b = 0; b < g.batch; ++b) {
      for (int64_t r0 = 0; r0 < g.seqlen_q(b); r0 += kRowBlock) {
        tasks.push_back({h, b, r0, std::min(r0 + kRowBlock, g.seqlen_q(b))});
      }
    }
  }
  std::vector<double> task_max(tasks.size(), -std::numeric_limits<double>::infinity());

  // Each task walks its rows key block by key block, so a block of K (then V) stays in
  // cache while all the task's rows use it. Pass 1 stores the scores and row maxima,
  // pass 2 sums exp(S - max) and P V.
  parallel_for(static_cast<int64_t>(tasks.size()), [&](int64_t ti) {
    const Task& t = tasks[ti];
    const int hk = t.h / group;
    const int64_t q0 = g.cu_seqlens_q[t.b] + t.r0, k0 = g.cu_seqlens_k[t.b], lk = g.seqlen_k(t.b);
    const int64_t nr = t.r1 - t.r0;
    const int32_t* mask_h = a.mask + int64_t(g.mask_head(t.h)) * g.nfunc * g.total_q;
    std::vector<Acc> scores(static_cast<size_t>(nr * lk)), m(nr, kNegInf), l(nr, Acc(0));
    std::vector<Acc> o(static_cast<size_t>(nr) * dv, Acc(0));
    std::vector<char> any(nr, 0);
    for (int64_t c0 = 0; c0 < lk; c0 += kKeyBlock) {
      const int64_t c1 = std::min(c0 + kKeyBlock, lk);
      for (int64_t r = 0; r < nr; ++r) {
        const E* qi = qf.at(t.h, q0 + r);
        Acc* sr = scores.data() + r * lk;
        Acc mr = m[r];
        for_each_interval(mask_h + q0 + r, g.total_q, g.nfunc, c0, c1, [&](int64_t lo, int64_t hi) {
          any[r] = 1;
          int64_t j = lo;
          for (; j + 4 <= hi; j += 4) {
            dot4<Acc>(qi, kf.at(hk, k0 + j), dqk, dqk, sr + j);
            for (int i = 0; i < 4; ++i) {
              sr[j + i] *= scale;
              mr = std::max(mr, sr[j + i]);
            }
          }
          for (; j < hi; ++j) {
            sr[j] = scale * dot<Acc>(qi, kf.at(hk, k0 + j), dqk);
            mr = std::max(mr, sr[j]);
          }
        });
        m[r] = mr;
      }
    }
    for (int64_t c0 = 0; c0 < lk; c0 += kKeyBlock) {
      const int64_t c1 = std::min(c0 + kKeyBlock, lk);
      for (int64_t r = 0; r < nr; ++r) {
        if (!any[r]) continue;
        const Acc* sr = scores.data() + r * lk;
        Acc* orow = o.data() + r * dv;
        Acc lr = l[r];
        const Acc mr = m[r];
        for_each_interval(mask_h + q0 + r, g.total_q, g.nfunc, c0, c1, [&](int64_t lo, int64_t hi) {
          int64_t j = lo;
          for (; j + 4 <= hi; j += 4) {
            Acc p[4];
            for (int i = 0; i < 4; ++i) {
              p[i] = std::exp(sr[j + i] - mr);
              lr += p[i];
            }
            axpy4<Acc>(orow, p, vf.at(hk, k0 + j), dv, dv);
          }
          for (; j < hi; ++j) {
            const Acc p = std::exp(sr[j] - mr);
            lr += p;
            axpy<Acc>(orow, p, vf.at(hk, k0 + j), dv);
          }
        });
        l[r] = lr;
      }
    }
    double local_max = -std::numeric_limits<double>::infinity();
    for (int64_t r = 0; r < nr; ++r) {
      const int64_t row = q0 + r, out_off = out_idx(row, t.h);
      if (!any[r]) {
        // No visible key: out = 0, LSE = -inf (never 0/0).
        store_zero_row(a.out, out_off, dv);
        if (want_lse) store_stat(a.lse, lse_idx(t.h, row), -std::numeric_limits<double>::infinity());
        continue;
      }
      store_row<Acc>(a.out, out_off, dv, o.data() + r * dv, Acc(1) / l[r]);
      if (want_lse) store_stat(a.lse, lse_idx(t.h, row), static_cast<double>(m[r] + std::log(l[r])));
      local_max = std::max(local_max, static_cast<double>(m[r]));
    }
    task_max[ti] = local_max;
  });

  if (want_max) {
    std::vector<double> head_max(hq, -std::numeric_limits<double>::infinity());
    for (size_t ti = 0; ti < tasks.size(); ++ti) head_max[tasks[ti].h] = std::max(head_max[tasks[ti].h], task_max[ti]);
    for (int h = 0; h < hq; ++h) store_stat(a.max_logit, h * a.max_logit.stride(0), head_max[h]);
  }
}

// ---------------------------------------------------------------------------
// Backward
// ---------------------------------------------------------------------------

template <typename Acc, typename E>
void backward_impl(const FlexBackwardArgs& a) {
  const FlexGeometry& g = *a.geometry;
  const int hq = g.num_heads_q, hkv = g.num_heads_kv, dqk = g.head_dim_qk, dv = g.head_dim_v;
  const int group = g.group_size();
  const Heads<E> qf = to_heads<E>(a.q, g.varlen, g.max_seqlen_q, hq, g.total_q, dqk);
  const Heads<E> kf = to_heads<E>(a.k, g.varlen, g.max_seqlen_k, hkv, g.total_k, dqk);
  const Heads<E> vf = to_heads<E>(a.v, g.varlen, g.max_seqlen_k, hkv, g.total_k, dv);
  const Heads<E> of = to_heads<E>(a.out, g.varlen, g.max_seqlen_q, hq, g.total_q, dv);
  const Heads<E> dof = to_heads<E>(a.dout, g.varlen, g.max_seqlen_q, hq, g.total_q, dv);
  const Acc scale = static_cast<Acc>(a.softmax_scale);
  const int64_t tq = g.total_q;

  // LSE (Acc, head-major) and D_i = dO_i . O_i - dlse_i, both [Hq, total_q]. The dlse
  // term: d LSE_i / d S_ij = P_ij, so dS_ij = P_ij (dP_ij - dO_i . O_i + dlse_i).
  std::vector<Acc> lse(static_cast<size_t>(hq) * tq);
  std::vector<Acc> delta(static_cast<size_t>(hq) * tq);
  const LseIndexer lse_idx(a.lse, g.varlen, g.max_seqlen_q);
  const bool has_dlse = a.dlse.defined();
  const LseIndexer dlse_idx = has_dlse ? LseIndexer(a.dlse, g.varlen, g.max_seqlen_q) : LseIndexer();
  parallel_for(hq, [&](int64_t h) {
    for (int64_t r = 0; r < tq; ++r) {
      lse[h * tq + r] = static_cast<Acc>(load_stat(a.lse, lse_idx(h, r)));
      delta[h * tq + r] = dot<Acc>(dof.at(h, r), of.at(h, r), dv);
      if (has_dlse) delta[h * tq + r] -= static_cast<Acc>(load_stat(a.dlse, dlse_idx(h, r)));
    }
  });

  // Visits every visible pair (row, key) of query head h, sample b, keys clipped to
  // [kc0, kc1), rows [r0, r1): fn(row, key, p, ds) with P and dS of the pair.
  // Rows whose LSE is -inf (empty rows) have P = 0 and contribute nothing.
  auto for_each_pair = [&](int h, int b, int64_t r0, int64_t r1, int64_t kc0, int64_t kc1, auto&& fn) {
    const int hk = h / group;
    const int64_t q0 = g.cu_seqlens_q[b], k0 = g.cu_seqlens_k[b];
    const int32_t* mask_h = a.mask + int64_t(g.mask_head(h)) * g.nfunc * tq;
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t row = q0 + r;
      const Acc lse_acc = lse[h * tq + row], d_i = delta[h * tq + row];
      if (!(lse_acc > -std::numeric_limits<Acc>::infinity())) continue;
      const E* qi = qf.at(h, row);
      const E* doi = dof.at(h, row);
      for_each_interval(mask_h + row, tq, g.nfunc, kc0, kc1, [&](int64_t lo, int64_t hi) {
        int64_t j = lo;
        for (; j + 4 <= hi; j += 4) {
          Acc s[4], dp[4];
          dot4<Acc>(qi, kf.at(hk, k0 + j), dqk, dqk, s);
          dot4<Acc>(doi, vf.at(hk, k0 + j), dv, dv, dp);
          for (int i = 0; i < 4; ++i) {
            const Acc p = std::exp(scale * s[i] - lse_acc);
            fn(row, j + i, p, p * (dp[i] - d_i));
          }
        }
        for (; j < hi; ++j) {
          const Acc s = scale * dot<Acc>(qi, kf.at(hk, k0 + j), dqk);
          const Acc p = std::exp(s - lse_acc);
          const Acc dp = dot<Acc>(doi, vf.at(hk, k0 + j), dv);
          fn(row, j, p, p * (dp - d_i));
        }
      });
    }
  };

  // dQ: tasks (head, sample, row block).
  {
    struct Task { int h, b; int64_t r0, r1; };
    std::vector<Task> tasks;
    for (int h = 0; h < hq; ++h) {
      for (int b = 0; b < g.batch; ++b) {
        for (int64_t r0 = 0; r0 < g.seqlen_q(b); r0 += kRowBlock) {
          tasks.push_back({h, b, r0, std::min(r0 + kRowBlock, g.seqlen_q(b))});
        }
      }
    }
    const RowIndexer dq_idx(a.dq, g.varlen, g.max_seqlen_q);
    // Key block by key block, as in the forward, so K and V blocks stay in cache.
    parallel_for(static_cast<int64_t>(tasks.size()), [&](int64_t ti) {
      const Task& t = tasks[ti];
      const int hk = t.h / group;
      const int64_t q0 = g.cu_seqlens_q[t.b], k0 = g.cu_seqlens_k[t.b], lk = g.seqlen_k(t.b);
      const int64_t nr = t.r1 - t.r0;
      std::vector<Acc> dq(static_cast<size_t>(nr) * dqk, Acc(0));
      for (int64_t c0 = 0; c0 < lk; c0 += kKeyBlock) {
        const int64_t c1 = std::min(c0 + kKeyBlock, lk);
        for (int64_t r = 0; r < nr; ++r) {
          Acc* dqr = dq.data() + r * dqk;
          for_each_pair(t.h, t.b, t.r0 + r, t.r0 + r + 1, c0, c1, [&](int64_t, int64_t j, Acc, Acc ds) {
            axpy<Acc>(dqr, ds, kf.at(hk, k0 + j), dqk);
          });
        }
      }
      for (int64_t r = 0; r < nr; ++r) store_row<Acc>(a.dq, dq_idx(q0 + t.r0 + r, t.h), dqk, dq.data() + r * dqk, scale);
    });
  }

  // dK, dV: tasks (kv head, sample, key block); each sums over its group's query heads.
  {
    struct Task { int hk, b; int64_t c0, c1; };
    std::vector<Task> tasks;
    for (int hk = 0; hk < hkv; ++hk) {
      for (int b = 0; b < g.batch; ++b) {
        for (int64_t c0 = 0; c0 < g.seqlen_k(b); c0 += kKeyBlock) {
          tasks.push_back({hk, b, c0, std::min(c0 + kKeyBlock, g.seqlen_k(b))});
        }
      }
    }
    const RowIndexer dk_idx(a.dk, g.varlen, g.max_seqlen_k);
    const RowIndexer dv_idx(a.dv, g.varlen, g.max_seqlen_k);
    parallel_for(static_cast<int64_t>(tasks.size()), [&](int64_t ti) {
      const Task& t = tasks[ti];
      const int64_t n = t.c1 - t.c0, k0 = g.cu_seqlens_k[t.b];
      std::vector<Acc> dk(static_cast<size_t>(n) * dqk, Acc(0)), dvv(static_cast<size_t>(n) * dv, Acc(0));
      for (int h = t.hk * group; h < (t.hk + 1) * group; ++h) {
        for_each_pair(h, t.b, 0, g.seqlen_q(t.b), t.c0, t.c1, [&](int64_t row, int64_t j, Acc p, Acc ds) {
          axpy<Acc>(dvv.data() + (j - t.c0) * dv, p, dof.at(h, row), dv);
          axpy<Acc>(dk.data() + (j - t.c0) * dqk, ds, qf.at(h, row), dqk);
        });
      }
      for (int64_t j = 0; j < n; ++j) {
        store_row<Acc>(a.dk, dk_idx(k0 + t.c0 + j, t.hk), dqk, dk.data() + j * dqk, scale);
        store_row<Acc>(a.dv, dv_idx(k0 + t.c0 + j, t.hk), dv, dvv.data() + j * dv, Acc(1));
      }
    });
  }
}

}  // namespace

void flex_forward(const FlexForwardArgs& args) {
  check_common(args.geometry, args.mask, args.softmax_scale, args.max_logit.defined());
  const FlexGeometry& g = *args.geometry;
  check_tensor(args.q, "q", g, expected_q_shape, g.dtype);
  check_tensor(args.k, "k", g, expected_k_shape, g.dtype);
  check_tensor(args.v, "v", g, expected_v_shape, g.dtype);
  check_tensor(args.out, "out", g, expected_out_shape, g.dtype);
  const DType stats = flex_stats_dtype(g.dtype);
  if (args.lse.defined()) check_tensor(args.lse, "lse", g, expected_lse_shape, stats);
  if (args.max_logit.defined()) check_tensor(args.max_logit, "max_logit", g, max_logit_shape, stats);
  if (g.dtype == DType::kFloat64) forward_impl<double, double>(args);
  else if (args.accumulate_double) forward_impl<double, float>(args);
  else forward_impl<float, float>(args);
}

void flex_backward(const FlexBackwardArgs& args) {
  check_common(args.geometry, args.mask, args.softmax_scale, false);
  const FlexGeometry& g = *args.geometry;
  check_tensor(args.q, "q", g, expected_q_shape, g.dtype);
  check_tensor(args.k, "k", g, expected_k_shape, g.dtype);
  check_tensor(args.v, "v", g, expected_v_shape, g.dtype);
  check_tensor(args.out, "out", g, expected_out_shape, g.dtype);
  check_tensor(args.dout, "dout", g, expected_out_shape, g.dtype);
  const DType stats = flex_stats_dtype(g.dtype);
  check_tensor(args.lse, "lse", g, expected_lse_shape, stats);
  if (args.dlse.defined()) check_tensor(args.dlse, "dlse", g, expected_lse_shape, stats);
  check_tensor(args.dq, "dq", g, expected_q_shape, g.dtype);
  check_tensor(args.dk, "dk", g, expected_k_shape, g.dtype);
  check_tensor(args.dv, "dv", g, expected_v_shape, g.dtype);
  if (g.dtype == DType::kFloat64) backward_impl<double, double>(args);
  else if (args.accumulate_double) backward_impl<double, float>(args);
  else backward_impl<float, float>(args);
}

int64_t count_visible_pairs(const FlexGeometry& g, const int32_t* mask, int mask_head) {
  FS_CHECK_ARG(mask != nullptr || g.total_q == 0, "mask_func: host endpoints are required");
  FS_CHECK_ARG(mask_head >= 0 && mask_head < g.num_heads_mask, "mask_head: must be in [0, Hmask = ",
               g.num_heads_mask, "), got ", mask_head);
  const int32_t* mask_h = mask + int64_t(mask_head) * g.nfunc * g.total_q;
  int64_t total = 0;
  for (int b = 0; b < g.batch; ++b) {
    const int64_t lk = g.seqlen_k(b);
    for (int64_t row = g.cu_seqlens_q[b]; row < g.cu_seqlens_q[b + 1]; ++row) {
      for_each_interval(mask_h + row, g.total_q, g.nfunc, 0, lk, [&](int64_t lo, int64_t hi) { total += hi - lo; });
    }
  }
  return total;
}

}  // namespace flashspan::reference
