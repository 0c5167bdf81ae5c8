"""SDPA features of issue 14 on CPU tensors that the random forward/backward test (test_sdpa_cpu.py) does not read
back: base-2 stats, row max / sum of exp and per-head max logit outputs, rng_dump, paged K/V (prefill and decode,
sub-page sequences, packed page tables, poisoned unused pages), fully masked rows, gradients' padding rows on
poisoned memory, the deterministic backward, and finite differences in float64 through flashspan.sdpa's autograd
for every differentiable input (q, k, v, bias, sinks, gate) with every score modifier."""

import math
import random

import pytest
import torch

import sdpa_ref
from conftest import uninitialized_memory_poisoned
from sdpa_cases import assert_close, random_problem, unpack, valid_rows

LOG2E = 1.0 / math.log(2.0)


def _oracle(p):
    c = p.case
    return sdpa_ref.forward(c, c.q, c.k, c.v, c.bias, c.sinks, c.gate)


# ---------------------------------------------------------------------------
# Statistics outputs
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(40))
def test_row_statistics_and_max_logit(fs, seed):
    p = random_problem(50_000 + seed)
    c = p.case
    B, Hq, Sq = c.q.shape[:3]
    score_max = torch.full((B, Hq, Sq, 1), float("nan"))
    sum_exp = torch.full((B, Hq, Sq, 1), float("nan"))
    max_logit = torch.full((Hq,), float("nan"))
    with torch.no_grad():
        o, stats = fs.sdpa(p.q, p.k, p.v, generate_stats=True, score_max=score_max, score_sum_exp=sum_exp,
                           max_logit=max_logit, **p.args)
        o2, stats2 = fs.sdpa(p.q, p.k, p.v, generate_stats=True, stats_use_log2=True, **p.args)
    out = _oracle(p)
    lq = c.len_q
    rows = torch.zeros(B, Hq, Sq, dtype=torch.bool)
    for b, n in enumerate(lq):
        rows[b, :, :n] = True
        assert torch.all(score_max[b, :, n:] == -math.inf) and torch.all(sum_exp[b, :, n:] == 0)
    tol = torch.float32 if p.dtype != torch.float64 else torch.float64
    assert_close(score_max[..., 0][rows], out["row_max"][rows], tol, "score_max")
    assert_close(sum_exp[..., 0][rows], out["sum_exp"][rows], tol, "score_sum_exp", terms=c.k.shape[2])
    assert_close(max_logit, sdpa_ref.max_logit(out), tol, "max_logit")
    # LSE = row max + log(sum of exp) wherever the row saw something.
    lse = unpack(p, stats, "q", p.thd_q)[..., 0]
    seen = rows & (sum_exp[..., 0] > 0)
    assert_close(lse[seen], (score_max[..., 0] + torch.log(sum_exp[..., 0]))[seen].double(), tol, "lse vs max+log(sum)")
    # Base-2 stats: exactly the natural stats times log2(e) (-inf stays -inf), O unchanged.
    assert torch.equal(valid_rows(unpack(p, o, "q", p.thd_q), lq).nan_to_num(7.0),
                       valid_rows(unpack(p, o2, "q", p.thd_q), lq).nan_to_num(7.0))
    nat = unpack(p, stats, "q", p.thd_q)[..., 0]
    two = unpack(p, stats2, "q", p.thd_q)[..., 0]
    fin = torch.isfinite(nat)
    assert torch.equal(torch.isneginf(nat), torch.isneginf(two))
    assert torch.allclose(two[fin], nat[fin] * LOG2E, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_base2_stats_with_gradients(fs, dtype):
    # stats_use_log2 "only affects stats ... the backward pass is unaffected" (the seed): with gradients the forward
    # keeps the natural-log stats for the backward and returns their base-2 form (it raised ValueError before).
    g = torch.Generator().manual_seed(3)
    B, H, S, D = 2, 2, 12, 16
    q0, k0, v0, do = (torch.randn(B, H, S, D, generator=g, dtype=dtype) for _ in range(4))
    sink0 = torch.randn(H, generator=g, dtype=torch.float32)
    args = dict(attn_scale=0.25, use_padding_mask=True, seq_len_q=torch.tensor([7, 12]),
                seq_len_kv=torch.tensor([12, 9]), diagonal_band_right_bound=0, generate_stats=True)

    def run(**kw):
        q, k, v, sink = (t.clone().requires_grad_() for t in (q0, k0, v0, sink0))
        o, stats = fs.sdpa(q, k, v, sink_token=sink, **args, **kw)
        torch.autograd.backward(o, do)
        return o.detach(), stats, (q.grad, k.grad, v.grad, sink.grad)

    o2, stats2, grads2 = run(stats_use_log2=True)
    o1, stats1, grads1 = run()
    with torch.no_grad():
        o3, stats3 = fs.sdpa(q0, k0, v0, sink_token=sink0, stats_use_log2=True, **args)
    assert not stats2.requires_grad
    assert torch.equal(o2, o1) and torch.equal(o2, o3)
    for got, want in zip(grads2, grads1):
        assert torch.equal(got, want)  # the backward of natural-log stats, bitwise
    assert torch.equal(torch.isneginf(stats2), torch.isneginf(stats3))
    fin = torch.isfinite(stats3)
    if dtype == torch.float32:
        assert torch.equal(stats2[fin], stats3[fin])  # as the C layer computes them: float32 LSE times log2(e)
    assert torch.allclose(stats2[fin], stats3[fin], rtol=1e-6, atol=0)
    assert torch.allclose(stats2[fin], stats1[fin] * LOG2E, rtol=1e-6, atol=0)


# ---------------------------------------------------------------------------
# rng_dump
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(8))
def test_rng_dump_is_the_oracle_keep_mask(fs, seed):
    rng = random.Random(seed)
    B, H, Sq, Skv, D = rng.randint(1, 3), rng.randint(1, 3), rng.randint(1, 40), rng.randint(1, 40), 8
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, H, s, D, generator=g, dtype=torch.float64) for s in (Sq, Skv, Skv))
    lq = [rng.randint(0, Sq) for _ in range(B)]
    lk = [rng.randint(0, Skv) for _ in range(B)]
    prob = rng.choice([0.1, 0.5, 0.9])
    sd, off = rng.randint(0, 2**40), rng.randint(0, 2**40)
    dump = torch.full((B, H, Sq, Skv), 7, dtype=rng.choice([torch.uint8, torch.float32]))
    with torch.no_grad():
        fs.sdpa(q, k, v, use_padding_mask=True, seq_len_q=torch.tensor(lq), seq_len_kv=torch.tensor(lk),
                dropout=(prob, torch.tensor([sd]), torch.tensor([off])), rng_dump=dump)
    keep = sdpa_ref.dropout_keep(sd, off, B, H, Sq, Skv, prob)
    inside = torch.zeros(B, 1, Sq, Skv, dtype=torch.bool)
    for b in range(B):
        inside[b, :, : lq[b], : lk[b]] = True
    want = (keep & inside).to(dump.dtype)
    assert torch.equal(dump, want)
    if inside.any():
        kept = keep[inside.expand_as(keep)].double().mean().item()
        assert abs(kept - (1 - prob)) < 0.25  # the probability is the drop rate


# ---------------------------------------------------------------------------
# Paged K/V caches
# ---------------------------------------------------------------------------


def _paged(dense: torch.Tensor, lens, bs: int, gen: torch.Generator, extra: int = 3):
    """dense [B, H, S, D] -> (container [N, H, bs, D] with NaN unused pages, page table [B, 1, P, 1], entries list)."""
    B, H, S, D = dense.shape
    P = max(1, -(-S // bs))
    N = B * P + extra
    perm = torch.randperm(N, generator=gen).tolist()
    container = torch.full((N, H, bs, D), float("nan"), dtype=dense.dtype)
    table = torch.full((B, 1, P, 1), -1, dtype=torch.int32)  # unused entries are never read
    entries = []
    for b in range(B):
        row = []
        for pg in range(-(-lens[b] // bs)):
            blk = perm.pop()
            rows = min(bs, lens[b] - pg * bs)
            container[blk, :, :rows] = dense[b, :, pg * bs : pg * bs + rows]
            table[b, 0, pg, 0] = blk
            row.append(blk)
        entries.append(row)
    return container, table, entries


@pytest.mark.parametrize("seed", range(16))
def test_paged_kv_matches_the_dense_oracle(fs, seed):
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    dtype = rng.choice([torch.float64, torch.bfloat16])
    B, Hk = rng.randint(1, 3), rng.choice([1, 2])
    Hq = Hk * rng.choice([1, 2, 4])
    D = rng.choice([8, 16])
    decode = rng.random() < 0.5
    Sq = 1 if decode else rng.randint(1, 12)
    bs_k, bs_v = rng.choice([1, 2, 4, 8, 16]), rng.choice([1, 2, 4, 8, 16])
    Skv = rng.randint(1, 20)
    lk = [rng.randint(0, Skv) for _ in range(B)]
    lq = [rng.randint(0, Sq) if not decode else 1 for _ in range(B)]
    q = torch.randn(B, Hq, Sq, D, generator=gen, dtype=torch.float64).to(dtype)
    kd = torch.randn(B, Hk, Skv, D, generator=gen, dtype=torch.float64).to(dtype)
    vd = torch.randn(B, Hk, Skv, D, generator=gen, dtype=torch.float64).to(dtype)
    kc, kt, _ = _paged(kd, lk, bs_k, gen)
    vc, vt, ventries = _paged(vd, lk, bs_v, gen)
    kw = dict(use_padding_mask=True, seq_len_q=torch.tensor(lq), seq_len_kv=torch.tensor(lk),
              paged_attention_k_table=kt, paged_attention_v_table=vt, paged_attention_max_seq_len_kv=Skv,
              attn_scale=0.3, generate_stats=True)
    causal = rng.random() < 0.5
    if causal:
        kw.update(diagonal_band_right_bound=0, diagonal_alignment="BOTTOM_RIGHT")
    packed_v = rng.random() < 0.5
    if packed_v:  # packed V page table: only the used entries, addressed through ragged offsets
        flat = [e for row in ventries for e in row]
        offs = [0]
        for row in ventries:
            offs.append(offs[-1] + len(row))
        Pv = vt.shape[2]
        store = torch.tensor(flat + [-1] * Pv, dtype=torch.int32)  # room for a full table read at the last offset
        vt_packed = store.as_strided((B, 1, Pv, 1), (0, Pv, 1, 1))
        kw["paged_attention_v_table"] = vt_packed
        kw["ragged_offsets"] = {"paged_attention_v_table": torch.tensor(offs[:-1] + [offs[-1]])}
    with torch.no_grad():
        o, stats = fs.sdpa(q, kc, vc, **kw)
    case = sdpa_ref.Case(q=q.double(), k=kd.double(), v=vd.double(), len_q=lq, len_kv=lk, scale=0.3,
                         bottom_right=causal, right=0 if causal else None)
    out = sdpa_ref.forward(case, case.q, case.k, case.v)
    assert_close(valid_rows(o.double(), lq), valid_rows(out["o"], lq), dtype, "o")
    got = stats[..., 0].clone()
    want = out["lse"].clone()
    for b, n in enumerate(lq):
        got[b, :, n:] = 0
        want[b, :, n:] = 0
    assert_close(got, want, torch.float32 if dtype != torch.float64 else torch.float64, "stats")


def test_paged_rules(fs):
    q = torch.randn(1, 1, 2, 8)
    kc = torch.randn(4, 1, 4, 8)
    kt = torch.zeros(1, 1, 2, 1, dtype=torch.int32)
    base = dict(use_padding_mask=True, seq_len_q=torch.tensor([2]), seq_len_kv=torch.tensor([8]),
                paged_attention_k_table=kt, paged_attention_v_table=kt)
    with pytest.raises(ValueError, match=r"^paged_attention_max_seq_len_kv: 9 exceeds the capacity of the page tables"):
        fs.sdpa(q, kc, kc, paged_attention_max_seq_len_kv=9, **base)
    with pytest.raises(ValueError, match=r"^paged_attention_k_table, paged_attention_v_table: paged K/V caches have no "
                                         r"backward"):
        fs.sdpa(q.requires_grad_(), kc, kc, **base)


def _paged_call(fs, k=None, v=None, k_table=True, v_table=True, lens=(5, 30), **kw):
    """A paged decode step: q (2, 2, 1, 8), containers (8, 1, 8, 8), tables (2, 1, 4, 1) (capacity 4 * 8 = 32)."""
    q = torch.randn(2, 2, 1, 8)
    k = torch.randn(8, 1, 8, 8) if k is None else k
    v = torch.randn(8, 1, 8, 8) if v is None else v
    table = torch.arange(8, dtype=torch.int32).view(2, 1, 4, 1)
    return fs.sdpa(q, k, v, use_padding_mask=True, seq_len_q=torch.ones(2, dtype=torch.int32),
                   seq_len_kv=torch.tensor(lens, dtype=torch.int32), paged_attention_k_table=table if k_table else None,
                   paged_attention_v_table=table if v_table else None, **kw)


def test_paged_container_errors_name_the_paged_layout(fs):
    """A paged container of the wrong rank was named in the dense (B, H, S, D) / THD layout by the Python layer."""
    with pytest.raises(ValueError, match=r"^k: must be a 4-D tensor \[num_blocks, H_k, block_size, D_qk\] \(a paged "
                                         r"container: paged_attention_k_table is given\), got rank 3"):
        _paged_call(fs, k=torch.randn(8, 8, 8))
    with pytest.raises(ValueError, match=r"^v: must be a 4-D tensor \[num_blocks, H_v, block_size, D_v\] \(a paged "
                                         r"container: paged_attention_v_table is given\), got rank 3"):
        _paged_call(fs, v=torch.randn(8, 8, 8))
    with pytest.raises(ValueError, match=r"^k: the block size \(dim 2\) of a paged container \[num_blocks, H_k, "
                                         r"block_size, D_qk\] must be a power of two, got 6"):
        _paged_call(fs, k=torch.randn(8, 1, 6, 8))


@pytest.mark.parametrize("missing", ["k", "v"])
def test_paged_one_table_only_names_both_tables(fs, missing):
    """A container given without its page table read as a batch mismatch only ("v: batch 8 differs from q's B = 2")."""
    other = "v" if missing == "k" else "k"
    with pytest.raises(ValueError, match=rf"^{missing}: batch 8 differs from q's B = 2 \(paged_attention_{other}_table "
                                         rf"is given but paged_attention_{missing}_table is not.*pass both "
                                         r"paged_attention_k_table and paged_attention_v_table"):
        _paged_call(fs, k_table=missing != "k", v_table=missing != "v")
    # One side paged with the other dense (the seed's optional per-side tables) still runs.
    dense = torch.randn(2, 1, 32, 8)
    o, _ = _paged_call(fs, **{missing: dense}, k_table=missing != "k", v_table=missing != "v")
    assert torch.isfinite(o).all()


def test_paged_capacity_states_the_rule_with_numbers(fs):
    """The capacity errors gave the product only, or (lengths) a bare S_kv."""
    with pytest.raises(ValueError, match=r"^paged_attention_max_seq_len_kv: 40 exceeds the capacity of the page tables: "
                                         r"it must be <= max_pages \* block_size = 4 \* 8 = 32 \(max_pages of "
                                         r"paged_attention_k_table"):
        _paged_call(fs, paged_attention_max_seq_len_kv=40)
    with pytest.raises(ValueError, match=r"^seq_len_kv: sample 1 has length 40, outside \[0, S_kv = 32\]: with paged "
                                         r"K/V a sample's length must be <= the page tables' capacity, max_pages \* "
                                         r"block_size = 4 \* 8 = 32"):
        _paged_call(fs, lens=(5, 40))
    # The side with the smaller capacity is the one named.
    with pytest.raises(ValueError, match=r"max_pages \* block_size = 4 \* 4 = 16 \(max_pages of "
                                         r"paged_attention_v_table \[B, 1, max_pages, 1\], block_size of v"):
        _paged_call(fs, v=torch.randn(8, 1, 4, 8))


# ---------------------------------------------------------------------------
# Fully masked rows, padding rows of gradients, determinism
# ---------------------------------------------------------------------------


def test_fully_masked_rows_give_zero_output_neg_inf_lse_and_zero_gradients(fs):
    # BOTTOM_RIGHT causal with len_kv < len_q: the first len_q - len_kv rows see no key; a left bound of 1 with
    # right bound 0 leaves each row only its diagonal column.
    g = torch.Generator().manual_seed(0)
    B, H, Sq, Skv, D = 2, 2, 6, 3, 8
    q = torch.randn(B, H, Sq, D, generator=g, dtype=torch.float64, requires_grad=True)
    k = torch.randn(B, H, Skv, D, generator=g, dtype=torch.float64, requires_grad=True)
    v = torch.randn(B, H, Skv, D, generator=g, dtype=torch.float64, requires_grad=True)
    bias = torch.randn(1, H, Sq, Skv, generator=g, dtype=torch.float64, requires_grad=True)
    o, lse = fs.sdpa(q, k, v, bias=bias, diagonal_alignment="BOTTOM_RIGHT", diagonal_band_right_bound=0,
                     generate_stats=True)
    dead = Sq - Skv
    assert torch.all(o[:, :, :dead] == 0) and torch.all(lse[:, :, :dead] == -math.inf)
    assert torch.isfinite(o).all() and torch.isfinite(lse[:, :, dead:]).all()
    dq, dk, dv, db = torch.autograd.grad(o.sum(), (q, k, v, bias))
    assert torch.all(dq[:, :, :dead] == 0) and torch.all(db[:, :, :dead] == 0)
    for t in (dq, dk, dv, db):
        assert torch.isfinite(t).all()


def test_gradient_padding_rows_are_written_as_zero(fs):
    # Gradients allocated by the library start NaN-poisoned; padding rows must come back 0, padding inputs unread.
    g = torch.Generator().manual_seed(1)
    B, Hq, Hk, Sq, Skv, D = 2, 4, 2, 7, 9, 16
    lq, lk = [3, 7], [9, 0]
    q = torch.randn(B, Hq, Sq, D, generator=g)
    k = torch.randn(B, Hk, Skv, D, generator=g)
    v = torch.randn(B, Hk, Skv, D, generator=g)
    gate = torch.randn(B, Hq, Sq, D, generator=g)
    for b in range(B):
        for t, n in ((q, lq[b]), (gate, lq[b]), (k, lk[b]), (v, lk[b])):
            t[b, :, n:] = float("nan")
    kw = dict(use_padding_mask=True, seq_len_q=torch.tensor(lq), seq_len_kv=torch.tensor(lk), attn_scale=0.25,
              gate=gate)
    with torch.no_grad():
        o, stats = fs.sdpa(q, k, v, generate_stats=True, **kw)
    do = torch.randn(o.shape, generator=g)
    dgate = torch.full_like(gate, float("nan"))
    with uninitialized_memory_poisoned():
        dq, dk, dv = fs.sdpa_backward(q, k, v, o, do, stats, dgate=dgate, **kw)
    for b in range(B):
        assert torch.all(dq[b, :, lq[b]:] == 0) and torch.all(dgate[b, :, lq[b]:] == 0)
        assert torch.all(dk[b, :, lk[b]:] == 0) and torch.all(dv[b, :, lk[b]:] == 0)
        assert torch.isfinite(dq[b, :, : lq[b]]).all() and torch.isfinite(dgate[b, :, : lq[b]]).all()
        assert torch.isfinite(dk[b, :, : lk[b]]).all() and torch.isfinite(dv[b, :, : lk[b]]).all()


def test_deterministic_backward_is_bitwise_stable(fs):
    p = random_problem(77, dtype=torch.bfloat16)
    leaves = {"q": p.q, "k": p.k, "v": p.v, **p.grad_inputs}
    results = []
    for _ in range(3):
        ins = {n: t.detach().clone().requires_grad_() for n, t in leaves.items()}
        args = dict(p.args)
        for n in ("bias", "sink_token", "gate"):
            if n in args:
                args[n] = ins[n]
        torch.use_deterministic_algorithms(True)
        try:
            o, _ = fs.sdpa(ins["q"], ins["k"], ins["v"], **args)
            grads = torch.autograd.grad(o.float().sum(), list(ins.values()))
        finally:
            torch.use_deterministic_algorithms(False)
        results.append([g.clone() for g in grads])
    for again in results[1:]:
        for a, b in zip(results[0], again):
            assert torch.equal(torch.nan_to_num(a, nan=123.0), torch.nan_to_num(b, nan=123.0))


# ---------------------------------------------------------------------------
# Finite differences in float64 (tiny shapes) through flashspan.sdpa's autograd
# ---------------------------------------------------------------------------

GRADCHECK_SPECS = {
    "bias-broadcast": dict(bias=(1, 2, 1, 6)),
    "bias-full-causal": dict(bias=(2, 2, 5, 6), diagonal_band_right_bound=0),
    "alibi-bottom-right": dict(use_alibi_mask=True, diagonal_band_right_bound=0, diagonal_alignment="BOTTOM_RIGHT"),
    "softcap-band": dict(softcap=2.0, diagonal_band_left_bound=3, diagonal_band_right_bound=1),
    "sinks": dict(sink_token=True),
    "gate": dict(gate=True),
    "dropout-mask": dict(dropout_mask=True),
    "block-mask-padding": dict(block_mask=True, padding=True),
    "everything": dict(bias=(2, 1, 5, 1), softcap=3.0, sink_token=True, gate=True, padding=True,
                       diagonal_band_right_bound=2),
    "thd-sinks-gate": dict(thd=True, sink_token=True, gate=True, diagonal_band_right_bound=0),
}


@pytest.mark.parametrize("name", list(GRADCHECK_SPECS))
def test_gradcheck_float64(fs, name):
    spec = GRADCHECK_SPECS[name]
    g = torch.Generator().manual_seed(hash(name) % 1000)
    B, Hq, Hk, Sq, Skv, D, Dv = 2, 2, 1, 5, 6, 8, 8
    rnd = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64)
    q, k, v = rnd(B, Hq, Sq, D), rnd(B, Hk, Skv, D), rnd(B, Hk, Skv, Dv)
    kw = dict(attn_scale=0.4)
    leaves = {"q": q, "k": k, "v": v}
    if "bias" in spec:
        leaves["bias"] = rnd(*spec["bias"])
    if spec.get("sink_token"):
        leaves["sink_token"] = rnd(Hq)
    if spec.get("gate"):
        leaves["gate"] = rnd(B, Hq, Sq, Dv)
    for key in ("use_alibi_mask", "diagonal_band_right_bound", "diagonal_band_left_bound", "diagonal_alignment",
                "softcap"):
        if key in spec:
            kw[key] = spec[key]
    if spec.get("dropout_mask"):
        kw["dropout"] = ((torch.rand(1, Hq, Sq, Skv, generator=g) > 0.3).to(torch.uint8), torch.tensor([1 / 0.7]))
    if spec.get("block_mask"):
        kw["block_mask"] = torch.tensor([[[[1]]], [[[0]]]], dtype=torch.uint8)  # sample 1 sees nothing
    if spec.get("padding"):
        kw.update(use_padding_mask=True, seq_len_q=torch.tensor([5, 3]), seq_len_kv=torch.tensor([4, 6]))
    if spec.get("thd"):
        lq, lk = [2, 3], [4, 2]
        cq, ck = torch.tensor([0, 2, 5]), torch.tensor([0, 4, 6])
        leaves["q"], leaves["k"], leaves["v"] = rnd(5, Hq, D), rnd(6, Hk, D), rnd(6, Hk, Dv)
        if "gate" in leaves:
            leaves["gate"] = rnd(5, Hq, Dv)
        kw.update(use_padding_mask=True, cu_seq_len_q=cq, cu_seq_len_kv=ck, max_seq_len_q=max(lq),
                  max_seq_len_kv=max(lk))
    names = list(leaves)
    inputs = tuple(t.requires_grad_() for t in leaves.values())

    def f(*xs):
        a = dict(zip(names, xs))
        extra = {n: a[n] for n in ("bias", "sink_token", "gate") if n in a}
        return fs.sdpa(a["q"], a["k"], a["v"], **extra, **kw)[0]

    assert torch.autograd.gradcheck(f, inputs, eps=1e-6, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("dqk, dv", [(192, 128), (256, 256), (256, 8), (8, 256)])
def test_large_and_unequal_head_dims(fs, dqk, dv):
    # Head dims up to 256, d_qk != d_v (the seed's (192, 128) among them), forward and backward vs the oracle.
    g = torch.Generator().manual_seed(dqk + dv)
    B, Hq, Hk, Sq, Skv = 1, 2, 1, 5, 7
    q = torch.randn(B, Hq, Sq, dqk, generator=g, dtype=torch.float64)
    k = torch.randn(B, Hk, Skv, dqk, generator=g, dtype=torch.float64)
    v = torch.randn(B, Hk, Skv, dv, generator=g, dtype=torch.float64)
    ours = [t.clone().requires_grad_() for t in (q, k, v)]
    o, lse = fs.sdpa(*ours, attn_scale=1 / math.sqrt(dqk), diagonal_band_right_bound=0,
                     diagonal_alignment="BOTTOM_RIGHT", generate_stats=True)
    assert o.shape == (B, Hq, Sq, dv)
    ref_in = [t.clone().requires_grad_() for t in (q, k, v)]
    case = sdpa_ref.Case(q=q, k=k, v=v, len_q=[Sq], len_kv=[Skv], scale=1 / math.sqrt(dqk), bottom_right=True, right=0)
    out = sdpa_ref.forward(case, *ref_in)
    assert_close(o, out["o"], torch.float64, "o")
    assert_close(lse[..., 0], out["lse"], torch.float64, "lse")
    do = torch.randn(o.shape, generator=g, dtype=torch.float64)
    for name, a, b in zip("qkv", torch.autograd.grad(o, ours, do), torch.autograd.grad(out["o"], ref_in, do)):
        assert_close(a, b, torch.float64, f"d{name}")


def test_packed_page_table_offsets_past_the_table_are_rejected(fs):
    # A packed page table is seen by the C layer as [B, 1, max_pages, 1]: an offset past its memory was read out of
    # bounds; flashspan.sdpa names it.
    q = torch.randn(2, 1, 1, 8)
    kc = torch.randn(6, 1, 4, 8)
    store = torch.tensor([0, 1, 2, 3], dtype=torch.int32)
    table = store.as_strided((2, 1, 2, 1), (0, 2, 1, 1))
    kw = dict(use_padding_mask=True, seq_len_q=torch.tensor([1, 1]), seq_len_kv=torch.tensor([8, 5]),
              paged_attention_k_table=table, paged_attention_v_table=table, paged_attention_max_seq_len_kv=8)
    with torch.no_grad():
        fs.sdpa(q, kc, kc, ragged_offsets={"paged_attention_k_table": torch.tensor([0, 2, 4])}, **kw)  # in bounds
        with pytest.raises(ValueError, match=r"^paged_attention_k_table: the ragged offsets place sample 1's 2 page "
                                             r"entries at \[100000, 100002\), outside the table's 4 entries"):
            fs.sdpa(q, kc, kc, ragged_offsets={"paged_attention_k_table": torch.tensor([0, 100000, 100002])}, **kw)


def test_deprecated_setters_keep_the_seeds_precedence(fs):
    # set_causal_mask / set_causal_mask_bottom_right set the alignment and right bound 0 only when no right bound
    # was given; set_sliding_window_length is set_diagonal_band_left_bound; set_is_inference(x) is
    # set_generate_stats(!x).
    g = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(2, 2, n, 8, generator=g, dtype=torch.float64) for n in (6, 9, 9))
    run = lambda **kw: fs.sdpa(q, k, v, generate_stats=True, **kw)
    with torch.no_grad():
        band2, _ = run(diagonal_band_right_bound=2)
        assert torch.equal(run(use_causal_mask=True, diagonal_band_right_bound=2)[0], band2)
        causal, _ = run(diagonal_band_right_bound=0)
        assert torch.equal(run(use_causal_mask=True)[0], causal)
        br, _ = run(diagonal_alignment="BOTTOM_RIGHT", diagonal_band_right_bound=0)
        assert torch.equal(run(use_causal_mask_bottom_right=True)[0], br)
        assert not torch.equal(br, causal)  # S_q != S_kv: the alignments differ
        br2, _ = run(diagonal_alignment="BOTTOM_RIGHT", diagonal_band_right_bound=2)
        assert torch.equal(run(use_causal_mask_bottom_right=True, diagonal_band_right_bound=2)[0], br2)
        win, _ = run(diagonal_band_left_bound=3, diagonal_band_right_bound=0)
        assert torch.equal(run(sliding_window_length=3, use_causal_mask=True)[0], win)
        o, stats = fs.sdpa(q, k, v, is_inference=False)
        assert stats is not None and stats.shape == (2, 2, 6, 1)
        o, stats = fs.sdpa(q, k, v, is_inference=True)
        assert stats is None
