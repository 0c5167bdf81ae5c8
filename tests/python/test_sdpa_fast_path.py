"""The per-signature fast path of flashspan.sdpa / sdpa_backward / the custom ops (issue 24, "Host cost"; sdpa.py,
_fast_key / _remember): a remembered binding is reused only for a call of the same signature (shapes, strides,
dtypes, devices, argument values and types), gives the results of the full path, and bad input still raises
the full path's errors (a failing call is never remembered)."""

import re
import sys

import pytest
import torch

pytestmark = pytest.mark.no_poison


@pytest.fixture
def S(fs, monkeypatch):
    """The flashspan.sdpa module with an empty fast-path table, FLASHSPAN_SDPA_ROUTE unset."""
    monkeypatch.delenv("FLASHSPAN_SDPA_ROUTE", raising=False)
    mod = sys.modules["flashspan.sdpa"]
    mod._FAST.clear()
    yield mod
    mod._FAST.clear()


def _qkv(seed, shape=(2, 3, 24, 16), dtype=torch.float32, kv_heads=None):
    g = torch.Generator().manual_seed(seed)
    B, H, Sq, D = shape
    hk = kv_heads or H
    q = torch.randn(B, H, Sq, D, generator=g).to(dtype)
    k = torch.randn(B, hk, Sq + 5, D, generator=g).to(dtype)
    v = torch.randn(B, hk, Sq + 5, D, generator=g).to(dtype)
    return q, k, v


def _uncached(S, fn):
    """fn() with the fast path bypassed: the table emptied before and after, and nothing remembered."""
    saved = dict(S._FAST)
    S._FAST.clear()
    real = S._remember
    S._remember = lambda *a, **k: None
    try:
        return fn()
    finally:
        S._remember = real
        S._FAST.clear()
        S._FAST.update(saved)


def _no_full_path(S, monkeypatch):
    """Makes the full paths raise: a call that still runs took the fast path."""

    def boom(*a, **k):
        raise AssertionError("full path taken")

    monkeypatch.setattr(S, "_forward_full", boom)
    monkeypatch.setattr(S, "_backward_full", boom)
    monkeypatch.setattr(S, "_Layout", boom)


def test_second_call_takes_the_fast_path_and_matches(fs, S, monkeypatch):
    q, k, v = _qkv(0)
    kw = dict(attn_scale=0.25, diagonal_band_right_bound=0, generate_stats=True)
    o1, st1 = fs.sdpa(q, k, v, **kw)
    assert len(S._FAST) == 1
    q2, k2, v2 = _qkv(1)  # same signature, other values: the new tensors' pointers are bound, not the first call's
    want = _uncached(S, lambda: fs.sdpa(q2, k2, v2, **kw))
    with monkeypatch.context() as m:
        _no_full_path(S, m)
        o2, st2 = fs.sdpa(q2, k2, v2, **kw)
    assert torch.equal(o2, want[0]) and torch.equal(st2, want[1])
    assert not torch.equal(o1, o2)
    assert o2.data_ptr() != o1.data_ptr()  # fresh outputs per call


@pytest.mark.parametrize("change", ["strides", "dtype", "shape", "heads", "scale", "band", "alignment", "stats",
                                    "bias", "bias_strides", "seq_len"])
def test_a_changed_signature_is_not_reused(fs, S, change):
    """A call differing from a remembered one in one respect gives what an uncached call gives."""
    q, k, v = _qkv(2)
    base = dict(attn_scale=0.3, diagonal_band_right_bound=0)
    fs.sdpa(q, k, v, **base)
    fs.sdpa(q, k, v, **base)
    assert len(S._FAST) == 1
    kw = dict(base)
    if change == "strides":  # BSHD memory seen as BHSD
        q, k, v = (t.transpose(1, 2).contiguous().transpose(1, 2) for t in (q, k, v))
    elif change == "dtype":
        q, k, v = (t.double() for t in (q, k, v))
    elif change == "shape":
        q, k, v = _qkv(3, shape=(2, 3, 17, 16))
    elif change == "heads":
        q, k, v = _qkv(3, kv_heads=1)
    elif change == "scale":
        kw["attn_scale"] = 0.7
    elif change == "band":
        kw["diagonal_band_left_bound"] = 4
    elif change == "alignment":
        kw["diagonal_alignment"] = "BOTTOM_RIGHT"
    elif change == "stats":
        kw["generate_stats"] = True
    elif change in ("bias", "bias_strides"):
        bias = torch.randn(1, 3, q.shape[2], k.shape[2], generator=torch.Generator().manual_seed(4))
        kw["bias"] = bias
        fs.sdpa(q, k, v, **kw)  # remembered with a contiguous bias
        if change == "bias_strides":
            kw["bias"] = bias[:, :1].expand(1, 3, -1, -1)  # broadcast over heads: stride 0
    elif change == "seq_len":
        kw.update(use_padding_mask=True, seq_len_q=torch.tensor([10, 24]), seq_len_kv=torch.tensor([29, 7]))
    got = fs.sdpa(q, k, v, **kw)
    want = _uncached(S, lambda: fs.sdpa(q, k, v, **kw))
    for a, b in zip(got, want):
        assert (a is None and b is None) or torch.equal(a, b)
    assert len(S._FAST) >= 2  # the changed call has its own entry


def test_tensor_values_of_a_remembered_signature_are_read_per_call(fs, S):
    """seq_len and attn_scale tensors are bound by pointer: new values of the same layout are used."""
    q, k, v = _qkv(5)
    for lens, scale in (([10, 24], 0.5), ([3, 1], 0.125), ([24, 24], 1.5)):
        kw = dict(use_padding_mask=True, seq_len_q=torch.tensor(lens), seq_len_kv=torch.tensor([29, 2]),
                  attn_scale=torch.tensor([scale]), generate_stats=True)
        got = fs.sdpa(q, k, v, **kw)
        want = _uncached(S, lambda: fs.sdpa(q, k, v, **kw))
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    assert len(S._FAST) == 1


def test_bad_input_still_raises_after_a_remembered_call(fs, S):
    q, k, v = _qkv(6)
    band = dict(diagonal_alignment=1, diagonal_band_right_bound=0)
    bias = torch.zeros(1, 3, q.shape[2], k.shape[2])
    fs.sdpa(q, k, v, attn_scale=0.5, **band)
    fs.sdpa(q, k, v, attn_scale=0.5, **band)
    fs.sdpa(q, k, v, attn_scale=0.5, bias=bias)
    n = len(S._FAST)
    cases = [
        (dict(attn_scale=0.5, diagonal_alignment=1.0, diagonal_band_right_bound=0), ValueError,
         "diagonal_alignment: must be TOP_LEFT or BOTTOM_RIGHT"),
        (dict(attn_scale=0.5, diagonal_alignment=1), ValueError,
         "diagonal_alignment: BOTTOM_RIGHT only re-anchors a diagonal band"),
        (dict(attn_scale=0.5, bias=bias.transpose(2, 3).contiguous().transpose(2, 3)), ValueError,
         "bias: last dimension must be contiguous (stride 1)"),
        (dict(attn_scale="0.5"), ValueError, "attn_scale: must be a finite float"),
        (dict(attn_scale=True), ValueError, "attn_scale: must be a finite float"),
        (dict(attn_scale=0.5, diagonal_band_left_bound=0), ValueError, "diagonal_band_left_bound"),
        (dict(attn_scale=0.5, implementation="FAST"), ValueError, "implementation: must be AUTO"),
    ]
    for kw, exc, msg in cases:
        for _ in range(2):  # a failing call is not remembered: the same error every time
            with pytest.raises(exc, match=re.escape(msg)):
                fs.sdpa(q, k, v, **kw)
    with pytest.raises(Exception) as first:  # mixed dtypes: the C layer's rule
        fs.sdpa(q, k.double(), v, attn_scale=0.5, **band)
    with pytest.raises(type(first.value), match=re.escape(str(first.value))):
        fs.sdpa(q, k.double(), v, attn_scale=0.5, **band)
    with pytest.raises(ValueError, match=r"^q: must be 4-D"):
        fs.sdpa(q[0, 0], k, v, attn_scale=0.5)
    assert len(S._FAST) == n


def test_backward_fast_path(fs, S, monkeypatch):
    q, k, v = _qkv(7)
    o, st = fs.sdpa(q, k, v, attn_scale=0.25, diagonal_band_right_bound=0, generate_stats=True)
    dO = torch.randn_like(o)
    kw = dict(attn_scale=0.25, diagonal_band_right_bound=0)
    fs.sdpa_backward(q, k, v, o, dO, st, **kw)
    want = _uncached(S, lambda: fs.sdpa_backward(q, k, v, o, dO * 2, st, **kw))
    with monkeypatch.context() as m:
        def boom(*a, **k):
            raise AssertionError("full path taken")
        m.setattr(S, "_Layout", boom)
        got = fs.sdpa_backward(q, k, v, o, dO * 2, st, **kw)
    for a, b in zip(got, want):
        assert torch.equal(a, b)
    # another dO layout: its own entry, the uncached result
    dO_t = (dO * 2).transpose(1, 2).contiguous().transpose(1, 2)
    got = fs.sdpa_backward(q, k, v, o, dO_t, st, **kw)
    for a, b in zip(got, want):
        assert torch.equal(a, b)
    with pytest.raises(ValueError, match=r"^stats: must be 4-D"):
        fs.sdpa_backward(q, k, v, o, dO, st[..., 0], **kw)


def test_autograd_through_the_fast_path(fs, S):
    q, k, v = (t.requires_grad_() for t in _qkv(8, dtype=torch.float64))
    grads = []
    for _ in range(2):
        o, _ = fs.sdpa(q, k, v, attn_scale=0.4, diagonal_band_right_bound=0)
        grads.append(torch.autograd.grad(o.sum(), (q, k, v)))
    for a, b in zip(*grads):
        assert torch.equal(a, b)
    assert len(S._FAST) == 2  # forward and backward


def test_ops_fast_path_and_errors(fs, S):
    q, k, v = _qkv(9)
    op = torch.ops.flashspan.sdpa_fwd
    o1, lse1 = op(q, k, v, 0.5, is_causal=True)
    o2, lse2 = op(q, k, v, 0.5, is_causal=True)
    want = _uncached(S, lambda: op(q, k, v, 0.5, is_causal=True))
    assert torch.equal(o2, want[0]) and torch.equal(lse2, want[1]) and torch.equal(o1, o2)
    for _ in range(2):
        with pytest.raises(ValueError, match=r"^sdpa_fwd: window_left counts"):
            op(q, k, v, 0.5, window_left=0)
        with pytest.raises(TypeError, match=r"^sdpa_fwd: all io tensors must share one dtype"):
            op(q, k.double(), v, 0.5)
        with pytest.raises(TypeError, match=r"^sdpa_fwd: q: unsupported dtype torch.int32"):
            op(q.int(), k.int(), v.int(), 0.5)
    dO = torch.randn_like(o2)
    bwd = torch.ops.flashspan.sdpa_bwd
    g1 = bwd(dO, q, k, v, o2, lse2, 0.5, is_causal=True)
    g2 = bwd(dO, q, k, v, o2, lse2, 0.5, is_causal=True)
    g3 = _uncached(S, lambda: bwd(dO, q, k, v, o2, lse2, 0.5, is_causal=True))
    for a, b, c in zip(g1, g2, g3):
        assert torch.equal(a, b) and torch.equal(b, c)
    with pytest.raises(TypeError, match=r"^sdpa_bwd: lse: dtype must be float32"):
        bwd(dO, q, k, v, o2, lse2.double(), 0.5, is_causal=True)


def test_calls_the_fast_path_does_not_remember(fs, S, monkeypatch):
    """THD, dropout, ragged offsets and a copied (non-contiguous) sink_token run the full path on every call, with the
    full path's results; FLASHSPAN_SDPA_ROUTE=flex (the retired route) raises on a signature the fast path
    remembered, and remembers nothing."""
    q, k, v = _qkv(10)
    sink = torch.randn(6, generator=torch.Generator().manual_seed(1))[::2]  # non-contiguous: copied per call
    a = fs.sdpa(q, k, v, attn_scale=0.5, sink_token=sink)
    b = fs.sdpa(q, k, v, attn_scale=0.5, sink_token=sink)
    assert torch.equal(a[0], b[0])
    drop = dict(attn_scale=0.5, dropout=(0.25, 7, 3))
    assert torch.equal(fs.sdpa(q, k, v, **drop)[0], fs.sdpa(q, k, v, **drop)[0])
    T = torch.tensor([0, 5, 12], dtype=torch.int32)
    qt = torch.randn(12, 3, 16, generator=torch.Generator().manual_seed(2))
    thd = dict(attn_scale=0.5, use_padding_mask=True, cu_seq_len_q=T, cu_seq_len_kv=T)
    assert torch.equal(fs.sdpa(qt, qt, qt, **thd)[0], fs.sdpa(qt, qt, qt, **thd)[0])
    assert len(S._FAST) == 0
    fs.sdpa(q, k, v, attn_scale=0.5)
    assert len(S._FAST) == 1
    monkeypatch.setenv("FLASHSPAN_SDPA_ROUTE", "flex")
    with pytest.raises(ValueError, match=r"^FLASHSPAN_SDPA_ROUTE=flex: .* was retired"):
        fs.sdpa(q, k, v, attn_scale=0.5)
    with pytest.raises(ValueError, match=r"^FLASHSPAN_SDPA_ROUTE=flex: .* was retired"):
        fs.sdpa(q, k, v, attn_scale=0.25)
    assert len(S._FAST) == 1


# ---------------------------------------------------------------------------
# The ops' own fast path (sdpa_ops.py, _op_key / _op_remember) and sdpa_fwd's autograd shortcut
# ---------------------------------------------------------------------------


def _op_entries(S):
    return [key for key in S._FAST if key[0] in ("sdpa_fwd", "sdpa_bwd", "_sdpa_bwd_full")]


def _no_op_full_path(monkeypatch):
    """Makes the ops' full path (and the engine's) raise: an op call that still runs took the op's fast path."""
    ops = sys.modules["flashspan.sdpa_ops"]

    def boom(*a, **k):
        raise AssertionError("op full path taken")

    for name in ("_common_kwargs", "_check_io", "_forward_kw", "_backward_kw", "_fast_key"):
        monkeypatch.setattr(ops, name, boom)


def test_op_second_call_takes_the_op_fast_path_and_matches(fs, S, monkeypatch):
    op = torch.ops.flashspan.sdpa_fwd
    q, k, v = _qkv(20)
    sinks = torch.randn(3, generator=torch.Generator().manual_seed(3)).to(torch.bfloat16)  # converted per call
    lens = dict(seq_len_q=torch.tensor([10, 24]), seq_len_kv=torch.tensor([29, 3]))
    kw = dict(is_causal=True, window_left=9, sinks=sinks, **lens)
    op(q, k, v, 0.5, **kw)
    assert len(_op_entries(S)) == 1
    q2, k2, v2 = _qkv(21)
    sinks2 = sinks * 2
    lens2 = dict(seq_len_q=torch.tensor([3, 17]), seq_len_kv=torch.tensor([5, 29]))
    kw2 = dict(kw, sinks=sinks2, **lens2)  # same signature, other values: read per call
    want = _uncached(S, lambda: op(q2, k2, v2, 0.5, **kw2))
    with monkeypatch.context() as m:
        _no_op_full_path(m)
        got = op(q2, k2, v2, 0.5, **kw2)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    # return_lse=False: the empty LSE of the full path
    op(q, k, v, 0.5, return_lse=False)
    with monkeypatch.context() as m:
        _no_op_full_path(m)
        o, lse = op(q2, k2, v2, 0.5, return_lse=False)
    assert lse.shape == (0,) and lse.dtype == torch.float32
    assert torch.equal(o, _uncached(S, lambda: op(q2, k2, v2, 0.5, return_lse=False))[0])


def test_op_signature_is_the_engine_key_without_keywords(fs, S):
    """_op_key repeated _fast_key's loop over the tensors: the ops' signatures are now _fast_key's, without the
    engine's keyword part (kw None) and with tensors of any rank (the sinks and lengths are 1-D)."""
    O = sys.modules["flashspan.sdpa_ops"]
    assert O._op_key is S._fast_key
    q, k, v = _qkv(30)
    sinks = torch.randn(3)
    lens = torch.tensor([10, 24])
    scalars = (0.5, True, False, -1, -1, 0, 0, True)
    torch.ops.flashspan.sdpa_fwd(q, k, v, 0.5, is_causal=True, sinks=sinks, seq_len_q=lens, seq_len_kv=lens)
    key = S._fast_key("sdpa_fwd", (q, k, v, sinks, lens, lens), scalars, None)
    assert key in S._FAST and key in _op_entries(S)
    assert key == ("sdpa_fwd", scalars) + tuple(
        None if t is None else (t.shape, t.stride(), t.dtype, t.device) for t in (q, k, v, sinks, lens, lens))
    # The engine's keys keep refusing packed (3-D) tensors; the op's take them (its callers skip THD calls).
    t3 = torch.randn(8, 3, 16)
    assert S._fast_key("fwd", (t3, t3, t3, None, None), False, {}) is None
    assert S._fast_key("sdpa_fwd", (t3,), scalars, None) is not None


def test_op_empty_lse_is_allocated_in_one_place(fs, S, monkeypatch):
    """return_lse=False: the empty LSE was allocated on the fast path and again on the full path; one place now,
    after either path."""
    import inspect

    O = sys.modules["flashspan.sdpa_ops"]
    assert inspect.getsource(O._sdpa_fwd_impl).count("torch.empty(0") == 1
    op = torch.ops.flashspan.sdpa_fwd
    q, k, v = _qkv(31)
    o_full, lse_full = op(q, k, v, 0.5, return_lse=False)  # the full path
    with monkeypatch.context() as m:
        _no_op_full_path(m)
        o_fast, lse_fast = op(q, k, v, 0.5, return_lse=False)  # the fast path
    for lse in (lse_full, lse_fast):
        assert lse.shape == (0,) and lse.dtype == torch.float32 and lse.device == q.device
    assert torch.equal(o_full, o_fast)


@pytest.mark.parametrize("change", ["strides", "dtype", "shape", "scale", "causal", "bottom_right", "window_left",
                                    "window_right", "return_lse", "sinks", "sinks_dtype", "seq_len", "max_seqlen"])
def test_op_changed_signature_is_not_reused(fs, S, change):
    op = torch.ops.flashspan.sdpa_fwd
    q, k, v = _qkv(22)
    base = dict(is_causal=True, window_left=7)
    op(q, k, v, 0.3, **base)
    op(q, k, v, 0.3, **base)
    scale, kw = 0.3, dict(base)
    if change == "strides":
        q = q.transpose(1, 2).contiguous().transpose(1, 2)
    elif change == "dtype":
        q, k, v = q.double(), k.double(), v.double()
    elif change == "shape":
        q = q[:, :, :20]
    elif change == "scale":
        scale = 0.7
    elif change == "causal":
        kw["is_causal"] = False
    elif change == "bottom_right":
        kw["causal_bottom_right"] = True
    elif change == "window_left":
        kw["window_left"] = 3
    elif change == "window_right":
        kw = dict(window_left=7, window_right=2)
    elif change == "return_lse":
        kw["return_lse"] = False
    elif change == "sinks":
        kw["sinks"] = torch.randn(3, generator=torch.Generator().manual_seed(4))
    elif change == "sinks_dtype":
        kw["sinks"] = torch.randn(3, generator=torch.Generator().manual_seed(4)).double()
    elif change == "seq_len":
        kw.update(seq_len_q=torch.tensor([10, 24]), seq_len_kv=torch.tensor([29, 3]))
    elif change == "max_seqlen":
        kw.update(max_seqlen_q=24, max_seqlen_kv=29)  # ignored by the dense path, but another signature
    got = op(q, k, v, scale, **kw)
    got2 = op(q, k, v, scale, **kw)  # now from the op's fast path
    want = _uncached(S, lambda: op(q, k, v, scale, **kw))
    for a, b, c in zip(got, got2, want):
        assert torch.equal(a, c) and torch.equal(b, c)
    assert len(_op_entries(S)) == 2


def test_op_bad_input_is_never_remembered(fs, S):
    op = torch.ops.flashspan.sdpa_fwd
    q, k, v = _qkv(23)
    op(q, k, v, 0.5, is_causal=True)
    op(q, k, v, 0.5, is_causal=True)
    n = len(S._FAST)
    cases = [
        (lambda: op(q, k, v, 0.5, window_left=0), ValueError, "sdpa_fwd: window_left counts the visible tokens"),
        (lambda: op(q, k, v, 0.5, is_causal=True, window_right=3), ValueError, "sdpa_fwd: is_causal masks"),
        (lambda: op(q, k, v, 0.5, causal_bottom_right=True), ValueError, "sdpa_fwd: causal_bottom_right only"),
        (lambda: op(q, k.double(), v, 0.5), TypeError, "sdpa_fwd: all io tensors must share one dtype"),
        (lambda: op(q.int(), k.int(), v.int(), 0.5), TypeError, "sdpa_fwd: q: unsupported dtype torch.int32"),
        (lambda: op(q, k, v, 0.5, seq_len_q=torch.tensor([3, 4])), ValueError,
         "sdpa_fwd: the padded path needs both seq_len_q and seq_len_kv"),
        (lambda: op(q[0], k[0], v[0], 0.5), ValueError, "sdpa_fwd: the dense path expects BHSD"),
        (lambda: op(q, k[:, :2], v[:, :2], 0.5), ValueError, "sdpa_fwd:"),  # H_k does not divide H_q: the C layer
    ]
    for call, exc, msg in cases:
        for _ in range(3):  # the same error every time
            with pytest.raises(exc, match="^" + re.escape(msg)):
                call()
    assert len(S._FAST) == n


def test_op_route_variable_is_read_per_call(fs, S, monkeypatch):
    """FLASHSPAN_SDPA_ROUTE=flex raises on a signature the op's fast path remembered, with the full path's error."""
    op = torch.ops.flashspan.sdpa_fwd
    q, k, v = _qkv(24)
    op(q, k, v, 0.5)
    op(q, k, v, 0.5)
    monkeypatch.setenv("FLASHSPAN_SDPA_ROUTE", "flex")
    with pytest.raises(ValueError) as full:
        _uncached(S, lambda: op(q, k, v, 0.5))
    assert str(full.value).startswith("sdpa_fwd: FLASHSPAN_SDPA_ROUTE=flex: ")
    for _ in range(2):
        with pytest.raises(ValueError) as fast:
            op(q, k, v, 0.5)
        assert str(fast.value) == str(full.value)
    monkeypatch.setenv("FLASHSPAN_SDPA_ROUTE", "bogus")
    with pytest.raises(ValueError, match=r"^sdpa_fwd: FLASHSPAN_SDPA_ROUTE: must be unset, native or reference"):
        op(q, k, v, 0.5)
    monkeypatch.setenv("FLASHSPAN_SDPA_ROUTE", " Reference ")
    op(q, k, v, 0.5)
    monkeypatch.delenv("FLASHSPAN_SDPA_ROUTE")
    op(q, k, v, 0.5)


def test_op_backward_fast_path(fs, S, monkeypatch):
    op, bwd = torch.ops.flashspan.sdpa_fwd, torch.ops.flashspan.sdpa_bwd
    q, k, v = _qkv(25)
    o, lse = op(q, k, v, 0.5, is_causal=True)
    dO = torch.randn_like(o)
    dO_t = dO.transpose(2, 3).contiguous().transpose(2, 3)  # last dim not contiguous: copied per call
    for grad_out, stats, det in ((dO, lse, False), (dO, lse[..., 0], False), (dO_t, lse, False), (dO, lse, True)):
        bwd(grad_out, q, k, v, o, stats, 0.5, is_causal=True, is_deterministic=det)
        want = _uncached(S, lambda: bwd(grad_out * 2, q, k, v, o, stats, 0.5, is_causal=True, is_deterministic=det))
        with monkeypatch.context() as m:
            _no_op_full_path(m)
            got = bwd(grad_out * 2, q, k, v, o, stats, 0.5, is_causal=True, is_deterministic=det)
        for a, b in zip(got, want):
            assert torch.equal(a, b)
    with pytest.raises(TypeError, match=r"^sdpa_bwd: lse: dtype must be float32"):
        bwd(dO, q, k, v, o, lse.double(), 0.5, is_causal=True)
    # the internal full backward (sinks, per-sample lengths): its dsink too
    full = torch.ops.flashspan._sdpa_bwd_full
    sinks = torch.randn(3, generator=torch.Generator().manual_seed(5))
    lens = (torch.tensor([10, 24]), torch.tensor([29, 3]))
    o, lse = op(q, k, v, 0.5, sinks=sinks, seq_len_q=lens[0], seq_len_kv=lens[1])
    args = (0.5, False, False, -1, -1, sinks, *lens, None, None, 0, 0, False)
    full(dO, q, k, v, o, lse, *args)
    want = _uncached(S, lambda: full(dO * 3, q, k, v, o, lse, *args))
    with monkeypatch.context() as m:
        _no_op_full_path(m)
        got = full(dO * 3, q, k, v, o, lse, *args)
    for a, b in zip(got, want):
        assert torch.equal(a, b)


def test_op_autograd_shortcut_keeps_autograd_and_modes(fs, S):
    """sdpa_fwd's autograd kernel calls the implementation directly only without gradients and on plain tensors:
    inputs requiring grad record the backward, a TorchDispatchMode and fake tensors still see the op."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.utils._python_dispatch import TorchDispatchMode

    op = torch.ops.flashspan.sdpa_fwd
    q, k, v = _qkv(26, dtype=torch.float64)
    o_plain, lse_plain = op(q, k, v, 0.5, is_causal=True)
    assert o_plain.grad_fn is None and not o_plain.requires_grad
    qg = q.clone().requires_grad_()
    o, lse = op(qg, k, v, 0.5, is_causal=True)
    assert o.grad_fn is not None and torch.equal(o.detach(), o_plain)
    (gq,) = torch.autograd.grad(o.sum(), qg)
    assert gq.shape == q.shape and torch.isfinite(gq).all()
    with torch.no_grad():
        o_ng, _ = op(qg, k, v, 0.5, is_causal=True)
    assert o_ng.grad_fn is None and torch.equal(o_ng, o_plain)

    seen = []

    class Mode(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            seen.append(str(func))
            return func(*args, **(kwargs or {}))

    with Mode():
        o_mode, _ = op(q, k, v, 0.5, is_causal=True)
    assert "flashspan.sdpa_fwd.default" in seen and torch.equal(o_mode, o_plain)
    with FakeTensorMode() as mode:
        fq, fk, fv = (mode.from_tensor(t) for t in (q, k, v))
        o_fake, lse_fake = op(fq, fk, fv, 0.5, is_causal=True)
    assert o_fake.shape == o_plain.shape and lse_fake.shape == lse_plain.shape
    # a negative view (the Negative key: torch's redispatch materialises it)
    o_neg, _ = op(torch._neg_view(q), k, v, 0.5, is_causal=True)
    assert torch.equal(o_neg, op(-q, k, v, 0.5, is_causal=True)[0])
