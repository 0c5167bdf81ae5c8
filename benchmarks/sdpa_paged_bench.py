"""SDPA prefill over paged K/V caches: the sm90 paged forward against the sm80 paged forward and the unpaged sm90 forward.

For B samples of S_q = S_kv = S (default 4 x 8192), H = 16, D in --dims, bf16, masks none and causal, and page sizes
--pages (pages shuffled in the container, separate K and V tables): ``flashspan.sdpa`` on paged K/V with the sm90 paged
forward (``sdpa_fwd_paged_kernel_sm90``, the default), the same call on the sm80 paged forward
(``FLASHSPAN_SM90_SDPA_PAGED=0``), and the unpaged sm90 forward on the dense
K/V. Timed with flashspan.bench.timing.Timer (CUDA events, L2 flushed, median). Each paged output is compared
with the unpaged forward's (same softmax order: within bf16 rounding of it, max |diff| <= 2^-6 of max |O|, else the
script exits with status 1 after the table).

--features picks what the calls carry besides the paged K / V: ``plain`` (nothing), ``thd`` (q, O packed [B S, H, D]
through ``ragged_offsets={"q": ...}``: the chunked-prefill form; its sm80 route is ``FLASHSPAN_SM90_SDPA_PAGED_THD=0``),
``bias`` (an additive bf16 bias [1, 1, S, S] broadcast over B and H; sm80 route ``FLASHSPAN_SM90_SDPA_PAGED_BIAS=0``).
The unpaged reference call carries the same feature on padded q.

Prints a markdown table: TFLOP/s over visible pairs (4 D per pair) per route, and each paged route's ratio to the
unpaged sm90 forward.

Usage: python benchmarks/sdpa_paged_bench.py [--batch 4] [--seq 8192] [--dims 64,128] [--pages 16,64,256] [--reps 10]
       [--features plain,thd,bias]
"""

from __future__ import annotations

import argparse

import torch

import flashspan
from flashspan.bench.report import finish_checks
from flashspan.bench.switches import scoped_env
from flashspan.bench.timing import Timer
from flashspan.bench.workloads import paged_cache


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=8192)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--dims", default="64,128")
    ap.add_argument("--pages", default="16,64,256")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--features", default="plain", help="comma list of plain, thd, bias")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("sdpa_paged_bench: needs a CUDA device")
    dev = torch.device("cuda")
    timer = Timer(dev, warmup=3, reps=args.reps)
    b, s, h = args.batch, args.seq, args.heads
    print(f"GPU {torch.cuda.get_device_name()}, B={b} H={h} S_q=S_kv={s} BF16, pages shuffled; median of {args.reps}; "
          f"TFLOP/s over visible pairs")
    print("| feature | D | mask | page | unpaged sm90 | paged sm90 | ratio | paged sm80 | ratio |")
    print("|---|---|---|---|---|---|---|---|---|")
    failures = []
    gen = torch.Generator().manual_seed(0)
    lens = torch.full((b,), s, dtype=torch.int32, device=dev)
    starts = torch.arange(0, (b + 1) * s, s, dtype=torch.int32, device=dev)  # packed q's sample starts
    features = args.features.split(",")
    unknown = set(features) - {"plain", "thd", "bias"}
    if unknown:
        raise SystemExit(f"sdpa_paged_bench: --features: unknown {sorted(unknown)} (plain, thd, bias)")
    bias = torch.randn(1, 1, s, s, device=dev, dtype=torch.bfloat16) if "bias" in features else None
    sm80_switch = {"plain": "FLASHSPAN_SM90_SDPA_PAGED", "thd": "FLASHSPAN_SM90_SDPA_PAGED_THD",
                   "bias": "FLASHSPAN_SM90_SDPA_PAGED_BIAS"}
    for feature, d in [(f, int(x)) for f in features for x in args.dims.split(",")]:
        torch.manual_seed(d)
        q, k, v = (torch.randn(b, h, s, d, device=dev, dtype=torch.bfloat16) for _ in range(3))
        scale = d ** -0.5
        for mask in ("none", "causal"):
            ma = {} if mask == "none" else {"diagonal_band_right_bound": 0}
            pairs = s * s if mask == "none" else s * (s + 1) // 2
            tflops = lambda ms: 4 * d * pairs * b * h / ms / 1e9  # noqa: E731

            fa = {"bias": bias} if feature == "bias" else {}

            def dense():
                return flashspan.sdpa(q, k, v, attn_scale=scale, generate_stats=False, **fa, **ma)[0]

            with torch.no_grad():
                ref = dense()
                ms_dense = timer.measure(dense).median_ms
                for page in [int(x) for x in args.pages.split(",")]:
                    kc, kt = paged_cache(k, page, gen)
                    vc, vt = paged_cache(v, page, gen)

                    if feature == "thd":
                        qp = q.transpose(1, 2).reshape(b * s, h, d)
                        fa_paged = {"ragged_offsets": {"q": starts}}
                    else:
                        qp, fa_paged = q, fa

                    def paged_call():
                        o = flashspan.sdpa(qp, kc, vc, attn_scale=scale, use_padding_mask=True, seq_len_q=lens,
                                           seq_len_kv=lens, paged_attention_k_table=kt,
                                           paged_attention_v_table=vt, paged_attention_max_seq_len_kv=s,
                                           generate_stats=False, **fa_paged, **ma)[0]
                        return o.view(b, s, h, d).transpose(1, 2) if feature == "thd" else o

                    ms = {}
                    for route, value in (("sm90", "1"), ("sm80", "0")):
                        with scoped_env(**{sm80_switch[feature]: value}):
                            out = paged_call()
                            err = (out.float() - ref.float()).abs().max().item()
                            if not err <= ref.float().abs().max().item() / 64:
                                failures.append(f"{feature} D={d} {mask} page {page} paged {route}: max |diff| {err:.3g}")
                            ms[route] = timer.measure(paged_call).median_ms
                    print(f"| {feature} | {d} | {mask} | {page} | {tflops(ms_dense):.0f} | {tflops(ms['sm90']):.0f} | "
                          f"{ms_dense / ms['sm90']:.2f} | {tflops(ms['sm80']):.0f} | {ms_dense / ms['sm80']:.2f} |",
                          flush=True)
                    del kc, vc
    finish_checks("sdpa_paged_bench", failures, "every paged output")


if __name__ == "__main__":
    main()
