"""MODEL, NOT A MEASUREMENT: predicted context-parallel scaling of flashspan.distributed on N H200s.

Nothing here runs on a GPU or over NCCL. The model combines
  * the real per-(query shard, key shard) work of the real sharding code: visible pairs of the
    eight-mask builders (flashspan.masks.benchmark_mask) at the requested S, computed exactly by
    SequenceSharding.work_matrix (endpoints shifted into each key shard, as the plans are built);
  * single-GPU kernel rates MEASURED earlier on one H200 (flashspan-bench, S=131072, B=1, H=4,
    D=128, BF16; README / benchmarks/results/2026-11-29-h200-bwd-addr/s131072/): causal 351 fwd /
    297 bwd TFLOP/s, document_causal 339 / 261 -- applied to every pair as if a pair ran at the rate
    of its whole mask (ASSUMPTION: shard pairs of >= 131072 tokens per side are large enough);
  * NCCL bandwidths that are ASSUMED, not measured here (NVLink 4 on H200 SXM: 450 GB/s per
    direction nominal; defaults 350 GB/s for ring send/recv and all-gather bus bandwidth, typical
    of nccl-tests on 8x H100/H200 SXM), and a compute slowdown while NCCL kernels share the SMs
    (default 5 %).

Ring step model (what flashspan.distributed does): at step s every rank attends its query shard to
the K/V shard in hand while the next shard moves one hop; a step ends when the slowest rank has both
finished its pair and received its next shard: step = max_i max(compute(i, s), transfer). Backward
hops carry K/V (BF16) plus the fp32 dK/dV accumulators, and the last dK/dV hop is exposed.
All-gather: the K/V gather (and in the backward the fp32 dK/dV reduce-scatter) is exposed, then one
kernel per rank over all keys.

Scaling efficiency = T(1 GPU, whole problem) / (N * T(N GPUs)); "hidden" = share of the transfer
time that overlaps compute. Check against NCCL runs when multi-GPU machines are lent (issue 15).

Usage: python benchmarks/cp_model.py [--seqlen 1048576] [--worlds 2,4,8] [--heads 8,32] ...
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))

# flashspan.distributed and flashspan.masks are pure torch: the model needs no compiled library.
from flashspan.distributed.plan import choose_strategy  # noqa: E402
from flashspan.distributed.sharding import SequenceSharding  # noqa: E402

MEASURED_TFLOPS = {  # (fwd, bwd) TFLOP/s over visible pairs, one H200, S=131072, H=4, D=128, BF16
    "causal": (351.0, 297.0),
    "document_causal": (339.0, 261.0),
}


def model(mask: str, s: int, world: int, hq: int, hkv: int, d: int, *, p2p_gbps: float, ag_gbps: float,
          sm_tax: float, scheme: str = "zigzag", work=None) -> dict:
    """Predicted times (ms) of one attention layer, B=1, for ring and all-gather on ``world`` GPUs."""
    fwd_rate, bwd_rate = (r * 1e12 for r in MEASURED_TFLOPS[mask])
    if work is None:
        import flashspan.masks as fm

        work = SequenceSharding(world, seqlen=s, scheme=scheme).work_matrix(fm.benchmark_mask(mask, s))
    flop_pair = 4 * d * hq  # forward FLOP per visible (query, key) pair over all heads (Dqk = Dv = d)
    total = sum(map(sum, work))
    t1_fwd, t1_bwd = total * flop_pair / fwd_rate, 2.5 * total * flop_pair / bwd_rate
    shard = s // world
    kv_bytes = shard * hkv * 2 * d * 2  # K and V, BF16
    dkv_bytes = shard * hkv * 2 * d * 4  # dK and dV accumulators, fp32
    t_kv, t_dkv = kv_bytes / (p2p_gbps * 1e9), dkv_bytes / (p2p_gbps * 1e9)

    far = [(i - j) % world for i in range(world) for j in range(world) if work[i][j]]
    steps = 1 + max(far, default=0)  # the ring stops once no rank needs a farther shard

    def ring(rate, factor, hop, last_hop):
        time = exposed = 0.0
        comm = 0.0
        for step in range(steps):
            moving = hop if step < steps - 1 else 0.0
            comp = max(work[i][(i - step) % world] for i in range(world)) * flop_pair * factor / rate
            comp *= 1 + (sm_tax if moving else 0.0)
            time += max(comp, moving)
            exposed += max(0.0, moving - comp)
            comm += moving
        if last_hop and steps > 1:  # the dK/dV of the last step go home after it
            time += last_hop
            exposed += last_hop
            comm += last_hop
        return time, (1 - exposed / comm) if comm else 1.0

    ring_f, hid_f = ring(fwd_rate, 1.0, t_kv, 0.0)
    ring_b, hid_b = ring(bwd_rate, 2.5, t_kv + t_dkv, t_dkv)
    rank_max = max(sum(row) for row in work)
    t_ag = (world - 1) * kv_bytes / (ag_gbps * 1e9)
    t_rs = (world - 1) * dkv_bytes / (ag_gbps * 1e9)
    ag_f = t_ag + rank_max * flop_pair / fwd_rate
    ag_b = t_ag + t_rs + 2.5 * rank_max * flop_pair / bwd_rate
    eff = lambda t1, tn: t1 / (world * tn)  # noqa: E731
    return dict(
        mask=mask, S=s, N=world, Hq=hq, Hkv=hkv, D=d, ring_steps=steps,
        imbalance=rank_max / (total / world),
        t1_fwd=t1_fwd * 1e3, t1_bwd=t1_bwd * 1e3,
        ring_fwd=ring_f * 1e3, ring_bwd=ring_b * 1e3, ring_eff_fwd=eff(t1_fwd, ring_f), ring_eff_bwd=eff(t1_bwd, ring_b),
        hidden_fwd=hid_f, hidden_bwd=hid_b,
        ag_fwd=ag_f * 1e3, ag_bwd=ag_b * 1e3, ag_eff_fwd=eff(t1_fwd, ag_f), ag_eff_bwd=eff(t1_bwd, ag_b),
        auto=choose_strategy(world, hq, hkv, d, d),
    )


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seqlen", type=int, default=1 << 20)
    ap.add_argument("--worlds", default="2,4,8")
    ap.add_argument("--heads", default="8,32", help="Hq values (Hkv = Hq unless --gqa-kv-heads)")
    ap.add_argument("--gqa-kv-heads", type=int, default=4, help="also model Hkv = this for every Hq > it (0: off)")
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--schemes", default="causal:zigzag,document_causal:contiguous,document_causal:zigzag",
                    help="mask:scheme pairs to model")
    ap.add_argument("--p2p-gbps", type=float, default=350.0, help="ASSUMED NCCL send/recv GB/s per direction")
    ap.add_argument("--ag-gbps", type=float, default=350.0, help="ASSUMED NCCL all-gather / reduce-scatter bus GB/s")
    ap.add_argument("--sm-tax", type=float, default=0.05, help="ASSUMED compute slowdown while NCCL runs")
    a = ap.parse_args(argv)
    import flashspan.masks as fm

    print("MODEL, NOT A MEASUREMENT (benchmarks/cp_model.py): kernel rates measured on one H200; NCCL bandwidths "
          f"assumed ({a.p2p_gbps:.0f} GB/s p2p, {a.ag_gbps:.0f} GB/s all-gather); work from the real sharding.")
    print(f"S={a.seqlen}, B=1, D={a.head_dim}; times in ms per layer; eff = T1 / (N * TN); steps = ring steps\n")
    print("| mask | scheme | N | Hq/Hkv | imbal. | steps | 1-GPU fwd/bwd | ring fwd/bwd | ring eff fwd/bwd "
          "| hidden fwd/bwd | all-gather fwd/bwd | AG eff fwd/bwd | auto |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    masks = {}
    for item in a.schemes.split(","):
        mask, scheme = item.split(":")
        if mask not in masks:
            masks[mask] = fm.benchmark_mask(mask, a.seqlen)
        for w in (int(x) for x in a.worlds.split(",")):
            work = SequenceSharding(w, seqlen=a.seqlen, scheme=scheme).work_matrix(masks[mask])
            for hq in (int(x) for x in a.heads.split(",")):
                kv_list = [hq] + ([a.gqa_kv_heads] if 0 < a.gqa_kv_heads < hq else [])
                for hkv in kv_list:
                    r = model(mask, a.seqlen, w, hq, hkv, a.head_dim, p2p_gbps=a.p2p_gbps, ag_gbps=a.ag_gbps,
                              sm_tax=a.sm_tax, scheme=scheme, work=work)
                    print(f"| {mask} | {scheme} | {w} | {hq}/{hkv} | {r['imbalance']:.3f} | {r['ring_steps']} "
                          f"| {r['t1_fwd']:.0f} / {r['t1_bwd']:.0f} "
                          f"| {r['ring_fwd']:.1f} / {r['ring_bwd']:.1f} | {r['ring_eff_fwd']:.2f} / {r['ring_eff_bwd']:.2f} "
                          f"| {r['hidden_fwd']:.2f} / {r['hidden_bwd']:.2f} | {r['ag_fwd']:.1f} / {r['ag_bwd']:.1f} "
                          f"| {r['ag_eff_fwd']:.2f} / {r['ag_eff_bwd']:.2f} | {r['auto']} |")


if __name__ == "__main__":
    main()
