"""Findings of a new-user trial on the CPU (2026-12-05): each test pins one fixed papercut."""

import math

import pytest
import torch

import flashspan
import flashspan._lib as _lib
import flashspan.masks as fm


def test_from_mask_mod_refuses_non_bool_results():
    # An additive mask (0 visible, -inf hidden), bool()-converted, is the inverse of the mask meant:
    # from_mask_mod refuses it, as from_dense refuses a non-bool mask.
    additive = lambda b, h, q, kv: torch.where(kv <= q, 0.0, float("-inf"))  # noqa: E731
    with pytest.raises(TypeError, match=r"mask_mod: must return a bool tensor .* got dtype torch.float32"):
        fm.from_mask_mod(additive, 4)
    with pytest.raises(TypeError, match="got dtype torch.int64"):
        fm.from_mask_mod(lambda b, h, q, kv: (kv <= q).long(), 4)
    # The explicit conversions the message names give the mask meant.
    assert torch.equal(fm.from_mask_mod(lambda b, h, q, kv: additive(b, h, q, kv) == 0, 4), fm.causal(4))
    # A Python bool (a constant mask) is still a bool.
    assert torch.equal(fm.from_mask_mod(lambda b, h, q, kv: True, 3), fm.from_dense(torch.ones(3, 3, dtype=torch.bool)))


def test_thd_mask_from_per_sample_builders():
    # The recipe of the masks module docstring: one builder per sample, concatenated along the rows.
    lq, lk, hq, hkv, d = [5, 17, 30], [9, 17, 40], 4, 2, 16
    cu_q = torch.tensor([0, 5, 22, 52], dtype=torch.int32)
    cu_k = torch.tensor([0, 9, 26, 66], dtype=torch.int32)
    mask_func = torch.cat([fm.causal(a, b, bottom_right=True) for a, b in zip(lq, lk)], dim=2)
    assert mask_func.shape == (1, 1, sum(lq))
    torch.manual_seed(0)
    q = torch.randn(sum(lq), hq, d)
    k = torch.randn(sum(lk), hkv, d)
    v = torch.randn(sum(lk), hkv, d)
    plan = flashspan.create_mask_plan(mask_func, q, k, v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k)
    out = flashspan.flex_attn_func(q, k, v, mask_plan=plan)
    for i, (a, b) in enumerate(zip(lq, lk)):
        qs, ks = q[cu_q[i]:cu_q[i + 1]], k[cu_k[i]:cu_k[i + 1]]
        vs = v[cu_k[i]:cu_k[i + 1]]
        visible = fm.to_dense(fm.causal(a, b, bottom_right=True), seqlen_k=b)[0]
        s = torch.einsum("qhd,khd->hqk", qs.double(), ks.repeat_interleave(hq // hkv, 1).double()) / math.sqrt(d)
        p = torch.softmax(s.masked_fill(~visible, float("-inf")), -1)
        ref = torch.einsum("hqk,khd->qhd", p, vs.repeat_interleave(hq // hkv, 1).double())
        torch.testing.assert_close(out[cu_q[i]:cu_q[i + 1]].double(), ref, atol=1e-5, rtol=0)


def test_library_not_found_names_every_place_searched(monkeypatch):
    # The message listed only the package's lib/ path (candidate_paths() drops build folders that do
    # not exist), not build/ or build-*/, where a source checkout's library is looked for.
    monkeypatch.delenv("FLASHSPAN_LIBRARY", raising=False)
    monkeypatch.setattr(_lib, "_lib", None)
    monkeypatch.setattr(_lib, "candidate_paths", lambda: ["/nonexistent/flashspan/lib/libflashspan.so"])
    with pytest.raises(ImportError) as info:
        _lib.lib()
    msg = str(info.value)
    assert "FLASHSPAN_LIBRARY" in msg and "/nonexistent/flashspan/lib/libflashspan.so" in msg
    assert "build/libflashspan.so" in msg and "build-*/libflashspan.so" in msg
    assert "FLASHSPAN_CUDA=OFF" in msg
