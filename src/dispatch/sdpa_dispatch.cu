// SDPA on the GPU (sdpa_launch.h): the device checks, and the launches of a validated, bound
// sdpa::Problem on the sm80 kernels with the analytic mask (launch_sdpa_fwd_sm80 /
// launch_sdpa_bwd_sm80), or the sm90 ones where sdpa_family.cpp's rule chooses them
// (launch_sdpa_fwd_sm90 / launch_sdpa_bwd_sm90), or the decode forward where its rule takes a call
// (launch_sdpa_fwd_decode_sm80), with the parameters of sdpa_params.cpp. Nothing is read back from the
// device: sequence lengths and ragged offsets stay in device memory, where the kernels read them.
#include <cuda_runtime.h>

#include <cmath>

#include "core/error.h"
#include "dispatch/sdpa_launch.h"
#include "dispatch/tensor_addr.h"
#include "kernels/common/fwd_launch.h"
#include "kernels/common/launch_util.h"
#include "kernels/sm80/launch_sm80.h"
#include "kernels/sm90/launch_sm90.h"
#include "kernels/sm90/sdpa_fp8_bwd_sm90.h"

namespace flashspan {

namespace {

using sdpa::Problem;

void check_vec_aligned_slots(const Problem& p, std::initializer_list<int> slots) {
  for (int s : slots) {
    if (p.has(s)) check_vec_aligned(p.t(s), sdpa::slot_name(s));
  }
}

// The tile of the sm80 kernels for the call's head dims (tile_sm80.h).
sm80::TileSm80 tile_of(const Problem& p) { return sm80::tile_sm80(static_cast<int>(p.Dqk), static_cast<int>(p.Dv)); }

// dBias together with softcap runs on the sm90 backward: its kernel with modifiers stores dBias's dS,
// P (dP - D), before softcap's factor 1 - t^2 (kernel_bwd_mods_sm90.cuh store_ds; the bias is added after
// softcap), while the sm80 kernels hold P (1 - t^2) at the dS step (docs/SDPA.md); with
// sdpa_dbias_softcap_sm80_enabled (on by default since its GPU test passed on an H200) the sm80 backward runs the
// calls the sm90 one does not take, its dK/dV kernel storing the fp32 P in the dS workspace at the logits step and
// P (dP - D) over it at the dS step (kernel_bwd_sm80.cuh). Checked at check_support and again at execute (the
// family switches are read per call); with dropout the sm90 backward refuses it (sm90_refusal), so the sm80 one runs
// it (sdpa_dbias_softcap_dropout_enabled; off, sdpa_check_features_gpu refuses it on every GPU). On unless
// FLASHSPAN_SDPA_DBIAS_SOFTCAP=0, the pair's one variable on both backwards (sdpa_dbias_softcap_enabled, and
// sdpa_dbias_softcap_sm80_enabled reads it too).
void check_dbias_with_softcap(const Problem& p) {
  if (!p.a.backward || p.fp8 || !p.has(FS_SDPA_DBIAS) || !p.a.softcap) return;
  FS_CHECK_SUPPORTED(sdpa_dbias_softcap_enabled(), "dBias together with softcap: turned off on CUDA tensors by "
                     "FLASHSPAN_SDPA_DBIAS_SOFTCAP=0 (unset, the sm90 backward runs it on an H100 / H200, head dims up "
                     "to 128, padded tensors, and the sm80 backward the other calls); CPU tensors run it on the CPU "
                     "reference");
  if (sdpa_bwd_runs_sm90(p)) return;
  if (sdpa_dbias_softcap_sm80_enabled()) return;  // the sm80 backward
  // (Reached through the overrides only: FLASHSPAN_SDPA_DBIAS_SOFTCAP=0 refused the pair above.) Why the sm90
  // backward does not take the call, in the terms of this pair (sm90_refusal's own words name the modifiers when
  // their kernels are out of reach).
  const char* r = sdpa_bwd_sm90_refusal(p);
  const char* why = !sdpa_bwd_sm90_enabled()                   ? "FLASHSPAN_KERNEL_FAMILY=sm80"
                    : p.Dqk > 128 || p.Dv > 128                ? "head dims above 128"
                    : !sdpa_bwd_sm90_mods_enabled()            ? "FLASHSPAN_SM90_SDPA_BWD_MODS=0"
                    : r != nullptr                             ? r
                                                               : "not an sm_90 device with this build's sm_90a code";
  throw Error(Status::kNotSupported,
              detail::concat("dBias together with softcap: runs on the sm90 backward (an H100 / H200 with this "
                             "build's sm_90a code; head dims up to 128, padded tensors), which does not take this "
                             "call on device cuda:", p.device_id, " (", why, "), and on the sm80 backward, whose path "
                             "for it is turned off (sdpa_dbias_softcap_sm80_enabled; on unless "
                             "FLASHSPAN_SDPA_DBIAS_SOFTCAP=0); CPU tensors run it on the CPU reference"));
}

// Zeroes every element of a tensor in device memory on the stream (memsets only; any strides with the last dim
// contiguous, which validation asks of every output): one memset for a contiguous tensor (TensorView::is_contiguous:
// its elements fill [data, data + numel)), else one 2-D memset of the last two dims per index of the others (the
// pitch, stride(-2), is at least the row's width: validation refuses outputs whose elements overlap).
void zero_on_stream(const TensorView& t, cudaStream_t stream, const char* what) {
  const size_t item = static_cast<size_t>(dtype_size(t.dtype));
  if (t.is_contiguous()) {
    check_cuda(cudaMemsetAsync(t.data, 0, static_cast<size_t>(t.numel()) * item, stream), what);
    return;
  }
  FS_CHECK(t.ndim >= 2 && (t.size(-1) <= 1 || t.stride(-1) == 1), Status::kInternal, what,
           ": an output without a contiguous last dim");
  const int64_t rows = t.size(-2), cols = t.size(-1);
  const size_t width = static_cast<size_t>(cols) * item;
  const size_t pitch = rows > 1 ? static_cast<size_t>(t.stride(-2)) * item : width;
  int64_t outer = 1;
  for (int d = 0; d < t.ndim - 2; ++d) outer *= t.shape[d];
  for (int64_t o = 0; o < outer; ++o) {
    int64_t off = 0, rest = o;
    for (int d = t.ndim - 3; d >= 0; --d) {
      off += (rest % t.shape[d]) * t.strides[d];
      rest /= t.shape[d];
    }
    check_cuda(cudaMemset2DAsync(static_cast<char*>(t.data) + off * static_cast<int64_t>(item), pitch, 0, width,
                                 static_cast<size_t>(rows), stream),
               what);
  }
}

// An empty batch (Problem::empty_batch, B = 0): the identity values of sdpa::empty_batch_fills (the rule the CPU
// reference follows too), on the stream; nothing else runs: no attention kernel, no workspace (its size is 0).
void fill_empty_batch_gpu(const Problem& p, cudaStream_t stream) {
  for (const sdpa::EmptyBatchFill& f : sdpa::empty_batch_fills(p)) {
    const TensorView& t = p.t(f.slot);
    if (f.value == 0.0f) {
      zero_on_stream(t, stream, "sdpa (empty batch): zero fill");
      continue;
    }
    // -inf: max_logit, [H_q] float32, compact (validation: Checker::small).
    FS_CHECK(std::isinf(f.value) && f.value < 0 && t.dtype == DType::kFloat32 && t.is_contiguous(),
             Status::kInternal, "sdpa (empty batch): ", sdpa::slot_name(f.slot), ": no device fill for its value");
    launch_max_logit_reset(static_cast<float*>(t.data), static_cast<int>(t.numel()), stream);
  }
}

}  // namespace

void sdpa_check_support_gpu(const Problem& p) {
  sdpa_check_features_gpu(p);
  check_dbias_with_softcap(p);
  if (p.fp8 && !p.a.backward) {
    // The sm90 FP8 forward where it runs the call (sdpa_launch.h sdpa_fp8_fwd_runs_sm90); else the sm80 FP8
    // forward on the sm80 forward's tiles (the checks below); the FP8 backward runs the sm80
    // backward's tiles (the checks below).
    if (sdpa_fp8_fwd_runs_sm90(p)) return;
    FS_CHECK_SUPPORTED(sdpa_fp8_fwd_runs_sm80(p), "q: FP8 inputs on CUDA tensors need an sm_90 device (H100 / "
                       "H200) and this build's sm_90a code (FLASHSPAN_CUDA_ARCHS with 90a), or the sm80 FP8 forward "
                       "(every GPU from sm_80), which FLASHSPAN_SDPA_FP8_SM80=0 turned off; device cuda:", p.device_id,
                       " has neither or not both");
  }
  int major = 0, smem_optin = 0;
  const cudaError_t e = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, p.device_id);
  FS_CHECK(e == cudaSuccess, Status::kCudaError, "cudaDeviceGetAttribute(cuda:", p.device_id,
           "): ", cudaGetErrorString(e));
  FS_CHECK_SUPPORTED(major >= 8, "device cuda:", p.device_id, " has compute capability ", major,
                     ".x; the SDPA GPU kernels need 8.0 or newer");
  const cudaError_t e2 = cudaDeviceGetAttribute(&smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, p.device_id);
  FS_CHECK(e2 == cudaSuccess, Status::kCudaError, "cudaDeviceGetAttribute(cuda:", p.device_id,
           "): ", cudaGetErrorString(e2));
  const sm80::TileSm80 t = tile_of(p);
  const int need = p.a.backward ? sm80::bwd_smem_bytes(t, p.a.deterministic) : sm80::fwd_smem_bytes(t);
  FS_CHECK_SUPPORTED(need <= smem_optin, "q, v: head dims (D_qk, D_v) = (", p.Dqk, ", ", p.Dv, "): the ",
                     p.a.backward ? "backward" : "forward", " kernels need ", need,
                     " bytes of shared memory per block; device cuda:", p.device_id, " allows ", smem_optin);
}

void launch_sdpa_fwd(const Problem& p, void* workspace, size_t workspace_bytes, void* stream) {
  // An empty batch: before any kernel, parameter or workspace binding (all of which assume B >= 1).
  if (p.empty_batch()) {
    fill_empty_batch_gpu(p, static_cast<cudaStream_t>(stream));
    return;
  }
  if (p.fp8 && sdpa_fp8_fwd_runs_sm80(p)) {
    // The FP8 forward on the sm80 kernels (check_support accepted the call: sdpa_fp8_fwd_sm80_refusal,
    // the device). Its pre-pass reads q, k, v a byte at a time (no vector rule there); O takes code pairs.
    check_vec_aligned_slots(p, {FS_SDPA_O});
    sm80::launch_sdpa_fp8_fwd_sm80(sdpa_fp8_fwd_sm80_params(p, workspace, workspace_bytes), tile_of(p),
                                   static_cast<cudaStream_t>(stream));
    return;
  }
  check_vec_aligned_slots(p, {FS_SDPA_Q, FS_SDPA_K, FS_SDPA_V, FS_SDPA_O, FS_SDPA_GATE});
  if (p.fp8) {
    // The sm90 FP8 forward (check_support accepted the call: sdpa_fp8_fwd_sm90_refusal, the device); packed q or k
    // (experimental): the per-sample tensor maps' part of the workspace, after the V^T.
    const WorkspaceSlice maps = sdpa_fwd_sm90_maps(p, workspace, workspace_bytes);
    sm90::launch_sdpa_fp8_fwd_sm90(sdpa_fp8_fwd_params(p, workspace, workspace_bytes), p.t(FS_SDPA_Q),
                                   p.t(FS_SDPA_K), p.t(FS_SDPA_V), maps.ptr, maps.bytes,
                                   static_cast<cudaStream_t>(stream));
    return;
  }
  // score_max / score_sum_exp beside a packed O: their padded rows past each sample, which no forward
  // kernel's block reaches (sdpa_feature_pairs_enabled; rows disjoint from the forward's).
  if (p.ragged(FS_SDPA_O) && (p.has(FS_SDPA_SCORE_MAX) || p.has(FS_SDPA_SCORE_SUM_EXP))) {
    launch_sdpa_fwd_stats_padding(sdpa_fwd_params(p), static_cast<cudaStream_t>(stream));
  }
  if (sdpa_fwd_runs_decode(p)) {
    int64_t slots = 0;
    const SdpaPagedFwdParams f = sdpa_decode_fwd_params(p, workspace, workspace_bytes, &slots);
    sm80::launch_sdpa_fwd_decode_sm80(f, slots, p.dtype, static_cast<cudaStream_t>(stream));
    return;
  }
  if (p.paged) {
    if (sdpa_fwd_runs_sm90_paged(p)) {
      // The sm90 forward over the page tables (sdpa_sm90_paged_enabled): packed q's per-sample maps (on by default,
      // sdpa_sm90_paged_thd_enabled) at the workspace's start, its flags after them.
      const WorkspaceSlice maps = sdpa_fwd_sm90_maps(p, workspace, workspace_bytes);
      SdpaPagedFwdSm90Params f = sdpa_paged_fwd_params_sm90(p, workspace, workspace_bytes);
      f.analytic.item_counter = sdpa_fwd_sm90_counter(p, workspace, workspace_bytes);
      // The bias (on by default, sdpa_sm90_paged_bias_enabled): its descriptor for the staged bias's map.
      sm90::launch_sdpa_fwd_paged_sm90(f, p.t(FS_SDPA_Q),
                                       p.t(FS_SDPA_K), p.t(FS_SDPA_V),
                                       p.has(FS_SDPA_BIAS) ? &p.t(FS_SDPA_BIAS) : nullptr, p.dtype, maps.ptr,
                                       maps.bytes, static_cast<cudaStream_t>(stream));
      return;
    }
    sm80::launch_sdpa_fwd_paged_sm80(sdpa_paged_fwd_params(p), tile_of(p), p.dtype, static_cast<cudaStream_t>(stream));
    return;
  }
  if (sdpa_fwd_runs_sm90(p)) {
    // Packed q, k or v (experimental): the per-sample tensor maps' part of the workspace.
    const WorkspaceSlice maps = sdpa_fwd_sm90_maps(p, workspace, workspace_bytes);
    SdpaFwdParams f = sdpa_fwd_params(p);
    f.analytic.item_counter = sdpa_fwd_sm90_counter(p, workspace, workspace_bytes);  // (grouped cells, claimed)
    sm90::launch_sdpa_fwd_sm90(f, p.t(FS_SDPA_Q), p.t(FS_SDPA_K), p.t(FS_SDPA_V),
                               p.has(FS_SDPA_BIAS) ? &p.t(FS_SDPA_BIAS) : nullptr, p.dtype, maps.ptr, maps.bytes,
                               static_cast<cudaStream_t>(stream));
    return;
  }
  sm80::launch_sdpa_fwd_sm80(sdpa_fwd_params(p), tile_of(p), p.dtype, static_cast<cudaStream_t>(stream));
}

void launch_sdpa_bwd(const Problem& p, void* workspace, size_t workspace_bytes, void* stream) {
  // An empty batch: before any kernel, parameter or workspace binding (all of which assume B >= 1).
  if (p.empty_batch()) {
    fill_empty_batch_gpu(p, static_cast<cudaStream_t>(stream));
    return;
  }
  if (p.fp8) {
    // The FP8 backward (check_support accepted the call: sdpa_fp8_bwd_refusal) on the sm90 kernel where its
    // rule takes the call (sdpa_fp8_bwd_runs_sm90), else on the sm80 kernels. Its FP8 tensors are read and
    // written a byte at a time (no vector rule); the kernels' 16-bit tensors are its workspace copies.
    if (sdpa_fp8_bwd_runs_sm90(p)) {
      sm90::launch_sdpa_fp8_bwd_sm90(sdpa_fp8_bwd_params(p, workspace, workspace_bytes),
                                     static_cast<cudaStream_t>(stream));
      return;
    }
    sm80::launch_sdpa_fp8_bwd_sm80(sdpa_fp8_bwd_params(p, workspace, workspace_bytes), tile_of(p),
                                   static_cast<cudaStream_t>(stream));
    return;
  }
  check_vec_aligned_slots(p, {FS_SDPA_Q, FS_SDPA_K, FS_SDPA_V, FS_SDPA_O, FS_SDPA_DO, FS_SDPA_DQ, FS_SDPA_DK,
                              FS_SDPA_DV, FS_SDPA_GATE, FS_SDPA_DGATE});
  check_dbias_with_softcap(p);
  if (sdpa_bwd_runs_sm90(p)) {
    // Packed q, k, v or dO (experimental): the per-sample tensor maps' part of the workspace.
    const WorkspaceSlice maps = sdpa_bwd_sm90_maps(p, workspace, workspace_bytes);
    sm90::launch_sdpa_bwd_sm90(sdpa_bwd_params_sm90(p, workspace, workspace_bytes), p.t(FS_SDPA_Q), p.t(FS_SDPA_K),
                               p.t(FS_SDPA_V), p.t(FS_SDPA_DO), p.dtype, maps.ptr, maps.bytes,
                               static_cast<cudaStream_t>(stream));
    return;
  }
  const SdpaBwdParams b = sdpa_bwd_params(p, workspace, workspace_bytes);
  sm80::launch_sdpa_bwd_sm80(b, tile_of(p), p.dtype, static_cast<cudaStream_t>(stream));
}

}  // namespace flashspan
