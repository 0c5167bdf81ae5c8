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
