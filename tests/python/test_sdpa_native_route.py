"""The experimental native SDPA route (FLASHSPAN_EXPERIMENTAL=1): CUDA calls of flashspan.sdpa, sdpa_backward and
the custom ops go to the C layer's SDPA operation (its GPU kernels) instead of the flex lowering. CPU tests: the
route choice, the route's Python plumbing (run on CPU tensors, where the operation runs the CPU reference), and the
C layer's NotImplementedError naming each feature the GPU kernels do not run (CUDA descriptors, no GPU needed).
GPU tests (skipped without one) compare the native route with the CPU reference."""

import random
import re

import pytest
import torch

from conftest import cuda_ready
from sdpa_cases import valid_rows
from test_sdpa_flex_lowering import _rows, mask_problem
from test_sdpa_flex_lowering import test_gpu_custom_ops_deterministic_backward as _custom_ops_case
from test_sdpa_flex_lowering import test_gpu_random_lowered_against_cpu_reference as _lowering_gpu_case

pytestmark = pytest.mark.usefixtures("poison_uninitialized")


@pytest.fixture
def native(monkeypatch):
    from flashspan import sdpa_lowering

    monkeypatch.setenv(sdpa_lowering.EXPERIMENTAL_ENV, "1")
    monkeypatch.delenv(sdpa_lowering.ROUTE_ENV, raising=False)
    return sdpa_lowering


def test_route_choice(fs, monkeypatch):
    from flashspan import sdpa_lowering as sl

    cpu, meta = torch.empty(1), torch.empty(1, device="meta")
    monkeypatch.delenv(sl.ROUTE_ENV, raising=False)
    monkeypatch.delenv(sl.EXPERIMENTAL_ENV, raising=False)
    assert sl.route(cpu) == "reference" and sl.route(meta) == "flex"
    monkeypatch.setenv(sl.EXPERIMENTAL_ENV, "1")
    assert sl.route(cpu) == "reference" and sl.route(meta) == "native"
    monkeypatch.setenv(sl.EXPERIMENTAL_ENV, "0")
    assert sl.route(meta) == "flex"
    monkeypatch.setenv(sl.ROUTE_ENV, "flex")
    monkeypatch.setenv(sl.EXPERIMENTAL_ENV, "1")
    assert sl.route(cpu) == "flex" and sl.route(meta) == "native"


@pytest.mark.parametrize("seed", range(6))
def test_native_plumbing_on_cpu(fs, monkeypatch, seed):
    """The native branch of flashspan.sdpa (attn_scale tensors read on the host, then the C operation) on CPU
    tensors, forced through the route: the same results as the default CPU route, bitwise."""
    from flashspan import sdpa_lowering as sl

    monkeypatch.delenv(sl.ROUTE_ENV, raising=False)
    p = mask_problem(31_000 + seed, dtype=random.Random(seed).choice([torch.bfloat16, torch.float16]))
    args = dict(p.args)
    args["attn_scale"] = torch.tensor([0.25], dtype=torch.float32) if seed % 2 else 0.25

    lq, lk = p.case.len_q, p.case.len_kv

    def sel(t, lens, thd, offs):  # the samples' rows (THD gaps and padding are not outputs)
        t = t.detach()
        return t[_rows(offs, lens)] if thd else valid_rows(t.double(), lens)

    def run():
        ins = [t.detach().clone().requires_grad_() for t in (p.q, p.k, p.v)]
        o, stats = fs.sdpa(*ins, generate_stats=True, **args)
        do = torch.randn(o.shape, generator=torch.Generator().manual_seed(seed)).to(o.dtype)
        dq, dk, dv = torch.autograd.grad(o, ins, do)
        return [sel(o, lq, p.thd_q, p.offsets_q), sel(stats, lq, p.thd_q, p.offsets_q),
                sel(dq, lq, p.thd_q, p.offsets_q), sel(dk, lk, p.thd_kv, p.offsets_kv),
                sel(dv, lk, p.thd_kv, p.offsets_kv)]

    want = run()
    monkeypatch.setattr(sl, "route", lambda q: "native")
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


@pytest.mark.parametrize("feature,setup", [
    ("bias", lambda a, d: a.set("bias", d((1, 2, 16, 16)))),
    ("use_alibi_mask (ALiBi)", lambda a, d: (a.set("causal_mask", 1), a.set("alibi_mask", 1))),
    ("softcap", lambda a, d: a.set("softcap", 30.0)),
    ("sink_token (attention sinks)", lambda a, d: a.set("sink_token", d((2,), torch.float32))),
    ("dropout", lambda a, d: a.set_dropout(0.1, d((1,), torch.int64), d((1,), torch.int64))),
    ("block_mask", lambda a, d: a.set("block_mask", d((1, 1, 1, 1), torch.uint8))),
    ("gate", lambda a, d: a.set("gate", d((1, 2, 16, 64)))),
    ("score_max", lambda a, d: a.set("logit_max", d((1, 2, 16, 1), torch.float32))),
    ("score_sum_exp", lambda a, d: a.set("score_sum_exp", d((1, 2, 16, 1), torch.float32))),
    ("attn_scale as a tensor", lambda a, d: a.set("attn_scale_tensor", d((1,), torch.float32))),
])
def test_cuda_feature_not_native_is_named(fs, feature, setup):
    from flashspan import _lib as lib
    from flashspan import _sdpa_lib as L

    with pytest.raises(NotImplementedError, match=f"^{re.escape(feature)}.*not supported on CUDA tensors yet"):
        _cuda_op(L, lib, "fwd", setup)


def test_cuda_heads_and_dims_not_native_are_named(fs):
    from flashspan import _lib as lib
    from flashspan import _sdpa_lib as L

    with pytest.raises(NotImplementedError, match=r"^k, v: H_k = 1 != H_v = 2"):
        _cuda_op(L, lib, "fwd", lambda a, d: None, hv=2)
    with pytest.raises(NotImplementedError, match=r"^gate: not supported"):
        _cuda_op(L, lib, "bwd", lambda a, d: (a.set("gate", d((1, 2, 16, 64))), a.set("dgate", d((1, 2, 16, 64)))))


# ---------------------------------------------------------------------------
# GPU (skipped without one): the native route against the CPU reference
# ---------------------------------------------------------------------------

gpu = pytest.mark.skipif(not cuda_ready(),
                         reason="needs a CUDA device and a libflashspan.so built with CUDA (fs_cuda_available() == 1)")


@gpu
@pytest.mark.parametrize("seed", range(40))
def test_gpu_native_against_cpu_reference(fs, native, monkeypatch, seed):
    """flashspan.sdpa on CUDA tensors through the native kernels: O, stats and gradients against the CPU reference
    on the same inputs (the lowering's GPU comparison: padding NaN-poisoned, THD with gaps and empty samples, GQA,
    both alignments; its 200 seeds run on this route with FLASHSPAN_EXPERIMENTAL=1 too)."""
    _lowering_gpu_case(fs, monkeypatch, 40_000 + seed)


@gpu
@pytest.mark.parametrize("varlen", [False, True])
def test_gpu_native_custom_ops(fs, native, monkeypatch, varlen):
    """torch.ops.flashspan.sdpa_fwd / sdpa_bwd (sdpa_torch) on the native route against the CPU reference, dense and
    THD with an empty sample; the deterministic backward bitwise reproducible."""
    _custom_ops_case(fs, monkeypatch, varlen)


@gpu
def test_gpu_native_unsupported_feature_named(fs, native):
    q, k, v = (torch.randn(1, 2, 16, 16, dtype=torch.bfloat16, device="cuda") for _ in range(3))
    with pytest.raises(NotImplementedError, match="^softcap: not supported on CUDA tensors yet"):
        fs.sdpa(q, k, v, softcap=5.0)
    with pytest.raises(NotImplementedError, match="head dims"):
        q2 = torch.randn(1, 2, 16, 136, dtype=torch.bfloat16, device="cuda")
        fs.sdpa(q2, q2, q2)
