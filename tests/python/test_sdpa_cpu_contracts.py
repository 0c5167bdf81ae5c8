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
