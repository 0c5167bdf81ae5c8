"""SequenceSharding: which tokens of every sample each context-parallel rank owns, and the endpoint shift into shard coordinates."""

from __future__ import annotations

import operator
from typing import Optional, Sequence, Union

import torch

SCHEMES = ("zigzag", "striped", "contiguous")


def _as_int(name: str, value) -> int:
    if isinstance(value, bool):
        raise TypeError(f"{name} must be an int, got bool")
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}") from None


class SequenceSharding:
    """How the tokens of every sample are split over the ``world_size`` ranks of a context-parallel group.

    Every rank owns the same positions of Q, K and V (self-attention: one sequence per
    sample). A rank's tokens of a sample keep their order, so the owned positions of
    a sample form an increasing list ``pos[r][b]``; the local tensors hold them sample
    after sample (BSHD ``[B, S/W, ...]``, THD ``[T_r, ...]`` with local ``cu_seqlens``).

    Schemes (``L`` = length of a sample, ``W`` = world size):

    * ``"zigzag"`` (default, load-balanced for causal-like masks): the sample is cut into
      ``2W`` chunks; rank ``r`` owns chunks ``r`` and ``2W-1-r``, so every rank holds one
      early and one late piece and the causal work ``sum(i+1)`` is the same on every rank.
    * ``"striped"``: position ``p`` goes to rank ``p % W`` (also balanced for causal; each
      (query shard, key shard) pair is itself a causal-shaped mask).
    * ``"contiguous"``: rank ``r`` owns ``[r L / W, (r+1) L / W)`` (unbalanced for causal
      masks: the last rank does ``2W-1`` times the work of the first).

    Lengths that do not divide evenly are split as evenly as possible (chunk sizes differ by
    at most one; a rank may own no token of a short sample, or no token at all). BSHD needs
    every rank to hold the same count: ``seqlen % (2W) == 0`` for zigzag, ``seqlen % W == 0``
    otherwise (ValueError names the rule).

    Args:
        world_size: ranks of the context-parallel group (>= 1).
        seqlen, batch: BSHD geometry (``[B, S, H, D]`` global tensors), or
        cu_seqlens: THD cumulative sample lengths (ints or an integer tensor, ``[B+1]``,
            starting at 0, nondecreasing; empty samples allowed).
        scheme: one of ``"zigzag"``, ``"striped"``, ``"contiguous"``.

    Example::

        sh = SequenceSharding(4, seqlen=4096, batch=1)            # zigzag over 4 ranks
        q_local = sh.shard(q, rank)                                # [1, 1024, H, D]
        sh = SequenceSharding(2, cu_seqlens=[0, 300, 301, 1000])   # THD
        q_local = sh.shard(q_thd, rank)                            # [sh.local_tokens(rank), H, D]
    """

    def __init__(
        self,
        world_size: int,
        *,
        seqlen: Optional[int] = None,
        batch: Optional[int] = None,
        cu_seqlens: Union[None, Sequence[int], torch.Tensor] = None,
        scheme: str = "zigzag",
    ):
        w = _as_int("world_size", world_size)
        if w < 1:
            raise ValueError(f"world_size must be >= 1, got {w}")
        if scheme not in SCHEMES:
            raise ValueError(f"scheme must be one of {', '.join(SCHEMES)}, got {scheme!r}")
        if (seqlen is None) == (cu_seqlens is None):
            raise ValueError("give either seqlen (and batch) for BSHD or cu_seqlens for THD, not both or neither")
        if cu_seqlens is None:
            s = _as_int("seqlen", seqlen)
            b = 1 if batch is None else _as_int("batch", batch)
            if s < 1 or b < 1:
                raise ValueError(f"seqlen and batch must be >= 1, got seqlen={s}, batch={b}")
            divisor = 2 * w if scheme == "zigzag" else w
            if s % divisor:
                raise ValueError(
                    f"seqlen={s}: BSHD with scheme={scheme!r} over world_size={w} needs seqlen % {divisor} == 0 "
                    "(every rank must hold the same number of tokens); pad the sequence or use THD"
                )
            lengths = [s] * b
            self.varlen = False
        else:
            if batch is not None:
                raise ValueError("batch is for BSHD (seqlen=...); THD takes the batch from cu_seqlens")
            if isinstance(cu_seqlens, torch.Tensor):
                if cu_seqlens.dtype.is_floating_point or cu_seqlens.dtype == torch.bool:
                    raise TypeError(f"cu_seqlens must hold integers, got a {cu_seqlens.dtype} tensor")
                cu = [int(x) for x in cu_seqlens.cpu().tolist()]
            else:
                cu = [_as_int(f"cu_seqlens[{i}]", x) for i, x in enumerate(cu_seqlens)]
            if len(cu) < 2 or cu[0] != 0 or any(b < a for a, b in zip(cu, cu[1:])):
                raise ValueError(f"cu_seqlens must start at 0, be nondecreasing and hold B+1 >= 2 values, got {cu}")
            lengths = [b - a for a, b in zip(cu, cu[1:])]
            self.varlen = True
        self.world_size = w
        self.scheme = scheme
        self.lengths = lengths
        self.cu_seqlens = [0]
        for n in lengths:
            self.cu_seqlens.append(self.cu_seqlens[-1] + n)
        self.batch = len(lengths)
        self.seqlen = None if self.varlen else lengths[0]
        # positions[r][b]: int64 sample-local positions rank r owns in sample b (increasing).
        self._positions = [[self._owned(n, r) for n in lengths] for r in range(w)]
        # flat[r]: int64 global token index (cu[b] + position) of every local token, in local order.
        self._flat = [
            torch.cat([p + c for p, c in zip(self._positions[r], self.cu_seqlens)]) for r in range(w)
        ]
        self._local_cu = []
        for r in range(w):
            cu = [0]
            for p in self._positions[r]:
                cu.append(cu[-1] + p.numel())
            self._local_cu.append(cu)

    # -- the partition -------------------------------------------------------------------------

    def _owned(self, n: int, r: int) -> torch.Tensor:
        w = self.world_size
        if self.scheme == "striped":
            return torch.arange(min(r, n), n, w, dtype=torch.int64)
        chunks = 2 * w if self.scheme == "zigzag" else w

        def bounds(c: int) -> tuple[int, int]:
            return (c * n) // chunks, ((c + 1) * n) // chunks

        if self.scheme == "contiguous":
            a, b = bounds(r)
            return torch.arange(a, b, dtype=torch.int64)
        a0, b0 = bounds(r)
        a1, b1 = bounds(2 * w - 1 - r)
        return torch.cat([torch.arange(a0, b0, dtype=torch.int64), torch.arange(a1, b1, dtype=torch.int64)])

    def _check_rank(self, rank: int) -> int:
        r = _as_int("rank", rank)
        if not 0 <= r < self.world_size:
            raise ValueError(f"rank must be in [0, {self.world_size}), got {r}")
        return r

    def positions(self, rank: int, sample: int = 0) -> torch.Tensor:
        """int64 sample-local positions of ``sample`` that ``rank`` owns (increasing)."""
        return self._positions[self._check_rank(rank)][sample]

    def token_index(self, rank: int) -> torch.Tensor:
        """int64 ``[T_r]``: global flat token index (``cu_seqlens[b] + position``) of each local token."""
        return self._flat[self._check_rank(rank)]

    def local_cu_seqlens(self, rank: int) -> list[int]:
        """Local cumulative sample lengths of ``rank`` (``[B+1]`` ints; samples may be empty)."""
        return list(self._local_cu[self._check_rank(rank)])

    def local_tokens(self, rank: int) -> int:
        """Tokens ``rank`` owns over all samples (``B * S / W`` for BSHD)."""
        return self._local_cu[self._check_rank(rank)][-1]

    def local_seqlen(self) -> int:
        """BSHD only: the local sequence length ``S / W``."""
        if self.varlen:
            raise ValueError("local_seqlen: THD shardings have per-rank token counts; use local_tokens(rank)")
        return self.seqlen // self.world_size

    @property
    def total_tokens(self) -> int:
        return self.cu_seqlens[-1]

    # -- moving tensors ------------------------------------------------------------------------

    def _seq_dim(self, x: torch.Tensor, dim: Optional[int], what: str) -> int:
        if dim is None:
            dim = 0 if self.varlen else 1
        d = dim % x.dim() if x.dim() else 0
        want = self.total_tokens if self.varlen else self.seqlen
        if self.varlen and x.shape[d] != want:
            raise ValueError(f"{what}: dimension {dim} of shape {tuple(x.shape)} must be the THD token count {want}")
        if not self.varlen:
            if d < 1 or x.shape[d] != want or x.shape[0] != self.batch:
                raise ValueError(
                    f"{what}: shape {tuple(x.shape)} must be [B={self.batch}, ...] with S={want} at dimension {dim}"
                )
        return d

    def shard(self, x: torch.Tensor, rank: int, dim: Optional[int] = None) -> torch.Tensor:
        """The tokens of global ``x`` that ``rank`` owns, in local order (a copy).

        ``x``: BSHD ``[B, S, ...]`` (``dim`` defaults to 1; use ``dim=2`` for an LSE
        ``[B, H, S]``) or THD ``[T, ...]`` (``dim`` defaults to 0; ``dim=1`` for ``[H, T]``).
        """
        r = self._check_rank(rank)
        d = self._seq_dim(x, dim, "shard")
        idx = (self._flat[r] if self.varlen else self._positions[r][0]).to(x.device)
        return x.index_select(d, idx)

    def unshard(self, shards: Sequence[torch.Tensor], dim: Optional[int] = None) -> torch.Tensor:
        """Inverse of :meth:`shard`: the global tensor from the ``world_size`` local shards (rank order)."""
        if len(shards) != self.world_size:
            raise ValueError(f"unshard: needs {self.world_size} shards (one per rank), got {len(shards)}")
        d = (0 if self.varlen else 1) if dim is None else dim % shards[0].dim()
        cat = torch.cat(list(shards), dim=d)
        return cat.index_select(d, self.gather_order().to(cat.device))

    def gather_order(self) -> torch.Tensor:
        """int64: position in the rank-major concatenation of local tokens of every global token.

        THD: ``[T]`` over the concatenation of all ranks' ``[T_r]``; BSHD: ``[S]`` over the
        concatenation of the ranks' ``[S/W]`` positions (the same for every sample).
        """
        if self.varlen:
            order = torch.cat(self._flat)
        else:
            order = torch.cat([p[0] for p in self._positions])
        inv = torch.empty_like(order)
        inv[order] = torch.arange(order.numel(), dtype=torch.int64)
        return inv

    def gather(self, x: torch.Tensor, group=None, dim: Optional[int] = None) -> torch.Tensor:
        """All-gathers this rank's shard ``x`` into the global tensor on every rank (a collective).

        ``dim`` as in :meth:`shard`. THD shards of different sizes are padded to the largest one
        for the collective. Meant for checks and debugging; training keeps tensors sharded.
        """
        import torch.distributed as dist

        w = dist.get_world_size(group)
        if w != self.world_size:
            raise ValueError(f"gather: the group has {w} ranks but the sharding is for {self.world_size}")
        d = (0 if self.varlen else 1) if dim is None else dim % x.dim()
        sizes = [self.local_tokens(r) if self.varlen else self.local_seqlen() for r in range(w)]
        width = max(sizes) if sizes else 0
        xm = x.movedim(d, 0)
        if xm.shape[0] < width:
            xm = torch.cat([xm, xm.new_zeros((width - xm.shape[0], *xm.shape[1:]))])
        buf = xm.new_empty((w * width, *xm.shape[1:]))
        dist.all_gather_into_tensor(buf, xm.contiguous(), group=group)
        parts = [buf[r * width : r * width + sizes[r]].movedim(0, d) for r in range(w)]
        return self.unshard(parts, dim=d)

    # -- masks ---------------------------------------------------------------------------------

    def shard_rows(self, mask_func: torch.Tensor, rank: int) -> torch.Tensor:
        """Rows of a global ``mask_func`` ``[Hmask, nfunc, T]`` (``T = B*S`` or THD ``T``) that ``rank``'s queries own.

        The endpoints stay in global (sample-local) key coordinates; :meth:`shift_endpoints`
        moves them into a key shard's coordinates.
        """
        r = self._check_rank(rank)
        if mask_func.dim() != 3 or mask_func.shape[2] != self.total_tokens:
            raise ValueError(
                f"mask_func must be [Hmask, nfunc, {self.total_tokens}] (one row per global token), "
                f"got {tuple(mask_func.shape)}"
            )
        return mask_func.index_select(2, self._flat[r].to(mask_func.device))

    def row_samples(self, rank: int) -> torch.Tensor:
        """int64 ``[T_r]``: sample index of each of ``rank``'s local tokens."""
        r = self._check_rank(rank)
        counts = torch.tensor([p.numel() for p in self._positions[r]], dtype=torch.int64)
        return torch.repeat_interleave(torch.arange(self.batch, dtype=torch.int64), counts)

    def shift_endpoints(self, rows: torch.Tensor, row_rank: int, key_rank: int) -> torch.Tensor:
        """Endpoints of ``row_rank``'s rows (from :meth:`shard_rows`) in ``key_rank``'s local key coordinates.

        A rank's positions of a sample are increasing, so the count
        ``c(x) = #{owned keys of the sample at positions < x}`` is nondecreasing and maps every
        global interval ``[a, b)`` onto exactly the owned keys inside it, ``[c(a), c(b))``: the
        shifted endpoints keep ``nfunc``, stay nondecreasing and describe the same visible set
        restricted to the key shard. Returns int32 of the shape of ``rows``.
        """
        kr = self._check_rank(key_rank)
        flat_k = self._flat[kr].to(rows.device)
        cu = torch.tensor(self.cu_seqlens[:-1], dtype=torch.int64, device=rows.device)
        base = cu[self.row_samples(row_rank).to(rows.device)]  # [T_r]
        start = torch.searchsorted(flat_k, base)  # keys of key_rank before the row's sample
        shifted = torch.searchsorted(flat_k, (rows.to(torch.int64) + base).contiguous()) - start
        return shifted.to(torch.int32)

    def pair_visible(self, mask_func: torch.Tensor, row_rank: int) -> list[int]:
        """Visible (query, key) pairs of ``row_rank``'s queries with each key rank's keys (summed over mask heads)."""
        rows = self.shard_rows(mask_func, row_rank)
        return [visible_count(self.shift_endpoints(rows, row_rank, j)) for j in range(self.world_size)]

    def work_matrix(self, mask_func: torch.Tensor) -> list[list[int]]:
        """``[W][W]`` visible pairs of (query rank, key rank): the per-pair attention work."""
        return [self.pair_visible(mask_func, i) for i in range(self.world_size)]

    def __repr__(self) -> str:
        geo = f"cu_seqlens={self.cu_seqlens}" if self.varlen else f"seqlen={self.seqlen}, batch={self.batch}"
        if self.varlen and len(self.cu_seqlens) > 9:
            geo = f"THD B={self.batch}, T={self.total_tokens}"
        return f"SequenceSharding(world_size={self.world_size}, {geo}, scheme={self.scheme!r})"


def visible_count(endpoints: torch.Tensor) -> int:
    """Visible keys summed over rows and heads of ``[Hmask, nfunc, T]`` endpoints: ``F0 + sum(F(2t+2) - F(2t+1))``."""
    e = endpoints.to(torch.int64)
    total = e[:, 0].sum()
    if e.shape[1] > 1:
        total = total + (e[:, 2::2] - e[:, 1::2]).sum()
    return int(total)
