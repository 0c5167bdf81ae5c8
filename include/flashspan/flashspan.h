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

/* Bumped on any incompatible change of a struct or signature in this header. */
#define FLASHSPAN_ABI_VERSION 2

typedef enum fs_status {
  FS_STATUS_SUCCESS = 0,
  FS_STATUS_INVALID_ARGUMENT = 1, /* a value or shape breaks a rule (-> ValueError) */
  FS_STATUS_TYPE_ERROR = 2,       /* wrong dtype or device kind (-> TypeError) */
  FS_STATUS_NOT_SUPPORTED = 3,    /* valid, but not implemented for this configuration */
  FS_STATUS_CUDA_ERROR = 4,       /* a CUDA runtime call failed */
  FS_STATUS_OUT_OF_MEMORY = 5,
  FS_STATUS_INTERNAL_ERROR = 6
} fs_status_t;

/* DLPack-compatible descriptors (same values and layout as DLPack v0.8+). */
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
  FS_DTYPE_BFLOAT = 4  /* kDLBfloat */
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
  int32_t has_softmax_scale;     /* 0: scale = 1/sqrt(Dqk) */
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
  int32_t has_softmax_scale;
  int32_t deterministic;         /* 1: bitwise reproducible dQ/dK/dV */
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

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* FLASHSPAN_FLASHSPAN_H_ */
