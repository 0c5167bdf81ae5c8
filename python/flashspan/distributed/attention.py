"""Context-parallel flex attention: ring (K/V shards pass around the ranks) and all-gather, forward and backward, merged by LSE."""

from __future__ import annotations

from typing import Optional, Union

import torch
import torch.distributed as dist

from .._checks import check_flag
from ..execution import run_backward, run_forward, stats_dtype_of
from .plan import ContextParallelPlan

# ---------------------------------------------------------------------------------------------
# LSE merge
# ---------------------------------------------------------------------------------------------


def _lse_rows(lse: torch.Tensor, varlen: bool) -> torch.Tensor:
    """LSE ``[B, H, S]`` / ``[H, T]`` as a view broadcastable against out ``[B, S, H, 1]`` / ``[T, H, 1]``."""
    return (lse.transpose(0, 1) if varlen else lse.transpose(1, 2)).unsqueeze(-1)


def merge_partial(
    out: torch.Tensor, lse: torch.Tensor, part_out: torch.Tensor, part_lse: torch.Tensor, varlen: bool
) -> None:
    """In place: ``(out, lse) <- merge((out, lse), (part_out, part_lse))`` over disjoint key sets.

    ``out`` and ``lse`` (natural log), fp32 (fp64 for fp64 inputs), are the running result; the merged LSE is
    ``log(e^lse + e^part_lse)`` and each output is weighted by ``e^(lse_x - lse_new)``. A row
    that has seen no key in either part keeps ``out = 0`` and ``lse = -inf`` exactly (its
    weights are set to 0 rather than computed as ``e^(-inf + inf)``).
    """
    new = torch.logaddexp(lse, part_lse)
    dead = torch.isneginf(new)
    w_old = torch.where(dead, 0.0, torch.exp(lse - new))
    w_new = torch.where(dead, 0.0, torch.exp(part_lse - new))
    out.mul_(_lse_rows(w_old, varlen)).add_(part_out.to(out.dtype) * _lse_rows(w_new, varlen))
    lse.copy_(new)


# ---------------------------------------------------------------------------------------------
# Point-to-point ring exchange
# ---------------------------------------------------------------------------------------------


class _Exchange:
    """One posted transfer: send ``tensors`` to group rank ``dst``, receive buffers of ``recv_shapes`` from ``src``
    (default: one hop along the ring, next / previous rank)."""

    def __init__(self, plan: ContextParallelPlan, tensors, recv_shapes, dst=None, src=None):
        g, w, r = plan.group, plan.world_size, plan.rank
        dst = _global_rank(g, (r + 1) % w if dst is None else dst)
        src = _global_rank(g, (r - 1) % w if src is None else src)
        self.recv = [torch.empty(s, dtype=t.dtype, device=t.device) for t, s in zip(tensors, recv_shapes)]
        self._send = [t.contiguous() for t in tensors]  # referenced until wait(): the sends read them
        ops = [dist.P2POp(dist.isend, t, dst, g) for t in self._send]
        ops += [dist.P2POp(dist.irecv, b, src, g) for b in self.recv]
        self._works = dist.batch_isend_irecv(ops)

    def wait(self):
        for work in self._works:
            work.wait()
        return self.recv


def _global_rank(group, group_rank: int) -> int:
    return group_rank if group is None else dist.get_global_rank(group, group_rank)


# ---------------------------------------------------------------------------------------------
# Ring
# ---------------------------------------------------------------------------------------------


def _ring_forward(q, k, v, plan: ContextParallelPlan, scale):
    varlen = plan.sharding.varlen
    w, r = plan.world_size, plan.rank
    out = torch.zeros((*q.shape[:-1], v.shape[-1]), dtype=stats_dtype_of(q), device=q.device)
    lse_shape = (q.shape[1], q.shape[0]) if varlen else (q.shape[0], q.shape[2], q.shape[1])
    lse = torch.full(lse_shape, float("-inf"), dtype=stats_dtype_of(q), device=q.device)
    kv = (k, v)
    steps = plan.ring_steps
    for step in range(steps):
        src = (r - step) % w
        hop = None
        if step < steps - 1:
            nxt_src = (r - step - 1) % w  # the shard the previous rank holds now
            hop = _Exchange(plan, kv, (plan.kv_shape(nxt_src, k.shape[-1]), plan.kv_shape(nxt_src, v.shape[-1])))
        pair = plan.pair_plans[src]
        if pair is not None:
            part_out, part_lse, _ = run_forward(q, kv[0], kv[1], pair, scale, False)
            merge_partial(out, lse, part_out, part_lse, varlen)
        if hop is not None:
            kv = tuple(hop.wait())
    return out.to(q.dtype), lse


def _ring_backward(q, k, v, out, dout, lse, dlse, plan: ContextParallelPlan, scale, deterministic):
    """dq for the local queries; dk/dv travel with their K/V and come home after the last step.

    At step s this rank holds K/V of ``src = (rank - s) % W`` and the fp32 (fp64 for fp64 inputs) dK/dV accumulated for
    ``src`` by the ranks before it; it adds its part and passes both on. After the last step
    (``n = plan.ring_steps``) it holds ``src = (rank - n + 1) % W`` and sends the accumulators
    straight to that owner (the next rank when ``n = W``). The order of additions is fixed by
    the ring, so with ``deterministic=True`` the result is bitwise reproducible.
    """
    w, r = plan.world_size, plan.rank
    steps = plan.ring_steps
    dq = torch.zeros(q.shape, dtype=stats_dtype_of(q), device=q.device)
    kv = (k, v)
    dkv = (torch.zeros(k.shape, dtype=stats_dtype_of(q), device=k.device),
           torch.zeros(v.shape, dtype=stats_dtype_of(q), device=v.device))
    dkv_hop = None
    for step in range(steps):
        src = (r - step) % w
        kv_hop = None
        if step < steps - 1:
            nxt_src = (r - step - 1) % w
            kv_hop = _Exchange(plan, kv, (plan.kv_shape(nxt_src, k.shape[-1]), plan.kv_shape(nxt_src, v.shape[-1])))
        pair = plan.pair_plans[src]
        parts = None
        if pair is not None:
            parts = run_backward(q, kv[0], kv[1], out, dout, lse, dlse, pair, scale, deterministic)
        if dkv_hop is not None:  # the accumulators for src, sent by the previous rank last step
            dkv = tuple(dkv_hop.wait())
        if parts is not None:
            dq.add_(parts[0])
            dkv[0].add_(parts[1])
            dkv[1].add_(parts[2])
        if step < steps - 1:
            nxt_src = (r - step - 1) % w
            dkv_hop = _Exchange(plan, dkv, (plan.kv_shape(nxt_src, k.shape[-1]), plan.kv_shape(nxt_src, v.shape[-1])))
        if kv_hop is not None:
            kv = tuple(kv_hop.wait())
    if steps > 1:  # home: to the owner of the shard in hand, from the rank holding ours
        owner, holder = (r - steps + 1) % w, (r + steps - 1) % w
        home = _Exchange(plan, dkv, (k.shape, v.shape), dst=owner, src=holder)
        dkv = tuple(home.wait())
    return dq.to(q.dtype), dkv[0].to(k.dtype), dkv[1].to(v.dtype)


# ---------------------------------------------------------------------------------------------
# All-gather
# ---------------------------------------------------------------------------------------------


def _token_first(x: torch.Tensor, varlen: bool) -> torch.Tensor:
    return x if varlen else x.transpose(0, 1)  # BSHD [B, S, ...] -> [S, B, ...]


def _gather_kv(x: torch.Tensor, plan: ContextParallelPlan) -> torch.Tensor:
    """This rank's K or V shard -> the global tensor in global token order (all-gather + reorder)."""
    varlen = plan.sharding.varlen
    xt = _token_first(x, varlen)
    width = plan.gather_width
    if xt.shape[0] < width:  # THD: pad to the largest shard
        xt = torch.cat([xt, xt.new_zeros((width - xt.shape[0], *xt.shape[1:]))])
    buf = xt.new_empty((plan.world_size * width, *xt.shape[1:]))
    dist.all_gather_into_tensor(buf, xt.contiguous(), group=plan.group)
    full = buf.index_select(0, plan.gather_index)
    return full if varlen else full.transpose(0, 1).contiguous()


def _reduce_scatter_kv(dx: torch.Tensor, like: torch.Tensor, plan: ContextParallelPlan) -> torch.Tensor:
    """Global fp32 / fp64 dK or dV (global token order) -> the sum over ranks of this rank's shard."""
    varlen = plan.sharding.varlen
    dt = _token_first(dx.to(stats_dtype_of(like)), varlen)
    width = plan.gather_width
    buf = dt.new_zeros((plan.world_size * width, *dt.shape[1:]))
    buf.index_copy_(0, plan.gather_index, dt)
    mine = dt.new_empty((width, *dt.shape[1:]))
    dist.reduce_scatter_tensor(mine, buf, group=plan.group)
    n = like.shape[0] if varlen else like.shape[1]
    mine = mine[:n]
    return (mine if varlen else mine.transpose(0, 1)).to(like.dtype)


def _allgather_forward(q, k, v, plan: ContextParallelPlan, scale):
    k_full, v_full = _gather_kv(k, plan), _gather_kv(v, plan)
    if plan.global_plan is None:  # no visible key for any local row (or no local row)
        return _empty_result(q, v, plan.sharding.varlen)
    out, lse, _ = run_forward(q, k_full, v_full, plan.global_plan, scale, False)
    return out, lse


def _allgather_backward(q, k, v, out, dout, lse, dlse, plan: ContextParallelPlan, scale, deterministic):
    k_full, v_full = _gather_kv(k, plan), _gather_kv(v, plan)  # gathered again: not kept from the forward
    if plan.global_plan is None:
        dq = torch.zeros_like(q)
        dk_full = torch.zeros(k_full.shape, dtype=stats_dtype_of(q), device=k.device)
        dv_full = torch.zeros(v_full.shape, dtype=stats_dtype_of(q), device=v.device)
    else:
        dq, dk_full, dv_full = run_backward(q, k_full, v_full, out, dout, lse, dlse, plan.global_plan, scale,
                                            deterministic)
    return dq, _reduce_scatter_kv(dk_full, k, plan), _reduce_scatter_kv(dv_full, v, plan)


def _empty_result(q, v, varlen):
    out = torch.zeros((*q.shape[:-1], v.shape[-1]), dtype=q.dtype, device=q.device)
    lse_shape = (q.shape[1], q.shape[0]) if varlen else (q.shape[0], q.shape[2], q.shape[1])
    return out, torch.full(lse_shape, float("-inf"), dtype=stats_dtype_of(q), device=q.device)


# ---------------------------------------------------------------------------------------------
# autograd + public entry point
# ---------------------------------------------------------------------------------------------


class ContextParallelFlexAttnFunc(torch.autograd.Function):
    """forward(q, k, v, plan, softmax_scale, deterministic) -> (out, lse); both differentiable.

    Saves the local q, k, v, out, lse; the backward runs the same strategy again (ring or
    all-gather) with the global LSE, so every (query shard, key shard) pair's gradient is
    exact without any second pass over the merge.
    """

    @staticmethod
    def forward(ctx, q, k, v, plan, softmax_scale, deterministic):
        if plan.strategy == "ring":
            out, lse = _ring_forward(q, k, v, plan, softmax_scale)
        else:
            out, lse = _allgather_forward(q, k, v, plan, softmax_scale)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.plan = plan
        ctx.softmax_scale = softmax_scale
        ctx.deterministic = deterministic
        ctx.set_materialize_grads(False)
        return out, lse

    @staticmethod
    def backward(ctx, dout, dlse):
        q, k, v, out, lse = ctx.saved_tensors
        plan = ctx.plan
        # Every rank must join the collectives, even one whose outputs got no gradient.
        if dout is None:
            dout = torch.zeros_like(out)
        if plan.strategy == "ring":
            dq, dk, dv = _ring_backward(q, k, v, out, dout, lse, dlse, plan, ctx.softmax_scale, ctx.deterministic)
        else:
            dq, dk, dv = _allgather_backward(q, k, v, out, dout, lse, dlse, plan, ctx.softmax_scale,
                                             ctx.deterministic)
        return dq, dk, dv, None, None, None


def flex_attn_func(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask_plan: ContextParallelPlan,
    softmax_scale: Optional[float] = None,
    deterministic: bool = False,
    return_lse: bool = False,
) -> Union[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
    """Context-parallel interval-masked attention over the ranks of ``mask_plan.group`` (a collective).

    Every rank calls it with its own shards; the result is this rank's rows of the
    single-process ``flashspan.flex_attn_func`` on the gathered tensors.

    Args:
        q, k, v: this rank's shards (``sharding.shard(x, rank)``): BSHD ``[B, S/W, Hq, Dqk]``,
            ``[B, S/W, Hkv, Dqk]``, ``[B, S/W, Hkv, Dv]`` or THD ``[T_r, Hq, Dqk]``, ...;
            the dtype and device the plan was built for.
        mask_plan: from :func:`flashspan.distributed.create_mask_plan` (with backward metadata
            when gradients are needed).
        softmax_scale: default ``1/sqrt(Dqk)``.
        deterministic: bitwise reproducible backward (fixed ring order + deterministic kernels).
        return_lse: also return the fp32 (fp64 for fp64 inputs) global LSE of the local rows (``[B, Hq, S/W]`` or
            ``[Hq, T_r]``, natural log, ``-inf`` for rows that see no key on any rank);
            differentiable.

    Returns ``out`` (``[..., Hq, Dv]``, dtype of q) or ``(out, lse)``. Gradients flow to the local
    q, k, v (dK/dV of this rank's keys, summed over every rank's queries).

    Errors: TypeError / ValueError naming the argument and the rule (shape of the shard, dtype,
    device, plan without backward); RuntimeError from the kernels or the collectives.

    Example::

        out = flashspan.distributed.flex_attn_func(q_local, k_local, v_local, cp_plan)
        out.backward(dout_local)
    """
    deterministic = check_flag("deterministic", deterministic, "flashspan.distributed.flex_attn_func")
    return_lse = check_flag("return_lse", return_lse, "flashspan.distributed.flex_attn_func")
    if not isinstance(mask_plan, ContextParallelPlan):
        raise TypeError(
            "flashspan.distributed.flex_attn_func: mask_plan must be a ContextParallelPlan "
            f"(flashspan.distributed.create_mask_plan), got {type(mask_plan).__name__}"
        )
    needs_grad = torch.is_grad_enabled() and any(isinstance(t, torch.Tensor) and t.requires_grad for t in (q, k, v))
    mask_plan.check_compatible(q, k, v, needs_grad, "flashspan.distributed.flex_attn_func")
    out, lse = ContextParallelFlexAttnFunc.apply(q, k, v, mask_plan, softmax_scale, deterministic)
    return (out, lse) if return_lse else out
