// C ABI glue of SDPA (flashspan.h, "SDPA" section): the attribute object's setters, and the
// forward / backward operations (create -> check_support -> compile -> workspace_size ->
// execute). Validation lives in core/sdpa_problem; CPU tensors run reference/sdpa_reference,
// CUDA tensors the GPU kernels through dispatch/sdpa_launch.h (the pure-mask configurations;
// other features are refused by check_support with an error naming them).
#include <memory>
#include <string>

#include "api/guard.h"
#include "core/error.h"
#include "core/sdpa_problem.h"
#include "core/tensor_view.h"
#include "dispatch/sdpa_launch.h"
#include "flashspan/flashspan.h"
#include "reference/sdpa_reference.h"

using namespace flashspan;
using api::guarded;

struct fs_sdpa_attributes {
  sdpa::Attributes a;
};

namespace {

enum class Direction { kBoth, kForward, kBackward };

sdpa::Attributes& attrs_of(fs_sdpa_attributes_t attr, const char* setter, Direction dir) {
  FS_CHECK_ARG(attr != nullptr, "attr: is NULL");
  sdpa::Attributes& a = attr->a;
  FS_CHECK_ARG(dir != Direction::kForward || !a.backward, setter,
               ": is a forward attribute (SDPA_attributes), not a backward one");
  FS_CHECK_ARG(dir != Direction::kBackward || a.backward, setter,
               ": is a backward attribute (SDPA_backward_attributes), not a forward one");
  return a;
}

void bind_descriptor(sdpa::Attributes& a, int slot, const fs_tensor_t* t) {
  TensorView view = tensor_view_from_fs(t, sdpa::slot_name(slot));
  if (t != nullptr && view.ndim == 0) {  // a 0-d scalar: one element, kept as [1] so it reads as bound
    view.ndim = 1;
    view.shape[0] = 1;
    view.strides[0] = 1;
  }
  view.data = nullptr;  // the variant pack gives the data at execute(), byte_offset is added to it
  a.tensors[slot] = view;
  a.byte_offset[slot] = t == nullptr ? 0 : t->byte_offset;
}

void set_tensor(fs_sdpa_attributes_t attr, int slot, const fs_tensor_t* t, Direction dir, const char* setter) {
  bind_descriptor(attrs_of(attr, setter, dir), slot, t);
}

int32_t check_bool(int32_t v, const char* name) {
  FS_CHECK_ARG(v == 0 || v == 1, name, ": must be 0 or 1, got ", v);
  return v;
}

// What forward and backward operations share.
struct SdpaOp {
  sdpa::Problem problem;
  bool supported = false;
  bool compiled = false;

  bool on_cuda() const { return problem.device == DeviceType::kCUDA; }
  void check_support() {
    if (on_cuda()) {
#ifdef FLASHSPAN_WITH_CUDA
      problem.fp8_fwd_family = problem.fp8_bwd_family = 0;  // (the rules' live answers while checking)
      problem.dbias_ds_form = -1;
      sdpa_check_support_gpu(problem);
      // dBias's form, chosen once (the workspace is sized by it, the kernel stores by it).
      if (problem.a.backward && problem.has(FS_SDPA_DBIAS)) problem.dbias_ds_form = sdpa_dbias_ds_form(problem);
      // An FP8 call's kernel family, chosen once (its workspace and launch follow it).
      if (problem.fp8 && !problem.a.backward) problem.fp8_fwd_family = sdpa_fp8_fwd_runs_sm80(problem) ? 80 : 90;
      if (problem.fp8 && problem.a.backward) problem.fp8_bwd_family = sdpa_fp8_bwd_runs_sm90(problem) ? 90 : 80;
#else
      sdpa_check_features_gpu(problem);  // the feature messages first, as a CUDA build gives them
      throw Error(Status::kNotSupported, "q: is a CUDA tensor but this build of flashspan has no CUDA support");
#endif
    }
    supported = true;
  }
  size_t workspace_size() const {
    if (!on_cuda()) return 0;  // the CPU reference needs no workspace
    return problem.a.backward ? sdpa_bwd_workspace_size(problem) : sdpa_fwd_workspace_size(problem);
  }
  // Runs the bound problem: the CPU reference, or the GPU kernels on the stream.
  void run(const sdpa::Problem& p, void* workspace, size_t workspace_bytes, void* stream) const {
    if (!on_cuda()) {
      if (p.a.backward) {
        reference::sdpa_backward(p);
      } else {
        reference::sdpa_forward(p);
      }
      return;
    }
    const size_t need = workspace_size();
    FS_CHECK_ARG(workspace_bytes >= need, "workspace: ", workspace_bytes, " bytes given, ", need, " needed");
    FS_CHECK_ARG(need == 0 || workspace != nullptr, "workspace: is NULL but ", need, " bytes are needed");
#ifdef FLASHSPAN_WITH_CUDA
    if (p.a.backward) {
      launch_sdpa_bwd(p, workspace, workspace_bytes, stream);
    } else {
      launch_sdpa_fwd(p, workspace, workspace_bytes, stream);
    }
#else
    (void)stream;
    throw Error(Status::kNotSupported, "q: is a CUDA tensor but this build of flashspan has no CUDA support");
#endif
  }
  void compile() {
    FS_CHECK_ARG(supported, "op: check_support() must succeed before compile()");
    compiled = true;
  }
  // A copy of the problem with the variant pack's pointers bound.
  sdpa::Problem bound(void* const* pack, int32_t num_slots) const {
    FS_CHECK_ARG(compiled, "op: compile() must be called before execute()");
    sdpa::Problem p = problem;
    p.bind(pack, num_slots);
    return p;
  }
};

sdpa::Attributes with_tensors(fs_sdpa_attributes_t attr, std::initializer_list<std::pair<int, const fs_tensor_t*>> ts) {
  FS_CHECK_ARG(attr != nullptr, "attr: is NULL");
  sdpa::Attributes a = attr->a;
  for (const auto& [slot, t] : ts) {
    if (t != nullptr) bind_descriptor(a, slot, t);
  }
  return a;
}

}  // namespace

struct fs_sdpa_fwd : SdpaOp {};
struct fs_sdpa_bwd : SdpaOp {};

extern "C" {

FS_API fs_status_t fs_sdpa_attributes_create(int32_t backward, fs_sdpa_attributes_t* attr) {
  return guarded([&] {
    FS_CHECK_ARG(attr != nullptr, "attr: output pointer is NULL");
    *attr = nullptr;
    auto h = std::make_unique<fs_sdpa_attributes>();
    h->a.backward = check_bool(backward, "backward") == 1;
    *attr = h.release();
  });
}

FS_API fs_status_t fs_sdpa_attributes_destroy(fs_sdpa_attributes_t attr) {
  return guarded([&] { delete attr; });
}

#define FS_SDPA_TENSOR_SETTER(name, slot, dir)                                                      \
  FS_API fs_status_t fs_sdpa_attributes_set_##name(fs_sdpa_attributes_t attr, const fs_tensor_t* value) { \
    return guarded([&] { set_tensor(attr, slot, value, dir, "set_" #name); });                     \
  }

FS_SDPA_TENSOR_SETTER(attn_scale_tensor, FS_SDPA_ATTN_SCALE, Direction::kBoth)
FS_SDPA_TENSOR_SETTER(bias, FS_SDPA_BIAS, Direction::kBoth)
FS_SDPA_TENSOR_SETTER(seq_len_q, FS_SDPA_SEQ_LEN_Q, Direction::kBoth)
FS_SDPA_TENSOR_SETTER(seq_len_kv, FS_SDPA_SEQ_LEN_KV, Direction::kBoth)
FS_SDPA_TENSOR_SETTER(cu_seq_len_q, FS_SDPA_CU_SEQ_LEN_Q, Direction::kBoth)
FS_SDPA_TENSOR_SETTER(cu_seq_len_kv, FS_SDPA_CU_SEQ_LEN_KV, Direction::kBoth)
FS_SDPA_TENSOR_SETTER(block_mask, FS_SDPA_BLOCK_MASK, Direction::kBoth)
FS_SDPA_TENSOR_SETTER(rng_dump, FS_SDPA_RNG_DUMP, Direction::kBoth)
FS_SDPA_TENSOR_SETTER(sink_token, FS_SDPA_SINK_TOKEN, Direction::kBoth)
FS_SDPA_TENSOR_SETTER(gate, FS_SDPA_GATE, Direction::kBoth)
FS_SDPA_TENSOR_SETTER(logit_max, FS_SDPA_SCORE_MAX, Direction::kForward)
FS_SDPA_TENSOR_SETTER(score_sum_exp, FS_SDPA_SCORE_SUM_EXP, Direction::kForward)
FS_SDPA_TENSOR_SETTER(max_logit, FS_SDPA_MAX_LOGIT, Direction::kForward)
FS_SDPA_TENSOR_SETTER(paged_attention_k_table, FS_SDPA_PAGE_TABLE_K, Direction::kForward)
FS_SDPA_TENSOR_SETTER(paged_attention_v_table, FS_SDPA_PAGE_TABLE_V, Direction::kForward)
FS_SDPA_TENSOR_SETTER(dbias, FS_SDPA_DBIAS, Direction::kBackward)
FS_SDPA_TENSOR_SETTER(dsink_token, FS_SDPA_DSINK_TOKEN, Direction::kBackward)
FS_SDPA_TENSOR_SETTER(dgate, FS_SDPA_DGATE, Direction::kBackward)
FS_SDPA_TENSOR_SETTER(descale_q, FS_SDPA_DESCALE_Q, Direction::kBoth)
FS_SDPA_TENSOR_SETTER(descale_k, FS_SDPA_DESCALE_K, Direction::kBoth)
FS_SDPA_TENSOR_SETTER(descale_v, FS_SDPA_DESCALE_V, Direction::kBoth)
FS_SDPA_TENSOR_SETTER(descale_s, FS_SDPA_DESCALE_S, Direction::kBoth)
FS_SDPA_TENSOR_SETTER(scale_s, FS_SDPA_SCALE_S, Direction::kBoth)
FS_SDPA_TENSOR_SETTER(scale_o, FS_SDPA_SCALE_O, Direction::kForward)
FS_SDPA_TENSOR_SETTER(amax_s, FS_SDPA_AMAX_S, Direction::kForward)
FS_SDPA_TENSOR_SETTER(amax_o, FS_SDPA_AMAX_O, Direction::kForward)
FS_SDPA_TENSOR_SETTER(descale_o, FS_SDPA_DESCALE_O, Direction::kBackward)
FS_SDPA_TENSOR_SETTER(descale_do, FS_SDPA_DESCALE_DO, Direction::kBackward)
FS_SDPA_TENSOR_SETTER(descale_dp, FS_SDPA_DESCALE_DP, Direction::kBackward)
FS_SDPA_TENSOR_SETTER(scale_dq, FS_SDPA_SCALE_DQ, Direction::kBackward)
FS_SDPA_TENSOR_SETTER(scale_dk, FS_SDPA_SCALE_DK, Direction::kBackward)
FS_SDPA_TENSOR_SETTER(scale_dv, FS_SDPA_SCALE_DV, Direction::kBackward)
FS_SDPA_TENSOR_SETTER(scale_dp, FS_SDPA_SCALE_DP, Direction::kBackward)
FS_SDPA_TENSOR_SETTER(amax_dq, FS_SDPA_AMAX_DQ, Direction::kBackward)
FS_SDPA_TENSOR_SETTER(amax_dk, FS_SDPA_AMAX_DK, Direction::kBackward)
FS_SDPA_TENSOR_SETTER(amax_dv, FS_SDPA_AMAX_DV, Direction::kBackward)
FS_SDPA_TENSOR_SETTER(amax_dp, FS_SDPA_AMAX_DP, Direction::kBackward)

#undef FS_SDPA_TENSOR_SETTER

FS_API fs_status_t fs_sdpa_attributes_set_attn_scale(fs_sdpa_attributes_t attr, float value) {
  return guarded([&] { attrs_of(attr, "set_attn_scale", Direction::kBoth).attn_scale_value = value; });
}

FS_API fs_status_t fs_sdpa_attributes_set_alibi_mask(fs_sdpa_attributes_t attr, int32_t value) {
  return guarded(
      [&] { attrs_of(attr, "set_alibi_mask", Direction::kBoth).alibi = check_bool(value, "alibi_mask") == 1; });
}

FS_API fs_status_t fs_sdpa_attributes_set_padding_mask(fs_sdpa_attributes_t attr, int32_t value) {
  return guarded([&] {
    attrs_of(attr, "set_padding_mask", Direction::kBoth).padding_mask = check_bool(value, "padding_mask") == 1;
  });
}

FS_API fs_status_t fs_sdpa_attributes_set_max_total_seq_len_q(fs_sdpa_attributes_t attr, int64_t value) {
  return guarded([&] { attrs_of(attr, "set_max_total_seq_len_q", Direction::kBoth).max_total_seq_len_q = value; });
}

FS_API fs_status_t fs_sdpa_attributes_set_max_total_seq_len_kv(fs_sdpa_attributes_t attr, int64_t value) {
  return guarded([&] { attrs_of(attr, "set_max_total_seq_len_kv", Direction::kBoth).max_total_seq_len_kv = value; });
}

FS_API fs_status_t fs_sdpa_attributes_set_diagonal_alignment(fs_sdpa_attributes_t attr, int32_t alignment) {
  return guarded([&] { attrs_of(attr, "set_diagonal_alignment", Direction::kBoth).alignment = alignment; });
}

FS_API fs_status_t fs_sdpa_attributes_set_diagonal_band_left_bound(fs_sdpa_attributes_t attr, int64_t value) {
  return guarded([&] { attrs_of(attr, "set_diagonal_band_left_bound", Direction::kBoth).left_bound = value; });
}

FS_API fs_status_t fs_sdpa_attributes_set_diagonal_band_right_bound(fs_sdpa_attributes_t attr, int64_t value) {
  return guarded([&] { attrs_of(attr, "set_diagonal_band_right_bound", Direction::kBoth).right_bound = value; });
}

// Seed semantics of the deprecated setters: the alignment, and a right bound of 0 only when
// no right bound was specified before.
FS_API fs_status_t fs_sdpa_attributes_set_causal_mask(fs_sdpa_attributes_t attr, int32_t value) {
  return guarded([&] {
    sdpa::Attributes& a = attrs_of(attr, "set_causal_mask", Direction::kBoth);
    if (check_bool(value, "causal_mask") == 0) return;
    a.alignment = FS_SDPA_TOP_LEFT;
    if (!a.right_bound) a.right_bound = 0;
  });
}

FS_API fs_status_t fs_sdpa_attributes_set_causal_mask_bottom_right(fs_sdpa_attributes_t attr, int32_t value) {
  return guarded([&] {
    sdpa::Attributes& a = attrs_of(attr, "set_causal_mask_bottom_right", Direction::kBoth);
    if (check_bool(value, "causal_mask_bottom_right") == 0) return;
    a.alignment = FS_SDPA_BOTTOM_RIGHT;
    if (!a.right_bound) a.right_bound = 0;
  });
}

FS_API fs_status_t fs_sdpa_attributes_set_sliding_window_length(fs_sdpa_attributes_t attr, int64_t value) {
  return guarded([&] { attrs_of(attr, "set_sliding_window_length", Direction::kBoth).left_bound = value; });
}

FS_API fs_status_t fs_sdpa_attributes_set_dropout(fs_sdpa_attributes_t attr, float probability,
                                                  const fs_tensor_t* seed, const fs_tensor_t* offset) {
  return guarded([&] {
    sdpa::Attributes& a = attrs_of(attr, "set_dropout", Direction::kBoth);
    a.dropout_probability = probability;
    bind_descriptor(a, FS_SDPA_DROPOUT_SEED, seed);
    bind_descriptor(a, FS_SDPA_DROPOUT_OFFSET, offset);
  });
}

FS_API fs_status_t fs_sdpa_attributes_set_dropout_mask(fs_sdpa_attributes_t attr, const fs_tensor_t* mask,
                                                       const fs_tensor_t* scale, const fs_tensor_t* scale_inv) {
  return guarded([&] {
    sdpa::Attributes& a = attrs_of(attr, "set_dropout_mask", Direction::kBoth);
    a.dropout_mask_form = mask != nullptr || scale != nullptr || scale_inv != nullptr;
    bind_descriptor(a, FS_SDPA_DROPOUT_MASK, mask);
    bind_descriptor(a, FS_SDPA_DROPOUT_SCALE, scale);
    bind_descriptor(a, FS_SDPA_DROPOUT_SCALE_INV, scale_inv);
  });
}

FS_API fs_status_t fs_sdpa_attributes_set_softcap(fs_sdpa_attributes_t attr, float value) {
  return guarded([&] { attrs_of(attr, "set_softcap", Direction::kBoth).softcap = value; });
}

FS_API fs_status_t fs_sdpa_attributes_set_ragged_offset(fs_sdpa_attributes_t attr, int32_t tensor,
                                                        const fs_tensor_t* offsets, int64_t multiplier) {
  return guarded([&] {
    sdpa::Attributes& a = attrs_of(attr, "set_ragged_offset", Direction::kBoth);
    const int r = tensor >= 0 && tensor < sdpa::kNumSlots ? sdpa::ragged_slot_of(tensor) : -1;
    FS_CHECK_ARG(r >= 0, "tensor: slot ", tensor, " cannot carry a ragged offset (Q, K, V, O, STATS, DO, DQ, DK, DV, "
                 "PAGE_TABLE_K, PAGE_TABLE_V, GATE or DGATE)");
    FS_CHECK_ARG(multiplier >= 1, sdpa::slot_name(r), ": multiplier must be >= 1, got ", multiplier);
    bind_descriptor(a, r, offsets);
    a.ragged_multiplier[r] = multiplier;
  });
}

FS_API fs_status_t fs_sdpa_attributes_set_generate_stats(fs_sdpa_attributes_t attr, int32_t value) {
  return guarded([&] {
    attrs_of(attr, "set_generate_stats", Direction::kForward).generate_stats = check_bool(value, "generate_stats") == 1;
  });
}

FS_API fs_status_t fs_sdpa_attributes_set_is_inference(fs_sdpa_attributes_t attr, int32_t value) {
  return guarded([&] {
    attrs_of(attr, "set_is_inference", Direction::kForward).generate_stats = check_bool(value, "is_inference") == 0;
  });
}

FS_API fs_status_t fs_sdpa_attributes_set_stats_use_log2(fs_sdpa_attributes_t attr, int32_t value) {
  return guarded([&] {
    attrs_of(attr, "set_stats_use_log2", Direction::kForward).stats_use_log2 = check_bool(value, "stats_use_log2") == 1;
  });
}

FS_API fs_status_t fs_sdpa_attributes_set_paged_attention_max_seq_len_kv(fs_sdpa_attributes_t attr, int64_t value) {
  return guarded([&] {
    attrs_of(attr, "set_paged_attention_max_seq_len_kv", Direction::kForward).paged_max_seq_len_kv = value;
  });
}

FS_API fs_status_t fs_sdpa_attributes_set_deterministic_algorithm(fs_sdpa_attributes_t attr, int32_t value) {
  return guarded([&] {
    attrs_of(attr, "set_deterministic_algorithm", Direction::kBackward).deterministic =
        check_bool(value, "deterministic_algorithm") == 1;
  });
}

// ---------------------------------------------------------------------------
// Forward
// ---------------------------------------------------------------------------

FS_API fs_status_t fs_sdpa_fwd_create(const fs_tensor_t* q, const fs_tensor_t* k, const fs_tensor_t* v,
                                      const fs_tensor_t* o, const fs_tensor_t* stats, fs_sdpa_attributes_t attr,
                                      fs_sdpa_fwd_t* op) {
  return guarded([&] {
    FS_CHECK_ARG(op != nullptr, "op: output pointer is NULL");
    *op = nullptr;
    const sdpa::Attributes a = with_tensors(
        attr, {{FS_SDPA_Q, q}, {FS_SDPA_K, k}, {FS_SDPA_V, v}, {FS_SDPA_O, o}, {FS_SDPA_STATS, stats}});
    auto h = std::make_unique<fs_sdpa_fwd>();
    h->problem = sdpa::validate_forward(a);
    *op = h.release();
  });
}

FS_API fs_status_t fs_sdpa_fwd_destroy(fs_sdpa_fwd_t op) {
  return guarded([&] { delete op; });
}

FS_API fs_status_t fs_sdpa_fwd_check_support(fs_sdpa_fwd_t op) {
  return guarded([&] {
    FS_CHECK_ARG(op != nullptr, "op: is NULL");
    op->check_support();
  });
}

FS_API fs_status_t fs_sdpa_fwd_compile(fs_sdpa_fwd_t op) {
  return guarded([&] {
    FS_CHECK_ARG(op != nullptr, "op: is NULL");
    op->compile();
  });
}

FS_API fs_status_t fs_sdpa_fwd_workspace_size(fs_sdpa_fwd_t op, size_t* bytes) {
  return guarded([&] {
    FS_CHECK_ARG(op != nullptr, "op: is NULL");
    FS_CHECK_ARG(bytes != nullptr, "bytes: is NULL");
    *bytes = op->workspace_size();
  });
}

FS_API fs_status_t fs_sdpa_fwd_execute(fs_sdpa_fwd_t op, void* const* variant_pack, int32_t num_slots,
                                       void* workspace, size_t workspace_bytes, void* stream) {
  return guarded([&] {
    FS_CHECK_ARG(op != nullptr, "op: is NULL");
    const sdpa::Problem p = op->bound(variant_pack, num_slots);
    op->run(p, workspace, workspace_bytes, stream);
  });
}

// ---------------------------------------------------------------------------
// Backward
// ---------------------------------------------------------------------------

FS_API fs_status_t fs_sdpa_bwd_create(const fs_tensor_t* q, const fs_tensor_t* k, const fs_tensor_t* v,
                                      const fs_tensor_t* o, const fs_tensor_t* dO, const fs_tensor_t* stats,
                                      const fs_tensor_t* dQ, const fs_tensor_t* dK, const fs_tensor_t* dV,
                                      fs_sdpa_attributes_t attr, fs_sdpa_bwd_t* op) {
  return guarded([&] {
    FS_CHECK_ARG(op != nullptr, "op: output pointer is NULL");
    *op = nullptr;
    const sdpa::Attributes a = with_tensors(attr, {{FS_SDPA_Q, q},
                                                   {FS_SDPA_K, k},
                                                   {FS_SDPA_V, v},
                                                   {FS_SDPA_O, o},
                                                   {FS_SDPA_DO, dO},
                                                   {FS_SDPA_STATS, stats},
                                                   {FS_SDPA_DQ, dQ},
                                                   {FS_SDPA_DK, dK},
                                                   {FS_SDPA_DV, dV}});
    auto h = std::make_unique<fs_sdpa_bwd>();
    h->problem = sdpa::validate_backward(a);
    *op = h.release();
  });
}

FS_API fs_status_t fs_sdpa_bwd_destroy(fs_sdpa_bwd_t op) {
  return guarded([&] { delete op; });
}

FS_API fs_status_t fs_sdpa_bwd_check_support(fs_sdpa_bwd_t op) {
  return guarded([&] {
    FS_CHECK_ARG(op != nullptr, "op: is NULL");
    op->check_support();
  });
}

FS_API fs_status_t fs_sdpa_bwd_compile(fs_sdpa_bwd_t op) {
  return guarded([&] {
    FS_CHECK_ARG(op != nullptr, "op: is NULL");
    op->compile();
  });
}

FS_API fs_status_t fs_sdpa_bwd_workspace_size(fs_sdpa_bwd_t op, size_t* bytes) {
  return guarded([&] {
    FS_CHECK_ARG(op != nullptr, "op: is NULL");
    FS_CHECK_ARG(bytes != nullptr, "bytes: is NULL");
    *bytes = op->workspace_size();
  });
}

FS_API fs_status_t fs_sdpa_bwd_execute(fs_sdpa_bwd_t op, void* const* variant_pack, int32_t num_slots,
                                       void* workspace, size_t workspace_bytes, void* stream) {
  return guarded([&] {
    FS_CHECK_ARG(op != nullptr, "op: is NULL");
    const sdpa::Problem p = op->bound(variant_pack, num_slots);
    op->run(p, workspace, workspace_bytes, stream);
  });
}

}  // extern "C"
