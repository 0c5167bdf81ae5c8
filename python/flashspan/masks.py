"""Mask builders: interval-endpoint ``mask_func`` tensors for flex attention.

A flex-attention mask gives every query row ``q`` an odd number ``nfunc`` of
nondecreasing, sample-local key endpoints ``F0 <= F1 <= ... <= F(nfunc-1)`` in
``[0, Sk]``; row ``q`` sees the keys::

    [0, F0) U [F1, F2) U [F3, F4) U ...

Unused interval slots repeat the last endpoint (empty intervals). Every builder
here returns an ``int32`` tensor of shape ``[Hmask, nfunc, B * Sq]`` (rows flattened
batch-major: row ``b * Sq + q``), the ``mask_func`` that ``flashspan.create_mask_plan``
takes. Builders are vectorised torch code: no Python loop runs over rows, so the
benchmark masks at ``S = 131072`` build in milliseconds.

Packed (THD) batches: a THD ``mask_func`` is ``[Hmask, nfunc, Tq]``, the samples' rows back to
back in ``cu_seqlens_q`` order with sample-local endpoints, so build one mask per sample (its own
``Sq``, ``Sk``) and concatenate them along the last dimension; masks of different ``nfunc`` are
first brought to a common one with :func:`pad_nfunc`::

    >>> lq, lk = [3, 2], [4, 2]   # cu_seqlens_q = [0, 3, 5], cu_seqlens_k = [0, 4, 6]
    >>> torch.cat([causal(a, b, bottom_right=True) for a, b in zip(lq, lk)], dim=2).tolist()
    [[[2, 3, 4, 1, 2]]]

Contents
--------
* dense-shape builders: :func:`causal`, :func:`sliding_window`, :func:`sink_window`,
  :func:`prefix_lm`;
* structured builders: :func:`document_causal`, :func:`tree`, :func:`binary_tree`,
  :func:`longformer`, :func:`hstu`, with :func:`random_document_lengths`;
* the eight workloads of ``docs/BENCHMARK.md``: :func:`benchmark_mask` (and
  :data:`BENCHMARK_MASKS`, :data:`BENCHMARK_NFUNC`);
* conversions: :func:`from_dense`, :func:`from_mask_mod` (any mask -> fewest
  endpoints), :func:`compact`, :func:`pad_nfunc`, :func:`to_dense`;
* statistics: :func:`visible_pairs`, :func:`density`.

Argument rules
--------------
Lengths are Python ints (numpy ints and 0-d integer tensors too; a bool or float
raises ``TypeError`` naming the argument). Flags (``bottom_right``, ``causal``,
``per_head``) are bools (a NumPy bool too; an int, a string or None raises
``TypeError`` naming the flag). Which zero lengths are allowed:

* the query length of a builder (``seqlen``, ``seqlen_q``, the total of
  ``document_lengths`` or ``node_lengths``, ``random_document_lengths``' ``total``)
  must be ``>= 1``: a mask without query rows describes nothing and is almost always
  a bug upstream (``causal(len(tokens))`` with no tokens), so it raises ``ValueError``;
* a separate key length ``seqlen_k`` may be 0: every row then sees no key, which
  flashspan defines (output 0, LSE ``-inf``), e.g. an empty KV cache;
* window sizes (``before``, ``after``, ``window``, ``radius``), ``sink``,
  ``prefix_length`` and ``num_global`` may be 0 (a window of the diagonal only, no
  sinks, no prefix, no global tokens); a single document or tree node may have
  length 0 (it contributes no rows);
* ``batch`` and ``heads`` must be ``>= 1``;
* negative values always raise ``ValueError``.

Conversions (:func:`from_dense`, :func:`to_dense`, :func:`compact`, ...) keep empty
inputs empty: they only change the representation.

Example::

    >>> import flashspan.masks as fm
    >>> fm.causal(4).tolist()
    [[[1, 2, 3, 4]]]
    >>> fm.sliding_window(5, before=1).tolist()   # causal window: the diagonal and 1 key before it
    [[[0, 0, 0, 0, 0], [0, 0, 1, 2, 3], [1, 2, 3, 4, 5]]]
    >>> fm.to_dense(fm.causal(3), 3, 3)[0, 0].int().tolist()
    [[1, 0, 0], [1, 1, 0], [1, 1, 1]]
"""

from __future__ import annotations

import functools
import math
import operator
import random
from typing import Callable, Optional, Sequence, Union

import torch

from ._checks import check_flag

__all__ = [
    "BENCHMARK_MASKS",
    "BENCHMARK_NFUNC",
    "benchmark_mask",
    "benchmark_mask_mod",
    "binary_tree",
    "binary_tree_layout",
    "causal",
    "compact",
    "density",
    "document_causal",
    "from_dense",
    "from_mask_mod",
    "hstu",
    "longformer",
    "pad_nfunc",
    "prefix_lm",
    "random_document_lengths",
    "sink_window",
    "sliding_window",
    "to_dense",
    "tree",
    "visible_pairs",
]

DeviceLike = Union[str, torch.device, None]

#: The eight flex-mask workloads of BENCHMARK.md, in its order.
BENCHMARK_MASKS = (
    "causal",
    "document_causal",
    "local",
    "sink_local",
    "tree_dfs",
    "tree_bfs",
    "longformer",
    "hstu",
)

#: Endpoint count of each benchmark mask, as BENCHMARK.md lists it.
BENCHMARK_NFUNC = {
    "causal": 1,
    "document_causal": 3,
    "local": 3,
    "sink_local": 3,
    "tree_dfs": 13,
    "tree_bfs": 13,
    "longformer": 19,
    "hstu": 5,
}

# BENCHMARK.md states its lengths (document sizes, windows) for S >= 32768; shorter
# sequences (the CPU run uses S = 512) scale them by S / 32768 so that a small run
# keeps the same structure instead of degenerating into one document or a plain
# causal mask.
_BENCHMARK_REFERENCE_S = 32768


# ---------------------------------------------------------------------------
# Internal helpers
# ---------------------------------------------------------------------------


def _check_int(name: str, value) -> int:
    """``value`` as a Python int (ints, numpy ints and 0-d int tensors); TypeError for bool, float, ..."""
    if isinstance(value, bool):
        raise TypeError(f"{name} must be an int, got bool")
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}") from None


def _check_len(name: str, value, minimum: int = 0) -> int:
    """``value`` as a Python int >= ``minimum`` (ints, numpy ints and 0-d int tensors)."""
    value = _check_int(name, value)
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return value


def _finish(endpoints: torch.Tensor, batch: int, heads: int, device: DeviceLike) -> torch.Tensor:
    """[nfunc, Sq] (one sample, shared by heads) or [B, nfunc, Sq] -> int32 [heads, nfunc, B*Sq]."""
    batch = _check_len("batch", batch, 1)
    heads = _check_len("heads", heads, 1)
    if endpoints.dim() == 2:
        endpoints = endpoints.unsqueeze(0).expand(batch, -1, -1)
    elif endpoints.shape[0] != batch:
        raise ValueError(f"got {endpoints.shape[0]} per-sample masks for batch={batch}")
    nfunc, sq = endpoints.shape[1], endpoints.shape[2]
    rows = endpoints.permute(1, 0, 2).reshape(nfunc, batch * sq)
    out = rows.to(torch.int32).unsqueeze(0).expand(heads, -1, -1).contiguous()
    return out.to(device) if device is not None else out


def _union_endpoints(starts: torch.Tensor, ends: torch.Tensor) -> torch.Tensor:
    """Endpoints of the union of K intervals per row.

    starts, ends: int64 [K, R], interval k of row r is [starts[k, r], ends[k, r]) (may be
    empty, may overlap, any order). Returns int64 [nfunc, R] with nfunc = 2K+1, or 2K-1
    when every row's leftmost interval starts at 0 (then it becomes [0, F0)).

    Sorting by start and clipping each interval to begin at the running maximum of the
    previous ends makes the intervals disjoint and ordered, so the endpoint list
    (0, s'0, e'0, s'1, e'1, ...) is nondecreasing and describes exactly the union.
    """
    ends = torch.maximum(ends, starts)
    starts, order = torch.sort(starts, dim=0, stable=True)
    ends = torch.gather(ends, 0, order)
    run_max = torch.cummax(ends, dim=0).values
    prev = torch.cat([torch.zeros_like(run_max[:1]), run_max[:-1]], dim=0)
    s = torch.maximum(starts, prev)
    e = run_max
    # Empty pairs repeat the end of the last non-empty one (the "unused slots repeat the
    # last endpoint" convention); still nondecreasing, same visible set.
    nonempty = e > s
    last_end = torch.cummax(torch.where(nonempty, e, torch.zeros_like(e)), dim=0).values
    s = torch.where(nonempty, s, last_end)
    e = torch.where(nonempty, e, last_end)
    pairs = torch.stack([s, e], dim=1).reshape(2 * starts.shape[0], -1)
    if bool((starts[0] == 0).all()):
        return pairs[1:]
    return torch.cat([torch.zeros_like(pairs[:1]), pairs], dim=0)


def _lengths_to_starts(lengths: torch.Tensor, total: int, what: str) -> torch.Tensor:
    if lengths.dim() != 1 or lengths.numel() == 0:
        raise ValueError(f"{what} must be a non-empty 1-D sequence of lengths")
    if bool((lengths < 0).any()):
        raise ValueError(f"{what} must be non-negative, got {lengths.tolist()}")
    if total < 1:
        raise ValueError(f"{what} must sum to a sequence length >= 1, got {total} (a mask needs query rows)")
    if int(lengths.sum()) != total:
        raise ValueError(f"{what} must sum to the sequence length {total}, got {int(lengths.sum())}")
    return torch.cumsum(lengths, 0) - lengths


def _int_tensor(values, name: str) -> torch.Tensor:
    """int64 CPU tensor of a sequence of ints or an integer tensor; TypeError for floats or
    bools (``torch.as_tensor(..., dtype=int64)`` would truncate 2.5 to 2 silently)."""
    if isinstance(values, torch.Tensor):
        if values.dtype.is_floating_point or values.dtype.is_complex or values.dtype == torch.bool:
            raise TypeError(f"{name} must hold integers, got a {values.dtype} tensor")
        return values.to(torch.int64).cpu()
    # Ranges (non-negative, sums) are the caller's rules; only the type is checked here.
    return torch.as_tensor([_check_int(f"{name}[{i}]", x) for i, x in enumerate(values)], dtype=torch.int64)


def _as_length_batches(lengths, name: str) -> list[torch.Tensor]:
    """One 1-D int64 tensor per sample from a sequence of lengths or a sequence of sequences."""
    if isinstance(lengths, torch.Tensor):
        t = _int_tensor(lengths, name)
        return [t] if t.dim() == 1 else [row for row in t]
    seq = list(lengths)
    if not seq:
        raise ValueError(f"{name} must not be empty")
    if isinstance(seq[0], (list, tuple, torch.Tensor)):
        return [_int_tensor(s, f"{name}[{i}]") for i, s in enumerate(seq)]
    return [_int_tensor(seq, name)]


def _segment_ids(lengths: torch.Tensor) -> torch.Tensor:
    return torch.repeat_interleave(torch.arange(lengths.numel()), lengths)


# ---------------------------------------------------------------------------
# Dense-shape builders
# ---------------------------------------------------------------------------


def causal(seqlen_q: int, seqlen_k: Optional[int] = None, *, bottom_right: bool = False,
           batch: int = 1, heads: int = 1, device: DeviceLike = None) -> torch.Tensor:
    """Causal mask, nfunc = 1.

    Top-left aligned (default): row ``q`` sees ``[0, min(q + 1, Sk))``.
    Bottom-right aligned (``bottom_right=True``, the KV-cache convention): the last
    query row is aligned with the last key, row ``q`` sees
    ``[0, clamp(q + Sk - Sq + 1, 0, Sk))``. Both are the same when ``Sq == Sk``.

    Args:
        seqlen_q, seqlen_k: query and key lengths per sample (``Sk`` defaults to ``Sq``).
        bottom_right: alignment of the diagonal when ``Sq != Sk``.
        batch: number of samples ``B`` (all with the same mask).
        heads: ``Hmask``, the leading dimension (1 = shared by all query heads).
        device: device of the result (default CPU).

    Returns:
        int32 ``[heads, 1, batch * Sq]``.

    Example::

        >>> causal(3, 5, bottom_right=True).tolist()
        [[[3, 4, 5]]]
    """
    sq = _check_len("seqlen_q", seqlen_q, 1)
    sk = sq if seqlen_k is None else _check_len("seqlen_k", seqlen_k)
    q = torch.arange(sq, dtype=torch.int64)
    shift = sk - sq if check_flag("bottom_right", bottom_right) else 0
    return _finish((q + shift + 1).clamp(0, sk).unsqueeze(0), batch, heads, device)


def sliding_window(seqlen_q: int, seqlen_k: Optional[int] = None, *, before: Optional[int] = None,
                   after: Optional[int] = 0, bottom_right: bool = False, batch: int = 1, heads: int = 1,
                   device: DeviceLike = None, **deprecated) -> torch.Tensor:
    """Sliding-window (band) mask, nfunc = 3: row ``q`` sees its diagonal key ``q'``, the ``before`` keys
    before it and the ``after`` keys after it, ``[q' - before, q' + after + 1)`` clipped to ``[0, Sk)``,
    where ``q' = q`` (top-left) or ``q + Sk - Sq`` (bottom-right).

    ``before=None`` / ``after=None`` make that side unbounded; ``after=0`` (the default) is a
    causal window. A row sees up to ``before + 1 + after`` keys: the diagonal is never counted
    in ``before`` / ``after``. SDPA's ``diagonal_band_left_bound`` (and the custom op's
    ``window_left``) count the diagonal too, so ``before=w`` is ``diagonal_band_left_bound = w + 1``;
    ``after=r`` is ``diagonal_band_right_bound = r``. The BENCHMARK.md ``local`` mask is
    ``sliding_window(S, before=512)``. The keywords ``left`` / ``right`` of earlier versions
    (the same counts as ``before`` / ``after``) still work, with a DeprecationWarning.

    Returns:
        int32 ``[heads, 3, batch * Sq]`` with endpoints ``(0, lo, hi)``.

    Example::

        >>> sliding_window(4, before=1, after=1).tolist()
        [[[0, 0, 0, 0], [0, 0, 1, 2], [2, 3, 4, 4]]]
    """
    before, after = _window_keywords(deprecated, before, after)
    sq = _check_len("seqlen_q", seqlen_q, 1)
    sk = sq if seqlen_k is None else _check_len("seqlen_k", seqlen_k)
    q = torch.arange(sq, dtype=torch.int64) + (sk - sq if check_flag("bottom_right", bottom_right) else 0)
    lo = torch.zeros_like(q) if before is None else (q - _check_len("before", before)).clamp(0, sk)
    hi = torch.full_like(q, sk) if after is None else (q + _check_len("after", after) + 1).clamp(0, sk)
    lo = torch.minimum(lo, hi)
    return _finish(torch.stack([torch.zeros_like(q), lo, hi]), batch, heads, device)


def _window_keywords(deprecated: dict, before, after):
    """(before, after) of sliding_window with its earlier keywords ``left`` / ``right`` mapped onto them
    (DeprecationWarning: "left" read as SDPA's left bound, which counts the diagonal, is one key off)."""
    import warnings

    for old, new in (("left", "before"), ("right", "after")):
        if old not in deprecated:
            continue
        value = deprecated.pop(old)
        given = before if new == "before" else after
        if given != (None if new == "before" else 0):
            raise TypeError(f"sliding_window() got values for both {new!r} and its deprecated name {old!r}")
        if new == "before":
            before = value
            if value is None:
                why = "the same window: no bound before the diagonal"
            else:
                n = _check_int(old, value)
                why = (f"the same window: the {n} keys before the diagonal, and the diagonal; 'left' read as SDPA's "
                       f"diagonal_band_left_bound, which counts the diagonal, is one key off: this window is "
                       f"diagonal_band_left_bound = {n + 1}")
        else:
            after = value
            why = ("the same window: no bound after the diagonal" if value is None else
                   f"the same window: the {value} keys after the diagonal, SDPA's diagonal_band_right_bound = {value}")
        warnings.warn(f"sliding_window: {old}={value} is deprecated; use {new}={value} ({why})", DeprecationWarning,
                      stacklevel=3)
    if deprecated:
        raise TypeError(f"sliding_window() got an unexpected keyword argument {next(iter(deprecated))!r}")
    return before, after


def sink_window(seqlen_q: int, seqlen_k: Optional[int] = None, *, sink: int = 4, window: int = 512,
                bottom_right: bool = False, batch: int = 1, heads: int = 1,
                device: DeviceLike = None) -> torch.Tensor:
    """Attention sinks plus a causal sliding window (StreamingLLM), nfunc = 3.

    Row ``q`` (diagonal position ``q'`` as in :func:`sliding_window`) sees
    ``[0, min(q' + 1, sink)) U [clamp(q' - window, sink, q' + 1), q' + 1)``, clipped to ``Sk``:
    ``window`` counts the keys before the diagonal, as :func:`sliding_window`'s ``before`` (up to
    ``sink + window + 1`` keys per row). The BENCHMARK.md ``sink_local`` mask is
    ``sink_window(S, sink=4, window=512)``.

    Returns:
        int32 ``[heads, 3, batch * Sq]``.

    Example::

        >>> sink_window(6, sink=1, window=2).tolist()
        [[[1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 2, 3], [1, 2, 3, 4, 5, 6]]]
    """
    sq = _check_len("seqlen_q", seqlen_q, 1)
    sk = sq if seqlen_k is None else _check_len("seqlen_k", seqlen_k)
    sink = _check_len("sink", sink)
    window = _check_len("window", window)
    q = torch.arange(sq, dtype=torch.int64) + (sk - sq if check_flag("bottom_right", bottom_right) else 0)
    hi = (q + 1).clamp(0, sk)
    f0 = hi.clamp(max=sink)
    f1 = torch.minimum((q - window).clamp(min=sink), hi).clamp(min=0)
    f1 = torch.maximum(f1, f0)
    return _finish(torch.stack([f0, f1, hi]), batch, heads, device)


def prefix_lm(seqlen: int, prefix_length: Union[int, Sequence[int]], *, batch: int = 1, heads: int = 1,
              device: DeviceLike = None) -> torch.Tensor:
    """Prefix-LM mask, nfunc = 1: the first ``prefix_length`` tokens attend bidirectionally
    among themselves, the rest causally: row ``q`` sees ``[0, max(prefix, q + 1))``.

    Args:
        prefix_length: one int for all samples, or one per sample (then ``batch`` is its length).

    Returns:
        int32 ``[heads, 1, batch * S]``.

    Example::

        >>> prefix_lm(4, 2).tolist()
        [[[2, 2, 3, 4]]]
    """
    s = _check_len("seqlen", seqlen, 1)
    prefixes = [prefix_length] if isinstance(prefix_length, int) else list(prefix_length)
    if not isinstance(prefix_length, int):
        batch = len(prefixes)
    q = torch.arange(s, dtype=torch.int64)
    per_sample = []
    for i, p in enumerate(prefixes):
        p = _check_len(f"prefix_length[{i}]", p)
        if p > s:
            raise ValueError(f"prefix_length[{i}] = {p} exceeds the sequence length {s}")
        per_sample.append(torch.maximum(q + 1, torch.full_like(q, p)).unsqueeze(0))
    eps = per_sample[0] if len(per_sample) == 1 else torch.stack(per_sample)
    return _finish(eps, batch, heads, device)


# ---------------------------------------------------------------------------
# Structured builders
# ---------------------------------------------------------------------------


def random_document_lengths(total: int, min_length: int, max_length: int, seed: int = 0) -> list[int]:
    """Document lengths drawn uniformly from ``[min_length, max_length]`` and packed back to
    back until ``total`` tokens; the last document is truncated to fit. Deterministic in
    ``seed`` (Python's Mersenne Twister, independent of torch's global RNG).

    Example::

        >>> sum(random_document_lengths(32768, 4096, 16384, seed=1))
        32768
    """
    total = _check_len("total", total, 1)
    min_length = _check_len("min_length", min_length, 1)
    max_length = _check_len("max_length", max_length, min_length)
    rng = random.Random(seed)
    out, used = [], 0
    while used < total:
        n = min(rng.randint(min_length, max_length), total - used)
        out.append(n)
        used += n
    return out


def document_causal(document_lengths, *, causal: bool = True, heads: int = 1,
                    device: DeviceLike = None) -> torch.Tensor:
    """Packed documents (sequence packing): a token sees only its own document,
    causally (``[doc_start, q + 1)``) or bidirectionally (``[doc_start, doc_end)``). nfunc = 3
    with endpoints ``(0, doc_start, end)``.

    Args:
        document_lengths: the documents of one sample (summing to ``S``), or one such
            sequence per sample (all summing to the same ``S``; the batch size is their
            count). A list or a 1-D/2-D int tensor.
        causal: causal within the document (default) or full.

    Returns:
        int32 ``[heads, 3, B * S]``.

    Example::

        >>> document_causal([2, 3]).tolist()
        [[[0, 0, 0, 0, 0], [0, 0, 2, 2, 2], [1, 2, 3, 4, 5]]]
    """
    causal = check_flag("causal", causal)
    per_sample = _as_length_batches(document_lengths, "document_lengths")
    total = int(per_sample[0].sum())
    out = []
    for i, lengths in enumerate(per_sample):
        starts = _lengths_to_starts(lengths, total, f"document_lengths[{i}]")
        seg = _segment_ids(lengths)
        start = starts[seg]
        end = torch.arange(total) + 1 if causal else (starts + lengths)[seg]
        out.append(torch.stack([torch.zeros_like(start), start, end]))
    return _finish(out[0] if len(out) == 1 else torch.stack(out), len(out), heads, device)


def tree(parent: Sequence[int], node_lengths: Sequence[int], *, heads: int = 1,
         device: DeviceLike = None) -> torch.Tensor:
    """Tree attention (speculative decoding trees, prompt trees): node ``i`` occupies the
    next ``node_lengths[i]`` tokens in the given order; a token sees the whole span of every
    ancestor of its node plus its own node causally. nfunc = 2 * depth_max + 1 (one less pair
    when every token's leftmost visible span starts at 0, e.g. a root laid out first).

    Args:
        parent: ``parent[i]`` is the index of node ``i``'s parent, ``-1`` for a root (a forest
            is fine). Must be acyclic; the order of nodes is the token layout order.
        node_lengths: tokens per node, non-negative, any total ``S``.

    Returns:
        int32 ``[heads, nfunc, S]`` (one sample).

    Example::

        >>> tree([-1, 0, 0], [1, 1, 1]).tolist()   # root, then two children
        [[[1, 1, 1], [1, 1, 2], [1, 2, 3]]]
    """
    par = _int_tensor(parent, "parent")
    lengths = _int_tensor(node_lengths, "node_lengths")
    n = par.numel()
    if n == 0 or lengths.numel() != n:
        raise ValueError(f"parent ({n}) and node_lengths ({lengths.numel()}) must be non-empty and equal length")
    if bool(((par < -1) | (par >= n)).any()):
        raise ValueError("parent entries must be -1 (root) or a node index in [0, len(parent))")
    if bool((lengths < 0).any()):
        raise ValueError("node_lengths must be non-negative")
    if int(lengths.sum()) < 1:
        raise ValueError("node_lengths must sum to a sequence length >= 1 (a mask needs query rows)")
    # Ancestor chains by pointer doubling over the (tiny) node array: chain[d, i] is the
    # d-th ancestor of i (itself at d = 0), -1 above the root.
    chain = [torch.arange(n)]
    while True:
        nxt = torch.where(chain[-1] >= 0, par[chain[-1].clamp(min=0)], torch.full_like(par, -1))
        if bool((nxt < 0).all()):
            break
        if len(chain) > n:
            raise ValueError("parent array contains a cycle")
        chain.append(nxt)
    anc = torch.stack(chain)                                    # [depth+1, n]
    starts = torch.cumsum(lengths, 0) - lengths
    valid = anc >= 0
    a = anc.clamp(min=0)
    node_start = torch.where(valid, starts[a], torch.zeros_like(a))
    node_end = torch.where(valid, (starts + lengths)[a], torch.zeros_like(a))
    # Per token: the own node (d = 0) ends at q + 1; missing ancestors are empty intervals.
    seg = _segment_ids(lengths)
    total = int(lengths.sum())
    s_tok = node_start[:, seg]
    e_tok = node_end[:, seg]
    e_tok[0] = torch.arange(total) + 1
    empty = ~valid[:, seg]
    s_tok = torch.where(empty, s_tok.new_zeros(()), s_tok)
    e_tok = torch.where(empty, e_tok.new_zeros(()), e_tok)
    # Place empty slots at the end of the row instead of at 0 so they do not break the
    # "leftmost span starts at 0" shortcut in _union_endpoints.
    s_tok = torch.where(empty, torch.full_like(s_tok, total), s_tok)
    e_tok = torch.where(empty, torch.full_like(e_tok, total), e_tok)
    return _finish(_union_endpoints(s_tok, e_tok), 1, heads, device)


def _binary_tree_layout(depth: int, order: str) -> list[int]:
    """Heap indices (root 0, children 2i+1, 2i+2) of a complete binary tree in layout order."""
    n = (1 << depth) - 1
    if order == "bfs":
        return list(range(n))
    if order != "dfs":
        raise ValueError(f"order must be 'dfs' or 'bfs', got {order!r}")
    out, stack = [], [0]
    while stack:
        i = stack.pop()
        out.append(i)
        for c in (2 * i + 2, 2 * i + 1):  # push right first so the left child comes next
            if c < n:
                stack.append(c)
    return out


def binary_tree_layout(seqlen: int, *, depth: int = 7, order: str = "dfs", jitter: float = 0.2,
                       seed: int = 0) -> tuple[list[int], list[int]]:
    """The ``(parent, node_lengths)`` of :func:`binary_tree`, in layout order.

    Node lengths are ``seqlen / n_nodes`` scaled by independent factors drawn uniformly from
    ``[1 - jitter, 1 + jitter]`` (Python ``random.Random(seed)``), then rounded at the cumulative
    boundaries so they sum exactly to ``seqlen``.

    Example::

        >>> binary_tree_layout(7, depth=2, order="bfs", jitter=0.0)
        ([-1, 0, 0], [2, 3, 2])
    """
    s = _check_len("seqlen", seqlen, 1)
    depth = _check_len("depth", depth, 1)
    if not 0.0 <= jitter < 1.0:
        raise ValueError(f"jitter must be in [0, 1), got {jitter}")
    layout = _binary_tree_layout(depth, order)
    n = len(layout)
    position = [0] * n
    for pos, node in enumerate(layout):
        position[node] = pos
    parent = [-1 if node == 0 else position[(node - 1) // 2] for node in layout]
    rng = random.Random(seed)
    weights = [1.0 + rng.uniform(-jitter, jitter) for _ in range(n)]
    total_w = sum(weights)
    acc, bounds = 0.0, [0]
    for w in weights:
        acc += w
        bounds.append(int(round(acc / total_w * s)))
    bounds[-1] = s
    return parent, [bounds[i + 1] - bounds[i] for i in range(n)]


def binary_tree(seqlen: int, *, depth: int = 7, order: str = "dfs", jitter: float = 0.2, seed: int = 0,
                heads: int = 1, device: DeviceLike = None) -> torch.Tensor:
    """The BENCHMARK.md tree mask: a complete binary tree of ``depth`` levels
    (``2**depth - 1`` nodes) laid out in DFS (preorder) or BFS (level) order, node lengths
    ``seqlen / n_nodes`` jittered by ``+-jitter`` (seeded; see :func:`binary_tree_layout`).
    Semantics as :func:`tree`; nfunc = ``2 * depth - 1`` (13 for depth 7).

    Returns:
        int32 ``[heads, 2*depth - 1, seqlen]``.

    Example::

        >>> binary_tree(7, depth=2, jitter=0.0, order="bfs").tolist()  # nodes of 2, 3, 2 tokens
        [[[1, 2, 2, 2, 2, 2, 2], [1, 2, 2, 2, 2, 5, 5], [1, 2, 3, 4, 5, 6, 7]]]
    """
    parent, lengths = binary_tree_layout(seqlen, depth=depth, order=order, jitter=jitter, seed=seed)
    return tree(parent, lengths, heads=heads, device=device)


def longformer(seqlen: int, *, radius: int = 256, global_tokens: Optional[Sequence[int]] = None,
               num_global: int = 8, batch: int = 1, heads: int = 1, device: DeviceLike = None) -> torch.Tensor:
    """Longformer attention: a sliding window ``[q - radius, q + radius + 1)`` (clipped)
    plus global tokens; every token sees every global token and a global token sees
    everything. nfunc = ``2 * (G + 1) + 1`` for ``G`` global tokens (19 for the benchmark's 8).

    Args:
        radius: window radius (the benchmark uses 256).
        global_tokens: global token positions; default ``num_global`` tokens at
            ``floor((i + 0.5) * seqlen / num_global)`` (the BENCHMARK.md placement).

    Returns:
        int32 ``[heads, 2G + 3, batch * seqlen]``.

    Example::

        >>> longformer(6, radius=0, global_tokens=[3]).tolist()
        [[[0, 0, 0, 0, 0, 0], [0, 1, 2, 0, 3, 3], [1, 2, 3, 6, 4, 4], [3, 3, 3, 6, 4, 5], [4, 4, 4, 6, 5, 6]]]
    """
    s = _check_len("seqlen", seqlen, 1)
    radius = _check_len("radius", radius)
    if global_tokens is None:
        num_global = _check_len("num_global", num_global)
        global_tokens = [int(math.floor((i + 0.5) * s / num_global)) for i in range(num_global)]
    g = torch.as_tensor(list(global_tokens), dtype=torch.int64)
    if g.numel() and bool(((g < 0) | (g >= s)).any()):
        raise ValueError(f"global_tokens must lie in [0, {s}), got {g.tolist()}")
    q = torch.arange(s, dtype=torch.int64)
    is_global = torch.zeros(s, dtype=torch.bool)
    is_global[g] = True
    win_lo = torch.where(is_global, torch.zeros_like(q), (q - radius).clamp(min=0))
    win_hi = torch.where(is_global, torch.full_like(q, s), (q + radius + 1).clamp(max=s))
    starts = torch.cat([g.unsqueeze(1).expand(-1, s), win_lo.unsqueeze(0)])
    ends = torch.cat([(g + 1).unsqueeze(1).expand(-1, s), win_hi.unsqueeze(0)])
    ep = _union_endpoints(starts, ends)
    if ep.shape[0] == 2 * starts.shape[0] - 1:  # every row starts at 0 (tiny S): keep 2G + 3
        ep = torch.cat([torch.zeros_like(ep[:1]), torch.zeros_like(ep[:1]), ep])
    return _finish(ep, batch, heads, device)


def hstu(document_lengths, *, context_fraction: float = 0.5, heads: int = 1,
         device: DeviceLike = None) -> torch.Tensor:
    """HSTU-style context/target mask (generative recommenders), nfunc = 5.

    Each document of length ``L`` splits into a context of ``floor(L * context_fraction)``
    tokens followed by targets. Context rows see ``[doc_start, q + 1)``; target rows see
    the whole context ``[doc_start, ctx_end)`` plus themselves ``[q, q + 1)``.
    Endpoints: ``(0, doc_start, ctx_end_or_q+1, q_or_q+1, q + 1)``.

    Args:
        document_lengths: as in :func:`document_causal`.

    Returns:
        int32 ``[heads, 5, B * S]``.

    Example::

        >>> hstu([4]).tolist()[0][1:4]   # context 2 tokens, targets 2
        [[0, 0, 0, 0], [1, 2, 2, 2], [1, 2, 2, 3]]
    """
    if not 0.0 <= context_fraction <= 1.0:
        raise ValueError(f"context_fraction must be in [0, 1], got {context_fraction}")
    per_sample = _as_length_batches(document_lengths, "document_lengths")
    total = int(per_sample[0].sum())
    q = torch.arange(total, dtype=torch.int64)
    out = []
    for i, lengths in enumerate(per_sample):
        starts = _lengths_to_starts(lengths, total, f"document_lengths[{i}]")
        seg = _segment_ids(lengths)
        start = starts[seg]
        ctx_end = start + torch.floor(lengths.double() * context_fraction).long()[seg]
        is_ctx = q < ctx_end
        f2 = torch.where(is_ctx, q + 1, ctx_end)
        f3 = torch.where(is_ctx, q + 1, q)
        out.append(torch.stack([torch.zeros_like(q), start, f2, f3, q + 1]))
    return _finish(out[0] if len(out) == 1 else torch.stack(out), len(out), heads, device)


# ---------------------------------------------------------------------------
# Benchmark workloads
# ---------------------------------------------------------------------------


def _scaled(length: int, seqlen: int) -> int:
    if seqlen >= _BENCHMARK_REFERENCE_S:
        return length
    return max(1, int(round(length * seqlen / _BENCHMARK_REFERENCE_S)))


def benchmark_mask(name: str, seqlen: int, *, seed: int = 0, batch: int = 1,
                   device: DeviceLike = None) -> torch.Tensor:
    """One of the eight flex-mask workloads of BENCHMARK.md at ``Sq = Sk = seqlen``.

    =================  =====  ==================================================================
    name               nfunc  row ``q`` sees
    =================  =====  ==================================================================
    causal             1      ``[0, q + 1)``
    document_causal    3      ``[doc_start, q + 1)``, documents of 4K..16K tokens (seeded)
    local              3      ``[max(0, q - 512), q + 1)``
    sink_local         3      ``[0, min(q + 1, 4)) U [clamp(q - 512, 4, q + 1), q + 1)``
    tree_dfs/tree_bfs  13     binary tree of depth 7, node lengths ``S/127`` +-20% (seeded)
    longformer         19     window radius 256 + 8 global tokens at ``(i + 0.5) S / 8``
    hstu               5      documents of 8K..16K, context half causal, targets see context+self
    =================  =====  ==================================================================

    For ``seqlen >= 32768`` the lengths are exactly those above. For shorter sequences
    (CPU runs, tests) document sizes, window sizes and the Longformer radius scale by
    ``seqlen / 32768`` (rounded, at least 1) so the structure survives; the sink count and
    the number of global tokens and tree nodes stay fixed.

    Args:
        name: one of :data:`BENCHMARK_MASKS`.
        seqlen: ``S``.
        seed: seed of the random document lengths and tree jitter.
        batch: samples (all with the same mask).
        device: device of the result.

    Returns:
        int32 ``[1, BENCHMARK_NFUNC[name], batch * seqlen]``.

    Example::

        >>> benchmark_mask("tree_bfs", 32768).shape
        torch.Size([1, 13, 32768])
    """
    s = _check_len("seqlen", seqlen, 1)
    if name == "causal":
        ep = causal(s)
    elif name == "document_causal":
        ep = document_causal(random_document_lengths(s, _scaled(4096, s), _scaled(16384, s), seed))
    elif name == "local":
        ep = sliding_window(s, before=_scaled(512, s))
    elif name == "sink_local":
        ep = sink_window(s, sink=4, window=_scaled(512, s))
    elif name in ("tree_dfs", "tree_bfs"):
        ep = binary_tree(s, depth=7, order=name[-3:], jitter=0.2, seed=seed)
    elif name == "longformer":
        ep = longformer(s, radius=_scaled(256, s), num_global=8)
    elif name == "hstu":
        ep = hstu(random_document_lengths(s, _scaled(8192, s), _scaled(16384, s), seed))
    else:
        raise ValueError(f"unknown benchmark mask {name!r}; expected one of {', '.join(BENCHMARK_MASKS)}")
    ep = pad_nfunc(ep, BENCHMARK_NFUNC[name])
    if batch != 1:
        ep = ep.repeat(1, 1, _check_len("batch", batch, 1))
    return ep.to(device) if device is not None else ep


def benchmark_mask_mod(name: str, seqlen: int, *, seed: int = 0, device: DeviceLike = None) -> Callable:
    """The natural FlexAttention ``mask_mod(b, h, q_idx, kv_idx) -> bool`` of a benchmark mask.

    The same visible set as :func:`benchmark_mask` (same lengths, seed and scaling), written
    the way a PyTorch FlexAttention user would: ``q >= kv`` for causal, document ids for the
    document masks, an ancestor table for the trees, a global-token table for Longformer.
    Index tensors it closes over live on ``device``. It works on scalar index tensors (as
    ``flex_attention`` calls it) and on broadcasting ones (as :func:`from_mask_mod` does).

    Example::

        >>> mod = benchmark_mask_mod("local", 1024)
        >>> a = to_dense(from_mask_mod(mod, 1024), seqlen_k=1024)
        >>> torch.equal(a, to_dense(benchmark_mask("local", 1024), seqlen_k=1024))
        True
    """
    s = _check_len("seqlen", seqlen, 1)
    dev = torch.device(device) if device is not None else torch.device("cpu")
    if name == "causal":
        return lambda b, h, q, kv: q >= kv
    if name in ("local", "sink_local"):
        window = _scaled(512, s)
        if name == "local":
            return lambda b, h, q, kv: (q >= kv) & (q - kv <= window)
        return lambda b, h, q, kv: (q >= kv) & ((kv < 4) | (q - kv <= window))
    if name in ("document_causal", "hstu"):
        lo, hi = (4096, 16384) if name == "document_causal" else (8192, 16384)
        lengths = torch.as_tensor(random_document_lengths(s, _scaled(lo, s), _scaled(hi, s), seed))
        doc = _segment_ids(lengths).to(dev)
        if name == "document_causal":
            return lambda b, h, q, kv: (doc[q] == doc[kv]) & (q >= kv)
        starts = torch.cumsum(lengths, 0) - lengths
        ctx_end = (starts + lengths // 2)[_segment_ids(lengths)].to(dev)
        return lambda b, h, q, kv: (doc[q] == doc[kv]) & (q >= kv) & ((kv < ctx_end[q]) | (kv == q))
    if name in ("tree_dfs", "tree_bfs"):
        parent, lengths = binary_tree_layout(s, depth=7, order=name[-3:], jitter=0.2, seed=seed)
        n = len(parent)
        anc = torch.zeros(n, n, dtype=torch.bool)   # anc[x, y]: y is a strict ancestor of x
        for x in range(n):
            y = parent[x]
            while y != -1:
                anc[x, y] = True
                y = parent[y]
        node = _segment_ids(torch.as_tensor(lengths)).to(dev)
        anc = anc.to(dev)
        return lambda b, h, q, kv: anc[node[q], node[kv]] | ((node[q] == node[kv]) & (q >= kv))
    if name == "longformer":
        radius = _scaled(256, s)
        is_global = torch.zeros(s, dtype=torch.bool)
        is_global[[int(math.floor((i + 0.5) * s / 8)) for i in range(8)]] = True
        is_global = is_global.to(dev)
        return lambda b, h, q, kv: ((q - kv).abs() <= radius) | is_global[q] | is_global[kv]
    raise ValueError(f"unknown benchmark mask {name!r}; expected one of {', '.join(BENCHMARK_MASKS)}")


# ---------------------------------------------------------------------------
# Conversions
# ---------------------------------------------------------------------------


def _check_mask_func(mask_func: torch.Tensor, name: str = "mask_func") -> None:
    if not isinstance(mask_func, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(mask_func).__name__}")
    if mask_func.dim() != 3:
        raise ValueError(f"{name} must have shape [Hmask, nfunc, rows], got {tuple(mask_func.shape)}")
    if mask_func.dtype.is_floating_point or mask_func.dtype in (torch.bool, torch.complex64, torch.complex128):
        raise TypeError(f"{name} must be an integer tensor (int32), got {mask_func.dtype}")
    if mask_func.shape[1] % 2 != 1:
        raise ValueError(f"{name}: nfunc (dim 1) must be odd, got {mask_func.shape[1]}")


def _row_name(head: int, row: int, seqlen_q: Optional[int]) -> str:
    if seqlen_q:
        return f"head {head}, batch {row // seqlen_q}, query {row % seqlen_q} (row {row})"
    return f"head {head}, row {row}"


def pad_nfunc(mask_func: torch.Tensor, nfunc: int) -> torch.Tensor:
    """Widen ``mask_func`` to ``nfunc`` endpoints by repeating the last endpoint (empty
    intervals), or shrink it to ``nfunc`` via :func:`compact` when it has more.

    Raises:
        ValueError: ``nfunc`` even or not positive, or some row needs more than ``nfunc``.

    Example::

        >>> pad_nfunc(torch.tensor([[[1, 2]]], dtype=torch.int32), 3).tolist()
        [[[1, 2], [1, 2], [1, 2]]]
    """
    _check_mask_func(mask_func)
    nfunc = _check_len("nfunc", nfunc, 1)
    if nfunc % 2 != 1:
        raise ValueError(f"nfunc must be odd, got {nfunc}")
    n = mask_func.shape[1]
    if n > nfunc:
        return compact(mask_func, nfunc=nfunc)
    if n == nfunc:
        return mask_func
    last = mask_func[:, -1:, :].expand(-1, nfunc - n, -1)
    return torch.cat([mask_func, last], dim=1).contiguous()


def compact(mask_func: torch.Tensor, nfunc: Optional[int] = None, *, seqlen_q: Optional[int] = None) -> torch.Tensor:
    """Canonical form with the fewest endpoints: drops empty intervals and merges touching
    ones. The visible set of every row is unchanged.

    Visibility flips at every endpoint (it starts visible at key 0), so a key position that
    occurs an even number of times in a row cancels out; the canonical endpoints are the
    positions occurring an odd number of times.

    Args:
        mask_func: int ``[Hmask, n, rows]``, rows nondecreasing.
        nfunc: pad the result to this odd width (error if some row needs more).
        seqlen_q: only used to name ``batch, query`` in error messages.

    Returns:
        int32 ``[Hmask, nfunc or minimal, rows]`` on the device of ``mask_func``.

    Example::

        >>> compact(torch.tensor([[[0], [0], [3]]], dtype=torch.int32)).tolist()
        [[[3]]]
    """
    _check_mask_func(mask_func)
    v = mask_func.to(torch.int64)
    n = v.shape[1]
    if n > 1 and bool((v[:, 1:] < v[:, :-1]).any()):
        bad = torch.nonzero((v[:, 1:] < v[:, :-1]).any(dim=1))[0]
        raise ValueError(f"mask_func endpoints must be nondecreasing; "
                         f"{_row_name(int(bad[0]), int(bad[1]), seqlen_q)} is not")
    idx = torch.arange(n, device=v.device).view(1, n, 1)
    is_start = torch.ones_like(v, dtype=torch.bool)
    is_start[:, 1:] = v[:, 1:] != v[:, :-1]
    start_pos = torch.where(is_start, idx.expand_as(v), torch.full_like(v, n))
    # next_start[j] = first group start after j (reverse running minimum).
    shifted = torch.cat([start_pos[:, 1:], torch.full_like(start_pos[:, :1], n)], dim=1)
    next_start = torch.flip(torch.cummin(torch.flip(shifted, [1]), dim=1).values, [1])
    keep = is_start & (((next_start - idx) % 2) == 1)
    counts = keep.sum(dim=1)
    width = _check_fit(counts, nfunc, seqlen_q)
    # Gather kept positions to the front of each row (stable order), then pad.
    order = torch.argsort(torch.where(keep, idx, idx + n), dim=1)
    values = torch.gather(v, 1, order)[:, :max(int(counts.max()) if counts.numel() else 1, 1)]
    return _pad_toggles(values, counts, width)


def _dense_toggles(m: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """bool [H, rows, Sk] -> (int64 endpoints [H, need, rows] unpadded, int64 counts [H, rows]).

    A row's endpoints are the key positions p in [0, Sk] where visibility changes, reading
    the row as visible before key 0 and invisible after key Sk-1; their count is odd.
    """
    h, rows, sk = m.shape
    edge = torch.ones(h, rows, 1, dtype=torch.bool, device=m.device)
    ext = torch.cat([edge, m, ~edge], dim=2)
    change = ext[:, :, 1:] != ext[:, :, :-1]                    # [H, rows, Sk+1]
    counts = change.sum(dim=2)
    need = int(counts.max()) if counts.numel() else 1
    slot = torch.cumsum(change.to(torch.int32), dim=2) - 1      # toggles before it in the row
    out = torch.zeros(h, rows, need, dtype=torch.int64, device=m.device)
    hh, rr, pp = torch.nonzero(change, as_tuple=True)
    out[hh, rr, slot[hh, rr, pp].long()] = pp
    return out.permute(0, 2, 1), counts


def _pad_toggles(values: torch.Tensor, counts: torch.Tensor, width: int) -> torch.Tensor:
    """[H, need, rows] with counts[h, r] valid entries -> int32 [H, width, rows], the tail
    of each row repeating its last valid endpoint."""
    last = torch.gather(values, 1, (counts - 1).clamp(min=0).unsqueeze(1))
    slot = torch.arange(values.shape[1], device=values.device).view(1, -1, 1)
    values = torch.where(slot < counts.unsqueeze(1), values, last)
    if values.shape[1] < width:
        values = torch.cat([values, last.expand(-1, width - values.shape[1], -1)], dim=1)
    return values.to(torch.int32).contiguous()


def _check_fit(counts: torch.Tensor, nfunc: Optional[int], seqlen_q: Optional[int],
               row_offset: int = 0, head_offset: int = 0, what: str = "mask") -> int:
    """The endpoint width to use: ``nfunc`` if given (validated and checked to fit), else the need."""
    need = int(counts.max()) if counts.numel() else 1
    if nfunc is None:
        return need
    nfunc = _check_len("nfunc", nfunc, 1)
    if nfunc % 2 != 1:
        raise ValueError(f"nfunc must be odd, got {nfunc}")
    if need > nfunc:
        bad = torch.nonzero(counts > nfunc)[0]
        h, r = int(bad[0]), int(bad[1])
        raise ValueError(
            f"{what}: {_row_name(h + head_offset, r + row_offset, seqlen_q)} needs "
            f"{int(counts[h, r])} endpoints, more than the nfunc={nfunc} allowed")
    return nfunc


def from_dense(mask: torch.Tensor, nfunc: Optional[int] = None, *, seqlen_q: Optional[int] = None,
               device: DeviceLike = None) -> torch.Tensor:
    """Converts a dense Boolean mask into the fewest endpoints.

    Each row's run-length encoding of visible keys gives its endpoints: the positions where
    visibility changes, starting from "visible" before key 0 and ending "invisible" after
    the last key, so their count is always odd.

    Args:
        mask: bool ``[rows, Sk]`` or ``[H, rows, Sk]`` (True = visible). For a batch, stack
            the samples' rows batch-major (``rows = B * Sq``).
        nfunc: the odd number of endpoints wanted; default the smallest that fits all rows.
        seqlen_q: ``Sq`` per sample, only to name ``batch, query`` in error messages.
        device: device of the result (default: that of ``mask``).

    Returns:
        int32 ``[H or 1, nfunc, rows]``.

    Raises:
        TypeError: ``mask`` is not a bool tensor.
        ValueError: a row needs more endpoints than ``nfunc`` (the message names it),
            ``nfunc`` even or not positive, or a bad shape.

    Example::

        >>> from_dense(torch.tensor([[1, 0, 1, 1]], dtype=torch.bool)).tolist()
        [[[1], [2], [4]]]
    """
    if not isinstance(mask, torch.Tensor):
        raise TypeError(f"mask must be a torch.Tensor, got {type(mask).__name__}")
    if mask.dtype != torch.bool:
        # An int or float tensor is ambiguous (0/1 visibility? additive -inf biases, where
        # 0 means visible?); converting it silently would invert the latter.
        raise TypeError(f"mask must be a bool tensor (True = visible), got dtype {mask.dtype}; "
                        "convert explicitly, e.g. mask != 0 or mask == 0 for an additive bias")
    if mask.dim() == 2:
        mask = mask.unsqueeze(0)
    if mask.dim() != 3:
        raise ValueError(f"mask must be [rows, Sk] or [H, rows, Sk], got shape {tuple(mask.shape)}")
    values, counts = _dense_toggles(mask)
    width = _check_fit(counts, nfunc, seqlen_q)
    result = _pad_toggles(values, counts, width)
    return result.to(device) if device is not None else result


def from_mask_mod(mask_mod: Callable, seqlen_q: int, seqlen_k: Optional[int] = None, nfunc: Optional[int] = None,
                  *, batch: int = 1, heads: int = 1, device: DeviceLike = None,
                  chunk_elements: int = 1 << 24) -> torch.Tensor:
    """Converts a FlexAttention-style ``mask_mod(b, h, q_idx, kv_idx) -> bool`` into the
    fewest endpoints.

    ``mask_mod`` is called with int64 tensors that broadcast: ``b`` and ``h`` 0-d,
    ``q_idx`` of shape ``[rows, 1]`` and ``kv_idx`` of shape ``[1, Sk]``; it must return a
    Boolean tensor broadcastable to ``[rows, Sk]`` (elementwise torch code, as for
    ``torch.nn.attention.flex_attention``). Rows are evaluated in chunks of about
    ``chunk_elements`` elements, so memory stays bounded for long sequences (the cost is
    still ``O(B * H * Sq * Sk)``).

    Args:
        mask_mod: the predicate.
        seqlen_q, seqlen_k: per-sample lengths (``Sk`` defaults to ``Sq``).
        nfunc: odd endpoint count wanted; default the smallest that fits.
        batch: samples; heads: mask heads (use 1 when the mask ignores ``h``).
        device: where ``mask_mod`` is evaluated and the result lives (default CPU).
        chunk_elements: rows per evaluation ~ ``chunk_elements / Sk``.

    Returns:
        int32 ``[heads, nfunc, batch * Sq]``.

    Raises:
        TypeError: ``mask_mod`` returns a tensor that is not bool (an additive 0 / -inf mask
            would otherwise be read inverted), as :func:`from_dense` refuses one.
        ValueError: as :func:`from_dense`, naming the (head, batch, query) that does not fit.

    Example::

        >>> from_mask_mod(lambda b, h, q, kv: kv <= q, 3).tolist()
        [[[1, 2, 3]]]
    """
    sq = _check_len("seqlen_q", seqlen_q, 1)
    sk = sq if seqlen_k is None else _check_len("seqlen_k", seqlen_k)
    batch = _check_len("batch", batch, 1)
    heads = _check_len("heads", heads, 1)
    chunk_elements = _check_len("chunk_elements", chunk_elements, 1)
    if nfunc is not None:
        _check_fit(torch.ones(1, 1, dtype=torch.int64), nfunc, sq)
    dev = torch.device(device) if device is not None else torch.device("cpu")
    rows_per_chunk = max(1, chunk_elements // max(sk, 1))
    kv = torch.arange(sk, device=dev).view(1, sk)
    chunks = []  # (values [1, need, rows], counts [1, rows]) in (head, batch, q) order
    for h in range(heads):
        h_t = torch.tensor(h, device=dev)
        for b in range(batch):
            b_t = torch.tensor(b, device=dev)
            for q0 in range(0, sq, rows_per_chunk):
                q1 = min(sq, q0 + rows_per_chunk)
                q_idx = torch.arange(q0, q1, device=dev).view(-1, 1)
                dense = torch.as_tensor(mask_mod(b_t, h_t, q_idx, kv), device=dev)
                if dense.dtype != torch.bool:
                    # bool() of an additive mask (0 visible, -inf hidden) is its inverse: refuse,
                    # as from_dense does, instead of converting silently.
                    raise TypeError(
                        f"mask_mod: must return a bool tensor (True = visible), got dtype {dense.dtype}; "
                        "convert explicitly, e.g. (x != 0) for a 0/1 mask or (x == 0) for an additive "
                        "bias (0 visible, -inf hidden)"
                    )
                dense = torch.broadcast_to(dense, (q1 - q0, sk))
                values, counts = _dense_toggles(dense.unsqueeze(0))
                _check_fit(counts, nfunc, sq, row_offset=b * sq + q0, head_offset=h, what="mask_mod")
                chunks.append((values, counts))
    width = nfunc if nfunc is not None else max(int(c.max()) if c.numel() else 1 for _, c in chunks)
    padded = [_pad_toggles(v, c, width) for v, c in chunks]
    per_head = len(padded) // heads
    out = torch.cat([torch.cat(padded[i * per_head:(i + 1) * per_head], dim=2) for i in range(heads)], dim=0)
    return out.contiguous()


def to_dense(mask_func: torch.Tensor, seqlen_q: Optional[int] = None, seqlen_k: Optional[int] = None) -> torch.Tensor:
    """Dense Boolean mask of ``mask_func`` (for tests and small sequences).

    Key ``k`` of a row is visible iff an even number of the row's endpoints are ``<= k``.

    Args:
        mask_func: int ``[Hmask, nfunc, rows]``.
        seqlen_q: ``Sq``; when given the result is ``[Hmask, B, Sq, Sk]`` instead of
            ``[Hmask, rows, Sk]``.
        seqlen_k: ``Sk``; default the largest endpoint.

    Returns:
        bool ``[Hmask, rows, Sk]`` (or ``[Hmask, B, Sq, Sk]``).

    Example::

        >>> to_dense(torch.tensor([[[1], [2], [4]]]), seqlen_k=4).int().tolist()
        [[[1, 0, 1, 1]]]
    """
    _check_mask_func(mask_func)
    v = mask_func.to(torch.int64)
    h, _, rows = v.shape
    if seqlen_k is None:
        sk = int(v.max()) if v.numel() else 0
    else:
        sk = _check_len("seqlen_k", seqlen_k)
    if sk == 0 or rows == 0:
        dense = torch.zeros(h, rows, sk, dtype=torch.bool, device=v.device)
    else:
        rows_first = v.permute(0, 2, 1).contiguous()            # [H, rows, n]
        keys = torch.arange(sk, device=v.device).view(1, 1, sk).expand(h, rows, sk).contiguous()
        count = torch.searchsorted(rows_first, keys, right=True)  # endpoints <= k
        dense = (count % 2) == 0
    if seqlen_q is not None:
        seqlen_q = _check_len("seqlen_q", seqlen_q, 1)
        if rows % seqlen_q:
            raise ValueError(f"rows={rows} is not a multiple of seqlen_q={seqlen_q}")
        dense = dense.view(h, rows // seqlen_q, seqlen_q, sk)
    return dense


def visible_pairs(mask_func: torch.Tensor, *, per_head: bool = False) -> Union[int, torch.Tensor]:
    """Number of visible (query, key) pairs: ``sum over rows of F0 + (F2 - F1) + (F4 - F3) + ...``
    (endpoints are assumed valid: nondecreasing, within ``[0, Sk]``).

    For FLOP counts with ``Hmask = 1`` and ``Hq`` query heads, multiply by ``Hq``.

    Returns:
        a Python int summed over mask heads, or int64 ``[Hmask]`` with ``per_head=True``.

    Example::

        >>> visible_pairs(causal(4))
        10
    """
    _check_mask_func(mask_func)
    per_head = check_flag("per_head", per_head)
    v = mask_func.to(torch.int64)
    sign = torch.ones(v.shape[1], dtype=torch.int64, device=v.device)
    sign[1::2] = -1
    per = (v * sign.view(1, -1, 1)).sum(dim=(1, 2))
    return per if per_head else int(per.sum())


def density(mask_func: torch.Tensor, seqlen_k: int) -> float:
    """Fraction of visible pairs: ``visible_pairs / (Hmask * rows * Sk)``.

    Example::

        >>> density(causal(4), 4)
        0.625
    """
    _check_mask_func(mask_func)
    h, _, rows = mask_func.shape
    return visible_pairs(mask_func) / float(h * rows * _check_len("seqlen_k", seqlen_k, 1))


# ---------------------------------------------------------------------------
# Error messages name the builder
# ---------------------------------------------------------------------------


def _name_errors(fn: Callable) -> Callable:
    """``fn`` with its TypeError / ValueError messages prefixed ``masks.<name>: `` (as flex's and the SDPA ops'
    messages start with the call's name); a builder called by another is renamed to the outer one, the call the
    user made. The exception's type and traceback are kept; ``help()`` and ``inspect.signature`` see ``fn``'s
    signature (functools.wraps)."""

    prefix = f"masks.{fn.__name__}: "

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except (TypeError, ValueError) as e:
            if e.args and isinstance(e.args[0], str):
                msg = e.args[0]
                if msg.startswith("masks.") and ": " in msg:
                    msg = msg.split(": ", 1)[1]
                e.args = (prefix + msg,) + e.args[1:]
            raise

    return wrapper


for _name in __all__:
    if callable(globals()[_name]):
        globals()[_name] = _name_errors(globals()[_name])
del _name
