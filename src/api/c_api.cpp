// C ABI glue: turns fs_* calls into validated C++ calls, exceptions into status codes
// and a per-thread last-error message. Dispatches CPU tensors to the reference backend
// and CUDA tensors to the planner/kernels.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <string>

#include "api/guard.h"
#include "core/validation.h"
#include "core/error.h"
#include "core/tensor_view.h"
#include "flashspan/flashspan.h"
#include "dispatch/family.h"
#include "dispatch/flex_launch.h"
#include "plan/mask_plan.h"
#include "plan/planner.h"
#include "reference/reference.h"

#ifdef FLASHSPAN_WITH_CUDA
#include <cuda_runtime.h>
#endif

#ifndef FLASHSPAN_VERSION_STRING
#define FLASHSPAN_VERSION_STRING "0.0.0"
#endif
#ifndef FLASHSPAN_CUDA_ARCHS_STRING
#define FLASHSPAN_CUDA_ARCHS_STRING ""
#endif

using namespace flashspan;

struct fs_mask_plan {
  std::unique_ptr<MaskPlan> plan;
};

namespace {

using api::guarded;

#ifdef FLASHSPAN_WITH_CUDA
void cuda_check(cudaError_t err, const char* what) {
  FS_CHECK(err == cudaSuccess, Status::kCudaError, what, ": ", cudaGetErrorString(err));
}

// A CUDA tensor needs a usable device: say so plainly rather than with a driver error.
void check_cuda_device(int device_id) {
  int n = 0;
  const cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess) cudaGetLastError();  // clear the sticky error
  FS_CHECK(err == cudaSuccess && n > 0, Status::kCudaError, "q: is a CUDA tensor but no CUDA device is usable (",
           cudaGetErrorString(err), ")");
  FS_CHECK_TYPE(device_id >= 0 && device_id < n, "q: CUDA device ", device_id, " does not exist (", n,
                " device(s) visible)");
}
#endif

constexpr const char* kNoBackwardMessage =
    "plan: was built without backward metadata; the backward pass needs a plan built with build_backward "
    "(Python: create_mask_plan(..., build_backward=True); C++: PlanArgs::with_backward(true); C: "
    "fs_mask_plan_args_t.build_backward = 1)";

MaskPlan& plan_ref(fs_mask_plan_t p, const char* name = "plan") {
  FS_CHECK_ARG(p != nullptr && p->plan != nullptr, name, ": is NULL");
  return *p->plan;
}

// Descriptor of a tensor captured at construction, compared on every execute().
struct TensorDesc {
  bool present = false;
  TensorView view;  // data pointer ignored

  static TensorDesc capture(const TensorView& v) {
    TensorDesc d;
    d.present = v.defined();
    d.view = v;
    d.view.data = nullptr;
    return d;
  }
  void check_matches(const TensorView& v, const char* name) const {
    FS_CHECK_ARG(v.defined() == present, name, present ? ": is required (it was given at construction)"
                                                       : ": was not given at construction, so it must be NULL");
    if (!present) return;
    FS_CHECK_TYPE(v.dtype == view.dtype, name, ": dtype ", dtype_name(v.dtype), " differs from the compiled ",
                  dtype_name(view.dtype));
    FS_CHECK_TYPE(v.device == view.device && v.device_id == view.device_id, name,
                  ": device differs from the compiled descriptor");
    bool same = v.ndim == view.ndim;
    for (int i = 0; same && i < v.ndim; ++i) same = v.shape[i] == view.shape[i] && v.strides[i] == view.strides[i];
    FS_CHECK_ARG(same, name, ": shape ", v.shape_str(), " or strides differ from the compiled descriptor (shape ",
                 view.shape_str(), ")");
  }
};

void check_plan_compatible(const MaskPlan& compiled, const MaskPlan& given, bool need_backward) {
  const std::string diff = given.geometry.first_difference(compiled.geometry);
  FS_CHECK_ARG(diff.empty(), "plan: geometry (", diff,
               ", given vs compiled) differs from the plan the operation was compiled with");
  FS_CHECK_ARG(given.signature.consumer == compiled.signature.consumer,
               "plan: built for another kernel family or tile (", given.signature.to_string(given.geometry),
               ") than the compiled operation (", compiled.signature.to_string(compiled.geometry), ")");
  FS_CHECK_ARG(given.signature.pack_gqa == compiled.signature.pack_gqa, "plan: pack_gqa differs from the compiled plan");
  FS_CHECK_ARG(!need_backward || given.signature.has_backward, kNoBackwardMessage);
}

// Where a call tensor's required dtype comes from (check_same_tensor_shape's dtype_why).
constexpr const char* kPlanDtype = "the dtype the mask plan was built for";
constexpr const char* kStatsDtype = "lse, dlse and max_logit are float32, float64 for float64 inputs";

// Checks that q/k/v/out/lse of a call have the plan's geometry.

void check_call_tensors(const FlexGeometry& g, const TensorView& q, const TensorView& k, const TensorView& v,
                        const TensorView* out, const TensorView* lse, const char* out_name) {
  int64_t s[4];
  int n = 0;
  expected_q_shape(g, s, &n);
  check_same_tensor_shape(q, "q", s, n, g.dtype, g.device, g.device_id, kPlanDtype);
  expected_k_shape(g, s, &n);
  check_same_tensor_shape(k, "k", s, n, g.dtype, g.device, g.device_id, kPlanDtype);
  expected_v_shape(g, s, &n);
  check_same_tensor_shape(v, "v", s, n, g.dtype, g.device, g.device_id, kPlanDtype);
  if (out) {
    expected_out_shape(g, s, &n);
    check_same_tensor_shape(*out, out_name, s, n, g.dtype, g.device, g.device_id, kPlanDtype);
  }
  if (lse && lse->defined()) {
    expected_lse_shape(g, s, &n);
    check_same_tensor_shape(*lse, "lse", s, n, flex_stats_dtype(g.dtype), g.device, g.device_id, kStatsDtype);
  }
}

void check_max_logit(const FlexGeometry& g, const TensorView& m) {
  if (!m.defined()) return;
  const int64_t s[1] = {g.num_heads_q};
  check_same_tensor_shape(m, "max_logit", s, 1, flex_stats_dtype(g.dtype), g.device, g.device_id, kStatsDtype);
}

float resolve_scale(const FlexGeometry& g, float scale, int32_t has_scale, bool want_max_logit) {
  const float s = has_scale ? scale : default_softmax_scale(g.head_dim_qk);
  check_softmax_scale(s, want_max_logit);
  return s;
}

// Scale of one execute(): the call's own when it sets has_softmax_scale, else the one resolved at create().
float execute_scale(float compiled, float scale, int32_t has_scale, bool want_max_logit) {
  if (!has_scale) return compiled;
  check_softmax_scale(scale, want_max_logit);
  return scale;
}

}  // namespace

// ---------------------------------------------------------------------------
// Library information
// ---------------------------------------------------------------------------

extern "C" {

FS_API const char* fs_get_last_error(void) { return api::last_error().c_str(); }
FS_API int32_t fs_abi_version(void) { return FLASHSPAN_ABI_VERSION; }
FS_API const char* fs_version(void) { return FLASHSPAN_VERSION_STRING; }
FS_API const char* fs_built_cuda_archs(void) { return FLASHSPAN_CUDA_ARCHS_STRING; }

FS_API int32_t fs_cuda_available(void) {
#ifdef FLASHSPAN_WITH_CUDA
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no device" error
    return 0;
  }
  return n > 0 ? 1 : 0;
#else
  return 0;
#endif
}

// ---------------------------------------------------------------------------
// Mask plan
// ---------------------------------------------------------------------------

FS_API fs_status_t fs_create_mask_plan(const fs_mask_plan_args_t* args, fs_mask_plan_t* out) {
  return guarded([&] {
    FS_CHECK_ARG(args != nullptr, "args: is NULL");
    FS_CHECK_ARG(out != nullptr, "plan: output pointer is NULL");
    *out = nullptr;
    PlanInputs in;
    in.mask_func = tensor_view_from_fs(args->mask_func, "mask_func");
    in.q = tensor_view_from_fs(args->q, "q");
    in.k = tensor_view_from_fs(args->k, "k");
    in.v = tensor_view_from_fs(args->v, "v");
    in.cu_seqlens_q = tensor_view_from_fs(args->cu_seqlens_q, "cu_seqlens_q");
    in.cu_seqlens_k = tensor_view_from_fs(args->cu_seqlens_k, "cu_seqlens_k");
    in.max_seqlen_q = args->max_seqlen_q;
    in.max_seqlen_k = args->max_seqlen_k;
    FS_CHECK_ARG(args->pack_gqa >= -1 && args->pack_gqa <= 1, "pack_gqa: must be -1 (choose), 0 or 1");
    FS_CHECK_ARG(args->build_backward == 0 || args->build_backward == 1, "build_backward: must be 0 or 1");

    const bool on_cuda = in.q.defined() && in.q.is_cuda();
#ifdef FLASHSPAN_WITH_CUDA
    if (on_cuda) check_cuda_device(in.q.device_id);
#endif
    std::vector<int32_t> cu_q_host, cu_k_host;
    if (on_cuda && in.cu_seqlens_q.defined() && in.cu_seqlens_k.defined()) {
#ifdef FLASHSPAN_WITH_CUDA
      copy_cu_seqlens_to_host(in.cu_seqlens_q, in.cu_seqlens_k, args->stream, &cu_q_host, &cu_k_host);  // plan/planner.h
#else
      FS_CHECK_SUPPORTED(false, "q: is a CUDA tensor but this build of flashspan has no CUDA support");
#endif
    }
    FlexGeometry g;
    try {
      g = validate_plan_inputs(in, cu_q_host.empty() ? nullptr : cu_q_host.data(),
                               cu_k_host.empty() ? nullptr : cu_k_host.data());
      // Head dims no kernel of the plan's device runs are a broken rule at plan creation (the
      // seed raises ValueError here), not a plan that fails later at check_support.
      if (on_cuda) check_head_dims_gpu(g.head_dim_qk, g.head_dim_v);
    } catch (const Error& e) {
      // The only NOT_SUPPORTED rules of plan validation are the head-dim rules.
      if (e.status() == Status::kNotSupported) throw Error(Status::kInvalidArgument, e.what());
      throw;
    }
    PlanRequest req;
    req.geometry = &g;
    const PlanChoice choice = choose_plan(args->arch, args->pack_gqa, g);  // dispatch/family.h
    req.consumer = choice.consumer;
    req.pack_gqa = choice.pack_gqa;
    req.build_backward = args->build_backward == 1;

    auto handle = std::make_unique<fs_mask_plan>();
    if (on_cuda) {
#ifdef FLASHSPAN_WITH_CUDA
      cuda_check(cudaSetDevice(g.device_id), "q: cudaSetDevice");
      handle->plan = build_mask_plan_cuda(req, in.mask_func.ptr<int32_t>(), args->stream);
#else
      FS_CHECK_SUPPORTED(false, "q: is a CUDA tensor but this build of flashspan has no CUDA support");
#endif
    } else {
      handle->plan = build_mask_plan_host(req, in.mask_func.ptr<int32_t>(), /*keep_mask=*/true);
    }
    *out = handle.release();
  });
}

FS_API fs_status_t fs_mask_plan_destroy(fs_mask_plan_t plan) {
  return guarded([&] { delete plan; });
}

FS_API fs_status_t fs_mask_plan_get_info(fs_mask_plan_t p, fs_mask_plan_info_t* info) {
  return guarded([&] {
    const MaskPlan& plan = plan_ref(p);
    FS_CHECK_ARG(info != nullptr, "info: is NULL");
    std::memset(info, 0, sizeof(*info));
    const FlexGeometry& g = plan.geometry;
    info->varlen = g.varlen;
    info->batch = g.batch;
    info->max_seqlen_q = g.max_seqlen_q;
    info->max_seqlen_k = g.max_seqlen_k;
    info->total_q = g.total_q;
    info->total_k = g.total_k;
    info->num_heads_q = g.num_heads_q;
    info->num_heads_kv = g.num_heads_kv;
    info->num_heads_mask = g.num_heads_mask;
    info->nfunc = g.nfunc;
    info->head_dim_qk = g.head_dim_qk;
    info->head_dim_v = g.head_dim_v;
    info->dtype = dtype_to_fs(g.dtype);
    info->device = {static_cast<int32_t>(g.device), g.device_id};
    const PlanSignature& s = plan.signature;
    info->pack_gqa = s.pack_gqa;
    info->has_backward = s.has_backward;
    info->arch = s.consumer.arch;
    info->fwd_block_q = s.consumer.fwd_block_q;
    info->fwd_block_k = s.consumer.fwd_block_k;
    info->bwd_block_q = s.consumer.bwd_block_q;
    info->bwd_block_k = s.consumer.bwd_block_k;
    const PlanCounts& c = plan.counts;
    info->fwd_num_q_blocks = c.fwd_num_q_blocks;
    info->fwd_num_k_blocks = c.fwd_num_k_blocks;
    info->fwd_partial_blocks = c.fwd_partial;
    info->fwd_full_blocks = c.fwd_full;
    info->bwd_partial_blocks = c.bwd_partial;
    info->bwd_full_blocks = c.bwd_full;
    info->visible_pairs = c.visible_pairs;
    info->num_tasks = c.num_tasks;
    info->bytes = plan.bytes();
    const std::string sig = s.to_string(g);
    std::strncpy(info->signature, sig.c_str(), sizeof(info->signature) - 1);
  });
}

FS_API fs_status_t fs_mask_plan_num_arrays(fs_mask_plan_t p, int32_t* count) {
  return guarded([&] {
    FS_CHECK_ARG(count != nullptr, "count: is NULL");
    *count = static_cast<int32_t>(plan_ref(p).arrays.size());
  });
}

FS_API fs_status_t fs_mask_plan_array_name(fs_mask_plan_t p, int32_t index, const char** name) {
  return guarded([&] {
    const MaskPlan& plan = plan_ref(p);
    FS_CHECK_ARG(name != nullptr, "name: is NULL");
    FS_CHECK_ARG(index >= 0 && index < static_cast<int32_t>(plan.arrays.size()), "index: ", index,
                 " is out of range [0, ", plan.arrays.size(), ")");
    *name = plan.arrays[index].name.c_str();
  });
}

FS_API fs_status_t fs_mask_plan_copy_array(fs_mask_plan_t p, const char* name, int32_t* dst, int64_t capacity,
                                           int64_t* num_elements) {
  return guarded([&] {
    const MaskPlan& plan = plan_ref(p);
    FS_CHECK_ARG(name != nullptr, "name: is NULL");
    int64_t count = 0;
    const int32_t* src = plan.array(name, &count);
    FS_CHECK_ARG(src != nullptr || count == 0, "name: the plan has no array named '", name, "'");
    bool found = false;
    for (const auto& a : plan.arrays) found |= a.name == name;
    FS_CHECK_ARG(found, "name: the plan has no array named '", name, "'");
    if (num_elements) *num_elements = count;
    if (dst == nullptr || count == 0) return;
    FS_CHECK_ARG(capacity >= count, "capacity: ", capacity, " is smaller than the array's ", count, " elements");
    if (plan.on_device()) {
#ifdef FLASHSPAN_WITH_CUDA
      cuda_check(cudaMemcpy(dst, src, count * sizeof(int32_t), cudaMemcpyDeviceToHost), "plan array: copy to host");
#endif
    } else {
      std::memcpy(dst, src, count * sizeof(int32_t));
    }
  });
}

}  // extern "C"

// ---------------------------------------------------------------------------
// Forward
// ---------------------------------------------------------------------------

// ---------------------------------------------------------------------------
// Forward and backward operations
// ---------------------------------------------------------------------------

namespace {

// What forward and backward operations share: the compiled geometry and plan signature
// (held as a MaskPlan without arrays, which is all that support checks, workspace sizes
// and plan compatibility read), the resolved scale, and the lifecycle state.
struct OpState {
  MaskPlan shape;  // geometry + signature only
  float scale = 0.0f;
  bool supported = false;
  bool compiled = false;

  const FlexGeometry& geometry() const { return shape.geometry; }
  bool on_cpu() const { return shape.geometry.device == DeviceType::kCPU; }
  void capture_plan(const MaskPlan& plan) {
    shape.geometry = plan.geometry;
    shape.signature = plan.signature;
  }
};

#ifndef FLASHSPAN_WITH_CUDA
[[noreturn]] void throw_no_cuda() {
  throw Error(Status::kNotSupported, "q: is a CUDA tensor but this build of flashspan has no CUDA support");
}
#endif

void op_check_support(OpState* op, bool backward) {
  FS_CHECK_ARG(op != nullptr, "op: is NULL");
  if (op->on_cpu()) {
    check_head_dims_reference(op->geometry().head_dim_qk, op->geometry().head_dim_v);
  } else {
#ifdef FLASHSPAN_WITH_CUDA
    flex_check_support_gpu(op->geometry(), op->shape, backward);
#else
    (void)backward;
    throw_no_cuda();
#endif
  }
  op->supported = true;
}

void op_compile(OpState* op) {
  FS_CHECK_ARG(op != nullptr, "op: is NULL");
  FS_CHECK_ARG(op->supported, "op: check_support() must succeed before compile()");
  op->compiled = true;
}

// Common start of execute(): lifecycle state and plan compatibility; returns the plan.
const MaskPlan& op_begin_execute(const OpState* op, fs_mask_plan_t handle, bool backward) {
  FS_CHECK_ARG(op != nullptr, "op: is NULL");
  FS_CHECK_ARG(op->compiled, "op: compile() must be called before execute()");
  const MaskPlan& plan = plan_ref(handle);
  check_plan_compatible(op->shape, plan, backward);
  if (op->on_cpu())
    FS_CHECK_ARG(plan.array("mask_func") != nullptr, "plan: a CPU plan without its endpoints cannot be executed");
  return plan;
}

#ifdef FLASHSPAN_WITH_CUDA
void check_workspace(size_t need, void* workspace, size_t workspace_bytes) {
  FS_CHECK_ARG(workspace_bytes >= need, "workspace: ", workspace_bytes, " bytes given, ", need, " needed");
  FS_CHECK_ARG(need == 0 || workspace != nullptr, "workspace: is NULL but ", need, " bytes are needed");
}
#endif

struct FwdViews {
  TensorView q, k, v, out, lse, max_logit;
};

struct BwdViews {
  TensorView q, k, v, out, dout, lse, dq, dk, dv, dlse;
};

FwdViews fwd_views(const fs_flex_fwd_args_t* a) {
  FS_CHECK_ARG(a != nullptr, "args: is NULL");
  return {tensor_view_from_fs(a->q, "q"),     tensor_view_from_fs(a->k, "k"),
          tensor_view_from_fs(a->v, "v"),     tensor_view_from_fs(a->out, "out"),
          tensor_view_from_fs(a->lse, "lse"), tensor_view_from_fs(a->max_logit, "max_logit")};
}

BwdViews bwd_views(const fs_flex_bwd_args_t* a) {
  FS_CHECK_ARG(a != nullptr, "args: is NULL");
  return {tensor_view_from_fs(a->q, "q"),   tensor_view_from_fs(a->k, "k"),
          tensor_view_from_fs(a->v, "v"),   tensor_view_from_fs(a->out, "out"),
          tensor_view_from_fs(a->dout, "dout"), tensor_view_from_fs(a->lse, "lse"),
          tensor_view_from_fs(a->dq, "dq"), tensor_view_from_fs(a->dk, "dk"),
          tensor_view_from_fs(a->dv, "dv"), tensor_view_from_fs(a->dlse, "dlse")};
}

void check_bwd_tensors(const FlexGeometry& g, const BwdViews& t) {
  check_call_tensors(g, t.q, t.k, t.v, &t.out, nullptr, "out");
  int64_t s[4];
  int n = 0;
  expected_out_shape(g, s, &n);
  check_same_tensor_shape(t.dout, "dout", s, n, g.dtype, g.device, g.device_id, kPlanDtype);
  FS_CHECK_ARG(t.lse.defined(), "lse: is required for the backward pass (the forward's LSE)");
  expected_lse_shape(g, s, &n);
  const DType stats = flex_stats_dtype(g.dtype);
  check_same_tensor_shape(t.lse, "lse", s, n, stats, g.device, g.device_id, kStatsDtype);
  if (t.dlse.defined()) check_same_tensor_shape(t.dlse, "dlse", s, n, stats, g.device, g.device_id, kStatsDtype);
  expected_q_shape(g, s, &n);
  check_same_tensor_shape(t.dq, "dq", s, n, g.dtype, g.device, g.device_id, kPlanDtype);
  expected_k_shape(g, s, &n);
  check_same_tensor_shape(t.dk, "dk", s, n, g.dtype, g.device, g.device_id, kPlanDtype);
  expected_v_shape(g, s, &n);
  check_same_tensor_shape(t.dv, "dv", s, n, g.dtype, g.device, g.device_id, kPlanDtype);
}

}  // namespace

struct fs_flex_fwd : OpState {
  TensorDesc q, k, v, out, lse, max_logit;
};

struct fs_flex_bwd : OpState {
  TensorDesc q, k, v, out, dout, lse, dq, dk, dv, dlse;
  bool deterministic = false;
};

extern "C" {

FS_API fs_status_t fs_flex_fwd_create(const fs_flex_fwd_args_t* a, fs_flex_fwd_t* op) {
  return guarded([&] {
    FS_CHECK_ARG(op != nullptr, "op: output pointer is NULL");
    *op = nullptr;
    const FwdViews t = fwd_views(a);
    const MaskPlan& plan = plan_ref(a->plan);
    const FlexGeometry& g = plan.geometry;
    check_call_tensors(g, t.q, t.k, t.v, &t.out, &t.lse, "out");
    check_max_logit(g, t.max_logit);
    check_no_self_overlap(t.out, "out");
    check_no_self_overlap(t.lse, "lse");
    check_no_self_overlap(t.max_logit, "max_logit");
    auto h = std::make_unique<fs_flex_fwd>();
    h->capture_plan(plan);
    h->q = TensorDesc::capture(t.q);
    h->k = TensorDesc::capture(t.k);
    h->v = TensorDesc::capture(t.v);
    h->out = TensorDesc::capture(t.out);
    h->lse = TensorDesc::capture(t.lse);
    h->max_logit = TensorDesc::capture(t.max_logit);
    h->scale = resolve_scale(g, a->softmax_scale, a->has_softmax_scale, t.max_logit.defined());
    *op = h.release();
  });
}

FS_API fs_status_t fs_flex_fwd_destroy(fs_flex_fwd_t op) {
  return guarded([&] { delete op; });
}

FS_API fs_status_t fs_flex_fwd_check_support(fs_flex_fwd_t op) {
  return guarded([&] { op_check_support(op, /*backward=*/false); });
}

FS_API fs_status_t fs_flex_fwd_compile(fs_flex_fwd_t op) {
  return guarded([&] { op_compile(op); });
}

FS_API fs_status_t fs_flex_fwd_workspace_size(fs_flex_fwd_t op, size_t* bytes) {
  return guarded([&] {
    FS_CHECK_ARG(op != nullptr, "op: is NULL");
    FS_CHECK_ARG(bytes != nullptr, "bytes: is NULL");
    *bytes = 0;
#ifdef FLASHSPAN_WITH_CUDA
    if (!op->on_cpu()) *bytes = flex_fwd_workspace_size(op->geometry(), op->shape, op->max_logit.present);
#endif
  });
}

FS_API fs_status_t fs_flex_fwd_execute(fs_flex_fwd_t op, const fs_flex_fwd_args_t* a, void* workspace,
                                       size_t workspace_bytes, void* stream) {
  return guarded([&] {
    const FwdViews t = fwd_views(a);
    const MaskPlan& plan = op_begin_execute(op, a->plan, /*backward=*/false);
    op->q.check_matches(t.q, "q");
    op->k.check_matches(t.k, "k");
    op->v.check_matches(t.v, "v");
    op->out.check_matches(t.out, "out");
    op->lse.check_matches(t.lse, "lse");
    op->max_logit.check_matches(t.max_logit, "max_logit");
    const float scale = execute_scale(op->scale, a->softmax_scale, a->has_softmax_scale, t.max_logit.defined());
    if (op->on_cpu()) {
      reference::FlexForwardArgs r;
      r.geometry = &plan.geometry;
      r.mask = plan.array("mask_func");
      r.q = t.q;
      r.k = t.k;
      r.v = t.v;
      r.out = t.out;
      r.lse = t.lse;
      r.max_logit = t.max_logit;
      r.softmax_scale = scale;
      reference::flex_forward(r);
      return;
    }
#ifdef FLASHSPAN_WITH_CUDA
    check_workspace(flex_fwd_workspace_size(plan.geometry, plan, t.max_logit.defined()), workspace, workspace_bytes);
    FlexFwdLaunch l;
    l.geometry = &plan.geometry;
    l.plan = &plan;
    l.q = t.q;
    l.k = t.k;
    l.v = t.v;
    l.out = t.out;
    l.lse = t.lse;
    l.max_logit = t.max_logit;
    l.softmax_scale = scale;
    l.workspace = workspace;
    l.workspace_bytes = workspace_bytes;
    l.stream = stream;
    launch_flex_fwd(l);
#else
    (void)workspace;
    (void)workspace_bytes;
    (void)stream;
    throw_no_cuda();
#endif
  });
}

FS_API fs_status_t fs_flex_bwd_create(const fs_flex_bwd_args_t* a, fs_flex_bwd_t* op) {
  return guarded([&] {
    FS_CHECK_ARG(op != nullptr, "op: output pointer is NULL");
    *op = nullptr;
    const BwdViews t = bwd_views(a);
    const MaskPlan& plan = plan_ref(a->plan);
    FS_CHECK_ARG(plan.signature.has_backward, kNoBackwardMessage);
    check_bwd_tensors(plan.geometry, t);
    check_no_self_overlap(t.dq, "dq");
    check_no_self_overlap(t.dk, "dk");
    check_no_self_overlap(t.dv, "dv");
    auto h = std::make_unique<fs_flex_bwd>();
    h->capture_plan(plan);
    h->q = TensorDesc::capture(t.q);
    h->k = TensorDesc::capture(t.k);
    h->v = TensorDesc::capture(t.v);
    h->out = TensorDesc::capture(t.out);
    h->dout = TensorDesc::capture(t.dout);
    h->lse = TensorDesc::capture(t.lse);
    h->dq = TensorDesc::capture(t.dq);
    h->dk = TensorDesc::capture(t.dk);
    h->dv = TensorDesc::capture(t.dv);
    h->dlse = TensorDesc::capture(t.dlse);
    h->scale = resolve_scale(plan.geometry, a->softmax_scale, a->has_softmax_scale, false);
    h->deterministic = a->deterministic != 0;
    *op = h.release();
  });
}

FS_API fs_status_t fs_flex_bwd_destroy(fs_flex_bwd_t op) {
  return guarded([&] { delete op; });
}

FS_API fs_status_t fs_flex_bwd_check_support(fs_flex_bwd_t op) {
  return guarded([&] { op_check_support(op, /*backward=*/true); });
}

FS_API fs_status_t fs_flex_bwd_compile(fs_flex_bwd_t op) {
  return guarded([&] { op_compile(op); });
}

FS_API fs_status_t fs_flex_bwd_workspace_size(fs_flex_bwd_t op, size_t* bytes) {
  return guarded([&] {
    FS_CHECK_ARG(op != nullptr, "op: is NULL");
    FS_CHECK_ARG(bytes != nullptr, "bytes: is NULL");
    *bytes = 0;
#ifdef FLASHSPAN_WITH_CUDA
    if (!op->on_cpu()) *bytes = flex_bwd_workspace_size(op->geometry(), op->shape, op->deterministic);
#endif
  });
}

FS_API fs_status_t fs_flex_bwd_execute(fs_flex_bwd_t op, const fs_flex_bwd_args_t* a, void* workspace,
                                       size_t workspace_bytes, void* stream) {
  return guarded([&] {
    const BwdViews t = bwd_views(a);
    const MaskPlan& plan = op_begin_execute(op, a->plan, /*backward=*/true);
    op->q.check_matches(t.q, "q");
    op->k.check_matches(t.k, "k");
    op->v.check_matches(t.v, "v");
    op->out.check_matches(t.out, "out");
    op->dout.check_matches(t.dout, "dout");
    op->lse.check_matches(t.lse, "lse");
    op->dq.check_matches(t.dq, "dq");
    op->dk.check_matches(t.dk, "dk");
    op->dv.check_matches(t.dv, "dv");
    op->dlse.check_matches(t.dlse, "dlse");
    const float scale = execute_scale(op->scale, a->softmax_scale, a->has_softmax_scale, false);
    if (op->on_cpu()) {
      reference::FlexBackwardArgs r;
      r.geometry = &plan.geometry;
      r.mask = plan.array("mask_func");
      r.q = t.q;
      r.k = t.k;
      r.v = t.v;
      r.out = t.out;
      r.dout = t.dout;
      r.lse = t.lse;
      r.dlse = t.dlse;
      r.dq = t.dq;
      r.dk = t.dk;
      r.dv = t.dv;
      r.softmax_scale = scale;
      reference::flex_backward(r);
      return;
    }
#ifdef FLASHSPAN_WITH_CUDA
    check_workspace(flex_bwd_workspace_size(plan.geometry, plan, op->deterministic), workspace, workspace_bytes);
    FlexBwdLaunch l;
    l.geometry = &plan.geometry;
    l.plan = &plan;
    l.q = t.q;
    l.k = t.k;
    l.v = t.v;
    l.out = t.out;
    l.dout = t.dout;
    l.lse = t.lse;
    l.dlse = t.dlse;
    l.dq = t.dq;
    l.dk = t.dk;
    l.dv = t.dv;
    l.softmax_scale = scale;
    l.deterministic = op->deterministic;
    l.workspace = workspace;
    l.workspace_bytes = workspace_bytes;
    l.stream = stream;
    launch_flex_bwd(l);
#else
    (void)workspace;
    (void)workspace_bytes;
    (void)stream;
    throw_no_cuda();
#endif
  });
}

}  // extern "C"
