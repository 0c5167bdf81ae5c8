// Shared helpers for the C++ tests: host tensors with owned storage and a TensorView,
// element access in any float dtype, NaN poisoning, random interval masks, a naive
// dense mask built from endpoints, geometry makers (through validate_plan_inputs),
// and tolerance comparisons that report the worst element.
//
// Everything is header-only and inline so any test file can include it.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "core/validation.h"
#include "core/geometry.h"
#include "core/half_conv.h"
#include "core/tensor_view.h"

namespace flashspan::test {

using Rng = std::mt19937_64;

// ---------------------------------------------------------------------------
// Scalar access
// ---------------------------------------------------------------------------

// Rounds a float to the nearest value representable in `dtype` (float16 / bfloat16 /
// float32), ties to even.
inline float round_to_dtype(DType dtype, float x) {
  switch (dtype) {
    case DType::kFloat16: return half_bits_to_float(float_to_half_bits(x));
    case DType::kBFloat16: return bf16_bits_to_float(float_to_bf16_bits(x));
    default: return x;
  }
}

// Reads / writes element `offset` (in elements) of a CPU view of a float dtype.
inline double read_elem(const TensorView& t, int64_t offset) {
  switch (t.dtype) {
    case DType::kFloat16: return half_bits_to_float(t.ptr<const uint16_t>()[offset]);
    case DType::kBFloat16: return bf16_bits_to_float(t.ptr<const uint16_t>()[offset]);
    case DType::kFloat32: return t.ptr<const float>()[offset];
    case DType::kFloat64: return t.ptr<const double>()[offset];
    case DType::kInt32: return t.ptr<const int32_t>()[offset];
    case DType::kUInt8: return t.ptr<const uint8_t>()[offset];
    default: ADD_FAILURE() << "read_elem: unsupported dtype " << dtype_name(t.dtype); return 0;
  }
}

inline void write_elem(const TensorView& t, int64_t offset, double x) {
  switch (t.dtype) {
    case DType::kFloat16: t.ptr<uint16_t>()[offset] = float_to_half_bits(static_cast<float>(x)); break;
    case DType::kBFloat16: t.ptr<uint16_t>()[offset] = float_to_bf16_bits(static_cast<float>(x)); break;
    case DType::kFloat32: t.ptr<float>()[offset] = static_cast<float>(x); break;
    case DType::kFloat64: t.ptr<double>()[offset] = x; break;
    case DType::kInt32: t.ptr<int32_t>()[offset] = static_cast<int32_t>(x); break;
    case DType::kUInt8: t.ptr<uint8_t>()[offset] = static_cast<uint8_t>(x); break;
    default: ADD_FAILURE() << "write_elem: unsupported dtype " << dtype_name(t.dtype);
  }
}

// ---------------------------------------------------------------------------
// HostTensor: owned CPU storage plus a strided view of it
// ---------------------------------------------------------------------------

// Memory order of the dimensions (outermost first). Empty = row-major. It must end
// with the last dimension (the last dim is always contiguous).
using DimOrder = std::vector<int>;

// For a rank-n BSHD/THD tensor: store heads outside the sequence dimension
// (BSHD [B,S,H,D] laid out as [B,H,S,D]; THD [T,H,D] laid out as [H,T,D]).
inline DimOrder heads_outer_order(int ndim) {
  DimOrder o(ndim);
  std::iota(o.begin(), o.end(), 0);
  if (ndim >= 3) std::swap(o[ndim - 3], o[ndim - 2]);
  return o;
}

class HostTensor {
 public:
  HostTensor() = default;
  // `pad` extra elements are added to every stride above the last dimension, so the
  // view is not contiguous and out-of-view writes land in padding (see
  // padding_changed()).
  HostTensor(DType dtype, std::vector<int64_t> shape, const DimOrder& order = {}, int64_t pad = 0) {
    const int n = static_cast<int>(shape.size());
    view_.dtype = dtype;
    view_.device = DeviceType::kCPU;
    view_.ndim = n;
    DimOrder ord = order;
    if (ord.empty()) {
      ord.resize(n);
      std::iota(ord.begin(), ord.end(), 0);
    }
    EXPECT_EQ(static_cast<int>(ord.size()), n);
    EXPECT_TRUE(n == 0 || ord.back() == n - 1) << "last dimension must stay innermost";
    int64_t stride = 1;
    for (int i = n - 1; i >= 0; --i) {
      const int d = ord[i];
      view_.shape[d] = shape[d];
      view_.strides[d] = stride;
      stride = stride * shape[d] + (i > 0 ? pad : 0);
    }
    storage_elems_ = std::max<int64_t>(stride, 1);
    storage_.assign(static_cast<size_t>((storage_elems_ * dtype_size(dtype) + 7) / 8), 0);
    view_.data = storage_.data();
  }
  HostTensor(const HostTensor&) = delete;
  HostTensor& operator=(const HostTensor&) = delete;
  HostTensor(HostTensor&&) = default;  // moving a vector keeps its buffer, so view_.data stays valid
  HostTensor& operator=(HostTensor&&) = default;

  const TensorView& view() const { return view_; }
  DType dtype() const { return view_.dtype; }
  int ndim() const { return view_.ndim; }
  int64_t size(int d) const { return view_.size(d); }
  int64_t numel() const { return view_.numel(); }
  std::vector<int64_t> shape() const { return {view_.shape.begin(), view_.shape.begin() + view_.ndim}; }

  // Element offset of logical row-major index `flat`.
  int64_t offset_of_flat(int64_t flat) const {
    int64_t off = 0;
    for (int d = view_.ndim - 1; d >= 0; --d) {
      off += (flat % view_.shape[d]) * view_.strides[d];
      flat /= view_.shape[d];
    }
    return off;
  }
  int64_t offset(std::initializer_list<int64_t> idx) const {
    int64_t off = 0;
    int d = 0;
    for (int64_t i : idx) off += i * view_.strides[d++];
    return off;
  }
  double at(std::initializer_list<int64_t> idx) const { return read_elem(view_, offset(idx)); }
  void set(std::initializer_list<int64_t> idx, double x) { write_elem(view_, offset(idx), x); }
  double flat(int64_t i) const { return read_elem(view_, offset_of_flat(i)); }
  void set_flat(int64_t i, double x) { write_elem(view_, offset_of_flat(i), x); }

  // All logical elements in row-major order, as double.
  std::vector<double> to_vector() const {
    std::vector<double> out(static_cast<size_t>(numel()));
    for (int64_t i = 0; i < numel(); ++i) out[i] = flat(i);
    return out;
  }

  // Uniform values in [lo, hi), rounded to the dtype.
  void fill_uniform(Rng& rng, double lo, double hi) {
    std::uniform_real_distribution<double> dist(lo, hi);
    for (int64_t i = 0; i < numel(); ++i) set_flat(i, dist(rng));
  }
  void fill(double x) {
    for (int64_t i = 0; i < numel(); ++i) set_flat(i, x);
  }
  // NaN in every storage element, padding included (outputs: unwritten elements fail).
  void poison() {
    const int64_t esz = dtype_size(view_.dtype);
    for (int64_t i = 0; i < storage_elems_; ++i) {
      unsigned char* p = reinterpret_cast<unsigned char*>(storage_.data()) + i * esz;
      if (esz == 2) {
        const uint16_t nan = view_.dtype == DType::kBFloat16 ? 0x7fc0 : 0x7e00;
        std::memcpy(p, &nan, 2);
      } else if (esz == 4) {
        const float nan = std::numeric_limits<float>::quiet_NaN();
        std::memcpy(p, &nan, 4);
      } else if (esz == 8) {
        const double nan = std::numeric_limits<double>::quiet_NaN();
        std::memcpy(p, &nan, 8);
      }
    }
  }
  // Number of storage elements outside the view that are no longer NaN (call after
  // poison() and the operation under test: a nonzero count means stray writes).
  int64_t padding_changed() const {
    std::vector<char> in_view(static_cast<size_t>(storage_elems_), 0);
    for (int64_t i = 0; i < numel(); ++i) in_view[offset_of_flat(i)] = 1;
    int64_t changed = 0;
    for (int64_t i = 0; i < storage_elems_; ++i) {
      if (!in_view[i] && !std::isnan(read_elem(view_, i))) ++changed;
    }
    return changed;
  }

 private:
  TensorView view_;
  std::vector<uint64_t> storage_;  // 8-byte aligned
  int64_t storage_elems_ = 0;
};

// ---------------------------------------------------------------------------
// Geometry makers (through the real validation, so they stay in sync with it)
// ---------------------------------------------------------------------------

// A dense CPU view without data, for shape-only validation.
inline TensorView shape_view(DType dtype, std::vector<int64_t> shape, DeviceType device = DeviceType::kCPU,
                             void* data = nullptr) {
  TensorView v;
  v.data = data;
  v.dtype = dtype;
  v.device = device;
  v.ndim = static_cast<int>(shape.size());
  int64_t stride = 1;
  for (int i = v.ndim - 1; i >= 0; --i) {
    v.shape[i] = shape[i];
    v.strides[i] = stride;
    stride *= shape[i];
  }
  return v;
}

struct HeadConfig {
  int hq = 1, hkv = 1, hmask = 1, nfunc = 1, dqk = 16, dv = 16;
  DType dtype = DType::kFloat16;
};

inline FlexGeometry make_bshd_geometry(int batch, int64_t sq, int64_t sk, const HeadConfig& h) {
  PlanInputs in;
  in.q = shape_view(h.dtype, {batch, sq, h.hq, h.dqk});
  in.k = shape_view(h.dtype, {batch, sk, h.hkv, h.dqk});
  in.v = shape_view(h.dtype, {batch, sk, h.hkv, h.dv});
  in.mask_func = shape_view(DType::kInt32, {h.hmask, h.nfunc, batch * sq});
  return validate_plan_inputs(in);
}

// THD geometry from per-sample lengths; max_seqlen defaults to the largest length
// (at least 1, since validation requires a positive maximum).
inline FlexGeometry make_thd_geometry(const std::vector<int64_t>& lens_q, const std::vector<int64_t>& lens_k,
                                      const HeadConfig& h, int64_t max_q = 0, int64_t max_k = 0) {
  EXPECT_EQ(lens_q.size(), lens_k.size());
  std::vector<int32_t> cu_q(1, 0), cu_k(1, 0);
  for (size_t b = 0; b < lens_q.size(); ++b) {
    cu_q.push_back(cu_q.back() + static_cast<int32_t>(lens_q[b]));
    cu_k.push_back(cu_k.back() + static_cast<int32_t>(lens_k[b]));
  }
  if (max_q == 0) max_q = std::max<int64_t>(1, *std::max_element(lens_q.begin(), lens_q.end()));
  if (max_k == 0) max_k = std::max<int64_t>(1, *std::max_element(lens_k.begin(), lens_k.end()));
  PlanInputs in;
  in.q = shape_view(h.dtype, {cu_q.back(), h.hq, h.dqk});
  in.k = shape_view(h.dtype, {cu_k.back(), h.hkv, h.dqk});
  in.v = shape_view(h.dtype, {cu_k.back(), h.hkv, h.dv});
  in.mask_func = shape_view(DType::kInt32, {h.hmask, h.nfunc, cu_q.back()});
  in.cu_seqlens_q = shape_view(DType::kInt32, {static_cast<int64_t>(cu_q.size())}, DeviceType::kCPU, cu_q.data());
  in.cu_seqlens_k = shape_view(DType::kInt32, {static_cast<int64_t>(cu_k.size())}, DeviceType::kCPU, cu_k.data());
  in.max_seqlen_q = max_q;
  in.max_seqlen_k = max_k;
  return validate_plan_inputs(in);
}

// Tensors of the shapes a geometry expects (q, k, v, out, lse), optionally strided.
inline std::vector<int64_t> shape_vec(void (*fn)(const FlexGeometry&, int64_t*, int*), const FlexGeometry& g) {
  int64_t s[kMaxDims];
  int n = 0;
  fn(g, s, &n);
  return {s, s + n};
}
inline HostTensor make_q(const FlexGeometry& g, const DimOrder& o = {}, int64_t pad = 0) {
  return HostTensor(g.dtype, shape_vec(expected_q_shape, g), o, pad);
}
inline HostTensor make_k(const FlexGeometry& g, const DimOrder& o = {}, int64_t pad = 0) {
  return HostTensor(g.dtype, shape_vec(expected_k_shape, g), o, pad);
}
inline HostTensor make_v(const FlexGeometry& g, const DimOrder& o = {}, int64_t pad = 0) {
  return HostTensor(g.dtype, shape_vec(expected_v_shape, g), o, pad);
}
inline HostTensor make_out(const FlexGeometry& g, const DimOrder& o = {}, int64_t pad = 0) {
  return HostTensor(g.dtype, shape_vec(expected_out_shape, g), o, pad);
}
inline HostTensor make_lse(const FlexGeometry& g, int64_t pad = 0) {
  return HostTensor(DType::kFloat32, shape_vec(expected_lse_shape, g), {}, pad);
}

// Sample index and sample-local position of a flattened query row.
inline int sample_of_row(const FlexGeometry& g, int64_t row) {
  int b = 0;
  while (b + 1 < g.batch && g.cu_seqlens_q[b + 1] <= row) ++b;
  return b;
}

// ---------------------------------------------------------------------------
// Interval masks
// ---------------------------------------------------------------------------

struct MaskOptions {
  double p_empty_row = 0.08;  // row sees nothing (F0 = 0, every later interval empty)
  double p_full_row = 0.08;   // row sees all keys
  double p_causal_row = 0.1;  // one interval [0, min(pos + 1 + shift, Sk))
  double p_zero = 0.12;       // an endpoint snaps to 0
  double p_end = 0.12;        // an endpoint snaps to Sk
  double p_repeat = 0.15;     // an endpoint repeats the previous one (empty interval)
  int granularity = 1;        // endpoints (other than Sk) rounded down to a multiple of this
};

// Random endpoints for every row of `g`: contiguous int32 [Hmask, nfunc, total_q],
// sample-local, nondecreasing, within [0, Sk(b)]. Mixes empty rows, full rows,
// causal rows, empty intervals and endpoints at 0 and Sk.
inline std::vector<int32_t> random_interval_mask(Rng& rng, const FlexGeometry& g, const MaskOptions& opt = {}) {
  const int64_t T = g.total_q;
  const int nf = g.nfunc;
  std::vector<int32_t> mask(static_cast<size_t>(g.num_heads_mask) * nf * T);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  std::vector<int64_t> e(nf);
  for (int hm = 0; hm < g.num_heads_mask; ++hm) {
    for (int64_t row = 0; row < T; ++row) {
      const int b = sample_of_row(g, row);
      const int64_t lk = g.seqlen_k(b), pos = row - g.cu_seqlens_q[b];
      auto snap = [&](int64_t x) { return x >= lk ? lk : x - x % std::max(1, opt.granularity); };
      std::uniform_int_distribution<int64_t> any_key(0, lk);
      const double kind = u(rng);
      if (kind < opt.p_empty_row) {
        // [0, 0) and every later visible interval [F(2i-1), F(2i)) empty.
        std::vector<int64_t> cuts;
        for (int f = 1; f < nf; f += 2) cuts.push_back(snap(any_key(rng)));
        std::sort(cuts.begin(), cuts.end());
        e[0] = 0;
        for (int f = 1; f < nf; f += 2) e[f] = e[f + 1] = cuts[(f - 1) / 2];
      } else if (kind < opt.p_empty_row + opt.p_full_row) {
        // [0, a) U [a, Sk) or [0, Sk): full either way.
        const int64_t a = snap(any_key(rng));
        e[0] = nf > 1 && u(rng) < 0.5 ? a : lk;
        for (int f = 1; f < nf; ++f) e[f] = f == 1 ? e[0] : lk;
      } else if (kind < opt.p_empty_row + opt.p_full_row + opt.p_causal_row) {
        const int64_t shift = std::uniform_int_distribution<int64_t>(-2, 2)(rng);
        e[0] = std::clamp<int64_t>(pos + 1 + shift, 0, lk);
        for (int f = 1; f < nf; ++f) e[f] = lk;
      } else {
        for (int f = 0; f < nf; ++f) {
          const double c = u(rng);
          if (c < opt.p_zero) e[f] = 0;
          else if (c < opt.p_zero + opt.p_end) e[f] = lk;
          else if (c < opt.p_zero + opt.p_end + opt.p_repeat && f > 0) e[f] = e[f - 1];
          else e[f] = snap(any_key(rng));
        }
        std::sort(e.begin(), e.end());
      }
      for (int f = 0; f < nf; ++f) mask[(static_cast<size_t>(hm) * nf + f) * T + row] = static_cast<int32_t>(e[f]);
    }
  }
  return mask;
}

// Dense boolean mask [Hmask, total_q, max_seqlen_k] from endpoints, built without
// interval walking: key j is visible iff an even number of endpoints are <= j.
class DenseMask {
 public:
  DenseMask(const int32_t* mask, const FlexGeometry& g)
      : hm_(g.num_heads_mask), t_(g.total_q), sk_(g.max_seqlen_k),
        bits_(static_cast<size_t>(hm_) * t_ * sk_, 0) {
    for (int hm = 0; hm < hm_; ++hm) {
      for (int64_t row = 0; row < t_; ++row) {
        const int64_t lk = g.seqlen_k(sample_of_row(g, row));
        for (int64_t j = 0; j < lk; ++j) {
          int count = 0;
          for (int f = 0; f < g.nfunc; ++f) count += mask[(static_cast<size_t>(hm) * g.nfunc + f) * t_ + row] <= j;
          bits_[(static_cast<size_t>(hm) * t_ + row) * sk_ + j] = count % 2 == 0;
        }
      }
    }
  }
  bool visible(int mask_head, int64_t row, int64_t key) const {
    return bits_[(static_cast<size_t>(mask_head) * t_ + row) * sk_ + key] != 0;
  }
  int64_t count(int mask_head) const {
    return std::count(bits_.begin() + static_cast<int64_t>(mask_head) * t_ * sk_,
                      bits_.begin() + static_cast<int64_t>(mask_head + 1) * t_ * sk_, 1);
  }

 private:
  int hm_;
  int64_t t_, sk_;
  std::vector<uint8_t> bits_;
};

// ---------------------------------------------------------------------------
// Comparisons
// ---------------------------------------------------------------------------

// Every element must satisfy |got - want| <= atol + rtol * |want| (NaN fails; equal
// infinities pass). On failure reports the count and the worst element.
inline ::testing::AssertionResult all_close(const std::vector<double>& got, const std::vector<double>& want,
                                            double rtol, double atol) {
  if (got.size() != want.size()) {
    return ::testing::AssertionFailure() << "size " << got.size() << " != " << want.size();
  }
  int64_t bad = 0, worst = -1;
  double worst_excess = -1;
  for (size_t i = 0; i < got.size(); ++i) {
    const double a = got[i], b = want[i];
    if (std::isinf(b) && a == b) continue;
    const double err = std::fabs(a - b), tol = atol + rtol * std::fabs(b);
    if (!(err <= tol)) {
      ++bad;
      const double excess = std::isnan(err) ? std::numeric_limits<double>::infinity() : err - tol;
      if (excess > worst_excess) worst_excess = excess, worst = static_cast<int64_t>(i);
    }
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << bad << " of " << got.size() << " elements differ; worst at flat index "
                                       << worst << ": got " << got[worst] << ", want " << want[worst]
                                       << " (rtol " << rtol << ", atol " << atol << ")";
}

inline double max_abs(const std::vector<double>& v) {
  double m = 0;
  for (double x : v) {
    if (std::isfinite(x)) m = std::max(m, std::fabs(x));
  }
  return m;
}

// ---------------------------------------------------------------------------
// Errors
// ---------------------------------------------------------------------------

// Runs fn and expects a flashspan::Error with `status` whose message contains `needle`
// (the argument name and the rule). Usage: EXPECT_TRUE(throws_error(fn, st, "q:")).
template <typename Fn>
::testing::AssertionResult throws_error(Fn&& fn, Status status, const std::string& needle) {
  try {
    fn();
  } catch (const Error& e) {
    const std::string msg = e.what();
    if (e.status() != status) {
      return ::testing::AssertionFailure() << "status " << int(e.status()) << " instead of " << int(status)
                                           << "; message: " << msg;
    }
    if (msg.find(needle) == std::string::npos) {
      return ::testing::AssertionFailure() << "message lacks '" << needle << "': " << msg;
    }
    return ::testing::AssertionSuccess();
  } catch (const std::exception& e) {
    return ::testing::AssertionFailure() << "threw a non-flashspan exception: " << e.what();
  }
  return ::testing::AssertionFailure() << "no error thrown (expected one containing '" << needle << "')";
}

}  // namespace flashspan::test
