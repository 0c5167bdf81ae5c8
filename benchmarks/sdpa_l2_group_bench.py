"""The sm90 SDPA forward's item order in groups of (sample, head) pairs (FLASHSPAN_SM90_FWD_L2_GROUP, experimental;
PERF_LOG v2.59) against the ungrouped order, alternated in one process, for G in 0 (ungrouped), 2, 4, 8; each output
compared bitwise with the ungrouped order's (exit status 1 on a difference). Dense and paged (page 256, shuffled) K/V,
masks none and causal, bf16; TFLOP/s over visible pairs (4 D a pair).

Usage: python benchmarks/sdpa_l2_group_bench.py   (needs a CUDA device with sm_90)
"""
import os

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
bad = 0
for b, h, s, d in ((4, 16, 8192, 128), (1, 16, 32768, 128), (8, 16, 4096, 64)):
    q, k, v = (torch.randn(b, h, s, d, device=dev, dtype=torch.bfloat16) for _ in range(3))
    lens = torch.full((b,), s, dtype=torch.int32, device=dev)
    kc, kt = paged_cache(k, 256, gen); vc, vt = paged_cache(v, 256, gen)
    for mask in ("none", "causal"):
        ma = {} if mask == "none" else {"diagonal_band_right_bound": 0}
        pairs = s * s if mask == "none" else s * (s + 1) // 2
        tf = lambda ms: 4 * d * pairs * b * h / ms / 1e9
        for kind in ("dense", "paged256"):
            if kind == "dense":
                f = lambda: flashspan.sdpa(q, k, v, attn_scale=d ** -0.5, generate_stats=False, **ma)[0]
            else:
                f = lambda: flashspan.sdpa(q, kc, vc, attn_scale=d ** -0.5, use_padding_mask=True, seq_len_q=lens,
                                           seq_len_kv=lens, paged_attention_k_table=kt, paged_attention_v_table=vt,
                                           paged_attention_max_seq_len_kv=s, generate_stats=False, **ma)[0]
            res = {}
            with torch.no_grad():
                os.environ.pop("FLASHSPAN_SM90_FWD_L2_GROUP", None)
                ref = f()
                for rnd in range(2):
                    for g in ("0", "2", "4", "8"):
                        os.environ["FLASHSPAN_SM90_FWD_L2_GROUP"] = g
                        if not torch.equal(f(), ref):
                            bad += 1
                            print("DIFF", b, h, s, d, mask, kind, g)
                        res.setdefault(g, []).append(f"{tf(timer.measure(f).median_ms):.0f}")
            os.environ.pop("FLASHSPAN_SM90_FWD_L2_GROUP", None)
            print(f"B={b} H={h} S={s} D={d} {mask} {kind}: " + "; ".join(f"g{g} {'/'.join(v)}" for g, v in res.items()), flush=True)
print("bad", bad)
if bad:
    raise SystemExit(1)
