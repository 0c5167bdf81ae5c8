"""Contracts of the seed API (nvidia-cudnn-frontend 1.32.0, cudnn.flex_attention) that a caller switching by
one import line relies on: signatures, keyword names, metadata, debug_snapshot, return conventions and
exception classes. One test per item of issue 11; the seed's documented examples are in test_seed_examples.py.
CPU tensors (the CPU reference backend) unless a test says otherwise."""

import dataclasses
import inspect
import warnings

import pytest
import torch
from conftest import cuda_ready
from flex_ref import assert_close, make_problem

P = inspect.Parameter
POS, KW = P.POSITIONAL_OR_KEYWORD, P.KEYWORD_ONLY
REQ = P.empty

# (name, kind, default) of every parameter, as the seed declares them.
SEED_SIGNATURES = {
    "create_mask_plan": [
        ("mask_func", POS, REQ), ("q", POS, REQ), ("k", POS, REQ), ("v", POS, REQ),
        ("cu_seqlens_q", KW, None), ("cu_seqlens_k", KW, None), ("max_seqlen_q", KW, None),
        ("max_seqlen_k", KW, None), ("pack_gqa", KW, None), ("build_backward", KW, None),
    ],
    "flex_attn_func": [
        ("q", POS, REQ), ("k", POS, REQ), ("v", POS, REQ), ("mask_plan", KW, REQ), ("softmax_scale", KW, None),
        ("deterministic", KW, False), ("return_lse", KW, False), ("return_max_logit", KW, False),
    ],
    "FlexAttentionFwd": [
        ("sample_q", POS, REQ), ("sample_k", POS, REQ), ("sample_v", POS, REQ), ("sample_o", POS, REQ),
        ("sample_mask_plan", POS, REQ), ("sample_lse", POS, None), ("sm90_use_smem_mask_pipeline", KW, True),
        ("sample_max_logit", KW, None),
    ],
    "FlexAttentionFwd.execute": [
        ("q_tensor", POS, REQ), ("k_tensor", POS, REQ), ("v_tensor", POS, REQ), ("o_tensor", POS, REQ),
        ("mask_plan", POS, REQ), ("lse_tensor", POS, None), ("workspace", KW, None), ("softmax_scale", KW, None),
        ("current_stream", KW, None), ("max_logit_tensor", KW, None),
    ],
    "FlexAttentionBwd": [
        ("sample_q", POS, REQ), ("sample_k", POS, REQ), ("sample_v", POS, REQ), ("sample_o", POS, REQ),
        ("sample_do", POS, REQ), ("sample_lse", POS, REQ), ("sample_dq", POS, REQ), ("sample_dk", POS, REQ),
        ("sample_dv", POS, REQ), ("sample_mask_plan", POS, REQ), ("sample_dlse", POS, None),
        ("deterministic", KW, False),
    ],
    "FlexAttentionBwd.execute": [
        ("q_tensor", POS, REQ), ("k_tensor", POS, REQ), ("v_tensor", POS, REQ), ("o_tensor", POS, REQ),
        ("do_tensor", POS, REQ), ("lse_tensor", POS, REQ), ("dq_tensor", POS, REQ), ("dk_tensor", POS, REQ),
        ("dv_tensor", POS, REQ), ("mask_plan", POS, REQ), ("dlse_tensor", POS, None), ("workspace", KW, REQ),
        ("softmax_scale", KW, None), ("current_stream", KW, None),
    ],
}

METADATA_FIELDS = [
    ("mode", str), ("arch", int), ("device", torch.device), ("dtype", torch.dtype), ("batch_size", int),
    ("total_q", int), ("total_k", int), ("max_seqlen_q", int), ("max_seqlen_k", int), ("num_q_heads", int),
    ("num_kv_heads", int), ("head_dim", int), ("head_dim_v", int), ("hmask", int), ("nfunc", int),
    ("pack_gqa", bool), ("has_backward", bool),
]


def _signature(fs, name):
    obj = fs
    for part in name.split("."):
        obj = getattr(obj, part)
    params = list(inspect.signature(obj).parameters.values())
    if params and params[0].name == "self":
        params = params[1:]
    return [(p.name, p.kind, p.default) for p in params]


# flashspan's keyword-only additions (docs/SEED_API.md): appended after the seed's parameters, with
# defaults that keep the seed's behaviour.
EXTENSIONS = {"create_mask_plan": [("arch", KW, None)]}


@pytest.mark.parametrize("name", sorted(SEED_SIGNATURES))
def test_signature_is_the_seeds(fs, name):
    assert _signature(fs, name) == SEED_SIGNATURES[name] + EXTENSIONS.get(name, [])


# -- item 1: plan.metadata ----------------------------------------------------------------------------


@pytest.mark.parametrize("varlen", [False, True])
def test_metadata_is_a_frozen_record_with_the_seeds_fields(fs, varlen):
    p = make_problem(1, varlen=varlen, batch=2, seqlen_q=[9, 13] if varlen else 11, seqlen_k=[7, 5] if varlen else 6,
                     hq=4, hkv=2, hm=4, nfunc=3, dqk=16, dv=8)
    plan = fs.create_mask_plan(p.mask_func, p.q, p.k, p.v, build_backward=True, **p.plan_kwargs())
    m = plan.metadata
    assert dataclasses.is_dataclass(m)
    assert [(f.name) for f in dataclasses.fields(m)] == [n for n, _ in METADATA_FIELDS]
    for name, typ in METADATA_FIELDS:
        assert isinstance(getattr(m, name), typ), name
    with pytest.raises(dataclasses.FrozenInstanceError):
        m.batch_size = 3
    assert m.mode == ("varlen" if varlen else "fixed")
    assert m.arch == 0  # CPU plan: no GPU architecture
    assert (m.device, m.dtype) == (torch.device("cpu"), torch.float32)
    assert (m.batch_size, m.num_q_heads, m.num_kv_heads, m.head_dim, m.head_dim_v, m.hmask, m.nfunc) == (
        2, 4, 2, 16, 8, 4, 3)
    if varlen:
        assert (m.total_q, m.total_k, m.max_seqlen_q, m.max_seqlen_k) == (22, 12, 13, 7)
    else:
        assert (m.total_q, m.total_k, m.max_seqlen_q, m.max_seqlen_k) == (22, 12, 11, 6)
    assert m.has_backward is True and m.pack_gqa is plan.pack_gqa
    assert plan.metadata is m  # one immutable record per plan


@pytest.mark.skipif(not cuda_ready(), reason="needs a CUDA GPU")
def test_metadata_arch_is_the_devices_sm(fs):
    p = make_problem(2, batch=1, seqlen_q=64, seqlen_k=64, hq=2, hkv=2, dtype=torch.bfloat16, device="cuda")
    plan = fs.create_mask_plan(p.mask_func, p.q, p.k, p.v)
    major, minor = torch.cuda.get_device_capability()
    assert plan.metadata.arch == major * 10 + minor  # 90 on an H100/H200, as the seed reports
    assert plan.metadata.device == p.q.device


# -- item 2: debug_snapshot ----------------------------------------------------------------------------


@pytest.mark.parametrize("varlen", [False, True])
@pytest.mark.parametrize("build_backward", [False, True])
def test_debug_snapshot_has_the_seeds_shape(fs, varlen, build_backward):
    p = make_problem(3, varlen=varlen, batch=2, seqlen_q=[40, 90] if varlen else 70, seqlen_k=[30, 100] if varlen else 80,
                     hq=2, hkv=1, hm=2, nfunc=3)
    plan = fs.create_mask_plan(p.mask_func, p.q, p.k, p.v, build_backward=build_backward, **p.plan_kwargs())
    snap = plan.debug_snapshot()
    assert set(snap) == {"metadata", "forward", "backward", "dq", "cu_seqlens_q", "cu_seqlens_k"}
    assert snap["metadata"] is plan.metadata
    groups = ["forward"] + (["backward", "dq"] if build_backward else [])
    for g in groups:
        assert isinstance(snap[g], dict) and snap[g], g
        for name, t in snap[g].items():
            assert isinstance(t, torch.Tensor) and t.dtype == torch.int32 and t.device == plan.device, (g, name)
    if not build_backward:
        assert snap["backward"] is None and snap["dq"] is None
    # The array names docs/SEED_API.md lists.
    q2k = {"q_block_start", "k_block_start", "q2k_partial_ptr", "q2k_partial_kb", "q2k_partial_bits",
           "q2k_full_ptr", "q2k_full_runs"}
    assert set(snap["forward"]) == q2k | {"tasks"}
    if build_backward:
        assert set(snap["backward"]) == q2k | {"tasks", "k2q_partial_ptr", "k2q_partial_qb", "k2q_partial_idx",
                                               "k2q_full_ptr", "k2q_full_runs"}
        assert set(snap["dq"]) == q2k
    # The arrays are the plan's own (fwd_* / bwd_* without the prefix), copied.
    for name, t in snap["forward"].items():
        assert t.tolist() == plan.array("fwd_" + name).tolist(), name
    assert snap["forward"]["q2k_partial_ptr"][-1].item() == plan.fwd_partial_blocks
    if build_backward:
        assert "k2q_partial_ptr" in snap["backward"] and "q2k_partial_ptr" in snap["dq"]
        assert not any(n.startswith("k2q_") for n in snap["dq"])
    if varlen:
        assert snap["cu_seqlens_q"].tolist() == [0, 40, 130] and snap["cu_seqlens_k"].tolist() == [0, 30, 130]
    else:
        assert snap["cu_seqlens_q"] is None and snap["cu_seqlens_k"] is None
    # Copies: changing them leaves the plan as it was.
    snap["forward"]["q2k_partial_ptr"].zero_()
    assert plan.debug_snapshot()["forward"]["q2k_partial_ptr"][-1].item() == plan.fwd_partial_blocks


# -- items 3 and 4: constructor and execute keywords ------------------------------------------------------


def _explicit(fs, seed=4, dlse=False):
    p = make_problem(seed, batch=2, seqlen_q=17, seqlen_k=21, hq=4, hkv=2, nfunc=3)
    plan = fs.create_mask_plan(p.mask_func, p.q, p.k, p.v, build_backward=True)
    out = torch.full(plan.out_shape(), float("nan"))
    lse = torch.full(plan.lse_shape(), float("nan"))
    return p, plan, out, lse


def test_seed_keyword_names_work_end_to_end(fs):
    p, plan, out, lse = _explicit(fs)
    ml = torch.empty(4)
    fwd = fs.FlexAttentionFwd(sample_q=p.q, sample_k=p.k, sample_v=p.v, sample_o=out, sample_mask_plan=plan,
                              sample_lse=lse, sm90_use_smem_mask_pipeline=False, sample_max_logit=ml)
    assert fwd.check_support() is True
    fwd.compile()
    ws = torch.empty(fwd.workspace_size, dtype=torch.uint8)
    fwd.execute(q_tensor=p.q, k_tensor=p.k, v_tensor=p.v, o_tensor=out, mask_plan=plan, lse_tensor=lse,
                workspace=ws, softmax_scale=0.3, current_stream=None, max_logit_tensor=ml)
    ro, rl, rm = p.reference(scale=0.3)
    assert_close(out, ro, torch.float32, "out")
    assert_close(lse, rl, torch.float32, "lse")
    assert_close(ml, rm, torch.float32, "max_logit")

    gen = torch.Generator().manual_seed(1)
    do, dlse = torch.randn(out.shape, generator=gen), torch.randn(lse.shape, generator=gen)
    dq, dk, dv = (torch.full_like(t, float("nan")) for t in (p.q, p.k, p.v))
    bwd = fs.FlexAttentionBwd(sample_q=p.q, sample_k=p.k, sample_v=p.v, sample_o=out, sample_do=do, sample_lse=lse,
                              sample_dq=dq, sample_dk=dk, sample_dv=dv, sample_mask_plan=plan, sample_dlse=dlse,
                              deterministic=True)
    bwd.check_support()
    bwd.compile()
    ws = torch.empty(bwd.workspace_size, dtype=torch.uint8)
    bwd.execute(q_tensor=p.q, k_tensor=p.k, v_tensor=p.v, o_tensor=out, do_tensor=do, lse_tensor=lse,
                dq_tensor=dq, dk_tensor=dk, dv_tensor=dv, mask_plan=plan, dlse_tensor=dlse, workspace=ws,
                softmax_scale=0.3, current_stream=None)
    leaves = [t.detach().double().requires_grad_(True) for t in (p.q, p.k, p.v)]
    ref_out, ref_lse = p.reference(*leaves, scale=0.3)[:2]
    fin = torch.isfinite(ref_lse)
    want = torch.autograd.grad((ref_out * do.double()).sum() + (ref_lse[fin] * dlse.double()[fin]).sum(), leaves)
    for name, g, w in zip("qkv", (dq, dk, dv), want):
        assert_close(g, w, torch.float32, f"d{name}", factor=4)


def test_backward_11th_positional_is_dlse(fs):
    """The seed's 11th positional argument of FlexAttentionBwd and of its execute() is dlse; the
    old form execute(..., plan, dlse, workspace=ws) failed with "multiple values for workspace"."""
    p, plan, out, lse = _explicit(fs, 5)
    do, dlse = torch.randn(out.shape), torch.randn(lse.shape)
    dq, dk, dv = (torch.empty_like(t) for t in (p.q, p.k, p.v))
    bwd = fs.FlexAttentionBwd(p.q, p.k, p.v, out, do, lse, dq, dk, dv, plan, dlse)
    assert bwd.has_dlse
    bwd.compile()
    bwd.execute(p.q, p.k, p.v, out, do, lse, dq, dk, dv, plan, dlse, workspace=torch.empty(0, dtype=torch.uint8))
    with pytest.raises(TypeError, match=r"sample_dlse \(11th argument\) must be a torch.Tensor or None, got float"):
        fs.FlexAttentionBwd(p.q, p.k, p.v, out, do, lse, dq, dk, dv, plan, 0.5)


def test_return_conventions(fs):
    p, plan, _, _ = _explicit(fs, 6)
    fwd_out = torch.empty(plan.out_shape())
    fwd = fs.FlexAttentionFwd(p.q, p.k, p.v, fwd_out, plan)
    assert fwd.check_support() is True
    assert fwd.compile() is None
    assert isinstance(fwd.workspace_size, int) and fwd.workspace_size >= 0
    assert fwd.execute(p.q, p.k, p.v, fwd_out, plan) is None
    r = fs.flex_attn_func(p.q, p.k, p.v, mask_plan=plan)
    assert isinstance(r, torch.Tensor)
    for flags, n in (((True, False), 2), ((False, True), 2), ((True, True), 3)):
        r = fs.flex_attn_func(p.q, p.k, p.v, mask_plan=plan, return_lse=flags[0], return_max_logit=flags[1])
        assert isinstance(r, tuple) and len(r) == n
        assert all(t.dtype == torch.float32 for t in r[1:])
    out, lse, ml = r
    assert lse.shape == (2, 4, 17) and ml.shape == (4,)


# -- item 5: exception classes ---------------------------------------------------------------------------


def test_device_mismatch_is_value_error(fs):
    p, plan, out, lse = _explicit(fs, 7)
    meta = [t.to("meta") for t in (p.q, p.k, p.v)]
    with pytest.raises(ValueError, match=r"^flex_attn_func: q is on meta but the mask plan was built for cpu"):
        fs.flex_attn_func(*meta, mask_plan=plan)


def test_explicit_api_dtype_and_device_mismatch_is_value_error(fs):
    p, plan, out, lse = _explicit(fs, 8)
    fwd = fs.FlexAttentionFwd(p.q, p.k, p.v, out, plan, lse)
    fwd.compile()
    with pytest.raises(ValueError, match=r"^FlexAttentionFwd.execute: q_tensor: dtype torch.float64 differs"):
        fwd.execute(p.q.double(), p.k, p.v, out, plan, lse)
    with pytest.raises(ValueError, match=r"^FlexAttentionFwd.execute: lse_tensor: device meta differs"):
        fwd.execute(p.q, p.k, p.v, out, plan, lse.to("meta"))


@pytest.mark.parametrize("flag", ["deterministic", "return_lse", "return_max_logit"])
@pytest.mark.parametrize("value", [1, 0, "yes", None, torch.tensor(True)])
def test_non_bool_flags_are_type_errors(fs, flag, value):
    p, plan, out, lse = _explicit(fs, 9)
    with pytest.raises(TypeError, match=rf"^flex_attn_func: {flag}: must be a bool"):
        fs.flex_attn_func(p.q, p.k, p.v, mask_plan=plan, **{flag: value})


def test_non_bool_flags_of_the_explicit_api_and_planner(fs):
    p, plan, out, lse = _explicit(fs, 10)
    dq, dk, dv = (torch.empty_like(t) for t in (p.q, p.k, p.v))
    with pytest.raises(TypeError, match=r"^FlexAttentionBwd: deterministic: must be a bool"):
        fs.FlexAttentionBwd(p.q, p.k, p.v, out, out, lse, dq, dk, dv, plan, deterministic="yes")
    with pytest.raises(TypeError, match=r"^FlexAttentionFwd: sm90_use_smem_mask_pipeline: must be a bool"):
        fs.FlexAttentionFwd(p.q, p.k, p.v, out, plan, lse, sm90_use_smem_mask_pipeline=1)
    for name in ("pack_gqa", "build_backward"):
        with pytest.raises(TypeError,
                           match=rf"^create_mask_plan: {name}: must be a bool \(True or False\) or None, got int"):
            fs.create_mask_plan(p.mask_func, p.q, p.k, p.v, **{name: 1})


def test_execute_before_compile_is_runtime_error(fs):
    p, plan, out, lse = _explicit(fs, 11)
    fwd = fs.FlexAttentionFwd(p.q, p.k, p.v, out, plan, lse)
    with pytest.raises(RuntimeError, match=r"^FlexAttentionFwd.execute: compile\(\) must be called before execute"):
        fwd.execute(p.q, p.k, p.v, out, plan, lse)
    fwd.check_support()  # supported but not compiled: still a RuntimeError
    with pytest.raises(RuntimeError, match="compile"):
        fwd.execute(p.q, p.k, p.v, out, plan, lse)
    dq, dk, dv = (torch.empty_like(t) for t in (p.q, p.k, p.v))
    bwd = fs.FlexAttentionBwd(p.q, p.k, p.v, out, out, lse, dq, dk, dv, plan)
    with pytest.raises(RuntimeError, match=r"^FlexAttentionBwd.execute: compile\(\) must be called"):
        bwd.execute(p.q, p.k, p.v, out, out, lse, dq, dk, dv, plan, workspace=None)


# -- item 6: pack_gqa with per-head masks, workspace -----------------------------------------------------


def test_pack_gqa_true_with_per_head_masks_is_value_error(fs):
    p = make_problem(12, batch=1, seqlen_q=8, seqlen_k=40, hq=4, hkv=2, hm=4)
    with pytest.raises(ValueError, match=r"pack_gqa=True needs a mask shared by all query heads \(Hmask = 1\), got "
                                         r"Hmask = 4"):
        fs.create_mask_plan(p.mask_func, p.q, p.k, p.v, pack_gqa=True)
    assert fs.create_mask_plan(p.mask_func, p.q, p.k, p.v, pack_gqa=False).metadata.pack_gqa is False


def test_workspace_is_any_contiguous_aligned_buffer(fs):
    """Any dtype (used as bytes); checked for size, contiguity and 128-byte alignment when bytes are needed."""
    from flashspan.execution import _workspace_ptr

    cpu = torch.device("cpu")
    ws = torch.empty(64, dtype=torch.float32)  # 256 bytes
    ptr, n = _workspace_ptr(ws, 0, cpu, "f")
    assert n == 256
    if ws.data_ptr() % 128 == 0:
        assert _workspace_ptr(ws, 256, cpu, "f") == (ws.data_ptr(), 256)
        with pytest.raises(ValueError, match=r"^f: workspace has 256 bytes but this call needs workspace_size = 257"):
            _workspace_ptr(ws, 257, cpu, "f")
        with pytest.raises(ValueError, match=r"^f: workspace must start on a 128-byte boundary"):
            _workspace_ptr(ws[1:], 16, cpu, "f")
        with pytest.raises(ValueError, match=r"^f: workspace must be contiguous"):
            _workspace_ptr(ws.view(8, 8).t(), 16, cpu, "f")
    with pytest.raises(ValueError, match=r"^f: workspace: this call needs a workspace of at least 16 bytes"):
        _workspace_ptr(None, 16, cpu, "f")
    with pytest.raises(ValueError, match=r"^f: workspace is on meta but the call runs on cpu"):
        _workspace_ptr(ws.to("meta"), 16, cpu, "f")


# -- our earlier names keep working, with a DeprecationWarning where they conflict ----------------------


def test_deprecated_forms_still_work(fs):
    p, plan, out, lse = _explicit(fs, 13)
    want = fs.flex_attn_func(p.q, p.k, p.v, mask_plan=plan, softmax_scale=0.5)
    with pytest.warns(DeprecationWarning, match="positionally is deprecated"):
        got = fs.flex_attn_func(p.q, p.k, p.v, plan, 0.5)
    assert torch.equal(got, want)
    with pytest.raises(TypeError, match="multiple values for argument 'mask_plan'"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            fs.flex_attn_func(p.q, p.k, p.v, plan, mask_plan=plan)
    with pytest.warns(DeprecationWarning, match="positionally is deprecated"):
        plan2 = fs.create_mask_plan(p.mask_func, p.q, p.k, p.v, None, None, None, None, None, True)
    assert plan2.has_backward
    with pytest.warns(DeprecationWarning, match="keyword 'plan' is deprecated; use 'sample_mask_plan'"):
        fwd = fs.FlexAttentionFwd(p.q, p.k, p.v, out, plan=plan, lse=lse)
    fwd.compile()
    with pytest.warns(DeprecationWarning, match="keyword 'lse' is deprecated; use 'lse_tensor'"):
        fwd.execute(p.q, p.k, p.v, out, plan, lse=lse)
    with pytest.raises(TypeError, match="unexpected keyword argument 'bogus'"):
        fwd.execute(p.q, p.k, p.v, out, plan, lse, bogus=1)
    # The old flat properties stay (they do not clash with the seed's names).
    assert (plan.batch, plan.num_heads_q, plan.head_dim_qk) == (plan.metadata.batch_size, plan.metadata.num_q_heads,
                                                               plan.metadata.head_dim)


# -- item 6 and the newcomer's papercuts: empty geometries ----------------------------------------------


def test_thd_with_max_seqlen_q_zero_is_accepted(fs):
    """The seed accepts THD with max_seqlen_q = 0 (every query sample empty): empty outputs, zero gradients."""
    q = torch.randn(0, 2, 16, requires_grad=True)
    k = torch.randn(3, 2, 16, requires_grad=True)
    v = torch.randn(3, 2, 16, requires_grad=True)
    cu_q, cu_k = torch.tensor([0, 0], dtype=torch.int32), torch.tensor([0, 3], dtype=torch.int32)
    plan = fs.create_mask_plan(torch.zeros(1, 1, 0, dtype=torch.int32), q, k, v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k,
                               max_seqlen_q=0, max_seqlen_k=3)
    assert plan.metadata.max_seqlen_q == 0 and plan.metadata.total_q == 0
    out, lse = fs.flex_attn_func(q, k, v, mask_plan=plan, return_lse=True)
    assert out.shape == (0, 2, 16) and lse.shape == (2, 0)
    out.sum().backward()
    assert torch.equal(k.grad, torch.zeros_like(k)) and torch.equal(v.grad, torch.zeros_like(v))
    with pytest.raises(ValueError, match=r"max_seqlen_q: must be >= 0 for THD, got -1"):
        fs.create_mask_plan(torch.zeros(1, 1, 0, dtype=torch.int32), q, k, v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k,
                            max_seqlen_q=-1, max_seqlen_k=3)
    for name in ("max_seqlen_q", "max_seqlen_k"):
        # A bound of 2^31 or more is rejected by name (it overflowed tile arithmetic before: fuzz regression).
        huge = {"max_seqlen_q": 0, "max_seqlen_k": 3, name: 2**63 - 1}
        with pytest.raises(ValueError, match=name + r": must be below 2\^31 \(cu_seqlens are int32\), got 9223372036854775807"):
            fs.create_mask_plan(torch.zeros(1, 1, 0, dtype=torch.int32), q, k, v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k,
                                **huge)


def test_bshd_batch_zero_is_a_clear_value_error(fs):
    """The seed rejects B = 0 for BSHD with ValueError; ours said "geometry: cu_seqlens copies must have B+1 entries"."""
    q = torch.randn(0, 4, 2, 16)
    with pytest.raises(ValueError, match=r"^create_mask_plan: q: batch size B \(dim 0\) must be in \[1, 2\^31\) for BSHD, "
                                         r"got 0"):
        fs.create_mask_plan(torch.zeros(1, 1, 0, dtype=torch.int32), q, q, q)


def test_empty_query_forward_then_backward(fs):
    """S = 0: autograd hands the backward an expanded (stride-0) empty gradient; it must be accepted."""
    q = torch.randn(1, 0, 2, 16, requires_grad=True)
    k = torch.randn(1, 5, 2, 16, requires_grad=True)
    v = torch.randn(1, 5, 2, 16, requires_grad=True)
    plan = fs.create_mask_plan(torch.zeros(1, 1, 0, dtype=torch.int32), q, k, v)
    out = fs.flex_attn_func(q, k, v, mask_plan=plan)
    out.sum().backward()
    assert q.grad.shape == q.shape and torch.equal(k.grad, torch.zeros_like(k))
