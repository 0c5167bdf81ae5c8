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

}  // namespace flashspan::api
