// MaskPlan accessors and the plan layout shared by both planners.
#include "plan/mask_plan.h"

#include <cstdio>
#include <limits>
#include <string>

#include "core/error.h"
#include "plan/plan_layout.h"
#include "plan/planner.h"

#ifdef FLASHSPAN_WITH_CUDA
#include <cuda_runtime.h>
#endif

namespace flashspan {

MaskPlan::~MaskPlan() {
#ifdef FLASHSPAN_WITH_CUDA
  // A destructor must not throw; a failed free leaks at worst.
  if (device_buffer != nullptr) (void)cudaFree(device_buffer);
#endif
}

const int32_t* MaskPlan::array(const std::string& name, int64_t* count) const {
  for (const PlanArray& a : arrays) {
    if (a.name == name) {
      if (count) *count = a.count;
      return base() + a.offset;
    }
  }
  if (count) *count = 0;
  return nullptr;
}

PlanViewPtrs MaskPlan::fwd_view() const {
  PlanViewPtrs v;
  v.block_q = signature.consumer.fwd_block_q;
  v.block_k = signature.consumer.fwd_block_k;
  v.pack_group = fwd_pack_group(geometry, signature.pack_gqa);
  v.num_mask_heads = fwd_mask_heads(geometry, signature.pack_gqa);
  v.num_q_blocks = counts.fwd_num_q_blocks;
  v.num_k_blocks = counts.fwd_num_k_blocks;
  v.q_block_start = array("fwd_q_block_start");
  v.k_block_start = array("fwd_k_block_start");
  v.q2k_partial_ptr = array("fwd_q2k_partial_ptr");
  v.q2k_partial_kb = array("fwd_q2k_partial_kb");
  v.q2k_partial_bits = reinterpret_cast<const uint32_t*>(array("fwd_q2k_partial_bits"));
  v.q2k_full_ptr = array("fwd_q2k_full_ptr");
  v.q2k_full_runs = array("fwd_q2k_full_runs");
  v.tasks = array("fwd_tasks");
  v.num_tasks = counts.num_tasks;
  return v;
}

PlanViewPtrs MaskPlan::bwd_view() const {
  FS_CHECK_ARG(signature.has_backward,
               "mask_plan: was built without backward metadata (build_backward=False); rebuild it with "
               "build_backward=True to run the backward pass");
  PlanViewPtrs v;
  v.block_q = signature.consumer.bwd_block_q;
  v.block_k = signature.consumer.bwd_block_k;
  v.num_mask_heads = geometry.num_heads_mask;
  v.num_q_blocks = counts.bwd_num_q_blocks;
  v.num_k_blocks = counts.bwd_num_k_blocks;
  v.q_block_start = array("bwd_q_block_start");
  v.k_block_start = array("bwd_k_block_start");
  v.q2k_partial_ptr = array("bwd_q2k_partial_ptr");
  v.q2k_partial_kb = array("bwd_q2k_partial_kb");
  v.q2k_partial_bits = reinterpret_cast<const uint32_t*>(array("bwd_q2k_partial_bits"));
  v.q2k_full_ptr = array("bwd_q2k_full_ptr");
  v.q2k_full_runs = array("bwd_q2k_full_runs");
  v.k2q_partial_ptr = array("bwd_k2q_partial_ptr");
  v.k2q_partial_qb = array("bwd_k2q_partial_qb");
  v.k2q_partial_idx = array("bwd_k2q_partial_idx");
  v.k2q_full_ptr = array("bwd_k2q_full_ptr");
  v.k2q_full_runs = array("bwd_k2q_full_runs");
  v.tasks = array("bwd_tasks");
  v.num_tasks = counts.num_bwd_tasks;
  return v;
}

std::string PlanSignature::to_string(const FlexGeometry& g) const {
  // Kept under 255 characters: the C ABI copies it into a fixed char[256].
  const Consumer& c = consumer;
  std::string s = detail::concat("sm", c.arch, " fwd ", c.fwd_block_q, "x", c.fwd_block_k, " bwd ", c.bwd_block_q, "x",
                                 c.bwd_block_k, " layout ", int(c.layout), has_backward ? " +bwd" : " fwd-only",
                                 pack_gqa ? " packgqa" : "", "; ");
  if (g.varlen) {
    s += detail::concat("THD B=", g.batch, " Tq=", g.total_q, " Tk=", g.total_k, " maxSq=", g.max_seqlen_q,
                        " maxSk=", g.max_seqlen_k);
  } else {
    s += detail::concat("BSHD B=", g.batch, " Sq=", g.max_seqlen_q, " Sk=", g.max_seqlen_k);
  }
  s += detail::concat(" Hq=", g.num_heads_q, " Hkv=", g.num_heads_kv, " Hmask=", g.num_heads_mask,
                      " nfunc=", g.nfunc, " D=", g.head_dim_qk, "/", g.head_dim_v, " ", dtype_name(g.dtype), " ",
                      g.device == DeviceType::kCUDA ? "cuda:" : "cpu:", g.device_id);
  return s;
}


// ---------------------------------------------------------------------------
// Shared planner helpers (plan_layout.h)
// ---------------------------------------------------------------------------

std::vector<int32_t> block_starts(const std::vector<int32_t>& cu, int block, int rows_per_position) {
  std::vector<int32_t> s(cu.size(), 0);
  for (size_t b = 0; b + 1 < cu.size(); ++b) {
    const int64_t len = (int64_t(cu[b + 1]) - cu[b]) * rows_per_position;
    const int64_t next = s[b] + (len + block - 1) / block;
    FS_CHECK_SUPPORTED(next < (int64_t(1) << 31), "mask_func: more than 2^31 - 1 blocks of ", block,
                       " rows; use shorter sequences", rows_per_position > 1 ? " or pack_gqa=False" : "");
    s[b + 1] = static_cast<int32_t>(next);
  }
  return s;
}

void check_plan_request(const PlanRequest& req) {
  FS_CHECK_ARG(req.geometry != nullptr, "geometry: is required");
  const Consumer& c = req.consumer;
  FS_CHECK_SUPPORTED(c.layout == PayloadLayout::kM16N64Frag, "consumer: unknown payload layout ", int(c.layout));
  auto tile_ok = [](int rows, int cols) { return rows > 0 && cols > 0 && rows % 16 == 0 && cols % 32 == 0; };
  FS_CHECK_ARG(tile_ok(c.fwd_block_q, c.fwd_block_k), "consumer: forward tile ", c.fwd_block_q, "x", c.fwd_block_k,
               " must have rows % 16 == 0 and columns % 32 == 0 (payload layout)");
  FS_CHECK_ARG(tile_ok(c.bwd_block_q, c.bwd_block_k), "consumer: backward tile ", c.bwd_block_q, "x", c.bwd_block_k,
               " must have rows % 16 == 0 and columns % 32 == 0 (payload layout)");
  const FlexGeometry& g = *req.geometry;
  FS_CHECK_ARG(g.batch >= 1 && int64_t(g.cu_seqlens_q.size()) == g.batch + 1 &&
                   int64_t(g.cu_seqlens_k.size()) == g.batch + 1,
               "geometry: cu_seqlens copies must have B+1 entries");
  FS_CHECK_ARG(g.num_heads_mask == 1 || g.num_heads_mask == g.num_heads_q, "geometry: Hmask must be 1 or Hq");
  FS_CHECK_ARG(g.num_heads_kv >= 1 && g.num_heads_q % g.num_heads_kv == 0,
               "geometry: Hq must be a positive multiple of Hkv");
  FS_CHECK_ARG(g.nfunc > 0 && g.nfunc % 2 == 1, "geometry: nfunc must be positive and odd");
}

void check_list_entries(const char* view, const char* list, int64_t entries, int bq, int bk, int mask_heads) {
  FS_CHECK_SUPPORTED(entries >= 0 && entries <= kMaxListEntries, "mask_func: the ", view, " view (tile ", bq, "x",
                     bk, ", ", mask_heads, " mask head", mask_heads == 1 ? "" : "s", ") would list ", entries, " ",
                     list, " entries, more than the plan format's limit of ", kMaxListEntries,
                     " (2^31 - 1) entries per list; use fewer mask heads (Hmask = 1), shorter sequences",
                     std::string(view).rfind("backward", 0) == 0 ? ", or build_backward=False" : "");
}

void assign_plan_layout(MaskPlan& plan, bool keep_mask) {
  const FlexGeometry& g = plan.geometry;
  const PlanCounts& n = plan.counts;
  const Consumer& c = plan.signature.consumer;
  check_list_entries("forward", "partial", n.fwd_partial, c.fwd_block_q, c.fwd_block_k,
                     fwd_mask_heads(g, plan.signature.pack_gqa));
  check_list_entries("forward", "full-run", n.fwd_full_runs, c.fwd_block_q, c.fwd_block_k,
                     fwd_mask_heads(g, plan.signature.pack_gqa));
  if (plan.signature.has_backward) {
    check_list_entries("backward", "partial", n.bwd_partial, c.bwd_block_q, c.bwd_block_k, g.num_heads_mask);
    check_list_entries("backward", "full-run", n.bwd_full_runs, c.bwd_block_q, c.bwd_block_k, g.num_heads_mask);
    check_list_entries("backward K2Q", "full-run", n.bwd_k2q_full_runs, c.bwd_block_q, c.bwd_block_k,
                       g.num_heads_mask);
  }
  FS_CHECK_SUPPORTED(n.num_tasks >= 0 && n.num_tasks <= kMaxListEntries && n.num_bwd_tasks >= 0 &&
                         n.num_bwd_tasks <= kMaxListEntries,
                     "mask_func: the plan's schedules would hold ", n.num_tasks, " forward / ", n.num_bwd_tasks,
                     " backward tasks (heads x blocks), more than the plan format's limit of ", kMaxListEntries,
                     "; use fewer heads or shorter sequences");
  plan.arrays.clear();
  int64_t off = 0;
  auto add = [&](const char* name, int64_t count) {
    plan.arrays.push_back(PlanArray{name, off, count});
    off += (count + kPlanAlign - 1) / kPlanAlign * kPlanAlign;
  };
  const int64_t B1 = g.batch + 1, Hm = g.num_heads_mask, Hmv = fwd_mask_heads(g, plan.signature.pack_gqa);
  add("cu_seqlens_q", B1);
  add("cu_seqlens_k", B1);
  add("fwd_q_block_start", B1);
  add("fwd_k_block_start", B1);
  add("fwd_q2k_partial_ptr", Hmv * n.fwd_num_q_blocks + 1);
  add("fwd_q2k_full_ptr", Hmv * n.fwd_num_q_blocks + 1);
  add("fwd_q2k_partial_kb", n.fwd_partial);
  add("fwd_q2k_full_runs", 2 * n.fwd_full_runs);
  add("fwd_tasks", 4 * n.num_tasks);
  add("fwd_q2k_partial_bits", n.fwd_partial * payload_words(c.fwd_block_q, c.fwd_block_k));
  if (plan.signature.has_backward) {
    add("bwd_q_block_start", B1);
    add("bwd_k_block_start", B1);
    add("bwd_q2k_partial_ptr", Hm * n.bwd_num_q_blocks + 1);
    add("bwd_q2k_full_ptr", Hm * n.bwd_num_q_blocks + 1);
    add("bwd_q2k_partial_kb", n.bwd_partial);
    add("bwd_q2k_full_runs", 2 * n.bwd_full_runs);
    add("bwd_k2q_partial_ptr", Hm * n.bwd_num_k_blocks + 1);
    add("bwd_k2q_full_ptr", Hm * n.bwd_num_k_blocks + 1);
    add("bwd_k2q_partial_qb", n.bwd_partial);
    add("bwd_k2q_partial_idx", n.bwd_partial);
    add("bwd_k2q_full_runs", 2 * n.bwd_k2q_full_runs);
    add("bwd_tasks", 4 * n.num_bwd_tasks);
    add("bwd_q2k_partial_bits", n.bwd_partial * payload_words(c.bwd_block_q, c.bwd_block_k));
  }
  if (keep_mask) add("mask_func", Hm * g.nfunc * g.total_q);
  // Every count above is <= kMaxListEntries times a small factor (payload words <= 2^15 for
  // the largest tile), so `off` cannot overflow int64; its byte size must still fit size_t.
  FS_CHECK_SUPPORTED(off <= std::numeric_limits<int64_t>::max() / int64_t(sizeof(int32_t)),
                     "mask_func: the plan would need ", off, " int32 elements, more than a 64-bit byte size holds");
  plan.buffer_elements = off;
}

}  // namespace flashspan
