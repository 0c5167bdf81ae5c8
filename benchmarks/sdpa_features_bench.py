"""SDPA forward (or backward) with each feature against the plain kernels, on the GPU (issue 24's "a feature costs <= 10 %").

For B=1, H=16, D=128, BF16, BHSD and each S of --seqs, causal (top-left), times ``flashspan.sdpa`` (forward,
``torch.no_grad()``, no stats) plain and with one feature: additive bias in several layouts and dtypes
((1,1,S,S) bf16 and float32, (1,H,S,S) bf16, (1,1,1,S) bf16), ALiBi, softcap 30, per-head sinks, Philox dropout 0.1.
Each bias row is timed twice in this process: with the bias staged through shared memory (the sm90 forward's
form for a 16-bit bias of whole aligned rows, SdpaBiasParams::chunks: the producer's TMA copies) and with a copy
of it one element off a 4-byte boundary (element loads), and the two outputs are compared (they must agree to fp32 rounding:
same values, same order of adds).

--backward times the backward instead: ``torch.autograd.grad`` of O with respect to Q, K, V (and the bias, sinks
where they are given) on a kept graph, from one forward per row (dBias with a bias; no element-load twin).

--peers times the same features on PyTorch SDPA's own CUDA backends in this process (cuDNN, flash, efficient;
``torch.nn.attention.sdpa_kernel``), forward and backward, and flashspan beside them: what a feature costs its
peers (the ones PyTorch exposes: additive bias (1,1,S,S) bf16 as ``attn_mask``, dropout 0.1), so that flashspan's
"x plain" reads against theirs. A backend that refuses a call prints "n/a".

Timing: flashspan.bench.timing.Timer (CUDA events, L2 flushed between calls, warm-up, median). TFLOP/s over the
visible (query, key) pairs (4 D pairs B H forward, 2.5 times that backward); "x plain" is the feature's time over
the plain call's.

Usage: python benchmarks/sdpa_features_bench.py [--seqs 8192] [--reps 10] [--heads 16] [--head-dim 128] [--backward]
       [--only dropout]
Prints a markdown table; exit status 1 when a staged / element pair disagrees.
"""

from __future__ import annotations

import argparse
import math
import sys

import torch

import flashspan
from flashspan.bench.timing import Timer


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seqs", default="8192")
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--backward", action="store_true", help="time the backward (autograd) instead of the forward")
    ap.add_argument("--peers", action="store_true", help="PyTorch SDPA's backends with the same features, and flashspan")
    ap.add_argument("--only", default="", help="the forward and --backward tables: only the feature rows whose names start with "
                    "one of these comma-separated prefixes (the plain row always runs), e.g. --only dropout; "
                    "--peers ignores it")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("sdpa_features_bench.py: needs a CUDA device")
    dev = torch.device("cuda")
    H, D = args.heads, args.head_dim
    timer = Timer(dev, warmup=args.warmup, reps=args.reps)
    if args.backward:
        backward_table(args, dev, timer)
        return
    if args.peers:
        peers_table(args, dev, timer)
        return
    failures = []
    print(f"GPU {torch.cuda.get_device_name()}, B=1 H={H} D={D} BF16 causal, forward; median of {args.reps}")
    print("| S | feature | ms | TFLOP/s | x plain | element loads ms | x plain |")
    print("|---|---|---|---|---|---|---|")
    for S in [int(x) for x in args.seqs.split(",")]:
        gen = torch.Generator(device=dev).manual_seed(S)
        q, k, v = (torch.randn(1, H, S, D, device=dev, dtype=torch.bfloat16, generator=gen) for _ in range(3))
        pairs = S * (S + 1) // 2
        flops = 4.0 * D * pairs * H

        def run(**kw):
            with torch.no_grad():
                return flashspan.sdpa(q, k, v, attn_scale=1.0 / math.sqrt(D), diagonal_band_right_bound=0,
                                      generate_stats=False, **kw)[0]

        def timed(**kw) -> float:
            return timer.measure(lambda: run(**kw)).median_ms

        plain = timed()
        rows = []
        biases = [
            ("bias (1,1,S,S) bf16", torch.randn(1, 1, S, S, device=dev, dtype=torch.bfloat16, generator=gen)),
            ("bias (1,1,S,S) fp32", torch.randn(1, 1, S, S, device=dev, dtype=torch.float32, generator=gen)),
            ("bias (1,H,S,S) bf16", torch.randn(1, H, S, S, device=dev, dtype=torch.bfloat16, generator=gen)
             if S <= 8192 else None),
            ("bias (1,1,1,S) bf16", torch.randn(1, 1, 1, S, device=dev, dtype=torch.bfloat16, generator=gen)),
        ]
        rows.append(("plain", plain, None))
        for name, b in biases:
            if b is None or not wanted(args, name):
                continue
            # The same values one element past a 4-byte boundary: not pair-aligned, so element loads.
            b_el = torch.empty(b.numel() + 1, device=dev, dtype=b.dtype)[1:].view(b.shape)
            b_el.copy_(b)
            staged = timed(bias=b)
            element = timed(bias=b_el)
            o_el = run(bias=b_el)
            o_st = run(bias=b)
            diff = (o_st.float() - o_el.float()).abs().max().item()
            if not diff <= 1e-2:
                failures.append(f"S={S} {name}: staged vs element loads differ by {diff}")
            rows.append((name, staged, element))
            del b, b_el
        seed = torch.tensor([7], dtype=torch.int64, device=dev)
        offset = torch.tensor([0], dtype=torch.int64, device=dev)
        sinks = torch.randn(1, H, 1, 1, device=dev, dtype=torch.float32, generator=gen)
        for name, kw in [("ALiBi", {"use_alibi_mask": True}), ("softcap 30", {"softcap": 30.0}),
                         ("sinks", {"sink_token": sinks}), ("dropout 0.1", {"dropout": (0.1, seed, offset)})]:
            if wanted(args, name):
                rows.append((name, timed(**kw), None))
        for name, t, te in rows:
            el = f"{te:.3f} | {te / plain:.2f}" if te is not None else "— | —"
            print(f"| {S} | {name} | {t:.3f} | {flops / t / 1e9:.0f} | {t / plain:.2f} | {el} |", flush=True)
        del q, k, v
        torch.cuda.empty_cache()
    for f in failures:
        print("FAIL", f)
    sys.exit(1 if failures else 0)


def wanted(args, name: str) -> bool:
    """Whether feature row `name` runs under --only (every row without it)."""
    only = [x for x in args.only.split(",") if x]
    return not only or any(name.startswith(x) for x in only)


def backward_table(args, dev, timer) -> None:
    """The --backward table: each feature's backward (dQ, dK, dV and its own gradients) against the plain one."""
    H, D = args.heads, args.head_dim
    print(f"GPU {torch.cuda.get_device_name()}, B=1 H={H} D={D} BF16 causal, backward; median of {args.reps}")
    print("| S | feature | ms | TFLOP/s | x plain |")
    print("|---|---|---|---|---|")
    for S in [int(x) for x in args.seqs.split(",")]:
        gen = torch.Generator(device=dev).manual_seed(S)
        q, k, v = (torch.randn(1, H, S, D, device=dev, dtype=torch.bfloat16, generator=gen).requires_grad_()
                   for _ in range(3))
        do = torch.randn(1, H, S, D, device=dev, dtype=torch.bfloat16, generator=gen)
        flops = 2.5 * 4.0 * D * (S * (S + 1) // 2) * H
        seed = torch.tensor([7], dtype=torch.int64, device=dev)
        offset = torch.tensor([0], dtype=torch.int64, device=dev)
        # Each row's arguments made only when the row runs (--only), so that skipped biases take no memory.
        features = [
            ("plain", lambda: {}),
            ("bias (1,1,S,S) bf16", lambda: {"bias": torch.randn(1, 1, S, S, device=dev, dtype=torch.bfloat16,
                                                                 generator=gen).requires_grad_()}),
            ("bias (1,1,1,S) bf16", lambda: {"bias": torch.randn(1, 1, 1, S, device=dev, dtype=torch.bfloat16,
                                                                 generator=gen).requires_grad_()}),
            ("ALiBi", lambda: {"use_alibi_mask": True}),
            ("softcap 30", lambda: {"softcap": 30.0}),
            ("sinks", lambda: {"sink_token": torch.randn(1, H, 1, 1, device=dev, dtype=torch.float32,
                                                         generator=gen).requires_grad_()}),
            ("dropout 0.1", lambda: {"dropout": (0.1, seed, offset)}),
        ]
        plain = None
        for name, make_kw in features:
            if name != "plain" and not wanted(args, name):
                continue
            kw = make_kw()
            o = flashspan.sdpa(q, k, v, attn_scale=1.0 / math.sqrt(D), diagonal_band_right_bound=0, **kw)[0]
            wrt = [q, k, v] + [t for t in kw.values() if isinstance(t, torch.Tensor) and t.requires_grad]
            t = timer.measure(lambda: torch.autograd.grad(o, wrt, do, retain_graph=True)).median_ms
            plain = plain if plain is not None else t
            print(f"| {S} | {name} | {t:.3f} | {flops / t / 1e9:.0f} | {t / plain:.2f} |", flush=True)
            del o
        del q, k, v, do, features
        torch.cuda.empty_cache()


def peers_table(args, dev, timer) -> None:
    """The --peers table: plain, bias and dropout on PyTorch SDPA's backends and on flashspan, forward and backward."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    import torch.nn.functional as F

    H, D = args.heads, args.head_dim
    print(f"GPU {torch.cuda.get_device_name()}, B=1 H={H} D={D} BF16 causal, PyTorch {torch.__version__}; "
          f"median of {args.reps}; ms (x the library's own plain call); PyTorch's bias holds the causal mask "
          "(-inf above the diagonal: it takes no is_causal with a bias, so every block is computed)")
    print("| S | library | pass | plain | bias (1,1,S,S) bf16 | dropout 0.1 |")
    print("|---|---|---|---|---|---|")
    backends = [("PyTorch cuDNN", SDPBackend.CUDNN_ATTENTION), ("PyTorch flash", SDPBackend.FLASH_ATTENTION),
                ("PyTorch efficient", SDPBackend.EFFICIENT_ATTENTION)]
    for S in [int(x) for x in args.seqs.split(",")]:
        gen = torch.Generator(device=dev).manual_seed(S)
        q, k, v = (torch.randn(1, H, S, D, device=dev, dtype=torch.bfloat16, generator=gen).requires_grad_()
                   for _ in range(3))
        do = torch.randn(1, H, S, D, device=dev, dtype=torch.bfloat16, generator=gen)
        bias = torch.randn(1, 1, S, S, device=dev, dtype=torch.bfloat16, generator=gen)
        causal = torch.ones(S, S, device=dev, dtype=torch.bool).tril()
        # PyTorch takes a bias and is_causal not together: the causal mask folded into the bias (-inf above).
        bias_causal = bias.masked_fill(~causal, float("-inf"))
        seed = torch.tensor([7], dtype=torch.int64, device=dev)
        offset = torch.tensor([0], dtype=torch.int64, device=dev)
        scale = 1.0 / math.sqrt(D)

        def torch_call(backend, feature):
            def f():
                with sdpa_kernel([backend]):
                    if feature == "bias":
                        return F.scaled_dot_product_attention(q, k, v, attn_mask=bias_causal, scale=scale)
                    return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale,
                                                          dropout_p=0.1 if feature == "dropout" else 0.0)
            return f

        def ours_call(feature):
            kw = {"bias": bias} if feature == "bias" else {"dropout": (0.1, seed, offset)} if feature == "dropout" else {}
            return lambda: flashspan.sdpa(q, k, v, attn_scale=scale, diagonal_band_right_bound=0, **kw)[0]

        libs = [(name, lambda ft, b=b: torch_call(b, ft)) for name, b in backends] + [("flashspan", ours_call)]
        for name, make in libs:
            for phase in ("forward", "backward"):
                cells = []
                for feature in ("plain", "bias", "dropout"):
                    call = make(feature)
                    try:
                        if phase == "forward":
                            with torch.no_grad():
                                t = timer.measure(call).median_ms
                        else:
                            o = call()
                            t = timer.measure(lambda: torch.autograd.grad(o, [q, k, v], do, retain_graph=True)).median_ms
                            del o
                    except RuntimeError as e:  # the backend refuses the call (its message on stderr)
                        print(f"{name} {phase} {feature}: n/a ({str(e).splitlines()[0][:120]})", file=sys.stderr)
                        t = None
                    cells.append(t)
                plain = cells[0]
                txt = [f"{c:.3f}" + (f" ({c / plain:.2f})" if plain and i else "") if c is not None else "n/a"
                       for i, c in enumerate(cells)]
                print(f"| {S} | {name} | {phase} | " + " | ".join(txt) + " |", flush=True)
        del q, k, v, do, bias, bias_causal, causal
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
