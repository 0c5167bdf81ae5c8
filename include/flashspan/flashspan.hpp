// flashspan — C++ API: a header-only RAII layer over the C ABI (flashspan.h).
//
// Errors are thrown as flashspan::api::Exception carrying the C status and the
// library's message (which names the argument and the rule broken).
//
// Example (BSHD, causal, CUDA tensors already allocated by the caller):
//
//   using namespace flashspan::api;
//   TensorDesc q(q_ptr, kBFloat16, Device::cuda(0), {B, S, H, D});
//   ...
//   MaskPlan plan = MaskPlan::create(PlanArgs{&mask, &q, &k, &v}.with_backward(true));
//   FlexAttentionFwd fwd(FwdArgs{&q, &k, &v, &out, &plan}.with_lse(&lse));
//   fwd.check_support();
//   fwd.compile();
//   void* ws = my_alloc(fwd.workspace_size());
//   fwd.execute(FwdArgs{&q, &k, &v, &out, &plan}.with_lse(&lse), ws, fwd.workspace_size(), stream);
#pragma once

#include <cstdint>
#include <initializer_list>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "flashspan/flashspan.h"

namespace flashspan::api {

class Exception : public std::runtime_error {
 public:
  Exception(fs_status_t status, const std::string& message) : std::runtime_error(message), status_(status) {}
  fs_status_t status() const noexcept { return status_; }

 private:
  fs_status_t status_;
};

inline void check(fs_status_t status) {
  if (status != FS_STATUS_SUCCESS) throw Exception(status, fs_get_last_error());
}

inline constexpr fs_dtype_t kFloat16{FS_DTYPE_FLOAT, 16, 1};
inline constexpr fs_dtype_t kBFloat16{FS_DTYPE_BFLOAT, 16, 1};
inline constexpr fs_dtype_t kFloat32{FS_DTYPE_FLOAT, 32, 1};
inline constexpr fs_dtype_t kInt32{FS_DTYPE_INT, 32, 1};
inline constexpr fs_dtype_t kInt64{FS_DTYPE_INT, 64, 1};
inline constexpr fs_dtype_t kFloat64{FS_DTYPE_FLOAT, 64, 1};
inline constexpr fs_dtype_t kUInt8{FS_DTYPE_UINT, 8, 1};
inline constexpr fs_dtype_t kFloat8E4M3{FS_DTYPE_FLOAT8_E4M3FN, 8, 1};  // torch.float8_e4m3fn
inline constexpr fs_dtype_t kFloat8E5M2{FS_DTYPE_FLOAT8_E5M2, 8, 1};    // torch.float8_e5m2

struct Device {
  static fs_device_t cpu() { return {FS_DEVICE_CPU, 0}; }
  static fs_device_t cuda(int id = 0) { return {FS_DEVICE_CUDA, id}; }
};

// A tensor descriptor that owns its shape and stride arrays. Strides in elements;
// empty strides mean compact row-major.
class TensorDesc {
 public:
  TensorDesc() = default;
  TensorDesc(void* data, fs_dtype_t dtype, fs_device_t device, std::vector<int64_t> shape,
             std::vector<int64_t> strides = {})
      : shape_(std::move(shape)), strides_(std::move(strides)) {
    t_.data = data;
    t_.dtype = dtype;
    t_.device = device;
    t_.ndim = static_cast<int32_t>(shape_.size());
    refresh();
  }
  TensorDesc(const TensorDesc& o) : t_(o.t_), shape_(o.shape_), strides_(o.strides_) { refresh(); }
  TensorDesc& operator=(const TensorDesc& o) {
    t_ = o.t_;
    shape_ = o.shape_;
    strides_ = o.strides_;
    refresh();
    return *this;
  }
  const fs_tensor_t* get() const { return &t_; }
  void set_data(void* data) { t_.data = data; }

 private:
  void refresh() {
    t_.shape = shape_.data();
    t_.strides = strides_.empty() ? nullptr : strides_.data();
  }
  fs_tensor_t t_{};
  std::vector<int64_t> shape_, strides_;
};

// Arguments of MaskPlan::create (see fs_mask_plan_args_t).
struct PlanArgs {
  const TensorDesc* mask_func = nullptr;
  const TensorDesc* q = nullptr;
  const TensorDesc* k = nullptr;
  const TensorDesc* v = nullptr;
  const TensorDesc* cu_seqlens_q = nullptr;
  const TensorDesc* cu_seqlens_k = nullptr;
  int64_t max_seqlen_q = 0, max_seqlen_k = 0;
  int pack_gqa = -1;
  bool build_backward = false;
  int arch = 0;
  void* stream = nullptr;

  PlanArgs& with_varlen(const TensorDesc* cu_q, const TensorDesc* cu_k, int64_t max_q, int64_t max_k) {
    cu_seqlens_q = cu_q;
    cu_seqlens_k = cu_k;
    max_seqlen_q = max_q;
    max_seqlen_k = max_k;
    return *this;
  }
  PlanArgs& with_backward(bool on) {
    build_backward = on;
    return *this;
  }
};

// Immutable, reusable mask plan (move-only owner of an fs_mask_plan_t).
class MaskPlan {
 public:
  static MaskPlan create(const PlanArgs& a) {
    auto p = [](const TensorDesc* t) { return t ? t->get() : nullptr; };
    fs_mask_plan_args_t c{};
    c.mask_func = p(a.mask_func);
    c.q = p(a.q);
    c.k = p(a.k);
    c.v = p(a.v);
    c.cu_seqlens_q = p(a.cu_seqlens_q);
    c.cu_seqlens_k = p(a.cu_seqlens_k);
    c.max_seqlen_q = a.max_seqlen_q;
    c.max_seqlen_k = a.max_seqlen_k;
    c.pack_gqa = a.pack_gqa;
    c.build_backward = a.build_backward ? 1 : 0;
    c.arch = a.arch;
    c.stream = a.stream;
    MaskPlan plan;
    check(fs_create_mask_plan(&c, &plan.h_));
    return plan;
  }
  MaskPlan() = default;
  MaskPlan(MaskPlan&& o) noexcept : h_(std::exchange(o.h_, nullptr)) {}
  MaskPlan& operator=(MaskPlan&& o) noexcept {
    std::swap(h_, o.h_);
    return *this;
  }
  MaskPlan(const MaskPlan&) = delete;
  MaskPlan& operator=(const MaskPlan&) = delete;
  ~MaskPlan() {
    if (h_) fs_mask_plan_destroy(h_);
  }
  fs_mask_plan_t handle() const { return h_; }
  fs_mask_plan_info_t info() const {
    fs_mask_plan_info_t i{};
    check(fs_mask_plan_get_info(h_, &i));
    return i;
  }
  // Host copy of a named int32 array of the plan (debug snapshots).
  std::vector<int32_t> array(const std::string& name) const {
    int64_t n = 0;
    check(fs_mask_plan_copy_array(h_, name.c_str(), nullptr, 0, &n));
    std::vector<int32_t> out(static_cast<size_t>(n));
    check(fs_mask_plan_copy_array(h_, name.c_str(), out.data(), n, &n));
    return out;
  }

 private:
  fs_mask_plan_t h_ = nullptr;
};

struct FwdArgs {
  const TensorDesc* q = nullptr;
  const TensorDesc* k = nullptr;
  const TensorDesc* v = nullptr;
  const TensorDesc* out = nullptr;
  const MaskPlan* plan = nullptr;
  const TensorDesc* lse = nullptr;
  const TensorDesc* max_logit = nullptr;
  float softmax_scale = 0.0f;
  bool has_softmax_scale = false;

  FwdArgs& with_lse(const TensorDesc* t) {
    lse = t;
    return *this;
  }
  FwdArgs& with_max_logit(const TensorDesc* t) {
    max_logit = t;
    return *this;
  }
  FwdArgs& with_scale(float s) {
    softmax_scale = s;
    has_softmax_scale = true;
    return *this;
  }
  fs_flex_fwd_args_t to_c() const {
    auto p = [](const TensorDesc* t) { return t ? t->get() : nullptr; };
    fs_flex_fwd_args_t c{};
    c.q = p(q);
    c.k = p(k);
    c.v = p(v);
    c.out = p(out);
    c.plan = plan ? plan->handle() : nullptr;
    c.lse = p(lse);
    c.max_logit = p(max_logit);
    c.softmax_scale = softmax_scale;
    c.has_softmax_scale = has_softmax_scale ? 1 : 0;
    return c;
  }
};

// Forward operation: construct from sample tensors, check_support(), compile(), then
// execute() any number of times with tensors of the same shape/stride/dtype/device.
class FlexAttentionFwd {
 public:
  explicit FlexAttentionFwd(const FwdArgs& sample) {
    const fs_flex_fwd_args_t c = sample.to_c();
    check(fs_flex_fwd_create(&c, &h_));
  }
  FlexAttentionFwd(const FlexAttentionFwd&) = delete;
  FlexAttentionFwd& operator=(const FlexAttentionFwd&) = delete;
  ~FlexAttentionFwd() {
    if (h_) fs_flex_fwd_destroy(h_);
  }
  void check_support() { check(fs_flex_fwd_check_support(h_)); }
  void compile() { check(fs_flex_fwd_compile(h_)); }
  size_t workspace_size() const {
    size_t n = 0;
    check(fs_flex_fwd_workspace_size(h_, &n));
    return n;
  }
  void execute(const FwdArgs& args, void* workspace, size_t workspace_bytes, void* stream = nullptr) {
    const fs_flex_fwd_args_t c = args.to_c();
    check(fs_flex_fwd_execute(h_, &c, workspace, workspace_bytes, stream));
  }

 private:
  fs_flex_fwd_t h_ = nullptr;
};

struct BwdArgs {
  const TensorDesc *q = nullptr, *k = nullptr, *v = nullptr, *out = nullptr, *dout = nullptr, *lse = nullptr;
  const TensorDesc *dq = nullptr, *dk = nullptr, *dv = nullptr;
  const MaskPlan* plan = nullptr;
  float softmax_scale = 0.0f;
  bool has_softmax_scale = false;
  bool deterministic = false;
  const TensorDesc* dlse = nullptr;  // optional fp32, shape of lse: gradient w.r.t. lse

  BwdArgs& with_dlse(const TensorDesc* t) {
    dlse = t;
    return *this;
  }

  fs_flex_bwd_args_t to_c() const {
    auto p = [](const TensorDesc* t) { return t ? t->get() : nullptr; };
    fs_flex_bwd_args_t c{};
    c.q = p(q);
    c.k = p(k);
    c.v = p(v);
    c.out = p(out);
    c.dout = p(dout);
    c.lse = p(lse);
    c.dq = p(dq);
    c.dk = p(dk);
    c.dv = p(dv);
    c.plan = plan ? plan->handle() : nullptr;
    c.softmax_scale = softmax_scale;
    c.has_softmax_scale = has_softmax_scale ? 1 : 0;
    c.deterministic = deterministic ? 1 : 0;
    c.dlse = p(dlse);
    return c;
  }
};

class FlexAttentionBwd {
 public:
  explicit FlexAttentionBwd(const BwdArgs& sample) {
    const fs_flex_bwd_args_t c = sample.to_c();
    check(fs_flex_bwd_create(&c, &h_));
  }
  FlexAttentionBwd(const FlexAttentionBwd&) = delete;
  FlexAttentionBwd& operator=(const FlexAttentionBwd&) = delete;
  ~FlexAttentionBwd() {
    if (h_) fs_flex_bwd_destroy(h_);
  }
  void check_support() { check(fs_flex_bwd_check_support(h_)); }
  void compile() { check(fs_flex_bwd_compile(h_)); }
  size_t workspace_size() const {
    size_t n = 0;
    check(fs_flex_bwd_workspace_size(h_, &n));
    return n;
  }
  void execute(const BwdArgs& args, void* workspace, size_t workspace_bytes, void* stream = nullptr) {
    const fs_flex_bwd_args_t c = args.to_c();
    check(fs_flex_bwd_execute(h_, &c, workspace, workspace_bytes, stream));
  }

 private:
  fs_flex_bwd_t h_ = nullptr;
};


// ===========================================================================
// SDPA (scaled dot-product attention with the cuDNN-frontend feature surface; docs/SDPA.md)
//
// Example (CPU tensors run the reference; BHSD descriptors, causal, with stats):
//
//   using namespace flashspan::api;
//   TensorDesc q(qp, kBFloat16, Device::cpu(), {B, H, S, D}), k(...), v(...), o(...);
//   TensorDesc stats(sp, kFloat32, Device::cpu(), {B, H, S, 1});
//   SdpaAttributes attr;
//   attr.set_attn_scale(0.125f).set_causal_mask(true).set_generate_stats(true);
//   SdpaFwd fwd(q, k, v, o, &stats, attr);
//   fwd.check_support();
//   fwd.compile();
//   SdpaVariantPack pack;
//   pack.set(FS_SDPA_Q, qp).set(FS_SDPA_K, kp).set(FS_SDPA_V, vp).set(FS_SDPA_O, op).set(FS_SDPA_STATS, sp);
//   fwd.execute(pack, workspace, fwd.workspace_size(), stream);
// ===========================================================================

enum class DiagonalAlignment : int32_t { kTopLeft = FS_SDPA_TOP_LEFT, kBottomRight = FS_SDPA_BOTTOM_RIGHT };

namespace detail {

// Setters shared by the forward and backward attribute objects (seed names; each returns the
// derived object so calls chain). Owns the C handle.
template <typename Derived>
class SdpaAttributesBase {
 public:
  SdpaAttributesBase(const SdpaAttributesBase&) = delete;
  SdpaAttributesBase& operator=(const SdpaAttributesBase&) = delete;
  ~SdpaAttributesBase() {
    if (h_) fs_sdpa_attributes_destroy(h_);
  }
  fs_sdpa_attributes_t handle() const { return h_; }

  Derived& set_attn_scale(float value) { return ok(fs_sdpa_attributes_set_attn_scale(h_, value)); }
  Derived& set_attn_scale(const TensorDesc& value) { return ok(fs_sdpa_attributes_set_attn_scale_tensor(h_, value.get())); }
  Derived& set_bias(const TensorDesc& value) { return ok(fs_sdpa_attributes_set_bias(h_, value.get())); }
  Derived& set_alibi_mask(bool value) { return ok(fs_sdpa_attributes_set_alibi_mask(h_, value)); }
  Derived& set_padding_mask(bool value) { return ok(fs_sdpa_attributes_set_padding_mask(h_, value)); }
  Derived& set_seq_len_q(const TensorDesc& value) { return ok(fs_sdpa_attributes_set_seq_len_q(h_, value.get())); }
  Derived& set_seq_len_kv(const TensorDesc& value) { return ok(fs_sdpa_attributes_set_seq_len_kv(h_, value.get())); }
  Derived& set_cu_seq_len_q(const TensorDesc& value) { return ok(fs_sdpa_attributes_set_cu_seq_len_q(h_, value.get())); }
  Derived& set_cu_seq_len_kv(const TensorDesc& value) { return ok(fs_sdpa_attributes_set_cu_seq_len_kv(h_, value.get())); }
  Derived& set_max_total_seq_len_q(int64_t value) { return ok(fs_sdpa_attributes_set_max_total_seq_len_q(h_, value)); }
  Derived& set_max_total_seq_len_kv(int64_t value) { return ok(fs_sdpa_attributes_set_max_total_seq_len_kv(h_, value)); }
  Derived& set_diagonal_alignment(DiagonalAlignment value) {
    return ok(fs_sdpa_attributes_set_diagonal_alignment(h_, static_cast<int32_t>(value)));
  }
  Derived& set_diagonal_band_left_bound(int64_t value) {
    return ok(fs_sdpa_attributes_set_diagonal_band_left_bound(h_, value));
  }
  Derived& set_diagonal_band_right_bound(int64_t value) {
    return ok(fs_sdpa_attributes_set_diagonal_band_right_bound(h_, value));
  }
  // DEPRECATED (as in the seed): TOP_LEFT, and right bound 0 unless one was set.
  Derived& set_causal_mask(bool value) { return ok(fs_sdpa_attributes_set_causal_mask(h_, value)); }
  // DEPRECATED: BOTTOM_RIGHT, and right bound 0 unless one was set.
  Derived& set_causal_mask_bottom_right(bool value) {
    return ok(fs_sdpa_attributes_set_causal_mask_bottom_right(h_, value));
  }
  // DEPRECATED: set_diagonal_band_left_bound(value).
  Derived& set_sliding_window_length(int64_t value) { return ok(fs_sdpa_attributes_set_sliding_window_length(h_, value)); }
  Derived& set_block_mask(const TensorDesc& value) { return ok(fs_sdpa_attributes_set_block_mask(h_, value.get())); }
  Derived& set_dropout(float probability, const TensorDesc& seed, const TensorDesc& offset) {
    return ok(fs_sdpa_attributes_set_dropout(h_, probability, seed.get(), offset.get()));
  }
  Derived& set_rng_dump(const TensorDesc& value) { return ok(fs_sdpa_attributes_set_rng_dump(h_, value.get())); }
  Derived& set_sink_token(const TensorDesc& value) { return ok(fs_sdpa_attributes_set_sink_token(h_, value.get())); }
  // flashspan extensions.
  Derived& set_softcap(float value) { return ok(fs_sdpa_attributes_set_softcap(h_, value)); }
  Derived& set_gate(const TensorDesc& value) { return ok(fs_sdpa_attributes_set_gate(h_, value.get())); }
  // The seed's tensor.set_ragged_offset(...) (and set_ragged_offset_multiplier) for one tensor slot.
  Derived& set_ragged_offset(fs_sdpa_slot_t tensor, const TensorDesc& offsets, int64_t multiplier = 1) {
    return ok(fs_sdpa_attributes_set_ragged_offset(h_, tensor, offsets.get(), multiplier));
  }
  // FP8 scale factors (fp32, 1 element) of both directions (docs/SDPA.md "FP8 SDPA").
  Derived& set_descale_q(const TensorDesc& value) { return ok(fs_sdpa_attributes_set_descale_q(h_, value.get())); }
  Derived& set_descale_k(const TensorDesc& value) { return ok(fs_sdpa_attributes_set_descale_k(h_, value.get())); }
  Derived& set_descale_v(const TensorDesc& value) { return ok(fs_sdpa_attributes_set_descale_v(h_, value.get())); }
  Derived& set_descale_s(const TensorDesc& value) { return ok(fs_sdpa_attributes_set_descale_s(h_, value.get())); }
  Derived& set_scale_s(const TensorDesc& value) { return ok(fs_sdpa_attributes_set_scale_s(h_, value.get())); }

 protected:
  explicit SdpaAttributesBase(bool backward) { check(fs_sdpa_attributes_create(backward ? 1 : 0, &h_)); }
  Derived& ok(fs_status_t s) {
    check(s);
    return static_cast<Derived&>(*this);
  }
  fs_sdpa_attributes_t h_ = nullptr;
};

}  // namespace detail

// Options of an SDPA forward operation (the seed's SDPA_attributes).
class SdpaAttributes : public detail::SdpaAttributesBase<SdpaAttributes> {
 public:
  SdpaAttributes() : SdpaAttributesBase(false) {}
  SdpaAttributes& set_generate_stats(bool value) { return ok(fs_sdpa_attributes_set_generate_stats(h_, value)); }
  // DEPRECATED: set_generate_stats(!value).
  SdpaAttributes& set_is_inference(bool value) { return ok(fs_sdpa_attributes_set_is_inference(h_, value)); }
  SdpaAttributes& set_stats_use_log2(bool value) { return ok(fs_sdpa_attributes_set_stats_use_log2(h_, value)); }
  SdpaAttributes& set_logit_max(const TensorDesc& value) { return ok(fs_sdpa_attributes_set_logit_max(h_, value.get())); }
  SdpaAttributes& set_score_sum_exp(const TensorDesc& value) {
    return ok(fs_sdpa_attributes_set_score_sum_exp(h_, value.get()));
  }
  // Per-head max logit (QK-clip), fp32 [H_q].
  SdpaAttributes& set_max_logit(const TensorDesc& value) { return ok(fs_sdpa_attributes_set_max_logit(h_, value.get())); }
  SdpaAttributes& set_paged_attention_k_table(const TensorDesc& value) {
    return ok(fs_sdpa_attributes_set_paged_attention_k_table(h_, value.get()));
  }
  SdpaAttributes& set_paged_attention_v_table(const TensorDesc& value) {
    return ok(fs_sdpa_attributes_set_paged_attention_v_table(h_, value.get()));
  }
  SdpaAttributes& set_paged_attention_max_seq_len_kv(int64_t value) {
    return ok(fs_sdpa_attributes_set_paged_attention_max_seq_len_kv(h_, value));
  }
  SdpaAttributes& set_dropout_mask(const TensorDesc& mask, const TensorDesc& scale) {
    return ok(fs_sdpa_attributes_set_dropout_mask(h_, mask.get(), scale.get(), nullptr));
  }
  using SdpaAttributesBase::set_dropout;
  // The seed's set_dropout(mask, scale).
  SdpaAttributes& set_dropout(const TensorDesc& mask, const TensorDesc& scale) { return set_dropout_mask(mask, scale); }
  // FP8: the output's scale factor and the amax outputs (fp32, 1 element).
  SdpaAttributes& set_scale_o(const TensorDesc& value) { return ok(fs_sdpa_attributes_set_scale_o(h_, value.get())); }
  SdpaAttributes& set_amax_s(const TensorDesc& value) { return ok(fs_sdpa_attributes_set_amax_s(h_, value.get())); }
  SdpaAttributes& set_amax_o(const TensorDesc& value) { return ok(fs_sdpa_attributes_set_amax_o(h_, value.get())); }
};

// Options of an SDPA backward operation (the seed's SDPA_backward_attributes).
class SdpaBackwardAttributes : public detail::SdpaAttributesBase<SdpaBackwardAttributes> {
 public:
  SdpaBackwardAttributes() : SdpaAttributesBase(true) {}
  SdpaBackwardAttributes& set_dbias(const TensorDesc& value) { return ok(fs_sdpa_attributes_set_dbias(h_, value.get())); }
  SdpaBackwardAttributes& set_dsink_token(const TensorDesc& value) {
    return ok(fs_sdpa_attributes_set_dsink_token(h_, value.get()));
  }
  SdpaBackwardAttributes& set_dgate(const TensorDesc& value) { return ok(fs_sdpa_attributes_set_dgate(h_, value.get())); }
  SdpaBackwardAttributes& set_deterministic_algorithm(bool value) {
    return ok(fs_sdpa_attributes_set_deterministic_algorithm(h_, value));
  }
  using SdpaAttributesBase::set_dropout;
  // The seed's set_dropout(mask, scale, scale_inv).
  SdpaBackwardAttributes& set_dropout(const TensorDesc& mask, const TensorDesc& scale, const TensorDesc& scale_inv) {
    return ok(fs_sdpa_attributes_set_dropout_mask(h_, mask.get(), scale.get(), scale_inv.get()));
  }
  // FP8: the backward's scale factors and amax outputs (fp32, 1 element).
  SdpaBackwardAttributes& set_descale_o(const TensorDesc& v) { return ok(fs_sdpa_attributes_set_descale_o(h_, v.get())); }
  SdpaBackwardAttributes& set_descale_dO(const TensorDesc& v) { return ok(fs_sdpa_attributes_set_descale_do(h_, v.get())); }
  SdpaBackwardAttributes& set_descale_dP(const TensorDesc& v) { return ok(fs_sdpa_attributes_set_descale_dp(h_, v.get())); }
  SdpaBackwardAttributes& set_scale_dQ(const TensorDesc& v) { return ok(fs_sdpa_attributes_set_scale_dq(h_, v.get())); }
  SdpaBackwardAttributes& set_scale_dK(const TensorDesc& v) { return ok(fs_sdpa_attributes_set_scale_dk(h_, v.get())); }
  SdpaBackwardAttributes& set_scale_dV(const TensorDesc& v) { return ok(fs_sdpa_attributes_set_scale_dv(h_, v.get())); }
  SdpaBackwardAttributes& set_scale_dP(const TensorDesc& v) { return ok(fs_sdpa_attributes_set_scale_dp(h_, v.get())); }
  SdpaBackwardAttributes& set_amax_dQ(const TensorDesc& v) { return ok(fs_sdpa_attributes_set_amax_dq(h_, v.get())); }
  SdpaBackwardAttributes& set_amax_dK(const TensorDesc& v) { return ok(fs_sdpa_attributes_set_amax_dk(h_, v.get())); }
  SdpaBackwardAttributes& set_amax_dV(const TensorDesc& v) { return ok(fs_sdpa_attributes_set_amax_dv(h_, v.get())); }
  SdpaBackwardAttributes& set_amax_dP(const TensorDesc& v) { return ok(fs_sdpa_attributes_set_amax_dp(h_, v.get())); }
};

using SDPA_attributes = SdpaAttributes;
using SDPA_backward_attributes = SdpaBackwardAttributes;
// FP8 calls use the same attribute objects and operations (FP8 by q's dtype), with the scale setters above.
using SDPA_fp8_attributes = SdpaAttributes;
using SDPA_fp8_backward_attributes = SdpaBackwardAttributes;

// Data pointers of one execute() call, indexed by fs_sdpa_slot_t.
class SdpaVariantPack {
 public:
  SdpaVariantPack& set(fs_sdpa_slot_t slot, void* data) {
    if (slot < 0 || slot >= FS_SDPA_NUM_SLOTS) throw Exception(FS_STATUS_INVALID_ARGUMENT, "slot: out of range");
    p_[slot] = data;
    return *this;
  }
  void* const* data() const { return p_; }

 private:
  void* p_[FS_SDPA_NUM_SLOTS] = {};
};

// SDPA forward: construct from descriptors and attributes (validates every rule),
// check_support(), compile(), then execute() with pointers of tensors of those layouts.
class SdpaFwd {
 public:
  SdpaFwd(const TensorDesc& q, const TensorDesc& k, const TensorDesc& v, const TensorDesc& o, const TensorDesc* stats,
          const SdpaAttributes& attr) {
    check(fs_sdpa_fwd_create(q.get(), k.get(), v.get(), o.get(), stats ? stats->get() : nullptr, attr.handle(), &h_));
  }
  SdpaFwd(const SdpaFwd&) = delete;
  SdpaFwd& operator=(const SdpaFwd&) = delete;
  ~SdpaFwd() {
    if (h_) fs_sdpa_fwd_destroy(h_);
  }
  void check_support() { check(fs_sdpa_fwd_check_support(h_)); }
  void compile() { check(fs_sdpa_fwd_compile(h_)); }
  size_t workspace_size() const {
    size_t n = 0;
    check(fs_sdpa_fwd_workspace_size(h_, &n));
    return n;
  }
  void execute(const SdpaVariantPack& pack, void* workspace, size_t workspace_bytes, void* stream = nullptr) {
    check(fs_sdpa_fwd_execute(h_, pack.data(), FS_SDPA_NUM_SLOTS, workspace, workspace_bytes, stream));
  }

 private:
  fs_sdpa_fwd_t h_ = nullptr;
};

// SDPA backward (stats: the forward's natural-log LSE).
class SdpaBwd {
 public:
  SdpaBwd(const TensorDesc& q, const TensorDesc& k, const TensorDesc& v, const TensorDesc& o, const TensorDesc& dO,
          const TensorDesc& stats, const TensorDesc& dQ, const TensorDesc& dK, const TensorDesc& dV,
          const SdpaBackwardAttributes& attr) {
    check(fs_sdpa_bwd_create(q.get(), k.get(), v.get(), o.get(), dO.get(), stats.get(), dQ.get(), dK.get(), dV.get(),
                             attr.handle(), &h_));
  }
  SdpaBwd(const SdpaBwd&) = delete;
  SdpaBwd& operator=(const SdpaBwd&) = delete;
  ~SdpaBwd() {
    if (h_) fs_sdpa_bwd_destroy(h_);
  }
  void check_support() { check(fs_sdpa_bwd_check_support(h_)); }
  void compile() { check(fs_sdpa_bwd_compile(h_)); }
  size_t workspace_size() const {
    size_t n = 0;
    check(fs_sdpa_bwd_workspace_size(h_, &n));
    return n;
  }
  void execute(const SdpaVariantPack& pack, void* workspace, size_t workspace_bytes, void* stream = nullptr) {
    check(fs_sdpa_bwd_execute(h_, pack.data(), FS_SDPA_NUM_SLOTS, workspace, workspace_bytes, stream));
  }

 private:
  fs_sdpa_bwd_t h_ = nullptr;
};

}  // namespace flashspan::api
