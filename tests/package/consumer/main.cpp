// C++ consumer of an installed flashspan (find_package + flashspan::flashspan): builds a causal
// plan on CPU tensors, runs the forward on the CPU reference backend and checks row 0 (which
// sees key 0 only, so its output is v[0] exactly) and the version of the headers vs the library.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

#include <flashspan/flashspan.hpp>

int main(int argc, char** argv) {
  using namespace flashspan::api;
  if (argc > 1 && std::strcmp(argv[1], "--version") == 0) {
    std::printf("%s\n", fs_version());
    return 0;
  }
  if (fs_abi_version() != FLASHSPAN_ABI_VERSION) {
    std::fprintf(stderr, "ABI %d of the library != %d of the headers\n", fs_abi_version(), FLASHSPAN_ABI_VERSION);
    return 1;
  }
  const int64_t B = 1, S = 16, H = 2, D = 8;
  std::vector<float> q(B * S * H * D), k(q.size()), v(q.size()), out(q.size(), NAN), lse(B * H * S, NAN);
  for (size_t i = 0; i < q.size(); ++i) {
    q[i] = float(i % 7) * 0.25f;
    k[i] = float(i % 5) * 0.5f;
    v[i] = float(i % 11) - 5.0f;
  }
  std::vector<int32_t> mask(B * S);
  for (int64_t i = 0; i < S; ++i) mask[size_t(i)] = int32_t(i + 1);  // causal
  const fs_device_t cpu = Device::cpu();
  TensorDesc tq(q.data(), kFloat32, cpu, {B, S, H, D}), tk(k.data(), kFloat32, cpu, {B, S, H, D});
  TensorDesc tv(v.data(), kFloat32, cpu, {B, S, H, D}), to(out.data(), kFloat32, cpu, {B, S, H, D});
  TensorDesc tl(lse.data(), kFloat32, cpu, {B, H, S}), tm(mask.data(), kInt32, cpu, {1, 1, B * S});
  try {
    MaskPlan plan = MaskPlan::create(PlanArgs{&tm, &tq, &tk, &tv});
    FlexAttentionFwd fwd(FwdArgs{&tq, &tk, &tv, &to, &plan}.with_lse(&tl));
    fwd.check_support();
    fwd.compile();
    fwd.execute(FwdArgs{&tq, &tk, &tv, &to, &plan}.with_lse(&tl), nullptr, 0, nullptr);
  } catch (const Exception& e) {
    std::fprintf(stderr, "flashspan error: %s\n", e.what());
    return 1;
  }
  for (int64_t h = 0; h < H; ++h)
    for (int64_t d = 0; d < D; ++d)
      if (std::fabs(out[size_t(h * D + d)] - v[size_t(h * D + d)]) > 1e-6f) {
        std::fprintf(stderr, "row 0 head %lld: out != v[0]\n", (long long)h);
        return 1;
      }
  for (float x : out)
    if (std::isnan(x)) {
      std::fprintf(stderr, "out has unwritten elements\n");
      return 1;
    }
  std::printf("C++ consumer: flashspan %s, forward on the CPU reference OK\n", fs_version());
  return 0;
}
