"""A new user's trial of flashspan.sdpa on a CPU machine (2026-12-04): the documented decode example runs and is
right, the top-level names docs/SDPA.md promises exist, a non-tensor where a tensor is expected is a TypeError
naming the argument, and the ALiBi rule's message points decode calls at the bottom-right alignment. CPU tensors
(the CPU reference)."""

import pathlib
import re

import pytest
import torch

DOCS = pathlib.Path(__file__).resolve().parents[2] / "docs" / "SDPA.md"


def test_documented_paged_decode_example_runs(fs):
    """docs/SDPA.md "A decode step with a paged KV cache (Python)": its code block runs as written (it asserts its
    result against PyTorch SDPA on the dense K/V gathered from the pages)."""
    text = DOCS.read_text()
    section = text.split("## A decode step with a paged KV cache (Python)", 1)[1]
    block = re.search(r"```python\n(.*?)```", section, re.S)
    assert block is not None, "the section's python block"
    torch.manual_seed(0)
    exec(compile(block.group(1), str(DOCS), "exec"), {})


def test_alignment_names_at_the_top_level(fs):
    """docs/SDPA.md names TOP_LEFT / BOTTOM_RIGHT at the top level; flashspan.BOTTOM_RIGHT raised AttributeError."""
    assert fs.TOP_LEFT is fs.diagonal_alignment.TOP_LEFT
    assert fs.BOTTOM_RIGHT is fs.diagonal_alignment.BOTTOM_RIGHT
    assert {"TOP_LEFT", "BOTTOM_RIGHT"} <= set(fs.__all__)


@pytest.mark.parametrize("name, value", [
    ("sink_token", [0.0] * 8),
    ("gate", [1.0]),
    ("seq_len_kv", [6]),
    ("paged_attention_k_table", [[0]]),
    ("bias", 0.5),
])
def test_non_tensor_keyword_is_a_type_error_naming_it(fs, name, value):
    """A list (or a number) where a tensor is expected raised AttributeError ('list' object has no attribute ...)
    from inside the binding, naming nothing."""
    q = torch.randn(1, 8, 1, 64)
    k = torch.randn(1, 2, 16, 64)
    v = torch.randn_like(k)
    with pytest.raises(TypeError, match=rf"^{name}: must be a torch.Tensor or None, got "):
        fs.sdpa(q, k, v, **{name: value})


def test_non_tensor_keyword_in_the_backward(fs):
    q = torch.randn(1, 2, 4, 16)
    k, v = torch.randn_like(q), torch.randn_like(q)
    o, stats = fs.sdpa(q, k, v, attn_scale=0.25, generate_stats=True)
    with pytest.raises(TypeError, match=r"^dBias: must be a torch.Tensor or None, got list"):
        fs.sdpa_backward(q, k, v, o, torch.randn_like(o), stats, attn_scale=0.25, dBias=[0.0])


def test_alibi_message_points_decode_at_bottom_right(fs):
    q = torch.randn(1, 2, 1, 16)
    k = torch.randn(1, 2, 8, 16)
    with pytest.raises(ValueError, match=r"^use_alibi_mask: ALiBi requires causal masking .*S_q < S_kv, decode or a "
                                         r"KV cache, the bottom-right alignment"):
        fs.sdpa(q, k, k, use_alibi_mask=True)
