"""Issue 25 (a new user's trial on a CPU machine): the API and error-message papercuts, each with the test that
failed before its fix. CPU tensors (the CPU reference backend)."""

import inspect
import re
import warnings

import pytest
import torch
from flex_ref import make_problem


def _causal(S, B=1):
    return torch.arange(1, S + 1, dtype=torch.int32).repeat(B).view(1, 1, B * S)


# -- flashspan.sdpa (the function) and the flashspan.sdpa module's documented names ------------------------


def test_documented_sdpa_names_are_reachable_through_flashspan_sdpa(fs):
    """`flashspan.sdpa` is the function, which shadowed the module of the same name: docs/SDPA.md's
    `dropout_offset_increment` raised AttributeError through it."""
    import importlib

    module = importlib.import_module("flashspan.sdpa")
    assert callable(fs.sdpa) and fs.sdpa is module.sdpa
    assert fs.sdpa.dropout_offset_increment(7) == 4
    assert fs.sdpa.dropout_offset_increment(17) == 8
    for name in module.__all__:
        assert getattr(fs.sdpa, name) is getattr(module, name), name
    # ... and at the top level, next to the other public names.
    assert fs.dropout_offset_increment is module.dropout_offset_increment
    assert {"dropout_offset_increment", "diagonal_alignment"} <= set(fs.__all__)


def test_diagonal_alignment_enum_mirrors_the_seeds(fs):
    """The seed's users write cudnn.diagonal_alignment.TOP_LEFT / BOTTOM_RIGHT; strings keep working."""
    da = fs.diagonal_alignment
    assert [m.name for m in da] == ["TOP_LEFT", "BOTTOM_RIGHT"]
    assert da.TOP_LEFT == "TOP_LEFT" and da.BOTTOM_RIGHT == "BOTTOM_RIGHT"
    assert fs.sdpa.diagonal_alignment is da
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, 2, 5, 8, generator=g)
    k, v = torch.randn(1, 2, 9, 8, generator=g), torch.randn(1, 2, 9, 8, generator=g)
    for member, text in ((da.TOP_LEFT, "TOP_LEFT"), (da.BOTTOM_RIGHT, "bottom_right")):
        got, _ = fs.sdpa(q, k, v, attn_scale=0.5, diagonal_alignment=member, diagonal_band_right_bound=0)
        want, _ = fs.sdpa(q, k, v, attn_scale=0.5, diagonal_alignment=text, diagonal_band_right_bound=0)
        assert torch.equal(got, want)
    top, _ = fs.sdpa(q, k, v, attn_scale=0.5, diagonal_alignment=da.TOP_LEFT, diagonal_band_right_bound=0)
    bottom, _ = fs.sdpa(q, k, v, attn_scale=0.5, diagonal_alignment=da.BOTTOM_RIGHT, diagonal_band_right_bound=0)
    assert not torch.equal(top, bottom)


# -- the explicit API ------------------------------------------------------------------------------------------


def _bwd_problem(fs):
    p = make_problem(3, batch=1, seqlen_q=9, seqlen_k=9, hq=2, hkv=2)
    plan = fs.create_mask_plan(p.mask_func, p.q, p.k, p.v, build_backward=True)
    out = fs.flex_attn_func(p.q, p.k, p.v, mask_plan=plan)
    lse = torch.empty(plan.lse_shape())
    fwd = fs.FlexAttentionFwd(p.q, p.k, p.v, out, plan, lse)
    fwd.compile()
    fwd.execute(p.q, p.k, p.v, out, plan, lse, workspace=None)
    do = torch.randn_like(out)
    grads = [torch.empty_like(t) for t in (p.q, p.k, p.v)]
    bwd = fs.FlexAttentionBwd(p.q, p.k, p.v, out, do, lse, *grads, plan)
    bwd.compile()
    return p, plan, out, lse, do, grads, bwd


def test_backward_execute_requires_workspace_as_its_signature_says(fs):
    """The seed's FlexAttentionBwd.execute has `workspace` keyword-only and required; the shown signature said so
    but a call without it worked. Now both agree: omitting it is the TypeError Python raises for such a call."""
    p, plan, out, lse, do, (dq, dk, dv), bwd = _bwd_problem(fs)
    param = inspect.signature(bwd.execute).parameters["workspace"]
    assert param.kind is inspect.Parameter.KEYWORD_ONLY and param.default is inspect.Parameter.empty
    with pytest.raises(TypeError, match=r"execute\(\) missing 1 required keyword-only argument: 'workspace'"):
        bwd.execute(p.q, p.k, p.v, out, do, lse, dq, dk, dv, plan)
    bwd.execute(p.q, p.k, p.v, out, do, lse, dq, dk, dv, plan, workspace=None)  # workspace_size is 0 on the CPU
    assert torch.isfinite(dq).all()


def test_softmax_scale_deprecation_points_to_execute(fs):
    p = make_problem(3, batch=1, seqlen_q=9, seqlen_k=9, hq=2, hkv=2)
    plan = fs.create_mask_plan(p.mask_func, p.q, p.k, p.v, build_backward=True)
    out = torch.empty(plan.out_shape())
    with pytest.warns(DeprecationWarning) as record:
        fs.FlexAttentionFwd(p.q, p.k, p.v, out, plan, softmax_scale=0.5)
    msg = str(record[0].message)
    assert "execute(..., softmax_scale=" in msg and "use 'softmax_scale'" not in msg, msg


# -- masks.sliding_window: what its window parameters count ---------------------------------------------------


def test_sliding_window_parameters_say_what_they_count(fs):
    """`left=w` saw w + 1 keys (w before the diagonal) where SDPA's diagonal_band_left_bound = w sees w (the
    diagonal included): the builder's parameters are now named for what they count, before / after the diagonal."""
    import flashspan.masks as fm

    S, w = 12, 3
    dense = fm.to_dense(fm.sliding_window(S, before=w), S, S)[0, 0]
    assert dense.sum(1).tolist() == [min(i, w) + 1 for i in range(S)]  # w keys before the diagonal, plus it
    # The same band through SDPA's bound, which counts the diagonal: diagonal_band_left_bound = before + 1.
    q = torch.randn(1, 1, S, 8)
    k, v = torch.randn_like(q), torch.randn_like(q)
    plan = fs.create_mask_plan(fm.sliding_window(S, before=w, after=0), q.transpose(1, 2), k.transpose(1, 2),
                               v.transpose(1, 2))
    flex = fs.flex_attn_func(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), mask_plan=plan,
                             softmax_scale=0.5).transpose(1, 2)
    sdpa, _ = fs.sdpa(q, k, v, attn_scale=0.5, diagonal_band_left_bound=w + 1, diagonal_band_right_bound=0)
    torch.testing.assert_close(flex, sdpa)
    # The earlier keywords keep working, with a DeprecationWarning that says what they count.
    with pytest.warns(DeprecationWarning, match=r"left=3 is deprecated; use before=3 .*diagonal_band_left_bound = 4"):
        old = fm.sliding_window(S, left=w)
    assert torch.equal(old, fm.sliding_window(S, before=w))
    with pytest.warns(DeprecationWarning, match="right=2 is deprecated; use after=2"):
        assert torch.equal(fm.sliding_window(S, before=1, right=2), fm.sliding_window(S, before=1, after=2))
    with pytest.raises(TypeError, match="both 'before' and its deprecated name 'left'"):
        fm.sliding_window(S, before=1, left=1)


# -- double backward --------------------------------------------------------------------------------------------


def test_double_backward_names_the_call(fs):
    """torch's generic "element 0 of tensors does not require grad" said nothing about flashspan."""
    p = make_problem(5, batch=1, seqlen_q=8, seqlen_k=8, hq=2, hkv=2, requires_grad=True)
    plan = fs.create_mask_plan(p.mask_func, p.q, p.k, p.v, build_backward=True)
    out = fs.flex_attn_func(p.q, p.k, p.v, mask_plan=plan)
    (dq,) = torch.autograd.grad(out.square().sum(), p.q, create_graph=True)
    with pytest.raises(RuntimeError, match=r"flex_attn_func: flashspan's backward is not differentiable"):
        dq.sum().backward()
    # First-order gradients under create_graph=True are unchanged.
    (ref,) = torch.autograd.grad(fs.flex_attn_func(p.q, p.k, p.v, mask_plan=plan).square().sum(), p.q)
    assert torch.equal(dq.detach(), ref)


@pytest.mark.parametrize("front_end", ["sdpa", "sdpa_fwd"])
def test_double_backward_through_sdpa_names_the_call(fs, front_end):
    """The same for flashspan.sdpa (generic torch error before) and the custom op (torch's fallback only warned
    "may lead to silently incorrect behavior" and returned a result)."""
    q = torch.randn(1, 2, 6, 8, requires_grad=True)
    k, v = torch.randn_like(q), torch.randn_like(q)
    if front_end == "sdpa":
        o, _ = fs.sdpa(q, k, v, attn_scale=0.5)
    else:
        o, _ = torch.ops.flashspan.sdpa_fwd(q, k, v, 0.5)
    (dq,) = torch.autograd.grad(o.square().sum(), q, create_graph=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "autograd kernel was not registered" warning either
        with pytest.raises(RuntimeError, match=rf"^{front_end}: flashspan's backward is not differentiable"):
            dq.sum().backward()
    (ref,) = torch.autograd.grad(fs.sdpa(q, k, v, attn_scale=0.5)[0].square().sum(), q)
    torch.testing.assert_close(dq.detach(), ref)


# -- error messages: each front end names its own arguments ---------------------------------------------------


def _thd(T=20, H=2, D=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(T, H, D, generator=g), torch.randn(T, H, D, generator=g), torch.randn(T, H, D, generator=g)


@pytest.mark.parametrize("kwargs, pattern", [
    # a sample longer than the given maximum
    (dict(cu_seqlens_q=[0, 8, 20], cu_seqlens_kv=[0, 8, 20], max_seqlen_q=4, max_seqlen_kv=12),
     r"^sdpa_fwd: cu_seqlens_q: sample 0 has length 8, longer than max_seqlen_q = 4$"),
    (dict(cu_seqlens_q=[0, 8, 20], cu_seqlens_kv=[0, 8, 20], max_seqlen_q=12, max_seqlen_kv=5),
     r"^sdpa_fwd: cu_seqlens_kv: sample 0 has length 8, longer than max_seqlen_kv = 5$"),
    # decreasing offsets
    (dict(cu_seqlens_q=[0, 9, 8], cu_seqlens_kv=[0, 8, 20], max_seqlen_q=9, max_seqlen_kv=12),
     r"^sdpa_fwd: cu_seqlens_q: must be nondecreasing"),
    # past the packed tensor
    (dict(cu_seqlens_q=[0, 8, 30], cu_seqlens_kv=[0, 8, 20], max_seqlen_q=22, max_seqlen_kv=12),
     r"^sdpa_fwd: cu_seqlens_q: must end at the total length 20 \(q's T\), got 30$"),
])
def test_op_messages_name_the_ops_arguments(fs, kwargs, pattern):
    """The custom op's messages used graph.sdpa's names (cu_seq_len_q, S_q) for what the caller wrote as
    cu_seqlens_q / max_seqlen_q."""
    q, k, v = _thd()
    kw = {n: (torch.tensor(x, dtype=torch.int32) if isinstance(x, list) else x) for n, x in kwargs.items()}
    with pytest.raises(ValueError, match=pattern) as e:
        torch.ops.flashspan.sdpa_fwd(q, k, v, 0.25, **kw)
    assert not re.search(r"\b(cu_seq_len_(q|kv)|S_q|S_kv)\b", str(e.value)), str(e.value)


def test_op_backward_messages_name_the_ops_arguments(fs):
    q, k, v = _thd()
    cu = torch.tensor([0, 8, 20], dtype=torch.int32)
    o, lse = torch.ops.flashspan.sdpa_fwd(q, k, v, 0.25, cu_seqlens_q=cu, cu_seqlens_kv=cu, max_seqlen_q=12,
                                          max_seqlen_kv=12)
    with pytest.raises(ValueError, match=r"^sdpa_bwd: cu_seqlens_q: sample 1 has length 12, longer than "
                                         r"max_seqlen_q = 11$"):
        torch.ops.flashspan.sdpa_bwd(torch.ones_like(o), q, k, v, o, lse, 0.25, cu_seqlens_q=cu, cu_seqlens_kv=cu,
                                     max_seqlen_q=11, max_seqlen_kv=12)


# -- cumulative lengths must cover the packed tensor, in both front ends ----------------------------------------


def test_cu_seqlens_must_end_at_the_packed_length_in_both_front_ends(fs):
    """sdpa_fwd accepted cu_seqlens ending before the last token (those rows were never written) where flex's
    create_mask_plan rejects the same tensor. One rule now (docs/SEED_API.md, docs/SDPA.md): cumulative lengths
    that describe a packed tensor end at its token count T."""
    q, k, v = _thd(T=20)
    cu = torch.tensor([0, 8, 16], dtype=torch.int32)
    with pytest.raises(ValueError, match=r"^create_mask_plan: cu_seqlens_q: must end at the total length 20, got 16"):
        fs.create_mask_plan(torch.full((1, 1, 20), 8, dtype=torch.int32), q, k, v, cu_seqlens_q=cu, cu_seqlens_k=cu)
    with pytest.raises(ValueError, match=r"^sdpa_fwd: cu_seqlens_q: must end at the total length 20 \(q's T\), "
                                         r"got 16"):
        torch.ops.flashspan.sdpa_fwd(q, k, v, 0.25, cu_seqlens_q=cu, cu_seqlens_kv=cu, max_seqlen_q=8, max_seqlen_kv=8)
    full = torch.tensor([0, 8, 20], dtype=torch.int32)
    with pytest.raises(ValueError, match=r"^sdpa_fwd: cu_seqlens_kv: must end at the total length 20 \(k's T\), "
                                         r"got 16"):
        torch.ops.flashspan.sdpa_fwd(q, k, v, 0.25, cu_seqlens_q=full, cu_seqlens_kv=cu, max_seqlen_q=12,
                                     max_seqlen_kv=8)
    # graph.sdpa: cumulative lengths that are also the packing (no ragged_offsets) follow the same rule ...
    with pytest.raises(ValueError, match=r"^cu_seq_len_q: must end at the total length 20 \(q's T\), got 16"):
        fs.sdpa(q, k, v, use_padding_mask=True, cu_seq_len_q=cu, cu_seq_len_kv=full)
    # ... while explicit ragged offsets may leave tokens outside every sample (the graph API's gaps).
    o, _ = fs.sdpa(q, k, v, use_padding_mask=True, cu_seq_len_q=cu, cu_seq_len_kv=full,
                   ragged_offsets={"q": cu})
    assert o.shape == (20, 2, 16)
    o, _ = torch.ops.flashspan.sdpa_fwd(q, k, v, 0.25, cu_seqlens_q=full, cu_seqlens_kv=full, max_seqlen_q=12,
                                        max_seqlen_kv=12)
    assert torch.isfinite(o).all()


# -- BHSD tensors given to flex -----------------------------------------------------------------------------------


def test_bhsd_tensors_given_to_flex_are_called_bhsd(fs):
    """SDPA's BHSD tensors passed to flex got an error blaming the mask's length."""
    B, H, S, D = 2, 4, 16, 8
    q = torch.randn(B, H, S, D)
    mask = _causal(S, B)
    with pytest.raises(ValueError, match=r"^create_mask_plan: q, k, v: shapes .* fit BHSD .*B=2, H=4, S=16, D=8.*"
                                         r"flex takes BSHD .*transpose\(1, 2\)"):
        fs.create_mask_plan(mask, q, q, q)
    # A plan built right, then called with BHSD tensors.
    plan = fs.create_mask_plan(mask, q.transpose(1, 2), q.transpose(1, 2), q.transpose(1, 2))
    with pytest.raises(ValueError, match=r"^flex_attn_func: q has shape \(2, 4, 16, 8\) .*fit BHSD.*transpose\(1, 2\)"):
        fs.flex_attn_func(q, q, q, mask_plan=plan)
    # Shapes that fit neither keep the plain message.
    with pytest.raises(ValueError, match=r"mask_func: length") as e:
        fs.create_mask_plan(mask, torch.randn(B, 5, H, D), torch.randn(B, 5, H, D), torch.randn(B, 5, H, D))
    assert "BHSD" not in str(e.value)


# -- one exception class per kind of rule, across flex and SDPA (docs/ERRORS.md) -------------------------------


def _flex_plan(q, k=None, v=None, **kw):
    import flashspan

    k = q if k is None else k
    v = q if v is None else v
    B, S = (q.shape[0], q.shape[1]) if isinstance(q, torch.Tensor) else (1, 8)
    return flashspan.create_mask_plan(_causal(S, B), q, k, v, **kw)


def _bshd(*shape, dtype=torch.float32):
    return torch.randn(*shape).to(dtype)


def _flex_call(**kw):
    import flashspan

    q = _bshd(1, 8, 2, 16)
    plan = _flex_plan(q)
    return flashspan.flex_attn_func(q, q, q, mask_plan=plan, **kw)


def _sdpa(q, k=None, v=None, **kw):
    import flashspan

    return flashspan.sdpa(q, q if k is None else k, q if v is None else v, **kw)


def _op(q, k=None, v=None, scale=0.25, **kw):
    return torch.ops.flashspan.sdpa_fwd(q, q if k is None else k, q if v is None else v, scale, **kw)


_BHSD = (1, 2, 8, 16)
KINDS = [
    # (kind, expected class, flex call, SDPA calls)
    ("head dim above 256", ValueError,
     lambda: _flex_plan(_bshd(1, 8, 2, 512)),
     [lambda: _sdpa(torch.randn(1, 2, 8, 512)), lambda: _op(torch.randn(1, 2, 8, 512))]),
    ("head dim not a multiple of 8", ValueError,
     lambda: _flex_plan(_bshd(1, 8, 2, 12)),
     [lambda: _sdpa(torch.randn(1, 2, 8, 12)), lambda: _op(torch.randn(1, 2, 8, 12))]),
    ("dtype not supported", TypeError,
     lambda: _flex_plan(torch.ones(1, 8, 2, 16, dtype=torch.int32)),
     [lambda: _sdpa(torch.ones(*_BHSD, dtype=torch.int32)), lambda: _op(torch.ones(*_BHSD, dtype=torch.int32))]),
    ("mixed dtypes", TypeError,
     lambda: _flex_plan(_bshd(1, 8, 2, 16), _bshd(1, 8, 2, 16, dtype=torch.float16)),
     [lambda: _sdpa(torch.randn(*_BHSD), torch.randn(*_BHSD).half()),
      lambda: _op(torch.randn(*_BHSD), torch.randn(*_BHSD).half())]),
    ("not a tensor", TypeError,
     lambda: _flex_plan([1.0]),
     [lambda: _sdpa([1.0], [1.0], [1.0])]),
    ("scale not a finite number", ValueError,
     lambda: _flex_call(softmax_scale=float("nan")),
     [lambda: _sdpa(torch.randn(*_BHSD), attn_scale=float("nan")), lambda: _op(torch.randn(*_BHSD), scale=float("inf"))]),
    ("scale not a number", ValueError,
     lambda: _flex_call(softmax_scale="0.5"),
     [lambda: _sdpa(torch.randn(*_BHSD), attn_scale="0.5")]),
    ("K head count does not divide Q's", ValueError,
     lambda: _flex_plan(_bshd(1, 8, 3, 16), _bshd(1, 8, 2, 16), _bshd(1, 8, 2, 16)),
     [lambda: _sdpa(torch.randn(1, 3, 8, 16), torch.randn(*_BHSD), torch.randn(*_BHSD)),
      lambda: _op(torch.randn(1, 3, 8, 16), torch.randn(*_BHSD), torch.randn(*_BHSD))]),
    ("last dimension not contiguous", ValueError,
     lambda: _flex_plan(_bshd(1, 8, 2, 32)[..., ::2]),
     [lambda: _sdpa(torch.randn(1, 2, 8, 32)[..., ::2]), lambda: _op(torch.randn(1, 2, 8, 32)[..., ::2])]),
]


@pytest.mark.parametrize("kind, exc, flex, sdpa_calls", KINDS, ids=[k[0] for k in KINDS])
def test_one_exception_class_per_kind_of_rule(fs, kind, exc, flex, sdpa_calls):
    """SDPA rejected head dim 512 with RuntimeError where flex raises ValueError (and the op raised ValueError for
    a dtype where flex and graph.sdpa raise TypeError): each kind of rule has one class in every front end."""
    calls = [("flex", flex)] + [(f"sdpa #{i}", c) for i, c in enumerate(sdpa_calls)]
    for where, call in calls:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with pytest.raises(Exception) as e:
                call()
        assert type(e.value) is exc, f"{kind}, {where}: {type(e.value).__name__}: {e.value}"


# -- flags that are not bools -----------------------------------------------------------------------------------
#
# Every public boolean flag takes a bool (or a NumPy bool) only: flashspan.sdpa(..., generate_stats="false") returned
# the stats ("false" is truthy), use_padding_mask=1.5 ran as True, use_causal_mask="no" masked. One rule
# (_checks.check_flag): a TypeError naming the flag, ``[call: ]flag: must be a bool (True or False)[ or None], got
# <type> <value>``; None only where the default is None (generate_stats, is_inference, pack_gqa, build_backward).

_NOT_BOOLS = ["no", "false", "", 1, 0, 1.5, torch.tensor(True)]
_SDPA_FLAGS = ["use_alibi_mask", "use_padding_mask", "stats_use_log2", "generate_stats", "unfuse_fma",
               "use_causal_mask", "use_causal_mask_bottom_right", "is_inference"]
_OPTIONAL = {"generate_stats", "is_inference", "pack_gqa", "build_backward"}  # None allowed: their default


def _flag_error(name, value, where=""):
    rule = r"a bool \(True or False\)" + (" or None" if name in _OPTIONAL else "")
    prefix = re.escape(f"{where}: ") if where else ""
    return rf"^{prefix}{name}: must be {rule}, got {type(value).__name__}\b"


def _sdpa_qkv(requires_grad=False):
    g = torch.Generator().manual_seed(0)
    return [torch.randn(1, 2, 8, 16, generator=g).requires_grad_(requires_grad) for _ in range(3)]


@pytest.mark.parametrize("value", _NOT_BOOLS, ids=repr)
@pytest.mark.parametrize("flag", _SDPA_FLAGS)
def test_sdpa_flags_that_are_not_bools_are_type_errors(fs, flag, value):
    q, k, v = _sdpa_qkv()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the TypeError comes before a deprecated flag's DeprecationWarning
        for _ in range(2):  # the fast path never remembers a call that raised
            with pytest.raises(TypeError, match=_flag_error(flag, value)):
                fs.sdpa(q, k, v, **{flag: value})


@pytest.mark.parametrize("flag", ["use_alibi_mask", "use_padding_mask", "stats_use_log2", "generate_stats",
                                  "use_causal_mask"])
def test_sdpa_flag_of_another_type_never_reuses_a_remembered_call(fs, flag):
    """The fast path keys a call by its arguments' types too: 1 after True (equal, same hash) takes the full path."""
    q, k, v = _sdpa_qkv()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        fs.sdpa(q, k, v, **{flag: False})
        fs.sdpa(q, k, v, **{flag: False})  # remembered
        for value in (0, 0.0):
            with pytest.raises(TypeError, match=_flag_error(flag, value)):
                fs.sdpa(q, k, v, **{flag: value})


@pytest.mark.parametrize("flag", ["use_alibi_mask", "use_padding_mask", "stats_use_log2", "generate_stats",
                                  "use_causal_mask", "use_causal_mask_bottom_right", "is_inference"])
def test_sdpa_flags_that_are_not_bools_with_gradients(fs, flag):
    """With gradients the forward runs in the autograd Function (generate_stats is not passed to it, base-2 stats
    are refused with a ValueError): the same TypeError."""
    q, k, v = _sdpa_qkv(requires_grad=True)
    with pytest.raises(TypeError, match=_flag_error(flag, "false")):
        fs.sdpa(q, k, v, **{flag: "false"})


@pytest.mark.parametrize("value", ["no", 1, 0.0], ids=repr)
@pytest.mark.parametrize("flag", ["use_alibi_mask", "use_padding_mask", "use_deterministic_algorithm",
                                  "use_causal_mask", "use_causal_mask_bottom_right"])
def test_sdpa_backward_flags_that_are_not_bools_are_type_errors(fs, flag, value):
    q, k, v = _sdpa_qkv()
    o, stats = fs.sdpa(q, k, v, generate_stats=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(TypeError, match=_flag_error(flag, value)):
            fs.sdpa_backward(q, k, v, o, o, stats, **{flag: value})


def test_sdpa_takes_numpy_bools(fs):
    """A NumPy bool (what a NumPy comparison gives) is a bool: the same call as the Python one."""
    np = pytest.importorskip("numpy")
    q, k, v = _sdpa_qkv()
    want_o, want_stats = fs.sdpa(q, k, v, generate_stats=True, stats_use_log2=True)
    for _ in range(2):
        o, stats = fs.sdpa(q, k, v, generate_stats=np.bool_(True), stats_use_log2=np.True_, use_alibi_mask=np.False_,
                           unfuse_fma=np.False_)
        assert torch.equal(o, want_o) and torch.equal(stats, want_stats)
    assert fs.sdpa(q, k, v, generate_stats=np.False_)[1] is None
    with pytest.warns(DeprecationWarning, match="use_causal_mask"):
        got = fs.sdpa(q, k, v, use_causal_mask=np.True_)[0]
    assert torch.equal(got, fs.sdpa(q, k, v, diagonal_band_right_bound=0)[0])
    o, stats = fs.sdpa(q, k, v, generate_stats=True)
    dq = fs.sdpa_backward(q, k, v, o, o, stats, use_deterministic_algorithm=np.True_)[0]
    assert torch.equal(dq, fs.sdpa_backward(q, k, v, o, o, stats, use_deterministic_algorithm=True)[0])


def _fp8(*shape):
    g = torch.Generator().manual_seed(0)
    return torch.randn(*shape, generator=g).to(torch.float8_e4m3fn)


@pytest.mark.parametrize("value", ["no", 1, None], ids=repr)
@pytest.mark.parametrize("flag", ["use_causal_mask", "use_padding_mask", "stats_use_log2", "generate_stats",
                                  "is_inference"])
def test_sdpa_fp8_flags_that_are_not_bools_are_type_errors(fs, flag, value):
    q = k = v = _fp8(1, 2, 4, 16)
    if value is None and flag in _OPTIONAL:  # their default (None: no stats)
        assert fs.sdpa_fp8(q, k, v, *(1.0,) * 6, **{flag: value})[0].shape == (1, 2, 4, 16)
        return
    with pytest.raises(TypeError, match=_flag_error(flag, value)):
        fs.sdpa_fp8(q, k, v, *(1.0,) * 6, **{flag: value})


@pytest.mark.parametrize("flag", ["use_causal_mask", "use_deterministic_algorithm"])
def test_sdpa_fp8_backward_flags_that_are_not_bools_are_type_errors(fs, flag):
    q = k = v = o = dO = _fp8(1, 2, 4, 16)
    stats = torch.zeros(1, 2, 4, 1)
    with pytest.raises(TypeError, match=_flag_error(flag, "yes")):
        fs.sdpa_fp8_backward(q, k, v, o, dO, stats, *(1.0,) * 12, **{flag: "yes"})


@pytest.mark.parametrize("value", ["no", 1, 1.5, None], ids=repr)
@pytest.mark.parametrize("flag", ["is_causal", "causal_bottom_right", "return_lse"])
def test_sdpa_torch_flags_that_are_not_bools_are_type_errors(fs, flag, value):
    """torch.ops.flashspan.sdpa_fwd's schema converts them (torch takes 1.5 or None for a bool, as for the seed's
    op); the Python wrapper sdpa_torch checks them as flashspan.sdpa does."""
    q, k, v = _sdpa_qkv()
    with pytest.raises(TypeError, match=_flag_error(flag, value, "sdpa_torch")):
        fs.sdpa_torch(q, k, v, **{flag: value})


@pytest.mark.parametrize("value", ["false", 1.5, 0], ids=repr)
@pytest.mark.parametrize("flag", ["deterministic", "return_lse", "return_max_logit"])
def test_flex_attn_func_flags_that_are_not_bools_are_type_errors(fs, flag, value):
    p = make_problem(3, batch=1, seqlen_q=9, seqlen_k=9, hq=2, hkv=2)
    plan = fs.create_mask_plan(p.mask_func, p.q, p.k, p.v)
    with pytest.raises(TypeError, match=_flag_error(flag, value, "flex_attn_func")):
        fs.flex_attn_func(p.q, p.k, p.v, mask_plan=plan, **{flag: value})


def test_flex_flags_that_are_not_bools_elsewhere(fs):
    p = make_problem(3, batch=1, seqlen_q=9, seqlen_k=9, hq=2, hkv=2)
    for name in ("pack_gqa", "build_backward"):
        for value in ("false", 0, 1.5):
            with pytest.raises(TypeError, match=_flag_error(name, value, "create_mask_plan")):
                fs.create_mask_plan(p.mask_func, p.q, p.k, p.v, **{name: value})
    plan = fs.create_mask_plan(p.mask_func, p.q, p.k, p.v, build_backward=True)
    out = fs.flex_attn_func(p.q, p.k, p.v, mask_plan=plan)
    lse = torch.empty(1, 2, 9)
    with pytest.raises(TypeError, match=_flag_error("sm90_use_smem_mask_pipeline", "false", "FlexAttentionFwd")):
        fs.FlexAttentionFwd(p.q, p.k, p.v, out, plan, lse, sm90_use_smem_mask_pipeline="false")
    dq, dk, dv = (torch.empty_like(t) for t in (p.q, p.k, p.v))
    with pytest.raises(TypeError, match=_flag_error("deterministic", 1.5, "FlexAttentionBwd")):
        fs.FlexAttentionBwd(p.q, p.k, p.v, out, out, lse, dq, dk, dv, plan, deterministic=1.5)


def test_flex_takes_numpy_bools(fs):
    np = pytest.importorskip("numpy")
    p = make_problem(3, batch=1, seqlen_q=9, seqlen_k=9, hq=2, hkv=2)
    plan = fs.create_mask_plan(p.mask_func, p.q, p.k, p.v, pack_gqa=np.False_, build_backward=np.True_)
    assert plan.has_backward and not plan.pack_gqa
    want_out, want_lse = fs.flex_attn_func(p.q, p.k, p.v, mask_plan=plan, return_lse=True)
    got = fs.flex_attn_func(p.q, p.k, p.v, mask_plan=plan, return_lse=np.True_, deterministic=np.False_)
    assert isinstance(got, tuple) and len(got) == 2
    assert torch.equal(got[0], want_out) and torch.equal(got[1], want_lse)
    out = want_out
    dq, dk, dv = (torch.empty_like(t) for t in (p.q, p.k, p.v))
    bwd = fs.FlexAttentionBwd(p.q, p.k, p.v, out, out, torch.empty(1, 2, 9), dq, dk, dv, plan,
                              deterministic=np.True_)
    assert bwd.deterministic is True


def test_mask_builder_flags_that_are_not_bools_are_type_errors(fs):
    m = fs.masks
    calls = [  # (flag, the builder the message names first, call)
        ("bottom_right", "masks.causal", lambda x: m.causal(4, 6, bottom_right=x)),
        ("bottom_right", "masks.sliding_window", lambda x: m.sliding_window(4, 6, bottom_right=x)),
        ("bottom_right", "masks.sink_window", lambda x: m.sink_window(4, 6, bottom_right=x)),
        ("causal", "masks.document_causal", lambda x: m.document_causal([2, 3], causal=x)),
        ("per_head", "masks.visible_pairs", lambda x: m.visible_pairs(m.causal(4), per_head=x)),
    ]
    for name, where, fn in calls:
        for value in ("no", 1, None):
            with pytest.raises(TypeError, match=_flag_error(name, value, where)):
                fn(value)
    np = pytest.importorskip("numpy")
    assert torch.equal(m.causal(3, 5, bottom_right=np.True_), m.causal(3, 5, bottom_right=True))


def test_distributed_flags_that_are_not_bools_are_type_errors(fs):
    """Checked before anything needs a process group."""
    from flashspan import distributed as fsd

    q = torch.randn(1, 4, 2, 16)
    for flag in ("deterministic", "return_lse"):
        with pytest.raises(TypeError, match=_flag_error(flag, "no", "flashspan.distributed.flex_attn_func")):
            fsd.flex_attn_func(q, q, q, None, **{flag: "no"})
    sh = fsd.SequenceSharding(1, seqlen=4, batch=1)
    for flag in ("build_backward", "pack_gqa"):
        with pytest.raises(TypeError, match=_flag_error(flag, 1, "flashspan.distributed.create_mask_plan")):
            fsd.create_mask_plan(_causal(4), q, q, q, sh, **{flag: 1})
