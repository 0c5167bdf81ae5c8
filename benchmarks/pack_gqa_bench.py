"""Packed-GQA forward vs unpacked on decode / short-query shapes (GPU only).

For each (Sq, Hq, Hkv) the same mask (row s of a sample sees the keys [0, Sk - Sq + s + 1):
bottom-right causal, the usual decode / chunked-prefill mask) is planned twice, with
pack_gqa=False and pack_gqa=True, and the forward of each plan is timed (CUDA events, L2
flushed, median). Both outputs are checked against SDPA's math backend in float32 on the
first sample with the test suite's criterion (tests/python/criteria.py: relative L2 + max-abs
bound); the script exits with status 1 after the table when any check fails. Also timed
for reference: PyTorch SDPA with enable_gqa and no mask (its default backend choice; for
Sq = 1 that is the same attention, for Sq > 1 it attends to all Sk keys).

Usage: python benchmarks/pack_gqa_bench.py [--sk 32768] [--batch 4] [--reps 20]
(On an sm_90 GPU packed plans that are not decode shapes take the sm90 forward, unless
FLASHSPAN_SM90_PACK_GQA=0 keeps them on sm80; the arch column says which family each plan got.)
Prints a markdown table: ms and effective K/V bandwidth (bytes of K and V read once per
kv head / time), which is what a decode step is bound by.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch
import torch.nn.functional as F

import flashspan
from flashspan.bench.report import finish_checks
from flashspan.bench.timing import Timer

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "python"))
from criteria import check_tensor  # noqa: E402  (the tests' one error criterion)


def bottom_right_causal(batch: int, sq: int, sk: int, device) -> torch.Tensor:
    rows = torch.arange(sq, dtype=torch.int32, device=device)
    ends = (sk - sq + 1 + rows).clamp(max=sk)
    return ends.repeat(batch).view(1, 1, batch * sq)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sk", type=int, default=32768)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--reps", type=int, default=20)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("pack_gqa_bench: needs a CUDA device")
    dev = torch.device("cuda")
    timer = Timer(dev, warmup=3, reps=args.reps)
    b, sk, d = args.batch, args.sk, args.dim
    print(f"GPU {torch.cuda.get_device_name()}, B={b} Sk={sk} D={d} BF16, bottom-right causal; "
          f"median of {args.reps}")
    print("| Sq | Hq/Hkv | arch (unpacked/packed) | unpacked ms | packed ms | speedup | packed K/V GB/s | SDPA no-mask ms | max |packed-unpacked| | err vs fp32 |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    failures = []
    for sq, hq, hkv in [(1, 32, 8), (1, 64, 8), (4, 32, 8), (4, 64, 8), (16, 32, 4), (64, 32, 8), (128, 32, 8)]:
        torch.manual_seed(sq * 1000 + hq)
        q = torch.randn(b, sq, hq, d, device=dev, dtype=torch.bfloat16)
        k = torch.randn(b, sk, hkv, d, device=dev, dtype=torch.bfloat16)
        v = torch.randn(b, sk, hkv, d, device=dev, dtype=torch.bfloat16)
        mf = bottom_right_causal(b, sq, sk, dev)
        outs, ms, arch = {}, {}, {}
        for pack in (False, True):
            plan = flashspan.create_mask_plan(mf, q, k, v, pack_gqa=pack)
            assert plan.pack_gqa == pack
            arch[pack] = plan.arch  # the family chosen (sm90 packed: not decode shapes)
            outs[pack] = flashspan.flex_attn_func(q, k, v, mask_plan=plan)
            ms[pack] = timer.measure(lambda: flashspan.flex_attn_func(q, k, v, mask_plan=plan)).median_ms
        diff = (outs[True].float() - outs[False].float()).abs().max().item()
        # fp32 reference on sample 0 (SDPA math, bottom-right causal as an explicit bool mask).
        qr, kr, vr = (t[:1].transpose(1, 2).float() for t in (q, k, v))
        allowed = torch.arange(sk, device=dev)[None, :] < mf[0, 0, :sq, None]
        ref = F.scaled_dot_product_attention(qr, kr, vr, attn_mask=allowed, enable_gqa=True).transpose(1, 2)
        err = (outs[True][:1].float() - ref).abs().max().item()
        for pack in (False, True):
            try:
                check_tensor(outs[pack][:1], ref, torch.bfloat16, f"Sq={sq} Hq/Hkv={hq}/{hkv} pack_gqa={pack} out")
            except AssertionError as e:
                failures.append(str(e))
        qs, ks, vs = (t.transpose(1, 2) for t in (q, k, v))
        try:
            sdpa_ms = timer.measure(lambda: F.scaled_dot_product_attention(qs, ks, vs, enable_gqa=True)).median_ms
            sdpa = f"{sdpa_ms:.3f}"
        except RuntimeError as e:  # a backend may refuse the shape
            sdpa = f"n/a ({str(e).splitlines()[0][:40]})"
        kv_bytes = 2 * b * sk * hkv * d * 2
        print(f"| {sq} | {hq}/{hkv} | {arch[False]}/{arch[True]} | {ms[False]:.3f} | {ms[True]:.3f} | {ms[False] / ms[True]:.2f}x | "
              f"{kv_bytes / ms[True] / 1e6:.0f} | {sdpa} | {diff:.2e} | {err:.2e} |", flush=True)
    finish_checks("pack_gqa_bench", failures)


if __name__ == "__main__":
    main()
