"""flashspan.sdpa / sdpa_backward on CPU tensors (the CPU reference) against the independent float64 oracle
(sdpa_ref.py): random combinations of every feature, forward and backward, plus focused tests."""

import math

import pytest
import torch

import sdpa_ref
from sdpa_cases import assert_close, random_problem, unpack, valid_rows

NUM_RANDOM = 300


def _run(fs, p, *, grads=True):
    """flashspan forward (+ backward through autograd) and the oracle's, compared."""
    c = p.case
    leaves = {"q": p.q, "k": p.k, "v": p.v, **p.grad_inputs}
    ours_in = {n: t.detach().clone().requires_grad_(grads) for n, t in leaves.items()}
    # clone() keeps NaN padding; strided layouts become compact, which is also a valid layout.
    if not grads:
        ours_in = {n: t.detach() for n, t in leaves.items()}
    args = dict(p.args)
    for n in ("bias", "sink_token", "gate"):
        if n in args:
            args[n] = ours_in[n]
    o, stats = fs.sdpa(ours_in["q"], ours_in["k"], ours_in["v"], generate_stats=True, **args)

    ref_in = {"q": c.q, "k": c.k, "v": c.v, "bias": c.bias, "sink_token": c.sinks, "gate": c.gate}
    ref_in = {n: (None if t is None else t.clone().requires_grad_(grads)) for n, t in ref_in.items()}
    out = sdpa_ref.forward(c, ref_in["q"], ref_in["k"], ref_in["v"], ref_in["bias"], ref_in["sink_token"],
                           ref_in["gate"])
    lq = c.len_q
    got_o = unpack(p, o, "q", p.thd_q)
    assert_close(valid_rows(got_o, lq), valid_rows(out["o"], lq), p.dtype, "o")
    got_lse = unpack(p, stats, "q", p.thd_q)[..., 0]
    want_lse = out["lse"].clone()
    for b, n in enumerate(lq):
        want_lse[b, :, n:] = 0
        got_lse[b, :, n:] = 0
    assert_close(got_lse, want_lse, torch.float32 if p.dtype != torch.float64 else torch.float64, "stats")
    if not p.thd_q:  # padding rows of padded outputs
        for b, n in enumerate(lq):
            assert torch.all(o[b, :, n:] == 0), "o: padding rows must be 0"
            assert torch.all(stats[b, :, n:] == -math.inf), "stats: padding rows must be -inf"
    if not grads:
        return
    g = torch.Generator().manual_seed(1234)
    do_pad = torch.randn(out["o"].shape, generator=g, dtype=torch.float64).to(p.dtype).to(torch.float64)
    do_pad = valid_rows(do_pad, lq)
    if p.thd_q:
        do = torch.zeros_like(o)
        for b, n in enumerate(lq):
            do[p.offsets_q[b] : p.offsets_q[b] + n] = do_pad[b, :, :n].transpose(0, 1).to(o.dtype)
    else:
        do = do_pad.to(o.dtype).clone()
        for b, n in enumerate(lq):
            do[b, :, n:] = float("nan")  # padding rows of dO are never read
    names = list(ours_in)
    got = torch.autograd.grad(o, [ours_in[n] for n in names], do)
    want = torch.autograd.grad(out["o"], [ref_in[n] for n in names], do_pad)
    for n, gt, wt in zip(names, got, want):
        if n in ("q", "k", "v", "gate"):
            side = "q" if n in ("q", "gate") else "kv"
            lens = lq if side == "q" else c.len_kv
            gt = unpack(p, gt, side, p.thd_q if side == "q" else p.thd_kv, _offsets(p, n))
            gt, wt = valid_rows(gt, lens), valid_rows(wt, lens)
        terms = 1
        if n == "sink_token":
            gt = gt.reshape(-1)
            terms = len(lq) * max(lq)
        elif n == "bias":
            terms = out["o"].numel() // out["o"].shape[-1] * c.k.shape[2] // wt.numel()
        assert_close(gt, wt, p.dtype, f"d{n}", terms)


def _offsets(p, name):
    """Token offsets of a packed tensor (its ragged offsets when given, else the side's packing)."""
    ragged = p.args.get("ragged_offsets", {})
    if name in ragged:
        return ragged[name].tolist()
    return p.offsets_q if name in ("q", "gate") else p.offsets_kv


@pytest.mark.parametrize("seed", range(NUM_RANDOM))
def test_random_forward_backward(fs, seed):
    _run(fs, random_problem(seed))


@pytest.mark.parametrize("seed", range(6))
def test_random_long_sequences_block_mask_tiles(fs, seed):
    # S > 128 so the 128x128 block mask has several tiles per sample.
    _run(fs, random_problem(10_000 + seed, big=True, dtype=torch.float64))


def test_compute_data_type_spellings():
    """compute_data_type takes the seed's FLOAT / NOT_SET and torch.float32 (all float32 compute); anything else is
    refused by name."""
    import flashspan

    q = torch.randn(1, 1, 16, 16, dtype=torch.bfloat16)
    want = flashspan.sdpa(q, q, q)[0]
    for cdt in ("FLOAT", "NOT_SET", torch.float32):
        assert torch.equal(flashspan.sdpa(q, q, q, compute_data_type=cdt)[0], want)
    with pytest.raises(ValueError, match="^compute_data_type: .*got torch.float16"):
        flashspan.sdpa(q, q, q, compute_data_type=torch.float16)
