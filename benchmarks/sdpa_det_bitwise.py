"""How often the deterministic sm90 backward gives a bitwise different result. For one shape -- SDPA (B=1, H=16, D=128,
bf16, no mask unless --causal) or, with --flex NAME, a flex benchmark mask (B=1, H=4, D=128, bf16,
flashspan.masks.benchmark_mask) -- runs the backward N times under each named configuration of the deterministic
order's switches, all in one process on the same inputs, and prints per configuration the number of distinct dQ
results (with their counts), how many equal the first run of the first configuration, how many runs differed in dK or
dV, and the largest |dQ - first|. Exit status 1 when a reproducible configuration gave more than one result.

Configurations: snake (FLASHSPAN_SM90_BWD_DET_L2_GROUP=0, FLASHSPAN_SM90_BWD_DET_CLAIM=0: ungrouped static snake
waves), claimed (ungrouped, claimed through the counter), default (the rules), each also with the suffix _whole
(FLASHSPAN_SM90_BWD_DET_DQ_CHUNKS=1: each dQ tile added whole, not in two halves) and _relaxed
(FLASHSPAN_SM90_BWD_DET_RELAXED=1: the dQ turn handed on by a relaxed increment, measurement only and NOT
reproducible: PERF_LOG v2.64 found it gave a different dQ in 1-3 of 16 runs of the flex tree_bfs / hstu on an H100; its
differences do not set the exit status, so it serves as the check that the script can see one). PERF_LOG v2.63-v2.64.

Usage: python benchmarks/sdpa_det_bitwise.py [--runs N] [--seq S] [--causal | --flex NAME] [CONFIG ...]
(needs a CUDA device with sm_90)
"""
import argparse
import os

import torch

import flashspan

BASE = {
    "snake": {"FLASHSPAN_SM90_BWD_DET_L2_GROUP": "0", "FLASHSPAN_SM90_BWD_DET_CLAIM": "0"},
    "claimed": {"FLASHSPAN_SM90_BWD_DET_L2_GROUP": "0"},
    "default": {},
}
CONF = dict(BASE)
CONF.update({k + "_whole": dict(v, FLASHSPAN_SM90_BWD_DET_DQ_CHUNKS="1") for k, v in BASE.items()})
CONF.update({k + "_relaxed": dict(v, FLASHSPAN_SM90_BWD_DET_RELAXED="1") for k, v in BASE.items()})
VARS = sorted({k for c in CONF.values() for k in c})

ap = argparse.ArgumentParser()
ap.add_argument("--runs", type=int, default=40)
ap.add_argument("--seq", type=int, default=32768)
ap.add_argument("--causal", action="store_true")
ap.add_argument("--flex", metavar="NAME", help="a flex benchmark mask instead of SDPA (B=1, H=4)")
ap.add_argument("configs", nargs="*", default=["snake", "default", "default_whole"])
args = ap.parse_args()
if not torch.cuda.is_available():
    raise SystemExit("sdpa_det_bitwise: needs a CUDA device")
for c in args.configs:
    if c not in CONF:
        raise SystemExit(f"sdpa_det_bitwise: unknown configuration {c!r} (one of {', '.join(CONF)})")
dev = torch.device("cuda")
torch.use_deterministic_algorithms(True)
torch.manual_seed(0)
if args.flex:
    import flashspan.masks as fm
    q, k, v = (torch.randn(1, args.seq, 4, 128, device=dev, dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    plan = flashspan.create_mask_plan(fm.benchmark_mask(args.flex, args.seq, device=dev), q, k, v, build_backward=True)
    o = flashspan.flex_attn_func(q, k, v, mask_plan=plan, deterministic=True)
    what = f"flex {args.flex}"
else:
    q, k, v = (torch.randn(1, 16, args.seq, 128, device=dev, dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    band = {"diagonal_band_right_bound": 0} if args.causal else {}
    o = flashspan.sdpa(q, k, v, attn_scale=128 ** -0.5, **band)[0]
    what = "causal" if args.causal else "none"
do = torch.randn_like(o)
first = None
bad = 0
for name in args.configs:
    for x in VARS:
        os.environ.pop(x, None)
    os.environ.update(CONF[name])
    uniq, counts, kv_diff = [], [], 0
    for _ in range(args.runs):
        g = torch.autograd.grad(o, (q, k, v), do, retain_graph=True)
        if first is None:
            first = [t.clone() for t in g]
        kv_diff += not all(torch.equal(a, b) for a, b in zip(g[1:], first[1:]))
        for j, u in enumerate(uniq):
            if torch.equal(g[0], u):
                counts[j] += 1
                break
        else:
            uniq.append(g[0].clone())
            counts.append(1)
    same = sum(c for u, c in zip(uniq, counts) if torch.equal(u, first[0]))
    err = max(float((u.float() - first[0].float()).abs().max()) for u in uniq)
    bad += (len(uniq) > 1 or kv_diff > 0) and not name.endswith("_relaxed")
    print(f"S={args.seq} {what} {name}: {args.runs} runs, distinct dQ {len(uniq)} "
          f"(counts {counts}), equal to the first run {same}, dK/dV differing {kv_diff}, max |dQ - first| {err:.3g}",
          flush=True)
for x in VARS:
    os.environ.pop(x, None)
print("bad", bad)
if bad:
    raise SystemExit(1)
