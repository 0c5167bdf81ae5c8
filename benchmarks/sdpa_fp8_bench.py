"""FP8 SDPA forward speed on the GPU: ``flashspan.sdpa_fp8`` next to the 16-bit ``flashspan.sdpa`` (GPU only).

Shapes: B=1, H=16, D in {64, 128} (``--head-dims``), S in {8192, 32768} (``--seqs``), no mask and causal; E4M3 inputs
made from randn with Transformer Engine's per-tensor recipe (scale = 448 / amax rounded down to a power of two,
descale = 1 / scale), scale_s = 448, scale_o from the bf16 output's amax. The FP8 forward is on by default since
PERF_LOG v2.20; the script runs the library's defaults (set ``FLASHSPAN_EXPERIMENTAL=1`` in the environment to time
the experimental paths, e.g. the eight-code widening pre-pass).

Timing: flashspan.bench.timing.Timer (CUDA events, 256 MB written between calls to flush L2, warm-up first, median).
TFLOP/s over the visible (query, key) pairs: 4 * D * pairs * B * H for both.

Check: the dequantized FP8 output against the bf16 output of the same (dequantized) inputs, relative L2 on heads 0 and
H-1 (FP8's one-step rounding of S and O: a few percent; printed, and a failure above 10 % makes the exit status 1).

--backward: the FP8 backward instead (``flashspan.sdpa_fp8_backward``; on an H100 / H200 the sm90 kernel) next to
the 16-bit ``flashspan.sdpa_backward`` of the same dequantized tensors: o and the stats from the FP8 forward (the CPU
reference off an sm_90 device), dO E5M2 by the recipe (fmax 57344), gradients E5M2; scale_dQ / dK / dV from the
bf16 gradients' amaxes, scale_dP from a first FP8 call's amax_dP (Transformer Engine's delayed scaling, one step).
TFLOP/s at 2.5x the forward's FLOPs. Check: relative L2 of the dequantized dQ, dK, dV against the bf16 ones on
heads 0 and H-1 (failure above 0.2: E5M2's 2 mantissa bits on dP8 and the gradients).

--device cpu: the same logic on CPU tensors (the CPU reference, wall-clock timing): a smoke run of the script, e.g.
``--device cpu --seqs 64 --head-dims 32 --heads 2 --reps 1 --warmup 0``.

Usage: python benchmarks/sdpa_fp8_bench.py [--seqs 8192,32768] [--head-dims 128] [--reps 10] [--backward]
"""

from __future__ import annotations

import argparse
import math
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import flashspan  # noqa: E402
from flashspan.bench.timing import Timer, tflops  # noqa: E402

E4M3_MAX = 448.0
E5M2_MAX = 57344.0


def recipe_scale(amax: float, fmax: float) -> float:
    """Transformer Engine's per-tensor scale: fmax / amax rounded down to a power of two (1 for amax 0)."""
    return 2.0 ** math.floor(math.log2(fmax / amax)) if amax > 0 and math.isfinite(amax) else 1.0


def quantize(x: torch.Tensor, dtype=torch.float8_e4m3fn) -> tuple[torch.Tensor, float]:
    """(FP8 tensor, descale) of x by the per-tensor recipe."""
    scale = recipe_scale(float(x.abs().max()), E4M3_MAX if dtype == torch.float8_e4m3fn else E5M2_MAX)
    return (x * scale).to(dtype), 1.0 / scale


def rel_l2(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.float() - want.float()).norm() / want.float().norm())


def backward_rows(args, dev, timer, B: int, H: int, failed: list) -> None:
    """The --backward table (module docstring)."""
    print(f"B={B} H={H} E4M3 q/k/v/o, E5M2 dO and gradients, BHSD, backward TFLOP/s over visible pairs "
          f"(2.5x the forward's FLOPs), median of {args.reps}")
    print("| S | D | mask | fp8 | bf16 | fp8 / bf16 | rel L2 dQ / dK / dV (fp8 vs bf16) |")
    print("|---|---|---|---|---|---|---|")
    for d in (int(x) for x in args.head_dims.split(",")):
        for s in (int(x) for x in args.seqs.split(",")):
            g = torch.Generator(device=dev).manual_seed(s + d)
            q, k, v, do = (torch.randn(B, H, s, d, device=dev, generator=g) for _ in range(4))
            (q8, dq_), (k8, dk_), (v8, dv_) = quantize(q), quantize(k), quantize(v)
            do8, ddo = quantize(do, torch.float8_e5m2)
            qb, kb, vb, dob = ((t.float() * ds).to(torch.bfloat16)
                               for t, ds in ((q8, dq_), (k8, dk_), (v8, dv_), (do8, ddo)))
            for causal in (False, True):
                mask = "causal" if causal else "none"
                scale = 1.0 / math.sqrt(d)
                band = dict(diagonal_band_right_bound=0) if causal else {}  # causal, top-left
                with torch.no_grad():
                    ob, st = flashspan.sdpa(qb, kb, vb, attn_scale=scale, generate_stats=True, **band)
                    gb = flashspan.sdpa_backward(qb, kb, vb, ob, dob, st, attn_scale=scale, **band)
                scale_o = recipe_scale(float(ob.float().abs().max()), E4M3_MAX)
                # o and stats of the FP8 forward (what a training step hands its backward).
                o8, st8 = flashspan.sdpa_fp8(q8, k8, v8, dq_, dk_, dv_, 1.0 / E4M3_MAX, E4M3_MAX, scale_o,
                                             attn_scale=scale, use_causal_mask=causal, generate_stats=True)[:2]
                sg = [recipe_scale(float(x.float().abs().max()), E5M2_MAX) for x in gb]
                scale_dp = [1.0]

                def fp8_call():
                    return flashspan.sdpa_fp8_backward(
                        q8, k8, v8, o8, do8, st8, dq_, dk_, dv_, 1.0 / scale_o, ddo, 1.0 / E4M3_MAX,
                        1.0 / scale_dp[0], E4M3_MAX, sg[0], sg[1], sg[2], scale_dp[0], attn_scale=scale,
                        use_causal_mask=causal, grad_dtype=torch.float8_e5m2)

                def bf16_call():
                    return flashspan.sdpa_backward(qb, kb, vb, ob, dob, st, attn_scale=scale, **band)

                scale_dp[0] = recipe_scale(float(fp8_call()[6].reshape(-1)[0]), E5M2_MAX)  # amax_dP
                out = fp8_call()
                t8 = timer.measure(fp8_call)
                with torch.no_grad():
                    t16 = timer.measure(bf16_call)
                fl = 2.5 * 4.0 * d * visible_pairs(s, causal) * B * H
                h = [0, H - 1]
                rels = [rel_l2(out[i][:, h].float() / sg[i], gb[i][:, h]) for i in range(3)]
                if not all(math.isfinite(r) and r <= 0.2 for r in rels):
                    failed.append(f"S={s} D={d} {mask}: relative L2 dQ / dK / dV {rels}")
                f8, f16 = tflops(fl, t8.median_ms), tflops(fl, t16.median_ms)
                print(f"| {s} | {d} | {mask} | {f8:.0f} | {f16:.0f} | {f8 / f16:.2f}x | "
                      f"{rels[0]:.4f} / {rels[1]:.4f} / {rels[2]:.4f} |", flush=True)


def visible_pairs(s: int, causal: bool) -> int:
    return s * (s + 1) // 2 if causal else s * s


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seqs", default="8192,32768")
    ap.add_argument("--head-dims", default="128")
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--backward", action="store_true", help="the FP8 backward instead of the forward")
    ap.add_argument("--device", default="cuda", help="cuda (default) or cpu (a smoke run on the CPU reference)")
    args = ap.parse_args()
    dev = torch.device(args.device)
    timer = Timer(dev, args.warmup, args.reps)
    B, H = 1, args.heads
    failed = []
    if args.backward:
        backward_rows(args, dev, timer, B, H, failed)
        for f in failed:
            print("FAILED:", f)
        return 1 if failed else 0
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
