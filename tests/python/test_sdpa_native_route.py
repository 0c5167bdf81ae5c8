"""The native SDPA route (CUDA tensors on every GPU; the only GPU route since the flex route, a Python lowering of
pure-mask calls onto flex mask plans, was retired): CUDA calls of flashspan.sdpa, sdpa_backward and the custom ops
go to the C layer's SDPA operation (its GPU kernels). CPU tests: the route choice, the route's Python plumbing (run
on CPU tensors, where the operation runs the CPU reference), and the C layer's NotImplementedError naming each
feature the GPU kernels do not run (CUDA descriptors, no GPU needed). GPU tests (skipped without one) compare the
native route with the CPU reference."""

import itertools
import math
import random
import re
import sys

import pytest
import torch

from conftest import cuda_ready
from sdpa_cases import assert_close, mask_problem, sample_rows, valid_rows

ROUTE_ENV, EXPERIMENTAL_ENV, PAGED_ENV = "FLASHSPAN_SDPA_ROUTE", "FLASHSPAN_EXPERIMENTAL", "FLASHSPAN_SDPA_PAGED"
PAIRS_ENV = "FLASHSPAN_SDPA_FEATURE_PAIRS"
DBIAS_SOFTCAP_ENV = "FLASHSPAN_SDPA_DBIAS_SOFTCAP"
SM90_THD_ENV = "FLASHSPAN_SM90_SDPA_THD"

pytestmark = pytest.mark.usefixtures("poison_uninitialized")


def _random_lens(rng, g, B, Sq, Skv):
    """Half the time, per-sample (seq_len_q, seq_len_kv) with the first sample's queries and the last
    sample's keys at full length; else None (no padding)."""
    if rng.random() >= 0.5:
        return None
    lq = torch.randint(0, Sq + 1, (B,), generator=g)
    lk = torch.randint(0, Skv + 1, (B,), generator=g)
    lq[0], lk[-1] = Sq, Skv
    return (lq, lk)

def _valid_rows(lens, B, Sq, Skv):
    """Boolean masks (B, 1, S_q, 1) and (B, 1, S_kv, 1) of the query and key rows inside each sample (lens as
    _random_lens returns it; None: every row)."""
    lq, lk = lens if lens is not None else (torch.full((B,), Sq), torch.full((B,), Skv))
    mq = (torch.arange(Sq)[None, :] < lq[:, None])[:, None, :, None]
    mk = (torch.arange(Skv)[None, :] < lk[:, None])[:, None, :, None]
    return mq, mk


def _zero_outside(t, m):
    """t with the rows outside the samples (m False) set to 0 (the padding rows' values are checked by the other
    tests)."""
    return torch.where(m, t, torch.zeros((), dtype=t.dtype))



@pytest.fixture
def native(monkeypatch):
    """The default environment of the native route: no FLASHSPAN_SDPA_ROUTE, no FLASHSPAN_EXPERIMENTAL (which does
    not choose the route) and no FLASHSPAN_SDPA_PAGED=0 (which would refuse paged K/V caches)."""
    monkeypatch.delenv(EXPERIMENTAL_ENV, raising=False)
    monkeypatch.delenv(ROUTE_ENV, raising=False)
    monkeypatch.delenv(PAGED_ENV, raising=False)


def _sdpa_module():
    return sys.modules["flashspan.sdpa"]  # flashspan.sdpa is the function


def test_route_choice(fs, monkeypatch):
    """CPU tensors run the CPU reference, other devices the native route, whatever FLASHSPAN_EXPERIMENTAL says and
    whatever FLASHSPAN_SDPA_ROUTE says among its allowed values (unset, native, reference); flex (retired) and other
    values raise (test_sdpa_cpu_masks.py::test_route_switch_flex_is_retired: through the entry points)."""
    route = _sdpa_module()._route
    cpu, meta = torch.empty(1), torch.empty(1, device="meta")
    for value in (None, "native", "reference"):
        if value is None:
            monkeypatch.delenv(ROUTE_ENV, raising=False)
        else:
            monkeypatch.setenv(ROUTE_ENV, value)
        for experimental in (None, "0", "1"):
            if experimental is None:
                monkeypatch.delenv(EXPERIMENTAL_ENV, raising=False)
            else:
                monkeypatch.setenv(EXPERIMENTAL_ENV, experimental)
            assert route(cpu) == "reference" and route(meta) == "native"
    for value in ("flex", " Flex ", "sm80"):
        monkeypatch.setenv(ROUTE_ENV, value)
        with pytest.raises(ValueError, match="^FLASHSPAN_SDPA_ROUTE"):
            route(meta)


@pytest.mark.parametrize("seed", range(6))
def test_native_plumbing_on_cpu(fs, monkeypatch, seed):
    """The native branch of flashspan.sdpa (attn_scale tensors read on the host, then the C operation) on CPU
    tensors, forced through the route: the same results as the default CPU route, bitwise."""
    monkeypatch.delenv(ROUTE_ENV, raising=False)
    p = mask_problem(31_000 + seed, dtype=random.Random(seed).choice([torch.bfloat16, torch.float16]))
    args = dict(p.args)
    args["attn_scale"] = torch.tensor([0.25], dtype=torch.float32) if seed % 2 else 0.25

    lq, lk = p.case.len_q, p.case.len_kv

    def sel(t, lens, thd, offs):  # the samples' rows (THD gaps and padding are not outputs)
        t = t.detach()
        return t[sample_rows(offs, lens)] if thd else valid_rows(t.double(), lens)

    def run():
        ins = [t.detach().clone().requires_grad_() for t in (p.q, p.k, p.v)]
        o, stats = fs.sdpa(*ins, generate_stats=True, **args)
        do = torch.randn(o.shape, generator=torch.Generator().manual_seed(seed)).to(o.dtype)
        dq, dk, dv = torch.autograd.grad(o, ins, do)
        return [sel(o, lq, p.thd_q, p.offsets_q), sel(stats, lq, p.thd_q, p.offsets_q),
                sel(dq, lq, p.thd_q, p.offsets_q), sel(dk, lk, p.thd_kv, p.offsets_kv),
                sel(dv, lk, p.thd_kv, p.offsets_kv)]

    want = run()
    monkeypatch.setattr(_sdpa_module(), "_route", lambda q: "native")
    got = run()
    for a, b in zip(got, want):
        assert torch.equal(a, b)


def _cuda_op(L, lib, direction, setup, hv=1):
    """Creates an SDPA operation on CUDA bf16 descriptors (no GPU needed) with `setup(attrs)` applied."""
    dev = torch.device("cuda", 0)

    def d(shape, dtype=torch.bfloat16):
        stride = [1] * len(shape)
        for i in range(len(shape) - 2, -1, -1):
            stride[i] = stride[i + 1] * shape[i + 1]
        return lib.TensorDesc.from_spec(shape, stride, dtype, dev, "t")

    B, H, S, D = 1, 2, 16, 64
    attrs = L.Attributes(direction == "bwd")
    setup(attrs, d)
    q, k, v, o = d((B, H, S, D)), d((B, 1, S, D)), d((B, hv, S, D)), d((B, H, S, D))
    st = d((B, H, S, 1), torch.float32)
    descs = [q, k, v, o, None] if direction == "fwd" else [q, k, v, o, d((B, H, S, D)), st, d((B, H, S, D)),
                                                            d((B, 1, S, D)), d((B, hv, S, D))]
    return L.Op(direction, descs, attrs)


@pytest.mark.parametrize("experimental", [None, "1"])
@pytest.mark.parametrize("feature,setup", [
    ("attn_scale as a device tensor", lambda a, d: a.set("attn_scale_tensor", d((1,), torch.float32))),
])
def test_cuda_feature_not_native_is_named(fs, feature, setup, monkeypatch, experimental):
    from flashspan import _lib as lib
    from flashspan import _sdpa_lib as L

    if experimental is None:
        monkeypatch.delenv(EXPERIMENTAL_ENV, raising=False)
    else:
        monkeypatch.setenv(EXPERIMENTAL_ENV, experimental)
    with pytest.raises(NotImplementedError, match=f"^{re.escape(feature)}.*not supported on CUDA tensors yet"):
        _cuda_op(L, lib, "fwd", setup)


def _sinks_max_logit(a, d):
    a.set("sink_token", d((2,), torch.float32))
    a.set("max_logit", d((2,), torch.float32))


def _paged_bias(a, d):
    _paged_setup(a, d)
    a.set("bias", d((1, 2, 16, 16)))


def _paged_dropout(a, d):
    _paged_setup(a, d)
    a.set_dropout(0.1, d((1,), torch.int64), d((1,), torch.int64))


FEATURE_PAIRS = [("max_logit together with sink_token", _sinks_max_logit),
                 ("bias together with paged K/V caches", _paged_bias),
                 ("dropout together with paged K/V caches", _paged_dropout)]


@pytest.mark.parametrize("pairs,experimental", [(None, None), (None, "0"), (None, "1"), ("1", None), ("", None),
                                                ("off", None), ("0", None), ("0", "1")])
def test_cuda_feature_pairs_switch(fs, monkeypatch, pairs, experimental):
    """The feature pairs (max_logit with sinks, the bias or dropout with paged K/V; score_max / score_sum_exp with a
    packed O: tests/cpp/test_sdpa_api.cpp) run on CUDA tensors by default, since their GPU tests passed on an H200:
    they pass the host rules (without a GPU check_support then stops at the device). FLASHSPAN_SDPA_FEATURE_PAIRS=0
    (read at each check; only "0") refuses each, naming the pair and the variable; FLASHSPAN_EXPERIMENTAL (their
    switch before) changes neither answer."""
    from flashspan import _lib as lib
    from flashspan import _sdpa_lib as L

    monkeypatch.delenv(PAGED_ENV, raising=False)
    for name, value in ((PAIRS_ENV, pairs), (EXPERIMENTAL_ENV, experimental)):
        if value is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, value)
    for feature, setup in FEATURE_PAIRS:
        if pairs == "0":
            with pytest.raises(NotImplementedError, match=f"^{re.escape(feature)}: turned off on CUDA tensors by "
                                                          r"FLASHSPAN_SDPA_FEATURE_PAIRS=0; CPU tensors run it on the "
                                                          r"CPU reference$"):
                _cuda_op(L, lib, "fwd", setup)
        else:
            try:
                _cuda_op(L, lib, "fwd", setup)
            except NotImplementedError as e:
                pytest.fail(f"{feature} refused with {PAIRS_ENV}={pairs!r}, {EXPERIMENTAL_ENV}={experimental!r}: {e}")
            except Exception:  # noqa: BLE001 (no device here: a later check fails)
                pass


def test_cuda_dbias_with_softcap_runs_on_both_backwards(fs, monkeypatch):
    """The additive bias and dBias run natively; dBias together with softcap too, by default on both backwards (the
    sm90 one's kernel stores dBias's dS before softcap's factor, its GPU test passed on an H100; the sm80 one's dS
    holds that factor, so its dK/dV kernel stores P and P (dP - D) through the dS workspace, its GPU test passed on an
    H200): the call passes this rule on any device (without a GPU it then stops at the device, not here), with
    FLASHSPAN_KERNEL_FAMILY=sm80 too; refused with FLASHSPAN_SDPA_DBIAS_SOFTCAP=0 (the pair's one variable on both
    backwards, read at each check; only "0"), naming the variable; whatever FLASHSPAN_EXPERIMENTAL (the sm80 one's
    switch before) and FLASHSPAN_SDPA_FEATURE_PAIRS (not a feature pair) say; with dropout too, on the sm80 backward
    (refused with FLASHSPAN_SDPA_DBIAS_SOFTCAP_DROPOUT=0)."""
    from flashspan import _lib as lib
    from flashspan import _sdpa_lib as L

    monkeypatch.delenv("FLASHSPAN_EXPERIMENTAL", raising=False)
    monkeypatch.delenv(PAIRS_ENV, raising=False)
    monkeypatch.delenv(DBIAS_SOFTCAP_ENV, raising=False)

    def both(a, d):
        a.set("bias", d((1, 2, 16, 16)))
        a.set("dbias", d((1, 2, 16, 16)))
        a.set("softcap", 5.0)

    turned_off = (r"^dBias together with softcap: turned off on CUDA tensors by FLASHSPAN_SDPA_DBIAS_SOFTCAP=0 \(unset, "
                  r"the sm90 backward runs it on an H100 / H200, head dims up to 128, padded tensors, and the sm80 "
                  r"backward the other calls\); CPU tensors run it on the CPU reference$")

    def passes_the_rule(where):
        try:
            _cuda_op(L, lib, "bwd", both)
        except Exception as e:  # (without a GPU: the device)
            assert not str(e).startswith("dBias together with softcap"), f"{e} ({where})"

    for pairs, experimental, switch in itertools.product((None, "0"), (None, "0", "1"), (None, "1", "", "off", "0")):
        for name, value in ((PAIRS_ENV, pairs), (EXPERIMENTAL_ENV, experimental), (DBIAS_SOFTCAP_ENV, switch)):
            if value is None:
                monkeypatch.delenv(name, raising=False)
            else:
                monkeypatch.setenv(name, value)
        where = f"{PAIRS_ENV}={pairs!r}, {EXPERIMENTAL_ENV}={experimental!r}, {DBIAS_SOFTCAP_ENV}={switch!r}"
        if switch == "0":
            with pytest.raises(NotImplementedError, match=turned_off):
                _cuda_op(L, lib, "bwd", both)
        else:
            passes_the_rule(where)
    for name in (PAIRS_ENV, EXPERIMENTAL_ENV, DBIAS_SOFTCAP_ENV):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("FLASHSPAN_KERNEL_FAMILY", "sm80")
    passes_the_rule("FLASHSPAN_KERNEL_FAMILY=sm80")
    monkeypatch.setenv(DBIAS_SOFTCAP_ENV, "0")
    with pytest.raises(NotImplementedError, match=turned_off):
        _cuda_op(L, lib, "bwd", both)
    monkeypatch.delenv(DBIAS_SOFTCAP_ENV)
    monkeypatch.delenv("FLASHSPAN_KERNEL_FAMILY")

    def with_dropout(a, d):
        both(a, d)
        a.set_dropout(0.1, d((1,), torch.int64), d((1,), torch.int64))

    # With dropout too, on the sm80 backward by default (its GPU test passed on an H100): passes this rule; refused
    # with FLASHSPAN_SDPA_DBIAS_SOFTCAP_DROPOUT=0, naming the variable.
    try:
        _cuda_op(L, lib, "bwd", with_dropout)
    except Exception as e:  # (without a GPU: the device)
        assert not str(e).startswith("dBias together with softcap"), str(e)
    monkeypatch.setenv("FLASHSPAN_SDPA_DBIAS_SOFTCAP_DROPOUT", "0")
    with pytest.raises(NotImplementedError,
                       match=r"^dBias together with softcap and dropout: turned off on CUDA tensors by "
                             r"FLASHSPAN_SDPA_DBIAS_SOFTCAP_DROPOUT=0 \(unset, the sm80 backward runs it\)"):
        _cuda_op(L, lib, "bwd", with_dropout)
    monkeypatch.delenv("FLASHSPAN_SDPA_DBIAS_SOFTCAP_DROPOUT")
    cases = [("fwd", lambda a, d: a.set("bias", d((1, 2, 16, 16)))),
             ("fwd", lambda a, d: (a.set("bias", d((1, 1, 1, 16), torch.float32)), a.set("softcap", 5.0))),
             ("bwd", lambda a, d: (a.set("bias", d((1, 2, 16, 16))), a.set("dbias", d((1, 2, 16, 16)))))]
    for direction, setup in cases:
        try:
            _cuda_op(L, lib, direction, setup)
        except NotImplementedError:
            raise
        except Exception:  # noqa: BLE001 (no device here)
            pass


def test_cuda_heads_and_dims_not_native_are_named(fs):
    from flashspan import _lib as lib
    from flashspan import _sdpa_lib as L

    # H_k != H_v, the output gate with dgate and the score_max / score_sum_exp outputs run natively (without a GPU,
    # check_support stops at the device).
    cases = [("fwd", lambda a, d: None, 2), ("bwd", lambda a, d: None, 2),
             ("fwd", lambda a, d: a.set("gate", d((1, 2, 16, 64))), 1),
             ("bwd", lambda a, d: (a.set("gate", d((1, 2, 16, 64))), a.set("dgate", d((1, 2, 16, 64)))), 1),
             ("fwd", lambda a, d: (a.set("logit_max", d((1, 2, 16, 1), torch.float32)),
                                   a.set("score_sum_exp", d((1, 2, 16, 1), torch.float32))), 1)]
    for direction, setup, hv in cases:
        try:
            _cuda_op(L, lib, direction, setup, hv=hv)
        except NotImplementedError:
            raise
        except Exception:  # noqa: BLE001 (no device here)
            pass


def _paged_setup(a, d):
    """Paged K and V on _cuda_op's descriptors: k / v (1, 1, 16, 64) read as containers of one page of 16 rows."""
    a.set("padding_mask", 1)
    a.set("seq_len_q", d((1,), torch.int32))
    a.set("seq_len_kv", d((1,), torch.int32))
    a.set("paged_attention_k_table", d((1, 1, 1, 1), torch.int32))
    a.set("paged_attention_v_table", d((1, 1, 1, 1), torch.int32))


def test_cuda_paged_switch(fs, monkeypatch):
    """Paged K/V on CUDA tensors pass the feature rules by default (without a GPU, check_support then stops at the
    device) and are refused, naming the switch, with FLASHSPAN_SDPA_PAGED=0 (read by the C layer at each check)."""
    from flashspan import _lib as lib
    from flashspan import _sdpa_lib as L

    monkeypatch.delenv(PAGED_ENV, raising=False)
    try:
        _cuda_op(L, lib, "fwd", _paged_setup)
    except NotImplementedError:
        raise
    except Exception:  # noqa: BLE001 (no device here)
        pass
    monkeypatch.setenv(PAGED_ENV, "0")
    with pytest.raises(NotImplementedError, match=r"^paged_attention_k_table, paged_attention_v_table: paged K/V caches "
                                                  r"on CUDA tensors are turned off by FLASHSPAN_SDPA_PAGED=0"):
        _cuda_op(L, lib, "fwd", _paged_setup)


# ---------------------------------------------------------------------------
# GPU (skipped without one): the native route against the CPU reference
# ---------------------------------------------------------------------------

gpu = pytest.mark.skipif(not cuda_ready(),
                         reason="needs a CUDA device and a libflashspan.so built with CUDA (fs_cuda_available() == 1)")


@gpu
@pytest.mark.parametrize("seed", range(12))
def test_gpu_native_gate_stats_block_mask(fs, native, seed):
    _gate_stats_block_mask_case(fs, seed)


@gpu
@pytest.mark.parametrize("sm90_mods", [None, "0"])
@pytest.mark.parametrize("seed", range(6))
def test_gpu_feature_calls_native_by_default(fs, monkeypatch, seed, sm90_mods):
    """Without FLASHSPAN_EXPERIMENTAL, a CUDA call with features beyond the masks (the gate, the score_max /
    score_sum_exp outputs, the block mask, sinks, softcap) runs on the native route and matches the CPU reference: on an H200 its forward on the sm90 kernel with modifiers by default (since PERF_LOG
    v2.13) and its backward too where the sm90 backward with modifiers covers it (no block mask; since v2.15); on the
    sm80 kernels both ways with FLASHSPAN_SM90_SDPA_MODS=0 and FLASHSPAN_SM90_SDPA_BWD_MODS=0 (read per call;
    docs/SDPA.md "The sm90 forward", "The sm90 backward")."""
    monkeypatch.delenv(EXPERIMENTAL_ENV, raising=False)
    monkeypatch.delenv(ROUTE_ENV, raising=False)
    for name in ("FLASHSPAN_SM90_SDPA_MODS", "FLASHSPAN_SM90_SDPA_BWD_MODS"):
        if sm90_mods is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, sm90_mods)
    _gate_stats_block_mask_case(fs, 100 + seed)


def _gate_stats_block_mask_case(fs, seed):
    """The output gate O * sigmoid(G) (forward epilogue; dgate and dO * sigmoid(G) in the backward, through autograd),
    the score_max / score_sum_exp outputs (natural units whatever stats_use_log2 says) and the 128x128 block_mask
    (broadcast forms) on the native route against the CPU reference on the same inputs, with causal / padding /
    sinks / softcap / GQA drawn at random."""
    from criteria import check_stat, check_tensor, grad_floor

    rng = random.Random(900 + seed)
    dtype = rng.choice([torch.bfloat16, torch.float16])
    B, Hq = rng.choice([1, 2]), rng.choice([2, 4])
    Hk = rng.choice([1, Hq])
    Sq, Skv = rng.randint(1, 300), rng.randint(1, 400)
    D = rng.choice([32, 64, 128])
    g = torch.Generator().manual_seed(900 + seed)
    q = torch.randn(B, Hq, Sq, D, generator=g).to(dtype)
    k = torch.randn(B, Hk, Skv, D, generator=g).to(dtype)
    v = torch.randn(B, Hk, Skv, D, generator=g).to(dtype)
    gate = (torch.randn(B, Hq, Sq, D, generator=g) * 2).to(dtype)
    kw = {}
    if rng.random() < 0.5:
        kw.update(diagonal_band_right_bound=0, diagonal_alignment=rng.choice(["TOP_LEFT", "BOTTOM_RIGHT"]))
    if rng.random() < 0.3:
        kw["softcap"] = 5.0
    backward = rng.random() < 0.6  # base-2 stats only without gradients (the backward takes natural-log stats)
    if not backward:
        kw["stats_use_log2"] = rng.random() < 0.5
    scale = 2.0 / math.sqrt(D)
    sinks = torch.randn(Hq, generator=g) if rng.random() < 0.4 else None
    lens = _random_lens(rng, g, B, Sq, Skv)
    use_gate = seed % 3 != 2
    stats_out = seed % 3 != 1
    bm = None
    if seed % 2:
        nq, nk = -(-Sq // 128), -(-(-(-Skv // 128)) // 8)
        shape = (rng.choice([1, B]), rng.choice([1, Hq]), nq, nk)
        bm = (torch.randint(0, 256, shape, generator=g) | torch.randint(0, 256, shape, generator=g)).to(torch.uint8)

    def run(dev):
        ins = [t.to(dev).requires_grad_(backward) for t in (q, k, v)]
        gt = gate.to(dev).requires_grad_(backward) if use_gate else None
        extra = dict(kw)
        if lens is not None:
            extra.update(use_padding_mask=True, seq_len_q=lens[0].to(dev), seq_len_kv=lens[1].to(dev))
        if stats_out:
            extra.update(score_max=torch.full((B, Hq, Sq, 1), float("nan"), device=dev),
                         score_sum_exp=torch.full((B, Hq, Sq, 1), float("nan"), device=dev))
        sk = sinks.to(dev) if sinks is not None else None
        if bm is not None:
            extra["block_mask"] = bm.to(dev)
        o, stats = fs.sdpa(*ins, generate_stats=True, attn_scale=scale, sink_token=sk, gate=gt, **extra)
        out = [o, stats]
        if backward:
            do = torch.randn(o.shape, generator=torch.Generator().manual_seed(seed + 1)).to(o.dtype).to(dev)
            leaves = ins + ([gt] if gt is not None else [])
            out += list(torch.autograd.grad(o, leaves, do))
        if stats_out:
            out += [extra["score_max"], extra["score_sum_exp"]]
        return [t.detach().cpu() for t in out]

    want, got = run("cpu"), run("cuda")
    mq, mk = _valid_rows(lens, B, Sq, Skv)
    z = _zero_outside

    check_tensor(z(got[0], mq), z(want[0], mq), dtype, "o")
    check_stat(torch.where(mq, got[1], 0.0), torch.where(mq, want[1], 0.0), "stats")
    n = 2
    if backward:
        fl = grad_floor(scale, D, 4.5, 4.5, 4.5)
        check_tensor(z(got[2], mq), z(want[2], mq), dtype, "dq", floor=fl)
        check_tensor(z(got[3], mk), z(want[3], mk), dtype, "dk", floor=fl)
        check_tensor(z(got[4], mk), z(want[4], mk), dtype, "dv")
        n = 5
        if use_gate:
            check_tensor(z(got[5], mq), z(want[5], mq), dtype, "dgate")
            n = 6
    if stats_out:
        # Every row, padding included (-inf / 0 there, and for rows that see nothing).
        check_stat(got[n], want[n], "score_max")
        check_stat(got[n + 1].log(), want[n + 1].log(), "log score_sum_exp")  # relative: sums reach S_kv



@gpu
@pytest.mark.parametrize("seed", range(40))
def test_gpu_native_against_cpu_reference(fs, native, seed):
    """flashspan.sdpa on CUDA tensors through the native kernels: O, stats and gradients against the CPU reference
    on the same inputs (gpu_case_against_cpu_reference: padding NaN-poisoned, THD with gaps and empty samples, GQA,
    both alignments)."""
    gpu_case_against_cpu_reference(fs, 40_000 + seed)


@gpu
@pytest.mark.parametrize("family", ["sm90", "sm80"])
@pytest.mark.parametrize("seed", range(16))
def test_gpu_native_forward_family(fs, native, monkeypatch, family, seed):
    """The same comparison with the kernel family of the forward and the backward chosen by FLASHSPAN_KERNEL_FAMILY
    (read per call): on an H200 "sm90" runs the sm90 forward and backward with the analytic mask for the calls they
    cover (docs/SDPA.md "The sm90 forward", "The sm90 backward"; the others and "sm80" the sm80 kernels)."""
    monkeypatch.setenv("FLASHSPAN_KERNEL_FAMILY", family)
    gpu_case_against_cpu_reference(fs, 41_000 + seed)


@gpu
@pytest.mark.parametrize("family", ["sm90", "sm80"])
@pytest.mark.parametrize("D,causal,mods", [(64, False, False), (128, True, False), (128, True, True)])
def test_gpu_a_nan_logit_row_is_nan_as_on_the_cpu(fs, native, monkeypatch, family, D, causal, mods):
    """A NaN in one query row: that row's O and LSE are NaN on the GPU kernels as on the CPU reference (softmax.cuh
    lse_from_stats: l NaN is not a row without keys), dQ of the row NaN; every other row finite."""
    monkeypatch.setenv("FLASHSPAN_KERNEL_FAMILY", family)
    g = torch.Generator().manual_seed(D + causal)
    q, k, v = (torch.randn(1, 2, 200, D, generator=g).bfloat16().cuda() for _ in range(3))
    q[0, 1, 100, 3] = float("nan")
    kw = {"attn_scale": D ** -0.5, "generate_stats": True}
    if causal:
        kw["diagonal_band_right_bound"] = 0
    if mods:
        kw["softcap"] = 20.0
    o, stats = fs.sdpa(q, k, v, **kw)
    bad = torch.zeros(1, 2, 200, dtype=torch.bool, device="cuda")
    bad[0, 1, 100] = True
    assert o[bad].isnan().all() and stats[bad].isnan().all(), (o[bad], stats[bad])
    assert o[~bad].isfinite().all() and stats[~bad].isfinite().all()
    kw.pop("generate_stats")
    dq = fs.sdpa_backward(q, k, v, o, torch.randn_like(o), stats, **kw)[0]
    assert dq[bad].isnan().all() and dq[~bad].isfinite().all()


@gpu
@pytest.mark.parametrize("varlen", [False, True])
def test_gpu_native_custom_ops(fs, native, varlen):
    """torch.ops.flashspan.sdpa_fwd / sdpa_bwd (sdpa_torch) on the native route against the CPU reference, dense and
    THD with an empty sample; the deterministic backward bitwise reproducible."""
    g = torch.Generator().manual_seed(11)
    if varlen:
        cu = torch.tensor([0, 100, 100, 333], dtype=torch.int32)
        q, k, v = (torch.randn(333, 4, 64, generator=g).bfloat16() for _ in range(3))
        kw = dict(is_causal=True, cu_seqlens_q=cu, cu_seqlens_kv=cu, max_seqlen_q=233, max_seqlen_kv=233)
    else:
        q, k, v = (torch.randn(2, 4, 200, 64, generator=g).bfloat16() for _ in range(3))
        kw = dict(is_causal=True, window_left=50, causal_bottom_right=True)

    def run(dev):
        leaves = [t.to(dev).requires_grad_() for t in (q, k, v)]
        kwd = {n: (t.to(dev) if isinstance(t, torch.Tensor) else t) for n, t in kw.items()}
        o, lse = fs.sdpa_torch(*leaves, return_lse=True, **kwd)
        do = torch.randn(o.shape, generator=torch.Generator().manual_seed(1)).to(o.dtype).to(dev)
        grads = torch.autograd.grad(o, leaves, do)
        return [t.detach().cpu() for t in (o, lse) + grads]

    want = run("cpu")
    got = run("cuda")
    for name, a, b in zip(("o", "lse", "dq", "dk", "dv"), got, want):
        assert_close(a, b, torch.bfloat16 if name != "lse" else torch.float32, name)
    prev = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled())
    torch.use_deterministic_algorithms(True, warn_only=True)  # sdpa_bwd's is_deterministic follows it
    try:
        first, second = run("cuda"), run("cuda")
    finally:
        torch.use_deterministic_algorithms(prev[0], warn_only=prev[1])
    for a, b in zip(first, second):
        assert torch.equal(a, b)


@gpu
@pytest.mark.parametrize("sm90_thd", [None, "0"])
@pytest.mark.parametrize("seed", range(6))
def test_gpu_native_thd_forward(fs, native, monkeypatch, sm90_thd, seed):
    """Packed (THD) q, k, v with cu_seq_len on both sides (samples of random lengths, an empty one, gaps: none; GQA;
    causal in both alignments or a window; head dims of every sm90 family) against the CPU reference: O and the
    packed stats. By default an H100 / H200 runs them on the sm90 forward through per-sample tensor maps (dispatch's
    sdpa_sm90_thd_enabled; on by default since its GPU tests passed), with FLASHSPAN_SM90_SDPA_THD=0 (and on other
    GPUs) on the sm80 forward; the results are the same either way."""
    if sm90_thd is None:
        monkeypatch.delenv(SM90_THD_ENV, raising=False)
    else:
        monkeypatch.setenv(SM90_THD_ENV, sm90_thd)
    rng = random.Random(900 + seed)
    g = torch.Generator().manual_seed(900 + seed)
    B, Hk = rng.randint(1, 4), rng.choice([1, 2])
    Hq = Hk * rng.choice([1, 2, 4])
    D, Dv = rng.choice([(64, 64), (128, 128), (40, 120), (192, 128), (256, 256)])
    lq = [rng.randint(0, 300) for _ in range(B)]
    lk = [rng.randint(0, 330) for _ in range(B)]
    lq[-1], lk[-1] = max(lq[-1], 1), max(lk[-1], 1)
    cu_q = torch.tensor([0, *itertools.accumulate(lq)], dtype=torch.int32)
    cu_k = torch.tensor([0, *itertools.accumulate(lk)], dtype=torch.int32)
    dt = rng.choice([torch.bfloat16, torch.float16])
    q = torch.randn(sum(lq), Hq, D, generator=g).to(dt)
    k = torch.randn(sum(lk), Hk, D, generator=g).to(dt)
    v = torch.randn(sum(lk), Hk, Dv, generator=g).to(dt)
    kw = dict(attn_scale=1 / math.sqrt(D), generate_stats=True, use_padding_mask=True,
              max_total_seq_len_q=sum(lq), max_total_seq_len_kv=sum(lk))
    if seed % 3 == 0:
        kw.update(diagonal_band_right_bound=0, diagonal_alignment=rng.choice(["TOP_LEFT", "BOTTOM_RIGHT"]))
    elif seed % 3 == 1:
        kw.update(diagonal_band_left_bound=rng.randint(1, 100), diagonal_band_right_bound=rng.randint(0, 40))

    def run(dev):
        return fs.sdpa(q.to(dev), k.to(dev), v.to(dev), cu_seq_len_q=cu_q.to(dev), cu_seq_len_kv=cu_k.to(dev), **kw)

    o_ref, s_ref = run("cpu")
    o, stats = run("cuda")
    assert_close(o.cpu(), o_ref, dt, "o")
    assert_close(stats.cpu(), s_ref, torch.float32, "stats")


@gpu
@pytest.mark.parametrize("sm90_thd", [None, "0"])
@pytest.mark.parametrize("seed", range(4))
def test_gpu_native_thd_backward(fs, native, monkeypatch, sm90_thd, seed):
    """THD through torch.ops.flashspan.sdpa_fwd / sdpa_bwd (sdpa_torch with cu_seqlens; samples of random lengths,
    an empty one; GQA; causal; head dims (64, 64), (128, 128), (192, 128)) against the CPU reference: O, the LSE and
    dQ, dK, dV. By default an H100 / H200 runs both passes on the sm90 kernels through per-sample tensor maps (on by
    default since their GPU tests passed), with FLASHSPAN_SM90_SDPA_THD=0 (and on other GPUs) on the sm80 kernels."""
    if sm90_thd is None:
        monkeypatch.delenv(SM90_THD_ENV, raising=False)
    else:
        monkeypatch.setenv(SM90_THD_ENV, sm90_thd)
    rng = random.Random(950 + seed)
    g = torch.Generator().manual_seed(950 + seed)
    B, Hk = rng.randint(2, 4), rng.choice([1, 2])
    Hq = Hk * rng.choice([1, 2])
    D, Dv = ((64, 64), (128, 128), (192, 128), (128, 128))[seed]
    lens = [rng.randint(0, 260) for _ in range(B)]
    if seed % 2:
        lens[0] = 0  # a sample without rows or keys
    lens[-1] = max(lens[-1], 1)
    cu = torch.tensor([0, *itertools.accumulate(lens)], dtype=torch.int32)
    T = sum(lens)
    q = torch.randn(T, Hq, D, generator=g).bfloat16()
    k = torch.randn(T, Hk, D, generator=g).bfloat16()
    v = torch.randn(T, Hk, Dv, generator=g).bfloat16()
    kw = dict(is_causal=True, cu_seqlens_q=cu, cu_seqlens_kv=cu, max_seqlen_q=max(lens), max_seqlen_kv=max(lens))

    def run(dev):
        leaves = [t.to(dev).requires_grad_() for t in (q, k, v)]
        kwd = {n: (t.to(dev) if isinstance(t, torch.Tensor) else t) for n, t in kw.items()}
        o, lse = fs.sdpa_torch(*leaves, return_lse=True, **kwd)
        do = torch.randn(o.shape, generator=torch.Generator().manual_seed(2)).to(o.dtype).to(dev)
        grads = torch.autograd.grad(o, leaves, do)
        return [t.detach().cpu() for t in (o, lse) + grads]

    want, got = run("cpu"), run("cuda")
    for name, a, b in zip(("o", "lse", "dq", "dk", "dv"), got, want):
        assert_close(a, b, torch.bfloat16 if name != "lse" else torch.float32, name)


@gpu
@pytest.mark.parametrize("dims", [(64, 64), (128, 128), (192, 128), (256, 256)])
@pytest.mark.parametrize("align", ["TOP_LEFT", "BOTTOM_RIGHT"])
def test_gpu_native_dense_causal_dims(fs, native, dims, align):
    """Causal in both alignments with S_q != S_kv, GQA, every GPU head dim family, q in BSHD memory: O and stats
    against the CPU reference."""
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 8, 300, dims[0], generator=g).bfloat16()
    k = torch.randn(2, 2, 517, dims[0], generator=g).bfloat16()
    v = torch.randn(2, 2, 517, dims[1], generator=g).bfloat16()
    kw = dict(attn_scale=1 / math.sqrt(dims[0]), diagonal_band_right_bound=0, diagonal_alignment=align,
              generate_stats=True)
    o_ref, s_ref = fs.sdpa(q, k, v, **kw)
    o, stats = fs.sdpa(q.cuda().transpose(1, 2).contiguous().transpose(1, 2), k.cuda(), v.cuda(), **kw)
    assert_close(o.cpu(), o_ref, torch.bfloat16, "o")
    assert_close(stats.cpu(), s_ref, torch.float32, "stats")


@gpu
def test_gpu_native_unsupported_feature_named(fs, native):
    q, k, v = (torch.randn(1, 2, 16, 16, dtype=torch.bfloat16, device="cuda") for _ in range(3))
    with pytest.raises(NotImplementedError, match="head dims"):
        q2 = torch.randn(1, 2, 16, 136, dtype=torch.bfloat16, device="cuda")
        fs.sdpa(q2, q2, q2)


@gpu
@pytest.mark.parametrize("seed", range(16))
def test_gpu_native_score_modifiers(fs, native, seed):
    """Issue 24's score modifiers on the native route against the CPU reference on the same inputs: softcap (and its
    derivative), ALiBi (causal), sinks with dSink through autograd, attn_scale as a host (1, 1, 1, 1) tensor, H_k != H_v,
    padding; bf16 / fp16."""
    from criteria import check_stat, check_tensor, grad_floor

    rng = random.Random(seed)
    dtype = rng.choice([torch.bfloat16, torch.float16])
    B, Hq = rng.choice([1, 2]), rng.choice([2, 4, 6])
    Hk = rng.choice([h for h in (1, 2, 3, 6) if Hq % h == 0 and h <= Hq])
    Hv = Hk if rng.random() < 0.7 else rng.choice([h for h in (1, 2, Hq) if Hq % h == 0])
    Sq, Skv = rng.randint(1, 260), rng.randint(1, 260)
    D = rng.choice([32, 64, 128])
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, Hq, Sq, D, generator=g).to(dtype)
    k = torch.randn(B, Hk, Skv, D, generator=g).to(dtype)
    v = torch.randn(B, Hv, Skv, D, generator=g).to(dtype)
    kw = dict(diagonal_band_right_bound=0)
    if rng.random() < 0.5:
        kw["diagonal_alignment"] = "BOTTOM_RIGHT"
    if rng.random() < 0.5:
        kw["use_alibi_mask"] = True
    if rng.random() < 0.6:
        kw["softcap"] = rng.choice([2.0, 5.0, 30.0])
    scale = rng.choice([1.0, 3.0]) / math.sqrt(D)
    kw["attn_scale"] = torch.full((1, 1, 1, 1), scale) if rng.random() < 0.5 else scale
    sinks = torch.randn(Hq, generator=g) * 1.5 if rng.random() < 0.6 else None
    lens = _random_lens(rng, g, B, Sq, Skv)
    backward = True

    def run(dev):
        ins = [t.to(dev).requires_grad_(backward) for t in (q, k, v)]
        extra = {n: (t.to(dev) if isinstance(t, torch.Tensor) and n != "attn_scale" else t) for n, t in kw.items()}
        if lens is not None:
            extra.update(use_padding_mask=True, seq_len_q=lens[0].to(dev), seq_len_kv=lens[1].to(dev))
        sk = sinks.to(dev).requires_grad_(backward) if sinks is not None else None
        o, stats = fs.sdpa(*ins, generate_stats=True, sink_token=sk, **extra)
        out = [o, stats]
        if backward:
            do = torch.randn(o.shape, generator=torch.Generator().manual_seed(seed + 1)).to(o.dtype).to(dev)
            leaves = ins + ([sk] if sk is not None else [])
            out += list(torch.autograd.grad(o, leaves, do))
        return [t.detach().cpu() for t in out]

    want, got = run("cpu"), run("cuda")
    mq, mk = _valid_rows(lens, B, Sq, Skv)
    z = _zero_outside

    check_tensor(z(got[0], mq), z(want[0], mq), dtype, "o")
    check_stat(torch.where(mq, got[1], 0.0), torch.where(mq, want[1], 0.0), "stats")
    if backward:
        fl = grad_floor(scale, D, 4.5, 4.5, 4.5)
        check_tensor(z(got[2], mq), z(want[2], mq), dtype, "dq", floor=fl)
        check_tensor(z(got[3], mk), z(want[3], mk), dtype, "dk", floor=fl)
        check_tensor(z(got[4], mk), z(want[4], mk), dtype, "dv")
        if sinks is not None:
            # dSink sums -P_sink D over rows, D = rowsum(dO O) with each side's own O rounded to the input dtype:
            # the input dtype's criterion (bf16 cases measured 0.0031-0.0033 relative L2 on an H200 with the lazy
            # sm90 forward, above fp16's 0.003; the C++ chain tests share one O instead).
            check_tensor(got[5], want[5], dtype, "dsink")



@gpu
@pytest.mark.parametrize("seed", range(24))
def test_gpu_native_paged(fs, native, seed):
    """Paged K/V caches (forward, no gradients: the seed has no paged backward) on the native route against the CPU
    reference on the same paged inputs: prefill and decode, page sizes 1 .. 256 per side (below, at and above the
    kernels' 64-key block), shuffled pages with NaN unused pages, ragged lengths (a sample without keys), a packed V
    table or K alone paged, GQA, head dims 64 / 128 / (192, 128), bf16 / fp16, causal bottom-right or none (paged K/V
    on CUDA tensors run by default: the `native` fixture clears FLASHSPAN_SDPA_PAGED)."""
    _check_native_paged(fs, seed)


@pytest.mark.skipif(not (cuda_ready() and torch.cuda.get_device_capability(0) == (9, 0)),
                    reason="the sm90 paged forward runs on an H100 / H200 only")
@pytest.mark.parametrize("seed", range(16))
@pytest.mark.parametrize("sm90_paged", ["on", "off"])
def test_gpu_native_paged_sm90(fs, native, monkeypatch, seed, sm90_paged):
    """Paged K/V caches on the sm90 forward (on by default; FLASHSPAN_SM90_SDPA_PAGED=0 keeps the sm80 paged kernel,
    the "off" cases): test_gpu_native_paged's inputs on the calls that kernel takes -- prefill (S_q H_q / H_k above
    16, not the decode forward's), pages of 8 .. 256 keys per side, head dims up to 128."""
    if sm90_paged == "on":
        monkeypatch.delenv("FLASHSPAN_SM90_SDPA_PAGED", raising=False)
    else:
        monkeypatch.setenv("FLASHSPAN_SM90_SDPA_PAGED", "0")
    _check_native_paged(fs, 5100 + seed, sm90=True)


def _check_native_paged(fs, seed, sm90=False):
    """The body of test_gpu_native_paged (seed: its own seed; sm90: the sm90 paged forward's calls)."""
    from criteria import check_stat, check_tensor
    from test_sdpa_cpu_features import _paged

    rng = random.Random(5000 + seed)
    g = torch.Generator().manual_seed(5000 + seed)
    dtype = rng.choice([torch.bfloat16, torch.float16])
    B, Hk = rng.randint(1, 4), rng.choice([1, 2])
    Hq = Hk * rng.choice([1, 2, 4])
    Dqk, Dv = rng.choice([(64, 64), (128, 128), (40, 72)] if sm90 else [(64, 64), (128, 128), (192, 128)])
    decode = seed % 2 == 0 and not sm90
    Sq = 1 if decode else rng.randint(17 if sm90 else 1, 300 if sm90 else 200)
    Skv = rng.randint(1, 600)
    if sm90:
        bs_k, bs_v = rng.choice([8, 16, 64, 128, 256]), rng.choice([8, 32, 64, 128, 256])
    else:
        bs_k, bs_v = rng.choice([1, 4, 16, 64, 128, 256]), rng.choice([1, 2, 8, 32, 64, 256])
    lk = [rng.randint(0, Skv) for _ in range(B)]
    lk[-1] = Skv
    if B > 1 and rng.random() < 0.3:
        lk[0] = 0
    lq = [1 if decode else rng.randint(0, Sq) for _ in range(B)]
    lq[0] = Sq
    q = torch.randn(B, Hq, Sq, Dqk, generator=g).to(dtype)
    kd = torch.randn(B, Hk, Skv, Dqk, generator=g).to(dtype)
    vd = torch.randn(B, Hk, Skv, Dv, generator=g).to(dtype)
    k_alone = rng.random() < 0.2
    packed = Pv = None
    kc, kt, _ = _paged(kd, lk, bs_k, g)
    vc, vt, ventries = _paged(vd, lk, bs_v, g)
    kw = dict(use_padding_mask=True, paged_attention_k_table=kt, paged_attention_max_seq_len_kv=Skv,
              attn_scale=1.0 / math.sqrt(Dqk), generate_stats=True)
    v_in = vd if k_alone else vc
    if not k_alone:
        kw["paged_attention_v_table"] = vt
        if rng.random() < 0.4:  # packed V page table through ragged offsets
            flat = [e for row in ventries for e in row]
            offs = [0]
            for row in ventries:
                offs.append(offs[-1] + len(row))
            Pv = vt.shape[2]
            packed = torch.tensor(flat + [-1] * Pv, dtype=torch.int32)  # room for a full row at the last offset
            kw["paged_attention_v_table"] = packed.as_strided((B, 1, Pv, 1), (0, Pv, 1, 1))
            kw["ragged_offsets"] = {"paged_attention_v_table": torch.tensor(offs, dtype=torch.int32)}
    if rng.random() < 0.5:
        kw.update(diagonal_band_right_bound=0, diagonal_alignment="BOTTOM_RIGHT")

    def run(dev):
        extra = {n: (t.to(dev) if isinstance(t, torch.Tensor) else t) for n, t in kw.items()}
        if "ragged_offsets" in kw:
            # A packed table is a view of its entries' storage: move the storage, then view it again.
            extra["ragged_offsets"] = {n: t.to(dev) for n, t in kw["ragged_offsets"].items()}
            extra["paged_attention_v_table"] = packed.to(dev).as_strided((B, 1, Pv, 1), (0, Pv, 1, 1))
        with torch.no_grad():
            o, stats = fs.sdpa(q.to(dev), kc.to(dev), v_in.to(dev), seq_len_q=torch.tensor(lq).to(dev),
                               seq_len_kv=torch.tensor(lk).to(dev), **extra)
        return o.cpu(), stats.cpu()

    (ow, sw), (og, sg) = run("cpu"), run("cuda")
    mq = (torch.arange(Sq)[None, :] < torch.tensor(lq)[:, None])[:, None, :, None]
    check_tensor(torch.where(mq, og, 0), torch.where(mq, ow, 0), dtype, "o")
    check_stat(torch.where(mq, sg, 0.0), torch.where(mq, sw, 0.0), "stats")


@gpu
@pytest.mark.parametrize("seed", range(16))
def test_gpu_native_bias(fs, native, seed):
    """The additive bias on the native route against the CPU reference on the same inputs: every broadcast form of
    (1|B, 1|H_q, 1|S_q, 1|S_kv), float32 or q's dtype, a non-contiguous (sliced) bias, dBias through autograd (reduced
    over the broadcast dims; not with softcap: test_gpu_native_dbias_with_softcap), with causal / padding /
    ALiBi / sinks / GQA drawn at random; bf16 / fp16."""
    _check_native_bias(fs, seed)


@pytest.mark.skipif(not (cuda_ready() and torch.cuda.get_device_capability(0) == (9, 0)),
                    reason="the sm90 backward's dBias with softcap (H100 / H200; the sm80 one's: SdpaGpu."
                           "Sm80BackwardDbiasWithSoftcap)")
@pytest.mark.parametrize("seed", range(8))
def test_gpu_native_dbias_with_softcap(fs, native, monkeypatch, seed):
    """dBias together with softcap on the sm90 backward (on by default since its C++ GPU test passed on an H100;
    FLASHSPAN_SDPA_DBIAS_SOFTCAP unset here): test_gpu_native_bias's cases with softcap 2-30 and the backward always,
    head dims up to 128."""
    monkeypatch.delenv(DBIAS_SOFTCAP_ENV, raising=False)
    _check_native_bias(fs, 1350 + seed, softcap=[2.0, 5.0, 12.0, 30.0][seed % 4])


def _check_native_bias(fs, seed, softcap=None):
    """test_gpu_native_bias's case `seed`; softcap: that softcap with the backward always (dBias with softcap)."""
    from criteria import check_reduced_grad, check_stat, check_tensor, grad_floor

    rng = random.Random(1300 + seed)
    dtype = rng.choice([torch.bfloat16, torch.float16])
    B, Hq = rng.choice([1, 2]), rng.choice([2, 4])
    Hk = rng.choice([1, Hq])
    Sq, Skv = rng.randint(1, 260), rng.randint(1, 300)
    D = rng.choice([32, 64, 128])
    g = torch.Generator().manual_seed(1300 + seed)
    q = torch.randn(B, Hq, Sq, D, generator=g).to(dtype)
    k = torch.randn(B, Hk, Skv, D, generator=g).to(dtype)
    v = torch.randn(B, Hk, Skv, D, generator=g).to(dtype)
    form = seed % 16  # bit d set: dimension d of the bias broadcast (size 1)
    shape = [1 if form >> d & 1 else n for d, n in enumerate((B, Hq, Sq, Skv))]
    bias_dtype = torch.float32 if rng.random() < 0.3 else dtype
    wide = (torch.randn(*shape[:3], shape[3] + 5, generator=g) * 1.5).to(bias_dtype)
    strided = rng.random() < 0.4  # a slice of a wider tensor (row stride S_kv + 5) on both devices
    bias = wide[..., 2:2 + shape[3]]
    backward = rng.random() < 0.75
    kw = {}
    if rng.random() < 0.5:
        kw.update(diagonal_band_right_bound=0, diagonal_alignment=rng.choice(["TOP_LEFT", "BOTTOM_RIGHT"]))
        if rng.random() < 0.4:
            kw["use_alibi_mask"] = True
    if not backward and rng.random() < 0.4:
        kw["softcap"] = 5.0
    if softcap is not None:  # (after every draw of the plain cases: their inputs stay as they were)
        backward = True
        kw["softcap"] = softcap
    scale = rng.choice([1.0, 2.0]) / math.sqrt(D)
    sinks = torch.randn(Hq, generator=g) if rng.random() < 0.3 else None
    lens = _random_lens(rng, g, B, Sq, Skv)

    def run(dev, full=False):
        ins = [t.to(dev).requires_grad_(backward) for t in (q, k, v)]
        bs = wide.to(dev)[..., 2:2 + shape[3]]
        if full:  # the bias expanded to (B, H_q, S_q, S_kv): its gradient is dS itself
            bs = bs.expand(B, Hq, Sq, Skv)
        bs = (bs if strided and not full else bs.contiguous()).detach().requires_grad_(backward)
        extra = dict(kw)
        if lens is not None:
            extra.update(use_padding_mask=True, seq_len_q=lens[0].to(dev), seq_len_kv=lens[1].to(dev))
        sk = sinks.to(dev) if sinks is not None else None
        o, stats = fs.sdpa(*ins, generate_stats=True, attn_scale=scale, bias=bs, sink_token=sk, **extra)
        out = [o, stats]
        if backward:
            do = torch.randn(o.shape, generator=torch.Generator().manual_seed(seed + 7)).to(o.dtype).to(dev)
            out += list(torch.autograd.grad(o, ins + [bs], do))
        return [t.detach().cpu() for t in out]

    want, got = run("cpu"), run("cuda")
    mq, mk = _valid_rows(lens, B, Sq, Skv)
    z = _zero_outside

    check_tensor(z(got[0], mq), z(want[0], mq), dtype, "o")
    check_stat(torch.where(mq, got[1], 0.0), torch.where(mq, want[1], 0.0), "stats")
    if backward:
        fl = grad_floor(scale, D, 4.5, 4.5, 4.5)
        check_tensor(z(got[2], mq), z(want[2], mq), dtype, "dq", floor=fl)
        check_tensor(z(got[3], mk), z(want[3], mk), dtype, "dk", floor=fl)
        check_tensor(z(got[4], mk), z(want[4], mk), dtype, "dv")
        # dBias (bias's dtype and shape): the sum of dS over the broadcast dims. Over keys that sum cancels
        # (sum_j dS_ij = D_i P_sink: 0 without a sink), so its error is bounded by the rounding of the terms, not by
        # the result: check_reduced_grad against the reference's sum of |dS| over the same dims.
        assert got[5].shape == bias.shape and got[5].dtype == bias.dtype
        ds_abs = run("cpu", full=True)[5].double().abs()
        mass = ds_abs.sum(dim=[d for d in range(4) if shape[d] == 1], keepdim=True)
        check_reduced_grad(got[5].float(), want[5].float(), mass, dtype, "dbias")


@gpu
@pytest.mark.parametrize("seed", range(12))
def test_gpu_native_dropout(fs, native, seed):
    """Dropout on the native route against the CPU reference on the same inputs: Philox (seed / offset as int32 or
    int64 device tensors; rng_dump equal to the reference's) and the caller's mask form (uint8, float32 or q's dtype,
    broadcast forms, a scale tensor), forward and gradients (the backward regenerates the same multipliers), with
    causal / padding / bias drawn at random; bf16 / fp16."""
    from criteria import check_stat, check_tensor, grad_floor

    rng = random.Random(1700 + seed)
    dtype = rng.choice([torch.bfloat16, torch.float16])
    B, Hq = rng.choice([1, 2]), rng.choice([2, 4])
    Hk = rng.choice([1, Hq])
    Sq, Skv = rng.randint(1, 200), rng.randint(1, 260)
    D = rng.choice([32, 64, 128])
    g = torch.Generator().manual_seed(1700 + seed)
    q = torch.randn(B, Hq, Sq, D, generator=g).to(dtype)
    k = torch.randn(B, Hk, Skv, D, generator=g).to(dtype)
    v = torch.randn(B, Hk, Skv, D, generator=g).to(dtype)
    prob = rng.choice([0.1, 0.3, 0.5])
    philox = seed % 3 != 2
    if philox:
        idt = rng.choice([torch.int32, torch.int64])
        sd = torch.tensor([rng.randint(-2 ** 30, 2 ** 30)], dtype=idt)
        off = torch.tensor([rng.randint(0, 2 ** 20)], dtype=idt)
    else:
        form = rng.randrange(16)
        mshape = [1 if form >> d & 1 else n for d, n in enumerate((B, Hq, Sq, Skv))]
        mask = (torch.rand(*mshape, generator=g) >= prob).to(rng.choice([torch.uint8, torch.float32, dtype]))
        mscale = torch.tensor([1.0 / (1.0 - prob)])
    kw = {}
    if rng.random() < 0.5:
        kw.update(diagonal_band_right_bound=0, diagonal_alignment=rng.choice(["TOP_LEFT", "BOTTOM_RIGHT"]))
    bias = (torch.randn(1, Hq, Sq, Skv, generator=g)).to(dtype) if rng.random() < 0.3 else None
    scale = 1.0 / math.sqrt(D)
    lens = _random_lens(rng, g, B, Sq, Skv)

    def run(dev):
        ins = [t.to(dev).requires_grad_() for t in (q, k, v)]
        extra = dict(kw)
        if lens is not None:
            extra.update(use_padding_mask=True, seq_len_q=lens[0].to(dev), seq_len_kv=lens[1].to(dev))
        dump = None
        if philox:
            dump = torch.full((B, Hq, Sq, Skv), 7, dtype=torch.uint8, device=dev)
            extra.update(dropout=(prob, sd.to(dev), off.to(dev)), rng_dump=dump)
        else:
            extra["dropout"] = (mask.to(dev), mscale.to(dev))
        if bias is not None:
            extra["bias"] = bias.to(dev)
        o, stats = fs.sdpa(*ins, generate_stats=True, attn_scale=scale, **extra)
        do = torch.randn(o.shape, generator=torch.Generator().manual_seed(seed + 3)).to(o.dtype).to(dev)
        out = [o, stats] + list(torch.autograd.grad(o, ins, do))
        if dump is not None:
            out.append(dump)
        return [t.detach().cpu() for t in out]

    want, got = run("cpu"), run("cuda")
    mq, mk = _valid_rows(lens, B, Sq, Skv)
    z = _zero_outside

    if philox:
        assert torch.equal(got[5], want[5]), "rng_dump"
    mult = 1.0 / (1.0 - prob)
    check_tensor(z(got[0], mq), z(want[0], mq), dtype, "o")
    check_stat(torch.where(mq, got[1], 0.0), torch.where(mq, want[1], 0.0), "stats")
    fl = grad_floor(scale, D, 4.5, 4.5 * mult, 4.5)
    check_tensor(z(got[2], mq), z(want[2], mq), dtype, "dq", floor=fl)
    check_tensor(z(got[3], mk), z(want[3], mk), dtype, "dk", floor=fl)
    check_tensor(z(got[4], mk), z(want[4], mk), dtype, "dv")


@gpu
def test_gpu_default_route_is_native(fs, monkeypatch):
    """A CUDA call takes the native route on every GPU and kernel family, every GPU head dim, with or without
    features; FLASHSPAN_SDPA_ROUTE=flex (the retired lowering onto flex) raises naming the variable."""
    route = _sdpa_module()._route
    monkeypatch.delenv(ROUTE_ENV, raising=False)
    monkeypatch.delenv("FLASHSPAN_KERNEL_FAMILY", raising=False)
    q = torch.zeros(1, 2, 16, 16, device="cuda", dtype=torch.bfloat16)
    assert route(q) == "native"
    monkeypatch.setenv("FLASHSPAN_KERNEL_FAMILY", "sm80")
    assert route(q) == "native"
    monkeypatch.setenv(ROUTE_ENV, "native")
    assert route(q) == "native"
    monkeypatch.setenv(ROUTE_ENV, "flex")
    monkeypatch.delenv("FLASHSPAN_KERNEL_FAMILY")
    with pytest.raises(ValueError, match=r"^FLASHSPAN_SDPA_ROUTE=flex: .* was retired"):
        fs.sdpa(q, q, q)


# ---------------------------------------------------------------------------
# The random pure-mask configurations (sdpa_cases.mask_problem) on CUDA tensors against the CPU reference
# ---------------------------------------------------------------------------


def _to_cuda(x):
    if isinstance(x, torch.Tensor):
        return x.cuda()
    if isinstance(x, dict):
        return {n: _to_cuda(t) for n, t in x.items()}
    if isinstance(x, tuple):
        return tuple(_to_cuda(t) for t in x)
    return x


def _gpu_head_dims_ok(dqk: int, dv: int) -> bool:
    """Head dims the GPU kernels run (src/dispatch/family.h, check_head_dims_gpu)."""
    small = lambda d: 0 < d <= 128 and d % 8 == 0  # noqa: E731
    return (small(dqk) and small(dv)) or (dqk, dv) in ((192, 128), (256, 256))


def gpu_case_against_cpu_reference(fs, seed):
    """mask_problem(20_000 + seed) on the CPU reference, then on CUDA tensors (the native route): outputs, stats and
    gradients compared on the samples' rows."""
    p = mask_problem(20_000 + seed, dtype=random.Random(seed).choice([torch.bfloat16, torch.float16]))
    if not _gpu_head_dims_ok(p.q.shape[-1], p.v.shape[-1]):
        pytest.skip("head dims no GPU kernel runs")
    ins = [t.detach().clone().requires_grad_() for t in (p.q, p.k, p.v)]
    o, stats = fs.sdpa(*ins, generate_stats=True, **p.args)
    g = torch.Generator().manual_seed(seed)
    do = torch.randn(o.shape, generator=g).to(o.dtype)
    grads = torch.autograd.grad(o, ins, do)
    gins = [t.detach().cuda().requires_grad_() for t in (p.q, p.k, p.v)]
    og, sg = fs.sdpa(*gins, generate_stats=True, **_to_cuda(p.args))
    ggrads = torch.autograd.grad(og, gins, do.cuda())
    lq, lk = p.case.len_q, p.case.len_kv

    def sel(t, lens, thd, offs):
        t = t.detach().cpu()
        if thd:
            return t[sample_rows(offs, lens)]
        return valid_rows(t.double(), lens)

    assert_close(sel(og, lq, p.thd_q, p.offsets_q), sel(o, lq, p.thd_q, p.offsets_q), p.dtype, "o")
    assert_close(sel(sg, lq, p.thd_q, p.offsets_q), sel(stats, lq, p.thd_q, p.offsets_q), torch.float32, "stats")
    for n, a, b, lens, thd, offs in (("dq", grads[0], ggrads[0], lq, p.thd_q, p.offsets_q),
                                     ("dk", grads[1], ggrads[1], lk, p.thd_kv, p.offsets_kv),
                                     ("dv", grads[2], ggrads[2], lk, p.thd_kv, p.offsets_kv)):
        assert_close(sel(b, lens, thd, offs), sel(a, lens, thd, offs), p.dtype, n)
