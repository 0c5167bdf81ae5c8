"""Random SDPA problems for the tests: padded float64 truth (sdpa_ref.Case) plus the same values laid out the
way flashspan.sdpa takes them (BHSD, BSHD, strided, THD packed or partially packed), padding poisoned with NaN."""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Optional

import torch

import sdpa_ref

DTYPES = {"float64": torch.float64, "bfloat16": torch.bfloat16, "float16": torch.float16}


def tolerance(dtype: torch.dtype) -> float:
    return {torch.float64: 2e-5, torch.float32: 1e-4, torch.bfloat16: 3e-2, torch.float16: 6e-3}[dtype]


def assert_close(got: torch.Tensor, want: torch.Tensor, dtype: torch.dtype, what: str, terms: int = 1) -> None:
    """|got - want| <= tol * sqrt(terms) * (1 + |want|max) elementwise, NaN/inf matched exactly; `terms` is the
    number of rounded contributions summed into each element (reductions such as dBias, dSink)."""
    got = got.detach().to(torch.float64)
    want = want.detach().to(torch.float64)
    assert got.shape == want.shape, f"{what}: shape {tuple(got.shape)} vs {tuple(want.shape)}"
    nan_g, nan_w = torch.isnan(got), torch.isnan(want)
    assert torch.equal(nan_g, nan_w), f"{what}: NaN at {torch.nonzero(nan_g ^ nan_w)[:5].tolist()}"
    inf_w = torch.isinf(want)
    assert torch.equal(got[inf_w], want[inf_w]), f"{what}: infinities differ"
    ok = ~(nan_w | inf_w)
    if not ok.any():
        return
    g, w = got[ok], want[ok]
    scale = 1.0 + w.abs().max().item()
    err = (g - w).abs().max().item()
    tol = tolerance(dtype) * scale * max(1.0, terms) ** 0.5
    assert err <= tol, f"{what}: max error {err:.3e} > {tol:.3e} (dtype {dtype})"


@dataclass
class Problem:
    """A random problem: the oracle case, the flashspan.sdpa arguments and the packing of each tensor."""

    case: sdpa_ref.Case
    dtype: torch.dtype
    args: dict  # keyword arguments of flashspan.sdpa (q, k, v given separately)
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    thd_q: bool
    thd_kv: bool
    offsets_q: Optional[list]  # token offset of each sample (THD)
    offsets_kv: Optional[list]
    grad_inputs: dict = field(default_factory=dict)  # name -> leaf tensor (bias, sink_token, gate)
    paged: bool = False
    backward_ok: bool = True


def _round(x: torch.Tensor, dtype) -> torch.Tensor:
    return x.to(dtype).to(torch.float64)


def _layout_dense(x: torch.Tensor, kind: str) -> torch.Tensor:
    """x [B,H,S,D] in a memory layout: bhsd, bshd, or strided (padded rows in D and S)."""
    B, H, S, D = x.shape
    if kind == "bhsd":
        return x.contiguous()
    if kind == "bshd":
        return x.transpose(1, 2).contiguous().transpose(1, 2)
    base = torch.full((H, B, S + 3, D + 8), float("nan"), dtype=x.dtype)
    view = base[:, :, 1 : S + 1, :D].permute(1, 0, 2, 3)
    view.copy_(x)
    return view


def _pack(x: torch.Tensor, lens: list, gaps: bool, rng: random.Random):
    """x [B,H,S,D] -> packed (T,H,D) holding the valid rows of every sample (NaN gaps when `gaps`); offsets."""
    B, H, S, D = x.shape
    offsets, pos = [], 0
    for b in range(B):
        pos += rng.randint(0, 2) if gaps else 0
        offsets.append(pos)
        pos += lens[b]
    T = pos + (rng.randint(0, 2) if gaps else 0)
    out = torch.full((T, H, D), float("nan"), dtype=x.dtype)
    for b in range(B):
        out[offsets[b] : offsets[b] + lens[b]] = x[b, :, : lens[b]].transpose(0, 1)
    offsets.append(pos)
    return out, offsets


def _poison_padding(x: torch.Tensor, lens: list) -> torch.Tensor:
    """NaN in the rows past each sample's length (x [B,H,S,D] float64, a copy)."""
    x = x.clone()
    for b, n in enumerate(lens):
        x[b, :, n:] = float("nan")
    return x


def random_problem(seed: int, *, dtype=None, allow_dropout=True, allow_paged=False, big=False) -> Problem:
    rng = random.Random(seed)
    g = torch.Generator().manual_seed(seed)
    dtype = dtype or DTYPES[rng.choice(["float64", "float64", "bfloat16", "float16"])]
    B = rng.randint(1, 3)
    hk = rng.choice([1, 2])
    group = rng.choice([1, 2, 3])
    hq = hk * group
    hv = rng.choice([d for d in range(1, hq + 1) if hq % d == 0])
    dqk = rng.choice([8, 16, 24, 32])
    dv = rng.choice([8, 16, 32, dqk])
    sq = rng.randint(1, 150 if big else 20)
    skv = rng.randint(1, 270 if big else 24)
    if big:
        dqk, dv, hq, hk, hv, B = 8, 8, rng.choice([1, 2]), 1, 1, rng.randint(1, 2)
    thd_q = rng.random() < 0.3
    thd_kv = rng.random() < 0.3
    padding = thd_q or thd_kv or rng.random() < 0.4
    len_q = [rng.randint(0, sq) for _ in range(B)] if padding else [sq] * B
    len_kv = [rng.randint(0, skv) for _ in range(B)] if padding else [skv] * B
    if padding and rng.random() < 0.5:  # mostly non-empty samples
        len_q = [max(1, n) for n in len_q]
        len_kv = [max(1, n) for n in len_kv]

    qf = _round(torch.randn(B, hq, sq, dqk, generator=g, dtype=torch.float64), dtype)
    kf = _round(torch.randn(B, hk, skv, dqk, generator=g, dtype=torch.float64), dtype)
    vf = _round(torch.randn(B, hv, skv, dv, generator=g, dtype=torch.float64), dtype)
    case = sdpa_ref.Case(q=qf, k=kf, v=vf, len_q=len_q, len_kv=len_kv)
    args: dict = {}
    scale = rng.choice([0.125, 0.25, 0.5, 1.0 / 4.0])
    case.scale = scale
    if rng.random() < 0.3:
        args["attn_scale"] = torch.tensor([scale], dtype=torch.float32)
    else:
        args["attn_scale"] = scale

    # masks
    kind = rng.choice(["none", "causal", "causal", "band", "left", "right"])
    br = rng.random() < 0.4
    if kind == "causal":
        case.right = 0
    elif kind == "band":
        case.left, case.right = rng.randint(1, 6), rng.randint(0, 4)
    elif kind == "left":
        case.left = rng.randint(1, 8)
    elif kind == "right":
        case.right = rng.randint(1, 5)
    case.bottom_right = br and kind != "none"
    if case.bottom_right:
        args["diagonal_alignment"] = "BOTTOM_RIGHT"
    spelling = rng.random()
    if kind == "causal" and spelling < 0.3:
        args["use_causal_mask_bottom_right" if case.bottom_right else "use_causal_mask"] = True
        args.pop("diagonal_alignment", None)
    else:
        if case.right is not None:
            args["diagonal_band_right_bound"] = case.right
        if case.left is not None:
            if spelling > 0.8:
                args["sliding_window_length"] = case.left
            else:
                args["diagonal_band_left_bound"] = case.left

    # score modifiers
    grad_inputs = {}
    if rng.random() < 0.35:
        shape = [rng.choice([1, B]), rng.choice([1, hq]), rng.choice([1, sq]), rng.choice([1, skv])]
        bdt = rng.choice([dtype, torch.float32]) if dtype != torch.float64 else torch.float64
        bias = _round(torch.randn(*shape, generator=g, dtype=torch.float64), bdt)
        case.bias = bias
        grad_inputs["bias"] = bias.to(bdt)
    if case.right == 0 and rng.random() < 0.3:
        case.alibi = True
        args["use_alibi_mask"] = True
    if rng.random() < 0.25:
        case.softcap = rng.choice([2.0, 5.0])
        args["softcap"] = case.softcap
    if rng.random() < 0.25:
        sinks = torch.randn(hq, generator=g, dtype=torch.float64).to(torch.float32).to(torch.float64)
        case.sinks = sinks
        grad_inputs["sink_token"] = sinks.to(torch.float32)
    if rng.random() < 0.2:
        gate = _round(torch.randn(B, hq, sq, dv, generator=g, dtype=torch.float64), dtype)
        case.gate = gate
        grad_inputs["gate"] = gate
    if rng.random() < 0.15:
        nq, nk = (sq + 127) // 128, ((skv + 127) // 128 + 7) // 8
        bm = torch.randint(0, 256, (rng.choice([1, B]), rng.choice([1, hq]), nq, nk), generator=g, dtype=torch.uint8)
        if rng.random() < 0.5:
            bm |= 1  # keep the first tile mostly visible
        case.block_mask = bm
        args["block_mask"] = bm

    # dropout
    if allow_dropout:
        r = rng.random()
        if r < 0.2:
            case.dropout_p = rng.choice([0.1, 0.3, 0.5])
            case.seed = rng.randint(-(2**40), 2**40)
            case.offset = rng.randint(0, 2**33)
            sd = rng.choice([torch.int64, torch.int32]) if -(2**31) <= case.seed < 2**31 and case.offset < 2**31 \
                else torch.int64
            args["dropout"] = (case.dropout_p, torch.tensor([case.seed], dtype=sd), torch.tensor([case.offset], dtype=sd))
        elif r < 0.3:
            shape = [rng.choice([1, B]), rng.choice([1, hq]), rng.choice([1, sq]), rng.choice([1, skv])]
            mask = (torch.rand(*shape, generator=g) > 0.3).to(torch.uint8)
            case.dropout_mask = mask
            case.dropout_scale = 1.0 / 0.7
            args["dropout"] = (mask, torch.tensor([1.0 / 0.7], dtype=torch.float32))
            case.dropout_scale = float(torch.tensor(1.0 / 0.7, dtype=torch.float32))

    # lengths
    offsets_q = offsets_kv = None
    if padding:
        args["use_padding_mask"] = True
        for side, lens, thd in (("q", len_q, thd_q), ("kv", len_kv, thd_kv)):
            use_cu = thd or rng.random() < 0.5
            if use_cu:
                cu = [0]
                for n in lens:
                    cu.append(cu[-1] + n)
                args[f"cu_seq_len_{side}"] = torch.tensor(cu, dtype=rng.choice([torch.int32, torch.int64]))
            else:
                args[f"seq_len_{side}"] = torch.tensor(lens, dtype=rng.choice([torch.int32, torch.int64])).view(B, 1, 1, 1)

    # tensors in their layouts
    ragged = {}
    if thd_q:
        gaps = rng.random() < 0.4
        q, offsets_q = _pack(qf.to(dtype), len_q, gaps, rng)
        if gaps:
            ragged["q"] = torch.tensor(offsets_q, dtype=torch.int64)
        args["max_seq_len_q"] = sq
        if case.gate is not None:
            gp, goff = _pack(case.gate.to(dtype), len_q, False, rng)
            grad_inputs["gate"] = gp
            ragged["gate"] = torch.tensor(goff, dtype=torch.int64)
    else:
        q = _layout_dense(_poison_padding(qf, len_q).to(dtype), rng.choice(["bhsd", "bshd", "strided"]))
        if case.gate is not None:
            grad_inputs["gate"] = _layout_dense(_poison_padding(case.gate, len_q).to(dtype), rng.choice(["bhsd", "bshd"]))
    if thd_kv:
        gaps = rng.random() < 0.4
        k, offsets_kv = _pack(kf.to(dtype), len_kv, gaps, rng)
        v, voff = _pack(vf.to(dtype), len_kv, gaps, random.Random(seed + 7) if gaps else rng)
        if gaps:
            ragged["k"] = torch.tensor(offsets_kv, dtype=torch.int64)
            ragged["v"] = torch.tensor(voff, dtype=torch.int64)
        elif voff != offsets_kv:
            raise AssertionError("packing without gaps must give equal offsets")
        args["max_seq_len_kv"] = skv
    else:
        k = _layout_dense(_poison_padding(kf, len_kv).to(dtype), rng.choice(["bhsd", "bshd", "strided"]))
        v = _layout_dense(_poison_padding(vf, len_kv).to(dtype), rng.choice(["bhsd", "bshd", "strided"]))
    if ragged:
        args["ragged_offsets"] = ragged
    if "bias" in grad_inputs:
        args["bias"] = grad_inputs["bias"]
    if "sink_token" in grad_inputs:
        args["sink_token"] = grad_inputs["sink_token"]
    if "gate" in grad_inputs:
        args["gate"] = grad_inputs["gate"]
    return Problem(case=case, dtype=dtype, args=args, q=q, k=k, v=v, thd_q=thd_q, thd_kv=thd_kv,
                   offsets_q=offsets_q, offsets_kv=offsets_kv, grad_inputs=grad_inputs)


def unpack(p: Problem, t: torch.Tensor, side: str, thd: bool, offsets=None) -> torch.Tensor:
    """A flashspan output / gradient -> padded float64 [B, H, S, D] (padding rows NaN for THD)."""
    c = p.case
    lens = c.len_q if side == "q" else c.len_kv
    S = c.q.shape[2] if side == "q" else c.k.shape[2]
    if not thd:
        return t.detach().to(torch.float64)
    offsets = offsets if offsets is not None else (p.offsets_q if side == "q" else p.offsets_kv)
    B = len(lens)
    H, D = t.shape[1], t.shape[2]
    out = torch.full((B, H, S, D), float("nan"), dtype=torch.float64)
    for b in range(B):
        out[b, :, : lens[b]] = t[offsets[b] : offsets[b] + lens[b]].detach().to(torch.float64).transpose(0, 1)
    return out


def valid_rows(x: torch.Tensor, lens: list) -> torch.Tensor:
    """Rows past each sample's length set to 0 (for comparisons on valid rows only)."""
    x = x.clone()
    for b, n in enumerate(lens):
        x[b, :, n:] = 0
    return x


def mask_problem(seed: int, dtype=None, big=False) -> Problem:
    """random_problem restricted to the pure-mask subset (H_k = H_v, no score modifier, dropout, block mask or gate)
    in float32 / bf16 / fp16; packed V at K's token offsets. (The subset and these draws are those the retired flex
    route of flashspan.sdpa ran, which needed V packed like K; the seeds stay, so the GPU comparisons that draw from
    here run the configurations of their earlier GPU runs.)"""
    rng = random.Random(seed)
    dtype = dtype or rng.choice((torch.float32, torch.bfloat16, torch.float16))
    for attempt in range(100):
        p = random_problem(seed * 101 + attempt, dtype=dtype, allow_dropout=False, big=big)
        if p.case.v.shape[1] == p.case.k.shape[1]:
            break
    c = p.case
    c.bias, c.alibi, c.softcap, c.sinks, c.gate, c.block_mask = None, False, None, None, None, None
    for name in ("bias", "use_alibi_mask", "softcap", "sink_token", "gate", "block_mask"):
        p.args.pop(name, None)
    p.grad_inputs = {}
    ragged = p.args.get("ragged_offsets")
    if ragged is not None:
        ragged.pop("gate", None)
        if "k" in ragged:  # V packed at K's offsets
            v = torch.full((p.k.shape[0], p.v.shape[1], p.v.shape[2]), float("nan"), dtype=dtype)
            for b, n in enumerate(c.len_kv):
                v[p.offsets_kv[b] : p.offsets_kv[b] + n] = c.v[b, :, :n].transpose(0, 1).to(dtype)
            p.v = v
            ragged["v"] = ragged["k"]
        if not ragged:
            p.args.pop("ragged_offsets")
    return p


def sample_rows(offsets, lens) -> torch.Tensor:
    """Token indices of the samples of a packed tensor (sample b: ``lens[b]`` tokens from ``offsets[b]``)."""
    return torch.cat([torch.arange(offsets[b], offsets[b] + n) for b, n in enumerate(lens)] + [torch.arange(0)])
