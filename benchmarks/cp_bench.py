"""Context-parallel benchmark (issue 15): times flashspan.distributed forward / backward on N ranks.

NOT RUN ON GPUs YET (written without multi-GPU time; smoke-tested on CPU/gloo at tiny sizes only).
Launch one process per GPU with torchrun; rank 0 prints one line per measured configuration:

    NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 \\
      torchrun --nproc-per-node 8 benchmarks/cp_bench.py --seqlen 1048576 --heads 16 --mask causal

Per configuration: median wall time (CUDA events on every rank, the slowest rank reported) of the
forward and of forward+backward, TFLOP/s per GPU over visible pairs (forward 4·D per pair and
head, backward 2.5× that), and the same run with the transfers replaced by local buffers of the
same shape (``compute only``: same kernels and merges, no NCCL) -- the difference is the exposed
communication. Scaling efficiency needs the one-GPU time of the same S: run with
``--nproc-per-node 1`` (if it fits) and divide. ``--device cpu`` runs on gloo (a smoke test).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402


class _NoTransfer:
    """Stands in for a ring hop in ``--compute-only`` runs: buffers of the right shape, no communication."""

    def __init__(self, plan, tensors, recv_shapes, dst=None, src=None):
        self.recv = [torch.empty(s, dtype=t.dtype, device=t.device) for t, s in zip(tensors, recv_shapes)]

    def wait(self):
        return self.recv


def _timer(device):
    if device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()

        def stop():
            end.record()
            end.synchronize()
            return start.elapsed_time(end)

        return stop
    t0 = time.perf_counter()
    return lambda: (time.perf_counter() - t0) * 1e3


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description="context-parallel flashspan benchmark (torchrun)")
    ap.add_argument("--seqlen", type=int, default=1 << 20)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--kv-heads", type=int, default=0, help="Hkv (default: --heads)")
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--mask", default="causal", help="a flashspan.masks.benchmark_mask name")
    ap.add_argument("--scheme", default="zigzag")
    ap.add_argument("--strategy", default="ring", choices=["ring", "allgather", "auto"])
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--no-backward", action="store_true")
    a = ap.parse_args(argv)

    import flashspan.masks as fm
    from flashspan.distributed import SequenceSharding, attention, create_mask_plan, flex_attn_func

    cuda = a.device == "cuda"
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    dtype = torch.bfloat16 if cuda else torch.float32
    hq, hkv, d = a.heads, a.kv_heads or a.heads, a.head_dim
    sh = SequenceSharding(world, seqlen=a.seqlen, batch=1, scheme=a.scheme)
    sl = sh.local_seqlen()
    gen = torch.Generator(device="cpu").manual_seed(rank)
    q = torch.randn((1, sl, hq, d), generator=gen).to(device, dtype).requires_grad_()
    k = torch.randn((1, sl, hkv, d), generator=gen).to(device, dtype).requires_grad_()
    v = torch.randn((1, sl, hkv, d), generator=gen).to(device, dtype).requires_grad_()
    mask = fm.benchmark_mask(a.mask, a.seqlen)
    t0 = time.perf_counter()
    plan = create_mask_plan(mask, q, k, v, sh, strategy=a.strategy, build_backward=not a.no_backward)
    plan_ms = (time.perf_counter() - t0) * 1e3
    visible = sum(map(sum, sh.work_matrix(mask.to(device))))
    fwd_flop = 4 * d * hq * visible
    dout = torch.randn_like(q)

    def measure(compute_only: bool):
        real = attention._Exchange
        if compute_only:
            attention._Exchange = _NoTransfer
        try:
            fwd, both = [], []
            for it in range(a.warmup + a.iters):
                dist.barrier()
                stop = _timer(device)
                out = flex_attn_func(q, k, v, plan)
                t_f = stop()
                t_b = float("nan")
                if not a.no_backward:
                    stop = _timer(device)
                    out = flex_attn_func(q, k, v, plan)
                    out.backward(dout)
                    t_b = stop()
                if it >= a.warmup:
                    fwd.append(t_f)
                    both.append(t_b)
            # the slowest rank sets the pace
            res = torch.tensor([statistics.median(fwd), statistics.median(both)], dtype=torch.float64, device=device)
            dist.all_reduce(res, op=dist.ReduceOp.MAX)
            return res.tolist()
        finally:
            attention._Exchange = real

    f_ms, fb_ms = measure(False)
    cf_ms, cfb_ms = measure(True) if plan.strategy == "ring" else (float("nan"), float("nan"))
    if rank == 0:
        per_gpu = lambda flop, ms: flop / world / (ms * 1e-3) / 1e12  # noqa: E731
        bwd_ms = fb_ms - f_ms
        print(
            f"cp_bench N={world} {a.mask} S={a.seqlen} Hq={hq} Hkv={hkv} D={d} {a.scheme} {plan.strategy} "
            f"steps={plan.ring_steps} plan_ms(rank0)={plan_ms:.1f} | fwd {f_ms:.2f} ms "
            f"({per_gpu(fwd_flop, f_ms):.1f} TFLOP/s/GPU) | bwd {bwd_ms:.2f} ms "
            f"({per_gpu(2.5 * fwd_flop, bwd_ms):.1f} TFLOP/s/GPU) | compute-only fwd {cf_ms:.2f} ms, "
            f"fwd+bwd {cfb_ms:.2f} ms (exposed comm fwd {f_ms - cf_ms:.2f} ms, fwd+bwd {fb_ms - cfb_ms:.2f} ms)",
            flush=True,
        )
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
