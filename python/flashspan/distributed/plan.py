"""ContextParallelPlan: one rank's mask plans for context-parallel flex attention, built once from global endpoints."""

from __future__ import annotations

from typing import Optional

import torch

from .._checks import check_flag
from ..plan import MaskPlan
from ..plan import create_mask_plan as _plan_one
from .sharding import SequenceSharding, visible_count

STRATEGIES = ("auto", "ring", "allgather")


def choose_strategy(world_size: int, num_heads_q: int, num_heads_kv: int, head_dim_qk: int, head_dim_v: int) -> str:
    """The ``strategy="auto"`` rule: ``"allgather"`` when the gathered K/V fit in the rank's own Q + O, else ``"ring"``.

    Both strategies move the same bytes per rank (the ``(W-1)/W`` of K/V a rank does not own).
    The ring keeps one foreign K/V shard in memory and hides each transfer under the attention
    of the shard in hand; the all-gather holds all of K/V, exposes the transfer (it runs before
    the attention), and in exchange runs one kernel over all keys with one plan (no per-step
    launches, no LSE merges, block skipping over the whole mask). The gathered K/V per token
    are ``W * Hkv * (Dqk + Dv)`` elements against ``Hq * (Dqk + Dv)`` for the local Q and O, so
    the rule ``W * Hkv * (Dqk + Dv) <= Hq * (Dqk + Dv)`` picks the all-gather for GQA/MQA groups
    at least as large as the world size, where K/V are small: the memory stays within what
    the rank already holds and the exposed transfer is at most the time of moving its own Q + O.
    """
    kv = world_size * num_heads_kv * (head_dim_qk + head_dim_v)
    qo = num_heads_q * (head_dim_qk + head_dim_v)
    return "allgather" if world_size > 1 and kv <= qo else "ring"


def _sample(shape, like: torch.Tensor) -> torch.Tensor:
    """A tensor of ``shape`` with the dtype/device of ``like`` and a contiguous last dimension
    that allocates one row (the planner reads only shape, dtype and device)."""
    row = torch.empty(shape[-1], dtype=like.dtype, device=like.device)
    return row.expand(*shape)


class ContextParallelPlan:
    """One rank's share of a context-parallel flex attention: the sharding, the group and its mask plans.

    Built by :func:`create_mask_plan` (``flashspan.distributed``) once per mask and geometry,
    reused for every call and every training step. Holds, for ``strategy="ring"``, one
    :class:`flashspan.MaskPlan` per key rank ``j`` (``pair_plans[j]``, ``None`` when this
    rank's queries see none of rank ``j``'s keys: that step costs no compute), built from the
    global endpoints shifted into rank ``j``'s key coordinates; for ``strategy="allgather"``,
    one plan of the local queries against all keys in global order.

    Attributes: ``sharding`` (:class:`SequenceSharding`), ``group``, ``rank``, ``world_size``,
    ``strategy`` (``"ring"`` or ``"allgather"``), ``pair_visible`` (visible pairs per key rank),
    ``ring_steps`` (ring only: 1 + the largest ring distance ``(i - j) % W`` of any rank pair
    with a visible pair; K/V make ``ring_steps - 1`` hops),
    ``has_backward``, ``layout`` (``"bshd"`` / ``"thd"``), ``local_shape_q`` etc.
    """

    def __init__(self, *args, **kwargs):
        raise TypeError("ContextParallelPlan is built by flashspan.distributed.create_mask_plan(...)")

    @classmethod
    def _build(cls, **fields) -> "ContextParallelPlan":
        self = object.__new__(cls)
        self.__dict__.update(fields)
        return self

    @property
    def layout(self) -> str:
        return "thd" if self.sharding.varlen else "bshd"

    def kv_shape(self, rank: int, head_dim: int) -> tuple[int, ...]:
        """Local K (``head_dim = Dqk``) or V (``Dv``) shape of ``rank``."""
        if self.sharding.varlen:
            return (self.sharding.local_tokens(rank), self.num_heads_kv, head_dim)
        return (self.sharding.batch, self.sharding.local_seqlen(), self.num_heads_kv, head_dim)

    def check_compatible(self, q, k, v, need_backward: bool, where: str) -> None:
        """Host-only check of the local q/k/v against the plan (shape, dtype, device, backward)."""
        for name, t, want in (("q", q, self.q_shape), ("k", k, self.k_shape), ("v", v, self.v_shape)):
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"{where}: {name} must be a torch.Tensor, got {type(t).__name__}")
            if tuple(t.shape) != want:
                raise ValueError(
                    f"{where}: {name} has shape {tuple(t.shape)} but rank {self.rank}'s shard is {want} "
                    f"({self.layout.upper()}, {self.sharding})"
                )
            if t.dtype != self.dtype:
                raise TypeError(f"{where}: {name} has dtype {t.dtype} but the plan was built for {self.dtype}")
            if t.device != self.device:
                raise TypeError(f"{where}: {name} is on {t.device} but the plan was built for {self.device}")
        if need_backward and not self.has_backward:
            raise ValueError(
                f"{where}: the context-parallel plan was built without backward metadata but this call requires "
                "gradients; build it with build_backward=True"
            )

    def __repr__(self) -> str:
        skipped = sum(p is None for p in self.pair_plans) if self.strategy == "ring" else 0
        return (
            f"ContextParallelPlan(rank={self.rank}/{self.world_size}, {self.strategy}, {self.sharding}, "
            f"Hq={self.num_heads_q}, Hkv={self.num_heads_kv}, visible per key rank={self.pair_visible}, "
            f"skipped pairs={skipped}, ring steps={self.ring_steps}, backward={'yes' if self.has_backward else 'no'})"
        )


def _check_endpoints(rows: torch.Tensor, sharding: SequenceSharding, rank: int, where: str) -> None:
    """The rules of global endpoints, on this rank's rows: nfunc odd, each in [0, L_b], nondecreasing.

    Checked here because shifting into shard coordinates would clamp a bad endpoint silently.
    """
    nfunc = rows.shape[1]
    if nfunc % 2 == 0:
        raise ValueError(f"{where}: mask_func: nfunc = {nfunc} endpoints per row must be odd")
    if rows.shape[2] == 0:
        return
    lengths = torch.tensor(sharding.lengths, dtype=torch.int64, device=rows.device)
    limit = lengths[sharding.row_samples(rank).to(rows.device)]  # [T_r]: the key length of each row's sample
    r64 = rows.to(torch.int64)
    bad = (r64 < 0) | (r64 > limit)
    if nfunc > 1:
        bad[:, 1:] |= r64[:, 1:] < r64[:, :-1]
    if bool(bad.any()):
        h, f, t = (int(x) for x in bad.nonzero()[0])
        g = int(sharding.token_index(rank)[t])
        raise ValueError(
            f"{where}: mask_func: row {g} (mask head {h}) breaks the endpoint rules at F{f} = {int(rows[h, f, t])}: "
            f"endpoints must be nondecreasing and within [0, {int(limit[t])}] (the length of its sample)"
        )


def create_mask_plan(
    mask_func: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    sharding: SequenceSharding,
    group=None,
    strategy: str = "auto",
    build_backward: Optional[bool] = None,
    pack_gqa: Optional[bool] = None,
    arch: Optional[int] = None,
) -> ContextParallelPlan:
    """Builds this rank's plans for context-parallel flex attention (call on every rank of ``group``).

    Args:
        mask_func: the GLOBAL endpoints, int32 ``[Hmask, nfunc, B*S]`` (BSHD) or ``[Hmask, nfunc, T]``
            (THD), sample-local key coordinates as for :func:`flashspan.create_mask_plan`; the
            same tensor on every rank (only this rank's rows are read). Any device; the plans
            live on the device of ``q``.
        q, k, v: this rank's shards (``sharding.shard(x, rank)``): BSHD ``[B, S/W, Hq, Dqk]``,
            ``[B, S/W, Hkv, Dqk]``, ``[B, S/W, Hkv, Dv]``; THD ``[T_r, H, D]``. Only shape,
            dtype and device are read.
        sharding: the :class:`SequenceSharding` of the group (``world_size`` = group size).
        group: the ``torch.distributed`` process group (default: the world).
        strategy: ``"ring"``, ``"allgather"`` or ``"auto"`` (:func:`choose_strategy`).
        build_backward: as for :func:`flashspan.create_mask_plan` (None: autograd on and an
            input requires grad).
        pack_gqa, arch: passed to every :func:`flashspan.create_mask_plan` this rank makes.

    No communication happens here: every rank derives every shard geometry from ``sharding``.
    Errors: ValueError / TypeError naming the argument and the rule broken.

    Example::

        sh = SequenceSharding(dist.get_world_size(), seqlen=S, batch=1)
        r = dist.get_rank()
        q, k, v = (sh.shard(x, r) for x in (q_full, k_full, v_full))
        plan = flashspan.distributed.create_mask_plan(flashspan.masks.causal(S), q, k, v, sh)
        out = flashspan.distributed.flex_attn_func(q, k, v, plan)
    """
    import torch.distributed as dist

    where = "flashspan.distributed.create_mask_plan"
    if not isinstance(sharding, SequenceSharding):
        raise TypeError(f"{where}: sharding must be a flashspan.distributed.SequenceSharding, got {type(sharding).__name__}")
    for name, t in (("mask_func", mask_func), ("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{where}: {name} must be a torch.Tensor, got {type(t).__name__}")
    if mask_func.dtype != torch.int32:
        raise TypeError(f"{where}: mask_func must be int32, got {mask_func.dtype}")
    if strategy not in STRATEGIES:
        raise ValueError(f"{where}: strategy must be one of {', '.join(STRATEGIES)}, got {strategy!r}")
    build_backward = check_flag("build_backward", build_backward, where, none_ok=True)
    pack_gqa = check_flag("pack_gqa", pack_gqa, where, none_ok=True)
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError(f"{where}: torch.distributed is not initialised (call init_process_group first)")
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    if world != sharding.world_size:
        raise ValueError(f"{where}: sharding is for world_size={sharding.world_size} but the group has {world} ranks")
    varlen = sharding.varlen
    want_dim = 3 if varlen else 4
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dim() != want_dim:
            raise ValueError(
                f"{where}: {name} must be {'THD [T_r, H, D]' if varlen else 'BSHD [B, S/W, H, D]'} "
                f"for this sharding, got shape {tuple(t.shape)}"
            )
    hq, dqk = q.shape[-2], q.shape[-1]
    hkv, dv = k.shape[-2], v.shape[-1]
    if k.shape[-1] != dqk:
        raise ValueError(f"{where}: k's head dim {k.shape[-1]} differs from q's {dqk}")
    if v.shape[-2] != hkv:
        raise ValueError(f"{where}: v has {v.shape[-2]} heads but k has {hkv}")
    if hkv < 1 or hq % hkv:
        raise ValueError(f"{where}: Hq={hq} must be a multiple of Hkv={hkv}")
    if varlen:
        local = (sharding.local_tokens(rank),)
    else:
        local = (sharding.batch, sharding.local_seqlen())
    q_shape, k_shape, v_shape = local + (hq, dqk), local + (hkv, dqk), local + (hkv, dv)
    for name, t, want in (("q", q, q_shape), ("k", k, k_shape), ("v", v, v_shape)):
        if tuple(t.shape) != want:
            raise ValueError(f"{where}: {name} has shape {tuple(t.shape)} but rank {rank}'s shard is {want} ({sharding})")
    if k.dtype != q.dtype or v.dtype != q.dtype:
        raise TypeError(f"{where}: q, k, v must share one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if mask_func.shape[0] not in (1, hq):
        raise ValueError(f"{where}: mask_func has {mask_func.shape[0]} mask heads; expected 1 or Hq={hq}")
    if build_backward is None:
        build_backward = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))
    if strategy == "auto":
        strategy = choose_strategy(world, hq, hkv, dqk, dv)

    mask_func = mask_func.to(q.device)  # the work matrix below reads every rank's rows
    rows = sharding.shard_rows(mask_func, rank)
    _check_endpoints(rows, sharding, rank, where)
    lq = sharding.local_cu_seqlens(rank)
    fields = dict(
        sharding=sharding, group=group, rank=rank, world_size=world, strategy=strategy,
        has_backward=bool(build_backward), dtype=q.dtype, device=q.device,
        num_heads_q=hq, num_heads_kv=hkv, head_dim_qk=dqk, head_dim_v=dv,
        q_shape=q_shape, k_shape=k_shape, v_shape=v_shape,
    )

    extra = {}
    if pack_gqa is not None:
        extra["pack_gqa"] = pack_gqa
    if arch is not None:
        extra["arch"] = arch

    def thd_kwargs(cu_q, cu_k) -> dict:
        if not varlen:
            return dict(extra)
        lens = lambda cu: max(1, max(b - a for a, b in zip(cu, cu[1:])))  # noqa: E731
        return dict(
            extra,
            cu_seqlens_q=torch.tensor(cu_q, dtype=torch.int32, device=q.device),
            cu_seqlens_k=torch.tensor(cu_k, dtype=torch.int32, device=q.device),
            max_seqlen_q=lens(cu_q), max_seqlen_k=lens(cu_k),
        )

    q_sample = _sample(q_shape, q)
    if strategy == "ring":
        # Every rank derives the whole work matrix from the same global endpoints (no collective),
        # so all agree on how far K/V must travel: with no visible pair beyond ring distance d,
        # the ring stops after d hops (e.g. document masks on contiguous shards: one hop).
        work = sharding.work_matrix(mask_func)
        far = [(i - j) % world for i in range(world) for j in range(world) if work[i][j]]
        plans: list[Optional[MaskPlan]] = []
        visible = work[rank]
        for j in range(world):
            if visible[j] == 0 or q_shape[0] == 0:
                plans.append(None)  # mask-aware skipping: no visible pair, no plan, no kernel
                continue
            local_k = (sharding.local_tokens(j),) if varlen else local
            plans.append(
                _plan_one(
                    sharding.shift_endpoints(rows, rank, j), q_sample, _sample(local_k + (hkv, dqk), q), _sample(local_k + (hkv, dv), q),
                    build_backward=bool(build_backward), **thd_kwargs(lq, sharding.local_cu_seqlens(j)),
                )
            )
        fields.update(pair_plans=plans, pair_visible=visible, global_plan=None, ring_steps=1 + max(far, default=0))
    else:
        visible = [visible_count(sharding.shift_endpoints(rows, rank, j)) for j in range(world)]
        full = (sharding.total_tokens,) if varlen else (sharding.batch, sharding.seqlen)
        plan = None
        if sum(visible) and q_shape[0]:
            plan = _plan_one(
                rows.contiguous(), q_sample, _sample(full + (hkv, dqk), q), _sample(full + (hkv, dv), q),
                build_backward=bool(build_backward), **thd_kwargs(lq, sharding.cu_seqlens),
            )
        fields.update(pair_plans=None, pair_visible=visible, global_plan=plan, ring_steps=None)
        # Where every global token sits in the padded [W, width] all-gather buffer.
        width = max(sharding.local_tokens(r) for r in range(world)) if varlen else sharding.local_seqlen()
        offsets = torch.cat([
            torch.arange(sharding.local_tokens(r) if varlen else width, dtype=torch.int64) + r * width
            for r in range(world)
        ])
        fields.update(gather_width=width, gather_index=offsets[sharding.gather_order()].to(q.device))
    return ContextParallelPlan._build(**fields)
