"""Worker processes for the context-parallel tests: a persistent process group (gloo on CPU, or NCCL on one GPU)
that runs named cases, each checked on every rank against single-process flex attention on the gathered tensors."""

from __future__ import annotations

import datetime
import math
import os
import socket
import traceback

import torch

# ---------------------------------------------------------------------------------------------
# Pool (parent side)
# ---------------------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Pool:
    """``world`` spawned ranks joined in one process group; :meth:`run` sends a case to all of them.

    A case that fails on any rank leaves the group in an unknown state (peers may sit in a
    collective until the timeout), so the pool marks itself broken and the caller starts a new one.
    """

    def __init__(self, world: int, backend: str = "gloo", device: str = "cpu", timeout_s: int = 60):
        import torch.multiprocessing as mp

        ctx = mp.get_context("spawn")
        self.world, self.broken = world, False
        self.tasks = [ctx.Queue() for _ in range(world)]
        self.results = ctx.Queue()
        port = _free_port()
        self.procs = [
            ctx.Process(target=worker_main, args=(r, world, port, backend, device, timeout_s, self.tasks[r],
                                                  self.results), daemon=True)
            for r in range(world)
        ]
        for p in self.procs:
            p.start()

    def run(self, case: str, world: int, timeout: float = 120.0, **kwargs):
        """Runs ``case(**kwargs)`` on the first ``world`` ranks (a subgroup when smaller than the pool);
        returns their results; AssertionError on a failure."""
        kwargs["world"] = world
        import queue

        for q in self.tasks:
            q.put((case, kwargs))
        got = {}
        try:
            for _ in range(self.world):
                rank, ok, value = self.results.get(timeout=timeout)
                got[rank] = (ok, value)
        except queue.Empty:
            self.broken = True
            raise AssertionError(f"case {case}{kwargs}: ranks {sorted(set(range(self.world)) - set(got))} "
                                 f"did not answer within {timeout} s") from None
        failed = {r: v for r, (ok, v) in got.items() if not ok}
        if failed:
            self.broken = True
            first = min(failed)
            raise AssertionError(f"case {case}{kwargs} failed on ranks {sorted(failed)}; rank {first}:\n{failed[first]}")
        return [got[r][1] for r in range(world)]

    def close(self):
        for q in self.tasks:
            try:
                q.put(None)
            except Exception:
                pass
        import time

        deadline = time.monotonic() + (2.0 if not self.broken else 0.2)  # one shared grace period
        for p in self.procs:
            p.join(timeout=max(0.0, deadline - time.monotonic()))
        for p in self.procs:
            if p.is_alive():
                p.terminate()
                p.join(timeout=5)


# ---------------------------------------------------------------------------------------------
# Worker (child side)
# ---------------------------------------------------------------------------------------------


def worker_main(rank, world, port, backend, device, timeout_s, tasks, results):
    import torch.distributed as dist

    import warnings

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)
    # Every torch.empty (kernel outputs, receive buffers, workspaces) starts as NaN / 0xFF, as in
    # conftest.uninitialized_memory_poisoned: a value never written cannot pass for a result.
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.utils.deterministic.fill_uninitialized_memory = True
    warnings.filterwarnings("ignore", message=".*(deterministic|CuBLAS|CUBLAS).*")
    if device == "cuda":
        # One GPU per rank when there are enough; otherwise ranks share GPUs (correctness only,
        # and only where NCCL accepts several ranks on one device).
        torch.cuda.set_device(rank % torch.cuda.device_count())
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=timeout_s))
    # Smaller worlds run on the subgroup of the first ranks (new_group is collective: all ranks
    # create every subgroup once); ranks outside a case's subgroup answer None at once.
    groups = {w: dist.new_group(list(range(w))) for w in range(1, world)}
    groups[world] = None
    try:
        while True:
            item = tasks.get()
            if item is None:
                break
            name, kwargs = item
            try:
                sub = kwargs.pop("world", world)
                if rank >= sub:
                    results.put((rank, True, None))
                    continue
                value = CASES[name](rank=rank, world=sub, device=device, group=groups[sub], **kwargs)
                results.put((rank, True, value))
            except BaseException:
                results.put((rank, False, traceback.format_exc()))
    finally:
        try:
            dist.destroy_process_group()
        except Exception:
            pass


# ---------------------------------------------------------------------------------------------
# Problems and checks
# ---------------------------------------------------------------------------------------------

TOL = {torch.float64: 1e-12, torch.float32: 2e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}


def assert_close(actual, expected, dtype, what, factor=4.0):
    """|a - e| <= factor * tol(dtype) * (1 + max|e|), identical infinities."""
    a, e = actual.detach().double().cpu(), expected.detach().double().cpu()
    assert a.shape == e.shape, f"{what}: shape {tuple(a.shape)} != {tuple(e.shape)}"
    inf = torch.isinf(e)
    assert torch.equal(torch.isinf(a), inf) and torch.equal(a[inf], e[inf]), f"{what}: infinities differ"
    assert not torch.isnan(a).any(), f"{what}: NaN"
    if (~inf).any():
        tol = factor * TOL[dtype] * (1.0 + e[~inf].abs().max().item())
        err = (a[~inf] - e[~inf]).abs().max().item()
        assert err <= tol, f"{what}: max abs error {err:.3g} > {tol:.3g}"


def _mask(kind, cu, hm, nfunc, gen, seqlen=None):
    """Global endpoints int32 [hm, nfunc, T] for samples with cumulative lengths cu."""
    import flashspan.masks as fm

    if kind.startswith("bench:"):
        # The benchmark masks are BSHD single-sample builders: one per sample, concatenated.
        name = kind[6:]
        rows = [fm.benchmark_mask(name, b - a) for a, b in zip(cu, cu[1:]) if b > a]
        return torch.cat(rows, dim=2).expand(hm, -1, -1).contiguous()
    rows = []
    for a, b in zip(cu, cu[1:]):
        n = b - a
        if kind == "causal":
            f = (torch.arange(n) + 1).view(1, n).expand(nfunc, n)
        elif kind == "document":
            # documents of random lengths inside the sample, causal inside each document
            doc = torch.zeros(n, dtype=torch.int64)
            pos = 0
            while pos < n:
                ln = int(torch.randint(1, max(2, n // 3 + 1), (1,), generator=gen))
                doc[pos:pos + ln] = pos
                pos += ln
            f = torch.stack([torch.zeros(n, dtype=torch.int64), doc, torch.arange(n) + 1])
            f = torch.cat([f, (torch.arange(n) + 1).view(1, n).expand(nfunc - 3, n)]) if nfunc > 3 else f
        elif kind == "random":
            f = torch.randint(0, n + 1, (nfunc, n), generator=gen).sort(dim=0).values
            empty = torch.rand(n, generator=gen) < 0.1  # some rows see nothing
            f[:, empty] = n
            f[0, empty] = 0
        else:
            raise ValueError(kind)
        rows.append(f.unsqueeze(0).expand(hm, -1, -1))
    return torch.cat(rows, dim=2).to(torch.int32).contiguous()


def _problem(seed, *, lengths=None, batch=1, seqlen=64, hq=4, hkv=2, hm=1, nfunc=3, dqk=16, dv=16,
             dtype=torch.float32, mask="random"):
    """Global q/k/v/dout/dlse and endpoints, the same on every rank (seeded)."""
    gen = torch.Generator().manual_seed(seed)
    if lengths is not None:
        cu = [0]
        for n in lengths:
            cu.append(cu[-1] + n)
        lead = (cu[-1],)
    else:
        cu = [b * seqlen for b in range(batch + 1)]
        lead = (batch, seqlen)
    if mask == "document" or mask.startswith("bench:"):
        nfunc = {"document": 3}.get(mask, None) or _bench_nfunc(mask)
    mf = _mask(mask, cu, hm, nfunc, gen)
    q = torch.randn(lead + (hq, dqk), generator=gen).to(dtype)
    k = torch.randn(lead + (hkv, dqk), generator=gen).to(dtype)
    v = torch.randn(lead + (hkv, dv), generator=gen).to(dtype)
    dout = torch.randn(lead + (hq, dv), generator=gen).to(dtype)
    lse_shape = (hq, cu[-1]) if lengths is not None else (batch, hq, seqlen)
    dlse = torch.randn(lse_shape, generator=gen)
    return dict(q=q, k=k, v=v, dout=dout, dlse=dlse, mask_func=mf, cu=cu)


def _bench_nfunc(mask):
    import flashspan.masks as fm

    return fm.BENCHMARK_NFUNC[mask[6:]]


def _reference(p, varlen, scale, backward=True, use_dlse=True):
    """Single-process flashspan flex attention on the global tensors: out, lse and (backward) dq, dk, dv."""
    import flashspan

    q, k, v = (p[n].clone().requires_grad_(backward) for n in ("q", "k", "v"))
    kw = {}
    if varlen:
        cu = torch.tensor(p["cu"], dtype=torch.int32, device=p["q"].device)
        ml = max(1, max(b - a for a, b in zip(p["cu"], p["cu"][1:])))
        kw = dict(cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=ml, max_seqlen_k=ml)
    plan = flashspan.create_mask_plan(p["mask_func"], q, k, v, build_backward=backward, **kw)
    out, lse = flashspan.flex_attn_func(q, k, v, mask_plan=plan, softmax_scale=scale, return_lse=True)
    res = dict(out=out.detach(), lse=lse.detach())
    if backward:
        finite = torch.isfinite(lse)
        loss = (out.float() * p["dout"].float()).sum()
        if use_dlse:
            loss = loss + (torch.where(finite, lse, 0.0) * p["dlse"]).sum()
        loss.backward()
        res.update(dq=q.grad, dk=k.grad, dv=v.grad)
    return res


def _sharding(p, world, scheme, varlen):
    from flashspan.distributed import SequenceSharding

    if varlen:
        return SequenceSharding(world, cu_seqlens=p["cu"], scheme=scheme)
    return SequenceSharding(world, seqlen=p["q"].shape[1], batch=p["q"].shape[0], scheme=scheme)


def case_flex(rank, world, device, group=None, *, seed=0, varlen=False, scheme="zigzag", strategy="ring", backward=True,
              use_dlse=True, dtype="float32", scale=None, deterministic=False, plan_kw=None, **problem):
    """CP forward (+ backward) of one problem vs single-process attention; returns per-rank statistics."""
    import flashspan.distributed as fd

    dt = getattr(torch, dtype)
    if device == "cuda" and dt == torch.float32:
        dt = torch.bfloat16  # the CUDA kernels take FP16/BF16; fp32 runs on the CPU backend only
    p = _problem(seed, dtype=dt, **problem)
    p = {n: (x.to(device) if isinstance(x, torch.Tensor) else x) for n, x in p.items()}
    ref = _reference(p, varlen, scale, backward, use_dlse)
    sh = _sharding(p, world, scheme, varlen)
    lse_dim = 1 if varlen else 2
    local = {n: sh.shard(p[n], rank) for n in ("q", "k", "v", "dout")}
    for n in ("q", "k", "v"):
        local[n].requires_grad_(backward)
    plan = fd.create_mask_plan(p["mask_func"], local["q"], local["k"], local["v"], sh, group=group,
                               strategy=strategy, build_backward=backward, **(plan_kw or {}))
    out, lse = fd.flex_attn_func(local["q"], local["k"], local["v"], plan, softmax_scale=scale,
                                 deterministic=deterministic, return_lse=True)
    assert_close(out, sh.shard(ref["out"], rank), dt, "out")
    assert_close(lse, sh.shard(ref["lse"], rank, dim=lse_dim), torch.float32 if dt == torch.float32 else dt, "lse")
    made = [x for x in (plan.pair_plans or [plan.global_plan]) if x is not None]
    if plan_kw and plan_kw.get("pack_gqa"):
        assert all(x.pack_gqa for x in made), "pack_gqa=True did not reach the per-rank plans"
    stats = dict(strategy=plan.strategy, pair_visible=plan.pair_visible, ring_steps=plan.ring_steps,
                 skipped=sum(x is None for x in plan.pair_plans) if plan.pair_plans else 0)
    if backward:
        finite = torch.isfinite(lse)
        loss = (out.float() * local["dout"].float()).sum()
        if use_dlse:
            loss = loss + (torch.where(finite, lse, 0.0) * sh.shard(p["dlse"], rank, dim=lse_dim)).sum()
        loss.backward()
        # Gradients of bf16/fp16 sum W rounded partials: allow a little more than the forward.
        f = 4.0 if dt == torch.float32 else 8.0
        assert_close(local["q"].grad, sh.shard(ref["dq"], rank), dt, "dq", f)
        assert_close(local["k"].grad, sh.shard(ref["dk"], rank), dt, "dk", f)
        assert_close(local["v"].grad, sh.shard(ref["dv"], rank), dt, "dv", f)
        stats["grads"] = [local[n].grad.detach().cpu().clone() for n in ("q", "k", "v")]
    # Empty rows stay exactly empty.
    dead = torch.isneginf(sh.shard(ref["lse"], rank, dim=lse_dim))
    rows_out = out.transpose(0, 1) if varlen else out.transpose(1, 2)  # [H, T, D] / [B, H, S, D]
    assert torch.all(rows_out[dead] == 0), "rows that see no key must have out == 0 exactly"
    return stats


def case_deterministic(rank, world, device, group=None, **kw):
    """Two identical backward runs give bitwise identical gradients."""
    a = case_flex(rank, world, device, group, deterministic=True, **kw)["grads"]
    b = case_flex(rank, world, device, group, deterministic=True, **kw)["grads"]
    for x, y, n in zip(a, b, ("dq", "dk", "dv")):
        assert torch.equal(x, y), f"{n} differs between two deterministic runs"
    return True


def case_gather(rank, world, device, group=None, *, varlen=False, scheme="zigzag"):
    """SequenceSharding.gather (all_gather of uneven shards) rebuilds the global tensor."""
    p = _problem(3, lengths=[5, 0, 17, 1, 30] if varlen else None, seqlen=8 * world, batch=2)
    sh = _sharding(p, world, scheme, varlen)
    x = sh.shard(p["q"], rank).to(device)
    full = sh.gather(x, group)
    assert torch.equal(full.cpu(), p["q"]), "gather != global tensor"
    lse_dim = 1 if varlen else 2
    assert torch.equal(sh.gather(sh.shard(p["dlse"], rank, dim=lse_dim).to(device), group, dim=lse_dim).cpu(), p["dlse"])
    return True


def case_errors(rank, world, device, group=None):
    """Bad input raises a clear error naming the argument (no collective is entered)."""
    import flashspan.distributed as fd

    p = _problem(1, seqlen=8 * world)
    sh = _sharding(p, world, "zigzag", False)
    q, k, v = (sh.shard(p[n], rank) for n in ("q", "k", "v"))
    msgs = []
    for call, exc in (
        (lambda: fd.create_mask_plan(p["mask_func"], q[:, :1], k, v, sh, group), ValueError),
        (lambda: fd.create_mask_plan(p["mask_func"].long(), q, k, v, sh, group), TypeError),
        (lambda: fd.create_mask_plan(p["mask_func"], q, k, v, _sharding(p, 1, "zigzag", False), group), ValueError),
        (lambda: fd.create_mask_plan(p["mask_func"], q, k, v, sh, group, strategy="tree"), ValueError),
        (lambda: fd.create_mask_plan(p["mask_func"][:, :, :-1], q, k, v, sh, group), ValueError),
        (lambda: fd.create_mask_plan(p["mask_func"] + 8 * world, q, k, v, sh, group), ValueError),
        (lambda: fd.create_mask_plan(p["mask_func"].flip(1).contiguous(), q, k, v, sh, group), ValueError),
        (lambda: fd.create_mask_plan(p["mask_func"][:, :2].contiguous(), q, k, v, sh, group), ValueError),
    ):
        try:
            call()
        except exc as e:
            msgs.append(str(e))
        else:
            raise AssertionError(f"expected {exc.__name__}")
    plan = fd.create_mask_plan(p["mask_func"], q, k, v, sh, group, build_backward=False)
    for call, exc in (
        (lambda: fd.flex_attn_func(q.double(), k, v, plan), TypeError),
        (lambda: fd.flex_attn_func(q[:, 1:], k, v, plan), ValueError),
        (lambda: fd.flex_attn_func(q.requires_grad_(), k, v, plan), ValueError),
        (lambda: fd.flex_attn_func(q, k, v, "plan"), TypeError),
    ):
        try:
            call()
        except exc as e:
            msgs.append(str(e))
        else:
            raise AssertionError(f"expected {exc.__name__}")
    return msgs


CASES = {
    "flex": case_flex,
    "deterministic": case_deterministic,
    "gather": case_gather,
    "errors": case_errors,
}
