"""Tests of the benchmark CLI (flashspan.bench): the CPU run end to end, its reference and its peers' masks."""

import csv
import json
import math
import os

import pytest
import torch

from flashspan import masks as fm
from flashspan.bench import __main__ as bench
from flashspan.bench import reference as ref_mod
from flashspan.bench.runners import FlashspanRunner, endpoint_mask_mod


def _library_or_skip():
    try:
        import flashspan._lib as lib

        lib.lib()
    except ImportError as e:
        pytest.skip(f"libflashspan not built/loadable: {e}")


def _run(tmp_path, *extra):
    out = tmp_path / "out"
    argv = ["--mask", "causal,tree_bfs", "--seqlen", "64", "--heads", "2", "--reps", "1", "--warmup", "0",
            "--device", "cpu", "--no-progress", "--output-dir", str(out), *extra]
    return bench.main(argv), out


def test_cpu_run_writes_sane_results(tmp_path, capsys):
    _library_or_skip()
    rc, out = _run(tmp_path)
    assert rc == 0
    printed = capsys.readouterr().out
    assert "NO GPU RUN" in printed and "CPU reference backend" in printed
    for ext in ("json", "csv", "md"):
        assert (out / f"results.{ext}").stat().st_size > 0
    doc = json.loads((out / "results.json").read_text())
    assert doc["complete"] is True
    assert doc["config"]["mode"] == "cpu-reference" and doc["config"]["seqlen"] == 64
    assert doc["failed_checks"] == []
    env = doc["environment"]
    for key in ("torch", "flashspan", "git_revision", "flashspan_library", "date_utc"):
        assert key in env
    rows = doc["results"]
    for mask in ("causal", "tree_bfs"):
        fs = {r["phase"]: r for r in rows if r["workload"] == mask and r["backend"] == "flashspan"}
        assert set(fs) == {"plan_fwd", "plan_fwd_bwd", "forward", "backward", "combined"}
        for phase in ("forward", "backward", "combined"):
            r = fs[phase]
            assert r["status"] == "ok" and r["check"] == "pass"
            assert r["median_ms"] > 0 and r["tflops"] > 0
            assert r["visible_pairs"] == fm.visible_pairs(fm.benchmark_mask(mask, 64)) * 2
        # TFLOP/s follows from the visible pairs: 2*(Dqk+Dv) per pair, x2.5 backward.
        flops = 2 * 256 * fs["forward"]["visible_pairs"] * 2.5
        assert fs["backward"]["tflops"] == pytest.approx(flops / (fs["backward"]["median_ms"] * 1e-3) / 1e12)
    checks = [c for c in doc["checks"] if c["backend"] == "flashspan"]
    assert len(checks) == 2 and all(c["passed"] for c in checks)
    assert all(c["errors"]["out"] < 2e-2 and c["errors"]["dk"] < 5e-2 for c in checks)
    # SDPA math times causal (expressible) and is recorded unavailable for the tree.
    sdpa = [r for r in rows if r["backend"] == "sdpa_math"]
    assert any(r["workload"] == "causal" and r["phase"] == "forward" and r["status"] == "ok" for r in sdpa)
    assert any(r["workload"] == "tree_bfs" and r["status"] == "unavailable" and "not expressible" in r["reason"]
               for r in sdpa)
    causal_fwd = next(r for r in rows if r["workload"] == "causal" and r["backend"] == "flashspan"
                      and r["phase"] == "forward")
    assert causal_fwd["speedup_vs_sdpa_math"] > 0
    with open(out / "results.csv") as f:
        csv_rows = list(csv.DictReader(f))
    assert len(csv_rows) == len(rows)
    assert {"workload", "backend", "phase", "median_ms", "tflops", "status"} <= set(csv_rows[0])
    md = (out / "results.md").read_text()
    assert "CPU run" in md and "## causal" in md and "## tree_bfs" in md and "| flashspan | pass |" in md
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        assert "matplotlib" in doc["chart"]
    else:
        png = out / "results.png"
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_failed_check_is_loud_and_marked(tmp_path, capsys, monkeypatch):
    """A wrong flashspan output must fail the check, mark the timings and exit 1."""
    _library_or_skip()
    real = FlashspanRunner.outputs

    def corrupted(self):
        res = dict(real(self))
        res["out"] = res["out"] * 1.5
        return res

    monkeypatch.setattr(FlashspanRunner, "outputs", corrupted)
    rc, out = _run(tmp_path, "--peers", "none", "--phase", "forward")
    assert rc == 1
    err = capsys.readouterr()
    assert "CORRECTNESS CHECK FAILED" in err.out + err.err
    doc = json.loads((out / "results.json").read_text())
    assert doc["failed_checks"] == ["causal", "tree_bfs"]
    fwd = [r for r in doc["results"] if r["phase"] == "forward"]
    assert fwd and all(r["status"] == "check_failed" and r["check"].startswith("FAILED") for r in fwd)
    assert "CORRECTNESS CHECK FAILED" in (out / "results.md").read_text()


def test_bad_arguments():
    with pytest.raises(SystemExit):
        bench.parse_args(["--mask", "nope"])
    with pytest.raises(SystemExit):
        bench.parse_args(["--phase", "sideways"])
    with pytest.raises(SystemExit):
        bench.parse_args(["--no-masks"])
    args = bench.parse_args(["--mask", "causal", "--mask", "local,hstu", "--head-dim", "all", "--phase", "forward"])
    assert args.masks == ["causal", "local", "hstu"]
    assert args.head_dims == [128, 192, 256] and args.phases == ["forward"]


@pytest.mark.parametrize("name", fm.BENCHMARK_MASKS)
def test_endpoint_mask_mod_is_the_mask(name):
    """The FlexAttention peer's endpoint-reading mask_mod sees exactly the endpoint mask."""
    s = 256
    mf = fm.benchmark_mask(name, s, batch=2)
    mod = endpoint_mask_mod(mf, s)
    for b in range(2):
        got = mod(torch.tensor(b), torch.tensor(0), torch.arange(s).view(-1, 1), torch.arange(s).view(1, -1))
        assert torch.equal(got, fm.to_dense(mf, s, s)[0, b])


def _dense_reference(q, k, v, do, mask_func, scale):
    """Plain autograd float64 attention, the reference of the reference."""
    b, s, hq, _ = q.shape
    hkv = k.shape[2]
    dense = fm.to_dense(mask_func, s, s)  # [Hm, B, S, S]
    qd, kd, vd = (t.double().requires_grad_(True) for t in (q, k, v))
    kk = kd.repeat_interleave(hq // hkv, dim=2)
    vv = vd.repeat_interleave(hq // hkv, dim=2)
    sc = torch.einsum("bqhd,bkhd->bhqk", qd, kk) * scale
    m = dense.permute(1, 0, 2, 3).expand(b, hq, s, s) if dense.shape[0] > 1 else dense[0].unsqueeze(1)
    sc = sc.masked_fill(~m, float("-inf"))
    lse = torch.logsumexp(sc, dim=-1)
    p = torch.where(torch.isfinite(lse).unsqueeze(-1), torch.exp(sc - lse.unsqueeze(-1)), torch.zeros_like(sc))
    out = torch.einsum("bhqk,bkhd->bqhd", p, vv)
    out.backward(do.double())
    return out.detach(), lse.detach(), qd.grad, kd.grad, vd.grad


@pytest.mark.parametrize("hq,hkv,hmask", [(2, 2, 1), (4, 2, 4), (3, 1, 1)])
def test_reference_matches_dense_autograd(hq, hkv, hmask):
    torch.manual_seed(0)
    b, s, dqk, dv = 2, 40, 16, 8
    q = torch.randn(b, s, hq, dqk)
    k = torch.randn(b, s, hkv, dqk)
    v = torch.randn(b, s, hkv, dv)
    do = torch.randn(b, s, hq, dv)
    dense = torch.rand(hmask, b * s, s) < 0.4
    dense[:, 5] = False  # an empty row: out 0, lse -inf
    mf = fm.from_dense(dense)
    scale = 1 / math.sqrt(dqk)
    out, lse, dq, dk, dvv = _dense_reference(q, k, v, do, mf, scale)
    sample = ref_mod.Sample(torch.tensor([0, 5, 7, 39]), torch.tensor([0, 3, 20, 39]))
    r = ref_mod.reference(q, k, v, do, mf, sample, scale, chunk_elements=7 * s)  # several row chunks
    rows, cols = sample.rows, sample.cols
    torch.testing.assert_close(r["out"].double(), out[:, rows], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(r["lse"].double(), lse[:, :, rows], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(r["dq"].double(), dq[:, rows], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(r["dk"].double(), dk[:, cols], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(r["dv"].double(), dvv[:, cols], atol=1e-5, rtol=1e-5)
    assert bool(torch.isinf(r["lse"][0, :, 1]).all())  # row 5 of sample 0 sees nothing
    assert bool((r["out"][0, 1] == 0).all())


def test_error_metrics():
    a = torch.ones(4)
    assert ref_mod.rel_error(a, a) == 0
    assert ref_mod.rel_error(a * float("nan"), a) == math.inf
    lse = torch.tensor([1.0, float("-inf")])
    assert ref_mod.lse_error(lse, lse) == 0
    assert ref_mod.lse_error(torch.tensor([1.0, 0.0]), lse) == math.inf


def test_speedups_and_derived_backward():
    base = {"workload": "w"}
    from flashspan.bench.timing import Timing

    wl = type("W", (), {"flops": lambda self, phase: 1e9})()
    rows = [
        dict(base, backend="flashspan", phase="forward", status="ok", median_ms=2.0),
        dict(base, backend="peer", phase="forward", status="ok", median_ms=3.0),
        dict(base, backend="peer", phase="backward", status="error", reason="boom"),
        dict(base, backend="other", phase="forward", status="error"),
    ]
    timed = {"forward": Timing(3.0, 3.0, 3.0, 1), "combined": Timing(10.0, 9.0, 11.0, 1)}
    bench.derive_backward(rows, base, "peer", timed, wl, ["forward", "backward", "combined"], None)
    derived = [r for r in rows if r["backend"] == "peer" and r["phase"] == "backward"]
    assert len(derived) == 1 and derived[0]["status"] == "derived" and derived[0]["median_ms"] == 7.0
    bench.add_speedups(rows)
    assert rows[0]["speedup_vs_peer"] == 1.5
    assert "speedup_vs_other" not in rows[0]


def test_timer_cpu_median():
    from flashspan.bench.timing import Timer

    calls = []
    t = Timer(torch.device("cpu"), warmup=2, reps=5)
    res = t.measure(lambda: calls.append(1))
    assert len(calls) == 7 and res.reps == 5 and res.min_ms <= res.median_ms <= res.max_ms


@pytest.mark.gpu
def test_gpu_smoke(tmp_path):
    """On a GPU: two masks at S=4096 against the PyTorch peers; flashspan must pass its checks.
    Peers may be unavailable on a given install (recorded with a reason), never a crash."""
    from conftest import cuda_ready

    if not cuda_ready():
        pytest.skip("needs a CUDA device and a libflashspan built with CUDA kernels")
    out = tmp_path / "gpu"
    rc = bench.main(["--mask", "causal,sink_local", "--seqlen", "4096", "--reps", "2", "--warmup", "1",
                     "--device", "cuda", "--no-progress", "--output-dir", str(out),
                     "--peers", "flex_endpoints,sdpa_cudnn,sdpa_flash"])
    doc = json.loads((out / "results.json").read_text())
    assert rc == 0, doc["failed_checks"]
    assert doc["config"]["mode"] == "gpu" and doc["environment"]["gpu"]
    fs = [r for r in doc["results"] if r["backend"] == "flashspan" and r["phase"] in ("forward", "backward")]
    assert len(fs) == 4 and all(r["status"] == "ok" and r["tflops"] > 0 for r in fs)
    for r in doc["results"]:
        assert r["status"] in ("ok", "unavailable", "derived", "check_mismatch", "error"), r


def test_merge_runs(tmp_path):
    """Runs split to fit a time limit merge into one report."""
    _library_or_skip()
    dirs = []
    for mask in ("causal", "local"):
        d = tmp_path / mask
        rc = bench.main(["--mask", mask, "--seqlen", "48", "--heads", "1", "--reps", "1", "--warmup", "0",
                         "--device", "cpu", "--no-progress", "--peers", "none", "--phase", "forward",
                         "--output-dir", str(d)])
        assert rc == 0
        dirs.append(str(d))
    merged = tmp_path / "merged"
    assert bench.main(["--merge", *dirs, "--output-dir", str(merged)]) == 0
    doc = json.loads((merged / "results.json").read_text())
    assert {r["workload"] for r in doc["results"]} == {"causal", "local"}
    assert len(doc["checks"]) == 2 and doc["complete"]
    md = (merged / "results.md").read_text()
    assert "## causal" in md and "## local" in md
