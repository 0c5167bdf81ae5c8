// Instantiations and launch of the SDPA decode forward (kernel_decode_sm80.cuh): the 16 x 64 decode
// tile on the 128 head-dim tile (exact / predicated head dims) x {fp16, bf16} x {contiguous, paged
// K / V}: 8 kernels, and the combine kernel per dtype. Runs on every GPU the sm80 family runs on
// (sm_80 and newer, sm_90 included: decode is bound by the K / V reads, which mma.sync keeps up with).
#include <algorithm>
#include <atomic>

#include "kernels/common/fwd_launch.h"
#include "kernels/sm80/kernel_decode_sm80.cuh"
#include "kernels/sm80/launch_sm80.h"

namespace flashspan::sm80 {
namespace {

std::atomic<int64_t> g_decode_launches{0};

template <class T, class E, class KvAddr>
void run_sdpa_decode(const SdpaPagedFwdParams& p, int64_t slot_capacity, cudaStream_t stream) {
  static_assert(T::kBlockQ == kDecodeBlockQ && T::kSmemBytes == fwd_smem_bytes(T::kBlockQ, T::kBlockK, T::kDqk, T::kDv));
  auto kernel = kern::sdpa_fwd_decode_kernel_sm80<T, E, KvAddr>;
  static std::atomic<uint64_t> smem_set{0};
  ensure_smem_limit(kernel, T::kSmemBytes, smem_set, "sdpa decode forward: cudaFuncSetAttribute(MaxDynamicSharedMemorySize)");
  static std::atomic<int> ctas_cache[64];
  const int ctas = persistent_ctas(kernel, T::kThreads, T::kSmemBytes, ctas_cache, "sdpa decode forward");
  const SdpaDecodeGrid d = sdpa_decode_grid(p, ctas);
  const int64_t tasks = int64_t(p.batch) * d.num_heads_kv * d.num_q_blocks;
  if (tasks == 0) return;
  const int64_t items = tasks * d.splits;
  FS_CHECK(items <= 0x7fffffff && items <= slot_capacity, Status::kInternal, "sdpa decode forward: ", items,
           " items, the workspace holds ", slot_capacity, " slots");
  kernel<<<unsigned(items), T::kThreads, T::kSmemBytes, stream>>>(p, d);
  check_launch("sdpa decode forward (sm80)");
  FS_CHECK(tasks <= 0x7fffffff / kDecodeBlockQ && d.combine_rows > 0, Status::kInternal, "sdpa decode combine: ", tasks,
           " tasks");
  // A programmatic dependent of the decode kernel: its launch and index arithmetic overlap the
  // decode kernel's last items.
  launch_dependent(kern::sdpa_fwd_decode_combine_kernel<E>, unsigned(tasks * d.combine_rows), kern::kDecodeCombineThreads,
                   0, stream, "sdpa decode combine (sm80)", static_cast<const SdpaFwdParams&>(p), d);
  g_decode_launches.fetch_add(1, std::memory_order_relaxed);
}

}  // namespace

SdpaDecodeGrid sdpa_decode_grid(const SdpaFwdParams& p, int ctas) {
  const DecodeShape s = decode_shape(p.batch, p.num_heads_q / p.group_size, p.analytic.max_q, p.pack, p.analytic.max_kv);
  const DecodeSplit split = decode_split(s.tasks, s.key_blocks, ctas);
  SdpaDecodeGrid d;
  d.num_q_blocks = s.num_q_blocks;
  d.num_heads_kv = p.num_heads_q / p.group_size;
  d.splits = split.splits;
  d.chunk = split.chunk;
  // Rows past max_q G hold no query (rows_to_store stops there): no CTA of the combine for them.
  d.combine_rows = int(std::min<int64_t>(kDecodeBlockQ, int64_t(p.analytic.max_q) * p.pack));
  return d;
}

int64_t sdpa_decode_launches() { return g_decode_launches.load(std::memory_order_relaxed); }

void launch_sdpa_fwd_decode_sm80(const SdpaPagedFwdParams& p, int64_t slot_capacity, DType dtype,
                                 cudaStream_t stream) {
  FS_CHECK(p.pack == p.group_size && p.head_dqk <= 128 && p.head_dv <= 128 &&
               (slot_capacity == 0 || (p.split.o_accum != nullptr && p.split.ml != nullptr)),
           Status::kInternal, "sdpa decode forward: parameters of a call it does not take");
  if (p.max_logit != nullptr) launch_max_logit_reset(p.max_logit, p.num_heads_q, stream);
  // No slot: no task (B, H_k or S_q is 0), so no row of O or of the statistics to write (an empty output); max_logit
  // (per head, over no row) keeps the reset's -inf.
  if (slot_capacity == 0) return;
  const bool paged = p.paged_k.table != nullptr || p.paged_v.table != nullptr;
  kern::with_fwd_tile_traits_sm80<kDecodeBlockQ, 128, 128, 1, 4, false>(p.head_dqk, p.head_dv, [&](auto t) {
    with_element_type(dtype, "sdpa decode forward (sm80)", [&](auto e) {
      if (paged) {
        run_sdpa_decode<decltype(t), decltype(e), kern::PagedKv>(p, slot_capacity, stream);
      } else {
        run_sdpa_decode<decltype(t), decltype(e), kern::ContiguousKv>(p, slot_capacity, stream);
      }
    });
  });
}

}  // namespace flashspan::sm80
