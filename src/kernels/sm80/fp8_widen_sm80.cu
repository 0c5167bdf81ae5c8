// The FP8 SDPA pre-pass both FP8 launchers of the sm80 family share (launch_sdpa_fp8_fwd_sm80.cu,
// launch_sdpa_fp8_bwd_sm80.cu): FP8 tensors' codes widened to bf16 copies, which the 16-bit kernels read
// (exact: every E4M3 / E5M2 value is a bf16 value). Conversions by kernels/common/fp8_soft.h (no FP8
// instruction before sm_89).
#include <algorithm>
#include <cstdint>

#include "kernels/common/experimental_switch.h"
#include "kernels/common/fp8_soft.h"
#include "kernels/common/grid.h"
#include "kernels/common/launch_util.h"
#include "kernels/common/ptx.cuh"
#include "kernels/sm80/fp8_bwd_prepass_sm80.h"
#include "kernels/sm80/launch_sm80.h"

namespace flashspan::kern {
namespace {

// Job blockIdx.y: an FP8 tensor [B, heads, rows, cols] (byte strides) widened to bf16 [B, heads, rows, cols]
// contiguous at dst (cols even: pairs); grid-stride over the pairs.
__global__ void __launch_bounds__(256) fp8_widen_kernel(const sm80::Fp8WidenJobs jobs) {
  const sm80::Fp8WidenJob& j = jobs.job[blockIdx.y];
  const int pairs = j.cols / 2;
  const int64_t total = int64_t(j.batch) * j.heads * j.rows * pairs;
  const uint8_t* src = static_cast<const uint8_t*>(j.src.data);
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int c = int(i % pairs);
    int64_t r = i / pairs;  // (b, h, s) row
    const int s = int(r % j.rows);
    r /= j.rows;
    const int h = int(r % j.heads);
    const int b = int(r / j.heads);
    const uint8_t* x = src + int64_t(b) * j.src.batch_stride + int64_t(h) * j.src.head_stride +
                       int64_t(s) * j.src.row_stride + 2 * c;
    j.dst[i] = pack2<BFloat16>(fp8_soft_decode(__ldg(x), j.e5m2 != 0), fp8_soft_decode(__ldg(x + 1), j.e5m2 != 0));
  }
}

// Eight codes a thread (one 8-byte load, one 16-byte store; launch_fp8_widen_sm80 checks the 8-byte
// alignment): a quarter of the pair kernel's index arithmetic, whose int64 divisions bound it (about 260 us
// for q, k, v, dO at B = 1, H = 16, S = 8192, D = 128 on the H200: PERF_LOG v2.36). Experimental, not yet
// run on a GPU (fp8_widen_vec_enabled).
__global__ void __launch_bounds__(256) fp8_widen8_kernel(const sm80::Fp8WidenJobs jobs) {
  const sm80::Fp8WidenJob& j = jobs.job[blockIdx.y];
  const int groups = j.cols / 8;
  const int64_t total = int64_t(j.batch) * j.heads * j.rows * groups;
  const uint8_t* src = static_cast<const uint8_t*>(j.src.data);
  const bool e5 = j.e5m2 != 0;
  auto pair = [e5](uint32_t w, int sh) {
    return pack2<BFloat16>(fp8_soft_decode((w >> sh) & 0xffu, e5), fp8_soft_decode((w >> (sh + 8)) & 0xffu, e5));
  };
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int c = int(i % groups);
    int64_t r = i / groups;  // (b, h, s) row
    const int s = int(r % j.rows);
    r /= j.rows;
    const int h = int(r % j.heads);
    const int b = int(r / j.heads);
    const uint2 v = __ldg(reinterpret_cast<const uint2*>(src + int64_t(b) * j.src.batch_stride +
                                                         int64_t(h) * j.src.head_stride + int64_t(s) * j.src.row_stride +
                                                         8 * c));
    reinterpret_cast<uint4*>(j.dst)[i] = make_uint4(pair(v.x, 0), pair(v.x, 16), pair(v.y, 0), pair(v.y, 16));
  }
}

}  // namespace
}  // namespace flashspan::kern

namespace flashspan::sm80 {

namespace {
kern::ExperimentalSwitch g_widen_vec;

// A job the eight-code kernel takes: its source's base and strides multiples of 8 bytes, its columns of 8.
bool widen8_ok(const Fp8WidenJob& j) {
  return reinterpret_cast<uintptr_t>(j.src.data) % 8 == 0 && j.src.batch_stride % 8 == 0 &&
         j.src.head_stride % 8 == 0 && j.src.row_stride % 8 == 0 && j.cols % 8 == 0;
}
}  // namespace

Fp8WidenJob fp8_widen_job(const SdpaFp8Tensor& src, const void* dst, int batch, int heads, int rows, int cols,
                          int format) {
  Fp8WidenJob j;
  j.src = src;
  j.dst = static_cast<uint32_t*>(const_cast<void*>(dst));
  j.batch = batch;
  j.heads = heads;
  j.rows = rows;
  j.cols = cols;
  j.e5m2 = format == 2 ? 1 : 0;
  return j;
}

void set_fp8_widen_vec_enabled(int on) { g_widen_vec.set(on); }
bool fp8_widen_vec_enabled() { return g_widen_vec.on(); }

void launch_fp8_widen_sm80(const Fp8WidenJobs& jobs, int num_jobs, cudaStream_t stream) {
  bool vec = fp8_widen_vec_enabled();
  for (int i = 0; i < num_jobs; ++i) vec = vec && widen8_ok(jobs.job[i]);
  int64_t most = 0;
  for (int i = 0; i < num_jobs; ++i) {
    const Fp8WidenJob& j = jobs.job[i];
    most = std::max<int64_t>(most, int64_t(j.batch) * j.heads * j.rows * (j.cols / (vec ? 8 : 2)));
  }
  if (most == 0) return;
  const dim3 grid(grid_stride_1d(most, 256), unsigned(num_jobs));
  if (vec) {
    kern::fp8_widen8_kernel<<<grid, 256, 0, stream>>>(jobs);
  } else {
    kern::fp8_widen_kernel<<<grid, 256, 0, stream>>>(jobs);
  }
  check_launch("sdpa fp8: widen");
}

}  // namespace flashspan::sm80
