// Per-sample tensor maps of packed (THD, ragged-offset) SDPA tensors for the sm90 kernels, built on
// the device. A TMA map has one base address and fixed extents, but a packed tensor's samples start at
// offsets held in device memory (the ragged offsets), which the host cannot read without a sync; so a
// pre-pass copies a host-encoded template per (sample, tensor) into the call's workspace, replacing its
// base with the sample's start and its row extent with the sample's length (tensormap.replace, sm_90a):
// a box past the sample's last row reads zeros, never the next sample or past the allocation. The
// kernels load through these maps with batch coordinate 0 (AnalyticMaskParams::sample_maps).
//
// TMA needs 16-byte aligned bases: a sample whose start is not (its ragged offset times the element
// size not a multiple of 16 bytes, which no THD layout of head dims that are multiples of 8 has) gets a
// map over its rows moved down to the alignment (reads stay inside the tensor) and a flag; after the
// kernel, launch_sample_poison_sm90 writes NaN over that sample's O and stats rows, so the fault shows.
// Experimental (dispatch: sdpa_sm90_thd_enabled); not yet run on a GPU.
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "core/tensor_view.h"
#include "kernels/params.h"
#include "kernels/sm90/tile_sm90.h"

namespace flashspan::sm90 {

// The workspace layout (kSampleMapsFwd, kTensorMapBytes, sample_maps_bytes): tile_sm90.h, which dispatch reads.

// What the pre-pass reads: per tensor x < tensors the template (the tensor's map with batch extent 1,
// row extent S: make_tensor_map_sm90's form), its data, its sample starts and its side (0: the query
// side's lengths, 1: the key side's); the samples' lengths as the analytic kernels take them.
struct SampleMapsJob {
  CUtensorMap tmpl[kSampleMapsFwd];
  const char* data[kSampleMapsFwd];
  SampleStart start[kSampleMapsFwd];
  int side[kSampleMapsFwd];
  int tensors = 0;
  int elem_bytes = 2;
  IndexArray seq_len[2], cu_seq_len[2];
  int32_t max_len[2] = {0, 0};
};

// Writes the maps of every sample into maps[tensors b + x] and the flags (1: a start not 16-byte aligned)
// into flags[b]; maps / flags: the workspace laid out by sample_maps_bytes.
void launch_sample_maps_sm90(const SampleMapsJob& job, int batch, CUtensorMap* maps, int32_t* flags,
                             cudaStream_t stream);

// NaN over the O rows (every head, D_v columns) and the stats rows of each flagged sample: a packed O /
// stats the sample's rows, a padded one every row below S_q (the forward's rows_to_store); p: the
// forward's parameters (O, the stats, their starts and strides); dtype: O's (float16 or bfloat16).
void launch_sample_poison_sm90(const SdpaFwdParams& p, DType dtype, const int32_t* flags, cudaStream_t stream);

}  // namespace flashspan::sm90
