"""SDPA decode (S_q = 1, GQA) through flashspan.sdpa against PyTorch SDPA, contiguous and paged K/V (GPU only).

For each (B, H_q, H_kv) at S_kv (default 32768), D = 128, bf16, every sample's query sees all its keys (the
usual decode step): flashspan.sdpa on dense K/V (the decode forward, kernel_decode_sm80.cuh), the same with
FLASHSPAN_SDPA_DECODE=0 (the prefill kernels: one valid row of a 128-row tile per query head), on paged
K/V caches (page size --page, pages shuffled), and PyTorch's F.scaled_dot_product_attention(enable_gqa=True)
(its default backend choice for the shape). Timed with flashspan.bench.timing.Timer (CUDA events, L2
flushed, median). Each flashspan output is checked against SDPA's math backend in float32 with the test
suite's criterion (tests/python/criteria.py); the script exits with status 1 after the table when one fails.

Prints a markdown table: ms and the K/V read rate (bytes of K and V of every kv head read once / time),
which is what a decode step is bound by (H200 copy ceiling about 4.2 TB/s).

With ``--alibi`` a second table: ALiBi decode (bottom-right causal, the ALiBi paper's slopes for H_q heads) on the
decode forward against the prefill kernels (``FLASHSPAN_SDPA_DECODE=0``), checked against SDPA's math backend with
the ALiBi term as a float mask.

Usage: python benchmarks/sdpa_decode_bench.py [--skv 32768] [--page 64] [--reps 20] [--no-prefill] [--alibi]
"""

from __future__ import annotations

import argparse
import os
import sys

import torch
import torch.nn.functional as F

import flashspan
from flashspan.bench.report import finish_checks
from flashspan.bench.switches import scoped_env
from flashspan.bench.timing import Timer
from flashspan.bench.workloads import paged_cache

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "python"))
from criteria import check_tensor  # noqa: E402  (the tests' one error criterion)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--skv", type=int, default=32768)
    ap.add_argument("--page", type=int, default=64)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--no-prefill", action="store_true", help="skip the FLASHSPAN_SDPA_DECODE=0 column")
    ap.add_argument("--alibi", action="store_true", help="also ALiBi decode")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("sdpa_decode_bench: needs a CUDA device")
    dev = torch.device("cuda")
    timer = Timer(dev, warmup=3, reps=args.reps)
    sk, d = args.skv, args.dim
    print(f"GPU {torch.cuda.get_device_name()}, S_q=1 S_kv={sk} D={d} BF16, no mask; page {args.page}; "
          f"median of {args.reps}")
    print("| B | Hq/Hkv | decode ms | TB/s | paged ms | TB/s | prefill kernels ms | PyTorch SDPA ms | TB/s |")
    print("|---|---|---|---|---|---|---|---|---|")
    failures = []
    gen = torch.Generator().manual_seed(0)
    for b, hq, hkv in [(4, 32, 8), (8, 32, 8), (8, 64, 8), (1, 32, 8), (32, 32, 8)]:
        torch.manual_seed(b * 100 + hq)
        q = torch.randn(b, hq, 1, d, device=dev, dtype=torch.bfloat16)
        k = torch.randn(b, hkv, sk, d, device=dev, dtype=torch.bfloat16)
        v = torch.randn(b, hkv, sk, d, device=dev, dtype=torch.bfloat16)
        scale = d ** -0.5
        kc, kt = paged_cache(k, args.page, gen)
        vc, vt = paged_cache(v, args.page, gen)
        lens = torch.full((b,), sk, dtype=torch.int32, device=dev)
        lens_q = torch.ones(b, dtype=torch.int32, device=dev)

        def dense():
            return flashspan.sdpa(q, k, v, attn_scale=scale, generate_stats=False)[0]

        def paged_call():
            return flashspan.sdpa(q, kc, vc, attn_scale=scale, use_padding_mask=True, seq_len_q=lens_q,
                                  seq_len_kv=lens, paged_attention_k_table=kt, paged_attention_v_table=vt,
                                  paged_attention_max_seq_len_kv=sk, generate_stats=False)[0]

        with torch.no_grad():
            ref = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), scale=scale, enable_gqa=True)
            for name, fn in (("decode", dense), ("paged", paged_call)):
                try:
                    check_tensor(fn(), ref, torch.bfloat16, f"B={b} Hq/Hkv={hq}/{hkv} {name}")
                except AssertionError as e:
                    failures.append(str(e))
            ms_dense = timer.measure(dense).median_ms
            ms_paged = timer.measure(paged_call).median_ms
            prefill = "-"
            if not args.no_prefill:
                with scoped_env(FLASHSPAN_SDPA_DECODE="0"):
                    prefill = f"{timer.measure(dense).median_ms:.3f}"
            ms_torch = timer.measure(lambda: F.scaled_dot_product_attention(q, k, v, scale=scale, enable_gqa=True)
                                     ).median_ms
        kv_bytes = 2 * b * hkv * sk * d * 2
        tbs = lambda ms: kv_bytes / ms / 1e9  # noqa: E731
        print(f"| {b} | {hq}/{hkv} | {ms_dense:.3f} | {tbs(ms_dense):.2f} | {ms_paged:.3f} | {tbs(ms_paged):.2f} | "
              f"{prefill} | {ms_torch:.3f} | {tbs(ms_torch):.2f} |", flush=True)
    if args.alibi:
        alibi_table(args, timer, failures)
    finish_checks("sdpa_decode_bench", failures, "every flashspan output")


def alibi_slopes(h: int) -> torch.Tensor:
    """The ALiBi paper's slopes for h heads (core/sdpa_problem.cpp alibi_slope: n the largest power of two <= h)."""
    n = 1
    while n * 2 <= h:
        n *= 2
    e = [-8.0 * (i + 1) / n if i < n else -4.0 * (2 * (i - n) + 1) / n for i in range(h)]
    return torch.tensor([2.0 ** x for x in e], dtype=torch.float32)


def alibi_table(args, timer, failures) -> None:
    """ALiBi decode (S_q = 1, bottom-right causal: every key visible) on the decode forward and the prefill kernels."""
    dev = torch.device("cuda")
    sk, d = args.skv, args.dim
    print(f"\nALiBi, S_q=1 S_kv={sk} D={d} BF16, bottom-right causal; median of {args.reps}")
    print("| B | Hq/Hkv | decode ms | TB/s | prefill kernels ms |")
    print("|---|---|---|---|---|")
    for b, hq, hkv in [(4, 32, 8), (8, 32, 8), (1, 32, 8)]:
        torch.manual_seed(b * 100 + hq + 1)
        q = torch.randn(b, hq, 1, d, device=dev, dtype=torch.bfloat16)
        k = torch.randn(b, hkv, sk, d, device=dev, dtype=torch.bfloat16)
        v = torch.randn(b, hkv, sk, d, device=dev, dtype=torch.bfloat16)
        scale = d ** -0.5

        def call():
            return flashspan.sdpa(q, k, v, attn_scale=scale, use_alibi_mask=True, diagonal_alignment="BOTTOM_RIGHT",
                                  diagonal_band_right_bound=0, generate_stats=False)[0]

        with torch.no_grad():
            mask = (alibi_slopes(hq).to(dev).view(1, hq, 1, 1) *
                    (torch.arange(sk, device=dev, dtype=torch.float32) - (sk - 1)).view(1, 1, 1, sk))
            ref = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=mask, scale=scale,
                                                 enable_gqa=True)
            times = {}
            for name, env in (("decode", ("FLASHSPAN_SDPA_DECODE", "1")), ("prefill", ("FLASHSPAN_SDPA_DECODE", "0"))):
                with scoped_env(**{env[0]: env[1]}):
                    try:
                        check_tensor(call(), ref, torch.bfloat16, f"ALiBi B={b} Hq/Hkv={hq}/{hkv} {name}")
                    except AssertionError as e:
                        failures.append(str(e))
                    times[name] = timer.measure(call).median_ms
            ms, prefill = times["decode"], times["prefill"]
        kv_bytes = 2 * b * hkv * sk * d * 2
        print(f"| {b} | {hq}/{hkv} | {ms:.3f} | {kv_bytes / ms / 1e9:.2f} | {prefill:.3f} |", flush=True)


if __name__ == "__main__":
    main()
