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


# BSHD tensors [B, S, H, D] given where SDPA reads [B, H, S, D]: nothing tells them apart when S and H pass the BHSD
# rules (such a call runs on the wrong layout, and is not refused: it may be a valid BHSD call), but where a rule on
# H or S breaks and the BSHD reading would pass it, the message says so.
_BSHD_HINT = (r"\(q, k, v are read as \[B, H, S, D\]; read as \[B, S, H, D\] they would pass this rule, with "
              r"H_q = 4 and S_q = 16: if they are BSHD, pass q.transpose\(1, 2\), k.transpose\(1, 2\), "
              r"v.transpose\(1, 2\), views without a copy\)")


def _bshd(s=16, h=4):
    return torch.randn(2, s, h, 8)


@pytest.mark.parametrize("case", ["gqa", "k, v", "sink_token", "max_logit", "bias", "seq_len_q"])
def test_bshd_tensors_named_where_a_rule_on_heads_or_lengths_breaks(fs, case):
    q = _bshd()
    k = v = q
    kw = {}
    if case == "gqa":  # S_kv = 32, H_k = 2: read as BHSD, H_k = 32 does not divide H_q = 16
        k = v = _bshd(32, 2)
        pattern = r"^k, v: for MHA / GQA / MQA the K and V head counts must divide H_q = 16, got H_k = 32"
    elif case == "k, v":  # H_k != H_v (valid): read as BHSD, two S_kv
        k, v = _bshd(16, 2), _bshd(16, 4)
        pattern = r"^k, v: sequence lengths differ \(S_kv 2 vs 4\)"
    elif case in ("sink_token", "max_logit"):
        kw[case] = torch.zeros(4)
        pattern = rf"^{case}: must have 16 element\(s\)"
    elif case == "bias":
        kw["bias"] = torch.zeros(1, 4, 16, 16)
        pattern = r"^bias: is not broadcastable to \[2, 16, 4, 4\]: dimension 1 \(H_q\) is 4"
    else:
        kw.update(use_padding_mask=True, seq_len_q=torch.tensor([16, 9]), seq_len_kv=torch.tensor([16, 9]))
        pattern = r"^seq_len_q: sample 0 has length 16, outside \[0, S_q = 4\]"
    with pytest.raises(ValueError, match=pattern + r".* " + _BSHD_HINT + "$"):
        fs.sdpa(q, k, v, **kw)
    # The same call on the BHSD views runs.
    fs.sdpa(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), **kw)


def test_bhsd_errors_carry_no_bshd_hint(fs):
    """The hint is given only where the BSHD reading would pass the broken rule."""
    q = torch.randn(2, 4, 16, 8)
    with pytest.raises(ValueError, match=r"^sink_token: must have 4 element\(s\) .*got shape \[3\]$"):
        fs.sdpa(q, q, q, sink_token=torch.zeros(3))
    with pytest.raises(ValueError, match=r"^k, v: for MHA / GQA / MQA the K and V head counts must divide H_q = 4, "
                                         r"got H_k = 3, H_v = 3$"):
        fs.sdpa(q, torch.randn(2, 3, 24, 8), torch.randn(2, 3, 24, 8))


def test_docs_state_the_dimension_order_up_front(fs):
    """docs/SDPA.md says early (before any section) that q, k, v are (B, H, S, D) and how to pass BSHD tensors."""
    intro = DOCS.read_text().split("\n## ", 1)[0]
    assert "(B, H, S, D)" in intro and "q.transpose(1, 2)" in intro


@pytest.mark.parametrize("fn", ["sdpa_fp8", "sdpa_fp8_backward"])
def test_documented_fp8_signatures_are_the_code(fs, fn):
    """docs/SDPA.md "FP8 SDPA" / "API": each signature, its keyword-only marker and its defaults are the function's
    (the block showed generate_stats=True where the code's default is None: True unless is_inference is given)."""
    import ast
    import inspect

    section = DOCS.read_text().split("## FP8 SDPA", 1)[1].split("### API", 1)[1]
    block = re.search(r"```\n(.*?)```", section, re.S).group(1)
    m = re.search(rf"flashspan\.{fn}\((.*?)\)\s*\n\s*->", block, re.S)
    assert m is not None, f"the documented {fn} signature"
    documented = [p.strip() for p in m.group(1).replace("\n", " ").split(",")]
    actual = []
    for p in inspect.signature(getattr(fs, fn)).parameters.values():
        if p.kind is p.KEYWORD_ONLY and "*" not in actual:
            actual.append("*")
        actual.append(p.name if p.default is p.empty else f"{p.name}={p.default!r}")
    assert [d.split("=")[0] for d in documented] == [a.split("=")[0] for a in actual]
    for d, a in zip(documented, actual):
        if "=" in d or "=" in a:
            assert ast.literal_eval(d.split("=", 1)[1]) == ast.literal_eval(a.split("=", 1)[1]), (d, a)
