// CUDA mask planner (host orchestration; device passes in planner_kernels.cuh).
//
// Stages, all on the caller's stream:
//   1. validate endpoints (first error by (mask head, row, endpoint)), count partial / full
//      blocks per Q2K row of each view (one CTA per (mask head, query block)), exclusive
//      scans (CUB), a one-thread kernel that fills the header;
//   2. read the header back (exact 64-bit list sizes), raise endpoint errors with the host
//      planner's message and format-limit errors before anything is sized from the counts;
//   3. backward only: the backward Q2K lists into scratch, the K2Q full-run events counted
//      per Q2K row (plan_runs.h) and a second read-back of their total; then the plan buffer
//      is allocated exactly (one cudaMalloc);
//   4. materialise: partial lists, full runs and payloads (classifier re-run per query
//      block), K2Q partial entries by a stable radix sort of the backward Q2K entries by K2Q
//      row (so each K2Q row keeps the ascending Q2K order of query blocks), K2Q full runs by
//      stable sorts of the start and end events by K2Q row, schedules by a radix sort of
//      ((~cost) << 32 | task index).
// Scratch (linear in blocks and listed entries) comes from two cudaMallocAsync arenas and
// is freed in stream order before returning.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cub/device/device_radix_sort.cuh>
#include <cub/device/device_scan.cuh>
#include <vector>

#include "core/validation.h"
#include "core/error.h"
#include "kernels/common/grid.h"
#include "plan/plan_layout.h"
#include "plan/planner.h"
#include "plan/planner_kernels.cuh"

namespace flashspan {
namespace {

using namespace plan_gpu;

#define FS_PLAN_CUDA(expr)                                                                                 \
  do {                                                                                                     \
    const cudaError_t fs_err_ = (expr);                                                                    \
    if (fs_err_ != cudaSuccess) {                                                                          \
      (void)cudaGetLastError();                                                                            \
      throw ::flashspan::Error(fs_err_ == cudaErrorMemoryAllocation ? ::flashspan::Status::kOutOfMemory    \
                                                                    : ::flashspan::Status::kCudaError,     \
                               ::flashspan::detail::concat("CUDA planner: ", #expr, " failed: ",           \
                                                           cudaGetErrorString(fs_err_)));                  \
    }                                                                                                      \
  } while (0)

#define FS_PLAN_LAUNCHED() FS_PLAN_CUDA(cudaGetLastError())

// An allocation failure is Error(kOutOfMemory) naming what was allocated and its size; the
// (non-sticky) error is cleared, so the library and the process's CUDA context stay usable.
[[noreturn]] void throw_alloc_error(cudaError_t err, size_t bytes, const char* what) {
  (void)cudaGetLastError();
  if (err == cudaErrorMemoryAllocation)
    throw Error(Status::kOutOfMemory, detail::concat("create_mask_plan: out of device memory allocating ", what, " (",
                                                     bytes, " bytes = ", double(bytes) / double(1ull << 30),
                                                     " GiB); use fewer mask heads or shorter sequences, or free "
                                                     "device memory"));
  throw Error(Status::kCudaError,
              detail::concat("create_mask_plan: allocating ", what, " (", bytes, " bytes) failed: ",
                             cudaGetErrorString(err)));
}

void* device_alloc(size_t bytes, const char* what) {
  void* p = nullptr;
  const cudaError_t err = cudaMalloc(&p, std::max<size_t>(bytes, 1));
  if (err != cudaSuccess) throw_alloc_error(err, bytes, what);
  return p;
}

// Scratch: one stream-ordered allocation per planning phase, carved into 256-byte aligned
// pieces (few cudaMallocAsync calls: the default pool may return memory to the system at
// every synchronization, so each call can cost a mapping). Freed in stream order when the
// arena goes away, also when an exception unwinds. Use: run the same `carve` code once on
// a Sizer, then on the Arena.
struct Sizer {
  size_t bytes = 0;
  template <typename T>
  T* take(long long n) {
    bytes = (bytes + 255) / 256 * 256 + size_t(std::max<long long>(n, 1)) * sizeof(T);
    return nullptr;
  }
};

class Arena {
 public:
  Arena(cudaStream_t s, size_t bytes) : stream_(s) {
    const cudaError_t err = cudaMallocAsync(&base_, std::max<size_t>(bytes, 256), s);
    if (err != cudaSuccess) {
      base_ = nullptr;
      throw_alloc_error(err, bytes, "planner scratch");
    }
    size_ = bytes;
  }
  ~Arena() {
    if (base_ != nullptr) (void)cudaFreeAsync(base_, stream_);
  }
  Arena(const Arena&) = delete;
  Arena& operator=(const Arena&) = delete;
  template <typename T>
  T* take(long long n) {
    off_ = (off_ + 255) / 256 * 256;
    T* p = reinterpret_cast<T*>(static_cast<char*>(base_) + off_);
    off_ += size_t(std::max<long long>(n, 1)) * sizeof(T);
    FS_CHECK(off_ <= size_, Status::kInternal, "CUDA planner: scratch arena overflow");
    return p;
  }

 private:
  cudaStream_t stream_;
  void* base_ = nullptr;
  size_t size_ = 0, off_ = 0;
};

template <typename CarveFn>
std::unique_ptr<Arena> make_arena(cudaStream_t st, CarveFn carve) {
  Sizer sizer;
  carve(sizer);
  auto arena = std::make_unique<Arena>(st, sizer.bytes);
  carve(*arena);
  return arena;
}

// CTAs of a grid-stride planner kernel over n elements (kernels/common/grid.h, issue 18: the
// kernels loop over any n; `cap` bounds the grid, not the extent).
int grid_for(long long n, int cap = 4096) {
  return static_cast<int>(std::max<long long>(1, std::min<long long>(cap, (n + kThreads - 1) / kThreads)));
}

int32_t* arr(MaskPlan& plan, const char* name) {
  int32_t* p = const_cast<int32_t*>(plan.array(name));
  FS_CHECK(p != nullptr, Status::kInternal, "CUDA planner: plan array ", name, " missing");
  return p;
}

// One view (tile shape) of the plan during planning.
struct ViewState {
  int bq = 0, bk = 0;
  int group = 1;             // G of a packed-GQA forward view, else 1
  bool shared_mask = false;  // Hmask == 1
  std::vector<int32_t> qbs, kbs;  // host block starts
  const int32_t* d_qbs = nullptr;  // device copies (meta scratch)
  const int32_t* d_kbs = nullptr;
  long long nqb = 0, nkb = 0, rows = 0;  // rows = (virtual) mask heads * NQB
  long long* p_cnt = nullptr;  // [rows + 1], last entry 0 (64-bit: totals past 2^31 stay exact)
  long long* f_cnt = nullptr;
  long long* p_ptr = nullptr;  // scanned (64-bit scratch; narrowed into the plan once checked)
  long long* f_ptr = nullptr;
  int chunk = 1;
  size_t smem = 0;  // dynamic shared memory of the classifier (difference array)
};

RelationArgs relation_args(const FlexGeometry& g, const int32_t* mask, const int32_t* d_cu_q, const int32_t* d_cu_k,
                           const ViewState& v) {
  RelationArgs a{};
  a.mask = mask;
  a.T = g.total_q;
  a.nfunc = g.nfunc;
  a.batch = g.batch;
  a.group = v.group;
  a.shared_mask = v.shared_mask;
  a.cu_q = d_cu_q;
  a.cu_k = d_cu_k;
  a.qbs = v.d_qbs;
  a.kbs = v.d_kbs;
  a.bq = v.bq;
  a.bk = v.bk;
  a.nqb_all = v.nqb;
  a.nkb_all = v.nkb;
  a.chunk = v.chunk;
  return a;
}

// `packed`: the packed-GQA forward view (mask_plan.h).
void setup_view(ViewState& v, const FlexGeometry& g, int bq, int bk, bool packed) {
  v.bq = bq;
  v.bk = bk;
  v.group = fwd_pack_group(g, packed);
  v.shared_mask = g.num_heads_mask == 1;
  v.qbs = block_starts(g.cu_seqlens_q, bq, v.group);
  v.kbs = block_starts(g.cu_seqlens_k, bk);
  v.nqb = v.qbs.back();
  v.nkb = v.kbs.back();
  v.rows = int64_t(fwd_mask_heads(g, packed)) * v.nqb;
  FS_CHECK_SUPPORTED(v.rows < (int64_t(1) << 31) && int64_t(g.num_heads_mask) * v.nkb < (int64_t(1) << 31),
                     "mask_func: Hmask x blocks exceeds 2^31 for tile ", bq, "x", bk);
  int64_t max_nkb = 1;
  for (int b = 0; b < g.batch; ++b) max_nkb = std::max<int64_t>(max_nkb, v.kbs[b + 1] - v.kbs[b]);
  v.chunk = static_cast<int>(std::min<int64_t>(kChunk, max_nkb));
  v.smem = size_t(v.chunk + 1) * sizeof(int32_t);
}

// Schedule scratch: sort keys in and out plus CUB temp storage.
struct ScheduleScratch {
  unsigned long long* keys = nullptr;
  unsigned long long* sorted = nullptr;
  void* tmp = nullptr;
  size_t tmp_bytes = 0;
};

size_t schedule_sort_bytes(long long n, cudaStream_t st) {
  size_t bytes = 0;
  if (n > 0)
    FS_PLAN_CUDA(cub::DeviceRadixSort::SortKeys(nullptr, bytes, static_cast<unsigned long long*>(nullptr),
                                                static_cast<unsigned long long*>(nullptr), n, 0, 64, st));
  return bytes;
}

// ((~cost) << 32 | t) keys, radix sort, decode into `tasks`.
void build_schedule(const ScheduleArgs& sa, int32_t* tasks, const ScheduleScratch& s, cudaStream_t st) {
  if (sa.num_tasks == 0) return;
  schedule_keys_kernel<<<grid_for(sa.num_tasks), kThreads, 0, st>>>(sa, s.keys);
  FS_PLAN_LAUNCHED();
  size_t bytes = s.tmp_bytes;
  FS_PLAN_CUDA(cub::DeviceRadixSort::SortKeys(s.tmp, bytes, s.keys, s.sorted, sa.num_tasks, 0, 64, st));
  schedule_write_kernel<<<grid_for(sa.num_tasks), kThreads, 0, st>>>(sa, s.sorted, tasks);
  FS_PLAN_LAUNCHED();
}

int bits_for(long long max_value) {
  int bits = 1;
  while (bits < 32 && (1ll << bits) <= max_value) ++bits;
  return bits;
}

void launch_payloads(const FlexGeometry& g, const int32_t* mask, const int32_t* d_cu_q, const ViewState& v,
                     long long num_partial, const int32_t* p_ptr, const int32_t* p_kb, uint32_t* bits,
                     cudaStream_t st) {
  if (num_partial == 0) return;
  PayloadArgs a{};
  a.mask = mask;
  a.T = g.total_q;
  a.nfunc = g.nfunc;
  a.batch = g.batch;
  a.group = v.group;
  a.shared_mask = v.shared_mask;
  a.cu_q = d_cu_q;
  a.qbs = v.d_qbs;
  a.bq = v.bq;
  a.bk = v.bk;
  a.nqb_all = v.nqb;
  a.rows_all = v.rows;
  a.p_ptr = p_ptr;
  a.p_kb = p_kb;
  a.num_partial = num_partial;
  a.bits = bits;
  const long long ctas = (num_partial + kPayloadEntriesPerCta - 1) / kPayloadEntriesPerCta;
  payload_kernel<<<grid_1d(ctas, "CUDA planner: payload"), kThreads, 0, st>>>(a);
  FS_PLAN_LAUNCHED();
}

}  // namespace

std::unique_ptr<MaskPlan> build_mask_plan_cuda(const PlanRequest& req, const int32_t* mask, void* stream) {
  check_plan_request(req);
  const FlexGeometry& g = *req.geometry;
  FS_CHECK_ARG(mask != nullptr || g.total_q == 0, "mask_func: device endpoints are required");
  const cudaStream_t st = static_cast<cudaStream_t>(stream);
  const bool bwd = req.build_backward;
  const Consumer& c = req.consumer;
  const int B = g.batch, Hm = g.num_heads_mask;
  const long long T = g.total_q;
  const bool packed = plan_is_packed(req);

  ViewState fv, bv;
  setup_view(fv, g, c.fwd_block_q, c.fwd_block_k, packed);
  if (bwd) setup_view(bv, g, c.bwd_block_q, c.bwd_block_k, false);

  // ---- Phase 1 scratch: meta (cu_q, cu_k, fwd/bwd block starts, each B+1), counts and
  // pointers [fwd p | fwd f | bwd p | bwd f] (each rows + 1, 64-bit), K2Q event counts and
  // offsets [starts | ends] (bwd rows + 1 each), header, scan temp storage.
  const long long fr = fv.rows + 1, br = bwd ? bv.rows + 1 : 0;
  size_t scan_bytes = 0;
  for (long long n : {fr, br}) {
    size_t need = 0;
    if (n > 0)
      FS_PLAN_CUDA(cub::DeviceScan::ExclusiveSum(nullptr, need, static_cast<long long*>(nullptr),
                                                 static_cast<long long*>(nullptr), n, st));
    scan_bytes = std::max(scan_bytes, need);
  }
  int32_t* d_meta = nullptr;
  long long *d_cnt = nullptr, *d_ptr = nullptr, *d_ev_cnt = nullptr, *d_ev_off = nullptr;
  Header* d_hdr = nullptr;
  void* scan_tmp = nullptr;
  auto phase1 = make_arena(st, [&](auto& a) {
    d_meta = a.template take<int32_t>(6ll * (B + 1));
    d_cnt = a.template take<long long>(2 * fr + 2 * br);
    d_ptr = a.template take<long long>(2 * fr + 2 * br);
    d_ev_cnt = a.template take<long long>(2 * br);
    d_ev_off = a.template take<long long>(2 * br);
    d_hdr = a.template take<Header>(1);
    scan_tmp = a.template take<char>(static_cast<long long>(scan_bytes));
  });
  std::vector<int32_t> meta;
  const std::vector<int32_t>* parts[] = {&g.cu_seqlens_q, &g.cu_seqlens_k, &fv.qbs, &fv.kbs, &bv.qbs, &bv.kbs};
  for (const std::vector<int32_t>* v : parts) {
    std::vector<int32_t> x = *v;
    x.resize(B + 1, 0);  // bwd vectors are empty without backward
    meta.insert(meta.end(), x.begin(), x.end());
  }
  FS_PLAN_CUDA(cudaMemcpyAsync(d_meta, meta.data(), meta.size() * sizeof(int32_t), cudaMemcpyHostToDevice, st));
  const int32_t* d_cu_q = d_meta;
  const int32_t* d_cu_k = d_meta + (B + 1);
  fv.d_qbs = d_meta + 2 * (B + 1);
  fv.d_kbs = d_meta + 3 * (B + 1);
  bv.d_qbs = d_meta + 4 * (B + 1);
  bv.d_kbs = d_meta + 5 * (B + 1);
  FS_PLAN_CUDA(cudaMemsetAsync(d_cnt, 0, size_t(2 * fr + 2 * br) * sizeof(long long), st));
  if (bwd) FS_PLAN_CUDA(cudaMemsetAsync(d_ev_cnt, 0, size_t(2 * br) * sizeof(long long), st));
  fv.p_cnt = d_cnt;
  fv.f_cnt = d_cnt + fr;
  fv.p_ptr = d_ptr;
  fv.f_ptr = d_ptr + fr;
  if (bwd) {
    bv.p_cnt = d_cnt + 2 * fr;
    bv.f_cnt = d_cnt + 2 * fr + br;
    bv.p_ptr = d_ptr + 2 * fr;
    bv.f_ptr = d_ptr + 2 * fr + br;
  }
  init_header_kernel<<<1, 1, 0, st>>>(d_hdr);
  FS_PLAN_LAUNCHED();
  auto hdr_field = [&](size_t offset) {
    return reinterpret_cast<unsigned long long*>(reinterpret_cast<char*>(d_hdr) + offset);
  };

  // ---- 1. Validate, count (partial blocks and full runs per row), scan.
  if (Hm * T > 0) {
    validate_kernel<<<grid_for(Hm * T), kThreads, 0, st>>>(mask, T, g.nfunc, Hm, B, d_cu_q, d_cu_k, d_hdr);
    FS_PLAN_LAUNCHED();
  }
  for (ViewState* v : {&fv, &bv}) {
    if (v->rows == 0) continue;  // also skips the backward view when not requested
    RelationArgs a = relation_args(g, mask, d_cu_q, d_cu_k, *v);
    a.p_cnt = v->p_cnt;
    a.f_cnt = v->f_cnt;
    a.visible = v == &fv ? hdr_field(offsetof(Header, visible)) : nullptr;
    a.full_blocks = hdr_field(v == &fv ? offsetof(Header, fwd_full_blocks) : offsetof(Header, bwd_full_blocks));
    relation_kernel<false><<<grid_1d(v->rows, "CUDA planner: relation"), kThreads, v->smem, st>>>(a);
    FS_PLAN_LAUNCHED();
  }
  {
    const long long offs[4] = {0, fr, 2 * fr, 2 * fr + br};
    const long long lens[4] = {fr, fr, br, br};
    for (int k = 0; k < 4; ++k) {
      if (lens[k] == 0) continue;
      size_t bytes = scan_bytes;
      FS_PLAN_CUDA(cub::DeviceScan::ExclusiveSum(scan_tmp, bytes, d_cnt + offs[k], d_ptr + offs[k], lens[k], st));
    }
  }
  finalize_header_kernel<<<1, 1, 0, st>>>(d_hdr, mask, T, g.nfunc, B, d_cu_q, d_cu_k, fv.p_ptr + fv.rows,
                                          fv.f_ptr + fv.rows, bwd ? bv.p_ptr + bv.rows : nullptr,
                                          bwd ? bv.f_ptr + bv.rows : nullptr);
  FS_PLAN_LAUNCHED();

  // ---- 2. First read-back: exact 64-bit list sizes, endpoint errors.
  Header h{};
  FS_PLAN_CUDA(cudaMemcpyAsync(&h, d_hdr, sizeof(Header), cudaMemcpyDeviceToHost, st));
  FS_PLAN_CUDA(cudaStreamSynchronize(st));
  if (h.err_key != ~0ull) throw_endpoint_error(int(h.err_kind), h.err_hm, h.err_row, h.err_index, h.err_value,
                                               h.err_limit, g);
  // Refuse lists past the format's limit before anything is sized from them.
  check_list_entries("forward", "partial", h.fwd_partial, fv.bq, fv.bk, fwd_mask_heads(g, packed));
  check_list_entries("forward", "full-run", h.fwd_full, fv.bq, fv.bk, fwd_mask_heads(g, packed));
  if (bwd) {
    check_list_entries("backward", "partial", h.bwd_partial, bv.bq, bv.bk, Hm);
    check_list_entries("backward", "full-run", h.bwd_full, bv.bq, bv.bk, Hm);
  }

  auto plan = std::make_unique<MaskPlan>();
  plan->geometry = g;
  plan->signature.consumer = c;
  plan->signature.has_backward = bwd;
  plan->signature.pack_gqa = packed;
  PlanCounts& n = plan->counts;
  n.fwd_num_q_blocks = fv.nqb;
  n.fwd_num_k_blocks = fv.nkb;
  n.fwd_partial = h.fwd_partial;
  n.fwd_full = static_cast<int64_t>(h.fwd_full_blocks);
  n.fwd_full_runs = h.fwd_full;
  // A packed view with one shared mask head holds every query row G times.
  n.visible_pairs = static_cast<int64_t>(h.visible) / (fv.shared_mask ? fv.group : 1);
  n.num_tasks = int64_t(g.num_heads_q / fv.group) * fv.nqb;

  // ---- 3. Backward: Q2K lists into scratch, K2Q full-run events counted, second read-back
  // (the K2Q run count sizes the plan). The lists are copied into the plan afterwards.
  const long long np = h.bwd_partial, nfr = h.bwd_full;
  const long long k2q_rows = bwd ? int64_t(Hm) * bv.nkb : 0;
  const int end_bit = bits_for(k2q_rows);
  int32_t *b_p_kb = nullptr, *b_runs = nullptr, *p_qb = nullptr;
  uint32_t* p_key = nullptr;
  std::unique_ptr<Arena> phase_b;
  K2QEventArgs ev{};
  if (bwd) {
    n.bwd_num_q_blocks = bv.nqb;
    n.bwd_num_k_blocks = bv.nkb;
    n.bwd_partial = np;
    n.bwd_full = static_cast<int64_t>(h.bwd_full_blocks);
    n.bwd_full_runs = nfr;
    n.num_bwd_tasks = int64_t(g.num_heads_kv) * bv.nkb;
    phase_b = make_arena(st, [&](auto& a) {
      b_p_kb = a.template take<int32_t>(np);
      b_runs = a.template take<int32_t>(2 * nfr);
      p_key = a.template take<uint32_t>(np);
      p_qb = a.template take<int32_t>(np);
    });
    if (bv.rows > 0) {
      RelationArgs a = relation_args(g, mask, d_cu_q, d_cu_k, bv);
      a.p_ptr = bv.p_ptr;
      a.f_ptr = bv.f_ptr;
      a.p_kb = b_p_kb;
      a.f_runs = b_runs;
      a.p_key = p_key;
      a.p_qb = p_qb;
      relation_kernel<true><<<grid_1d(bv.rows, "CUDA planner: relation"), kThreads, bv.smem, st>>>(a);
      FS_PLAN_LAUNCHED();
      ev.batch = B;
      ev.qbs = bv.d_qbs;
      ev.kbs = bv.d_kbs;
      ev.nqb_all = bv.nqb;
      ev.nkb_all = bv.nkb;
      ev.rows = bv.rows;
      ev.f_ptr = bv.f_ptr;
      ev.runs = b_runs;
      ev.s_cnt = d_ev_cnt;
      ev.e_cnt = d_ev_cnt + br;
      ev.s_off = d_ev_off;
      ev.e_off = d_ev_off + br;
      k2q_events_kernel<false><<<grid_for(bv.rows), kThreads, 0, st>>>(ev);
      FS_PLAN_LAUNCHED();
      for (int k = 0; k < 2; ++k) {
        size_t bytes = scan_bytes;
        FS_PLAN_CUDA(cub::DeviceScan::ExclusiveSum(scan_tmp, bytes, d_ev_cnt + k * br, d_ev_off + k * br, br, st));
      }
      finalize_k2q_header_kernel<<<1, 1, 0, st>>>(d_hdr, d_ev_off + bv.rows, d_ev_off + br + bv.rows);
      FS_PLAN_LAUNCHED();
      FS_PLAN_CUDA(cudaMemcpyAsync(&h, d_hdr, sizeof(Header), cudaMemcpyDeviceToHost, st));
      FS_PLAN_CUDA(cudaStreamSynchronize(st));
      FS_CHECK(h.k2q_starts == h.k2q_ends, Status::kInternal, "CUDA planner: K2Q full runs have ", h.k2q_starts,
               " starts but ", h.k2q_ends, " ends");
    }
    n.bwd_k2q_full_runs = h.k2q_starts;
  }
  const long long nk2q = n.bwd_k2q_full_runs;

  // Throws (naming the limit and the exact 64-bit sizes) before anything is allocated or
  // written when a list passes the format's int32 limit.
  assign_plan_layout(*plan, /*keep_mask=*/false);
  plan->device_buffer = static_cast<int32_t*>(device_alloc(size_t(plan->buffer_elements) * sizeof(int32_t), "the plan"));
  void* buf = plan->device_buffer;
  FS_PLAN_CUDA(cudaMemsetAsync(buf, 0, size_t(plan->buffer_elements) * sizeof(int32_t), st));

  // ---- Phase 2 scratch: K2Q sort inputs/outputs and temp storage, schedule sort keys.
  size_t k2q_bytes = 0;
  for (long long items : {np, nk2q}) {
    if (items <= 0) continue;
    size_t need = 0;
    FS_PLAN_CUDA(cub::DeviceRadixSort::SortPairs(nullptr, need, static_cast<uint32_t*>(nullptr),
                                                 static_cast<uint32_t*>(nullptr), static_cast<int32_t*>(nullptr),
                                                 static_cast<int32_t*>(nullptr), items, 0, end_bit, st));
    k2q_bytes = std::max(k2q_bytes, need);
  }
  ScheduleScratch fs, bs;
  fs.tmp_bytes = schedule_sort_bytes(n.num_tasks, st);
  bs.tmp_bytes = schedule_sort_bytes(n.num_bwd_tasks, st);
  uint32_t *keys_sorted = nullptr, *keys_sorted2 = nullptr;
  int32_t *iota = nullptr, *s_sorted = nullptr, *e_sorted = nullptr;
  void* k2q_tmp = nullptr;
  auto phase2 = make_arena(st, [&](auto& a) {
    fs.keys = a.template take<unsigned long long>(n.num_tasks);
    fs.sorted = a.template take<unsigned long long>(n.num_tasks);
    fs.tmp = a.template take<char>(static_cast<long long>(fs.tmp_bytes));
    if (!bwd) return;
    bs.keys = a.template take<unsigned long long>(n.num_bwd_tasks);
    bs.sorted = a.template take<unsigned long long>(n.num_bwd_tasks);
    bs.tmp = a.template take<char>(static_cast<long long>(bs.tmp_bytes));
    keys_sorted = a.template take<uint32_t>(std::max(np, nk2q));
    keys_sorted2 = a.template take<uint32_t>(nk2q);
    iota = a.template take<int32_t>(np);
    ev.s_key = a.template take<uint32_t>(nk2q);
    ev.s_val = a.template take<int32_t>(nk2q);
    ev.e_key = a.template take<uint32_t>(nk2q);
    ev.e_val = a.template take<int32_t>(nk2q);
    s_sorted = a.template take<int32_t>(nk2q);
    e_sorted = a.template take<int32_t>(nk2q);
    k2q_tmp = a.template take<char>(static_cast<long long>(k2q_bytes));
  });

  // ---- 4. Materialise. Small arrays first, in one launch (64-bit pointers narrowed).
  {
    Segments s{};
    auto seg = [&](const auto* src, const char* name, long long count) {
      if constexpr (sizeof(*src) == sizeof(long long)) {
        s.src[s.count] = nullptr;
        s.src64[s.count] = reinterpret_cast<const long long*>(src);
      } else {
        s.src[s.count] = src;
        s.src64[s.count] = nullptr;
      }
      s.dst[s.count] = arr(*plan, name);
      s.n[s.count] = count;
      ++s.count;
    };
    seg(d_cu_q, "cu_seqlens_q", B + 1);
    seg(d_cu_k, "cu_seqlens_k", B + 1);
    seg(fv.d_qbs, "fwd_q_block_start", B + 1);
    seg(fv.d_kbs, "fwd_k_block_start", B + 1);
    seg(fv.p_ptr, "fwd_q2k_partial_ptr", fr);
    seg(fv.f_ptr, "fwd_q2k_full_ptr", fr);
    if (bwd) {
      seg(bv.d_qbs, "bwd_q_block_start", B + 1);
      seg(bv.d_kbs, "bwd_k_block_start", B + 1);
      seg(bv.p_ptr, "bwd_q2k_partial_ptr", br);
      seg(bv.f_ptr, "bwd_q2k_full_ptr", br);
    }
    const long long longest = std::max(fr, std::max<long long>(br, B + 1));
    // gridDim.y = s.count <= kMaxSegments (12): the only 2-D grid, bounded by a constant.
    copy_segments_kernel<<<dim3(grid_for(longest, 1024), s.count), kThreads, 0, st>>>(s);
    FS_PLAN_LAUNCHED();
  }
  if (fv.rows > 0) {
    RelationArgs a = relation_args(g, mask, d_cu_q, d_cu_k, fv);
    a.p_ptr = fv.p_ptr;
    a.f_ptr = fv.f_ptr;
    a.p_kb = arr(*plan, "fwd_q2k_partial_kb");
    a.f_runs = arr(*plan, "fwd_q2k_full_runs");
    relation_kernel<true><<<grid_1d(fv.rows, "CUDA planner: relation"), kThreads, fv.smem, st>>>(a);
    FS_PLAN_LAUNCHED();
  }
  launch_payloads(g, mask, d_cu_q, fv, n.fwd_partial, arr(*plan, "fwd_q2k_partial_ptr"), arr(*plan, "fwd_q2k_partial_kb"),
                  reinterpret_cast<uint32_t*>(arr(*plan, "fwd_q2k_partial_bits")), st);
  {
    // Tasks over query heads, or kv heads of a packed view (CSR head 0 when Hmask == 1).
    ScheduleArgs sa{};
    sa.batch = B;
    sa.heads = g.num_heads_q / fv.group;
    sa.group = 1;
    sa.shared_mask = Hm == 1;
    sa.starts = fv.d_qbs;
    sa.nblk_all = fv.nqb;
    sa.p_ptr = arr(*plan, "fwd_q2k_partial_ptr");
    sa.f_ptr = arr(*plan, "fwd_q2k_full_ptr");
    sa.runs = arr(*plan, "fwd_q2k_full_runs");
    sa.num_tasks = n.num_tasks;
    build_schedule(sa, arr(*plan, "fwd_tasks"), fs, st);
  }

  if (bwd) {
    if (np > 0)
      FS_PLAN_CUDA(cudaMemcpyAsync(arr(*plan, "bwd_q2k_partial_kb"), b_p_kb, size_t(np) * sizeof(int32_t),
                                   cudaMemcpyDeviceToDevice, st));
    if (nfr > 0)
      FS_PLAN_CUDA(cudaMemcpyAsync(arr(*plan, "bwd_q2k_full_runs"), b_runs, size_t(2 * nfr) * sizeof(int32_t),
                                   cudaMemcpyDeviceToDevice, st));
    launch_payloads(g, mask, d_cu_q, bv, np, arr(*plan, "bwd_q2k_partial_ptr"), arr(*plan, "bwd_q2k_partial_kb"),
                    reinterpret_cast<uint32_t*>(arr(*plan, "bwd_q2k_partial_bits")), st);
    // K2Q partial: stable radix sort of the entries (in Q2K order) by K2Q row keeps each K2Q
    // row's query blocks ascending, as the host planner's row-order scatter does.
    int32_t* k2q_p_ptr = arr(*plan, "bwd_k2q_partial_ptr");
    int32_t* k2q_f_ptr = arr(*plan, "bwd_k2q_full_ptr");
    if (np > 0) {
      int32_t* k2q_idx = arr(*plan, "bwd_k2q_partial_idx");
      iota_kernel<<<grid_for(np), kThreads, 0, st>>>(iota, np);
      FS_PLAN_LAUNCHED();
      size_t bytes = k2q_bytes;
      FS_PLAN_CUDA(
          cub::DeviceRadixSort::SortPairs(k2q_tmp, bytes, p_key, keys_sorted, iota, k2q_idx, np, 0, end_bit, st));
      gather_kernel<<<grid_for(np), kThreads, 0, st>>>(k2q_idx, p_qb, arr(*plan, "bwd_k2q_partial_qb"), np);
      FS_PLAN_LAUNCHED();
    }
    lower_bound_ptr_kernel<<<grid_for(k2q_rows + 1), kThreads, 0, st>>>(keys_sorted, np, k2q_p_ptr, k2q_rows);
    FS_PLAN_LAUNCHED();
    // K2Q full runs: events in Q2K row order, stable-sorted by K2Q row; start k pairs with end k.
    if (nk2q > 0) {
      k2q_events_kernel<true><<<grid_for(bv.rows), kThreads, 0, st>>>(ev);
      FS_PLAN_LAUNCHED();
      size_t bytes = k2q_bytes;
      FS_PLAN_CUDA(cub::DeviceRadixSort::SortPairs(k2q_tmp, bytes, ev.s_key, keys_sorted, ev.s_val, s_sorted, nk2q, 0,
                                                   end_bit, st));
      bytes = k2q_bytes;
      FS_PLAN_CUDA(cub::DeviceRadixSort::SortPairs(k2q_tmp, bytes, ev.e_key, keys_sorted2, ev.e_val, e_sorted, nk2q,
                                                   0, end_bit, st));
      interleave_runs_kernel<<<grid_for(nk2q), kThreads, 0, st>>>(s_sorted, e_sorted, arr(*plan, "bwd_k2q_full_runs"),
                                                                   nk2q);
      FS_PLAN_LAUNCHED();
    }
    lower_bound_ptr_kernel<<<grid_for(k2q_rows + 1), kThreads, 0, st>>>(keys_sorted, nk2q, k2q_f_ptr, k2q_rows);
    FS_PLAN_LAUNCHED();

    ScheduleArgs sa{};
    sa.batch = B;
    sa.heads = g.num_heads_kv;
    sa.group = g.group_size();
    sa.shared_mask = Hm == 1;
    sa.starts = bv.d_kbs;
    sa.nblk_all = bv.nkb;
    sa.p_ptr = k2q_p_ptr;
    sa.f_ptr = k2q_f_ptr;
    sa.runs = arr(*plan, "bwd_k2q_full_runs");
    sa.num_tasks = n.num_bwd_tasks;
    build_schedule(sa, arr(*plan, "bwd_tasks"), bs, st);
  }
  return plan;
}

void copy_cu_seqlens_to_host(const TensorView& cu_seqlens_q, const TensorView& cu_seqlens_k, void* stream,
                             std::vector<int32_t>* q_host, std::vector<int32_t>* k_host) {
  const TensorView* both[2] = {&cu_seqlens_q, &cu_seqlens_k};
  const char* names[2] = {"cu_seqlens_q", "cu_seqlens_k"};
  std::vector<int32_t>* hosts[2] = {q_host, k_host};
  for (int i = 0; i < 2; ++i) {
    const TensorView& t = *both[i];
    FS_CHECK_TYPE(t.dtype == DType::kInt32, names[i], ": dtype must be int32, got ", dtype_name(t.dtype));
    FS_CHECK_ARG(t.ndim == 1 && (t.size(0) < 2 || t.stride(0) == 1), names[i],
                 ": must be a contiguous 1-D int32 tensor [B+1]");
    FS_CHECK_TYPE(t.is_cuda(), names[i], ": must be on the same device as q (a CUDA device)");
  }
  auto s = static_cast<cudaStream_t>(stream);
  for (int i = 0; i < 2; ++i) {
    hosts[i]->resize(both[i]->numel());
    if (!hosts[i]->empty())
      FS_PLAN_CUDA(cudaMemcpyAsync(hosts[i]->data(), both[i]->data, hosts[i]->size() * sizeof(int32_t),
                                   cudaMemcpyDeviceToHost, s));
  }
  FS_PLAN_CUDA(cudaStreamSynchronize(s));
}

std::unique_ptr<MaskPlan> copy_plan_to_device(const MaskPlan& host_plan) {
  FS_CHECK_ARG(!host_plan.on_device(), "plan: is already a device plan");
  auto plan = std::make_unique<MaskPlan>();
  plan->geometry = host_plan.geometry;
  plan->signature = host_plan.signature;
  plan->counts = host_plan.counts;
  plan->arrays = host_plan.arrays;
  plan->buffer_elements = host_plan.buffer_elements;
  const size_t bytes = size_t(std::max<int64_t>(host_plan.buffer_elements, 1)) * sizeof(int32_t);
  void* buf = device_alloc(bytes, "the plan");
  plan->device_buffer = static_cast<int32_t*>(buf);
  if (host_plan.buffer_elements > 0)
    FS_PLAN_CUDA(cudaMemcpy(buf, host_plan.host_buffer.data(), size_t(host_plan.buffer_elements) * sizeof(int32_t),
                            cudaMemcpyHostToDevice));
  return plan;
}

std::unique_ptr<MaskPlan> copy_plan_to_host(const MaskPlan& device_plan) {
  FS_CHECK_ARG(device_plan.on_device(), "plan: is not a device plan");
  auto plan = std::make_unique<MaskPlan>();
  plan->geometry = device_plan.geometry;
  plan->signature = device_plan.signature;
  plan->counts = device_plan.counts;
  plan->arrays = device_plan.arrays;
  plan->buffer_elements = device_plan.buffer_elements;
  plan->host_buffer.resize(device_plan.buffer_elements);
  // cudaMemcpy waits for the planner's stream-ordered writes on the legacy default stream;
  // callers on other streams synchronize them first.
  if (device_plan.buffer_elements > 0)
    FS_PLAN_CUDA(cudaMemcpy(plan->host_buffer.data(), device_plan.device_buffer,
                            size_t(device_plan.buffer_elements) * sizeof(int32_t), cudaMemcpyDeviceToHost));
  return plan;
}

}  // namespace flashspan
