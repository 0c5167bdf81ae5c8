// The K/V address role of the kernels of every family (arch-neutral): where the keys and values
// of key block kb of kv head h of sample b lie in global memory. One home for the question, so
// that a second K/V layout (a paged cache, issue 24) is one more policy here and the loaders of
// both families (the sm80 cp.async tile loads, the sm90 TMA producers) stay as they are.
//
// A policy answers in the two forms the families load in:
//   pointer form (sm80 cp.async loaders): the item's head base (row 0 of the kv head in the
//     sample, today Mask::sample_ptr + h * head_stride) plus block_offset<kBlockK>(a, kb), the
//     element offset of the block's first row; the tile's rows follow at a.row_stride.
//   TMA form (sm90 producers, 4-D tensor maps (column, row, head, batch) of tma_sm90.h): per
//     item, tma_sample(...) gives the sample's coordinates; tma_row<kBlockK>(kb) the row
//     coordinate of the block's first key, tma_batch() the batch coordinate.
//
// The heads: K's kv head is the query head h / group_size (or the packed task's head); V's is the
// same but in SDPA, whose V may have its own head count (v_head: h / group_v).
//
// ContiguousKv: the rows of a [B, S, H, D] (BSHD) or [T, H, D] (THD) tensor (params.h
// TensorAddr); a THD sample starts at row cu_seqlens_k[b] of batch 0, a BSHD one at row 0 of
// batch b. The expressions are the ones the kernels had inline (scripts/sass_diff.sh: same SASS).
//
// PagedKv: a paged K/V cache (SDPA forward, params.h SdpaPagedSide): a container [num_pages,
// H, page_size, D] and, per sample, a row of page-table entries; key s of sample b lies at row
// s & (page_size - 1) of page table_b[s >> log2(page_size)]. Any power-of-two page size, 1
// included, so a key block may span pages: the policy answers per key row (row_offset), and
// the sm80 forward gathers its tiles row by row (tile_io_sm80.cuh gather_tile_async). Its head
// base has no sample term (the container's head h). A side without a page table (the seed
// lets K or V alone be paged) is one page holding the whole sample: row_offset = s * row_stride
// from the sample's head base. TMA form (the sm90 forward's producer, kernel_fwd_sm90.cuh, pages
// of 8 keys or more): a side's 4-D map (column, row, head, page) over the container (tma_sm90.h,
// the container's [num_pages, page_size, H, D] view), boxes of min(page_size, kBlockK) rows, so a
// key block is one box when a page holds whole key blocks (row (kb kBlockK) & (page_size - 1) of
// page table_b[kb kBlockK >> log2(page_size)]) and kBlockK / page_size boxes of one page each
// otherwise (>= 8 rows a box keeps the 128B swizzle atoms whole); a side without a table: its own
// [B, S, H, D] map at row kb kBlockK of batch b. Not written: the paged loader of the backward
// (the seed has no paged backward).
#pragma once

#include <cstdint>

#include "kernels/common/analytic_seqlen.cuh"
#include "kernels/params.h"

namespace flashspan::kern {

// The V head of query head h, whose K head is hk (h / group_size): hk, but for an SDPA kernel
// that reads SDPA's own V head count (kSdpaV), h / group_v: SDPA lets H_v differ from H_k, each
// dividing H_q (params.h SdpaScoreParams::group_v = H_q / H_v). Params: the FwdParams /
// BwdParams base of an SDPA kernel's parameters (analytic_of).
template <bool kSdpaV, class Params>
__device__ __forceinline__ int v_head(const Params& p, int h, int hk) {
  if constexpr (kSdpaV) {
    return h / analytic_of(p).score.group_v;
  } else {
    return hk;
  }
}

// Row `row` of head h of batch b in a [B,S,H,D] / [T,H,D] tensor (params.h) of elements Elem.
template <class Elem>
__device__ __forceinline__ const Elem* row_ptr(const void* base, const TensorAddr& a, int b, int64_t row, int h) {
  return static_cast<const Elem*>(base) + int64_t(b) * a.batch_stride + row * a.row_stride +
         int64_t(h) * a.head_stride;
}

struct ContiguousKv {
  int row0;   // TMA form: the sample's first key row in the tensor's row coordinate (THD: cu_seqlens_k[b])
  int batch;  // TMA form: the tensor's batch coordinate (BSHD: b; THD: 0)

  // Pointer form: element offset of key block kb's first row from the item's head base.
  template <int kBlockK>
  __device__ __forceinline__ static int64_t block_offset(const TensorAddr& a, int kb) {
    return int64_t(kb) * kBlockK * a.row_stride;
  }
  // The same for a block index the caller knows is non-negative (the unsigned widening is one
  // instruction less in the sm80 dQ kernel's loop).
  template <int kBlockK>
  __device__ __forceinline__ static int64_t block_offset_nonneg(const TensorAddr& a, int kb) {
    return int64_t(uint32_t(kb * kBlockK)) * a.row_stride;
  }

  // TMA form of sample b, its start read from the plan's cu_seqlens_k (only for THD).
  __device__ __forceinline__ static ContiguousKv tma_sample(const QkvParams& p, int b) {
    return ContiguousKv{p.varlen ? __ldg(p.cu_seqlens_k + b) : 0, p.varlen ? 0 : b};
  }
  // TMA form of sample b whose start k_start the kernel has read already (SeqlenInfo).
  __device__ __forceinline__ static ContiguousKv tma_sample(const QkvParams& p, int b, int k_start) {
    return ContiguousKv{p.varlen ? k_start : 0, p.varlen ? 0 : b};
  }
  template <int kBlockK>
  __device__ __forceinline__ int tma_row(int kb) const {
    return row0 + kb * kBlockK;
  }
  __device__ __forceinline__ int tma_batch() const { return batch; }
};

// It holds only sample b's first page-table entry: the rest (strides, page size, container
// size) is read from the kernel's parameters (constant memory) at each use.
struct PagedKv {
  const int32_t* entries;  // sample b's first page-table entry; null: a contiguous side

  // The policy of one side (K or V) for sample b.
  __device__ __forceinline__ static PagedKv item(const SdpaPagedSide& s, int b) {
    return PagedKv{s.table == nullptr ? nullptr : s.table + sample_start(s.table_start, b)};
  }
  // Element offset of key `key` (< the sample's length: the entries past it may be garbage)
  // from the item's head base, for side s (the parameters item() was built from). false: its
  // page-table entry lies outside the container (off then points nowhere; nothing may be read).
  __device__ __forceinline__ bool row_offset(const SdpaPagedSide& s, int key, int64_t row_stride, int64_t& off) const {
    if (entries == nullptr) {
      off = int64_t(key) * row_stride;
      return true;
    }
    const int32_t page = __ldg(entries + int64_t(key >> s.log2_page) * s.entry_stride);
    off = int64_t(page) * s.page_stride + int64_t(key & ((1 << s.log2_page) - 1)) * row_stride;
    return uint32_t(page) < uint32_t(s.num_pages);
  }

  // TMA form. log2 of the rows of side s's boxes: min(page_size, kBlockK), kBlockK for a side
  // without a table (the launcher's maps: launch_fwd_sm90.cu launch_sdpa_fwd_paged_sm90).
  template <int kBlockK>
  __device__ __forceinline__ static int tma_log2_box(const SdpaPagedSide& s) {
    constexpr int kLog2K = kBlockK == 128 ? 7 : kBlockK == 64 ? 6 : -1;
    static_assert(kLog2K > 0, "PagedKv: key blocks of 64 or 128 keys");
    return s.table == nullptr || s.log2_page > kLog2K ? kLog2K : s.log2_page;
  }
  // The coordinates (row, page) of the box whose first key is `key` (a multiple of the box rows)
  // of sample b in side s's map. A box from the sample's length `len` on reads no entry (those
  // past the sample's pages may be garbage) and lies wholly past the map (page num_pages: zero
  // filled, its bytes still counted). false: its entry lies outside the container; page is then
  // num_pages as well, so a negative or huge entry never reaches a load as a coordinate.
  __device__ __forceinline__ bool tma_box(const SdpaPagedSide& s, int b, int key, int len, int& row,
                                          int& page) const {
    if (entries == nullptr) {
      row = key;
      page = b;
      return true;
    }
    row = key & ((1 << s.log2_page) - 1);
    page = s.num_pages;
    if (key >= len) return true;
    const int32_t e = __ldg(entries + int64_t(key >> s.log2_page) * s.entry_stride);
    if (uint32_t(e) >= uint32_t(s.num_pages)) return false;
    page = e;
    return true;
  }
};

}  // namespace flashspan::kern
