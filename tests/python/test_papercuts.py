"""Issue 11's papercuts found by a new user: each fixed one has a test here (the others live next to
the code they concern: test_seed_conformance.py for empty geometries and flag types). Issue 25's are in
test_papercuts_api.py, test_scripts.py and test_bench.py."""

import os
import subprocess

import pytest
import torch

_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_benchmark_workloads_are_in_the_repository():
    path = os.path.join(_REPO, "docs", "BENCHMARK.md")
    text = open(path).read()
    for mask in ("causal", "document_causal", "local", "sink_local", "tree_dfs", "tree_bfs", "longformer", "hstu"):
        assert f"`{mask}`" in text, mask


def test_git_revision_of_an_installed_package_never_asks_the_folders_around_it(tmp_path, monkeypatch):
    """An installed flashspan three folders below some other repository (a pyenv checkout) recorded
    that repository's HEAD; now only a flashspan source checkout is asked."""
    from flashspan.bench import report

    other = tmp_path / "pyenv"
    pkg = other / "versions" / "site-packages" / "flashspan"
    pkg.mkdir(parents=True)
    subprocess.run(["git", "init", "-q", str(other)], check=True)
    assert report.source_checkout(str(pkg)) is None
    monkeypatch.delenv("FLASHSPAN_GIT_REVISION", raising=False)
    rev = report.git_revision(None)
    assert rev == "unknown" or rev.endswith("(recorded at build time)")
    monkeypatch.setenv("FLASHSPAN_GIT_REVISION", "abc123")
    if rev == "unknown":
        assert report.git_revision(None) == "abc123 (from $FLASHSPAN_GIT_REVISION)"
    # This checkout's own package is recognised as a source checkout.
    assert report.source_checkout(os.path.join(_REPO, "python", "flashspan")) == _REPO


@pytest.mark.parametrize("values, unit, labels", [
    ((0.0123, 0.0045), "GFLOP/s", ("12.3", "4.5")),  # a CPU run (issue 25: TFLOP/s bars read 0.000)
    ((351.0, 66.2), "TFLOP/s", ("351", "66.2")),     # a GPU run
])
def test_chart_unit_follows_the_magnitude_with_values_and_a_legend_on_every_panel(tmp_path, values, unit, labels):
    pytest.importorskip("matplotlib")
    from flashspan.bench import report
    import matplotlib.pyplot as plt

    rows = [dict(workload=w, backend=b, phase=ph, tflops=t, status="ok")
            for ph in ("forward", "backward") for w, t in zip(("causal", "local"), values)
            for b in ("flashspan", "flex")]
    captured = {}
    real_savefig = plt.Figure.savefig

    def spy(fig, *a, **kw):
        captured["fig"] = fig
        return real_savefig(fig, *a, **kw)

    plt.Figure.savefig = spy
    try:
        assert report.write_chart(str(tmp_path / "c.png"), rows, "t") is None
    finally:
        plt.Figure.savefig = real_savefig
    axes = captured["fig"].axes
    assert len(axes) == 2
    for ax in axes:
        assert ax.get_ylabel().startswith(unit)
        assert ax.get_legend() is not None
        texts = [t.get_text() for t in ax.texts]
        assert all(label in texts for label in labels), texts
    assert os.path.getsize(tmp_path / "c.png") > 0


def test_readme_quick_start_gives_every_input_a_gradient():
    text = open(os.path.join(_REPO, "README.md")).read()
    start = text.index("## Python quick start")
    code = text[text.index("```python", start) + len("```python"):text.index("```", text.index("```python", start) + 9)]
    code = code.replace('device="cuda"', 'device="cpu"').replace("4096", "64").replace("128", "16")
    code = code.replace("torch.bfloat16", "torch.float32")
    scope = {}
    exec(compile(code, "README quick start", "exec"), scope)
    for name in ("q", "k", "v"):
        assert scope[name].grad is not None, f"{name}.grad is None after the quick start's backward()"


def test_sdpa_md_first_example_runs_as_written():
    """docs/SDPA.md's first example (the one README's "New here?" points to) runs on its own, on the CPU here, and
    its output is PyTorch SDPA's causal attention."""
    text = open(os.path.join(_REPO, "docs", "SDPA.md")).read()
    start = text.index("```python") + len("```python")
    code = text[start:text.index("```", start)]
    scope = {}
    exec(compile(code, "docs/SDPA.md first example", "exec"), scope)
    q, k, v, o, D = (scope[n] for n in ("q", "k", "v", "o", "D"))
    ref = torch.nn.functional.scaled_dot_product_attention(
        *(t.transpose(1, 2).float() for t in (q, k, v)), is_causal=True, scale=D ** -0.5).transpose(1, 2)
    assert o.shape == q.shape
    assert (o.float() - ref).abs().max().item() < 3e-2
