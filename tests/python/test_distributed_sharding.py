"""SequenceSharding and the LSE merge of flashspan.distributed, in one process (no process group needed)."""

import math

import pytest
import torch
from flex_ref import dense_mask, random_endpoints

from flashspan.distributed import SequenceSharding, merge_partial, visible_count


def _cu(lengths):
    cu = [0]
    for n in lengths:
        cu.append(cu[-1] + n)
    return cu


@pytest.mark.parametrize("scheme", ["zigzag", "striped", "contiguous"])
@pytest.mark.parametrize("world", [1, 2, 3, 4, 8])
def test_partition_covers_every_token_once(scheme, world):
    lengths = [0, 1, 5, 16, 33, 2]
    sh = SequenceSharding(world, cu_seqlens=_cu(lengths), scheme=scheme)
    allidx = torch.cat([sh.token_index(r) for r in range(world)])
    assert torch.equal(allidx.sort().values, torch.arange(sum(lengths)))
    for r in range(world):
        idx = sh.token_index(r)
        assert torch.all(idx[1:] > idx[:-1]), "local order must follow global order"
        assert sh.local_cu_seqlens(r)[-1] == idx.numel() == sh.local_tokens(r)
    counts = [sh.local_tokens(r) for r in range(world)]
    assert max(counts) - min(counts) <= (2 if scheme == "zigzag" else 1) * len(lengths)


def test_zigzag_chunks():
    sh = SequenceSharding(2, seqlen=8, batch=1)
    assert sh.positions(0).tolist() == [0, 1, 6, 7]
    assert sh.positions(1).tolist() == [2, 3, 4, 5]
    assert SequenceSharding(2, seqlen=8, scheme="striped").positions(1).tolist() == [1, 3, 5, 7]
    assert SequenceSharding(2, seqlen=8, scheme="contiguous").positions(1).tolist() == [4, 5, 6, 7]


@pytest.mark.parametrize("varlen", [False, True])
def test_shard_unshard_roundtrip(varlen):
    if varlen:
        sh = SequenceSharding(3, cu_seqlens=[0, 4, 4, 11])
        x = torch.randn(11, 2, 5)
        lse = torch.randn(2, 11)
    else:
        sh = SequenceSharding(4, seqlen=16, batch=2)
        x = torch.randn(2, 16, 2, 5)
        lse = torch.randn(2, 2, 16)
    assert torch.equal(sh.unshard([sh.shard(x, r) for r in range(sh.world_size)]), x)
    d = 1 if varlen else 2
    assert torch.equal(sh.unshard([sh.shard(lse, r, dim=d) for r in range(sh.world_size)], dim=d), lse)


@pytest.mark.parametrize("scheme", ["zigzag", "striped", "contiguous"])
@pytest.mark.parametrize("world", [2, 3, 4])
def test_shifted_endpoints_select_exactly_the_shard_keys(scheme, world):
    # The dense mask of (rank i's rows, rank j's keys) from the shifted endpoints equals the
    # global dense mask restricted to those rows and keys, for random multi-interval masks.
    gen = torch.Generator().manual_seed(world)
    lengths = [13, 0, 29, 4]
    cu = _cu(lengths)
    mf = random_endpoints(gen, 2, 5, cu, cu)
    sh = SequenceSharding(world, cu_seqlens=cu, scheme=scheme)
    full = dense_mask(mf, cu, cu)
    for i in range(world):
        rows = sh.shard_rows(mf, i)
        for j in range(world):
            shifted = sh.shift_endpoints(rows, i, j)
            assert torch.all(shifted[:, 1:] >= shifted[:, :-1])
            local = dense_mask(shifted, sh.local_cu_seqlens(i), sh.local_cu_seqlens(j))
            for b in range(len(lengths)):
                want = full[b][:, sh.positions(i, b)][:, :, sh.positions(j, b)]
                assert torch.equal(local[b], want), (i, j, b)
            assert visible_count(shifted) == sum(int(m.sum()) for m in local)


def test_zigzag_balances_causal_work_and_contiguous_does_not():
    import flashspan.masks as fm

    s, w = 1024, 4
    mf = fm.causal(s)
    zig = [sum(row) for row in SequenceSharding(w, seqlen=s).work_matrix(mf)]
    con = [sum(row) for row in SequenceSharding(w, seqlen=s, scheme="contiguous").work_matrix(mf)]
    assert sum(zig) == sum(con) == s * (s + 1) // 2
    assert max(zig) == min(zig)
    assert max(con) / min(con) > 6  # 7x for W=4 (2W-1 up to rounding)


def test_merge_keeps_empty_rows_exact():
    out = torch.zeros(1, 3, 1, 2)
    lse = torch.full((1, 1, 3), -math.inf)
    p1 = torch.tensor([[[[1.0, 2.0]], [[0.0, 0.0]], [[3.0, 3.0]]]])
    l1 = torch.tensor([[[0.0, -math.inf, math.log(3.0)]]])
    merge_partial(out, lse, p1, l1, varlen=False)
    p2 = torch.tensor([[[[5.0, 6.0]], [[0.0, 0.0]], [[1.0, 1.0]]]])
    l2 = torch.tensor([[[0.0, -math.inf, 0.0]]])
    merge_partial(out, lse, p2, l2, varlen=False)
    assert torch.allclose(out[0, 0, 0], torch.tensor([3.0, 4.0]))
    assert torch.equal(out[0, 1, 0], torch.zeros(2)) and math.isinf(lse[0, 0, 1]) and lse[0, 0, 1] < 0
    assert torch.allclose(out[0, 2, 0], torch.tensor([2.5, 2.5]))
    assert torch.allclose(lse[0, 0], torch.tensor([math.log(2.0), -math.inf, math.log(4.0)]))


@pytest.mark.parametrize(
    "kwargs,exc,words",
    [
        (dict(world_size=0, seqlen=8), ValueError, "world_size"),
        (dict(world_size=3, seqlen=8), ValueError, "seqlen % 6"),
        (dict(world_size=3, seqlen=8, scheme="striped"), ValueError, "seqlen % 3"),
        (dict(world_size=2, seqlen=8, scheme="ring"), ValueError, "scheme"),
        (dict(world_size=2), ValueError, "seqlen"),
        (dict(world_size=2, seqlen=8, cu_seqlens=[0, 8]), ValueError, "not both"),
        (dict(world_size=2, cu_seqlens=[0, 5, 3]), ValueError, "nondecreasing"),
        (dict(world_size=2, cu_seqlens=torch.tensor([0.0, 4.0])), TypeError, "integers"),
        (dict(world_size=2.0, seqlen=8), TypeError, "world_size"),
    ],
)
def test_sharding_errors(kwargs, exc, words):
    w = kwargs.pop("world_size")
    with pytest.raises(exc, match=words):
        SequenceSharding(w, **kwargs)


def test_shard_rejects_wrong_geometry():
    sh = SequenceSharding(2, seqlen=8, batch=1)
    with pytest.raises(ValueError, match="S=8"):
        sh.shard(torch.zeros(1, 6, 2, 4), 0)
    with pytest.raises(ValueError, match="rank"):
        sh.shard(torch.zeros(1, 8, 2, 4), 2)
    with pytest.raises(ValueError, match="mask_func"):
        sh.shard_rows(torch.zeros(1, 1, 7, dtype=torch.int32), 0)


def test_cost_model_runs_on_the_real_sharding():
    # benchmarks/cp_model.py (a model, not a measurement) stays runnable: balanced causal work,
    # efficiencies in (0, 1], a document mask on contiguous shards needs a 2-step ring.
    import importlib.util
    import os

    path = os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks", "cp_model.py")
    spec = importlib.util.spec_from_file_location("cp_model", path)
    cp_model = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(cp_model)
    kw = dict(p2p_gbps=350.0, ag_gbps=350.0, sm_tax=0.05)
    r = cp_model.model("causal", 4096, 4, 8, 8, 128, **kw)
    assert r["imbalance"] == 1.0 and r["ring_steps"] == 4
    for key in ("ring_eff_fwd", "ring_eff_bwd", "ag_eff_fwd", "ag_eff_bwd", "hidden_fwd", "hidden_bwd"):
        assert 0.0 < r[key] <= 1.0, (key, r[key])
    d = cp_model.model("document_causal", 16384, 4, 8, 8, 128, scheme="contiguous", **kw)
    assert d["ring_steps"] == 2
