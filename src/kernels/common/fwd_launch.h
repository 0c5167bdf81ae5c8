// Host launches of the forward's arch-neutral kernels, shared by the launchers of every family
// (launch_fwd_sm80.cu, launch_fwd_sm90.cu; SDPA's launch_sdpa_fwd_sm80.cu, launch_fwd_sm90.cu): the
// max_logit reset, the split schedule's count, scan, items and combine (fwd_split.cuh), and SDPA's
// rng_dump and statistics padding. Instantiated once, in fwd_launch.cu.
#pragma once

#include <cuda_runtime.h>

#include "core/tensor_view.h"
#include "kernels/params.h"

namespace flashspan {

// max_logit[0 .. heads) = -inf on the stream (the forward reduces into it; cudaMemsetAsync
// cannot write -inf).
void launch_max_logit_reset(float* max_logit, int heads, cudaStream_t stream);

// Steps A (count), S (scan) and B (items) of the split schedule of p.split, whose num_ctas is
// the persistent grid the forward will run. items_always: write the items of every task (a
// family whose persistent kernel runs the item list on every call, sm90); otherwise only
// when the scan split some task (sm80: when none is, the one-CTA-per-task kernel runs and
// reads no item).
void launch_fwd_split_schedule(const FwdParams& p, bool items_always, cudaStream_t stream);

// Step C: the rows of the split tasks from their items' slots (tasks that were not split
// return at once).
void launch_fwd_split_combine(const FwdParams& p, DType dtype, cudaStream_t stream);

// SDPA's rng_dump (p.analytic.dropout.rng_dump, else nothing): the Philox keep mask of every element of
// [B, H_q, S_q, S_kv], 1 / 0, 0 outside the samples, in the dump's dtype; written by a kernel of its own
// from core/philox.h, the generator the forward kernels of both families draw their masks from.
void launch_sdpa_fwd_rng_dump(const SdpaFwdParams& p, cudaStream_t stream);

// SDPA's score_max / score_sum_exp beside a packed O (p.analytic.start[kSdpaO] ragged; else, or without
// those outputs, nothing): their padded rows past each sample, which the forward's blocks do not reach
// (they stop at a packed O's sample), set to -inf / 0, the values of a row that sees nothing; rows inside
// the samples are left to the forward. Switched by sdpa_launch.h sdpa_feature_pairs_enabled.
void launch_sdpa_fwd_stats_padding(const SdpaFwdParams& p, cudaStream_t stream);

}  // namespace flashspan
