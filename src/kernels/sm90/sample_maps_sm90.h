// Per-sample tensor maps of packed (THD, ragged-offset) SDPA tensors for the sm90 kernels, built on
// the device. A TMA map has one base address and fixed extents, but a packed tensor's samples start at
// offsets held in device memory (the ragged offsets), which the host cannot read without a sync; so a
// pre-pass copies a host-encoded template per (sample, tensor) into the call's workspace, replacing its
// base with the sample's start and its row extent with the sample's length (tensormap.replace, sm_90a):
// a box past the sample's last row reads zeros, never the next sample or past the allocation. The
// kernels load through these maps with batch coordinate 0 (AnalyticMaskParams::sample_maps).
//
// TMA needs 16-byte aligned bases: a sample whose start is not (its ragged offset times the element
// size not a multiple of 16 bytes, which no THD layout of head dims that are multiples of 8 (16-bit) or
// 16 (FP8) has; dispatch refuses the multipliers that could give one) gets a map over its rows moved down
// to the alignment (reads stay inside the tensor) and a flag; after the kernel,
// launch_sample_poison_sm90 writes NaN over that sample's O and stats rows, so the fault shows. Users: the
// 16-bit sm90 forward (q, k, v), the FP8 one (q, k: 1-byte elements) and the 16-bit sm90 backward (q, k,
// v, dO). On by default for the 16-bit ones (dispatch: sdpa_sm90_thd_enabled, FLASHSPAN_SM90_SDPA_THD=0 off);
// experimental for the FP8 forward (sdpa_fp8_sm90_thd_enabled; not yet run on a GPU).
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <initializer_list>

#include "core/tensor_view.h"
#include "kernels/params.h"
#include "kernels/sm90/tile_sm90.h"

namespace flashspan::sm90 {

// The workspace layout (kSampleMapsFwd, kTensorMapBytes, sample_maps_bytes): tile_sm90.h, which dispatch reads.

// What the pre-pass reads: per tensor x < tensors (the map index: kSdpaQ, kSdpaK, kSdpaV, then the backward's
// kSampleMapDO) the template (the tensor's map with batch extent 1, row extent S: make_tensor_map_sm90's form, or
// make_tensor_map_fp8_sm90's), its data, its sample starts and its side (0: the query side's lengths, 1: the key
// side's); the samples' lengths as the analytic kernels take them (lengths_of); the bytes of an element; the maps a
// sample in the workspace (slots: 0 = tensors; the FP8 forward's 3 = kSampleMapsFwd of which it writes q's and k's
// only, its V being read by the V^T pre-pass, so that both forwards' workspaces have one layout).
inline constexpr int kMaxSampleMaps = kSampleMapsBwd;
struct SampleMapsJob {
  CUtensorMap tmpl[kMaxSampleMaps];
  const char* data[kMaxSampleMaps];
  SampleStart start[kMaxSampleMaps];
  int side[kMaxSampleMaps];
  int tensors = 0;
  int elem_bytes = 2;
  int slots = 0;
  IndexArray seq_len[2], cu_seq_len[2];
  int32_t max_len[2] = {0, 0};

  // The next tensor's map (host).
  void add(const CUtensorMap& map, const void* base, const SampleStart& s, int query_side) {
    tmpl[tensors] = map;
    data[tensors] = static_cast<const char*>(base);
    start[tensors] = s;
    side[tensors] = query_side ? 0 : 1;
    ++tensors;
  }
  void lengths_of(const AnalyticMaskParams& a) {
    seq_len[0] = a.seq_len_q;
    cu_seq_len[0] = a.cu_seq_len_q;
    seq_len[1] = a.seq_len_kv;
    cu_seq_len[1] = a.cu_seq_len_kv;
    max_len[0] = a.max_q;
    max_len[1] = a.max_kv;
  }
};

// Whether a launcher's call is packed, its maps per sample: any of the tensors xs it loads through TMA (indices of
// a.start) ragged. A packed call's workspace must hold `slots` maps a sample (sample_maps_bytes(batch, slots));
// `who` names the launcher in the error.
bool sample_maps_packed(const AnalyticMaskParams& a, std::initializer_list<int> xs, int64_t batch, int slots,
                        const void* workspace, size_t workspace_bytes, const char* who);

// One tensor of a launcher's job: its map's template, the view it was made over (sample_map_view's) and its
// sample starts.
struct SampleMapOf {
  const CUtensorMap& map;
  const TensorView& view;
  const SampleStart& start;
};

// The job of a launcher's packed call: maps[x] the tensor of map index x (q, k, v, then the backward's dO; q and dO
// on the query side, k and v on the key side), a's lengths, elements of elem_bytes, `slots` maps a sample (0: as
// many as maps).
inline SampleMapsJob sample_maps_job(const AnalyticMaskParams& a, std::initializer_list<SampleMapOf> maps,
                                     int elem_bytes = 2, int slots = 0) {
  static_assert(kSdpaQ == 0 && kSdpaK == 1 && kSdpaV == 2 && kSampleMapDO == 3,
                "the sample maps' index is the tensor's");
  SampleMapsJob job;
  for (const SampleMapOf& m : maps) {
    job.add(m.map, m.view.data, m.start, job.tensors == kSdpaQ || job.tensors == kSampleMapDO);
  }
  job.elem_bytes = elem_bytes;
  job.slots = slots;
  job.lengths_of(a);
  return job;
}

// A launcher's view of a tensor for its map (make_tensor_map_sm90's BSHD form): for a call with per-sample maps
// (packed), batch extent 1 (the template of one sample's rows, which the pre-pass copies per sample) and a null
// base -- a packed tensor of 0 tokens, every sample empty -- replaced by `dummy` (an aligned address: the
// producers never read an empty sample's map, their boxes lying past its extent).
inline TensorView sample_map_view(TensorView bshd, bool packed, void* dummy) {
  if (packed) {
    bshd.shape[0] = 1;
    if (bshd.data == nullptr) bshd.data = dummy;
  }
  return bshd;
}

// Writes the maps of every sample (n = job.slots, or job.tensors, a sample: maps[n b + x], x < job.tensors) at
// `workspace` (128-byte aligned, sample_maps_bytes(batch, n) bytes) and after them one flag a sample (1: a start
// not 16-byte aligned); returns the flags.
int32_t* launch_sample_maps_sm90(const SampleMapsJob& job, int batch, void* workspace, cudaStream_t stream);

// NaN over the O rows (every head, D_v columns) and the stats rows of each flagged sample: a packed O /
// stats the sample's rows, a padded one every row below S_q (the forward's rows_to_store); p: the
// forward's parameters (O, the stats, their starts and strides); dtype: O's (float16 or bfloat16, or an FP8
// format: the code 0x7F, NaN in E4M3 and E5M2).
void launch_sample_poison_sm90(const SdpaFwdParams& p, DType dtype, const int32_t* flags, cudaStream_t stream);
// The backward's: NaN over the dQ, dK and dV rows of each flagged sample (packed: the sample's rows, padded: every
// row below S_q / S_kv).
void launch_sample_poison_bwd_sm90(const SdpaBwdParams& p, DType dtype, const int32_t* flags, cudaStream_t stream);

}  // namespace flashspan::sm90
