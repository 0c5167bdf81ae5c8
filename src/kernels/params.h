// Kernel parameter blocks of the flex forward/backward kernels: plain structs (no CUDA, no plan
// or API types), filled on the host by src/dispatch, passed by value to the kernels of every
// family. FwdParams and BwdParams share the QkvParams base.
//
// Tensor addressing. Row i of sample b, head h of a [B,S,H,D] (BSHD) or [T,H,D] (THD) tensor
// starts at element
//   b * batch_stride + (row0(b) + i) * row_stride + h * head_stride
// where row0(b) = cu_seqlens[b] for THD (batch_stride = 0 then) and 0 for BSHD. The last
// dimension is contiguous. LSE uses the same formula with its own strides ([B,Hq,Sq] or
// [Hq,Tq], fp32). Sample lengths come from the plan's device copies of cu_seqlens, which
// hold b*S for BSHD, so len(b) = cu[b+1] - cu[b] in both layouts.
#pragma once

#include <cstdint>

#include "core/sdpa_band.h"
#include "kernels/plan_view.h"

namespace flashspan {

struct TensorAddr {
  int64_t batch_stride = 0, row_stride = 0, head_stride = 0;  // elements
};

// Split schedule shared by the forward and the non-deterministic dK/dV kernels (load
// balancing; see src/kernels/common/split_schedule.cuh). Task t (an entry of view.tasks)
// walks iters(t) steps; a work item is a range [begin, end) of those steps. A task whose
// steps exceed the run's chunk is split into several items whose partial results meet in
// workspace slots and are combined afterwards. All arrays live in the call's workspace.
struct SplitSchedule {
  // hdr[kTotal]: number of items; hdr[kCounter]: next item to claim (zeroed by the scan
  // kernel); hdr[kChunk]: steps per item of this run; hdr[kNumSplit]: slots used; hdr[kUneven]:
  // 1 when the longest task has more than twice the mean task's steps (not causal-like: the
  // deterministic sm90 backward then claims its items in list order, BwdParams::det_claim; written
  // by its rules only, 0 under the per-grid rule).
  static constexpr int kTotal = 0, kCounter = 1, kChunk = 2, kNumSplit = 3, kUneven = 4, kHdrInts = 5;
  // Chunk = max(kChunkMin, ceil(total steps / (kItemsPerCta * num_ctas)),
  //             ceil(total steps / kMaxSplit), and a term that depends on how the task
  //             count compares with the grid: split_schedule.cuh), so that
  //   items <= num_tasks + kItemsPerCta * num_ctas,   split tasks < kMaxSplit,
  //   items of split tasks < 2 * kMaxSplit (split_schedule.cuh proves both).
  static constexpr int kChunkMin = 16;
  static constexpr int kItemsPerCta = 4;
  static constexpr int kMaxCtas = 1024;   // persistent grid cap (bounds the item list)
  static constexpr int kMaxSplit = 1024;  // bounds the slots (the fp32 scratch)

  int32_t* hdr = nullptr;         // [kHdrInts]
  int32_t* task_iters = nullptr;  // [num_tasks] steps of each task
  int32_t* item_start = nullptr;  // [num_tasks + 1] first item of each task (exclusive scan)
  int32_t* task_slot = nullptr;   // [num_tasks] (first) slot of a split task, -1 if unsplit
  int32_t* items = nullptr;       // [max items * 4] {task, begin, end, slot}; nullptr = no split
                                  // schedule (one CTA per task or grid cell, direct writes)
  int num_tasks = 0;
  int num_ctas = 0;               // persistent grid
  int split_first = 0;            // 1: the split tasks' items lead the list (split_schedule.cuh
                                  // kSplitFirst; the sm90 backward in cell order, experimental)
  int above_mean = 2;             // the plan-only rule cuts walks of more than above_mean x the
                                  // mean steps (split_rule.h; the deterministic sm90 backward:
                                  // sm90::bwd_det_split_above_mean)
};

// Backward (dK/dV): steps are (query head, query block) pairs, the concatenation over the kv
// group's query heads of each head's K2Q list in ascending query-block order. One slot per
// split task: its items add their dK/dV partial sums into the slot with fp32 atomics and a
// convert kernel writes the rows.
struct BwdSplit : SplitSchedule {
  float* dk_accum = nullptr;      // [kMaxSplit or fewer slots, block_k, head_dqk] fp32, unscaled
  float* dv_accum = nullptr;      // [slots, block_k, head_dv] fp32
};

// Forward: steps are the key blocks of the query block's Q2K row in BlockCursor order
// (partial entries, then full runs; block_range.cuh). One slot per item of a split
// task (a task's slots are consecutive, from task_slot[t]): the item writes its unnormalised
// output accumulator and per-row running max (log2 units) and sum; a combine kernel merges
// them (split_schedule.cuh, flex_fwd_split_combine_kernel).
struct FwdSplit : SplitSchedule {
  // Rows of a query block the combine kernel takes (its per-row shared arrays): forward tiles
  // of every family have block_q <= kMaxBlockQ.
  static constexpr int kMaxBlockQ = 128;
  float* o_accum = nullptr;  // [slots, block_q, dv] fp32, unnormalised
  float* ml = nullptr;       // [slots, 2, block_q] fp32: running max m (log2 units), then sum l
};

// ---------------------------------------------------------------------------------------
// The analytic mask of SDPA (kernels/common/analytic_mask.h): the kernels derive empty /
// partial / full tiles and the element mask from positions, so there is no plan; the sample
// lengths and the per-sample starts of every tensor are read from the caller's device arrays
// (int32 or int64, never copied to the host).

// An int32 or int64 array in device memory (an SDPA length or offset tensor); ptr nullptr:
// not given.
struct IndexArray {
  const void* ptr = nullptr;
  int32_t is64 = 0;
};

// The SDPA tensors the analytic kernels address per sample (AnalyticMaskParams::start).
enum SdpaTensor : int {
  kSdpaQ = 0, kSdpaK, kSdpaV, kSdpaO, kSdpaStats, kSdpaDO, kSdpaDQ, kSdpaDK, kSdpaDV,
  kSdpaGate, kSdpaDGate, kSdpaScoreMax, kSdpaScoreSumExp, kSdpaNumTensors
};

// Element offset of (sample b, head 0, row 0) of one tensor: ragged (packed THD, ragged.ptr
// set) at ragged[b] * mult, else (padded) at b * batch_stride. A row r and head h of the
// sample are then at start + r * row_stride + h * head_stride (the tensor's TensorAddr).
struct SampleStart {
  IndexArray ragged;
  int64_t mult = 1;
  int64_t batch_stride = 0;
};

// Per-call parameters of the analytic mask. Sample lengths come from seq_len (B values) or
// cu_seq_len (B + 1 prefix sums), or are max_q / max_kv when neither is given; they are
// clamped to [0, max] (bad values never address past a padded tensor). Padded outputs get
// every row of [0, max) written (O 0, stats -inf, gradients 0 past the sample's length),
// ragged ones only the sample's rows. Rows of sample b in the backward workspace start at
// b * max_q (BwdParams::total_q = B * max_q).
// Score modifiers and sinks of an SDPA call (kernels/common/sdpa_score_mod.cuh), run-time
// flags inside the one analytic instantiation of each kernel (no template axis):
//   softcap2   softcap * log2(e) (0: none): logits x -> softcap tanh(x / softcap), in log2 units
//   alibi_n    ALiBi (0: none): the largest power of two <= H_q; head h's slope is
//              2^(-8 (h + 1) / n) for h < n, else 2^(-4 (2 (h - n) + 1) / n) (core/sdpa_problem.h)
//   sink       H_q float32 sink logits (natural units) in the softmax denominator, or null
//   dsink      H_q float32 dSink outputs (backward), or null
//   group_v    H_q / H_v (the V head of query head h is h / group_v; K's is h / group_size)
//   fused_softcap  the sm90 forward's full blocks of calls with softcap alone (no ALiBi, no bias): t and the
//              softmax's update in one basic block (kernel_fwd_sm90.cuh consumer), 1 while the switch
//              dispatch/sdpa_launch.h sdpa_sm90_fused_softcap_enabled is on (default), else 0 (Variant::logits')
//   dkdv_role  backward dK/dV kernel: 0 one pass (H_k = H_v: a work item's query heads share
//              K and V); with H_k != H_v two passes, 1: work items per K head, dK only (the V
//              tile reloaded when a query head's V head changes), 2: per V head, dV only (K
//              reloaded); the atomic dQ path adds dS K in passes 0 and 1 only
struct SdpaScoreParams {
  float softcap2 = 0.0f;
  int32_t alibi_n = 0;
  const float* sink = nullptr;
  float* dsink = nullptr;
  int32_t group_v = 1;
  int32_t dkdv_role = 0;
  int32_t fused_softcap = 0;
};

// Epilogue options of an SDPA call, run-time flags of the one analytic instantiation (null:
// not given). Tensors start at AnalyticMaskParams::start[kSdpaGate / kSdpaDGate /
// kSdpaScoreMax / kSdpaScoreSumExp] and have the TensorAddr row and head strides here.
//   gate           forward: O * sigmoid(G) on the rows that saw a key or sink (others stay 0);
//                  backward: read by the preprocess
//   dgate          backward: dO * O * (1 - sigmoid(G)) (O the gated output), written by the
//                  preprocess (0 on a padded dgate's rows past the sample)
//   do_gated       backward workspace [H_q, total_q, D_v] in the input dtype: dO * sigmoid(G),
//                  written by the preprocess; the launcher then points dout at it for the
//                  dK/dV and dQ kernels
//   score_max      forward [B, H_q, S_q, 1] fp32 (never packed): the row max of the logits,
//                  sink included, natural units (-inf for a row that sees nothing)
//   score_sum_exp  the row's sum of exp(logit - score_max), sink included (0 for such a row)
struct SdpaEpilogueParams {
  const void* gate = nullptr;
  void* dgate = nullptr;
  void* do_gated = nullptr;
  float* score_max = nullptr;
  float* score_sum_exp = nullptr;
  TensorAddr ga, dga, sma, ssa;
};

// SDPA's block_mask (uint8 [1|B, 1|H_q, ceil(S_q / 128), ceil(ceil(S_kv / 128) / 8)], one bit
// per 128 x 128 block of sample positions; analytic_mask.h block_mask_bit): its byte strides,
// 0 along a dimension of size 1 (broadcast). bits null: no block mask.
struct SdpaBlockMaskParams {
  const uint8_t* bits = nullptr;
  int64_t batch_stride = 0, head_stride = 0, row_stride = 0;
};

// SDPA's additive bias (bias [1|B, 1|H_q, 1|S_q, 1|S_kv], sample-local positions) and dBias, run-time
// flags of the one analytic instantiation (bias null: none; sdpa_score_mod.cuh SdpaBiasFrag).
//   bias            forward and backward: bias * log2(e) added to the logits of visible elements
//                   only (never read at padding rows / keys or masked positions)
//   dtype           bias's element type: 0 float32, 1 float16, 2 bfloat16 (kSdpaBiasF32 ...)
//   batch_stride .. col_stride   element strides, 0 along a broadcast dimension (size 1)
//   ds              backward with dBias: [B, H_q, S_q, ds_ld] fp32 workspace of dS = P (dP - D)
//                   (natural units), zeroed by the launcher; the dK/dV kernel stores the
//                   sample's visited elements (each once), sdpa_bwd_dbias_kernel (bwd_prepost.cuh)
//                   then sums it over dBias's broadcast dimensions in a fixed order
//   ds_form         where the kernel puts dS (SdpaDbiasDsForm; the sm90 backward takes every form,
//                   the sm80 one the workspace; dispatch's sdpa_dbias_ds_form chooses):
//                     kDbiasDsWorkspace   ds is the workspace above
//                     kDbiasDsAccumulate  ds is an fp32 accumulator of dBias's shape (contiguous,
//                                         [n0, n1, n2, n3] row-major, zeroed by the launcher) into which
//                                         the kernel adds (red.global.add) each dS element over dBias's
//                                         broadcast dimensions; launch_sdpa_bwd_dbias converts it
//                     kDbiasDsDirect      one dS term per dBias element (dBias broadcasts nothing the
//                                         problem has more than one of): the kernel stores dS into dBias
//                                         itself (its dtype and strides; zeroed by the launcher), ds null
//                   (bwd_prepost.cuh dbias_ds_row: the first two forms' element address)
//   dbias           dBias (bias's shape), dbias_dtype / dbias_stride[4] / dbias_size[4] likewise
enum SdpaBiasDType : int32_t { kSdpaBiasF32 = 0, kSdpaBiasF16 = 1, kSdpaBiasBF16 = 2 };
enum SdpaDbiasDsForm : int32_t { kDbiasDsWorkspace = 0, kDbiasDsAccumulate = 1, kDbiasDsDirect = 2 };
struct SdpaBiasParams {
  const void* bias = nullptr;
  int32_t dtype = kSdpaBiasF32;
  int64_t batch_stride = 0, head_stride = 0, row_stride = 0, col_stride = 0;
  // 1: a 16-bit bias whose row columns 8j .. 8j + 7 may be copied as 16-byte chunks (col_stride 1, a
  // multiple of 8 columns, the base 16-byte aligned and every other stride a multiple of 8): the
  // sm90 forward and backward then stage it through shared memory (the forward's producer by TMA,
  // sdpa_score_mod.cuh SdpaBiasFrag::add_tma; the backward's consumers by cp.async, stage_transposed).
  int32_t chunks = 0;
  float* ds = nullptr;
  int64_t ds_ld = 0;
  int32_t ds_form = kDbiasDsWorkspace;
  void* dbias = nullptr;
  int32_t dbias_dtype = kSdpaBiasF32;
  int64_t dbias_stride[4] = {0, 0, 0, 0};
  int64_t dbias_size[4] = {0, 0, 0, 0};
};

// SDPA dropout (sdpa_score_mod.cuh sdpa_dropout_apply), a run-time flag of the one analytic
// instantiation: P of element (b, h, i, j) (sample-local positions) is multiplied by
//   mode 1 (Philox)  scale (= 1 / (1 - p)) when its Philox word (core/philox.h: key = seed, counter
//                    from offset, (i, j) and b * H_q + h) is >= threshold, else 0
//   mode 2 (mask)    mask[1|b, 1|h, 1|i, 1|j] * mask_scale[0]
// in the P V product of the forward, and the same multiplier in the backward's dV = (P m)^T dO and
// dS = P (m dP - D). seed / offset: one int32 / int64 element each in device memory (int32 sign-
// extended); mask: uint8, float16, bfloat16 or float32 (SdpaDropoutMaskDType) with element strides,
// 0 along a broadcast dimension; mask_scale: one float32 in device memory. rng_dump (forward, Philox):
// [B, H_q, S_q, S_kv] keep mask (1 / 0, 0 outside the samples), dtype code as the mask's.
enum SdpaDropoutMaskDType : int32_t { kSdpaMaskU8 = 0, kSdpaMaskF16 = 1, kSdpaMaskBF16 = 2, kSdpaMaskF32 = 3 };
struct SdpaDropoutParams {
  int32_t mode = 0;
  IndexArray seed, offset;
  uint32_t threshold = 0;
  float scale = 1.0f;
  const void* mask = nullptr;
  int32_t mask_dtype = kSdpaMaskU8;
  int64_t mask_stride[4] = {0, 0, 0, 0};
  const float* mask_scale = nullptr;
  void* rng_dump = nullptr;
  int32_t dump_dtype = kSdpaMaskU8;
  int64_t dump_stride[4] = {0, 0, 0, 0};
  // Philox's form in the sm80 forward (dispatch sdpa_params.cpp, sdpa_launch.h sdpa_dropout_o_scaled_enabled; the
  // keep mask the same either way): 1, the dropped elements of P zeroed and 1 / (1 - p) applied to O once after
  // the walk (sdpa_dropout_zero_dropped / sdpa_dropout_scale_o, the sm90 forward's form); 0, P times the multiplier.
  int32_t o_scaled = 0;
};

struct AnalyticMaskParams {
  SdpaScoreParams score;
  SdpaBiasParams bias;
  SdpaDropoutParams dropout;
  SdpaEpilogueParams epi;
  SdpaBlockMaskParams block_mask;
  sdpa::Band band;
  IndexArray seq_len_q, seq_len_kv;
  IndexArray cu_seq_len_q, cu_seq_len_kv;
  int32_t max_q = 0, max_kv = 0;                 // S_q, S_kv
  int32_t num_q_blocks = 0, num_k_blocks = 0;   // per sample, of the launched tiles (launchers)
  // The sm90 forward's and backward's cell order in groups of l2_group (sample, head) pairs
  // (tile_scheduler.cuh AnalyticGrid::group, AnalyticBwdGrid::group; 0: one group; launch_fwd_sm90.cu
  // set_sdpa_fwd_l2_group, launch_bwd_sm90.cu set_sdpa_bwd_l2_group). item_counter (grouped cells of unequal cost:
  // the forward's with a band or a block mask, the backward's heads-fastest and deterministic ones): the cells claimed in list order
  // through this counter, zeroed by the launcher (AnalyticGrid::counter, AnalyticBwdGrid::counter; in the workspace:
  // dispatch sdpa_fwd_sm90_counter, sdpa_bwd_layout); null: static snake waves.
  int32_t l2_group = 0;
  int32_t* item_counter = nullptr;
  float lse_unit = 0.6931471805599453f;          // forward stats: ln 2 (natural log) or 1 (base 2)
  SampleStart start[kSdpaNumTensors];
  // The sm90 forward / backward of packed (THD) tensors (launch_{fwd,bwd}_sm90.cu; experimental): per sample b
  // the tensor maps of q, k, v (and the backward's main dO) (CUtensorMap, 128 bytes each, at sample_maps +
  // 128 (n b + x), n = 3 / 4, x = 0 / 1 / 2 (/ 3): tile_sm90.h kSampleMapsFwd / kSampleMapsBwd), each over that
  // sample's own rows (its start, its length), which the sm90 producers load through (batch coordinate 0).
  // Null everywhere else.
  const void* sample_maps = nullptr;
};

// What every flex kernel reads, forward or backward: the Q/K/V inputs, the sequence lengths,
// the head geometry, the softmax scale and one view of the mask plan. Head dims in elements;
// scale in 1/sqrt(d) units (scale_log2 = scale * log2(e), for exp2).
struct QkvParams {
  const void* q = nullptr;  // [B,Sq,Hq,Dqk] | [Tq,Hq,Dqk], fp16/bf16
  const void* k = nullptr;  // [B,Sk,Hkv,Dqk] | [Tk,Hkv,Dqk]
  const void* v = nullptr;  // [B,Sk,Hkv,Dv] | [Tk,Hkv,Dv]
  TensorAddr qa, ka, va;
  const int32_t* cu_seqlens_q = nullptr;  // device, [B+1] (the plan's copies; b*S for BSHD)
  const int32_t* cu_seqlens_k = nullptr;
  int varlen = 0;  // 1: THD, 0: BSHD
  int batch = 0;
  int num_heads_q = 0, group_size = 1, mask_per_head = 0;  // group_size = Hq / Hkv
  int head_dqk = 0, head_dv = 0;
  float scale = 0.f;       // softmax scale
  float scale_log2 = 0.f;  // scale * log2(e)
  PlanViewPtrs view;       // forward or backward view, device pointers
  // Forward: 0 = one CTA per entry of view.tasks (cost order); 1 = grid (query block, task
  // head) over every global query block, for plans whose task list omits blocks without
  // visible keys. dK/dV kernel: 0 = view.tasks, 1 = grid (key block, kv head); the sm90
  // backward's split schedule over cells: 1 = descending, heads fastest (deterministic),
  // kGridCellsAscending = heads slowest, key blocks ascending (non-deterministic)
  // (tile_scheduler.cuh; the deterministic list's heads: BwdParams::det_band).
  int grid_mode = 0;
};
inline constexpr int kGridCellsAscending = 2;
// BwdParams::det_band of the deterministic list with heads slowest (every key block one band).
inline constexpr int kDetBandAll = 1 << 30;

struct FwdParams : QkvParams {
  void* o = nullptr;  // [B,Sq,Hq,Dv] | [Tq,Hq,Dv]
  TensorAddr oa;
  float* lse = nullptr;  // optional, [B,Hq,Sq] | [Hq,Tq] fp32
  TensorAddr lsea;
  float* max_logit = nullptr;  // optional, [Hq], reset to -inf before the kernel
  // Packed GQA (plan.signature.pack_gqa, mask_plan.h): pack = G = group_size, the rows of a
  // query block are packed rows r = s * G + g (sample-local query position s of query head
  // hkv * G + g) and the head of a task or grid cell is the kv head hkv. pack = 1: rows are
  // query positions of the task's query head (the unpacked view). In both cases row r of a
  // block whose task head is h is position (row0 + r) / pack of query head
  // h * pack + (row0 + r) % pack.
  int pack = 1;
  FwdSplit split;  // bound when split_schedule = 1
  // 1: the split schedule runs (task mode with a workspace; `split` bound, fwd_split.cuh);
  // 0: one CTA per task or grid cell writes its rows directly (`split` unused).
  int split_schedule = 0;
};

// Int32 words from one dQ tile's ordering counter to the next (BwdParams::dq_sem): one counter a 128-byte line, so
// that the releases and polls of neighbouring tiles' counters do not share a line (measured on an H100: the claimed
// deterministic schedule's causal backward 330 -> 423 TFLOP/s, the snake's unchanged; PERF_LOG v2.49).
// Each tile has kDqChunksMax counters, kDqSemChunkWords apart (BwdParams::dq_chunks: one per piece of the tile).
inline constexpr int kDqSemChunkWords = 32;
inline constexpr int kDqChunksMax = 2;
inline constexpr int kDqSemStride = kDqSemChunkWords * kDqChunksMax;

struct BwdParams : QkvParams {
  const void* o = nullptr;
  const void* dout = nullptr;
  void* dq = nullptr;
  void* dk = nullptr;
  void* dv = nullptr;
  TensorAddr oa, doa, dqa, dka, dva;
  const float* lse = nullptr;
  TensorAddr lsea;
  const float* dlse = nullptr;  // optional gradient of LSE (lse's layout, own strides)
  TensorAddr dlsea;
  // Workspace, [Hq, total_q] fp32 each: D_i = dO_i . O_i - dlse_i, and LSE * log2(e) (+inf for an
  // empty row, so that exp2(s - lse2) = 0 there).
  float* delta = nullptr;
  float* lse2 = nullptr;
  // [Hq, total_q, Dqk] fp32 when deterministic = 0 (or the dq_blocked tiles below); nullptr on the
  // sm80 deterministic path (its dQ kernel writes dq directly).
  float* dq_accum = nullptr;
  int64_t total_q = 0;
  int64_t seqlen_q = 0;  // BSHD: Sq of every sample (flattened row t is position t % Sq of sample t / Sq); THD: 0
  BwdSplit split;  // bound when split_schedule = 1
  // 1: dQ added in a fixed order (bitwise reproducible), no split schedule: by the separate dQ
  // kernel (sm80 family), or by the dK/dV kernel in descending key-block order through dq_sem
  // (sm90 family); 0: the dK/dV kernel adds dS K into dq_accum with fp32 atomics (or bulk
  // reduce-adds), then a convert kernel.
  int deterministic = 0;
  // 1: the dK/dV split schedule runs (deterministic = 0, task mode; `split` bound,
  // bwd_split.cuh); 0: one dK/dV CTA per task or grid cell (`split` unused).
  int split_schedule = 0;
  // Layout of dq_accum: 0 = [Hq, total_q, Dqk]; 1 = the sm90 backward's
  // tiles, one 64 x Dqk tile per (query head, global query block of the backward view) in the
  // kernel's register order (kernels/sm90/kernel_bwd_sm90.cuh, dq_tile_offset_sm90).
  int dq_blocked = 0;
  // The sm90 deterministic backward (dq_blocked = 1, deterministic = 1): one int32 counter per
  // dq_accum tile, zeroed by the preprocess; a key block adds its dQ tile once the counter
  // equals the number of key blocks after it in the tile's Q2K row (descending key-block
  // order, kernels/sm90/kernel_bwd_sm90.cuh), then increments it. nullptr otherwise.
  int32_t* dq_sem = nullptr;
  // The sm90 deterministic backward's item order: 0 = snake waves (each CTA's items fixed by its index,
  // TileScheduler::next_cell_item); 1 = claimed in list order through the split schedule's counter
  // (TileScheduler::claim: no item starts after a later one); -1 (the default) = claimed when the plan's
  // walks are uneven (split.hdr[kUneven], written by the scan kernel), else snake waves. Causal-like plans
  // (longest walk <= 2x the mean) keep the snake: claimed in list order their walks grow along the list and
  // dependent key blocks run side by side (PERF_LOG v2.50). FLASHSPAN_SM90_BWD_DET_CLAIM=0 / 1 forces one.
  int det_claim = -1;
  // The sm90 deterministic backward's hand-off of a dQ tile's turn: 0 (the default) = a release increment of the
  // counter (red.release.gpu, after fence.proxy.async) once the bulk reduce-add has completed
  // (cp.async.bulk.wait_group 0): that completion makes the additions visible to the writer's thread only, the
  // release makes them visible to the next key block's writer, which acquires the counter; 1 = a relaxed increment
  // (measurement only, FLASHSPAN_SM90_BWD_DET_RELAXED=1: not bitwise reproducible, PERF_LOG v2.64).
  int det_relaxed = 0;
  // The sm90 deterministic backward's pieces of a dQ tile, each added by a writer warp of its own in its own chain of
  // turns (its own counter in dq_sem): 2 (the launchers' default, kDqChunksMax) or 1 (FLASHSPAN_SM90_BWD_DET_DQ_CHUNKS=1;
  // kernel_bwd_sm90.cuh bwd_dq_writer). The non-deterministic backward adds whole tiles.
  int dq_chunks = 1;
  // The flex deterministic backward's split slots (one per item): 1 = each item stores its slot whole and the
  // items kernel zeroes none (kernel_bwd_sm90.cuh split_slot_owned); 0 = zeroed slots, fp32 atomic additions
  // (by default; FLASHSPAN_SM90_BWD_DET_OWN_SLOTS=0 keeps 0, PERF_LOG v2.55).
  int det_own_slots = 0;
  // The sm90 deterministic backward's cell list (grid_mode 1, TileScheduler::cell_descending): the key blocks
  // descending in bands of det_band blocks, each band's cells head by head; 1 (the default) = heads fastest,
  // kDetBandAll = heads slowest (experimental, not yet run on a GPU: FLASHSPAN_SM90_BWD_DET_BAND;
  // benchmarks/det_schedule_model.py, PERF_LOG v2.51). Each head's cells stay in descending block order.
  int det_band = 1;
};

// The parameters of the analytic-mask kernels (SDPA): the flex parameters (no plan view, grid
// mode, no split schedule; TensorAddr batch strides 0, the samples' starts being in
// `analytic`) plus the analytic mask. Derived structs, so that FwdParams / BwdParams, and
// with them the plan kernels' parameter blocks, are unchanged; the kernels reach `analytic`
// from a FwdParams / BwdParams reference through analytic_of (analytic_seqlen.cuh).
struct SdpaFwdParams : FwdParams {
  AnalyticMaskParams analytic;
};
struct SdpaBwdParams : BwdParams {
  AnalyticMaskParams analytic;
};

// The FP8 SDPA forward (cuDNN's sdpa_fp8, Transformer Engine's conventions; the sm90 kernel
// kernel_fwd_sm90.cuh sdpa_fp8_fwd_kernel_sm90): Q, K, V and O in one FP8 format and per-tensor
// fp32 factors, each one element in device memory:
//   S     = descale_q descale_k attn_scale Q K^T (the mask applied), P = softmax(S) in fp32;
//   amax_s = max |P| over the rows that see a key (= max over them of 1 / l, l the row's sum of
//           exp(S - rowmax)), the probabilities before scale_s;
//   P_q   = fp8(P scale_s), O = (P_q V) descale_s descale_v, amax_o = max |O| (before scale_o),
//   O stored as fp8_satfinite(O scale_o) in o's format; the stats (LSE) as the 16-bit forward
//   writes them.
// The six factors and attn_scale (SdpaFp8Factor order): each one float in device memory (factor[i]), or, for
// a host scale factor (the seed's pass-by-value form, or attn_scale given as a float), factor[i] null and its
// value in host_factor[i] (kern::fp8_factor reads either). The kernels take attn_scale from here, not from
// QkvParams::scale (NaN when attn_scale is a device tensor). amax_s / amax_o: one fp32 each in device
// memory, zeroed by the launcher, reduced by the kernel with atomics (non-negative: integer max of
// the bits). v_t: the workspace of V^T (the P V GEMM's B operand must be K-major for 8-bit types):
// [B, H_v, D_v, fp8_vt_keys_sm90(S_kv)] bytes (tile_sm90.h fp8_vt_bytes_sm90), written per call by
// the V^T pre-pass (fp8_vt_sm90.cuh).
// format: q, k, v's (and P's quantization): 0 none (a 16-bit call), 1 E4M3, 2 E5M2
// (core/element_type.h kFp8Format); o_format: O's, 1 or 2 (0: format's).
enum SdpaFp8Factor : int {
  kFp8DescaleQ = 0, kFp8DescaleK, kFp8DescaleV, kFp8DescaleS, kFp8ScaleS, kFp8ScaleO, kFp8AttnScale, kFp8NumFactors
};
struct SdpaFp8Params {
  int32_t format = 0;
  int32_t o_format = 0;
  const float* factor[kFp8NumFactors] = {};
  float host_factor[kFp8NumFactors] = {1.0f, 1.0f, 1.0f, 1.0f, 1.0f, 1.0f, 1.0f};
  float* amax_s = nullptr;
  float* amax_o = nullptr;
  void* v_t = nullptr;
};

// The FP8 forward's parameters: the analytic forward's plus the FP8 factors. A derived struct
// (like SdpaPagedFwdParams), so that SdpaFwdParams, and with it every 16-bit kernel's
// parameter block, is unchanged.
struct SdpaFp8FwdParams : SdpaFwdParams {
  SdpaFp8Params fp8;
};

// The FP8 SDPA backward (cuDNN's sdpa_fp8_backward; docs/SDPA.md "FP8 SDPA", its formulas) on the 16-bit
// sm80 backward (kernels/sm80/launch_sdpa_fp8_bwd_sm80.cu, kernel_bwd_sm80.cuh with Fp8BwdSm80): the
// SdpaBwdParams tensors q, k, v, dout are the workspace's bf16 copies of the FP8 inputs' codes (exact:
// every FP8 value is a bf16 value), [B, H, S, D] contiguous; dq_accum, delta (D_i = descale_dO descale_o
// dO_i . o_i, the true units) and lse2 the 16-bit backward's workspace. The kernels read the factors
// through `derived` (Fp8BwdDerived order, written by the pre-pass from the factors: each one float in
// device memory, factor[i], or a host value, host_factor[i]) and write dQ / dK / dV as FP8 codes with
// their amaxes (zeroed by the pre-pass, reduced with atomics: non-negative). Formats (kFp8Format codes):
// format q, k, v's and the S8 quantization's; o_format o's; do_format dO's and dP8's; grad_format dQ, dK,
// dV's.
enum SdpaFp8BwdFactor : int {
  kFp8BwdDescaleQ = 0, kFp8BwdDescaleK, kFp8BwdDescaleV, kFp8BwdDescaleO, kFp8BwdDescaleDO, kFp8BwdDescaleS,
  kFp8BwdDescaleDP, kFp8BwdScaleS, kFp8BwdScaleDQ, kFp8BwdScaleDK, kFp8BwdScaleDV, kFp8BwdScaleDP,
  kFp8BwdAttnScale,  // attn_scale (a device tensor, or a host value): the pre-pass reads it, not QkvParams::scale
  kFp8BwdNumFactors
};
// The scalars the kernels use, products of factors (the pre-pass writes them to SdpaFp8BwdParams::derived):
//   kF8dQkScaleLog2  attn_scale descale_q descale_k log2(e)  (scores -> log2 units; P = exp2(s - lse2))
//   kF8dScaleS       scale_s                                 (S8 = fp8_q(P scale_s))
//   kF8dDsUnit       descale_dO descale_v                    (dS = kF8dDsUnit dO.v of the raw codes)
//   kF8dAttnScale    attn_scale                              (dP = attn_scale P (dS - D))
//   kF8dScaleDP      scale_dP                                (dP8 = fp8_dO(dP scale_dP))
//   kF8dDkUnit       descale_dP descale_q                    (dK = kF8dDkUnit sum dP8 q)
//   kF8dDvUnit       descale_s descale_dO                    (dV = kF8dDvUnit sum S8 dO)
//   kF8dDqUnit       descale_dP descale_k                    (dQ = kF8dDqUnit sum dP8 k)
//   kF8dScaleDQ, kF8dScaleDK, kF8dScaleDV                    (stored dX = fp8_grad(dX scale_dX))
//   kF8dDeltaUnit    descale_dO descale_o                    (D = kF8dDeltaUnit dO.o of the raw codes)
enum Fp8BwdDerived : int {
  kF8dQkScaleLog2 = 0, kF8dScaleS, kF8dDsUnit, kF8dAttnScale, kF8dScaleDP, kF8dDkUnit, kF8dDvUnit, kF8dDqUnit,
  kF8dScaleDQ, kF8dScaleDK, kF8dScaleDV, kF8dDeltaUnit, kFp8BwdNumDerived
};
// One FP8 tensor [B, H, S, D] as the pre-pass and the epilogues address it (element = byte strides; D
// contiguous).
struct SdpaFp8Tensor {
  void* data = nullptr;
  int64_t batch_stride = 0, head_stride = 0, row_stride = 0;
};
// Amax outputs of the backward, SdpaFp8BwdParams::amax's order.
enum SdpaFp8BwdAmax : int { kFp8AmaxDQ = 0, kFp8AmaxDK, kFp8AmaxDV, kFp8AmaxDP, kFp8BwdNumAmax };
struct SdpaFp8BwdParams : SdpaBwdParams {
  int32_t format = 1, o_format = 1, do_format = 1, grad_format = 1;
  const float* factor[kFp8BwdNumFactors] = {};
  float host_factor[kFp8BwdNumFactors] = {1.0f, 1.0f, 1.0f, 1.0f, 1.0f, 1.0f, 1.0f, 1.0f, 1.0f, 1.0f, 1.0f, 1.0f, 1.0f};
  float* amax[kFp8BwdNumAmax] = {};
  SdpaFp8Tensor q8, k8, v8, o8, do8;  // the FP8 inputs
  SdpaFp8Tensor dq8, dk8, dv8;        // the FP8 outputs
  float* derived = nullptr;           // workspace: kFp8BwdNumDerived floats
};

// The FP8 forward on the sm80 kernels (kernels/sm80/launch_sdpa_fp8_fwd_sm80.cu; on by default, PERF_LOG v2.36): every GPU
// from sm_80, the FP8 formulas of SdpaFp8Params above on the 16-bit sm80 forward. Its SdpaFwdParams
// tensors q, k, v are the workspace's bf16 copies of the FP8 inputs' codes (exact), [B, H, S, D]
// contiguous; o (and its TensorAddr) is the FP8 output (element = byte strides); the factors are fp8's
// (each CTA reads them: kernel_fwd_sm80.cuh Fp8FwdSm80). q8, k8, v8: the FP8 inputs; start8: their samples'
// starts (ragged: packed THD offsets times the multiplier, experimental; else b * batch_stride), which the widening
// reads (its copies are padded [B, H, S, D] whatever the inputs).
struct SdpaFp8FwdSm80Params : SdpaFp8FwdParams {
  SdpaFp8Tensor q8, k8, v8;
  SampleStart start8[3];  // q, k, v
};

// Paged K/V caches of an SDPA forward (kv_addr.cuh PagedKv): one side (K or V) as the kernels
// address it. A paged side is a container [num_pages, H, page_size, D] whose sample b reads
// key s from page table entry (s >> log2_page) of its row: the container's page
//   table[sample_start(table_start, b) + (s >> log2_page) * entry_stride]
// at row s & (page_size - 1) (row / head strides: QkvParams::ka / va). table null: the side is
// contiguous (AnalyticMaskParams::start locates its samples, as without paging). Entries outside
// [0, num_pages) are never read through: the loader fills the row with NaN instead.
struct SdpaPagedSide {
  const int32_t* table = nullptr;  // int32 page table [B, 1, max_pages, 1] (or packed), device
  SampleStart table_start;         // entry offset of sample b's first page (ragged, or b * stride(0))
  int64_t entry_stride = 1;        // table stride(2), entries
  int64_t page_stride = 0;         // container stride(0), elements
  int32_t log2_page = 0;           // page_size = 2^log2_page rows (any power of two, 1 included)
  int32_t num_pages = 0;           // container size(0)
};

// The paged SDPA forward's parameters (kernel_fwd_sm80.cuh sdpa_fwd_paged_kernel_sm80): the
// analytic forward's, with AnalyticMaskParams::start[kSdpaK / kSdpaV] of a paged side zero
// (its head base is the container's), and the two sides' page tables.
struct SdpaPagedFwdParams : SdpaFwdParams {
  SdpaPagedSide paged_k, paged_v;
};

// The paged SDPA forward on the sm90 kernels (kernel_fwd_sm90.cuh sdpa_fwd_paged_kernel_sm90,
// experimental): the paged forward's parameters and one int32 flag a sample in the call's workspace
// (zeroed by the launcher), which the producer sets when a page-table entry it reads lies outside the
// container (nothing is read there: kv_addr.cuh PagedKv::tma_box); the launcher then writes NaN over
// that sample's O and stats rows (sample_maps_sm90.h launch_sample_poison_sm90). A struct of its own,
// so that SdpaPagedFwdParams, the sm80 paged and decode kernels' parameter block, is unchanged.
struct SdpaPagedFwdSm90Params : SdpaPagedFwdParams {
  int32_t* bad_samples = nullptr;  // [B]
};

// The SDPA decode forward (kernel_decode_sm80.cuh; the rule that picks it: sdpa_family.cpp
// sdpa_decode_refusal): packed GQA on the 16-row decode tile and the key walk split into items
// (FlashDecoding). A task is (packed query block qb, kv head hkv, sample b), task index
// t = (b * num_heads_kv + hkv) * num_q_blocks + qb; packed row r of block qb is query position
// (16 qb + r) / G of query head hkv * G + (16 qb + r) % G (FwdParams::pack = G = H_q / H_k). Item
// i = t * splits + s walks key blocks [s * chunk, (s + 1) * chunk) of the task's Q2K row and writes
// workspace slot i (FwdSplit::o_accum [slots, 16, D_v], ml [slots, 2, 16]); a combine kernel per packed
// row merges its task's `splits` slots into O, the stats and the epilogue options (kernel_decode_sm80.cuh).
struct SdpaDecodeGrid {
  int num_q_blocks = 0;  // packed 16-row blocks per (sample, kv head): ceil(S_q G / 16)
  int num_heads_kv = 0;
  int splits = 1;        // items per task
  int chunk = 0;         // key blocks per item
  int combine_rows = 16; // combine CTAs per task: the packed rows a block can hold, min(16, S_q G)
};

// Whether an SDPA call needs the features instantiation of the sm80 analytic kernels (kernel_fwd_sm80.cuh
// AnalyticMaskSm80, kernel_bwd_sm80.cuh AnalyticMaskBwdSm80: kFeatures), i.e. something of their main
// loops beyond the mask; otherwise the mask-only kernels run it, whose loops are the flex (plan) kernels'
// with the analytic mask's hooks (launch_sdpa_{fwd,bwd}_sm80.cu).
//   forward: softcap, ALiBi, sinks (they seed the row statistics), the additive bias, dropout, the
//            block_mask, H_k != H_v (V's head); the gate, score_max / score_sum_exp, max_logit and the LSE
//            base are the epilogue's, which both instantiations run;
//   backward (dK/dV and dQ kernels): softcap, ALiBi, the bias and dBias, dropout, the block_mask,
//            H_k != H_v (two dK/dV passes); sinks / dSink (P takes the LSE; dSink has its own kernel) and
//            the gate (the preprocess's gated dO) are not theirs.
// sdpa_score_step_features: those of them but H_k != H_v, i.e. what the scores -> P step computes (the
// sm90 backward's choice of its kernel with score modifiers: its every instantiation takes H_k != H_v
// in its work items, kernel_bwd_sm90.cuh AnalyticSourceBwdSm90).
inline bool sdpa_score_step_features(const AnalyticMaskParams& a) {
  return a.score.softcap2 != 0.0f || a.score.alibi_n != 0 || a.bias.bias != nullptr || a.bias.dbias != nullptr ||
         a.dropout.mode != 0 || a.block_mask.bits != nullptr;
}
inline bool sdpa_main_loop_features(const AnalyticMaskParams& a, int group_size) {
  return sdpa_score_step_features(a) || a.score.group_v != group_size;
}
inline bool sdpa_fwd_has_features(const SdpaFwdParams& p) {
  return sdpa_main_loop_features(p.analytic, p.group_size) || p.analytic.score.sink != nullptr;
}
inline bool sdpa_bwd_has_features(const SdpaBwdParams& p) { return sdpa_main_loop_features(p.analytic, p.group_size); }

// The parameters of the SDPA backward's kernels after the preprocess (dK/dV, dQ): with the output
// gate, dO is the preprocess's dO * sigmoid(G) in the workspace ([H_q, total_q, D_v], row
// b * S_q + i of head h at (h * total_q + b * S_q + i) * D_v); otherwise p unchanged.
inline SdpaBwdParams sdpa_bwd_main_params(const SdpaBwdParams& p) {
  SdpaBwdParams m = p;
  if (p.analytic.epi.gate == nullptr) return m;
  m.dout = p.analytic.epi.do_gated;
  m.doa = TensorAddr{0, p.head_dv, p.total_q * p.head_dv};
  m.analytic.start[kSdpaDO] = SampleStart{};
  m.analytic.start[kSdpaDO].batch_stride = p.seqlen_q * p.head_dv;
  return m;
}

}  // namespace flashspan
