"""SDPA speed on the GPU: flashspan.sdpa's routes next to flashspan's flex kernels and PyTorch SDPA's cuDNN backend.

Shapes (issue 24's table): B=1, H=16, D=128, BF16, BHSD; S in {8192, 32768}; masks none, causal, causal
with a window of 4096 keys (``diagonal_band_left_bound=4096``: the diagonal and the 4095 keys before it).

Routes, all timed in this one process:
  flex        ``flashspan.flex_attn_func`` with the equivalent mask plan (``flashspan.masks``: every key, ``causal``,
              ``sliding_window(before=4095)``; built once per configuration, outside the timing) on BSHD views of
              the same tensors, ``FLASHSPAN_EXPERIMENTAL=0`` (the flex forward runs the sm90 family on an H200). Until
              issue 24 retired it this column was flashspan.sdpa's flex route (``FLASHSPAN_SDPA_ROUTE=flex``), a
              Python lowering of these calls onto the same plans and kernels (PERF_LOG's earlier "flex" figures);
  native90    the C layer's own SDPA operation with ``FLASHSPAN_EXPERIMENTAL=1`` (forward and backward on the sm90
              kernels with the analytic mask, docs/SDPA.md; the experimental flag now only adds paged K/V on CUDA
              and the flex backward's deterministic cut, so for these shapes it runs the kernels of ``native``);
  native80    the same with ``FLASHSPAN_KERNEL_FAMILY=sm80``: forward and backward on the sm80 analytic kernels;
  native      the default route (``FLASHSPAN_EXPERIMENTAL=0``): the native operation (on an H200 the sm90 kernels
              where they cover the call);
  native80f   native80 with ``FLASHSPAN_SDPA_SM80_FEATURES=1`` (measurement only): the sm80 SDPA kernels' features
              instantiation (every feature's code in the main loops, run-time flags) also for a pure-mask call,
              which runs on the mask-only kernels otherwise (launch_sdpa_{fwd,bwd}_sm80.cu);
  flex80      flex with ``FLASHSPAN_KERNEL_FAMILY=sm80`` (the plan built for the sm80 kernels), what a GPU without the
              sm90 kernels runs.
The C layer reads ``FLASHSPAN_KERNEL_FAMILY``, ``FLASHSPAN_EXPERIMENTAL`` and ``FLASHSPAN_SDPA_SM80_FEATURES`` per
call (and when it builds a plan), so the script switches routes by setting them around each route's calls.

Timing: flashspan.bench.timing.Timer (CUDA events around each call, 256 MB written between calls to flush L2,
warm-up calls first, median). Forward under ``torch.no_grad()`` without stats; backward:
``torch.autograd.grad`` of a kept forward graph (dQ, dK, dV). TFLOP/s over the visible (query, key) pairs:
forward 4 * D * pairs * B * H, backward 2.5x that. cuDNN has no sliding window here ("—").

Checks (spot checks: heads 0 and H-1, the first and last 256 rows, so that the criterion's float64 host copies
stay small): every flashspan route's O and the flex / native / cuDNN gradients against the flex route's (flex80's when
the flex route is not timed) and, where it runs, cuDNN's, with the tests' criterion (tests/python/criteria.py: relative L2 + max-abs bound); failures are
listed and the exit status is 1. A line per configuration is printed as it finishes and the table so far is
rewritten to --out after each, so a run stopped by a time limit keeps what it measured.

Usage: python benchmarks/sdpa_bench.py [--seqs 8192,32768] [--reps 10] [--warmup 3] [--out FILE.md]
Prints a markdown table (and writes it to --out).
"""

from __future__ import annotations

import argparse
import math
import os
import sys


import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import flashspan  # noqa: E402
import flashspan.masks  # noqa: E402
from flashspan.bench.switches import scoped_env  # noqa: E402
from flashspan.bench.timing import Timer, tflops  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "python"))
from criteria import check_tensor  # noqa: E402  (the tests' one error criterion)

MASKS = ("none", "causal", "causal_w4096")
WINDOW = 4096
SPOT_ROWS = 256


def spot(t: torch.Tensor) -> torch.Tensor:
    """The spot-checked part of a (B, H, S, D) result: heads 0 and H-1, the first and last SPOT_ROWS rows."""
    h = [0, t.shape[1] - 1] if t.shape[1] > 1 else [0]
    x = t[:, h]
    if x.shape[2] > 2 * SPOT_ROWS:
        x = torch.cat([x[:, :, :SPOT_ROWS], x[:, :, -SPOT_ROWS:]], dim=2)
    return x.float()


def route_env(route: str):
    """Environment of one flashspan route for the calls inside (restored after)."""
    return scoped_env(FLASHSPAN_EXPERIMENTAL="0" if route.startswith("flex") or route == "native" else "1",
                      FLASHSPAN_KERNEL_FAMILY="sm80" if route.endswith("80") or route == "native80f" else None,
                      FLASHSPAN_SDPA_SM80_FEATURES="1" if route == "native80f" else None)


def visible_pairs(s: int, mask: str) -> int:
    if mask == "none":
        return s * s
    if mask == "causal":
        return s * (s + 1) // 2
    w = min(WINDOW, s)  # row i sees min(i + 1, w) keys
    return w * (w + 1) // 2 + (s - w) * w


def route_call(route: str, s: int, mask: str, q, k, v, scale: float):
    """The route's attention as a function of (q, k, v) BHSD -> O BHSD (call it inside the route's route_env)."""
    if not route.startswith("flex"):
        ma = mask_args(mask)
        return lambda q, k, v: flashspan.sdpa(q, k, v, attn_scale=scale, **ma)[0]
    if mask == "none":
        mf = torch.full((1, 1, s), s, dtype=torch.int32, device=q.device)
    elif mask == "causal":
        mf = flashspan.masks.causal(s, device=q.device)
    else:  # the diagonal and the WINDOW - 1 keys before it: diagonal_band_left_bound=WINDOW, right bound 0
        mf = flashspan.masks.sliding_window(s, before=WINDOW - 1, after=0, device=q.device)
    bshd = [t.transpose(1, 2) for t in (q, k, v)]
    plan = flashspan.create_mask_plan(mf, *bshd, build_backward=True)

    def flex(q, k, v):
        o = flashspan.flex_attn_func(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), mask_plan=plan,
                                     softmax_scale=scale)
        return o.transpose(1, 2)

    return flex


def mask_args(mask: str) -> dict:
    if mask == "none":
        return {}
    a = {"diagonal_band_right_bound": 0}
    if mask == "causal_w4096":
        a["diagonal_band_left_bound"] = WINDOW
    return a


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seqs", default="8192,32768")
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--head-dim-v", type=int, default=None, help="V's head dim (default: --head-dim), e.g. 192 / 128")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--routes", default="flex,native90,native80")
    ap.add_argument("--no-cudnn", action="store_true")
    ap.add_argument("--out", default=None)
    ap.add_argument("--device", default="cuda", help="cpu: a smoke test of the script on the CPU reference (tiny S)")
    args = ap.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        print("sdpa_bench: no CUDA device; nothing to time")
        return 0
    dev = torch.device(args.device)
    timer = Timer(dev, warmup=args.warmup, reps=args.reps)
    B, H, D = 1, args.heads, args.head_dim
    Dv = args.head_dim_v or D
    scale = 1.0 / math.sqrt(D)
    routes = [r for r in args.routes.split(",") if r]
    failures: list[str] = []
    rows = []
    for s in [int(x) for x in args.seqs.split(",")]:
        g = torch.Generator(device=dev).manual_seed(s)
        print(f"S={s} ...", flush=True)
        q, k, v, do = (torch.randn(B, H, s, d, device=dev, dtype=torch.bfloat16, generator=g) for d in (D, D, Dv, Dv))
        for mask in MASKS:
            fl = 2.0 * (D + Dv) * visible_pairs(s, mask) * B * H
            res: dict[str, object] = {}
            outs: dict[str, torch.Tensor] = {}
            grads: dict[str, tuple] = {}
            for r in routes:
                with route_env(r):
                    call = route_call(r, s, mask, q, k, v, scale)

                    def fwd():
                        return call(q, k, v)

                    with torch.no_grad():
                        first = timer.first_call(fwd)
                        outs[r] = fwd()
                        res[f"{r}_fwd"] = timer.measure(fwd, first)
                    qg, kg, vg = (t.detach().requires_grad_() for t in (q, k, v))
                    o = call(qg, kg, vg)

                    def bwd():
                        return torch.autograd.grad(o, (qg, kg, vg), do, retain_graph=True)

                    first = timer.first_call(bwd)
                    grads[r] = bwd()
                    res[f"{r}_bwd"] = timer.measure(bwd, first)
                    del o, call
            if not args.no_cudnn and mask != "causal_w4096":
                from torch.nn.attention import SDPBackend, sdpa_kernel

                causal = mask == "causal"
                try:
                    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                        def cfwd():
                            return F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale)

                        with torch.no_grad():
                            first = timer.first_call(cfwd)
                            outs["cudnn"] = cfwd()
                            res["cudnn_fwd"] = timer.measure(cfwd, first)
                        qg, kg, vg = (t.detach().requires_grad_() for t in (q, k, v))
                        o = F.scaled_dot_product_attention(qg, kg, vg, is_causal=causal, scale=scale)

                        def cbwd():
                            return torch.autograd.grad(o, (qg, kg, vg), do, retain_graph=True)

                        first = timer.first_call(cbwd)
                        grads["cudnn"] = cbwd()
                        res["cudnn_bwd"] = timer.measure(cbwd, first)
                        del o
                except (RuntimeError, AssertionError) as e:  # no cuDNN attention in this build / for this shape
                    print(f"cuDNN S={s} {mask}: {e}".splitlines()[0], file=sys.stderr)
            # Spot checks: every route against the flex route and cuDNN (forward; gradients where timed).
            refs = [x for x in ("flex" if "flex" in outs else "flex80", "cudnn") if x in outs]
            for r in list(outs):
                for ref in refs:
                    if ref == r:
                        continue
                    try:
                        check_tensor(spot(outs[r]), spot(outs[ref]), torch.bfloat16, what=f"O {r} vs {ref}")
                    except AssertionError as e:
                        failures.append(f"S={s} {mask}: {str(e).splitlines()[0]}")
                    if r in grads and ref in grads:
                        for name, a, b in zip(("dQ", "dK", "dV"), grads[r], grads[ref]):
                            try:
                                check_tensor(spot(a), spot(b), torch.bfloat16, what=f"{name} {r} vs {ref}")
                            except AssertionError as e:
                                failures.append(f"S={s} {mask}: {str(e).splitlines()[0]}")
            rows.append((s, mask, fl, res))
            del outs, grads
            torch.cuda.empty_cache()
            text = table(rows, failures, args, B, H, D, dev)
            print(text.splitlines()[-3 - len(failures)], flush=True)  # this configuration's row
            if args.out:
                with open(args.out, "w") as f:
                    f.write(text + "\n")
    text = table(rows, failures, args, B, H, D, dev)
    print(text)
    return 1 if failures else 0


def table(rows, failures, args, B, H, D, dev) -> str:
    """The markdown table of the configurations measured so far, with the checks' verdict."""

    def tf(res, key, mult=1.0, fl=0.0):
        t = res.get(key)
        x = tflops(fl * mult, t.median_ms) if t is not None else None
        return "—" if x is None else f"{x:.0f}"

    cols = [r for r in args.routes.split(",") if r] + (["cudnn"] if not args.no_cudnn else [])
    ratios = [(a, b) for a in ("native", "native90") if a in cols for b in ("flex", "cudnn") if b in cols]
    ratios += [(a, "flex80") for a in ("native80", "native80f") if a in cols and "flex80" in cols]
    head = ("| S | mask | " + " | ".join(f"{c} fwd / bwd" for c in cols) + " | "
            + " | ".join(f"{a} vs {b} fwd / bwd" for a, b in ratios) + " |")
    lines = [
        f"B={B} H={H} D={D} bf16 BHSD, TFLOP/s over visible pairs (bwd = 2.5x fwd FLOPs), median of {args.reps} "
        f"(L2 flushed), {torch.cuda.get_device_name(dev) if dev.type == 'cuda' else 'cpu'}, torch {torch.__version__}",
        "",
        head,
        "|" + "---|" * (2 + len(cols) + len(ratios)),
    ]
    for s, mask, fl, res in rows:
        def ratio(a, b):
            ta, tb = res.get(a), res.get(b)
            return "—" if ta is None or tb is None else f"{tb.median_ms / ta.median_ms:.2f}x"

        lines.append(
            f"| {s} | {mask} | "
            + " | ".join(f"{tf(res, c + '_fwd', 1, fl)} / {tf(res, c + '_bwd', 2.5, fl)}" for c in cols) + " | "
            + " | ".join(f"{ratio(a + '_fwd', b + '_fwd')} / {ratio(a + '_bwd', b + '_bwd')}" for a, b in ratios)
            + " |")
    lines.append("")
    lines.append("checks: " + ("all passed" if not failures else f"{len(failures)} FAILED"))
    lines += [f"- {f}" for f in failures]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
