// Launch of the sm90 flex forward (kernel_fwd_sm90.cuh): the support answers, the tensor maps
// of Q, K, V (encoded on the host per call: no stream operation, so capture-safe; their inner
// extent is the call's true head dim, so smaller dims than the kernel's read zeros past it), and
// the choice of the kernel head dims from the tile table (tile_sm90.h). The kernels themselves
// are instantiated one unit per kernel head dims (fwd_sm90_d{64,128,192,256}.cu,
// fwd_sm90_run.cuh): (64, 64), (128, 128), (192, 128), (256, 256) x {fp16, bf16} x
// {max_logit off, on} x {serial, overlapped consumers}. Packed GQA is a run-time
// path of the same kernels (p.pack; Q's tensor map over (D, H, S[, B]): tma_sm90.h). The SDPA
// launches (analytic mask): launch_sdpa_fwd_sm90 (16-bit) and launch_sdpa_fp8_fwd_sm90 (FP8:
// the V^T pre-pass, then the FP8 kernel).
#include <cuda.h>

#include <atomic>
#include <cstdlib>
#include <cstdint>
#include <cstring>
#include <mutex>

#include "core/error.h"
#include "kernels/common/analytic_mask.h"
#include "kernels/common/fwd_launch.h"
#include "kernels/common/launch_util.h"
#include "kernels/sm90/fwd_sm90_run.h"
#include "kernels/sm90/launch_sm90.h"
#include "kernels/sm90/sample_maps_sm90.h"
#include "kernels/sm90/tile_sm90.h"
#include "kernels/sm90/tma_sm90.h"

namespace flashspan::sm90 {

bool fwd_overlap_sm90() {
  static const bool on = [] {
    const char* e = std::getenv("FLASHSPAN_SM90_OVERLAP");
    return e == nullptr || e[0] != '0';
  }();
  return on;
}

namespace {
std::atomic<int> g_packed_override{-1};
std::atomic<int64_t> g_fwd_launches{0};
std::atomic<int64_t> g_sdpa_fwd_launches{0};
std::atomic<int64_t> g_sdpa_fwd_drop_launches{0};
std::atomic<int64_t> g_sdpa_fp8_fwd_launches{0};
std::atomic<int64_t> g_sdpa_fwd_paged_launches{0};
// On unless the environment sets FLASHSPAN_SM90_PACK_GQA=0 (then packed plans keep the sm80
// family, for comparison), read once when the library is loaded, so that which plans take this
// path does not depend on which call reads it first. On since PERF_LOG v2.0: 1.45-1.62x the sm80
// packed forward on the pack_gqa_bench shapes it takes, after the GPU suite and the sanitizers
// passed with it (v1.8).
const bool g_packed_env = [] {
  const char* e = std::getenv("FLASHSPAN_SM90_PACK_GQA");
  return !(e != nullptr && std::strcmp(e, "0") == 0);
}();

// The map of a staged SDPA bias (kernel_fwd_sm90.cuh load_bias: a 16-bit bias of whole aligned rows, bp.chunks set),
// boxes of the query block's rows or, broadcast over rows, of row 0; where the driver refuses the map (a layout TMA
// cannot describe) bp.chunks is cleared and the kernel reads the bias element by element. Any bytes when nothing is
// staged. `bias`: the bias's descriptor (required when staged); `what` names the caller in the internal error.
CUtensorMap staged_bias_map(SdpaBiasParams& bp, const TensorView* bias, int block_q, const char* what) {
  CUtensorMap m{};
  if (bp.chunks != 0) {
    FS_CHECK(bias != nullptr, Status::kInternal, what, ": a staged bias without its descriptor");
    if (!make_tensor_map_bias_sm90(*bias, bp.row_stride == 0 ? 1 : block_q, &m)) bp.chunks = 0;
  }
  return m;
}
}  // namespace

void set_fwd_packed_enabled(int on) { g_packed_override.store(on < 0 ? -1 : (on ? 1 : 0), std::memory_order_relaxed); }

bool fwd_packed_enabled() {
  const int o = g_packed_override.load(std::memory_order_relaxed);
  return o >= 0 ? o == 1 : g_packed_env;
}

int64_t fwd_launches() { return g_fwd_launches.load(std::memory_order_relaxed); }
int64_t sdpa_fwd_launches() { return g_sdpa_fwd_launches.load(std::memory_order_relaxed); }
int64_t sdpa_fwd_drop_launches() { return g_sdpa_fwd_drop_launches.load(std::memory_order_relaxed); }
int64_t sdpa_fp8_fwd_launches() { return g_sdpa_fp8_fwd_launches.load(std::memory_order_relaxed); }
int64_t sdpa_fwd_paged_launches() { return g_sdpa_fwd_paged_launches.load(std::memory_order_relaxed); }

bool fwd_config_supported(const FlexGeometry& g, bool pack_gqa) {
  const bool packed = pack_gqa && g.num_heads_kv > 0 && g.group_size() > 1;
  return (g.dtype == DType::kFloat16 || g.dtype == DType::kBFloat16) &&
         fwd_runs_head_dims_sm90(g.head_dim_qk, g.head_dim_v) &&
         (!packed || (fwd_packed_enabled() && fwd_runs_pack_sm90(g.group_size())));
}

bool device_supported(int device_id) {
  static std::mutex mu;
  static int state[64] = {};  // 0 unknown, 1 yes, 2 no
  if (device_id < 0 || device_id >= 64) return false;
  std::lock_guard<std::mutex> lock(mu);
  if (state[device_id] == 0) {
    bool ok = false;
    int major = 0, minor = 0, prev = 0;
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device_id) == cudaSuccess &&
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device_id) == cudaSuccess && major == 9 &&
        minor == 0 && cudaGetDevice(&prev) == cudaSuccess && cudaSetDevice(device_id) == cudaSuccess) {
      // The binary the runtime loads for this device: 90 only when sm_90a code was built.
      ok = fwd_binary_version_of<128, 128>() == 90;
      (void)cudaSetDevice(prev);
    }
    (void)cudaGetLastError();
    state[device_id] = ok ? 1 : 2;
  }
  return state[device_id] == 1;
}

int fwd_smem_bytes(int dqk, int dv) {
  if (!fwd_runs_head_dims_sm90(dqk, dv)) return 0;
  const TileSm90 t = tile_sm90(dqk, dv);
  switch (t.dqk_tile) {
    case 64: return fwd_smem_bytes_of<64, 64>();
    case 128: return fwd_smem_bytes_of<128, 128>();
    case 192: return fwd_smem_bytes_of<192, 128>();
    default: return fwd_smem_bytes_of<256, 256>();
  }
}

void launch_fwd_sm90(const FwdParams& p, const TensorView& q, const TensorView& k, const TensorView& v,
                     DType dtype, cudaStream_t stream) {
  const TileSm90 t = tile_sm90(p.head_dqk, p.head_dv);
  FS_CHECK(fwd_runs_pack_sm90(p.pack) && fwd_runs_head_dims_sm90(p.head_dqk, p.head_dv) && p.view.block_q == t.fwd_bq &&
               p.view.block_k == t.fwd_bk,
           Status::kInternal, "sm90 forward: unsupported configuration reached the launcher (D ", p.head_dqk, "/", p.head_dv,
           ", tile ", p.view.block_q, "x", p.view.block_k, ", pack ", p.pack, ")");
  g_fwd_launches.fetch_add(1, std::memory_order_relaxed);
  if (p.max_logit != nullptr) launch_max_logit_reset(p.max_logit, p.num_heads_q, stream);
  if (p.view.num_q_blocks == 0 || (!p.grid_mode && p.view.num_tasks == 0)) return;
  const bool varlen = p.varlen != 0;
  const CUtensorMap mq = make_tensor_map_sm90(q, varlen, dtype, t.fwd_bq, "q", p.pack);
  const CUtensorMap mk = make_tensor_map_sm90(k, varlen, dtype, t.fwd_bk, "k");
  const CUtensorMap mv = make_tensor_map_sm90(v, varlen, dtype, t.fwd_bk, "v");
  switch (t.dqk_tile) {
    case 64: run_fwd_sm90<64, 64>(p, dtype, mq, mk, mv, stream); break;
    case 128: run_fwd_sm90<128, 128>(p, dtype, mq, mk, mv, stream); break;
    case 192: run_fwd_sm90<192, 128>(p, dtype, mq, mk, mv, stream); break;
    default: run_fwd_sm90<256, 256>(p, dtype, mq, mk, mv, stream); break;
  }
}

namespace {
// The SDPA forward's items in groups of (sample, head) pairs whose K / V share L2 (fwd_l2_group: by a query head's
// share of its K / V head's bytes; by default calls without a left bound or a block mask), for both 16-bit launchers;
// grouped cells of unequal cost (a band, a block mask) claimed through the workspace's counter where dispatch bound
// one (fwd_claim; zeroed here), else in snake waves. A group of every pair is the ungrouped order.
void set_sdpa_fwd_l2_group(SdpaFwdParams& p, cudaStream_t stream) {
  AnalyticMaskParams& a = p.analytic;
  const bool windowed = a.band.has_left != 0 || a.block_mask.bits != nullptr;
  const int g = fwd_l2_group(int64_t(a.max_kv) * (p.head_dqk + p.head_dv) * 2 / p.group_size, !windowed);
  bind_l2_group(a, g, int64_t(p.num_heads_q) * p.batch, fwd_claim(a.item_counter != nullptr), stream,
                "sdpa forward (sm90): item counter reset");
}
}  // namespace

void launch_sdpa_fwd_sm90(const SdpaFwdParams& p_in, const TensorView& q, const TensorView& k, const TensorView& v,
                          const TensorView* bias, DType dtype, void* workspace, size_t workspace_bytes,
                          cudaStream_t stream) {
  SdpaFwdParams p = p_in;
  const TileSm90 t = tile_sm90(p.head_dqk, p.head_dv);
  FS_CHECK(sdpa_fwd_runs_head_dims_sm90(p.head_dqk, p.head_dv) && p.pack == 1 && p.split_schedule == 0,
           Status::kInternal, "sdpa forward (sm90): unsupported configuration reached the launcher (D ", p.head_dqk,
           "/", p.head_dv, ")");
  // Packed (THD) q, k or v: per-sample maps (sample_maps_sm90.h); a packed O / stats: the epilogue's rows at
  // the samples' starts (AnalyticSourceSm90::rows).
  const bool packed_qkv = sample_maps_packed(p.analytic, {kSdpaQ, kSdpaK, kSdpaV}, p.batch, kSampleMapsFwd,
                                             workspace, workspace_bytes, "sdpa forward (sm90)");
  // H_k != H_v runs (the producer loads V of each query head's own V head: kv_addr.cuh v_head); dropout
  // (sdpa_family.cpp: unless FLASHSPAN_SM90_SDPA_DROPOUT=0) on the kernel with dropout below.
  g_sdpa_fwd_launches.fetch_add(1, std::memory_order_relaxed);
  if (p.max_logit != nullptr) launch_max_logit_reset(p.max_logit, p.num_heads_q, stream);
  launch_sdpa_fwd_rng_dump(p, stream);  // (the sm80 launcher's: fwd_launch.h)
  p.analytic.num_q_blocks = (p.analytic.max_q + t.fwd_bq - 1) / t.fwd_bq;
  if (p.analytic.num_q_blocks == 0 || p.batch == 0 || p.num_heads_q == 0) return;
  set_sdpa_fwd_l2_group(p, stream);
  // Padded tensors: sample b is batch b (the tensor maps' batch coordinate; the epilogue's
  // TensorAddr batch strides).
  p.varlen = 0;
  p.oa.batch_stride = p.analytic.start[kSdpaO].batch_stride;
  p.lsea.batch_stride = p.analytic.start[kSdpaStats].batch_stride;
  // Packed q, k or v: every one of the three through its samples' maps (the templates: one sample's
  // extent, batch extent 1), which a pre-pass writes into the workspace on the stream.
  const TensorView vq = sample_map_view(bshd_of_bhsd(q), packed_qkv, workspace);
  const TensorView vk = sample_map_view(bshd_of_bhsd(k), packed_qkv, workspace);
  const TensorView vv = sample_map_view(bshd_of_bhsd(v), packed_qkv, workspace);
  const CUtensorMap mq = make_tensor_map_sm90(vq, false, dtype, t.fwd_bq, "q");
  const CUtensorMap mk = make_tensor_map_sm90(vk, false, dtype, t.fwd_bk, "k");
  const CUtensorMap mv = make_tensor_map_sm90(vv, false, dtype, t.fwd_bk, "v");
  int32_t* sample_flags = nullptr;
  if (packed_qkv) {
    const SampleStart* st = p.analytic.start;
    const SampleMapsJob job =
        sample_maps_job(p.analytic, {{mq, vq, st[kSdpaQ]}, {mk, vk, st[kSdpaK]}, {mv, vv, st[kSdpaV]}});
    sample_flags = launch_sample_maps_sm90(job, p.batch, workspace, stream);
    p.analytic.sample_maps = workspace;
  }
  // A 16-bit bias of whole aligned rows is staged by the producer (kernel_fwd_sm90.cuh load_bias).
  const CUtensorMap mbias = staged_bias_map(p.analytic.bias, bias, t.fwd_bq, "sdpa forward (sm90)");
  // The instantiation with the score modifiers, sinks and epilogue options when the call has any
  // (sdpa_family.cpp lets them through unless FLASHSPAN_SM90_SDPA_MODS=0, head dims up to 128), the one
  // with dropout besides when it has dropout (sdpa_family.cpp: unless FLASHSPAN_SM90_SDPA_DROPOUT=0), else
  // the pure-mask one, whose code has none of them.
  const AnalyticMaskParams& a = p.analytic;
  const bool drop = a.dropout.mode != 0;
  const bool mods = drop || a.score.softcap2 != 0.0f || a.score.alibi_n > 0 || a.score.sink != nullptr ||
                    a.bias.bias != nullptr || a.epi.gate != nullptr || a.epi.score_max != nullptr ||
                    a.epi.score_sum_exp != nullptr;
  FS_CHECK(!mods || t.dqk_tile <= 128, Status::kInternal,
           "sdpa forward (sm90): score modifiers or dropout with head dims above 128 reached the launcher");
  if (drop) g_sdpa_fwd_drop_launches.fetch_add(1, std::memory_order_relaxed);
  switch (t.dqk_tile) {
    case 64:
      drop   ? run_sdpa_fwd_sm90<64, 64, true, true>(p, dtype, mq, mk, mv, mbias, stream)
      : mods ? run_sdpa_fwd_sm90<64, 64, true>(p, dtype, mq, mk, mv, mbias, stream)
             : run_sdpa_fwd_sm90<64, 64, false>(p, dtype, mq, mk, mv, mbias, stream);
      break;
    case 128:
      drop   ? run_sdpa_fwd_sm90<128, 128, true, true>(p, dtype, mq, mk, mv, mbias, stream)
      : mods ? run_sdpa_fwd_sm90<128, 128, true>(p, dtype, mq, mk, mv, mbias, stream)
             : run_sdpa_fwd_sm90<128, 128, false>(p, dtype, mq, mk, mv, mbias, stream);
      break;
    case 192: run_sdpa_fwd_sm90<192, 128, false>(p, dtype, mq, mk, mv, mbias, stream); break;
    default: run_sdpa_fwd_sm90<256, 256, false>(p, dtype, mq, mk, mv, mbias, stream); break;
  }
  if (sample_flags != nullptr) launch_sample_poison_sm90(p, dtype, sample_flags, stream);
}

void launch_sdpa_fwd_paged_sm90(const SdpaPagedFwdSm90Params& p_in, const TensorView& q, const TensorView& k,
                                const TensorView& v, const TensorView* bias, DType dtype, void* maps,
                                size_t maps_bytes, cudaStream_t stream) {
  SdpaPagedFwdSm90Params p = p_in;
  const TileSm90 t = tile_sm90(p.head_dqk, p.head_dv);
  const AnalyticMaskParams& a = p.analytic;
  // K / V through the page tables (a paged side's sample start is the container's, zeroed by dispatch; a packed
  // contiguous side is refused there: sdpa_fwd_sm90_paged_refusal).
  const bool ragged_kv = a.start[kSdpaK].ragged.ptr != nullptr || a.start[kSdpaV].ragged.ptr != nullptr;
  // A paged side: pages of 8 keys or more (boxes of whole swizzle atoms), a container of at least one page (its
  // map's page extent; an entry outside it is never a coordinate: kv_addr.cuh PagedKv::tma_box).
  auto side_ok = [](const SdpaPagedSide& s, const TensorView& c) {
    return s.table == nullptr || (s.log2_page >= 3 && s.num_pages >= 1 && c.ndim == 4 && c.size(0) == s.num_pages);
  };
  FS_CHECK(sdpa_fwd_runs_head_dims_sm90(p.head_dqk, p.head_dv) && t.dqk_tile <= 128 && p.pack == 1 &&
               p.split_schedule == 0 && !ragged_kv && a.dropout.mode == 0 && a.dropout.rng_dump == nullptr &&
               p.bad_samples != nullptr &&
               side_ok(p.paged_k, k) && side_ok(p.paged_v, v),
           Status::kInternal, "sdpa paged forward (sm90): unsupported configuration reached the launcher (D ",
           p.head_dqk, "/", p.head_dv, ")");
  // Packed (THD) q (on by default: dispatch's sdpa_sm90_paged_thd_enabled): per-sample maps of q alone, in slot kSdpaQ
  // of kSampleMapsFwd a sample (the producer acquires and loads q through it as the unpaged kernel does:
  // kernel_fwd_sm90.cuh with_kv_map). A packed o / stats / gate needs no map: the epilogue writes them at the
  // samples' starts (AnalyticSourceSm90::rows, the gate's sample_start).
  const bool packed_q = sample_maps_packed(a, {kSdpaQ}, p.batch, kSampleMapsFwd, maps, maps_bytes,
                                           "sdpa paged forward (sm90)");
  g_sdpa_fwd_paged_launches.fetch_add(1, std::memory_order_relaxed);
  if (p.max_logit != nullptr) launch_max_logit_reset(p.max_logit, p.num_heads_q, stream);
  p.analytic.num_q_blocks = (p.analytic.max_q + t.fwd_bq - 1) / t.fwd_bq;
  if (p.analytic.num_q_blocks == 0 || p.batch == 0 || p.num_heads_q == 0) return;
  set_sdpa_fwd_l2_group(p, stream);
  const TensorView vq = sample_map_view(bshd_of_bhsd(q), packed_q, maps);
  const CUtensorMap mq = make_tensor_map_sm90(vq, false, dtype, t.fwd_bq, "q");
  if (packed_q) {
    // The pre-pass writes every sample's flag (1: q's start not 16-byte aligned) before the kernel, so its flags are
    // the kernel's bad_samples too: one reset, one fill for both faults.
    p.bad_samples = launch_sample_maps_sm90(sample_maps_job(a, {{mq, vq, a.start[kSdpaQ]}}, 2, kSampleMapsFwd), p.batch,
                                            maps, stream);
    p.analytic.sample_maps = maps;
  } else {
    check_cuda(cudaMemsetAsync(p.bad_samples, 0, size_t(p.batch) * sizeof(int32_t), stream),
               "sdpa paged forward (sm90): flags reset");
  }
  // q / o / stats: sample b is batch b of padded tensors, a packed one's sample at its start (as
  // launch_sdpa_fwd_sm90).
  p.varlen = 0;
  p.oa.batch_stride = p.analytic.start[kSdpaO].batch_stride;
  p.lsea.batch_stride = p.analytic.start[kSdpaStats].batch_stride;
  // A paged side: the container [num_pages, H, page_size, D] as (column, row, head, page), boxes of
  // min(page_size, kBlockK) rows (kv_addr.cuh PagedKv::tma_log2_box); a side without a table: its own map.
  auto side_map = [&](const TensorView& c, const SdpaPagedSide& s, const char* name) {
    const int box = s.table == nullptr ? t.fwd_bk : std::min(1 << std::min(s.log2_page, 30), t.fwd_bk);
    return make_tensor_map_sm90(bshd_of_bhsd(c), false, dtype, box, name);
  };
  const CUtensorMap mk = side_map(k, p.paged_k, "k");
  const CUtensorMap mv = side_map(v, p.paged_v, "v");
  // The additive bias (on by default: dispatch's sdpa_sm90_paged_bias_enabled) as launch_sdpa_fwd_sm90 takes it: it
  // indexes keys by their position in the sample, not through the pages, so a 16-bit bias of whole aligned rows is
  // staged by the producer through its own map (kernel_fwd_sm90.cuh load_bias), any other read element by element.
  const CUtensorMap mbias = staged_bias_map(p.analytic.bias, bias, t.fwd_bq, "sdpa paged forward (sm90)");
  // The bias kernel is the (128, 128) one's alone (fwd_sm90_run.cuh run_sdpa_fwd_paged_sm90): smaller head dims with
  // a bias run on it (the maps' zero fill past the true dims, as the unpaged kernels' D = 72 .. 120).
  if (t.dqk_tile == 64 && a.bias.bias == nullptr) {
    run_sdpa_fwd_paged_sm90<64, 64>(p, dtype, mq, mk, mv, mbias, stream);
  } else {
    run_sdpa_fwd_paged_sm90<128, 128>(p, dtype, mq, mk, mv, mbias, stream);
  }
  launch_sample_poison_sm90(p, dtype, p.bad_samples, stream);
}

namespace {
// The FP8 tensors' TMA and 16-byte-load rule: data 16-byte aligned, every stride but the last a
// multiple of 16 elements (bytes); a packed (ragged) tensor's batch dimension is its ragged offsets'
// (the sample maps' pre-pass flags a start not 16-byte aligned, the V^T pre-pass reads one bytewise).
void check_fp8_aligned(const TensorView& t, const char* name, bool ragged) {
  FS_CHECK_SUPPORTED(reinterpret_cast<uintptr_t>(t.data) % 16 == 0, name,
                     ": data pointer must be 16-byte aligned for the FP8 forward");
  for (int d = ragged ? 1 : 0; d + 1 < t.ndim; ++d) {
    FS_CHECK_SUPPORTED(t.shape[d] <= 1 || t.strides[d] % 16 == 0, name, ": stride ", t.strides[d], " of dimension ", d,
                       " must be a multiple of 16 elements for the FP8 forward (TMA)");
  }
}
}  // namespace

void launch_sdpa_fp8_fwd_sm90(const SdpaFp8FwdParams& p_in, const TensorView& q, const TensorView& k,
                              const TensorView& v, void* workspace, size_t workspace_bytes, cudaStream_t stream) {
  SdpaFp8FwdParams p = p_in;
  const SdpaFp8Params& f = p.fp8;
  FS_CHECK(sdpa_fp8_fwd_runs_head_dims_sm90(p.head_dqk, p.head_dv) && p.pack == 1 && p.split_schedule == 0 &&
               (f.format == 1 || f.format == 2) && f.o_format >= 0 && f.o_format <= 2,
           Status::kInternal, "sdpa fp8 forward (sm90): unsupported configuration reached the launcher (D ", p.head_dqk,
           "/", p.head_dv, ", formats ", f.format, " / ", f.o_format, ")");
  FS_CHECK(f.amax_s != nullptr && f.amax_o != nullptr, Status::kInternal,
           "sdpa fp8 forward (sm90): an amax pointer is missing");
  // Packed (THD) q or k (experimental, dispatch's sdpa_fp8_sm90_thd_enabled): per-sample maps (sample_maps_sm90.h) of
  // both, the first two of each sample's kSampleMapsFwd slots (the 16-bit forward's workspace layout); a packed V:
  // the V^T pre-pass reads it at its samples' starts (fp8_vt_sm90.cuh); a packed O / stats: the epilogue's rows at
  // the samples' starts (AnalyticSourceSm90::rows).
  const bool ragged_v = p.analytic.start[kSdpaV].ragged.ptr != nullptr;
  const bool packed_qk = sample_maps_packed(p.analytic, {kSdpaQ, kSdpaK}, p.batch, kSampleMapsFwd, workspace,
                                            workspace_bytes, "sdpa fp8 forward (sm90)");
  const AnalyticMaskParams& a = p.analytic;
  FS_CHECK(a.dropout.mode == 0 && a.dropout.rng_dump == nullptr && a.score.group_v > 0 &&
               p.num_heads_q % a.score.group_v == 0 && v.ndim == 4 && v.shape[1] == p.num_heads_q / a.score.group_v &&
               a.score.softcap2 == 0.0f && a.score.alibi_n == 0 && a.score.sink == nullptr && a.bias.bias == nullptr &&
               a.epi.gate == nullptr,
           Status::kInternal, "sdpa fp8 forward (sm90): dropout, a score modifier or V's head count (H_q / group_v) "
           "outside what it runs reached the launcher");
  check_fp8_aligned(q, "q", p.analytic.start[kSdpaQ].ragged.ptr != nullptr);
  check_fp8_aligned(k, "k", p.analytic.start[kSdpaK].ragged.ptr != nullptr);
  check_fp8_aligned(v, "v", ragged_v);
  g_sdpa_fp8_fwd_launches.fetch_add(1, std::memory_order_relaxed);
  // The amaxes are maxima of non-negative values reduced with atomics: zero first.
  check_cuda(cudaMemsetAsync(f.amax_s, 0, sizeof(float), stream), "sdpa fp8 forward: amax_s reset");
  check_cuda(cudaMemsetAsync(f.amax_o, 0, sizeof(float), stream), "sdpa fp8 forward: amax_o reset");
  if (p.max_logit != nullptr) launch_max_logit_reset(p.max_logit, p.num_heads_q, stream);
  const int kd = sdpa_fp8_fwd_kernel_dim_sm90(p.head_dqk, p.head_dv);
  const TileSm90 t = tile_sm90(kd, kd);
  p.analytic.num_q_blocks = (p.analytic.max_q + t.fwd_bq - 1) / t.fwd_bq;
  if (p.analytic.num_q_blocks == 0 || p.batch == 0 || p.num_heads_q == 0) return;
  p.varlen = 0;
  p.oa.batch_stride = p.analytic.start[kSdpaO].batch_stride;
  p.lsea.batch_stride = p.analytic.start[kSdpaStats].batch_stride;
  // V^T first (the kernel's B operand of P V), then the forward, on the stream.
  const int64_t keys = fp8_vt_keys_sm90(p.analytic.max_kv);
  FS_CHECK(keys == 0 || f.v_t != nullptr, Status::kInternal, "sdpa fp8 forward (sm90): no V^T workspace");
  launch_sdpa_fp8_vt_sm90(p, stream);
  // V^T as a BSHD-shaped view [B, D_v rows, H_v, keys]: boxes of 128 keys x kD rows (rows past D_v
  // zero filled). Without keys no key block is walked and the map is never read: it is given the
  // shape of one block over q's data (or the workspace's, a packed q of 0 tokens having none).
  const int64_t heads_v = p.num_heads_q / a.score.group_v, vt_keys = keys > 0 ? keys : t.fwd_bk;
  TensorView vt = q;
  vt.data = keys > 0 ? f.v_t : q.data != nullptr ? q.data : workspace;
  vt.ndim = 4;
  vt.shape = {p.batch, p.head_dv, heads_v, vt_keys};
  vt.strides = {heads_v * p.head_dv * vt_keys, vt_keys, p.head_dv * vt_keys, 1};
  const int cols = kd < 128 ? kd : 128;  // a Q / K box: one row of the kernel's head dim, or 128 bytes of it
  // Packed q or k: both through their samples' maps (the templates: one sample's extent, batch extent 1).
  const TensorView vq = sample_map_view(bshd_of_bhsd(q), packed_qk, workspace);
  const TensorView vk = sample_map_view(bshd_of_bhsd(k), packed_qk, workspace);
  const CUtensorMap mq = make_tensor_map_fp8_sm90(vq, cols, t.fwd_bq, "q");
  const CUtensorMap mk = make_tensor_map_fp8_sm90(vk, cols, t.fwd_bk, "k");
  const CUtensorMap mvt = make_tensor_map_fp8_sm90(vt, t.fwd_bk, kd, "v (V^T workspace)");
  int32_t* sample_flags = nullptr;
  if (packed_qk) {
    // (Slot kSdpaV unwritten: V^T is the pre-pass's padded workspace.)
    const SampleMapsJob job =
        sample_maps_job(a, {{mq, vq, a.start[kSdpaQ]}, {mk, vk, a.start[kSdpaK]}}, /*elem_bytes=*/1, kSampleMapsFwd);
    sample_flags = launch_sample_maps_sm90(job, p.batch, workspace, stream);
    p.analytic.sample_maps = workspace;
  }
  if (kd == 64) {
    run_sdpa_fp8_fwd_sm90<64, 64>(p, mq, mk, mvt, stream);
  } else {
    run_sdpa_fp8_fwd_sm90<128, 128>(p, mq, mk, mvt, stream);
  }
  // A flagged sample (a start not 16-byte aligned): NaN over its O (0x7F, either format) and stats rows.
  if (sample_flags != nullptr) launch_sample_poison_sm90(p, DType::kFloat8E4M3, sample_flags, stream);
}

}  // namespace flashspan::sm90
