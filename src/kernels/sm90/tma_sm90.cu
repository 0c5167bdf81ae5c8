// Tensor maps of the sm90 kernels (tma_sm90.h).
#include "kernels/sm90/tma_sm90.h"

#include <cuda_runtime.h>
#include <cudaTypedefs.h>

#include <algorithm>
#include <utility>

#include "core/error.h"

namespace flashspan::sm90 {
namespace {

// cuTensorMapEncodeTiled through the runtime's driver entry point (no -lcuda).
PFN_cuTensorMapEncodeTiled_v12000 encode_fn() {
  static PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult q{};
    const cudaError_t e = cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault, &q);
    FS_CHECK(e == cudaSuccess && q == cudaDriverEntryPointSuccess && f != nullptr, Status::kCudaError,
             "sm90 kernels: cuTensorMapEncodeTiled is not available from the driver");
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(f);
  }();
  return fn;
}

// The map of make_tensor_map_sm90 for elements of es bytes of TMA type `type`, boxes of box_cols
// columns (box_cols x es bytes, the swizzle span `swizzle`).
CUtensorMap encode_map(const TensorView& t, bool varlen, CUtensorMapDataType type, int64_t es, int box_cols,
                       CUtensorMapSwizzle swizzle, int box_rows, const char* name, int pack) {
  FS_CHECK(pack >= 1 && box_rows % pack == 0, Status::kInternal, name, ": packed box of ", box_rows, " rows for ",
           pack, " heads");
  uint64_t dims[4];
  uint64_t strides[3];  // bytes, dims 1..3
  auto safe = [&](int64_t extent, int64_t stride) -> uint64_t {
    // A dimension of extent 1 is only ever indexed at 0: any valid stride does.
    return extent <= 1 ? uint64_t(16) : uint64_t(stride * es);
  };
  if (varlen) {
    dims[0] = uint64_t(t.shape[2]);
    dims[1] = uint64_t(std::max<int64_t>(t.shape[0], 1));
    dims[2] = uint64_t(t.shape[1]);
    dims[3] = 1;
    strides[0] = safe(t.shape[0], t.strides[0]);
    strides[1] = safe(t.shape[1], t.strides[1]);
    strides[2] = 16;
  } else {
    dims[0] = uint64_t(t.shape[3]);
    dims[1] = uint64_t(std::max<int64_t>(t.shape[1], 1));
    dims[2] = uint64_t(t.shape[2]);
    dims[3] = uint64_t(t.shape[0]);
    strides[0] = safe(t.shape[1], t.strides[1]);
    strides[1] = safe(t.shape[2], t.strides[2]);
    strides[2] = safe(t.shape[0], t.strides[0]);
  }
  uint32_t box[4] = {uint32_t(box_cols), uint32_t(box_rows), 1, 1};
  if (pack > 1) {
    // Packed rows: heads (dim 2) inside rows (dim 1), so that a box's rows come out as
    // position-major, head-minor packed rows.
    std::swap(dims[1], dims[2]);
    std::swap(strides[0], strides[1]);
    box[1] = uint32_t(pack);
    box[2] = uint32_t(box_rows / pack);
  }
  const uint32_t estr[4] = {1, 1, 1, 1};
  CUtensorMap m;
  const CUresult r = encode_fn()(&m, type, 4, t.data, dims, strides, box, estr, CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle,
                                 CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  FS_CHECK(r == CUDA_SUCCESS, Status::kCudaError, name, ": cuTensorMapEncodeTiled failed (error ", int(r),
           ") for an sm90 kernel's tensor map");
  return m;
}

}  // namespace

CUtensorMap make_tensor_map_sm90(const TensorView& t, bool varlen, DType dtype, int box_rows, const char* name,
                                 int pack) {
  return encode_map(t, varlen, dtype == DType::kBFloat16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
                    2, 64, CU_TENSOR_MAP_SWIZZLE_128B, box_rows, name, pack);
}

CUtensorMap make_tensor_map_fp8_sm90(const TensorView& t, int box_cols, int box_rows, const char* name) {
  FS_CHECK(box_cols == 64 || box_cols == 128, Status::kInternal, name, ": FP8 box of ", box_cols, " columns");
  return encode_map(t, false, CU_TENSOR_MAP_DATA_TYPE_UINT8, 1, box_cols,
                    box_cols == 128 ? CU_TENSOR_MAP_SWIZZLE_128B : CU_TENSOR_MAP_SWIZZLE_64B, box_rows, name, 1);
}

bool make_tensor_map_bias_sm90(const TensorView& bias, int box_rows, CUtensorMap* m) {
  // Extent 1 (stride 16: any valid one) along a broadcast dimension, else the bias's own.
  auto extent = [&](int d) -> uint64_t {
    return bias.size(d) <= 1 || bias.stride(d) == 0 ? 1u : uint64_t(bias.size(d));
  };
  auto stride = [&](int d) -> uint64_t { return extent(d) == 1 ? 16u : uint64_t(bias.stride(d)) * 2u; };
  const uint64_t dims[4] = {uint64_t(bias.size(3)), extent(2), extent(1), extent(0)};
  const uint64_t strides[3] = {stride(2), stride(1), stride(0)};
  const uint32_t box[4] = {64, uint32_t(box_rows), 1, 1};
  const uint32_t estr[4] = {1, 1, 1, 1};
  CUtensorMap map;
  const CUresult r = encode_fn()(&map, CU_TENSOR_MAP_DATA_TYPE_UINT16, 4, bias.data, dims, strides, box, estr,
                                 CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                                 CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) return false;
  *m = map;
  return true;
}

}  // namespace flashspan::sm90
