"""Packed (THD) SDPA forward speed on the GPU: the sm90 forward through per-sample tensor maps (the default on an
H100 / H200; docs/SDPA.md "The sm90 forward") against the sm80 forward that runs packed calls with
``FLASHSPAN_SM90_SDPA_THD=0``, and against the same samples padded (BHSD with ``seq_len``) on the sm90 forward, in one
process.

Shapes: H=16 (H_k = 16 or 4 with --gqa), D=128, BF16, causal (or none with --mask none); the tokens of --tokens
(default 32768) split into samples of --doc-len rows (default 4096; ``random``: lengths uniform in [1, 2 * mean] with
the same total). Routes:
  sm80     ``FLASHSPAN_SM90_SDPA_THD=0`` (packed calls take the sm80 forward, as on other GPUs);
  thd90    the default (the variable unset): the sm90 forward with the per-sample maps (their pre-pass included);
  pad90    the samples padded to the longest into BHSD tensors with ``seq_len_q`` / ``seq_len_kv`` (sm90 forward,
           default environment): what a caller who pads pays, the padded rows' blocks included.
Each route sets or unsets ``FLASHSPAN_SM90_SDPA_THD`` only (read per call); other variables (``FLASHSPAN_EXPERIMENTAL``
included) are the caller's.
--backward times the backward instead (each route's own forward's O and LSE, computed once; dQ compared), TFLOP/s
10 * D * pairs * H. TFLOP/s over the visible (query, key) pairs of the samples: 4 * D * pairs * H. Timing: flashspan.bench.timing.Timer
(CUDA events, L2 flushed between calls, median). O of every route against sm80's with the tests' criterion; a failure
makes the exit status 1. --device cpu runs a tiny smoke test of the script on the CPU reference.

Usage: python benchmarks/sdpa_thd_bench.py [--tokens 32768] [--doc-len 4096|random] [--mask causal|none] [--gqa] [--backward]
"""

from __future__ import annotations

import argparse
import itertools
import os
import random
import sys

import torch

import flashspan
from flashspan.bench.switches import scoped_env
from flashspan.bench.timing import Timer, tflops

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "python"))
from criteria import check_tensor  # noqa: E402  (the tests' one error criterion)


THD_ENV = "FLASHSPAN_SM90_SDPA_THD"  # "0": packed calls on the sm80 kernels (the sm80 route); unset: the default


def sm90_thd(on: bool):
    """Packed tensors on the sm90 kernels (the default: the variable unset) or, off, on the sm80 ones (its "0")."""
    return scoped_env(**{THD_ENV: None if on else "0"})


def lengths(tokens: int, doc_len: str, seed: int = 0) -> list[int]:
    if doc_len != "random":
        n = int(doc_len)
        return [n] * (tokens // n) + ([tokens % n] if tokens % n else [])
    rng = random.Random(seed)
    out, left = [], tokens
    mean = 4096 if tokens >= 8192 else max(tokens // 4, 1)
    while left > 0:
        n = min(left, rng.randint(1, 2 * mean))
        out.append(n)
        left -= n
    return out


def visible_pairs(lens: list[int], mask: str) -> int:
    return sum(n * (n + 1) // 2 if mask == "causal" else n * n for n in lens)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokens", type=int, default=32768)
    ap.add_argument("--doc-len", default="4096")
    ap.add_argument("--mask", default="causal", choices=["causal", "none"])
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--gqa", action="store_true", help="H_k = H / 4")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--backward", action="store_true", help="time the backward (dQ, dK, dV) instead of the forward")
    ap.add_argument("--device", default="cuda")
    a = ap.parse_args()
    dev = a.device
    if dev == "cpu":
        a.tokens, a.doc_len, a.heads, a.head_dim, a.reps, a.warmup = 96, "random", 2, 16, 1, 0
    lens = lengths(a.tokens, a.doc_len)
    H, D, Hk = a.heads, a.head_dim, a.heads // 4 if a.gqa else a.heads
    T, B, smax = sum(lens), len(lens), max(lens)
    g = torch.Generator().manual_seed(0)
    q = torch.randn(T, H, D, generator=g).bfloat16().to(dev)
    k = torch.randn(T, Hk, D, generator=g).bfloat16().to(dev)
    v = torch.randn(T, Hk, D, generator=g).bfloat16().to(dev)
    cu = torch.tensor([0, *itertools.accumulate(lens)], dtype=torch.int32, device=dev)
    seq = torch.tensor(lens, dtype=torch.int32, device=dev)
    kw = dict(attn_scale=D**-0.5)
    if a.mask == "causal":
        kw["diagonal_band_right_bound"] = 0

    # S_max given, as FlashAttention's varlen callers give max_seqlen (without it flashspan.sdpa reads it from the
    # lengths: a reduction and a device-to-host copy a call, which the timing would include).
    thd_kw = dict(cu_seq_len_q=cu, cu_seq_len_kv=cu, use_padding_mask=True, max_total_seq_len_q=T,
                  max_total_seq_len_kv=T, max_seq_len_q=smax, max_seq_len_kv=smax, **kw)

    def thd():
        return flashspan.sdpa(q, k, v, **thd_kw)[0]

    # The padded copies (BHSD, rows past a sample zero).
    def pad(x):
        out = torch.zeros(B, x.shape[1], smax, D, dtype=x.dtype, device=dev)
        for b, (s, n) in enumerate(zip(cu.tolist()[:-1], lens)):
            out[b, :, :n] = x[s:s + n].transpose(0, 1)
        return out

    qp, kp, vp = pad(q), pad(k), pad(v)

    pad_kw = dict(seq_len_q=seq, seq_len_kv=seq, use_padding_mask=True, **kw)

    def padded():
        return flashspan.sdpa(qp, kp, vp, **pad_kw)[0]

    if a.backward:
        # The backward of each route on its own forward's O and LSE (computed once, untimed); one random dO (normal,
        # bf16), padded for pad90; dQ compared (THD rows).
        do = (torch.randn(T, H, D, generator=g).bfloat16()).to(dev)
        dop = pad(do)

        def bwd_of(on90, x, y, z, dout, fkw):
            with sm90_thd(on90), torch.no_grad():
                o, st = flashspan.sdpa(x, y, z, generate_stats=True, **fkw)
            return lambda: flashspan.sdpa_backward(x, y, z, o, dout, st, **fkw)[0]

        routes = {"sm80": (False, bwd_of(False, q, k, v, do, thd_kw)),
                  "thd90": (True, bwd_of(True, q, k, v, do, thd_kw)),
                  "pad90": (True, bwd_of(True, qp, kp, vp, dop, pad_kw))}
    else:
        routes = {"sm80": (False, thd), "thd90": (True, thd), "pad90": (True, padded)}
    pairs = visible_pairs(lens, a.mask)
    timer = Timer(torch.device(dev), warmup=a.warmup, reps=a.reps)
    ref, fails = None, []
    print(f"T={T} B={B} (lengths {'x'.join(str(n) for n in lens[:4])}{'...' if B > 4 else ''}) H={H} Hk={Hk} D={D} "
          f"{a.mask}{' backward' if a.backward else ''}")
    print("| route | ms | TFLOP/s |\n|---|---|---|")
    for name, (on90, fn) in routes.items():
        with sm90_thd(on90), torch.no_grad():
            o = fn()
            if name == "pad90":  # back to THD rows
                o = torch.cat([o[b, :, :n].transpose(0, 1) for b, n in enumerate(lens)])
            if ref is None:
                ref = o.float().cpu()
            else:
                try:
                    check_tensor(o.float().cpu(), ref, torch.bfloat16, name)
                except AssertionError as e:
                    fails.append(str(e))
            ms = timer.measure(fn).median_ms
        tf = tflops((10 if a.backward else 4) * D * pairs * H, ms)
        print(f"| {name} | {ms:.3f} | {tf:.1f} |" if tf is not None else f"| {name} | {ms:.3f} | - |")
    for f in fails:
        print("FAIL", f)
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
