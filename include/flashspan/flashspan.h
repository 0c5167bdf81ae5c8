/*
 * flashspan — stable C ABI.
 *
 * Fused attention with arbitrary per-row interval masks ("Flex attention"):
 * every query row q lists an odd number nfunc of nondecreasing, sample-local key
 * endpoints F0..F(nfunc-1) and sees the keys [0,F0) U [F1,F2) U [F3,F4) ...
 *
 *   O = softmax(scale * Q K^T + interval_mask) V
 *
 * This header is the only interface the Python frontend (ctypes) and other
 * language bindings use. Everything is plain C: opaque handles, status codes, a
 * per-thread last-error message, and tensors described by a DLPack-compatible
 * descriptor (fs_tensor_t has the memory layout of DLPack's DLTensor).
 *
 * Tensor conventions (see DESIGN.md):
 *   BSHD: q [B,Sq,Hq,Dqk]  k [B,Sk,Hkv,Dqk]  v [B,Sk,Hkv,Dv]  out [B,Sq,Hq,Dv]  lse [B,Hq,Sq] fp32
 *   THD : q [Tq,Hq,Dqk]    k [Tk,Hkv,Dqk]    v [Tk,Hkv,Dv]    out [Tq,Hq,Dv]    lse [Hq,Tq]   fp32
 *   mask_func: int32 [Hmask, nfunc, B*Sq] (BSHD) or [Hmask, nfunc, Tq] (THD), Hmask in {1, Hq}.
 *   max_logit: fp32 [Hq].
 *   q/k/v/out dtype: fp16 or bf16 (CUDA), fp16 / bf16 / fp32 / fp64 (CPU); with fp64 inputs (CPU only:
 *   computed in double throughout) lse, dlse and max_logit are fp64.
 * Strides are in elements; only the last dimension must be contiguous.
 *
 * Every function returns FS_STATUS_SUCCESS (0) or an error status; on error
 * fs_get_last_error() returns a message naming the argument and the rule broken.
 */
#ifndef FLASHSPAN_FLASHSPAN_H_
#define FLASHSPAN_FLASHSPAN_H_

#include <stddef.h>
#include <stdint.h>

#if defined(_WIN32)
#define FS_API __declspec(dllexport)
#else
#define FS_API __attribute__((visibility("default")))
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* Bumped on any incompatible change of a struct or signature in this header (3: the FP8 SDPA slots
 * made FS_SDPA_NUM_SLOTS 64, the variant pack's length). */
#define FLASHSPAN_ABI_VERSION 3

typedef enum fs_status {
  FS_STATUS_SUCCESS = 0,
  FS_STATUS_INVALID_ARGUMENT = 1, /* a value or shape breaks a rule (-> ValueError) */
  FS_STATUS_TYPE_ERROR = 2,       /* wrong dtype or device kind (-> TypeError) */
  FS_STATUS_NOT_SUPPORTED = 3,    /* valid, but not implemented for this configuration */
  FS_STATUS_CUDA_ERROR = 4,       /* a CUDA runtime call failed */
  FS_STATUS_OUT_OF_MEMORY = 5,
  FS_STATUS_INTERNAL_ERROR = 6
} fs_status_t;

/* DLPack-compatible descriptors (same values and layout as DLPack v0.8+; the FP8 type codes are
 * DLPack v1.1's kDLFloat8_e4m3fn / kDLFloat8_e5m2). */
typedef enum fs_device_type {
  FS_DEVICE_CPU = 1,  /* kDLCPU */
  FS_DEVICE_CUDA = 2  /* kDLCUDA */
} fs_device_type_t;

typedef struct fs_device {
  int32_t device_type; /* fs_device_type_t */
  int32_t device_id;
} fs_device_t;

typedef enum fs_dtype_code {
  FS_DTYPE_INT = 0,    /* kDLInt */
  FS_DTYPE_UINT = 1,   /* kDLUInt */
  FS_DTYPE_FLOAT = 2,  /* kDLFloat */
  FS_DTYPE_BFLOAT = 4, /* kDLBfloat */
  FS_DTYPE_FLOAT8_E4M3FN = 10, /* kDLFloat8_e4m3fn, bits 8: torch.float8_e4m3fn (finite only, max 448) */
  FS_DTYPE_FLOAT8_E5M2 = 12    /* kDLFloat8_e5m2, bits 8: torch.float8_e5m2 (max 57344) */
} fs_dtype_code_t;

typedef struct fs_dtype {
  uint8_t code;   /* fs_dtype_code_t */
  uint8_t bits;   /* 16 / 32 / 8 */
  uint16_t lanes; /* always 1 */
} fs_dtype_t;

typedef struct fs_tensor {
  void* data;                /* base pointer; element (i0..) is at data + byte_offset + sum(i*stride)*itemsize */
  fs_device_t device;
  int32_t ndim;
  fs_dtype_t dtype;
  const int64_t* shape;      /* [ndim] */
  const int64_t* strides;    /* [ndim] in elements, or NULL for compact row-major */
  uint64_t byte_offset;
} fs_tensor_t;

/* ---------------------------------------------------------------------------
 * Library information and errors
 * ------------------------------------------------------------------------- */

/* Message of the last failed call on this thread ("" if none). Valid until the next call. */
FS_API const char* fs_get_last_error(void);
FS_API int32_t fs_abi_version(void);
/* Version string, e.g. "0.1.0". */
FS_API const char* fs_version(void);
/* 1 if the library was built with CUDA kernels and a CUDA device is visible, else 0. */
FS_API int32_t fs_cuda_available(void);
/* Comma-separated list of the GPU architectures compiled in, e.g. "80,90a" ("" for none). */
FS_API const char* fs_built_cuda_archs(void);

/* ---------------------------------------------------------------------------
 * Mask plan
 * ------------------------------------------------------------------------- */

typedef struct fs_mask_plan* fs_mask_plan_t;

typedef struct fs_mask_plan_args {
  const fs_tensor_t* mask_func;    /* int32 [Hmask, nfunc, B*Sq] or [Hmask, nfunc, Tq] */
  const fs_tensor_t* q;            /* sample tensors: only shape, dtype and device are read */
  const fs_tensor_t* k;
  const fs_tensor_t* v;
  const fs_tensor_t* cu_seqlens_q; /* int32 [B+1] for THD, NULL for BSHD (both or neither) */
  const fs_tensor_t* cu_seqlens_k;
  int64_t max_seqlen_q;            /* THD: required, >= every sample length; BSHD: ignored (pass 0) */
  int64_t max_seqlen_k;
  int32_t pack_gqa;                /* -1: choose, 0: off, 1: on */
  int32_t build_backward;          /* 0 or 1 */
  int32_t arch;                    /* consumer family: 0 = choose from the device, 80 = portable mma.sync, 90 = Hopper */
  void* stream;                    /* cudaStream_t for the CUDA planner (NULL = legacy default stream) */
} fs_mask_plan_args_t;

/* Geometry and statistics of a plan, filled by fs_mask_plan_get_info. */
typedef struct fs_mask_plan_info {
  int32_t varlen;          /* 1 = THD */
  int32_t batch;
  int64_t max_seqlen_q, max_seqlen_k;
  int64_t total_q, total_k; /* B*Sq, B*Sk for BSHD */
  int32_t num_heads_q, num_heads_kv, num_heads_mask, nfunc;
  int32_t head_dim_qk, head_dim_v;
  fs_dtype_t dtype;
  fs_device_t device;
  int32_t pack_gqa;
  int32_t has_backward;
  int32_t arch;             /* consumer family the payloads are laid out for */
  int32_t fwd_block_q, fwd_block_k;
  int32_t bwd_block_q, bwd_block_k;
  int64_t fwd_num_q_blocks, fwd_num_k_blocks;   /* over all samples */
  int64_t fwd_partial_blocks, fwd_full_blocks;  /* summed over mask heads */
  int64_t bwd_partial_blocks, bwd_full_blocks;
  int64_t visible_pairs;    /* number of visible (q,k) pairs, summed over mask heads */
  int64_t num_tasks;        /* forward schedule length */
  int64_t bytes;            /* total size of the plan's arrays */
  char signature[256];      /* human-readable compatibility signature */
} fs_mask_plan_info_t;

/* Builds a plan. CUDA mask -> CUDA planner on args->stream (synchronizes once to read the
 * header); CPU mask -> host planner. */
FS_API fs_status_t fs_create_mask_plan(const fs_mask_plan_args_t* args, fs_mask_plan_t* plan);
FS_API fs_status_t fs_mask_plan_destroy(fs_mask_plan_t plan);
FS_API fs_status_t fs_mask_plan_get_info(fs_mask_plan_t plan, fs_mask_plan_info_t* info);
/* Number of named arrays in the plan, and their names (for debug snapshots). */
FS_API fs_status_t fs_mask_plan_num_arrays(fs_mask_plan_t plan, int32_t* count);
FS_API fs_status_t fs_mask_plan_array_name(fs_mask_plan_t plan, int32_t index, const char** name);
/* Copies the named int32 array of the plan into host memory. With dst == NULL only
 * *num_elements is set. Synchronizes with the device for CUDA plans. */
FS_API fs_status_t fs_mask_plan_copy_array(fs_mask_plan_t plan, const char* name, int32_t* dst,
                                           int64_t capacity, int64_t* num_elements);

/* ---------------------------------------------------------------------------
 * Forward: check_support -> compile -> workspace_size -> execute (allocation-free)
 * ------------------------------------------------------------------------- */

typedef struct fs_flex_fwd* fs_flex_fwd_t;

typedef struct fs_flex_fwd_args {
  const fs_tensor_t* q;
  const fs_tensor_t* k;
  const fs_tensor_t* v;
  const fs_tensor_t* out;        /* [.., Hq, Dv], dtype of q */
  fs_mask_plan_t plan;
  const fs_tensor_t* lse;        /* optional fp32 LSE (NULL: not written) */
  const fs_tensor_t* max_logit;  /* optional fp32 [Hq] (NULL: not computed) */
  float softmax_scale;
  int32_t has_softmax_scale;     /* create: 0 = 1/sqrt(Dqk). execute: 1 = this call's scale (finite; >= 0 with
                                  * max_logit), 0 = the scale resolved at create */
} fs_flex_fwd_args_t;

/* Captures the sample descriptors (shapes, strides, dtype, device, presence of lse/max_logit). */
FS_API fs_status_t fs_flex_fwd_create(const fs_flex_fwd_args_t* sample, fs_flex_fwd_t* op);
FS_API fs_status_t fs_flex_fwd_destroy(fs_flex_fwd_t op);
FS_API fs_status_t fs_flex_fwd_check_support(fs_flex_fwd_t op);
FS_API fs_status_t fs_flex_fwd_compile(fs_flex_fwd_t op);
FS_API fs_status_t fs_flex_fwd_workspace_size(fs_flex_fwd_t op, size_t* bytes);
/* Runs on `stream` (cudaStream_t). Tensors must match the compiled descriptors; the plan
 * must be compatible with the sample plan. Allocates nothing; CUDA-graph capturable. */
FS_API fs_status_t fs_flex_fwd_execute(fs_flex_fwd_t op, const fs_flex_fwd_args_t* args, void* workspace,
                                       size_t workspace_bytes, void* stream);

/* ---------------------------------------------------------------------------
 * Backward
 * ------------------------------------------------------------------------- */

typedef struct fs_flex_bwd* fs_flex_bwd_t;

typedef struct fs_flex_bwd_args {
  const fs_tensor_t* q;
  const fs_tensor_t* k;
  const fs_tensor_t* v;
  const fs_tensor_t* out;
  const fs_tensor_t* dout;
  const fs_tensor_t* lse;        /* fp32, from the forward */
  const fs_tensor_t* dq;         /* outputs, dtypes of q/k/v */
  const fs_tensor_t* dk;
  const fs_tensor_t* dv;
  fs_mask_plan_t plan;           /* must have backward metadata */
  float softmax_scale;
  int32_t has_softmax_scale;     /* as in fs_flex_fwd_args_t: at execute, 1 = this call's scale */
  int32_t deterministic;         /* 1: bitwise reproducible dQ/dK/dV (read at create only) */
  /* Optional (NULL: no LSE gradient): fp32, shape of lse, the loss gradient w.r.t. the
   * forward's LSE. It adds dlse_i * P_ij to dS_ij (as d LSE_i / d S_ij = P_ij), i.e. it shifts
   * D_i = dO_i . O_i by -dlse_i; same cost as a backward without it. Since ABI version 2. */
  const fs_tensor_t* dlse;
} fs_flex_bwd_args_t;

FS_API fs_status_t fs_flex_bwd_create(const fs_flex_bwd_args_t* sample, fs_flex_bwd_t* op);
FS_API fs_status_t fs_flex_bwd_destroy(fs_flex_bwd_t op);
FS_API fs_status_t fs_flex_bwd_check_support(fs_flex_bwd_t op);
FS_API fs_status_t fs_flex_bwd_compile(fs_flex_bwd_t op);
FS_API fs_status_t fs_flex_bwd_workspace_size(fs_flex_bwd_t op, size_t* bytes);
FS_API fs_status_t fs_flex_bwd_execute(fs_flex_bwd_t op, const fs_flex_bwd_args_t* args, void* workspace,
                                       size_t workspace_bytes, void* stream);

/* ===========================================================================
 * SDPA: scaled dot-product attention with the cuDNN-frontend feature surface
 * (seeds/sdpa_attention.txt). Semantics, conventions and every rule: docs/SDPA.md.
 *
 *   S = attn_scale * Q K^T  -> softcap -> + bias -> + ALiBi -> masks (padding, diagonal band,
 *       block mask) -> softmax (with an optional per-head sink logit in the denominator)
 *       -> dropout -> P V -> optional output gate O * sigmoid(G)
 *
 * Tensors are 4-D in the logical order [B, H, S, D] with any strides (the last dimension
 * contiguous): BSHD memory is a [B, H, S, D] descriptor with BSHD strides. Ragged (THD)
 * tensors carry a ragged-offset tensor ([B+1] element offsets of each sample's first row,
 * times a multiplier); paged K/V are containers [num_blocks, H_k, block_size, D] addressed
 * through page tables [B, 1, max_pages, 1].
 *
 * Lifecycle as for flex: an attribute object collects the options (setters named after the
 * seed's SDPA_attributes / SDPA_backward_attributes), create() captures descriptors and
 * validates every rule, then check_support -> compile -> workspace_size -> execute. execute()
 * takes only data pointers (a variant pack indexed by fs_sdpa_slot_t): nothing is allocated,
 * nothing is read on the host for CUDA tensors, so it can be captured in a CUDA graph.
 * CPU tensors run the CPU reference. CUDA tensors run the GPU kernels (sm_80 and newer; the
 * Hopper kernels on sm_90): the masks (causal, bands, windows, padding, ragged THD), GQA/MQA
 * and H_k != H_v, LSE natural or base 2, max_logit, score_max / score_sum_exp, bias with
 * dBias, ALiBi, softcap, sinks with dSink, dropout, the block mask, the output gate, paged K/V
 * in the forward, deterministic backward (docs/SDPA.md "What runs where"); check_support
 * reports FS_STATUS_NOT_SUPPORTED naming what they do not run (e.g. an attn_scale tensor in
 * device memory in 16-bit calls). Their sequence lengths and ragged offsets stay
 * in device memory; the backward's workspace (workspace_size) holds B * S_q rows per query head.
 *
 * FP8 (the seed's sdpa_fp8 / sdpa_fp8_backward): q, k, v (and o, dO, dQ, dK, dV) of dtype
 * float8_e4m3fn / float8_e5m2 make the operation an FP8 one, with per-tensor scale factors and
 * amax outputs in the FS_SDPA_DESCALE_Q .. FS_SDPA_AMAX_DP slots and the seed's subset of
 * options (forward: causal and padding masks, THD; backward: causal); docs/SDPA.md "FP8 SDPA".
 * CPU tensors run the CPU reference. CUDA tensors: the forward on sm_90 (head dims up to 128)
 * and on sm_80 and newer (the sm80 kernels; more head dims), padded (packed THD on the sm80
 * kernels unless FLASHSPAN_SDPA_FP8_THD=0); the backward on sm_80 and newer (the sm90 kernel on sm_90); H_k !=
 * H_v in both unless FLASHSPAN_SDPA_FP8_HK_NE_HV=0; attn_scale in device memory too, read by
 * the kernels (unless FLASHSPAN_SDPA_FP8_DEVICE_ATTN_SCALE=0); check_support refuses the rest
 * with the reason.
 * ========================================================================= */

/* Tensor slots: the index of each tensor in a variant pack, and the name setters bind. */
typedef enum fs_sdpa_slot {
  FS_SDPA_Q = 0,          /* [B, H_q, S_q, D_qk]                                   */
  FS_SDPA_K = 1,          /* [B, H_k, S_kv, D_qk] or paged container [N_k, H_k, bs_k, D_qk] */
  FS_SDPA_V = 2,          /* [B, H_v, S_kv, D_v]  or paged container [N_v, H_v, bs_v, D_v]   */
  FS_SDPA_O = 3,          /* [B, H_q, S_q, D_v], dtype of q (output of the forward)          */
  FS_SDPA_STATS = 4,      /* fp32 [B, H_q, S_q, 1]: LSE (forward output, backward input)     */
  FS_SDPA_DO = 5,         /* backward: [B, H_q, S_q, D_v]                                     */
  FS_SDPA_DQ = 6,         /* backward outputs, shapes and dtype of q / k / v                  */
  FS_SDPA_DK = 7,
  FS_SDPA_DV = 8,
  FS_SDPA_SCORE_MAX = 9,      /* fp32 [B, H_q, S_q, 1] row max of the logits (set_logit_max)  */
  FS_SDPA_SCORE_SUM_EXP = 10, /* fp32 [B, H_q, S_q, 1] sum of exp(logit - row max)            */
  FS_SDPA_MAX_LOGIT = 11,     /* fp32, H_q elements: per-head max logit (QK-clip)             */
  FS_SDPA_ATTN_SCALE = 12,    /* fp32, 1 element (set_attn_scale with a tensor)               */
  FS_SDPA_BIAS = 13,          /* [1|B, 1|H_q, 1|S_q, 1|S_kv], dtype of q or fp32              */
  FS_SDPA_DBIAS = 14,         /* backward output, shape of bias                               */
  FS_SDPA_BLOCK_MASK = 15,    /* uint8 [1|B, 1|H_q, ceil(S_q/128), ceil(ceil(S_kv/128)/8)]   */
  FS_SDPA_SEQ_LEN_Q = 16,     /* int32/int64, B elements                                      */
  FS_SDPA_SEQ_LEN_KV = 17,
  FS_SDPA_CU_SEQ_LEN_Q = 18,  /* int32/int64, B+1 elements (prefix sums, leading 0)           */
  FS_SDPA_CU_SEQ_LEN_KV = 19,
  FS_SDPA_PAGE_TABLE_K = 20,  /* int32 [B, 1, max_pages_k, 1]                                 */
  FS_SDPA_PAGE_TABLE_V = 21,
  FS_SDPA_SINK_TOKEN = 22,    /* fp32, H_q elements                                           */
  FS_SDPA_DSINK_TOKEN = 23,   /* backward output, fp32, H_q elements                          */
  FS_SDPA_DROPOUT_SEED = 24,  /* int32/int64, 1 element                                       */
  FS_SDPA_DROPOUT_OFFSET = 25,
  FS_SDPA_DROPOUT_MASK = 26,  /* [1|B, 1|H_q, 1|S_q, 1|S_kv], uint8 or float                  */
  FS_SDPA_DROPOUT_SCALE = 27, /* fp32, 1 element                                              */
  FS_SDPA_DROPOUT_SCALE_INV = 28,
  FS_SDPA_RNG_DUMP = 29,      /* [B, H_q, S_q, S_kv] output: the Philox keep mask (1 / 0)     */
  FS_SDPA_GATE = 30,          /* [B, H_q, S_q, D_v], dtype of q: O * sigmoid(gate)            */
  FS_SDPA_DGATE = 31,         /* backward output, shape of gate                               */
  FS_SDPA_RAGGED_OFFSET_Q = 32, /* ragged offsets (int32/int64, B+1 elements) of Q, K, V, ... */
  FS_SDPA_RAGGED_OFFSET_K = 33,
  FS_SDPA_RAGGED_OFFSET_V = 34,
  FS_SDPA_RAGGED_OFFSET_O = 35,
  FS_SDPA_RAGGED_OFFSET_STATS = 36,
  FS_SDPA_RAGGED_OFFSET_DO = 37,
  FS_SDPA_RAGGED_OFFSET_DQ = 38,
  FS_SDPA_RAGGED_OFFSET_DK = 39,
  FS_SDPA_RAGGED_OFFSET_DV = 40,
  FS_SDPA_RAGGED_OFFSET_PAGE_TABLE_K = 41, /* packed page tables */
  FS_SDPA_RAGGED_OFFSET_PAGE_TABLE_V = 42,
  FS_SDPA_RAGGED_OFFSET_GATE = 43,
  FS_SDPA_RAGGED_OFFSET_DGATE = 44,
  /* FP8 (q, k, v float8_e4m3fn / float8_e5m2; the seed's sdpa_fp8 / sdpa_fp8_backward, docs/SDPA.md
   * "FP8 SDPA"): per-tensor scale factors, fp32, 1 element ((1, 1, 1, 1)), on q's device or the
   * host, required with FP8 inputs; amax outputs, fp32, 1 element on q's device, required too. */
  FS_SDPA_DESCALE_Q = 45,   /* forward and backward */
  FS_SDPA_DESCALE_K = 46,
  FS_SDPA_DESCALE_V = 47,
  FS_SDPA_DESCALE_S = 48,   /* of the quantized softmax probabilities S                      */
  FS_SDPA_SCALE_S = 49,
  FS_SDPA_SCALE_O = 50,     /* forward only                                                  */
  FS_SDPA_AMAX_S = 51,      /* forward output: max |S| (before scale_s)                      */
  FS_SDPA_AMAX_O = 52,      /* forward output: max |O| (before scale_o)                      */
  FS_SDPA_DESCALE_O = 53,   /* backward only                                                 */
  FS_SDPA_DESCALE_DO = 54,
  FS_SDPA_DESCALE_DP = 55,  /* of the quantized score gradient dP                            */
  FS_SDPA_SCALE_DQ = 56,
  FS_SDPA_SCALE_DK = 57,
  FS_SDPA_SCALE_DV = 58,
  FS_SDPA_SCALE_DP = 59,
  FS_SDPA_AMAX_DQ = 60,     /* backward outputs: max |dQ|, |dK|, |dV|, |dP| (before scaling)  */
  FS_SDPA_AMAX_DK = 61,
  FS_SDPA_AMAX_DV = 62,
  FS_SDPA_AMAX_DP = 63,
  FS_SDPA_NUM_SLOTS = 64
} fs_sdpa_slot_t;

typedef enum fs_sdpa_diagonal_alignment {
  FS_SDPA_TOP_LEFT = 0,     /* row i's diagonal is column i                                  */
  FS_SDPA_BOTTOM_RIGHT = 1  /* row i's diagonal is column i + (len_kv - len_q) of its sample */
} fs_sdpa_diagonal_alignment_t;

/* Options of one forward (backward = 0) or backward (backward = 1) operation. The setters
 * carry the seed's names; each returns FS_STATUS_INVALID_ARGUMENT when it does not apply to
 * the attribute object's direction. Tensor setters copy the descriptor (shape, strides,
 * dtype, device, byte_offset); its data pointer is not used: execute() takes the pointers, each
 * plus its descriptor's byte_offset, aligned to the element size. Outputs must not overlap
 * themselves (no zero or interleaving strides). NULL unbinds. */
typedef struct fs_sdpa_attributes* fs_sdpa_attributes_t;

FS_API fs_status_t fs_sdpa_attributes_create(int32_t backward, fs_sdpa_attributes_t* attr);
FS_API fs_status_t fs_sdpa_attributes_destroy(fs_sdpa_attributes_t attr);

/* Forward and backward. */
FS_API fs_status_t fs_sdpa_attributes_set_attn_scale(fs_sdpa_attributes_t attr, float value);          /* default 1 */
FS_API fs_status_t fs_sdpa_attributes_set_attn_scale_tensor(fs_sdpa_attributes_t attr, const fs_tensor_t* value);
FS_API fs_status_t fs_sdpa_attributes_set_bias(fs_sdpa_attributes_t attr, const fs_tensor_t* value);
FS_API fs_status_t fs_sdpa_attributes_set_alibi_mask(fs_sdpa_attributes_t attr, int32_t value);
FS_API fs_status_t fs_sdpa_attributes_set_padding_mask(fs_sdpa_attributes_t attr, int32_t value);
FS_API fs_status_t fs_sdpa_attributes_set_seq_len_q(fs_sdpa_attributes_t attr, const fs_tensor_t* value);
FS_API fs_status_t fs_sdpa_attributes_set_seq_len_kv(fs_sdpa_attributes_t attr, const fs_tensor_t* value);
FS_API fs_status_t fs_sdpa_attributes_set_cu_seq_len_q(fs_sdpa_attributes_t attr, const fs_tensor_t* value);
FS_API fs_status_t fs_sdpa_attributes_set_cu_seq_len_kv(fs_sdpa_attributes_t attr, const fs_tensor_t* value);
FS_API fs_status_t fs_sdpa_attributes_set_max_total_seq_len_q(fs_sdpa_attributes_t attr, int64_t value);
FS_API fs_status_t fs_sdpa_attributes_set_max_total_seq_len_kv(fs_sdpa_attributes_t attr, int64_t value);
FS_API fs_status_t fs_sdpa_attributes_set_diagonal_alignment(fs_sdpa_attributes_t attr, int32_t alignment);
FS_API fs_status_t fs_sdpa_attributes_set_diagonal_band_left_bound(fs_sdpa_attributes_t attr, int64_t value);
FS_API fs_status_t fs_sdpa_attributes_set_diagonal_band_right_bound(fs_sdpa_attributes_t attr, int64_t value);
/* DEPRECATED (seed semantics): TOP_LEFT alignment and right bound 0 unless a right bound was set. */
FS_API fs_status_t fs_sdpa_attributes_set_causal_mask(fs_sdpa_attributes_t attr, int32_t value);
/* DEPRECATED: BOTTOM_RIGHT alignment and right bound 0 unless a right bound was set. */
FS_API fs_status_t fs_sdpa_attributes_set_causal_mask_bottom_right(fs_sdpa_attributes_t attr, int32_t value);
/* DEPRECATED: set_diagonal_band_left_bound(value). */
FS_API fs_status_t fs_sdpa_attributes_set_sliding_window_length(fs_sdpa_attributes_t attr, int64_t value);
FS_API fs_status_t fs_sdpa_attributes_set_block_mask(fs_sdpa_attributes_t attr, const fs_tensor_t* value);
/* Philox dropout: probability in [0, 1), seed and offset int32/int64 tensors of one element. */
FS_API fs_status_t fs_sdpa_attributes_set_dropout(fs_sdpa_attributes_t attr, float probability,
                                                  const fs_tensor_t* seed, const fs_tensor_t* offset);
/* Caller dropout mask (multiplies P, broadcast over dims of size 1) and its scale; scale_inv
 * (backward only, optional) is accepted for parity with the seed. */
FS_API fs_status_t fs_sdpa_attributes_set_dropout_mask(fs_sdpa_attributes_t attr, const fs_tensor_t* mask,
                                                       const fs_tensor_t* scale, const fs_tensor_t* scale_inv);
FS_API fs_status_t fs_sdpa_attributes_set_rng_dump(fs_sdpa_attributes_t attr, const fs_tensor_t* value);
FS_API fs_status_t fs_sdpa_attributes_set_sink_token(fs_sdpa_attributes_t attr, const fs_tensor_t* value);
/* flashspan extensions: tanh softcap (value > 0) and the output gate O * sigmoid(gate). */
FS_API fs_status_t fs_sdpa_attributes_set_softcap(fs_sdpa_attributes_t attr, float value);
FS_API fs_status_t fs_sdpa_attributes_set_gate(fs_sdpa_attributes_t attr, const fs_tensor_t* value);
/* Ragged layout of one tensor (tensor in {Q, K, V, O, STATS, DO, DQ, DK, DV, PAGE_TABLE_K,
 * PAGE_TABLE_V, GATE, DGATE}): offsets[b] * multiplier is the element offset of sample b's
 * first row (the batch stride of the descriptor is then ignored). */
FS_API fs_status_t fs_sdpa_attributes_set_ragged_offset(fs_sdpa_attributes_t attr, int32_t tensor,
                                                        const fs_tensor_t* offsets, int64_t multiplier);

/* Forward only. */
FS_API fs_status_t fs_sdpa_attributes_set_generate_stats(fs_sdpa_attributes_t attr, int32_t value);
FS_API fs_status_t fs_sdpa_attributes_set_is_inference(fs_sdpa_attributes_t attr, int32_t value); /* DEPRECATED */
FS_API fs_status_t fs_sdpa_attributes_set_stats_use_log2(fs_sdpa_attributes_t attr, int32_t value);
FS_API fs_status_t fs_sdpa_attributes_set_logit_max(fs_sdpa_attributes_t attr, const fs_tensor_t* value);
FS_API fs_status_t fs_sdpa_attributes_set_score_sum_exp(fs_sdpa_attributes_t attr, const fs_tensor_t* value);
FS_API fs_status_t fs_sdpa_attributes_set_max_logit(fs_sdpa_attributes_t attr, const fs_tensor_t* value);
FS_API fs_status_t fs_sdpa_attributes_set_paged_attention_k_table(fs_sdpa_attributes_t attr, const fs_tensor_t* value);
FS_API fs_status_t fs_sdpa_attributes_set_paged_attention_v_table(fs_sdpa_attributes_t attr, const fs_tensor_t* value);
FS_API fs_status_t fs_sdpa_attributes_set_paged_attention_max_seq_len_kv(fs_sdpa_attributes_t attr, int64_t value);

/* FP8 scale factors and amax outputs (slots FS_SDPA_DESCALE_Q .. FS_SDPA_AMAX_DP; seed names). Forward and
 * backward: descale_q, descale_k, descale_v, descale_s, scale_s. */
FS_API fs_status_t fs_sdpa_attributes_set_descale_q(fs_sdpa_attributes_t attr, const fs_tensor_t* value);
FS_API fs_status_t fs_sdpa_attributes_set_descale_k(fs_sdpa_attributes_t attr, const fs_tensor_t* value);
FS_API fs_status_t fs_sdpa_attributes_set_descale_v(fs_sdpa_attributes_t attr, const fs_tensor_t* value);
FS_API fs_status_t fs_sdpa_attributes_set_descale_s(fs_sdpa_attributes_t attr, const fs_tensor_t* value);
FS_API fs_status_t fs_sdpa_attributes_set_scale_s(fs_sdpa_attributes_t attr, const fs_tensor_t* value);
/* Forward only: scale_o and the outputs amax_s, amax_o. */
FS_API fs_status_t fs_sdpa_attributes_set_scale_o(fs_sdpa_attributes_t attr, const fs_tensor_t* value);
FS_API fs_status_t fs_sdpa_attributes_set_amax_s(fs_sdpa_attributes_t attr, const fs_tensor_t* value);
FS_API fs_status_t fs_sdpa_attributes_set_amax_o(fs_sdpa_attributes_t attr, const fs_tensor_t* value);
/* Backward only: descale_o, descale_dO, descale_dP, scale_dQ, scale_dK, scale_dV, scale_dP and the outputs
 * amax_dQ, amax_dK, amax_dV, amax_dP. */
FS_API fs_status_t fs_sdpa_attributes_set_descale_o(fs_sdpa_attributes_t attr, const fs_tensor_t* value);
FS_API fs_status_t fs_sdpa_attributes_set_descale_do(fs_sdpa_attributes_t attr, const fs_tensor_t* value);
FS_API fs_status_t fs_sdpa_attributes_set_descale_dp(fs_sdpa_attributes_t attr, const fs_tensor_t* value);
FS_API fs_status_t fs_sdpa_attributes_set_scale_dq(fs_sdpa_attributes_t attr, const fs_tensor_t* value);
FS_API fs_status_t fs_sdpa_attributes_set_scale_dk(fs_sdpa_attributes_t attr, const fs_tensor_t* value);
FS_API fs_status_t fs_sdpa_attributes_set_scale_dv(fs_sdpa_attributes_t attr, const fs_tensor_t* value);
FS_API fs_status_t fs_sdpa_attributes_set_scale_dp(fs_sdpa_attributes_t attr, const fs_tensor_t* value);
FS_API fs_status_t fs_sdpa_attributes_set_amax_dq(fs_sdpa_attributes_t attr, const fs_tensor_t* value);
FS_API fs_status_t fs_sdpa_attributes_set_amax_dk(fs_sdpa_attributes_t attr, const fs_tensor_t* value);
FS_API fs_status_t fs_sdpa_attributes_set_amax_dv(fs_sdpa_attributes_t attr, const fs_tensor_t* value);
FS_API fs_status_t fs_sdpa_attributes_set_amax_dp(fs_sdpa_attributes_t attr, const fs_tensor_t* value);

/* Backward only. */
FS_API fs_status_t fs_sdpa_attributes_set_dbias(fs_sdpa_attributes_t attr, const fs_tensor_t* value);
FS_API fs_status_t fs_sdpa_attributes_set_dsink_token(fs_sdpa_attributes_t attr, const fs_tensor_t* value);
FS_API fs_status_t fs_sdpa_attributes_set_dgate(fs_sdpa_attributes_t attr, const fs_tensor_t* value);
FS_API fs_status_t fs_sdpa_attributes_set_deterministic_algorithm(fs_sdpa_attributes_t attr, int32_t value);

/* Forward operation. stats: the fp32 [B, H_q, S_q, 1] LSE output, required iff
 * generate_stats is set (NULL otherwise). Validates every rule of docs/SDPA.md. */
typedef struct fs_sdpa_fwd* fs_sdpa_fwd_t;
FS_API fs_status_t fs_sdpa_fwd_create(const fs_tensor_t* q, const fs_tensor_t* k, const fs_tensor_t* v,
                                      const fs_tensor_t* o, const fs_tensor_t* stats, fs_sdpa_attributes_t attr,
                                      fs_sdpa_fwd_t* op);
FS_API fs_status_t fs_sdpa_fwd_destroy(fs_sdpa_fwd_t op);
FS_API fs_status_t fs_sdpa_fwd_check_support(fs_sdpa_fwd_t op);
FS_API fs_status_t fs_sdpa_fwd_compile(fs_sdpa_fwd_t op);
FS_API fs_status_t fs_sdpa_fwd_workspace_size(fs_sdpa_fwd_t op, size_t* bytes);
/* variant_pack[slot]: data pointer of every bound slot (NULL for unbound slots);
 * num_slots must be FS_SDPA_NUM_SLOTS. */
FS_API fs_status_t fs_sdpa_fwd_execute(fs_sdpa_fwd_t op, void* const* variant_pack, int32_t num_slots,
                                       void* workspace, size_t workspace_bytes, void* stream);

/* Backward operation (stats: the forward's natural-log LSE). */
typedef struct fs_sdpa_bwd* fs_sdpa_bwd_t;
FS_API fs_status_t fs_sdpa_bwd_create(const fs_tensor_t* q, const fs_tensor_t* k, const fs_tensor_t* v,
                                      const fs_tensor_t* o, const fs_tensor_t* dO, const fs_tensor_t* stats,
                                      const fs_tensor_t* dQ, const fs_tensor_t* dK, const fs_tensor_t* dV,
                                      fs_sdpa_attributes_t attr, fs_sdpa_bwd_t* op);
FS_API fs_status_t fs_sdpa_bwd_destroy(fs_sdpa_bwd_t op);
FS_API fs_status_t fs_sdpa_bwd_check_support(fs_sdpa_bwd_t op);
FS_API fs_status_t fs_sdpa_bwd_compile(fs_sdpa_bwd_t op);
FS_API fs_status_t fs_sdpa_bwd_workspace_size(fs_sdpa_bwd_t op, size_t* bytes);
FS_API fs_status_t fs_sdpa_bwd_execute(fs_sdpa_bwd_t op, void* const* variant_pack, int32_t num_slots,
                                       void* workspace, size_t workspace_bytes, void* stream);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* FLASHSPAN_FLASHSPAN_H_ */
