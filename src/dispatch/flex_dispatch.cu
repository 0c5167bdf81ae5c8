// Entry points of flex_launch.h: workspace sizes, support checks and launches. The plan's
// consumer arch picks the kernel family: arch 80, the portable sm80 family (mma.sync), on any
// sm_80+ GPU; arch 90, the Hopper forward (src/kernels/sm90: TMA + wgmma) on sm_90 for the
// configurations it covers (sm90::fwd_config_supported), and the Hopper backward where it runs
// (sm90::bwd_config_supported, sm90::bwd_enabled), else the sm80 backward (same backward tile).
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cmath>

#include "core/validation.h"
#include "dispatch/family.h"
#include "dispatch/flex_launch.h"
#include "dispatch/tensor_addr.h"
#include "dispatch/workspace.h"
#include "kernels/sm80/launch_sm80.h"
#include "kernels/sm90/launch_sm90.h"

namespace flashspan {

namespace {

const int32_t* plan_array(const MaskPlan& plan, const char* name) {
  const int32_t* p = plan.array(name);
  FS_CHECK(p != nullptr, Status::kInternal, "mask_plan: array '", name, "' is missing");
  return p;
}

// The tile the sm80 kernels run for this plan (forward tile from the plan's consumer:
// launch_sm80.h, fwd_tile_for_plan_sm80). Throws kNotSupported when no sm80 forward
// kernel has the plan's forward tile.
sm80::TileSm80 plan_tile(const FlexGeometry& g, const MaskPlan& plan) {
  const Consumer& c = plan.signature.consumer;
  sm80::TileSm80 t{};
  if (!sm80::fwd_tile_for_plan_sm80(g.head_dim_qk, g.head_dim_v, c.fwd_block_q, c.fwd_block_k, &t)) {
    const sm80::TileSm80 d = sm80::tile_sm80(g.head_dim_qk, g.head_dim_v);
    FS_CHECK_SUPPORTED(false, "mask_plan: forward tile ", c.fwd_block_q, "x", c.fwd_block_k,
                       " has no sm80 forward kernel for head dims (", g.head_dim_qk, ", ", g.head_dim_v,
                       "); the sm80 kernels run ", d.fwd_bq, "x", d.fwd_bk,
                       g.head_dim_qk <= 128 && g.head_dim_v <= 128 ? detail::concat(" or ", kDecodeBlockQ, "x64")
                                                                   : std::string(),
                       " there");
  }
  return t;
}

void check_tile(const FlexGeometry& g, const MaskPlan& plan, bool backward) {
  const Consumer& c = plan.signature.consumer;
  FS_CHECK_SUPPORTED(c.layout == PayloadLayout::kM16N64Frag, "mask_plan: payload layout ", int(c.layout),
                     " is not the sm80 kernels' (kM16N64Frag)");
  const sm80::TileSm80 t = plan_tile(g, plan);
  if (backward) {
    FS_CHECK_SUPPORTED(c.bwd_block_q == t.bwd_bq && c.bwd_block_k == t.bwd_bk, "mask_plan: backward tile ",
                       c.bwd_block_q, "x", c.bwd_block_k, " does not match the sm80 kernel's ", t.bwd_bq, "x",
                       t.bwd_bk, " for head dims (", g.head_dim_qk, ", ", g.head_dim_v, ")");
  }
}

// The current device's L2 cache size in bytes (bwd_cell_order_sm90's bound), 0 when it cannot be
// read. Asked once per device: the backward reads it on every call, and the attribute does not
// change. Per-device slots (0: not read yet, since a device reports a positive size), relaxed
// atomics: threads racing on a first read store the same value.
int l2_cache_bytes() {
  static std::atomic<int> cache[64];
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) return 0;
  if (dev < 64) {
    const int c = cache[dev].load(std::memory_order_relaxed);
    if (c > 0) return c;
  }
  int l2 = 0;
  cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, dev);
  if (dev < 64 && l2 > 0) cache[dev].store(l2, std::memory_order_relaxed);
  return l2;
}

}  // namespace

size_t flex_fwd_workspace_size(const FlexGeometry& g, const MaskPlan& plan, bool has_max_logit) {
  (void)has_max_logit;
  // The split schedule of the forward (FwdWorkspaceLayout, from the plan's signature: its
  // consumer's forward tile and pack_gqa); max_logit is reset in place.
  return fwd_workspace_layout(g, plan.signature).total;
}

size_t flex_bwd_workspace_size(const FlexGeometry& g, const MaskPlan& plan, bool deterministic) {
  // delta and lse2, fp32 [Hq, total_q] each; the atomic path adds the dQ accumulator and
  // the dK/dV split schedule (launch_sm80.h, BwdWorkspaceLayout).
  return bwd_workspace_layout(g, plan.signature, deterministic).total;
}

void flex_check_support_gpu(const FlexGeometry& g, const MaskPlan& plan, bool backward) {
  FS_CHECK_SUPPORTED(g.dtype == DType::kFloat16 || g.dtype == DType::kBFloat16,
                     "q: the GPU kernels take float16 or bfloat16, got ", dtype_name(g.dtype));
  check_head_dims_gpu(g.head_dim_qk, g.head_dim_v);
  FS_CHECK_SUPPORTED(g.device == DeviceType::kCUDA, "q: the GPU kernels need CUDA tensors");
  FS_CHECK_SUPPORTED(plan.geometry.device == DeviceType::kCUDA && plan.geometry.device_id == g.device_id,
                     "mask_plan: must live on the same CUDA device as q (cuda:", g.device_id, ")");
  int major = 0;
  const cudaError_t e = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, g.device_id);
  FS_CHECK(e == cudaSuccess, Status::kCudaError, "cudaDeviceGetAttribute(cuda:", g.device_id,
           "): ", cudaGetErrorString(e));
  FS_CHECK_SUPPORTED(major >= 8, "device cuda:", g.device_id, " has compute capability ", major,
                     ".x; the flex kernels need 8.0 or newer");
  const Consumer& c = plan.signature.consumer;
  FS_CHECK_SUPPORTED(c.arch == 80 || c.arch == 90, "mask_plan: built for kernel family sm", c.arch,
                     ", which this build does not have (sm80 and sm90 exist)");
  if (c.arch == 90) {
    // Forward: the sm90 kernel, on the forward tile of the sm90 family's consumer
    // (kernels/sm90/tile_sm90.h through family.cpp); backward: the sm90 kernel where it runs,
    // else the sm80 kernels, whose backward tile the sm90 consumer has (tile_sm90.h).
    FS_CHECK_SUPPORTED(sm90::device_supported(g.device_id), "mask_plan: built for kernel family sm90, which needs a "
                       "compute capability 9.0 device and a build with 90a in FLASHSPAN_CUDA_ARCHS (device cuda:",
                       g.device_id, "); build the plan with arch=80");
    FS_CHECK_SUPPORTED(sm90::fwd_config_supported(g, plan.signature.pack_gqa),
                       "mask_plan: the sm90 forward runs float16/bfloat16, head dims each a multiple of 8 up to 128, "
                       "or (192, 128), or (256, 256), unpacked GQA or packed with Hq / Hkv a power of two up to 128 "
                       "(unless FLASHSPAN_SM90_PACK_GQA=0); got (", g.head_dim_qk, ", ", g.head_dim_v, ") ", dtype_name(g.dtype),
                       plan.signature.pack_gqa ? " packed" : "", ": build the plan with arch=80");
    const Consumer want = consumer_for(90, g.head_dim_qk, g.head_dim_v);
    FS_CHECK_SUPPORTED(c.fwd_block_q == want.fwd_block_q && c.fwd_block_k == want.fwd_block_k &&
                           c.layout == want.layout,
                       "mask_plan: forward tile ", c.fwd_block_q, "x", c.fwd_block_k, " is not the sm90 forward's ",
                       want.fwd_block_q, "x", want.fwd_block_k);
    if (backward && !sm90::bwd_wide_tile_sm90(g.head_dim_qk, g.head_dim_v, c.bwd_block_q, c.bwd_block_k)) {
      // (The wide tiles of (64, 64) and (192, 128) run on the sm90 backward only: launch_flex_bwd.)
      const sm80::TileSm80 t = sm80::tile_sm80(g.head_dim_qk, g.head_dim_v);
      FS_CHECK_SUPPORTED(c.bwd_block_q == t.bwd_bq && c.bwd_block_k == t.bwd_bk, "mask_plan: backward tile ",
                         c.bwd_block_q, "x", c.bwd_block_k, " does not match the sm80 kernel's ", t.bwd_bq, "x",
                         t.bwd_bk, " for head dims (", g.head_dim_qk, ", ", g.head_dim_v, ")");
    }
  } else {
    check_tile(g, plan, backward);
  }
  FS_CHECK_SUPPORTED(!backward || plan.signature.has_backward,
                     "mask_plan: has no backward metadata (build it with build_backward=True)");
  // Shared memory: sm_80 opts in to 163 KB a block, sm_86/89 to 99 KB, sm_90 to 227 KB.
  int smem_optin = 0;
  const cudaError_t e2 = cudaDeviceGetAttribute(&smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, g.device_id);
  FS_CHECK(e2 == cudaSuccess, Status::kCudaError, "cudaDeviceGetAttribute(cuda:", g.device_id,
           "): ", cudaGetErrorString(e2));
  const sm80::TileSm80 t = c.arch == 90 ? sm80::tile_sm80(g.head_dim_qk, g.head_dim_v) : plan_tile(g, plan);
  const int fwd_need = c.arch == 90 ? sm90::fwd_smem_bytes(g.head_dim_qk, g.head_dim_v) : sm80::fwd_smem_bytes(t);
  // Both backward dQ paths can be chosen at execute time: require the larger (and, for an sm90
  // plan, the sm90 backward's).
  int bwd_need = sm80::bwd_smem_bytes(t, true);
  if (c.arch == 90 && sm90::bwd_config_supported(g, false)) {
    bwd_need = std::max(bwd_need, sm90::bwd_smem_bytes(g.head_dim_qk, g.head_dim_v, c.bwd_block_q, c.bwd_block_k));
  }
  const int need = backward ? std::max(fwd_need, bwd_need) : fwd_need;
  FS_CHECK_SUPPORTED(need <= smem_optin, "(head_dim_qk, head_dim_v) = (", g.head_dim_qk, ", ", g.head_dim_v, "): the ",
                     backward ? "backward" : "forward", " kernels need ", need,
                     " bytes of shared memory per block; device cuda:", g.device_id, " allows ", smem_optin);
}

void launch_flex_fwd(const FlexFwdLaunch& a) {
  FS_CHECK(a.geometry != nullptr && a.plan != nullptr, Status::kInternal, "launch_flex_fwd: geometry/plan missing");
  const FlexGeometry& g = *a.geometry;
  const MaskPlan& plan = *a.plan;
  FS_CHECK(plan.on_device(), Status::kInternal, "mask_plan: launch_flex_fwd needs a CUDA plan");
  check_vec_aligned(a.q, "q");
  check_vec_aligned(a.k, "k");
  check_vec_aligned(a.v, "v");
  check_vec_aligned(a.out, "out");

  FwdParams p;
  p.q = a.q.data;
  p.k = a.k.data;
  p.v = a.v.data;
  p.o = a.out.data;
  p.qa = qkv_addr(a.q, g.varlen);
  p.ka = qkv_addr(a.k, g.varlen);
  p.va = qkv_addr(a.v, g.varlen);
  p.oa = qkv_addr(a.out, g.varlen);
  if (a.lse.defined()) {
    p.lse = a.lse.ptr<float>();
    p.lsea = lse_addr(a.lse, g.varlen);
  }
  if (a.max_logit.defined()) p.max_logit = a.max_logit.ptr<float>();
  p.cu_seqlens_q = plan_array(plan, "cu_seqlens_q");
  p.cu_seqlens_k = plan_array(plan, "cu_seqlens_k");
  p.varlen = g.varlen ? 1 : 0;
  p.batch = g.batch;
  p.num_heads_q = g.num_heads_q;
  p.group_size = g.num_heads_q / g.num_heads_kv;
  p.mask_per_head = g.num_heads_mask == 1 ? 0 : 1;
  p.head_dqk = g.head_dim_qk;
  p.head_dv = g.head_dim_v;
  p.scale = a.softmax_scale;
  p.scale_log2 = a.softmax_scale * 1.4426950408889634f;
  p.view = plan.fwd_view();
  // Packed GQA (mask_plan.h): the forward view's rows are packed rows of the G query heads of
  // a kv head, tasks and grid cells run per kv head.
  p.pack = p.view.pack_group;  // fwd_pack_group(g, plan.signature.pack_gqa): G or 1
  FS_CHECK(p.pack >= 1 && g.num_heads_q % p.pack == 0, Status::kInternal, "mask_plan: forward pack group ", p.pack,
           " does not divide Hq = ", g.num_heads_q);
  const int64_t all_blocks = int64_t(g.num_heads_q / p.pack) * p.view.num_q_blocks;
  p.grid_mode = p.view.num_tasks == all_blocks ? 0 : 1;
  // Split schedule (fwd_split.cuh) in task mode when the caller gave the workspace; a
  // call without one (workspace_bytes = 0; internal callers only, the C API checks the size)
  // runs one CTA per task as before (sm90: a persistent grid over the task list).
  // The forward tile is the plan's consumer's (default or decode tile); flex_check_support_gpu
  // has checked that a kernel of the plan's family provides it.
  const Consumer& c = plan.signature.consumer;
  const FwdWorkspaceLayout wl = fwd_workspace_layout(g, plan.signature);
  FS_CHECK_ARG(a.workspace_bytes == 0 || (a.workspace_bytes >= wl.total && a.workspace != nullptr),
               "workspace: needs ", wl.total, " bytes, got ", a.workspace_bytes);
  if (wl.total > 0 && a.workspace_bytes > 0 && !p.grid_mode && p.view.num_tasks > 0) {
    FS_CHECK_ARG(reinterpret_cast<uintptr_t>(a.workspace) % 16 == 0, "workspace: must be 16-byte aligned");
    FS_CHECK(p.view.num_tasks <= wl.max_tasks, Status::kInternal, "mask_plan: ", p.view.num_tasks,
             " forward tasks exceed the workspace bound ", wl.max_tasks);
    FS_CHECK(p.view.block_q == c.fwd_block_q && p.view.block_q <= FwdSplit::kMaxBlockQ, Status::kInternal,
             "mask_plan: forward query block ", p.view.block_q, " is not the consumer's ", c.fwd_block_q,
             " or exceeds the split combine's ", FwdSplit::kMaxBlockQ, " rows");
    char* ws = static_cast<char*>(a.workspace);
    wl.bind(p.split, ws);
    p.split.o_accum = reinterpret_cast<float*>(ws + wl.o_accum);
    p.split.ml = reinterpret_cast<float*>(ws + wl.ml);
    p.split.num_tasks = static_cast<int>(p.view.num_tasks);
    p.split_schedule = 1;
  }
  if (c.arch == 90) {
    FS_CHECK(sm90::device_supported(g.device_id) && sm90::fwd_config_supported(g, plan.signature.pack_gqa),
             Status::kNotSupported, "mask_plan: built for kernel family sm90, which cannot run this call on device cuda:",
             g.device_id, " (needs compute capability 9.0, a 90a build, float16/bfloat16, head dims each a multiple of 8 "
             "up to 128, or (192, 128), or (256, 256), unpacked GQA or packed with Hq / Hkv a power of two up to "
             "128 unless FLASHSPAN_SM90_PACK_GQA=0); build the plan with arch=80");
    sm90::launch_fwd_sm90(p, a.q, a.k, a.v, g.dtype, static_cast<cudaStream_t>(a.stream));
    return;
  }
  sm80::launch_fwd_sm80(p, plan_tile(g, plan), g.dtype, static_cast<int>(p.view.num_tasks),
                        static_cast<cudaStream_t>(a.stream));
}

void launch_flex_bwd(const FlexBwdLaunch& a) {
  FS_CHECK(a.geometry != nullptr && a.plan != nullptr, Status::kInternal, "launch_flex_bwd: geometry/plan missing");
  const FlexGeometry& g = *a.geometry;
  const MaskPlan& plan = *a.plan;
  FS_CHECK(plan.on_device(), Status::kInternal, "mask_plan: launch_flex_bwd needs a CUDA plan");
  const size_t need = flex_bwd_workspace_size(g, plan, a.deterministic);
  FS_CHECK_ARG(a.workspace_bytes >= need && (need == 0 || a.workspace != nullptr), "workspace: needs ", need,
               " bytes, got ", a.workspace_bytes);
  FS_CHECK_ARG(reinterpret_cast<uintptr_t>(a.workspace) % 16 == 0, "workspace: must be 16-byte aligned");
  const struct {
    const TensorView* t;
    const char* name;
  } vec[] = {{&a.q, "q"}, {&a.k, "k"}, {&a.v, "v"}, {&a.out, "out"}, {&a.dout, "dout"},
             {&a.dq, "dq"}, {&a.dk, "dk"}, {&a.dv, "dv"}};
  for (const auto& x : vec) check_vec_aligned(*x.t, x.name);

  BwdParams p;
  p.q = a.q.data;
  p.k = a.k.data;
  p.v = a.v.data;
  p.o = a.out.data;
  p.dout = a.dout.data;
  p.dq = a.dq.data;
  p.dk = a.dk.data;
  p.dv = a.dv.data;
  p.qa = qkv_addr(a.q, g.varlen);
  p.ka = qkv_addr(a.k, g.varlen);
  p.va = qkv_addr(a.v, g.varlen);
  p.oa = qkv_addr(a.out, g.varlen);
  p.doa = qkv_addr(a.dout, g.varlen);
  p.dqa = qkv_addr(a.dq, g.varlen);
  p.dka = qkv_addr(a.dk, g.varlen);
  p.dva = qkv_addr(a.dv, g.varlen);
  p.lse = a.lse.ptr<const float>();
  p.lsea = lse_addr(a.lse, g.varlen);
  if (a.dlse.defined()) {
    p.dlse = a.dlse.ptr<const float>();
    p.dlsea = lse_addr(a.dlse, g.varlen);
  }
  const bool sm90_plan = plan.signature.consumer.arch == 90;
  const BwdWorkspaceLayout wl = bwd_workspace_layout(g, plan.signature, a.deterministic);
  char* ws = static_cast<char*>(a.workspace);
  p.delta = reinterpret_cast<float*>(ws + wl.delta);
  p.lse2 = reinterpret_cast<float*>(ws + wl.lse2);
  p.deterministic = a.deterministic ? 1 : 0;
  // The Hopper backward where it covers the call (same backward tile and split schedule as the
  // sm80 kernels; dQ accumulated in 64-row tiles, which the workspace of an sm90 plan has room
  // for, deterministic or not).
  const bool run_sm90 = sm90_plan && sm90::bwd_enabled() && sm90::bwd_config_supported(g, a.deterministic);
  // A plan with a wide backward tile ((64, 64) 128 x 128, (192, 128) 64 x 96: tile_sm90.h) has no
  // sm80 backward: it is only built while the sm90 backward takes every call
  // (sm90::bwd_wide64_enabled / bwd_wide192_enabled), so this refuses only a call after an in-process
  // switch (set_bwd_enabled(0)) or an fp32 call.
  const Consumer& bc = plan.signature.consumer;
  FS_CHECK_SUPPORTED(run_sm90 || !sm90_plan || !sm90::bwd_wide_tile_sm90(g.head_dim_qk, g.head_dim_v, bc.bwd_block_q, bc.bwd_block_k),
                     "mask_plan: backward tile ", bc.bwd_block_q, "x", bc.bwd_block_k, " of head dims (", g.head_dim_qk, ", ", g.head_dim_v, ") runs on "
                     "the sm90 backward only, which does not take this call (FLASHSPAN_SM90_BWD=0 or set_bwd_enabled(0)",
                     a.deterministic ? ", or FLASHSPAN_SM90_BWD_DETERMINISTIC=0 for a deterministic call" : "",
                     "): rebuild the plan with the switches as they are now, or with arch=80");
  p.dq_accum = a.deterministic && !run_sm90 ? nullptr : reinterpret_cast<float*>(ws + wl.dq_accum);
  p.total_q = g.total_q;
  p.seqlen_q = g.varlen ? 0 : g.max_seqlen_q;
  p.cu_seqlens_q = plan_array(plan, "cu_seqlens_q");
  p.cu_seqlens_k = plan_array(plan, "cu_seqlens_k");
  p.varlen = g.varlen ? 1 : 0;
  p.batch = g.batch;
  p.num_heads_q = g.num_heads_q;
  p.group_size = g.num_heads_q / g.num_heads_kv;
  p.mask_per_head = g.num_heads_mask == 1 ? 0 : 1;
  p.head_dqk = g.head_dim_qk;
  p.head_dv = g.head_dim_v;
  p.scale = a.softmax_scale;
  p.scale_log2 = a.softmax_scale * 1.4426950408889634f;
  p.view = plan.bwd_view();
  const int64_t all_blocks = int64_t(g.num_heads_kv) * p.view.num_k_blocks;
  p.grid_mode = p.view.num_tasks == all_blocks ? 0 : 1;
  if (!a.deterministic && !p.grid_mode && p.view.num_tasks > 0) {
    // Split schedule of the dK/dV kernel (bwd_split.cuh); num_ctas is set at launch.
    FS_CHECK(p.view.num_tasks <= wl.max_tasks, Status::kInternal, "mask_plan: ", p.view.num_tasks,
             " backward tasks exceed the workspace bound ", wl.max_tasks);
    FS_CHECK(p.view.block_k == plan.signature.consumer.bwd_block_k, Status::kInternal,
             "mask_plan: backward key block ", p.view.block_k, " is not its consumer's (the workspace layout's) ",
             plan.signature.consumer.bwd_block_k);
    wl.bind(p.split, ws);
    p.split.dk_accum = reinterpret_cast<float*>(ws + wl.dk_accum);
    p.split.dv_accum = reinterpret_cast<float*>(ws + wl.dv_accum);
    p.split.num_tasks = static_cast<int>(p.view.num_tasks);
    p.split_schedule = 1;
  }

  if (run_sm90) {
    p.dq_blocked = 1;
    // The L2 rule of the head order (16-bit): the non-deterministic cell order's, and (experimental) the
    // deterministic list's heads slowest (BwdParams::det_band) when its switch leaves the band to the rule.
    auto heads_slowest_by_l2 = [&] {
      return sm90::bwd_cell_order_sm90(g.total_q, g.head_dim_qk, g.head_dim_v, 2, l2_cache_bytes());
    };
    bool cell_order = false;
    if (a.deterministic) {
      const int band = sm90::bwd_det_band_forced();  // 0: the rule
      p.det_band = band > 0 ? band : heads_slowest_by_l2() ? kDetBandAll : 1;
    } else {
      const int forced = sm90::bwd_cell_order_forced();
      cell_order = forced >= 0 ? forced == 1 : heads_slowest_by_l2();
    }
    if (a.deterministic || cell_order) {
      // Deterministic: every key block of every kv head in descending order, heads fastest or
      // (experimental, BwdParams::det_band) in bands head by head (the cells are the split schedule's
      // tasks, long walks cut into items: bwd_split.cuh, deterministic form), the dQ tiles added in
      // descending key-block order through their counters (kernel_bwd_sm90.cuh).
      // Cell order (non-deterministic): every cell, heads slowest, key blocks ascending
      // (kGridCellsAscending), so that the CTAs running at once walk the query
      // blocks of one head's neighbouring key blocks: their Q, dO and dQ tiles are shared in L2.
      if (a.deterministic) p.dq_sem = reinterpret_cast<int32_t*>(ws + wl.dq_sem);
      p.grid_mode = a.deterministic ? 1 : kGridCellsAscending;
      const int64_t cells = int64_t(g.num_heads_kv) * p.view.num_k_blocks;
      FS_CHECK(cells <= wl.max_tasks && p.view.block_k == plan.signature.consumer.bwd_block_k, Status::kInternal,
               "mask_plan: ", cells, " backward cells exceed the workspace bound ", wl.max_tasks,
               " or the key block ", p.view.block_k, " is not its consumer's");
      wl.bind(p.split, ws);
      p.split.dk_accum = reinterpret_cast<float*>(ws + wl.dk_accum);
      p.split.dv_accum = reinterpret_cast<float*>(ws + wl.dv_accum);
      p.split.num_tasks = static_cast<int>(cells);
      p.split.split_first = cell_order && sm90::bwd_split_first_enabled() ? 1 : 0;
      p.split_schedule = cells > 0 ? 1 : 0;
    }
    sm90::launch_bwd_sm90(p, a.q, a.k, a.v, a.dout, g.dtype, g.total_q, static_cast<cudaStream_t>(a.stream));
    return;
  }
  sm80::BwdLaunchSm80 cfg;
  cfg.num_q_blocks = static_cast<int>(p.view.num_q_blocks);
  cfg.num_bwd_tasks = static_cast<int>(p.grid_mode ? p.view.num_k_blocks : p.view.num_tasks);
  cfg.total_q = g.total_q;
  sm80::launch_bwd_sm80(p, sm80::tile_sm80(g.head_dim_qk, g.head_dim_v), g.dtype, cfg,
                        static_cast<cudaStream_t>(a.stream));
}

}  // namespace flashspan
