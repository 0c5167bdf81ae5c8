// libFuzzer target: fs_create_mask_plan and validation on CPU tensors, then the forward on
// the CPU reference backend.
//
// Each input decodes to one call: layout (BSHD/THD), batch, sequence lengths, heads (Hq, Hkv,
// Hmask), nfunc, head dims, dtypes, ranks, strides, cu_seqlens (valid or corrupted),
// max_seqlen, endpoints (valid or raw), pack_gqa / build_backward / arch codes, with a small
// share of "wild" values (negative, 2^31, 2^32 + 1, INT64_MAX). Invariants checked:
//   - no crash, sanitizer report or hang (ASan + UBSan build, libFuzzer's timeout);
//   - every failure has a known status (never INTERNAL or CUDA on CPU input) and a message
//     that names the argument ("<name>: <rule>");
//   - a plan that was built reports the geometry it was given, and its visible pair count
//     equals the count computed here from the endpoints (a silent wrong answer otherwise);
//   - for small float32 problems, the forward's out / lse / max_logit equal a float64
//     attention computed here from the endpoints.
#include <cmath>
#include <limits>

#include "fuzz_common.h"

using namespace fsfuzz;

namespace {

// Saturating arithmetic for the harness's own derived values (wild inputs must not make the harness itself UB).
int64_t sat(__int128 x) {
  const __int128 hi = std::numeric_limits<int64_t>::max(), lo = std::numeric_limits<int64_t>::min();
  return int64_t(x > hi ? hi : x < lo ? lo : x);
}

int64_t wild(FuzzedDataProvider& f) {
  // (No 2^31 - 1: a valid Sk that large makes a legitimately huge plan, not a bug.)
  static const int64_t kWild[] = {-1, 0, 1, 7, int64_t(1) << 31, (int64_t(1) << 32) + 1,
                                  std::numeric_limits<int64_t>::max(), std::numeric_limits<int64_t>::min()};
  if (f.ConsumeBool()) return kWild[f.ConsumeIntegralInRange<size_t>(0, sizeof(kWild) / sizeof(kWild[0]) - 1)];
  return f.ConsumeIntegral<int64_t>();
}

int64_t small_or_wild(FuzzedDataProvider& f, bool allow_wild, int64_t lo, int64_t hi) {
  if (allow_wild && f.ConsumeIntegralInRange(0, 7) == 0) return wild(f);
  return f.ConsumeIntegralInRange<int64_t>(lo, hi);
}

// Strides of a tensor of shape `shape`: compact, a permuted (valid) layout, or a broken one.
std::vector<int64_t> strides_for(FuzzedDataProvider& f, const std::vector<int64_t>& shape) {
  const int mode = f.ConsumeIntegralInRange(0, 9);
  if (mode <= 5 || shape.empty()) return {};  // compact (NULL strides)
  std::vector<int64_t> s(shape.size());
  const int n = int(shape.size());
  if (mode <= 7 && n >= 3) {
    // Heads-major layout ([.., H, S, D] in memory): the last dimension stays contiguous.
    int64_t acc = 1;
    std::vector<int> order;
    for (int i = n - 1; i >= 0; --i) order.push_back(i);
    std::swap(order[1], order[2]);  // put dim n-3 inside dim n-2
    for (int d : order) {
      s[d] = acc;
      acc = sat(__int128(acc) * std::max<int64_t>(1, std::min<int64_t>(shape[d], 1 << 20)));
    }
    return s;
  }
  // Arbitrary small strides (zero, negative, a non-unit last stride).
  for (auto& x : s) x = f.ConsumeIntegralInRange<int64_t>(-3, 70);
  return s;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider f(data, size);
  const bool varlen = f.ConsumeBool();
  const bool allow_wild = f.ConsumeIntegralInRange(0, 3) == 0;

  // ---- geometry
  int64_t B = varlen ? f.ConsumeIntegralInRange<int64_t>(0, 4) : small_or_wild(f, allow_wild, 0, 3);
  int64_t Sq = small_or_wild(f, allow_wild, 0, 48), Sk = small_or_wild(f, allow_wild, 0, 48);
  std::vector<int64_t> lq, lk;
  if (varlen)
    for (int64_t b = 0; b < B; ++b) {
      lq.push_back(f.ConsumeIntegralInRange<int64_t>(0, 40));
      lk.push_back(f.ConsumeIntegralInRange<int64_t>(0, 40));
    }
  int64_t Hkv = small_or_wild(f, allow_wild, 0, 3);
  int64_t Hq = f.ConsumeIntegralInRange(0, 5) == 0 ? small_or_wild(f, allow_wild, 0, 7)
                                                    : sat(__int128(Hkv) * f.ConsumeIntegralInRange<int64_t>(1, 3));
  static const int64_t kDims[] = {8, 16, 32, 64, 24, 128, 192, 256, 0, 7, 264, -8};
  const int64_t dqk = kDims[f.ConsumeIntegralInRange<int>(0, f.ConsumeBool() ? 3 : 11)];
  const int64_t dv = f.ConsumeBool() ? dqk : kDims[f.ConsumeIntegralInRange<int>(0, 11)];
  const int dt_q = f.ConsumeIntegralInRange(0, 4) == 0 ? f.ConsumeIntegralInRange(0, int(kBad)) : kF32;
  const int dt_k = f.ConsumeIntegralInRange(0, 9) == 0 ? f.ConsumeIntegralInRange(0, int(kBad)) : dt_q;
  const int dt_v = f.ConsumeIntegralInRange(0, 9) == 0 ? f.ConsumeIntegralInRange(0, int(kBad)) : dt_q;
  const int rank_delta = f.ConsumeIntegralInRange(0, 15) == 0 ? (f.ConsumeBool() ? 1 : -1) : 0;

  int64_t Tq = 0, Tk = 0;
  std::vector<int64_t> cuq(1, 0), cuk(1, 0);
  for (size_t b = 0; b < lq.size(); ++b) {
    cuq.push_back(cuq.back() + lq[b]);
    cuk.push_back(cuk.back() + lk[b]);
  }
  if (varlen) {
    Tq = cuq.back();
    Tk = cuk.back();
    if (f.ConsumeIntegralInRange(0, 7) == 0) Tq = small_or_wild(f, allow_wild, 0, 200);
    if (f.ConsumeIntegralInRange(0, 7) == 0) Tk = small_or_wild(f, allow_wild, 0, 200);
  }
  auto shape_of = [&](int64_t rows_b, int64_t rows_t, int64_t heads, int64_t d) {
    std::vector<int64_t> s = varlen ? std::vector<int64_t>{rows_t, heads, d} : std::vector<int64_t>{B, rows_b, heads, d};
    if (rank_delta > 0) s.insert(s.begin(), 1);
    if (rank_delta < 0) s.erase(s.begin());
    return s;
  };
  Tensor q, k, v;
  constexpr size_t kMaxBytes = size_t(1) << 22;
  q.make(dtype(dt_q), shape_of(Sq, Tq, Hq, dqk), {}, kMaxBytes, 1);
  q.make(dtype(dt_q), q.shape, strides_for(f, q.shape), kMaxBytes, 1);
  k.make(dtype(dt_k), shape_of(Sk, Tk, Hkv, dqk), {}, kMaxBytes, 2);
  k.make(dtype(dt_k), k.shape, strides_for(f, k.shape), kMaxBytes, 2);
  const int64_t v_heads = f.ConsumeIntegralInRange(0, 15) == 0 ? sat(__int128(Hkv) + 1) : Hkv;
  v.make(dtype(dt_v), shape_of(Sk, Tk, v_heads, dv), {}, kMaxBytes, 3);
  v.make(dtype(dt_v), v.shape, strides_for(f, v.shape), kMaxBytes, 3);

  // ---- cu_seqlens (THD): valid, or corrupted in one of several ways
  Tensor cq, ck;
  int64_t max_q = 0, max_k = 0;
  std::vector<int64_t> vq = cuq, vk = cuk;  // the values passed (maybe corrupted)
  if (varlen) {
    for (size_t b = 0; b < lq.size(); ++b) {
      max_q = std::max(max_q, lq[b]);
      max_k = std::max(max_k, lk[b]);
    }
    const int corrupt = f.ConsumeIntegralInRange(0, 11);
    if (corrupt == 1 && !vq.empty()) vq[f.ConsumeIntegralInRange<size_t>(0, vq.size() - 1)] = f.ConsumeIntegral<int32_t>();
    if (corrupt == 2) vk.push_back(vk.back());
    if (corrupt == 3 && !vk.empty()) vk[f.ConsumeIntegralInRange<size_t>(0, vk.size() - 1)] += f.ConsumeIntegralInRange(-3, 3);
    const fs_dtype_t cdt = corrupt == 4 ? dtype(kI64) : dtype(kI32);
    std::vector<int64_t> cshape_q{int64_t(vq.size())}, cshape_k{int64_t(vk.size())};
    if (corrupt == 5) cshape_q = {1, int64_t(vq.size())};
    std::vector<int64_t> cstr;
    if (corrupt == 6) cstr = {2};
    cq.make(cdt, cshape_q, corrupt == 5 ? std::vector<int64_t>{} : cstr, kMaxBytes, 0);
    ck.make(cdt, cshape_k, {}, kMaxBytes, 0);
    auto store = [&](Tensor& t, const std::vector<int64_t>& vals, int64_t stride) {
      for (size_t i = 0; i < vals.size(); ++i) {
        if (cdt.bits == 64) *t.at<int64_t>(int64_t(i) * stride) = vals[i];
        else *t.at<int32_t>(int64_t(i) * stride) = int32_t(vals[i]);
      }
    };
    store(cq, vq, corrupt == 6 ? 2 : 1);
    store(ck, vk, 1);
    const int mq = f.ConsumeIntegralInRange(0, 9);
    if (mq == 1) max_q = 0;
    if (mq == 2) max_q -= 1;
    if (mq == 3) max_q = wild(f);
    const int mk = f.ConsumeIntegralInRange(0, 9);
    if (mk == 1) max_k = 0;
    if (mk == 2) max_k -= 1;
    if (mk == 3) max_k = wild(f);
  }

  // ---- mask_func [Hmask, nfunc, total_q]
  const int hm_mode = f.ConsumeIntegralInRange(0, 9);
  const int64_t Hmask = hm_mode < 5 ? 1 : hm_mode < 9 ? Hq : f.ConsumeIntegralInRange<int64_t>(0, 5);
  const int64_t nfunc = f.ConsumeIntegralInRange(0, 7) == 0 ? f.ConsumeIntegralInRange<int64_t>(-1, 6)
                                                             : 2 * f.ConsumeIntegralInRange<int64_t>(0, 2) + 1;
  const __int128 rows_wide = varlen ? __int128(Tq) : __int128(B) * Sq;
  int64_t rows = (rows_wide >= 0 && rows_wide < (int64_t(1) << 40)) ? int64_t(rows_wide) : -1;
  if (f.ConsumeIntegralInRange(0, 15) == 0) rows += f.ConsumeBool() ? 1 : -1;
  const __int128 numel = __int128(Hmask) * nfunc * rows;
  if (Hmask < 0 || nfunc < 0 || rows < 0 || numel > (1 << 15)) return 0;  // no memory to describe: not a case
  Tensor mask;
  const fs_dtype_t mdt = f.ConsumeIntegralInRange(0, 15) == 0 ? dtype(kI64) : dtype(kI32);
  std::vector<int64_t> mshape{Hmask, nfunc, rows}, mstr;
  if (f.ConsumeIntegralInRange(0, 15) == 0 && Hmask > 0 && nfunc > 0) mstr = {rows, Hmask * rows, 1};  // not contiguous
  mask.make(mdt, mshape, mstr, kMaxBytes, 0);
  const bool raw_endpoints = f.ConsumeIntegralInRange(0, 7) == 0;
  // Sample of each row (for valid endpoints and the oracle).
  auto sample_k_len = [&](int64_t row) -> int64_t {
    if (!varlen) return Sk;
    for (size_t b = 0; b + 1 < cuq.size(); ++b)
      if (row < cuq[b + 1]) return lk[b];
    return 0;
  };
  std::vector<int32_t> ends(static_cast<size_t>(numel));
  // Loops over mask heads only when the mask has elements (Hmask may be huge with zero rows).
  const int64_t loop_heads = numel > 0 ? Hmask : 0;
  for (int64_t h = 0; h < loop_heads; ++h)
    for (int64_t r = 0; r < rows; ++r) {
      int64_t prev = 0;
      const int64_t lim = std::max<int64_t>(0, std::min<int64_t>(sample_k_len(r), 1 << 20));
      for (int64_t j = 0; j < nfunc; ++j) {
        int32_t e;
        if (raw_endpoints) e = f.ConsumeIntegral<int32_t>() % 70;
        else e = int32_t(prev + f.ConsumeIntegralInRange<int64_t>(0, lim - prev));
        prev = std::max<int64_t>(prev, e);
        ends[size_t((h * nfunc + j) * rows + r)] = e;
      }
    }
  if (mask.t.data) {
    for (int64_t h = 0; h < loop_heads; ++h)
      for (int64_t j = 0; j < nfunc; ++j)
        for (int64_t r = 0; r < rows; ++r) {
          const int64_t off = h * mask.strides[0] + j * mask.strides[1] + r * mask.strides[2];
          const int32_t e = ends[size_t((h * nfunc + j) * rows + r)];
          if (mdt.bits == 64) *mask.at<int64_t>(off) = e;
          else *mask.at<int32_t>(off) = e;
        }
  }

  // ---- options
  static const int32_t kPack[] = {-1, 0, 1, 2, -2};
  static const int32_t kArch[] = {0, 80, 90, 100, -1};
  fs_mask_plan_args_t args{};
  args.mask_func = mask.get();
  args.q = q.get();
  args.k = k.get();
  args.v = v.get();
  args.cu_seqlens_q = varlen ? cq.get() : nullptr;
  args.cu_seqlens_k = varlen ? ck.get() : nullptr;
  if (varlen && f.ConsumeIntegralInRange(0, 15) == 0) args.cu_seqlens_k = nullptr;
  args.max_seqlen_q = max_q;
  args.max_seqlen_k = max_k;
  args.pack_gqa = kPack[f.ConsumeIntegralInRange(0, f.ConsumeBool() ? 2 : 4)];
  args.build_backward = f.ConsumeIntegralInRange(0, 7) == 0 ? f.ConsumeIntegral<int32_t>() : f.ConsumeBool();
  args.arch = kArch[f.ConsumeIntegralInRange(0, f.ConsumeBool() ? 0 : 4)];
  args.stream = nullptr;

  fs_mask_plan_t plan = nullptr;
  const fs_status_t st = fs_create_mask_plan(&args, &plan);
  check_error(st, "fs_create_mask_plan");
  if (st != FS_STATUS_SUCCESS) {
    if (plan != nullptr) fail("failed fs_create_mask_plan left a plan behind");
    return 0;
  }

  // ---- the plan must describe what it was given (a THD plan accepted the cu_seqlens passed: the
  // oracle uses those, corrupted or not)
  if (varlen) {
    cuq = vq;
    cuk = vk;
    lq.clear();
    lk.clear();
    for (size_t b = 0; b + 1 < cuq.size(); ++b) {
      lq.push_back(cuq[b + 1] - cuq[b]);
      lk.push_back(cuk[b + 1] - cuk[b]);
    }
  }
  fs_mask_plan_info_t info{};
  if (fs_mask_plan_get_info(plan, &info) != FS_STATUS_SUCCESS) fail(std::string("get_info: ") + fs_get_last_error());
  const int64_t eB = varlen ? int64_t(cuq.size()) - 1 : B;
  if (info.batch != eB || info.num_heads_q != Hq || info.num_heads_kv != Hkv || info.num_heads_mask != Hmask ||
      info.nfunc != nfunc || info.head_dim_qk != dqk || info.head_dim_v != dv || info.varlen != int(varlen))
    fail("plan geometry differs from its inputs: " + std::string(info.signature));
  if (info.total_q != rows) fail("plan total_q differs from the mask length");
  // Visible pairs: for each mask head and row, F0 + sum (F[2i] - F[2i-1]).
  __int128 pairs = 0;
  for (int64_t h = 0; h < loop_heads; ++h)
    for (int64_t r = 0; r < rows; ++r) {
      const int32_t* e = &ends[size_t(h * nfunc * rows + r)];
      int64_t cnt = e[0];
      for (int64_t j = 1; j + 1 < nfunc; j += 2) cnt += int64_t(e[(j + 1) * rows]) - e[j * rows];
      pairs += cnt;
    }
  if (__int128(info.visible_pairs) != pairs)
    fail("visible_pairs " + std::to_string(info.visible_pairs) + " != " + std::to_string(int64_t(pairs)));
  int32_t n_arrays = 0;
  if (fs_mask_plan_num_arrays(plan, &n_arrays) != FS_STATUS_SUCCESS) fail("num_arrays");
  for (int32_t i = 0; i < n_arrays; ++i) {
    const char* name = nullptr;
    if (fs_mask_plan_array_name(plan, i, &name) != FS_STATUS_SUCCESS || name == nullptr) fail("array_name");
    int64_t count = -1;
    if (fs_mask_plan_copy_array(plan, name, nullptr, 0, &count) != FS_STATUS_SUCCESS || count < 0) fail("array size");
    std::vector<int32_t> buf(size_t(count) + 1);
    if (fs_mask_plan_copy_array(plan, name, buf.data(), count, &count) != FS_STATUS_SUCCESS) fail("copy_array");
  }

  // ---- forward on the CPU reference vs a float64 attention computed here (small float32 problems)
  const bool small = __int128(std::max<int64_t>(rows, 1)) * std::max<int64_t>(varlen ? max_k : Sk, 1) * Hq <= 60000;
  if (dt_q == kF32 && dt_k == kF32 && dt_v == kF32 && small && q.t.data && k.t.data && v.t.data && rows > 0 &&
      Hq > 0 && dqk > 0 && dv > 0 && dqk <= 256 && dv <= 256) {
    Tensor out, lse, ml;
    std::vector<int64_t> oshape = q.shape;
    oshape.back() = dv;
    out.make(dtype(kF32), oshape, {}, kMaxBytes, 9);
    lse.make(dtype(kF32), varlen ? std::vector<int64_t>{Hq, Tq} : std::vector<int64_t>{B, Hq, Sq}, {}, kMaxBytes, 9);
    ml.make(dtype(kF32), {Hq}, {}, kMaxBytes, 9);
    if (std::getenv("FSFUZZ_VERBOSE")) {
      auto dump = [](const char* n, Tensor& t) {
        std::fprintf(stderr, "%s shape", n);
        for (size_t i = 0; i < t.shape.size(); ++i) std::fprintf(stderr, " %lld/%lld", (long long)t.shape[i], (long long)t.strides[i]);
        std::fprintf(stderr, " strided=%d\n", int(t.strided));
      };
      std::fprintf(stderr, "varlen=%d B=%lld Sq=%lld Sk=%lld Hq=%lld Hkv=%lld Hmask=%lld nfunc=%lld dqk=%lld dv=%lld pack=%d\n",
                   int(varlen), (long long)B, (long long)Sq, (long long)Sk, (long long)Hq, (long long)Hkv,
                   (long long)Hmask, (long long)nfunc, (long long)dqk, (long long)dv, int(info.pack_gqa));
      dump("q", q);
      dump("k", k);
      dump("v", v);
    }
    const bool scaled = f.ConsumeBool();
    const float scale = scaled ? float(f.ConsumeIntegralInRange(0, 8)) / 4.0f : float(1.0 / std::sqrt(double(dqk)));
    fs_flex_fwd_args_t fa{q.get(), k.get(), v.get(), out.get(), plan, lse.get(), ml.get(), scale, scaled ? 1 : 0};
    fs_flex_fwd_t op = nullptr;
    fs_status_t s = fs_flex_fwd_create(&fa, &op);
    check_error(s, "fs_flex_fwd_create");
    if (s == FS_STATUS_SUCCESS) {
      s = fs_flex_fwd_check_support(op);
      check_error(s, "fs_flex_fwd_check_support");
      if (s == FS_STATUS_SUCCESS) {
        if (fs_flex_fwd_compile(op) != FS_STATUS_SUCCESS) fail(std::string("compile: ") + fs_get_last_error());
        s = fs_flex_fwd_execute(op, &fa, nullptr, 0, nullptr);
        check_error(s, "fs_flex_fwd_execute");
        if (s != FS_STATUS_SUCCESS) fail(std::string("execute failed after a successful compile: ") + fs_get_last_error());
        // float64 attention from the endpoints.
        const int64_t G = Hq / Hkv;
        std::vector<double> mlw(size_t(Hq), -INFINITY);
        auto elem = [](Tensor& t, std::initializer_list<int64_t> idx) {
          int64_t off = 0, i = 0;
          for (int64_t x : idx) off += x * t.strides[size_t(i++)];
          return t.at<float>(off);
        };
        for (int64_t r = 0; r < rows; ++r) {
          int64_t b = 0, pos = r;
          if (varlen) {
            while (b + 1 < int64_t(cuq.size()) - 1 && r >= cuq[size_t(b + 1)]) ++b;
            pos = r - cuq[size_t(b)];
          } else {
            b = r / Sq;
            pos = r % Sq;
          }
          const int64_t klen = varlen ? lk[size_t(b)] : Sk;
          for (int64_t h = 0; h < Hq; ++h) {
            const int64_t hm = Hmask == 1 ? 0 : h, hk = h / G;
            const int32_t* e = &ends[size_t(hm * nfunc * rows + r)];
            auto visible = [&](int64_t j) {
              if (j < e[0]) return true;
              for (int64_t t = 1; t + 1 < nfunc; t += 2)
                if (j >= e[t * rows] && j < e[(t + 1) * rows]) return true;
              return false;
            };
            std::vector<double> sc;
            std::vector<int64_t> js;
            double mx = -INFINITY;
            for (int64_t j = 0; j < klen; ++j) {
              if (!visible(j)) continue;
              const int64_t kr = varlen ? cuk[size_t(b)] + j : j;
              double dot = 0;
              for (int64_t d = 0; d < dqk; ++d) {
                const float qe = varlen ? *elem(q, {r, h, d}) : *elem(q, {b, pos, h, d});
                const float ke = varlen ? *elem(k, {kr, hk, d}) : *elem(k, {b, kr, hk, d});
                dot += double(qe) * ke;
              }
              dot *= scale;
              sc.push_back(dot);
              js.push_back(kr);
              mx = std::max(mx, dot);
            }
            mlw[size_t(h)] = std::max(mlw[size_t(h)], mx);
            double sum = 0;
            for (double x : sc) sum += std::exp(x - mx);
            const double want_lse = sc.empty() ? -INFINITY : mx + std::log(sum);
            const float got_lse = varlen ? *elem(lse, {h, r}) : *elem(lse, {b, h, pos});
            if (sc.empty() ? !(std::isinf(got_lse) && got_lse < 0) : !(std::fabs(got_lse - want_lse) <= 1e-3 * (1 + std::fabs(want_lse))))
              fail("lse differs at row " + std::to_string(r) + " head " + std::to_string(h) + ": " +
                   std::to_string(got_lse) + " vs " + std::to_string(want_lse));
            for (int64_t d = 0; d < dv; ++d) {
              double o = 0;
              for (size_t t = 0; t < sc.size(); ++t) {
                const float ve = varlen ? *elem(v, {js[t], hk, d}) : *elem(v, {b, js[t], hk, d});
                o += std::exp(sc[t] - want_lse) * ve;
              }
              const float got = varlen ? *elem(out, {r, h, d}) : *elem(out, {b, pos, h, d});
              if (!(std::fabs(got - o) <= 1e-3 * (1 + std::fabs(o))))
                fail("out differs at row " + std::to_string(r) + " head " + std::to_string(h) + " dim " +
                     std::to_string(d) + ": " + std::to_string(got) + " vs " + std::to_string(o));
            }
          }
        }
        for (int64_t h = 0; h < Hq; ++h) {
          const float got = *ml.at<float>(h);
          const double want = mlw[size_t(h)];
          if (std::isinf(want) ? !(std::isinf(got) && got < 0) : !(std::fabs(got - want) <= 1e-3 * (1 + std::fabs(want))))
            fail("max_logit differs at head " + std::to_string(h));
        }
      }
      fs_flex_fwd_destroy(op);
    }
  }
  fs_mask_plan_destroy(plan);
  return 0;
}
