"""Property tests (hypothesis) over the Python API with bad input, CPU tensors.

Each property compares the library's verdict with an oracle computed here:
  - endpoints: create_mask_plan succeeds exactly when every row's endpoints are nondecreasing and
    in [0, Sk_b]; a plan it builds counts the visible pairs the endpoints describe; a rejection is
    a ValueError naming mask_func and the offending element;
  - cu_seqlens: a THD plan is built exactly when cu_seqlens_q/k start at 0, never decrease, end at
    the totals and keep every length <= the maxima; a rejection names the tensor or maximum;
  - any single broken argument of flex_attn_func / FlexAttentionFwd.execute raises ValueError or
    TypeError (never another class, never a silent result) whose message starts with the call.
"""

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

SETTINGS = settings(max_examples=60, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def endpoint_cases(draw):
    batch = draw(st.integers(1, 3))
    sq, sk = draw(st.integers(1, 9)), draw(st.integers(0, 9))
    hm = draw(st.sampled_from([1, 2]))
    nfunc = draw(st.sampled_from([1, 3, 5]))
    rows = batch * sq
    corrupt = draw(st.booleans())
    values = []
    for _ in range(hm * rows):
        if corrupt:
            row = draw(st.lists(st.integers(-2, sk + 2), min_size=nfunc, max_size=nfunc))
        else:
            row = sorted(draw(st.lists(st.integers(0, sk), min_size=nfunc, max_size=nfunc)))
        values.append(row)
    return batch, sq, sk, hm, nfunc, values


@SETTINGS
@given(case=endpoint_cases())
def test_endpoint_validity_is_exact(fs, case):
    batch, sq, sk, hm, nfunc, values = case
    rows = batch * sq
    ends = np.array(values, dtype=np.int32).reshape(hm, rows, nfunc).transpose(0, 2, 1)  # [hm, nfunc, rows]
    mask = torch.from_numpy(np.ascontiguousarray(ends))
    q = torch.zeros(batch, sq, 2, 8)
    k = torch.zeros(batch, sk, 2, 8)
    valid = all(list(r) == sorted(r) and min(r) >= 0 and max(r) <= sk for r in values)
    if not valid:
        with pytest.raises(ValueError, match=r"mask_func: (endpoint mask_func\[|endpoints must be nondecreasing)"):
            fs.create_mask_plan(mask, q, k, k)
        return
    plan = fs.create_mask_plan(mask, q, k, k)
    pairs = sum(r[0] + sum(r[j + 1] - r[j] for j in range(1, nfunc - 1, 2)) for r in values)
    assert plan.visible_pairs == pairs


@st.composite
def cu_cases(draw):
    batch = draw(st.integers(1, 4))
    cu_q = [0] + [draw(st.integers(-1, 12)) for _ in range(batch)]
    cu_k = [0] + [draw(st.integers(-1, 12)) for _ in range(batch)]
    if draw(st.booleans()):  # mostly valid: cumulative sums of non-negative lengths
        cu_q = list(np.cumsum([0] + [abs(x) for x in cu_q[1:]]))
        cu_k = list(np.cumsum([0] + [abs(x) for x in cu_k[1:]]))
    if draw(st.integers(0, 5)) == 0:
        cu_q[0] = draw(st.integers(-2, 2))
    tq = max(0, cu_q[-1] + draw(st.sampled_from([0, 0, 0, 1, -1])))
    tk = max(0, cu_k[-1] + draw(st.sampled_from([0, 0, 0, 1, -1])))
    lens_q = [b - a for a, b in zip(cu_q, cu_q[1:])]
    lens_k = [b - a for a, b in zip(cu_k, cu_k[1:])]
    max_q = max(0, max(lens_q) + draw(st.sampled_from([0, 0, 1, -1])))
    max_k = max(0, max(lens_k) + draw(st.sampled_from([0, 0, 1, -1])))
    return cu_q, cu_k, tq, tk, max_q, max_k


@SETTINGS
@given(case=cu_cases())
def test_cu_seqlens_validity_is_exact(fs, case):
    cu_q, cu_k, tq, tk, max_q, max_k = case

    def ok(cu, total, mx):
        lens = [b - a for a, b in zip(cu, cu[1:])]
        return cu[0] == 0 and all(n >= 0 for n in lens) and cu[-1] == total and all(n <= mx for n in lens)

    valid = ok(cu_q, tq, max_q) and ok(cu_k, tk, max_k)
    q = torch.zeros(tq, 2, 8)
    k = torch.zeros(tk, 2, 8)
    mask = torch.zeros(1, 1, tq, dtype=torch.int32)  # every row sees nothing: valid for any lengths
    args = dict(cu_seqlens_q=torch.tensor(cu_q, dtype=torch.int32), cu_seqlens_k=torch.tensor(cu_k, dtype=torch.int32),
                max_seqlen_q=max_q, max_seqlen_k=max_k)
    if valid:
        plan = fs.create_mask_plan(mask, q, k, k, **args)
        assert plan.debug_snapshot()["cu_seqlens_q"].tolist() == cu_q
        out = fs.flex_attn_func(q, k, k, mask_plan=plan)
        assert out.shape == q.shape and torch.equal(out, torch.zeros_like(out))
    else:
        with pytest.raises(ValueError, match=r"^create_mask_plan: (cu_seqlens_[qk]|max_seqlen_[qk]): "):
            fs.create_mask_plan(mask, q, k, k, **args)


# -- one broken argument of a valid call --------------------------------------------------------------

B, S, HQ, HKV, D = 2, 12, 4, 2, 16


def _valid():
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(B, S, HQ, D, generator=gen)
    k = torch.randn(B, S, HKV, D, generator=gen)
    v = torch.randn(B, S, HKV, D, generator=gen)
    mask = torch.arange(1, S + 1, dtype=torch.int32).repeat(B).view(1, 1, B * S)
    return q, k, v, mask


def _break(name, kind, t):
    if kind == "dtype":
        return t.double() if t.dtype != torch.float64 else t.float()
    if kind == "shape":
        return t[..., :-8] if t.shape[-1] > 8 else t[:1]
    if kind == "rank":
        return t[0]
    if kind == "device":
        return t.to("meta")
    if kind == "last-stride":
        return t.transpose(-1, -2).contiguous().transpose(-1, -2) if t.shape[-1] != t.shape[-2] else t[..., ::2]
    if kind == "type":
        return t.tolist()
    raise AssertionError(kind)


ARGS = ["q", "k", "v"]
KINDS = ["dtype", "shape", "rank", "device", "last-stride", "type"]
OPTIONS = [("softmax_scale", float("nan")), ("softmax_scale", "0.5"), ("softmax_scale", torch.tensor(0.5)),
           ("deterministic", 1), ("return_lse", "yes"), ("return_max_logit", None), ("mask_plan", "plan"),
           ("mask_plan", None)]


@SETTINGS
@given(which=st.sampled_from(ARGS), kind=st.sampled_from(KINDS))
def test_flex_attn_func_with_one_broken_tensor(fs, which, kind):
    q, k, v, mask = _valid()
    plan = fs.create_mask_plan(mask, q, k, v)
    args = dict(q=q, k=k, v=v)
    args[which] = _break(which, kind, args[which])
    with pytest.raises((ValueError, TypeError), match=r"^flex_attn_func: " + which) as e:
        fs.flex_attn_func(args["q"], args["k"], args["v"], mask_plan=plan)
    assert "\n" not in str(e.value)


@SETTINGS
@given(option=st.sampled_from(OPTIONS))
def test_flex_attn_func_with_one_broken_option(fs, option):
    q, k, v, mask = _valid()
    plan = fs.create_mask_plan(mask, q, k, v)
    kw = {"mask_plan": plan, option[0]: option[1]}
    with pytest.raises((ValueError, TypeError), match=r"^flex_attn_func: " + option[0]):
        fs.flex_attn_func(q, k, v, **kw)


@SETTINGS
@given(which=st.sampled_from(["q", "k", "v", "out", "lse"]), kind=st.sampled_from(KINDS))
def test_execute_with_one_broken_tensor(fs, which, kind):
    q, k, v, mask = _valid()
    plan = fs.create_mask_plan(mask, q, k, v)
    out = torch.empty(B, S, HQ, D)
    lse = torch.empty(B, HQ, S)
    fwd = fs.FlexAttentionFwd(q, k, v, out, plan, lse)
    fwd.compile()
    args = dict(q=q, k=k, v=v, out=out, lse=lse)
    args[which] = _break(which, kind, args[which])
    # execute()'s parameter names: q_tensor, ..., o_tensor, lse_tensor
    name = {"out": "o_tensor"}.get(which, which + "_tensor")
    with pytest.raises((ValueError, TypeError), match=r"^FlexAttentionFwd\.execute: (" + name + r"|q_tensor)"):
        fwd.execute(args["q"], args["k"], args["v"], args["out"], plan, args["lse"])
    # The object still works after the rejected call.
    fwd.execute(q, k, v, out, plan, lse)
    assert torch.isfinite(out).all()
