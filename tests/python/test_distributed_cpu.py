"""Context-parallel flex attention (flashspan.distributed) on gloo CPU process groups vs single-process attention.

Each world size gets one persistent group of spawned ranks (cp_workers.Pool); every test sends
one case to all ranks, and every rank checks its shard of out / lse / dq / dk / dv against
flashspan.flex_attn_func on the gathered tensors. FLASHSPAN_CP_DEVICE=cuda (scripts/cp_gpu_check.sh)
runs the same cases over NCCL with every rank on the one GPU.
"""

import os

import pytest
import torch

import cp_workers

DEVICE = os.environ.get("FLASHSPAN_CP_DEVICE", "cpu")
BACKEND = "nccl" if DEVICE == "cuda" else "gloo"

pytestmark = pytest.mark.skipif(
    not torch.distributed.is_available() or (BACKEND == "gloo" and not torch.distributed.is_gloo_available()),
    reason="torch.distributed with gloo is not available",
)

# One group of 4 ranks; worlds 1-3 run on subgroups of its first ranks. FLASHSPAN_CP_RANKS
# lowers it (GPU checks: 1 rank with NCCL; cases for larger worlds then skip).
POOL_SIZE = int(os.environ.get("FLASHSPAN_CP_RANKS", "4"))
_pools: dict = {}


def _pool() -> cp_workers.Pool:
    pool = _pools.get("pool")
    if pool is None or pool.broken:
        if pool is not None:
            pool.close()
        pool = _pools["pool"] = cp_workers.Pool(POOL_SIZE, BACKEND, DEVICE)
    return pool


@pytest.fixture(scope="module", autouse=True)
def _close_pools(fs):  # fs: the library loads in the parent first (a clear skip/error if it cannot)
    yield
    for pool in _pools.values():
        pool.close()
    _pools.clear()


def run(world, case="flex", **kw):
    if world > POOL_SIZE:
        pytest.skip(f"world size {world} > FLASHSPAN_CP_RANKS={POOL_SIZE}")
    return _pool().run(case, world, **kw)


# -- random interval masks: BSHD, every scheme and strategy, GQA, per-head masks ------------------


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("scheme", ["zigzag", "striped", "contiguous"])
@pytest.mark.parametrize("strategy", ["ring", "allgather"])
def test_random_mask_bshd(world, scheme, strategy):
    run(world, seed=10 + world, scheme=scheme, strategy=strategy, batch=2, seqlen=16 * world, hq=4, hkv=2, nfunc=5)


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("hq,hkv,hm", [(4, 4, 4), (4, 1, 1), (6, 2, 6)])
def test_gqa_and_mask_heads(world, hq, hkv, hm):
    run(world, seed=20 + hq + hm, strategy="ring", seqlen=8 * world, hq=hq, hkv=hkv, hm=hm, nfunc=3, dqk=24, dv=8)


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("mask", ["causal", "document"])
@pytest.mark.parametrize("strategy", ["ring", "allgather"])
def test_causal_and_document(world, mask, strategy):
    stats = run(world, seed=30, mask=mask, strategy=strategy, batch=1, seqlen=32 * world, hq=2, hkv=2)
    if mask == "causal" and strategy == "ring":
        # zigzag: every rank sees the same causal work
        work = [sum(s["pair_visible"]) for s in stats]
        assert len(set(work)) == 1, work


def test_contiguous_causal_skips_pairs():
    # contiguous causal: rank r sees nothing of the ranks after it -> those steps run no kernel
    stats = run(4, seed=31, mask="causal", scheme="contiguous", strategy="ring", seqlen=64, hq=2, hkv=2)
    assert [s["skipped"] for s in stats] == [3, 2, 1, 0]


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("varlen", [False, True])
def test_short_range_mask_shortens_the_ring(world, varlen):
    # a 4-key causal window on contiguous shards: only neighbours share visible pairs -> 2 ring steps
    kw = dict(lengths=[100, 28]) if varlen else dict(seqlen=32 * world)
    stats = run(world, seed=41, mask="bench:local", scheme="contiguous", strategy="ring", varlen=varlen, hq=2, hkv=2,
                **kw)
    assert all(s["ring_steps"] == 2 for s in stats), [s["ring_steps"] for s in stats]


@pytest.mark.parametrize(
    "mask", ["causal", "document_causal", "local", "sink_local", "tree_dfs", "tree_bfs", "longformer", "hstu"]
)
@pytest.mark.parametrize("strategy", ["ring", "allgather"])
def test_benchmark_masks(mask, strategy):
    run(4, seed=40, mask="bench:" + mask, strategy=strategy, seqlen=256, hq=2, hkv=1, dqk=16, dv=16)


# -- THD: uneven and empty samples, ranks without tokens --------------------------------------------


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("scheme", ["zigzag", "striped", "contiguous"])
@pytest.mark.parametrize("strategy", ["ring", "allgather"])
def test_thd_uneven_and_empty_samples(world, scheme, strategy):
    run(world, seed=50, varlen=True, scheme=scheme, strategy=strategy, lengths=[37, 0, 3, 1, 70, 0, 9],
        hq=4, hkv=2, nfunc=3)


@pytest.mark.parametrize("strategy", ["ring", "allgather"])
def test_thd_rank_without_tokens(strategy):
    # 3 tokens over 4 ranks: one rank owns nothing and still takes part in every collective
    run(4, seed=51, varlen=True, scheme="contiguous", strategy=strategy, lengths=[2, 0, 1], hq=2, hkv=1)


@pytest.mark.parametrize("mask", ["causal", "document"])
def test_thd_causal_document(mask):
    run(4, seed=52, varlen=True, mask=mask, strategy="ring", lengths=[40, 17, 64], hq=2, hkv=2)


# -- dtypes, scale, LSE gradient, auto strategy, determinism ---------------------------------------


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("strategy", ["ring", "allgather"])
def test_half_dtypes(dtype, strategy):
    run(2, seed=60, dtype=dtype, strategy=strategy, seqlen=64, hq=4, hkv=2, dqk=32, dv=32)


@pytest.mark.skipif(DEVICE == "cuda", reason="float64 runs on CPU tensors only")
@pytest.mark.parametrize("strategy", ["ring", "allgather"])
def test_float64(strategy):
    # The merges and gradient accumulators in float64 too: within 1e-12 of the single-process float64 result.
    run(4, seed=61, dtype="float64", strategy=strategy, seqlen=64, hq=4, hkv=2, dqk=16, dv=16)


def test_softmax_scale_and_no_lse_gradient():
    run(2, seed=61, scale=0.37, use_dlse=False, seqlen=32)


@pytest.mark.parametrize("strategy", ["ring", "allgather"])
def test_plan_options_pass_through(strategy):
    # pack_gqa / arch reach every per-rank plan (packed GQA on short shards, the portable family)
    run(2, seed=68, strategy=strategy, seqlen=16, hq=8, hkv=2, plan_kw=dict(pack_gqa=True, arch=80))


def test_forward_only_plan():
    run(4, seed=62, backward=False, seqlen=32, strategy="ring")


@pytest.mark.parametrize("world,hq,hkv,want", [(2, 8, 1, "allgather"), (4, 8, 2, "allgather"), (4, 4, 2, "ring")])
def test_auto_strategy(world, hq, hkv, want):
    stats = run(world, seed=63, strategy="auto", seqlen=8 * world, hq=hq, hkv=hkv)
    assert all(s["strategy"] == want for s in stats)


@pytest.mark.parametrize("strategy", ["ring", "allgather"])
def test_deterministic_bitwise(strategy):
    run(4, "deterministic", seed=64, strategy=strategy, seqlen=32, hq=4, hkv=2)


@pytest.mark.parametrize("varlen", [False, True])
@pytest.mark.parametrize("strategy", ["ring", "allgather"])
@pytest.mark.parametrize("mask", ["random", "causal"])
def test_world_size_one(varlen, strategy, mask):
    # one rank: the whole CP path (plans, merge, the ring of one step, collectives of one rank)
    kw = dict(lengths=[30, 0, 9]) if varlen else dict(batch=2, seqlen=24)
    run(1, seed=67, varlen=varlen, strategy=strategy, mask=mask, hq=4, hkv=2, dqk=32, dv=32, **kw)


@pytest.mark.parametrize("world", [1, 3])
def test_odd_and_single_world(world):
    run(world, seed=65, strategy="ring", seqlen=12 * world, hq=2, hkv=1)
    run(world, seed=66, strategy="allgather", varlen=True, lengths=[7, 0, 20], hq=2, hkv=1)


@pytest.mark.parametrize("varlen", [False, True])
def test_gather(varlen):
    run(4, "gather", varlen=varlen)


def test_errors_name_the_argument():
    msgs = run(2, "errors")[0]
    assert "q has shape" in msgs[0]
    assert "int32" in msgs[1]
    assert "world_size=1" in msgs[2]
    assert "strategy" in msgs[3]
    assert "mask_func" in msgs[4]
    assert "within [0," in msgs[5]
    assert "nondecreasing" in msgs[6]
    assert "odd" in msgs[7]
    assert "dtype" in msgs[8]
    assert "shape" in msgs[9]
    assert "backward" in msgs[10]
    assert "ContextParallelPlan" in msgs[11]
