#include "core/validation.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <utility>
#include <string>

namespace flashspan {

float default_softmax_scale(int head_dim_qk) { return 1.0f / std::sqrt(static_cast<float>(head_dim_qk)); }

std::string FlexGeometry::first_difference(const FlexGeometry& o) const {
  auto diff = [](const char* name, auto a, auto b) {
    return a == b ? std::string() : detail::concat(name, " ", a, " vs ", b);
  };
  std::string d;
  auto first = [&d](std::string s) {
    if (d.empty()) d = std::move(s);
  };
  first(diff("layout (1 = THD)", int(varlen), int(o.varlen)));
  first(diff("batch", batch, o.batch));
  first(diff("max_seqlen_q", max_seqlen_q, o.max_seqlen_q));
  first(diff("max_seqlen_k", max_seqlen_k, o.max_seqlen_k));
  first(diff("total_q", total_q, o.total_q));
  first(diff("total_k", total_k, o.total_k));
  first(diff("Hq", num_heads_q, o.num_heads_q));
  first(diff("Hkv", num_heads_kv, o.num_heads_kv));
  first(diff("Dqk", head_dim_qk, o.head_dim_qk));
  first(diff("Dv", head_dim_v, o.head_dim_v));
  if (d.empty() && dtype != o.dtype) d = detail::concat("dtype ", dtype_name(dtype), " vs ", dtype_name(o.dtype));
  if (d.empty() && (device != o.device || device_id != o.device_id))
    d = detail::concat("device ", device == DeviceType::kCUDA ? "cuda:" : "cpu:", device_id, " vs ",
                       o.device == DeviceType::kCUDA ? "cuda:" : "cpu:", o.device_id);
  return d;
}

namespace {

const char* device_name(DeviceType d) { return d == DeviceType::kCUDA ? "cuda" : "cpu"; }

// float64 runs on the CPU reference only (in double throughout: gradcheck); the GPU kernels take float16 and
// bfloat16 (flex_dispatch.cu refuses the others with the GPU's rule).
void check_float_dtype(const TensorView& t, const char* name) {
  FS_CHECK_TYPE(t.dtype == DType::kFloat16 || t.dtype == DType::kBFloat16 || t.dtype == DType::kFloat32 ||
                    t.dtype == DType::kFloat64,
                name, ": dtype must be float16, bfloat16, float32 or float64, got ", dtype_name(t.dtype));
  FS_CHECK_SUPPORTED(t.dtype != DType::kFloat64 || t.device == DeviceType::kCPU, name,
                     ": float64 runs on CPU tensors only (the GPU kernels take float16 or bfloat16)");
}

void check_same_device(const TensorView& t, const char* name, const TensorView& ref) {
  FS_CHECK_TYPE(t.device == ref.device && t.device_id == ref.device_id, name, ": must be on the same device as q (",
                device_name(ref.device), ":", ref.device_id, "), got ", device_name(t.device), ":", t.device_id);
}

std::vector<int32_t> read_cu_seqlens(const TensorView& t, const char* name, int batch_plus_1, const int32_t* host) {
  FS_CHECK_TYPE(t.dtype == DType::kInt32, name, ": dtype must be int32, got ", dtype_name(t.dtype));
  FS_CHECK_ARG(t.ndim == 1, name, ": must be a 1-D tensor [B+1], got rank ", t.ndim);
  FS_CHECK_ARG(t.size(0) == batch_plus_1, name, ": must have B+1 = ", batch_plus_1, " elements, got ", t.size(0));
  FS_CHECK_ARG(t.size(0) < 2 || t.stride(0) == 1, name, ": must be contiguous");
  std::vector<int32_t> v(batch_plus_1);
  if (t.is_cuda()) {
    FS_CHECK(host != nullptr, Status::kInternal, name, ": host copy of a CUDA tensor was not provided");
    for (int i = 0; i < batch_plus_1; ++i) v[i] = host[i];
  } else {
    const int32_t* p = t.ptr<int32_t>();
    for (int i = 0; i < batch_plus_1; ++i) v[i] = p[i];
  }
  return v;
}

void check_cu_seqlens_values(const std::vector<int32_t>& cu, const char* name, int64_t total, int64_t max_seqlen,
                             const char* max_name) {
  FS_CHECK_ARG(cu.front() == 0, name, ": must start at 0, got ", cu.front());
  for (size_t b = 0; b + 1 < cu.size(); ++b) {
    const int64_t len = int64_t(cu[b + 1]) - cu[b];
    FS_CHECK_ARG(len >= 0, name, ": must be nondecreasing, but ", name, "[", b + 1, "] = ", cu[b + 1], " < ", name,
                 "[", b, "] = ", cu[b]);
    FS_CHECK_ARG(len <= max_seqlen, name, ": sample ", b, " has length ", len, ", longer than ", max_name, " = ",
                 max_seqlen);
  }
  FS_CHECK_ARG(cu.back() == total, name, ": must end at the total length ", total, ", got ", cu.back());
}

}  // namespace

void check_last_dim_contiguous(const TensorView& t, const char* name) {
  // An empty tensor has no element to read: any stride will do (autograd hands expanded,
  // stride-0 gradients of empty outputs).
  FS_CHECK_ARG(t.ndim > 0 && (t.size(-1) <= 1 || t.stride(-1) == 1 || t.numel() == 0), name,
               ": last dimension must be contiguous (stride 1), got stride ", t.ndim > 0 ? t.stride(-1) : 0);
}

void check_head_dims_reference(int dqk, int dv) {
  FS_CHECK_SUPPORTED(dqk > 0 && dqk % 8 == 0 && dqk <= 256, "head_dim_qk: must be a multiple of 8 in [8, 256], got ",
                     dqk);
  FS_CHECK_SUPPORTED(dv > 0 && dv % 8 == 0 && dv <= 256, "head_dim_v: must be a multiple of 8 in [8, 256], got ", dv);
}

void check_softmax_scale(float scale, bool want_max_logit) {
  FS_CHECK_ARG(std::isfinite(scale), "softmax_scale: must be finite, got ", scale);
  FS_CHECK_ARG(!want_max_logit || scale >= 0.0f, "softmax_scale: must be non-negative when max_logit is requested, got ",
               scale);
}

FlexGeometry validate_plan_inputs(const PlanInputs& in, const int32_t* cu_q_host, const int32_t* cu_k_host) {
  const TensorView &q = in.q, &k = in.k, &v = in.v, &m = in.mask_func;
  FS_CHECK_ARG(q.defined(), "q: is required");
  FS_CHECK_ARG(k.defined(), "k: is required");
  FS_CHECK_ARG(v.defined(), "v: is required");
  FS_CHECK_ARG(m.defined(), "mask_func: is required");
  const bool has_cu_q = in.cu_seqlens_q.defined(), has_cu_k = in.cu_seqlens_k.defined();
  FS_CHECK_ARG(has_cu_q == has_cu_k, "cu_seqlens_q, cu_seqlens_k: give both (THD) or neither (BSHD)");
  const bool varlen = has_cu_q;
  const int rank = varlen ? 3 : 4;
  const char* layout = varlen ? "THD [total, heads, head_dim]" : "BSHD [batch, seqlen, heads, head_dim]";
  FS_CHECK_ARG(q.ndim == rank, "q: must have rank ", rank, " (", layout, "), got rank ", q.ndim);
  FS_CHECK_ARG(k.ndim == rank, "k: must have rank ", rank, " (", layout, "), got rank ", k.ndim);
  FS_CHECK_ARG(v.ndim == rank, "v: must have rank ", rank, " (", layout, "), got rank ", v.ndim);
  check_float_dtype(q, "q");
  FS_CHECK_TYPE(k.dtype == q.dtype, "k: dtype ", dtype_name(k.dtype), " differs from q's ", dtype_name(q.dtype));
  FS_CHECK_TYPE(v.dtype == q.dtype, "v: dtype ", dtype_name(v.dtype), " differs from q's ", dtype_name(q.dtype));
  check_same_device(k, "k", q);
  check_same_device(v, "v", q);
  check_same_device(m, "mask_func", q);
  check_last_dim_contiguous(q, "q");
  check_last_dim_contiguous(k, "k");
  check_last_dim_contiguous(v, "v");

  FlexGeometry g;
  g.varlen = varlen;
  g.dtype = q.dtype;
  g.device = q.device;
  g.device_id = q.device_id;
  const int h = varlen ? 1 : 2;  // heads dimension
  // Heads, head dims and B are ints in the plan: larger extents are errors, never truncated.
  constexpr int64_t kIntMax = 2147483647;
  FS_CHECK_ARG(q.size(h) <= kIntMax && k.size(h) <= kIntMax && v.size(h) <= kIntMax, "q, k, v: the number of heads ",
               "must be below 2^31, got Hq = ", q.size(h), ", Hkv = ", k.size(h), ", v heads = ", v.size(h));
  FS_CHECK_ARG(q.size(-1) <= kIntMax && v.size(-1) <= kIntMax, "q, v: head dims must be below 2^31, got Dqk = ",
               q.size(-1), ", Dv = ", v.size(-1));
  g.num_heads_q = static_cast<int>(q.size(h));
  g.num_heads_kv = static_cast<int>(k.size(h));
  g.head_dim_qk = static_cast<int>(q.size(-1));
  g.head_dim_v = static_cast<int>(v.size(-1));
  FS_CHECK_ARG(g.num_heads_q > 0, "q: number of heads must be positive");
  FS_CHECK_ARG(g.num_heads_kv > 0, "k: number of heads must be positive");
  FS_CHECK_ARG(v.size(h) == g.num_heads_kv, "v: number of heads ", v.size(h), " differs from k's ", g.num_heads_kv,
               " (K and V share one head count, Hkv)");
  FS_CHECK_ARG(g.num_heads_q % g.num_heads_kv == 0, "q, k: Hq % Hkv must be 0 (MHA/GQA/MQA), got Hq = ", g.num_heads_q,
               ", Hkv = ", g.num_heads_kv);
  FS_CHECK_ARG(k.size(-1) == g.head_dim_qk, "k: head dim ", k.size(-1), " differs from q's ", g.head_dim_qk);
  check_head_dims_reference(g.head_dim_qk, g.head_dim_v);

  if (!varlen) {
    // The seed's rule (ValueError): a BSHD call has at least one sequence.
    FS_CHECK_ARG(q.size(0) >= 1 && q.size(0) <= kIntMax, "q: batch size B (dim 0) must be in [1, 2^31) for BSHD, got ",
                 q.size(0));
    g.batch = static_cast<int>(q.size(0));
    g.max_seqlen_q = q.size(1);
    g.max_seqlen_k = k.size(1);
    FS_CHECK_ARG(k.size(0) == g.batch, "k: batch ", k.size(0), " differs from q's ", g.batch);
    FS_CHECK_ARG(v.size(0) == g.batch, "v: batch ", v.size(0), " differs from q's ", g.batch);
    FS_CHECK_ARG(v.size(1) == g.max_seqlen_k, "v: sequence length ", v.size(1), " differs from k's ", g.max_seqlen_k);
    g.total_q = int64_t(g.batch) * g.max_seqlen_q;
    g.total_k = int64_t(g.batch) * g.max_seqlen_k;
    g.cu_seqlens_q.resize(g.batch + 1);
    g.cu_seqlens_k.resize(g.batch + 1);
    for (int b = 0; b <= g.batch; ++b) {
      g.cu_seqlens_q[b] = static_cast<int32_t>(int64_t(b) * g.max_seqlen_q);
      g.cu_seqlens_k[b] = static_cast<int32_t>(int64_t(b) * g.max_seqlen_k);
    }
  } else {
    g.total_q = q.size(0);
    g.total_k = k.size(0);
    FS_CHECK_ARG(v.size(0) == g.total_k, "v: total length ", v.size(0), " differs from k's ", g.total_k);
    FS_CHECK_ARG(in.cu_seqlens_q.ndim == 1 && in.cu_seqlens_q.size(0) >= 2,
                 "cu_seqlens_q: must be a 1-D int32 tensor [B+1] with B >= 1");
    FS_CHECK_ARG(in.cu_seqlens_q.size(0) <= kIntMax, "cu_seqlens_q: B+1 must be below 2^31, got ",
                 in.cu_seqlens_q.size(0));
    FS_CHECK_ARG(in.cu_seqlens_k.ndim == 1 && in.cu_seqlens_k.size(0) == in.cu_seqlens_q.size(0),
                 "cu_seqlens_k: must be a 1-D int32 tensor with as many elements as cu_seqlens_q (",
                 in.cu_seqlens_q.size(0), ")");
    check_same_device(in.cu_seqlens_q, "cu_seqlens_q", q);
    check_same_device(in.cu_seqlens_k, "cu_seqlens_k", q);
    g.batch = static_cast<int>(in.cu_seqlens_q.size(0) - 1);
    // 0 is valid (the seed accepts it): every sample is then empty on that side.
    FS_CHECK_ARG(in.max_seqlen_q >= 0, "max_seqlen_q: must be >= 0 for THD, got ", in.max_seqlen_q);
    FS_CHECK_ARG(in.max_seqlen_k >= 0, "max_seqlen_k: must be >= 0 for THD, got ", in.max_seqlen_k);
    FS_CHECK_ARG(in.max_seqlen_q < (int64_t(1) << 31), "max_seqlen_q: must be below 2^31 (cu_seqlens are int32), got ",
                 in.max_seqlen_q);
    FS_CHECK_ARG(in.max_seqlen_k < (int64_t(1) << 31), "max_seqlen_k: must be below 2^31 (cu_seqlens are int32), got ",
                 in.max_seqlen_k);
    g.max_seqlen_q = in.max_seqlen_q;
    g.max_seqlen_k = in.max_seqlen_k;
    g.cu_seqlens_q = read_cu_seqlens(in.cu_seqlens_q, "cu_seqlens_q", g.batch + 1, cu_q_host);
    g.cu_seqlens_k = read_cu_seqlens(in.cu_seqlens_k, "cu_seqlens_k", g.batch + 1, cu_k_host);
    check_cu_seqlens_values(g.cu_seqlens_q, "cu_seqlens_q", g.total_q, g.max_seqlen_q, "max_seqlen_q");
    check_cu_seqlens_values(g.cu_seqlens_k, "cu_seqlens_k", g.total_k, g.max_seqlen_k, "max_seqlen_k");
  }
  FS_CHECK_ARG(g.total_q < (int64_t(1) << 31) && g.total_k < (int64_t(1) << 31),
               "q, k: total sequence length must be below 2^31");

  // mask_func [Hmask, nfunc, B*Sq | Tq]
  FS_CHECK_TYPE(m.dtype == DType::kInt32, "mask_func: dtype must be int32, got ", dtype_name(m.dtype));
  FS_CHECK_ARG(m.ndim == 3, "mask_func: must have rank 3 [Hmask, nfunc, ", varlen ? "Tq" : "B*Sq", "], got rank ",
               m.ndim);
  FS_CHECK_ARG(m.is_contiguous(), "mask_func: must be contiguous");
  g.num_heads_mask = static_cast<int>(m.size(0));
  g.nfunc = static_cast<int>(m.size(1));
  FS_CHECK_ARG(g.num_heads_mask == 1 || g.num_heads_mask == g.num_heads_q, "mask_func: Hmask (dim 0) must be 1 or Hq = ",
               g.num_heads_q, ", got ", g.num_heads_mask);
  FS_CHECK_ARG(g.nfunc > 0 && g.nfunc % 2 == 1, "mask_func: nfunc (dim 1) must be positive and odd, got ", g.nfunc);
  FS_CHECK_ARG(m.size(2) == g.total_q, "mask_func: length (dim 2) must be ", varlen ? "Tq = " : "B*Sq = ", g.total_q,
               ", got ", m.size(2));
  return g;
}

void throw_endpoint_error(int kind, int64_t mask_head, int64_t row, int64_t index, int64_t value, int64_t limit,
                          const FlexGeometry& g) {
  // Locate the row's sample for the message.
  int b = 0;
  while (b + 1 < g.batch && g.cu_seqlens_q[b + 1] <= row) ++b;
  const int64_t pos = row - g.cu_seqlens_q[b];
  const std::string where = detail::concat("mask_func[", mask_head, ", ", index, ", ", row, "] (sample ", b,
                                           ", query ", pos, ")");
  switch (kind) {
    case 1: throw Error(Status::kInvalidArgument, detail::concat("mask_func: endpoint ", where, " = ", value,
                                                                 " is negative; endpoints must be in [0, Sk]"));
    case 2: throw Error(Status::kInvalidArgument,
                        detail::concat("mask_func: endpoint ", where, " = ", value, " is past the sample's key length ",
                                       limit, "; endpoints must be in [0, Sk]"));
    default: throw Error(Status::kInvalidArgument,
                         detail::concat("mask_func: endpoints must be nondecreasing within a row, but ", where, " = ",
                                        value, " < previous endpoint ", limit));
  }
}

void validate_endpoints_host(const int32_t* mask, const FlexGeometry& g) {
  const int64_t T = g.total_q;
  for (int hm = 0; hm < g.num_heads_mask; ++hm) {
    for (int b = 0; b < g.batch; ++b) {
      const int64_t lk = g.seqlen_k(b);
      for (int64_t row = g.cu_seqlens_q[b]; row < g.cu_seqlens_q[b + 1]; ++row) {
        int64_t prev = 0;
        for (int f = 0; f < g.nfunc; ++f) {
          const int64_t e = mask[(int64_t(hm) * g.nfunc + f) * T + row];
          if (e < 0) throw_endpoint_error(1, hm, row, f, e, lk, g);
          if (e > lk) throw_endpoint_error(2, hm, row, f, e, lk, g);
          if (e < prev) throw_endpoint_error(3, hm, row, f, e, prev, g);
          prev = e;
        }
      }
    }
  }
}

void check_same_tensor_shape(const TensorView& t, const char* name, const int64_t* shape, int ndim, DType dtype,
                             DeviceType device, int device_id, const char* dtype_why) {
  FS_CHECK_ARG(t.defined(), name, ": is required");
  FS_CHECK_TYPE(t.dtype == dtype, name, ": dtype must be ", dtype_name(dtype), ", got ", dtype_name(t.dtype),
                dtype_why != nullptr ? " (" : "", dtype_why != nullptr ? dtype_why : "", dtype_why != nullptr ? ")" : "");
  FS_CHECK_TYPE(t.device == device && t.device_id == device_id, name, ": must be on ", device_name(device), ":",
                device_id, ", got ", device_name(t.device), ":", t.device_id);
  bool ok = t.ndim == ndim;
  for (int i = 0; ok && i < ndim; ++i) ok = t.shape[i] == shape[i];
  if (!ok) {
    std::string want = "[";
    for (int i = 0; i < ndim; ++i) want += (i ? ", " : "") + std::to_string(shape[i]);
    want += "]";
    throw Error(Status::kInvalidArgument, detail::concat(name, ": shape must be ", want, ", got ", t.shape_str()));
  }
  check_last_dim_contiguous(t, name);
}

static void set_shape(int64_t* s, int* n, std::initializer_list<int64_t> v) {
  *n = 0;
  for (int64_t x : v) s[(*n)++] = x;
}

void expected_q_shape(const FlexGeometry& g, int64_t* s, int* n) {
  if (g.varlen) set_shape(s, n, {g.total_q, g.num_heads_q, g.head_dim_qk});
  else set_shape(s, n, {g.batch, g.max_seqlen_q, g.num_heads_q, g.head_dim_qk});
}
void expected_k_shape(const FlexGeometry& g, int64_t* s, int* n) {
  if (g.varlen) set_shape(s, n, {g.total_k, g.num_heads_kv, g.head_dim_qk});
  else set_shape(s, n, {g.batch, g.max_seqlen_k, g.num_heads_kv, g.head_dim_qk});
}
void expected_v_shape(const FlexGeometry& g, int64_t* s, int* n) {
  if (g.varlen) set_shape(s, n, {g.total_k, g.num_heads_kv, g.head_dim_v});
  else set_shape(s, n, {g.batch, g.max_seqlen_k, g.num_heads_kv, g.head_dim_v});
}
void expected_out_shape(const FlexGeometry& g, int64_t* s, int* n) {
  if (g.varlen) set_shape(s, n, {g.total_q, g.num_heads_q, g.head_dim_v});
  else set_shape(s, n, {g.batch, g.max_seqlen_q, g.num_heads_q, g.head_dim_v});
}
void expected_lse_shape(const FlexGeometry& g, int64_t* s, int* n) {
  if (g.varlen) set_shape(s, n, {g.num_heads_q, g.total_q});
  else set_shape(s, n, {g.batch, g.num_heads_q, g.max_seqlen_q});
}

// An output must not overlap itself: with a zero stride (an expanded tensor) or strides that
// interleave, several results land in one element and all but one are lost silently. Sorted by
// stride, each dimension's stride must reach past everything the inner dimensions span.
void check_no_self_overlap(const TensorView& t, const char* name, int first_dim) {
  if (!t.defined() || t.numel() == 0) return;
  std::array<std::pair<int64_t, int64_t>, kMaxDims> dims{};  // (|stride|, extent) of extents > 1
  int n = 0;
  for (int i = first_dim; i < t.ndim; ++i)
    if (t.size(i) > 1) {
      const int64_t s = t.stride(i);
      dims[n++] = {s == INT64_MIN ? INT64_MAX : (s < 0 ? -s : s), t.size(i)};
    }
  // Insertion sort of the n <= kMaxDims entries: std::sort on this small array makes GCC 12 warn
  // (-Warray-bounds: its inlined insertion sort reads 16 elements ahead of a 6-element array).
  for (int i = 1; i < n; ++i)
    for (int j = i; j > 0 && dims[j] < dims[j - 1]; --j) std::swap(dims[j], dims[j - 1]);
  int64_t span = 1;  // elements an inner block covers
  for (int i = 0; i < n; ++i) {
    FS_CHECK_ARG(dims[i].first >= span, name, ": strides make different elements share memory (stride ",
                 dims[i].first, " with extent ", dims[i].second, " inside a block of ", span,
                 " elements; shape ", t.shape_str(), "): an output must not overlap itself");
    // Saturating: a span past 2^62 elements already exceeds every stride a later check can meet.
    const __int128 next = __int128(dims[i].first) * (dims[i].second - 1) + span;
    span = next > (__int128(1) << 62) ? (int64_t(1) << 62) : int64_t(next);
  }
}

namespace {

// [first, last + 1) in bytes of a bound, non-empty tensor: each dimension's steps below or above its first element.
std::pair<__int128, __int128> byte_range(const TensorView& t) {
  __int128 lo = 0, hi = 0;
  for (int i = 0; i < t.ndim; ++i) {
    const __int128 reach = __int128(t.stride(i)) * (t.size(i) - 1);
    (reach < 0 ? lo : hi) += reach;
  }
  const __int128 item = dtype_size(t.dtype), base = reinterpret_cast<uintptr_t>(t.data);
  return {base + lo * item, base + hi * item + item};
}

}  // namespace

void check_no_overlap(const TensorView& out, const char* out_name, const TensorView& in, const char* in_name,
                      const char* why) {
  if (!out.defined() || !in.defined() || out.data == nullptr || in.data == nullptr) return;
  if (out.numel() == 0 || in.numel() == 0) return;
  const auto [o0, o1] = byte_range(out);
  const auto [i0, i1] = byte_range(in);
  FS_CHECK_ARG(o1 <= i0 || i1 <= o0, out_name, ": shares memory with ", in_name,
               " (their spans of memory, from the first element any stride reaches to the last, meet; ", why, ")");
}

}  // namespace flashspan
