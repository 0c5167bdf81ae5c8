"""FP8 SDPA forward speed on the GPU: ``flashspan.sdpa_fp8`` next to the 16-bit ``flashspan.sdpa`` (GPU only).

Shapes: B=1, H=16, D in {64, 128} (``--head-dims``), S in {8192, 32768} (``--seqs``), no mask and causal; E4M3 inputs
made from randn with Transformer Engine's per-tensor recipe (scale = 448 / amax rounded down to a power of two,
descale = 1 / scale), scale_s = 448, scale_o from the bf16 output's amax. The FP8 forward is on by default since
PERF_LOG v2.20; the script still sets ``FLASHSPAN_EXPERIMENTAL=1`` around the FP8 calls (for libraries before it).

Timing: flashspan.bench.timing.Timer (CUDA events, 256 MB written between calls to flush L2, warm-up first, median).
TFLOP/s over the visible (query, key) pairs: 4 * D * pairs * B * H for both.

Check: the dequantized FP8 output against the bf16 output of the same (dequantized) inputs, relative L2 on heads 0 and
H-1 (FP8's one-step rounding of S and O: a few percent; printed, and a failure above 10 % makes the exit status 1).

Usage: python benchmarks/sdpa_fp8_bench.py [--seqs 8192,32768] [--head-dims 128] [--reps 10]
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import flashspan  # noqa: E402
from flashspan.bench.timing import Timer, tflops  # noqa: E402

E4M3_MAX = 448.0


@contextlib.contextmanager
def experimental():
    saved = os.environ.get("FLASHSPAN_EXPERIMENTAL")
    os.environ["FLASHSPAN_EXPERIMENTAL"] = "1"
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop("FLASHSPAN_EXPERIMENTAL", None)
        else:
            os.environ["FLASHSPAN_EXPERIMENTAL"] = saved


def quantize(x: torch.Tensor) -> tuple[torch.Tensor, float]:
    """(E4M3 tensor, descale) of x by the per-tensor recipe."""
    amax = float(x.abs().max())
    scale = 2.0 ** math.floor(math.log2(E4M3_MAX / amax)) if amax > 0 else 1.0
    return (x * scale).to(torch.float8_e4m3fn), 1.0 / scale


def visible_pairs(s: int, causal: bool) -> int:
    return s * (s + 1) // 2 if causal else s * s


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seqs", default="8192,32768")
    ap.add_argument("--head-dims", default="128")
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    args = ap.parse_args()
    dev = torch.device("cuda")
    timer = Timer(dev, args.warmup, args.reps)
    B, H = 1, args.heads
    failed = []
    print(f"B={B} H={H} E4M3 BHSD, forward TFLOP/s over visible pairs, median of {args.reps}")
    print("| S | D | mask | fp8 | bf16 | fp8 / bf16 | rel L2 (fp8 vs bf16) |")
    print("|---|---|---|---|---|---|---|")
    for d in (int(x) for x in args.head_dims.split(",")):
        for s in (int(x) for x in args.seqs.split(",")):
            g = torch.Generator(device=dev).manual_seed(s + d)
            q, k, v = (torch.randn(B, H, s, d, device=dev, generator=g) for _ in range(3))
            (q8, dq), (k8, dk), (v8, dv) = quantize(q), quantize(k), quantize(v)
            qb, kb, vb = ((t.float() * ds).to(torch.bfloat16) for t, ds in ((q8, dq), (k8, dk), (v8, dv)))
            for causal in (False, True):
                mask = "causal" if causal else "none"
                scale = 1.0 / math.sqrt(d)
                band = dict(diagonal_band_right_bound=0) if causal else {}  # causal, top-left
                with torch.no_grad():
                    ob = flashspan.sdpa(qb, kb, vb, attn_scale=scale, generate_stats=False, **band)[0]
                amax_o = float(ob.float().abs().max())
                scale_o = 2.0 ** math.floor(math.log2(E4M3_MAX / amax_o)) if amax_o > 0 else 1.0

                def fp8_call():
                    return flashspan.sdpa_fp8(q8, k8, v8, dq, dk, dv, 1.0 / E4M3_MAX, E4M3_MAX, scale_o,
                                              attn_scale=scale, use_causal_mask=causal, generate_stats=False)

                def bf16_call():
                    return flashspan.sdpa(qb, kb, vb, attn_scale=scale, generate_stats=False, **band)

                with experimental():
                    o8 = fp8_call()[0]
                    t8 = timer.measure(fp8_call)
                with torch.no_grad():
                    t16 = timer.measure(bf16_call)
                fl = 4.0 * d * visible_pairs(s, causal) * B * H
                h = [0, H - 1]
                got = o8[:, h].float() / scale_o
                want = ob[:, h].float()
                rel = float((got - want).norm() / want.norm())
                if not math.isfinite(rel) or rel > 0.1:
                    failed.append(f"S={s} D={d} {mask}: relative L2 {rel:.3g}")
                f8, f16 = tflops(fl, t8.median_ms), tflops(fl, t16.median_ms)
                print(f"| {s} | {d} | {mask} | {f8:.0f} | {f16:.0f} | {f8 / f16:.2f}x | {rel:.4f} |", flush=True)
    for f in failed:
        print("FAILED:", f)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
