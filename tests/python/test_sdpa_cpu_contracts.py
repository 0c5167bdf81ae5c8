"""SDPA C ABI contracts on CPU tensors, through the ctypes binding (_sdpa_lib) and flashspan.sdpa: the bad-input
rules of issue 14 that need the raw ABI (output overlap, variant-pack pointers, byte offsets, integer overflow of
runtime values) and the band rules (bottom-right needs a band; huge bounds mean "unbounded")."""

import ctypes

import pytest
import torch

import sdpa_ref
from sdpa_cases import assert_close

B, H, S, D = 2, 2, 8, 16


def _qkv(dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(B, H, S, D, generator=g, dtype=dtype) for _ in range(3)]


def _fwd_op(q, k, v, o, stats=None, options=(), tensors=()):
    """An fs_sdpa_fwd_t over explicit descriptors (the flashspan.sdpa layer never builds broken ones)."""
    from flashspan import _lib
    from flashspan import _sdpa_lib as L

    attrs = L.Attributes(False)
    for name, value in options:
        attrs.set(name, value)
    for name, desc in tensors:
        attrs.set(name, desc)
    descs = [_lib.TensorDesc(t, n) if isinstance(t, torch.Tensor) else t
             for t, n in ((q, "q"), (k, "k"), (v, "v"), (o, "o"), (stats, "stats"))]
    descs = [None if d is None else d for d in descs]
    return L.Op("fwd", [d if d is not None else None for d in descs], attrs)


def _pack(**slots):
    from flashspan import _sdpa_lib as L

    return {getattr(L, name.upper()): ptr for name, ptr in slots.items()}


# ---------------------------------------------------------------------------
# Diagonal band rules
# ---------------------------------------------------------------------------


def test_bottom_right_without_a_band_is_rejected(fs):
    q, k, v = _qkv()
    with pytest.raises(ValueError, match=r"diagonal_alignment: BOTTOM_RIGHT only re-anchors a diagonal band"):
        fs.sdpa(q, k, v, diagonal_alignment="BOTTOM_RIGHT")
    with pytest.raises(ValueError, match=r"diagonal_alignment"):
        fs.sdpa_backward(q, k, v, q, q, torch.zeros(B, H, S, 1), diagonal_alignment="BOTTOM_RIGHT")
    # With a band (or through the deprecated setter, which sets right_bound = 0) it is accepted.
    fs.sdpa(q, k, v, diagonal_alignment="BOTTOM_RIGHT", diagonal_band_left_bound=3)
    fs.sdpa(q, k, v, use_causal_mask_bottom_right=True)


@pytest.mark.parametrize("side", ["right", "left"])
@pytest.mark.parametrize("bound", [2**31, 2**62, 2**63 - 1])
def test_huge_band_bounds_mask_nothing(fs, side, bound):
    # A bound past S_q + S_kv masks nothing more than an absent one; row + bound must not overflow.
    q, k, v = _qkv(torch.float64, seed=1)
    sl_q, sl_kv = torch.tensor([3, 8]), torch.tensor([8, 5])
    kw = dict(use_padding_mask=True, seq_len_q=sl_q, seq_len_kv=sl_kv, diagonal_alignment="BOTTOM_RIGHT",
              generate_stats=True)
    other = {"diagonal_band_left_bound": 2} if side == "right" else {"diagonal_band_right_bound": 1}
    got = fs.sdpa(q, k, v, **{f"diagonal_band_{side}_bound": bound}, **other, **kw)
    want = fs.sdpa(q, k, v, **other, **kw)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    # and against the oracle
    case = sdpa_ref.Case(q=q, k=k, v=v, len_q=[3, 8], len_kv=[8, 5], bottom_right=True,
                         left=2 if side == "right" else None, right=1 if side == "left" else None)
    ref = sdpa_ref.forward(case, q, k, v)
    for b, n in enumerate([3, 8]):
        assert_close(got[0][b, :, :n], ref["o"][b, :, :n], torch.float64, "o")


_PAST_INT64 = {
    "left bound 2**64 + 2": (dict(diagonal_band_left_bound=2**64 + 2), "diagonal_band_left_bound", 2**64 + 2),
    "right bound 2**64": (dict(diagonal_band_right_bound=2**64), "diagonal_band_right_bound", 2**64),
    "left bound 2**70": (dict(diagonal_band_left_bound=2**70), "diagonal_band_left_bound", 2**70),
    "right bound -2**63 - 1": (dict(diagonal_band_right_bound=-(2**63) - 1), "diagonal_band_right_bound",
                               -(2**63) - 1),
    "max_total_seq_len_q": (dict(max_total_seq_len_q=2**64 + 3), "max_total_seq_len_q", 2**64 + 3),
    "paged max": (dict(paged_attention_max_seq_len_kv=2**64), "paged_attention_max_seq_len_kv", 2**64),
    "dropout seed": (dict(dropout=(0.1, 2**64 + 1, 0)), "dropout seed", 2**64 + 1),
    "dropout offset": (dict(dropout=(0.1, 0, 2**64)), "dropout offset", 2**64),
}


@pytest.mark.parametrize("case", list(_PAST_INT64))
def test_integers_past_int64_are_refused_naming_the_argument(fs, case):
    # The C layer takes int64: ctypes wrapped a larger Python int modulo 2**64 (a left bound of 2**64 + 2 ran as 2,
    # a right bound of 2**64 as causal) and torch.tensor's "Overflow when unpacking long long" named no argument.
    q, k, v = _qkv()
    kw, name, value = _PAST_INT64[case]
    pattern = rf"^{name}: {value} does not fit int64 \(must be in \[-2\*\*63, 2\*\*63 - 1\]\)"
    with pytest.raises(ValueError, match=pattern):
        fs.sdpa(q, k, v, **kw)
    if "paged" not in name and "total" not in name:
        o, stats = fs.sdpa(q, k, v, generate_stats=True)
        with pytest.raises(ValueError, match=pattern):
            fs.sdpa_backward(q, k, v, o, o, stats, **kw)
    # 2**63 - 1 itself fits (and means "unbounded": test_huge_band_bounds_mask_nothing).
    fs.sdpa(q, k, v, diagonal_band_left_bound=2**63 - 1)


@pytest.mark.parametrize("kw, name, shown", [
    (dict(attn_scale=1e40), "attn_scale", r"1e\+40"),
    (dict(attn_scale=10**400), "attn_scale", r"1000"),
    (dict(softcap=1e300), "softcap", r"1e\+300"),
    (dict(softcap=-1e39), "softcap", r"-1e\+39"),
    (dict(dropout=(1e300, 0, 0)), "dropout probability", r"1e\+300"),
])
def test_floats_past_float32_are_refused_naming_the_argument(fs, kw, name, shown):
    # The C ABI takes these as float32: a finite value past its range became inf on the way and was refused as
    # "must be finite, got inf", a value the caller never gave.
    q, k, v = _qkv()
    with pytest.raises(ValueError, match=rf"^{name}: {shown}.* does not fit float32 \(must be finite as float32\)"):
        fs.sdpa(q, k, v, **kw)
    if name == "attn_scale" and isinstance(kw["attn_scale"], float):  # the op's schema takes a float
        with pytest.raises(ValueError, match=rf"^sdpa_fwd: attn_scale: {shown}.* does not fit float32"):
            torch.ops.flashspan.sdpa_fwd(q, k, v, kw["attn_scale"])
    # inf itself is the C layer's rule, named with the value given.
    with pytest.raises(ValueError, match=r"^attn_scale: must be finite, got inf"):
        fs.sdpa(q, k, v, attn_scale=float("inf"))


# ---------------------------------------------------------------------------
# Outputs, variant-pack pointers, byte offsets
# ---------------------------------------------------------------------------


def test_self_overlapping_outputs_are_rejected(fs):
    q, k, v = _qkv()
    o = torch.empty(B, H, 1, D).expand(B, H, S, D)  # stride 0 over S: every row writes one row
    with pytest.raises(ValueError, match=r"^o: strides make different elements share memory"):
        _fwd_op(q, k, v, o)
    stats = torch.empty(B, H, 1, 1).expand(B, H, S, 1)
    with pytest.raises(ValueError, match=r"^stats: strides make different elements share memory"):
        _fwd_op(q, k, v, torch.empty(B, H, S, D), stats, options=[("generate_stats", 1)])
    # Interleaving strides: H and S both step by D.
    o2 = torch.empty(B * (H + S) * D).as_strided((B, H, S, D), ((H + S) * D, D, D, 1))
    with pytest.raises(ValueError, match=r"^o: .*an output must not overlap itself"):
        _fwd_op(q, k, v, o2)
    # Backward gradients too.
    from flashspan import _lib
    from flashspan import _sdpa_lib as L

    dq = torch.empty(B, 1, S, D).expand(B, H, S, D)
    descs = [_lib.TensorDesc(t, n) for t, n in ((q, "q"), (k, "k"), (v, "v"), (q, "o"), (q, "dO"),
                                                 (torch.zeros(B, H, S, 1), "stats"), (dq, "dQ"),
                                                 (torch.empty_like(k), "dK"), (torch.empty_like(v), "dV"))]
    with pytest.raises(ValueError, match=r"^dQ: strides make different elements share memory"):
        L.Op("bwd", descs, L.Attributes(True))


def test_misaligned_variant_pack_pointer_is_rejected(fs):
    q, k, v = _qkv()
    o = torch.empty(B, H, S, D)
    op = _fwd_op(q, k, v, o)
    ptrs = _pack(q=q.data_ptr(), k=k.data_ptr(), v=v.data_ptr(), o=o.data_ptr())
    op.execute(ptrs, None, None)  # aligned: fine
    ptrs[next(iter(_pack(k=0)))] = k.data_ptr() + 2
    with pytest.raises(ValueError, match=r"^k: data pointer \(variant_pack pointer \+ byte_offset\) must be aligned"):
        op.execute(ptrs, None, None)


def test_descriptor_byte_offset_is_added_to_the_pack_pointer(fs):
    # DLPack semantics: element (0, ..) is at data + byte_offset; the variant pack supplies data.
    from flashspan import _lib

    q, k, v = _qkv(seed=3)
    want, _ = fs.sdpa(q, k, v, attn_scale=0.3)
    pad = 5  # elements before the tensor
    kbuf = torch.full((pad + k.numel(),), float("nan"))
    kbuf[pad:] = k.reshape(-1)
    kdesc = _lib.TensorDesc(k, "k")
    kdesc.struct.byte_offset = pad * 4
    o = torch.full((B, H, S, D), float("nan"))
    op = _fwd_op(q, kdesc, v, o, options=[("attn_scale", 0.3)])
    op.execute(_pack(q=q.data_ptr(), k=kbuf.data_ptr(), v=v.data_ptr(), o=o.data_ptr()), None, None)
    assert torch.equal(o, want)


# ---------------------------------------------------------------------------
# Runtime values that overflow int64 arithmetic
# ---------------------------------------------------------------------------


def test_length_errors_name_the_argument_first(fs):
    # "<argument>: <rule>", like every other message (the SDPA fuzzer found "seq_len_q[0] = ... is outside").
    q, k, v = _qkv()
    with pytest.raises(ValueError, match=r"^seq_len_q: sample 0 has length -9223372036854775808, outside \[0, S_q = 8\]"):
        fs.sdpa(q, k, v, use_padding_mask=True, seq_len_q=torch.tensor([-(2**63), 1]), seq_len_kv=torch.tensor([8, 8]))


def test_cumulative_lengths_that_overflow_are_rejected(fs):
    q, k, v = _qkv()
    cu = torch.tensor([0, 1, -(2**63)], dtype=torch.int64)  # -2^63 - 1 overflows int64
    with pytest.raises(ValueError, match=r"^cu_seq_len_q: must be nondecreasing"):
        fs.sdpa(q, k, v, use_padding_mask=True, cu_seq_len_q=cu, seq_len_kv=torch.tensor([8, 8]))


def test_ragged_offset_times_multiplier_overflow_is_rejected(fs):
    # Packed q [B, H, S, D] descriptor with offsets near 2^62 and a token multiplier of H * D: the element
    # offset overflows int64 (raw ABI: flashspan.sdpa already rejects offsets past the packed tensor).
    from flashspan import _lib
    from flashspan import _sdpa_lib as L

    T = 8
    qt = torch.randn(T, H, D)
    k = torch.randn(B, H, S, D)
    o = torch.empty(T, H, D)
    offs = torch.tensor([0, 2**62, 8], dtype=torch.int64)
    lens = torch.tensor([4, 4], dtype=torch.int64)
    lens_kv = torch.tensor([8, 8], dtype=torch.int64)
    desc = lambda t, n: _lib.TensorDesc.from_spec((B, H, 4, D), (0, D, H * D, 1), t.dtype, t.device, n)
    attrs = L.Attributes(False)
    attrs.set("padding_mask", 1)
    attrs.set("seq_len_q", _lib.TensorDesc(lens, "seq_len_q"))
    attrs.set("seq_len_kv", _lib.TensorDesc(lens_kv, "seq_len_kv"))
    attrs.set_ragged_offset(L.Q, _lib.TensorDesc(offs, "offsets"), H * D)
    op = L.Op("fwd", [desc(qt, "q"), _lib.TensorDesc(k, "k"), _lib.TensorDesc(k, "v"),
                      _lib.TensorDesc(torch.empty(B, H, 4, D), "o"), None], attrs)
    ptrs = _pack(q=qt.data_ptr(), k=k.data_ptr(), v=k.data_ptr(), o=o.data_ptr(), seq_len_q=lens.data_ptr(),
                 seq_len_kv=lens_kv.data_ptr())
    ptrs[L.RAGGED[L.Q]] = offs.data_ptr()
    with pytest.raises(ValueError, match=r"^ragged offset of q: entry 1 = 4611686018427387904 times the multiplier 32 "
                                         r"overflows int64"):
        op.execute(ptrs, None, None)


def test_ragged_rows_outside_the_packed_tensor_are_rejected(fs):
    # Every sample's rows [offset, offset + length) must lie in the packed (T, H, D) tensor, not only the last
    # offset (a middle offset past T was read out of bounds).
    q = torch.randn(8, H, D)
    k = torch.randn(B, H, S, D)
    for offs in ([0, 100000, 8], [0, 6, 8]):  # sample 1 at 100000; sample 1 = rows [6, 10) with T = 8
        with pytest.raises(ValueError, match=r"^q: the ragged offsets place sample 1's rows .* outside the packed "
                                             r"tensor's T = 8 tokens"):
            fs.sdpa(q, k, k, use_padding_mask=True, seq_len_q=torch.tensor([4, 4]), seq_len_kv=torch.tensor([8, 8]),
                    ragged_offsets={"q": torch.tensor(offs)}, max_seq_len_q=4)


def test_ragged_samples_sharing_rows_are_rejected(fs):
    # Interleaved tokens are not supported (the seed's ragged layout): sample 1 placed over sample 0's rows of q
    # made o's sample 1 overwrite sample 0's rows 2 and 3, silently. Checked on the host for CPU tensors (as the rows
    # outside T above); CUDA calls skip it (it would sync).
    qt, kt = torch.randn(20, H, D), torch.randn(12, H, D)
    kw = dict(use_padding_mask=True, seq_len_q=torch.tensor([4, 6]), cu_seq_len_kv=torch.tensor([0, 5, 12]))
    with pytest.raises(ValueError, match=r"^q: the ragged offsets place samples 0 and 1 on shared rows \(sample 0: "
                                         r"rows \[0, 4\), sample 1: rows \[2, 8\)\): each sample needs rows of its own "
                                         r"\(interleaved tokens are not supported\)"):
        fs.sdpa(qt, kt, kt, ragged_offsets={"q": torch.tensor([0, 2, 20])}, **kw)
    # Out of order (sample 1 first, 0 after it), the last sample covering the first: found whatever the order.
    with pytest.raises(ValueError, match=r"^q: the ragged offsets place samples 0 and 1 on shared rows \(sample 0: "
                                         r"rows \[10, 14\), sample 1: rows \[8, 14\)\)"):
        fs.sdpa(qt, kt, kt, ragged_offsets={"q": torch.tensor([10, 8, 20])}, **kw)
    # The KV side, and the backward.
    kw_kv = dict(use_padding_mask=True, cu_seq_len_q=torch.tensor([0, 4, 10]), seq_len_kv=torch.tensor([5, 7]))
    qp = torch.randn(10, H, D)
    with pytest.raises(ValueError, match=r"^k: the ragged offsets place samples 0 and 1 on shared rows"):
        fs.sdpa(qp, kt, kt, ragged_offsets={"k": torch.tensor([0, 4, 12]), "v": torch.tensor([0, 5, 12])}, **kw_kv)
    o, stats = fs.sdpa(qt, kt, kt, ragged_offsets={"q": torch.tensor([0, 8, 20])}, generate_stats=True, **kw)
    with pytest.raises(ValueError, match=r"^q: the ragged offsets place samples 0 and 1 on shared rows"):
        fs.sdpa_backward(qt, kt, kt, o, o, stats, ragged_offsets={"q": torch.tensor([0, 2, 20])}, **kw)
    # Disjoint samples in any order, with gaps, and an empty sample anywhere are fine.
    want = fs.sdpa(qt, kt, kt, ragged_offsets={"q": torch.tensor([0, 8, 20])}, **kw)[0]
    q2 = torch.zeros_like(qt)
    q2[14:18], q2[0:6] = qt[0:4], qt[8:14]
    got = fs.sdpa(q2, kt, kt, ragged_offsets={"q": torch.tensor([14, 0, 20])}, **kw)[0]
    assert torch.equal(got[14:18], want[0:4]) and torch.equal(got[0:6], want[8:14])
    fs.sdpa(qt, kt, kt, use_padding_mask=True, seq_len_q=torch.tensor([4, 0]), cu_seq_len_kv=torch.tensor([0, 5, 12]),
            ragged_offsets={"q": torch.tensor([0, 2, 20])})


def test_ragged_offsets_of_another_type_are_type_errors_naming_it(fs):
    # A list of offsets for a tensor raised AttributeError ('list' object has no attribute 'reshape'), a list for the
    # argument a TypeError about dict's update sequence: neither named ragged_offsets.
    qt, kt = torch.randn(20, H, D), torch.randn(12, H, D)
    kw = dict(use_padding_mask=True, seq_len_q=torch.tensor([4, 6]), cu_seq_len_kv=torch.tensor([0, 5, 12]))
    with pytest.raises(TypeError, match=r"^ragged_offsets: 'q': must be a torch\.Tensor \(int32 / int64 token "
                                        r"offsets, shape \(B \+ 1,\)\), got list \[0, 8, 20\]"):
        fs.sdpa(qt, kt, kt, ragged_offsets={"q": [0, 8, 20]}, **kw)
    for bad in ([1, 2], "q", torch.tensor([0, 8, 20])):
        with pytest.raises(TypeError, match=r"^ragged_offsets: must be a dict \{tensor name: int32 / int64 tensor of "
                                            rf"token offsets \(B \+ 1,\)\}}, .*got {type(bad).__name__}"):
            fs.sdpa(qt, kt, kt, ragged_offsets=bad, **kw)
    with pytest.raises(ValueError, match=r"^ragged_offsets: unknown tensor name\(s\) \['x'\]"):
        fs.sdpa(qt, kt, kt, ragged_offsets={"x": torch.tensor([0, 8, 20])}, **kw)
    fs.sdpa(qt, kt, kt, ragged_offsets={"q": torch.tensor([0, 8, 20])}, **kw)


# ---------------------------------------------------------------------------
# Every invalid combination the seed names: a ValueError / TypeError (RuntimeError for a valid but unsupported
# configuration) whose message starts with the argument and states the rule.
# ---------------------------------------------------------------------------

_BF = torch.bfloat16
_SL = torch.tensor([3, 8], dtype=torch.int32)


def _bad_cases():
    q, k, v = (torch.randn(B, H, S, D, dtype=_BF) for _ in range(3))
    pad = dict(use_padding_mask=True, seq_len_q=_SL, seq_len_kv=_SL)
    kc = torch.randn(4, H, 4, D, dtype=_BF)
    pt = torch.zeros(B, 1, 2, 1, dtype=torch.int32)
    return {
        "alibi without causal": ((q, k, v), dict(use_alibi_mask=True), ValueError,
                                 r"use_alibi_mask: ALiBi requires causal masking"),
        "alibi with right bound 2": ((q, k, v), dict(use_alibi_mask=True, diagonal_band_right_bound=2), ValueError,
                                     r"use_alibi_mask: ALiBi requires causal masking .* got diagonal_band_right_bound = 2"),
        "bottom-right without a band": ((q, k, v), dict(diagonal_alignment="BOTTOM_RIGHT"), ValueError,
                                        r"diagonal_alignment: BOTTOM_RIGHT only re-anchors a diagonal band"),
        "alignment not an enum": ((q, k, v), dict(diagonal_alignment="MIDDLE"), ValueError,
                                  r"diagonal_alignment: must be TOP_LEFT or BOTTOM_RIGHT"),
        "negative right bound": ((q, k, v), dict(diagonal_band_right_bound=-1), ValueError,
                                 r"diagonal_band_right_bound: must be >= 0"),
        "left bound 0": ((q, k, v), dict(diagonal_band_left_bound=0), ValueError,
                         r"diagonal_band_left_bound: must be >= 1"),
        "mixed dtypes": ((q, k.half(), v), {}, TypeError, r"k: dtype float16 differs from q's bfloat16"),
        "v dtype": ((q, k, v.float()), {}, TypeError, r"v: dtype float32 differs from q's bfloat16"),
        "both length forms on q": ((q, k, v), dict(pad, cu_seq_len_q=torch.tensor([0, 3, 11])), ValueError,
                                   r"seq_len_q, cu_seq_len_q: cannot both be set"),
        "both length forms on kv": ((q, k, v), dict(pad, cu_seq_len_kv=torch.tensor([0, 3, 11])), ValueError,
                                    r"seq_len_kv, cu_seq_len_kv: cannot both be set"),
        "lengths without padding mask": ((q, k, v), dict(seq_len_q=_SL, seq_len_kv=_SL), ValueError,
                                         r"seq_len_q: sequence lengths are only used with the padding mask"),
        "padding mask without kv lengths": ((q, k, v), dict(use_padding_mask=True, seq_len_q=_SL), ValueError,
                                            r"use_padding_mask: requires a Q-side .* missing: the KV side$"),
        "padding mask without any lengths": ((q, k, v), dict(use_padding_mask=True), ValueError,
                                             r"use_padding_mask: requires a Q-side .* missing: both sides$"),
        "head dim not a multiple of 8": ((q[..., :12], k[..., :12], v), {}, ValueError,
                                         r"q: head dim D_qk = 12 must be a positive multiple of 8"),
        "v head dim not a multiple of 8": ((q, k, v[..., :4]), {}, ValueError,
                                           r"v: head dim D_v = 4 must be a positive multiple of 8"),
        "head dim above 256": ((torch.randn(1, 1, 2, 264, dtype=_BF),) * 3, {}, ValueError,
                               r"q, v: head dims \(D_qk, D_v\) = \(264, 264\) are not supported"),
        "heads not dividing": ((q.repeat(1, 3, 1, 1)[:, :3], k, v), {}, ValueError,
                               r"k, v: for MHA / GQA / MQA the K and V head counts must divide H_q = 3"),
        "dropout probability 1": ((q, k, v), dict(dropout=(1.0, 1, 2)), ValueError,
                                  r"dropout: probability must be in \[0, 1\)"),
        "dropout probability negative": ((q, k, v), dict(dropout=(-0.25, 1, 2)), ValueError,
                                         r"dropout: probability must be in \[0, 1\)"),
        "dropout seed not an integer": ((q, k, v), dict(dropout=(0.1, torch.tensor([1.0]), torch.tensor([1]))),
                                        TypeError, r"dropout seed: dtype must be int32 or int64"),
        "dropout mask not broadcastable": ((q, k, v), dict(dropout=(torch.ones(1, 1, 3, S, dtype=torch.uint8),
                                                                    torch.tensor([1.0]))), ValueError,
                                           r"dropout mask: is not broadcastable to \[2, 2, 8, 8\]: dimension 2"),
        "rng_dump without Philox dropout": ((q, k, v), dict(rng_dump=torch.empty(B, H, S, S)), ValueError,
                                            r"rng_dump: needs Philox dropout"),
        "bias not broadcastable": ((q, k, v), dict(bias=torch.randn(1, 1, 3, S)), ValueError,
                                   r"bias: is not broadcastable to \[2, 2, 8, 8\]: dimension 2 \(S_q\) is 3"),
        "bias rank": ((q, k, v), dict(bias=torch.randn(S, S)), ValueError, r"bias: must be a 4-D tensor"),
        "bias dtype": ((q, k, v), dict(bias=torch.randn(1, 1, S, S, dtype=torch.float16)), TypeError,
                       r"bias: dtype must be q's \(bfloat16\) or float32"),
        "page table shape": ((q, kc, kc), dict(pad, paged_attention_k_table=torch.zeros(B, 2, 1, dtype=torch.int32),
                                               paged_attention_v_table=pt), ValueError,
                             r"paged_attention_k_table: page table shape must be \[B, 1, max_pages, 1\]"),
        "page table dtype": ((q, kc, kc), dict(pad, paged_attention_k_table=pt.long(), paged_attention_v_table=pt),
                             TypeError, r"paged_attention_k_table: dtype must be int32"),
        "paged block size not a power of two": ((q, torch.randn(4, H, 3, D, dtype=_BF), kc),
                                                dict(pad, paged_attention_k_table=torch.zeros(B, 1, 3, 1,
                                                                                              dtype=torch.int32),
                                                     paged_attention_v_table=pt), ValueError,
                                                r"k: the block size \(dim 2\) of a paged container .* power of "
                                                r"two, got 3"),
        "paged without padding": ((q, kc, kc), dict(paged_attention_k_table=pt, paged_attention_v_table=pt),
                                  ValueError, r"paged_attention_k_table, paged_attention_v_table: paged K/V caches "
                                              r"need the padding mask"),
        "page entry outside the container": ((q, kc, kc), dict(pad, paged_attention_k_table=torch.full_like(pt, 9),
                                                               paged_attention_v_table=pt), ValueError,
                                             r"paged_attention_k_table: entry \(batch 0, page 0\) = 9 is outside"),
        "max_seq_len_kv without paging": ((q, k, v), dict(paged_attention_max_seq_len_kv=8), ValueError,
                                          r"paged_attention_max_seq_len_kv: is only meaningful with paged K/V"),
        "max_total without a ragged layout": ((q, k, v), dict(max_total_seq_len_q=5), ValueError,
                                              r"max_total_seq_len_q: is only supported with a packed \(ragged\) Q-side"),
        "max_total smaller than the tokens": ((torch.randn(11, H, D, dtype=_BF), k, v),
                                              dict(use_padding_mask=True, cu_seq_len_q=torch.tensor([0, 3, 11]),
                                                   seq_len_kv=_SL, max_total_seq_len_q=10), ValueError,
                                              r"max_total_seq_len_q: the samples hold 11 tokens, more than the "
                                              r"declared 10"),
        "length above S": ((q, k, v), dict(pad, seq_len_q=torch.tensor([9, 1])), ValueError,
                           r"seq_len_q: sample 0 has length 9, outside \[0, S_q = 8\]"),
        "cu lengths decreasing": ((q, k, v), dict(use_padding_mask=True, cu_seq_len_q=torch.tensor([0, 5, 3]),
                                                  seq_len_kv=_SL), ValueError,
                                  r"cu_seq_len_q: must be nondecreasing"),
        "cu lengths not starting at 0": ((q, k, v), dict(use_padding_mask=True, cu_seq_len_q=torch.tensor([1, 5, 7]),
                                                         seq_len_kv=_SL), ValueError,
                                         r"cu_seq_len_q: must start at 0"),
        "softcap not positive": ((q, k, v), dict(softcap=0.0), ValueError, r"softcap: must be a finite positive value"),
        "attn_scale not finite": ((q, k, v), dict(attn_scale=float("inf")), ValueError, r"attn_scale: must be finite"),
        "attn_scale not a number": ((q, k, v), dict(attn_scale="0.5"), ValueError,
                                    r"attn_scale: must be a finite float, a 1-element float32 tensor or None, got str"),
        "attn_scale a bool": ((q, k, v), dict(attn_scale=True), ValueError, r"attn_scale: must be a finite float"),
        "sliding window and left bound disagree": ((q, k, v), dict(sliding_window_length=4, diagonal_band_left_bound=3),
                                                   ValueError, r"sliding_window_length, diagonal_band_left_bound: both "
                                                               r"set the left bound .* got 4 and 3"),
        "is_inference equal to generate_stats": ((q, k, v), dict(is_inference=True, generate_stats=True), ValueError,
                                                 r"is_inference, generate_stats: is_inference \(deprecated\) is the "
                                                 r"negation of generate_stats"),
        "sinks per head": ((q, k, v), dict(sink_token=torch.randn(3)), ValueError,
                           r"sink_token: must have 2 element\(s\)"),
        "gate shape": ((q, k, v), dict(gate=torch.randn(B, H, S, 8, dtype=_BF)), ValueError,
                       r"gate: shape must be \[2, 2, 8, 16\]"),
        "block mask dtype": ((q, k, v), dict(block_mask=torch.ones(1, 1, 1, 1, dtype=torch.int32)), TypeError,
                             r"block_mask: dtype must be uint8"),
        "block mask shape": ((q, k, v), dict(block_mask=torch.ones(1, 1, 2, 1, dtype=torch.uint8)), ValueError,
                             r"block_mask: shape must be \[1\|B, 1\|H_q, ceil\(S_q/128\)"),
        "implementation not an enum": ((q, k, v), dict(generate_stats=False, stats_use_log2=True,
                                                              implementation="FAST"), ValueError,
                                             r"implementation: must be AUTO, COMPOSITE or UNIFIED"),
    }


_BAD = _bad_cases()


@pytest.mark.parametrize("name", list(_BAD))
def test_seed_invalid_combinations_are_named(fs, name):
    (q, k, v), kw, exc, pattern = _BAD[name]
    with pytest.raises(exc, match="^" + pattern):
        with torch.no_grad():
            fs.sdpa(q, k, v, **kw)


# Numeric arguments of another type: softcap="2" ran with softcap 2.0 (float("2") parsed it), a float band bound or
# Philox seed was truncated (int(2.5)); the seed's graph.sdpa (pybind11) refuses both with a TypeError.
_NOT_NUMBERS = {
    "softcap a string": (dict(softcap="2"), r"softcap: must be a real number \(float\), got str '2'"),
    "softcap a bool": (dict(softcap=True), r"softcap: must be a real number \(float\), got bool"),
    "softcap a list": (dict(softcap=[2.0]), r"softcap: must be a real number \(float\), got list"),
    "dropout probability a string": (dict(dropout=("0.1", 1, 2)),
                                     r"dropout probability: must be a real number \(float\), got str"),
    "dropout seed a float": (dict(dropout=(0.1, 1.5, 2)), r"dropout seed: must be an int or an int32 / int64 tensor, got float 1.5"),
    "dropout offset a string": (dict(dropout=(0.1, 1, "2")), r"dropout offset: must be an int or an int32 / int64 tensor, got str"),
    "dropout scale a string": (dict(dropout=(torch.ones(1, 1, S, S, dtype=torch.uint8), "2")),
                               r"dropout scale: must be a torch.Tensor or a number, got str"),
    "left bound a string": (dict(diagonal_band_left_bound="2"), r"diagonal_band_left_bound: must be an int, got str"),
    "left bound a float": (dict(diagonal_band_left_bound=2.5), r"diagonal_band_left_bound: must be an int, got float"),
    "right bound a string": (dict(diagonal_band_right_bound="0"), r"diagonal_band_right_bound: must be an int"),
    "right bound a bool": (dict(diagonal_band_right_bound=False), r"diagonal_band_right_bound: must be an int, got bool"),
    "sliding window a float": (dict(sliding_window_length=4.0), r"sliding_window_length: must be an int, got float"),
    "max_total a string": (dict(max_total_seq_len_q="5"), r"max_total_seq_len_q: must be an int, got str"),
    "paged max a string": (dict(paged_attention_max_seq_len_kv="16"),
                           r"paged_attention_max_seq_len_kv: must be an int, got str"),
}


@pytest.mark.parametrize("name", list(_NOT_NUMBERS))
def test_numeric_arguments_of_another_type_are_type_errors(fs, name):
    q, k, v = _qkv()
    kw, pattern = _NOT_NUMBERS[name]
    if "paged" in name:
        kc = torch.randn(4, H, 4, D)
        table = torch.arange(4, dtype=torch.int32).view(B, 1, 2, 1)
        k = v = kc
        kw = dict(kw, use_padding_mask=True, seq_len_q=torch.full((B,), S, dtype=torch.int32),
                  seq_len_kv=torch.full((B,), 8, dtype=torch.int32), paged_attention_k_table=table,
                  paged_attention_v_table=table)
    with pytest.raises(TypeError, match="^" + pattern):
        fs.sdpa(q, k, v, **kw)


def test_numeric_arguments_of_another_type_are_type_errors_elsewhere(fs):
    q, k, v = _qkv()
    o, stats = fs.sdpa(q, k, v, generate_stats=True)
    with pytest.raises(TypeError, match=r"^softcap: must be a real number \(float\), got str"):
        fs.sdpa_backward(q, k, v, o, o, stats, softcap="2")
    with pytest.raises(TypeError, match=r"^diagonal_band_left_bound: must be an int, got float"):
        fs.sdpa_backward(q, k, v, o, o, stats, diagonal_band_left_bound=1.5)
    # THD: the maxima of the packed sides.
    cu = torch.tensor([0, 3, 8], dtype=torch.int32)
    t = torch.randn(8, H, D)
    with pytest.raises(TypeError, match=r"^max_seq_len_q: must be an int, got str"):
        fs.sdpa(t, t, t, use_padding_mask=True, cu_seq_len_q=cu, cu_seq_len_kv=cu, max_seq_len_q="5", max_seq_len_kv=5)
    with pytest.raises(TypeError, match=r"^max_seq_len_kv: must be an int, got float"):
        fs.dropout_offset_increment(64.0)


def test_numeric_arguments_take_numbers_of_any_kind(fs):
    """ints and NumPy scalars for floats, NumPy / 0-d tensor integers for ints: the same call as the Python numbers."""
    np = pytest.importorskip("numpy")
    q, k, v = _qkv()
    want = fs.sdpa(q, k, v, softcap=2.0, diagonal_band_left_bound=3, diagonal_band_right_bound=0,
                   dropout=(0.25, 7, 8))[0]
    for softcap, left, seed in ((2, np.int64(3), np.int32(7)), (np.float32(2.0), torch.tensor(3), torch.tensor([7])),
                                (np.float64(2.0), 3, 7)):
        got = fs.sdpa(q, k, v, softcap=softcap, diagonal_band_left_bound=left, diagonal_band_right_bound=np.int64(0),
                      dropout=(np.float64(0.25), seed, 8))[0]
        assert torch.equal(got, want)


def test_backward_only_rules_are_named(fs):
    q, k, v = (torch.randn(B, H, S, D, dtype=_BF) for _ in range(3))
    stats = torch.zeros(B, H, S, 1)
    with pytest.raises(ValueError, match=r"^dBias: needs the bias of the forward"):
        fs.sdpa_backward(q, k, v, q, q, stats, dBias=torch.empty(1, 1, S, S))
    with pytest.raises(ValueError, match=r"^dSink_token: requires sink_token"):
        fs.sdpa_backward(q, k, v, q, q, stats, dSink_token=torch.empty(H))
    with pytest.raises(ValueError, match=r"^dBias: shape must equal bias's \[1, 1, 8, 8\]"):
        fs.sdpa_backward(q, k, v, q, q, stats, bias=torch.randn(1, 1, S, S), dBias=torch.empty(1, H, S, S))
    with pytest.raises(ValueError, match=r"^stats: shape must be \[2, 2, 8, 1\]"):
        fs.sdpa_backward(q, k, v, q, q, torch.zeros(B, H, S, 2))
    with pytest.raises(ValueError, match=r"^stats: must be 4-D \(B, H_q, S_q, 1\), got shape \(2, 2, 8\)"):
        fs.sdpa_backward(q, k, v, q, q, torch.zeros(B, H, S))


@pytest.mark.parametrize("kw, pattern", [
    (dict(is_causal=True, window_right=2), r"sdpa_fwd: is_causal masks every future column but window_right=2"),
    (dict(causal_bottom_right=True), r"sdpa_fwd: causal_bottom_right only re-anchors an active diagonal band"),
    (dict(window_left=0), r"sdpa_fwd: window_left counts the visible tokens including the diagonal"),
    (dict(window_right=-2), r"sdpa_fwd: window_right must be -1 \(unbounded\) or >= 0"),
    (dict(seq_len_q=torch.tensor([3, 8])), r"sdpa_fwd: the padded path needs both seq_len_q and seq_len_kv"),
    (dict(cu_seqlens_kv=torch.tensor([0, 3, 8])), r"sdpa_fwd: cu_seqlens_kv without cu_seqlens_q"),
])
def test_op_invalid_combinations_are_named(fs, kw, pattern):
    q, k, v = (torch.randn(B, H, S, D, dtype=_BF) for _ in range(3))
    with pytest.raises(ValueError, match="^" + pattern):
        torch.ops.flashspan.sdpa_fwd(q, k, v, 0.5, **kw)


# ---------------------------------------------------------------------------
# Non-finite inputs
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("where", ["q_nan", "q_inf", "bias_nan"])
@pytest.mark.parametrize("sink", [False, True])
def test_a_nan_logit_row_is_nan_not_an_empty_row(fs, dtype, where, sink):
    """A row whose logits hold a NaN (a NaN or Inf in q, a NaN bias element) has a NaN output, LSE, score_max and
    dQ, as PyTorch's math SDPA and flex give; every other row stays finite. (The reference's row max once dropped the
    NaN and ran the row as one that sees no key: O = 0, LSE = -inf.)"""
    q, k, v = _qkv(dtype)
    kw = {"attn_scale": 0.35, "generate_stats": True}
    if where == "bias_nan":
        bias = torch.zeros(1, 1, S, S, dtype=dtype)
        bias[0, 0, 3, 5] = float("nan")
        kw["bias"] = bias
    else:
        q[1, 0, 3, 2] = float("nan") if where == "q_nan" else float("inf")
    if sink:
        kw["sink_token"] = torch.full((H,), 0.5, dtype=torch.float32)
    score_max = torch.zeros(B, H, S, 1)
    o, stats = fs.sdpa(q, k, v, score_max=score_max, **kw)
    bad = torch.zeros(B, H, S, dtype=torch.bool)
    bad[(slice(None), slice(None), 3) if where == "bias_nan" else (1, 0, 3)] = True  # (the bias: every b, h)
    # An Inf in q gives logits of +-inf: O NaN (inf - inf), the max +inf, the LSE NaN; PyTorch's logsumexp: inf.
    assert o[bad].isnan().all() and not stats[bad].isfinite().any() and not score_max[bad].isfinite().any()
    assert o[~bad].isfinite().all() and stats[~bad].isfinite().all() and score_max[~bad].isfinite().all()
    dO = torch.randn_like(o)
    bkw = {"attn_scale": 0.35, "bias": kw.get("bias"), "sink_token": kw.get("sink_token")}
    dq, dk, dv = fs.sdpa_backward(q, k, v, o, dO, stats, **{n: x for n, x in bkw.items() if x is not None})[:3]
    assert dq[bad].isnan().all()
    assert dq[~bad].isfinite().all()


@pytest.mark.parametrize("call", ["sdpa", "sdpa_backward", "sdpa_torch", "sdpa_torch_scale", "op"])
@pytest.mark.parametrize("missing", [0, 1, 2])
def test_none_for_q_k_or_v_is_a_type_error_naming_it(fs, call, missing):
    """None (or any non-tensor) for q, k or v is a TypeError naming the argument (docs/ERRORS.md), whatever entry
    point: not an AttributeError from inside the binding."""
    t = list(_qkv())
    t[missing] = None
    names = {"sdpa_torch": ("query", "k", "v")}.get(call, ("q", "k", "v"))
    with pytest.raises(TypeError, match=rf"\b{names[missing]}: must be a torch\.Tensor"):
        if call == "sdpa":
            fs.sdpa(*t)
        elif call == "sdpa_backward":
            x = _qkv()[0]
            fs.sdpa_backward(*t, x, x, torch.zeros(B, H, S, 1))
        elif call == "sdpa_torch":
            fs.sdpa_torch(*t)
        elif call == "sdpa_torch_scale":
            fs.sdpa_torch(*t, scale=0.5)
        else:
            torch.ops.flashspan.sdpa_fwd(*t, 0.5)
