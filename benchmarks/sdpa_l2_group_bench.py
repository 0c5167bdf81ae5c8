"""The sm90 SDPA forward's cells in L2 groups of (sample, head) pairs (on by default for calls without a left bound or
a block mask; PERF_LOG v2.59-v2.60) against the ungrouped order (FLASHSPAN_SM90_FWD_L2_GROUP=0), alternated in one
process, and for masks with a band the groups in static snake waves (FLASHSPAN_SM90_FWD_CLAIM=0) against claimed
through the counter (the default); each output compared bitwise with the ungrouped order's (exit status 1 on a
difference). Dense and paged (page 256, shuffled) K/V, masks none, causal and a causal window of 4096 (ungrouped by
default), bf16; TFLOP/s over visible pairs (4 D a pair). Then the non-deterministic backward's causal cells in L2
groups (on by default; PERF_LOG v2.61) against FLASHSPAN_SM90_BWD_L2_GROUP=0 (2.5x the forward's FLOPs; gradients
within 1e-2 of the ungrouped order's, relative to their largest element: the dQ additions' order differs). Then
the deterministic backward's cells in L2 groups (PERF_LOG v2.62-v2.63; by default for lists of 12 waves of the grid or
more) against FLASHSPAN_SM90_BWD_DET_L2_GROUP=0, no mask and causal (gradients bitwise the ungrouped order's).
--only-det: that section alone.

Usage: python benchmarks/sdpa_l2_group_bench.py [--quick] [--no-bwd] [--only-det]   (needs a CUDA device with sm_90)
"""
import os
import sys

import torch

import flashspan
from flashspan.bench.timing import Timer
from flashspan.bench.workloads import paged_cache
if not torch.cuda.is_available():
    raise SystemExit("sdpa_l2_group_bench: needs a CUDA device")
dev = torch.device("cuda")
timer = Timer(dev, warmup=3, reps=15)
print(torch.cuda.get_device_name())
gen = torch.Generator().manual_seed(0)
VARS = ("FLASHSPAN_SM90_FWD_L2_GROUP", "FLASHSPAN_SM90_FWD_CLAIM")
# name -> the variables of the run (none: the default)
RUNS = {"off": {"FLASHSPAN_SM90_FWD_L2_GROUP": "0"}, "default": {}, "static": {"FLASHSPAN_SM90_FWD_CLAIM": "0"}}
SHAPES = ((1, 16, 8192, 128), (4, 16, 8192, 128), (16, 16, 2048, 128), (1, 16, 32768, 128), (8, 16, 4096, 64))
if "--quick" in sys.argv:
    SHAPES = SHAPES[1:3]
bad = 0
ONLY_DET = "--only-det" in sys.argv
for b, h, s, d in SHAPES if not ONLY_DET else ():
    q, k, v = (torch.randn(b, h, s, d, device=dev, dtype=torch.bfloat16) for _ in range(3))
    lens = torch.full((b,), s, dtype=torch.int32, device=dev)
    kc, kt = paged_cache(k, 256, gen)
    vc, vt = paged_cache(v, 256, gen)
    for mask in ("none", "causal", "window"):
        ma = {} if mask == "none" else {"diagonal_band_right_bound": 0}
        if mask == "window":
            ma["diagonal_band_left_bound"] = 4096
        if mask == "window" and s <= 4096:
            continue
        pairs = sum(min(i + 1, ma.get("diagonal_band_left_bound", s)) for i in range(s)) if ma else s * s
        tf = lambda ms: 4 * d * pairs * b * h / ms / 1e9
        for kind in ("dense", "paged256"):
            if kind == "dense":
                f = lambda: flashspan.sdpa(q, k, v, attn_scale=d ** -0.5, generate_stats=False, **ma)[0]
            else:
                f = lambda: flashspan.sdpa(q, kc, vc, attn_scale=d ** -0.5, use_padding_mask=True, seq_len_q=lens,
                                           seq_len_kv=lens, paged_attention_k_table=kt, paged_attention_v_table=vt,
                                           paged_attention_max_seq_len_kv=s, generate_stats=False, **ma)[0]
            runs = [r for r in RUNS if mask == "causal" or r != "static"]
            res = {}
            with torch.no_grad():
                os.environ.update(RUNS["off"])
                ref = f()
                for rnd in range(2):
                    for r in runs:
                        for n in VARS:
                            os.environ.pop(n, None)
                        os.environ.update(RUNS[r])
                        if not torch.equal(f(), ref):
                            bad += 1
                            print("DIFF", b, h, s, d, mask, kind, r)
                        res.setdefault(r, []).append(f"{tf(timer.measure(f).median_ms):.0f}")
            for n in VARS:
                os.environ.pop(n, None)
            print(f"B={b} H={h} S={s} D={d} {mask} {kind}: " + "; ".join(f"{r} {'/'.join(v)}" for r, v in res.items()),
                  flush=True)
if "--no-bwd" not in sys.argv and not ONLY_DET:
    for b, h, s, d in SHAPES:
        q, k, v = (torch.randn(b, h, s, d, device=dev, dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
        tf = lambda ms: 2.5 * 4 * d * (s * (s + 1) // 2) * b * h / ms / 1e9
        o = flashspan.sdpa(q, k, v, attn_scale=d ** -0.5, diagonal_band_right_bound=0)[0]
        do = torch.randn_like(o)
        f = lambda: torch.autograd.grad(o, (q, k, v), do, retain_graph=True)
        res = {}
        os.environ["FLASHSPAN_SM90_BWD_L2_GROUP"] = "0"
        ref = f()
        for rnd in range(2):
            for r in ("off", "default"):
                os.environ.pop("FLASHSPAN_SM90_BWD_L2_GROUP", None)
                if r == "off":
                    os.environ["FLASHSPAN_SM90_BWD_L2_GROUP"] = "0"
                for a, want in zip(f(), ref):
                    if (a.float() - want.float()).abs().max().item() > 1e-2 * want.float().abs().max().item():
                        bad += 1
                        print("DIFF bwd", b, h, s, d, r)
                res.setdefault(r, []).append(f"{tf(timer.measure(f).median_ms):.0f}")
        os.environ.pop("FLASHSPAN_SM90_BWD_L2_GROUP", None)
        print(f"backward B={b} H={h} S={s} D={d} causal: " + "; ".join(f"{r} {'/'.join(v)}" for r, v in res.items()),
              flush=True)
        del q, k, v, o, do, ref
if "--no-bwd" not in sys.argv:
    DET = "FLASHSPAN_SM90_BWD_DET_L2_GROUP"
    torch.use_deterministic_algorithms(True)
    for b, h, s, d in SHAPES:
        q, k, v = (torch.randn(b, h, s, d, device=dev, dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
        for mask in ("none", "causal"):
            ma = {} if mask == "none" else {"diagonal_band_right_bound": 0}
            pairs = s * (s + 1) // 2 if ma else s * s
            tf = lambda ms: 2.5 * 4 * d * pairs * b * h / ms / 1e9
            o = flashspan.sdpa(q, k, v, attn_scale=d ** -0.5, **ma)[0]
            do = torch.randn_like(o)
            f = lambda: torch.autograd.grad(o, (q, k, v), do, retain_graph=True)
            res = {}
            os.environ[DET] = "0"
            ref = f()
            for rnd in range(2):
                for r in ("off", "default"):
                    os.environ.pop(DET, None)
                    if r == "off":
                        os.environ[DET] = "0"
                    if not all(torch.equal(a, want) for a, want in zip(f(), ref)):
                        bad += 1
                        print("DIFF det bwd", b, h, s, d, mask, r)
                    res.setdefault(r, []).append(f"{tf(timer.measure(f).median_ms):.0f}")
            os.environ.pop(DET, None)
            print(f"deterministic backward B={b} H={h} S={s} D={d} {mask}: " +
                  "; ".join(f"{r} {'/'.join(v)}" for r, v in res.items()), flush=True)
            del o, do, ref
        del q, k, v
    torch.use_deterministic_algorithms(False)
print("bad", bad)
if bad:
    raise SystemExit(1)
