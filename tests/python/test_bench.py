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
    # The CPU default peer: SDPA math with a dense bool mask from the endpoints, on EVERY mask
    # (the tree too, which is_causal cannot express), timed and checked against the reference.
    assert doc["config"]["peers"] == ["sdpa_math_mask"]
    for mask in ("causal", "tree_bfs"):
        sdpa = {r["phase"]: r for r in rows if r["workload"] == mask and r["backend"] == "sdpa_math_mask"}
        assert set(sdpa) == {"dense_mask", "forward", "backward", "combined"}, sdpa
        assert all(r["status"] == "ok" and r["median_ms"] > 0 for r in sdpa.values())
        assert all(sdpa[p]["check"] == "pass" and sdpa[p]["tflops"] > 0 for p in ("forward", "backward", "combined"))
        (c,) = [c for c in doc["checks"] if c["backend"] == "sdpa_math_mask" and c["workload"] == mask]
        assert c["passed"] and c["errors"]["out"] < 2e-2 and c["errors"]["dq"] < 5e-2, c
        for phase in ("forward", "backward", "combined"):
            fs_row = next(r for r in rows if r["workload"] == mask and r["backend"] == "flashspan"
                          and r["phase"] == phase)
            assert fs_row["speedup_vs_sdpa_math_mask"] == pytest.approx(
                sdpa[phase]["median_ms"] / fs_row["median_ms"])
    assert "unavailable" not in printed
    with open(out / "results.csv") as f:
        csv_rows = list(csv.DictReader(f))
    assert len(csv_rows) == len(rows)
    assert {"workload", "backend", "phase", "median_ms", "tflops", "status"} <= set(csv_rows[0])
    md = (out / "results.md").read_text()
    assert "CPU run" in md and "## causal" in md and "## tree_bfs" in md and "| flashspan | pass |" in md
    assert "| sdpa_math_mask | pass |" in md and "| dense_mask | sdpa_math_mask |" in md
    assert all(r["speedup_vs_sdpa_math_mask"] for r in csv_rows
               if r["backend"] == "flashspan" and r["phase"] in ("forward", "backward", "combined"))
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        assert "matplotlib" in doc["chart"]
    else:
        png = out / "results.png"
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_unavailable_peer_reason_is_printed(tmp_path, capsys):
    """is_causal SDPA cannot express the tree: recorded unavailable with the reason, and the reason
    is printed on the console too (not only in results.md)."""
    _library_or_skip()
    rc, out = _run(tmp_path, "--peers", "sdpa_math,sdpa_cudnn", "--phase", "forward")
    assert rc == 0
    printed = capsys.readouterr().out
    doc = json.loads((out / "results.json").read_text())
    for r in doc["results"]:
        if r["status"] == "unavailable":
            assert f"{r['backend']} unavailable on {r['workload']}: {r['reason']}" in printed
    reasons = {(r["workload"], r["backend"]): r["reason"] for r in doc["results"] if r["status"] == "unavailable"}
    assert "not expressible" in reasons[("tree_bfs", "sdpa_math")]
    assert "needs CUDA" in reasons[("causal", "sdpa_cudnn")]
    assert ("causal", "sdpa_math") not in reasons


def test_default_peers_and_dense_mask_limit():
    from flashspan.bench.runners import DENSE_MASK_MAX_SEQLEN, SdpaRunner, Unavailable
    from flashspan.bench.timing import Timer
    from flashspan.bench.workloads import Workload, dense_workloads

    assert bench.default_peers(True, 512, False) == ["sdpa_math_mask"]
    assert bench.default_peers(True, 512, True) == ["sdpa_math_mask", "sdpa_math"]
    gpu_small = bench.default_peers(False, DENSE_MASK_MAX_SEQLEN, False)
    assert gpu_small == ["flex_endpoints", "flex_natural", "sdpa_cudnn", "sdpa_flash", "sdpa_math_mask"]
    assert "sdpa_math_mask" not in bench.default_peers(False, DENSE_MASK_MAX_SEQLEN + 1, False)
    assert "sdpa_math_mask" not in bench.default_peers(False, 131072, True)
    # Dense shapes use is_causal; a dense attn_mask is not run there.
    dense = dense_workloads(True, 64, torch.device("cpu"))[0]
    assert bench.peers_for(dense, ["sdpa_math", "sdpa_math_mask", "flex_natural"]) == ["sdpa_math"]
    # Past the limit the peer refuses before allocating anything (the mask would be S^2).
    s = DENSE_MASK_MAX_SEQLEN * 2
    wl = Workload(name="causal", kind="flex", batch=1, heads_q=1, heads_kv=1, seqlen=s, head_dim_qk=128,
                  head_dim_v=128, mask_func=fm.causal(s), mask_name="causal")
    runner = SdpaRunner(wl, None, Timer(torch.device("cpu"), 0, 1), "sdpa_math_mask")
    with pytest.raises(Unavailable, match=rf"S <= {DENSE_MASK_MAX_SEQLEN} \(S={s}: the mask alone is 0.25 GiB"):
        runner.prepare(["forward"])


@pytest.mark.parametrize("name", fm.BENCHMARK_MASKS)
def test_dense_mask_peer_mask_is_the_mask(name):
    """The sdpa_math_mask peer's [B, Hmask, S, S] attn_mask is exactly the endpoint mask."""
    from flashspan.bench.runners import SdpaRunner
    from flashspan.bench.workloads import flex_workloads

    (wl,) = flex_workloads([name], 128, [128], 2, 2, 0, torch.device("cpu"))
    runner = SdpaRunner(wl, None, None, "sdpa_math_mask")
    m = runner._build_dense_mask()
    assert m.dtype == torch.bool and m.shape == (2, 1, 128, 128)
    mod = wl.natural_mask_mod
    q, kv = torch.arange(128).view(-1, 1), torch.arange(128).view(1, -1)
    for b in range(2):
        assert torch.equal(m[b, 0], torch.broadcast_to(mod(torch.tensor(b), torch.tensor(0), q, kv), (128, 128)))


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
    assert bench.parse_args(["--head-dim", "64,128"]).head_dims == [64, 128]  # (64, 64) only when asked for
    with pytest.raises(SystemExit):
        bench.parse_args(["--head-dim", "96"])
    assert bench.parse_args(["--switch", "FLASHSPAN_SM90_BWD_ORDER=0, 4"]).switch == ("FLASHSPAN_SM90_BWD_ORDER",
                                                                                     ["0", "4"])
    for bad in (["--switch", "FLASHSPAN_X"], ["--switch", "FLASHSPAN_X="], ["--switch", "flashspan_x=1"],
                ["--switch", "FLASHSPAN_X=1,,2"], ["--switch", "FLASHSPAN_X=1,1"], ["--switch", "A-B=1"],
                ["--switch", "FLASHSPAN_X=1", "--switch-rounds", "0"]):
        with pytest.raises(SystemExit):
            bench.parse_args(bad)


def test_switch_values_are_set_checked_and_timed(tmp_path, monkeypatch):
    """--switch: each value is set around its own spot check and timed calls (and unset afterwards), the values
    alternate over the rounds, each gets one row per phase with the rounds' medians; a value whose outputs are
    wrong fails loudly (its rows marked, exit status 1) while the others pass."""
    _library_or_skip()
    name = "FLASHSPAN_SM90_BWD_ORDER"
    monkeypatch.delenv(name, raising=False)
    seen = []
    backward, rerun = FlashspanRunner.backward, FlashspanRunner.rerun

    def spy_backward(self):
        seen.append(os.environ.get(name))
        return backward(self)

    def corrupt_rerun(self):
        rerun(self)
        if os.environ.get(name) == "4":
            self.dq.add_(1.0)

    monkeypatch.setattr(FlashspanRunner, "backward", spy_backward)
    monkeypatch.setattr(FlashspanRunner, "rerun", corrupt_rerun)
    rc, out = _run(tmp_path, "--phase", "backward", "--peers", "none", "--switch", f"{name}=0,4",
                   "--switch-rounds", "2")
    assert rc == 1
    assert os.environ.get(name) is None
    doc = json.loads((out / "results.json").read_text())
    assert doc["config"]["switch"] == {"name": name, "values": ["0", "4"], "rounds": 2}
    for mask in ("causal", "tree_bfs"):
        rows = {r["backend"]: r for r in doc["results"] if r["workload"] == mask and r["phase"] == "backward"}
        assert set(rows) == {"flashspan", "flashspan[SM90_BWD_ORDER=0]", "flashspan[SM90_BWD_ORDER=4]"}
        good, bad = rows["flashspan[SM90_BWD_ORDER=0]"], rows["flashspan[SM90_BWD_ORDER=4]"]
        assert good["status"] == "ok" and good["check"] == "pass"
        assert bad["status"] == "check_failed" and bad["check"].startswith("FAILED") and "dq" in bad["check"]
        assert rows["flashspan"]["check"] == "pass" and "speedup_vs_flashspan[SM90_BWD_ORDER=0]" not in rows["flashspan"]
        for r in (good, bad):
            assert len(r["round_medians_ms"]) == 2 and r["reps"] == 2 and r["tflops"] > 0
            assert r["median_ms"] == pytest.approx(sum(r["round_medians_ms"]) / 2)
        checks = [c for c in doc["checks"] if c["workload"] == mask and c.get("switch")]
        assert [(c["switch"], c["passed"]) for c in checks] == [(f"{name}=0", True), (f"{name}=4", False)]
    assert set(doc["failed_checks"]) == {"causal", "tree_bfs"}
    # Per workload: the plain rows' calls (environment as given), then each value's check, then the rounds
    # alternating 0, 4, 0, 4 (the first-call and timed calls of a phase under one value in between).
    per_wl = len(seen) // 2
    variant = [v for v in seen[:per_wl] if v is not None]
    assert variant[0] == "0" and variant[1] == "4"
    runs = [v for i, v in enumerate(variant) if i == 0 or variant[i - 1] != v]
    assert runs == ["0", "4", "0", "4", "0", "4"]


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


def test_dense_only_filters_dense_shapes(tmp_path):
    """--dense-only keeps the dense shapes whose label contains the text (and fails on none)."""
    _library_or_skip()
    out = tmp_path / "dense"
    rc = bench.main(["--dense", "--no-masks", "--dense-only", "D64", "--seqlen", "48", "--reps", "1",
                     "--warmup", "0", "--device", "cpu", "--no-progress", "--peers", "none", "--phase",
                     "forward", "--output-dir", str(out)])
    assert rc == 0
    names = {r["workload"] for r in json.loads((out / "results.json").read_text())["results"]}
    assert names and all("D64" in n for n in names), names
    assert any(n.endswith("causal") for n in names) and any(not n.endswith("causal") for n in names), names
    with pytest.raises(SystemExit):
        bench.main(["--dense", "--no-masks", "--dense-only", "no such shape", "--device", "cpu",
                    "--output-dir", str(tmp_path / "none")])


# -- issue 25: what the report says -----------------------------------------------------------------------


def _timed_rows(values, phases=("forward", "backward")):
    """Report rows of two workloads and two backends with the given TFLOP/s (cycled)."""
    base = dict(B=1, Hq=2, Hkv=2, S=64, Dqk=16, Dv=16, nfunc=1, density=0.5, visible_pairs=4096, status="ok",
                median_ms=1.5, min_ms=1.25, max_ms=2.5, reps=3, first_call_ms=9.0)
    rows, i = [], 0
    for wl in ("causal", "local"):
        for phase in phases:
            for be in ("flashspan", "sdpa_math_mask"):
                rows.append(dict(base, workload=wl, phase=phase, backend=be, tflops=values[i % len(values)]))
                i += 1
    return rows


def test_throughput_unit_follows_the_magnitude():
    """A CPU run's chart was in TFLOP/s with bars reading 0.000: below 1 TFLOP/s the chart and every table
    use GFLOP/s; GPU runs keep TFLOP/s."""
    from flashspan.bench import report

    cpu = _timed_rows([0.0123, 0.0004, 0.0031])
    gpu = _timed_rows([351.0, 0.5])
    assert report.throughput_unit(cpu) == ("GFLOP/s", 1e3)
    assert report.throughput_unit(gpu) == ("TFLOP/s", 1.0)
    table = "\n".join(report.summary_table(cpu, ["causal", "local"]))
    assert "GFLOP/s" in table and "TFLOP/s" not in table
    assert "| 12.3 |" in table and "| 0.4 |" in table, table
    gpu_table = "\n".join(report.summary_table(gpu, ["causal", "local"]))
    assert "TFLOP/s" in gpu_table and "| 351 |" in gpu_table and "| 0.5 |" in gpu_table


def _markdown(tmp_path, rows, reps=3):
    from flashspan.bench import report

    doc = {"environment": {"torch": torch.__version__}, "checks": [], "results": rows,
           "config": {"mode": "cpu-reference", "seqlen": 64, "dtype": "bfloat16", "phases": ["forward", "backward"],
                      "warmup": 1, "reps": reps}}
    path = tmp_path / "r.md"
    report.write_markdown(str(path), doc)
    return path.read_text()


def test_markdown_gives_the_spread_and_the_unit(tmp_path):
    """The markdown gave the median without its spread, and TFLOP/s columns of a CPU run."""
    rows = _timed_rows([0.0123, 0.0004])
    rows.append(dict(rows[0], phase="plan_fwd", tflops=None, median_ms=0.75, min_ms=0.5, max_ms=1.0))
    md = _markdown(tmp_path, rows)
    assert "| phase | backend | median ms | min–max ms | GFLOP/s |" in md, md
    assert "| preparation | backend | median ms | min–max ms |" in md, md
    assert "| forward | flashspan | 1.5 | 1.25–2.5 | 12.3 |" in md, md
    assert "| plan_fwd | flashspan | 0.75 | 0.5–1 |" in md, md
    assert "TFLOP/s" not in md.replace("GFLOP/s", ""), md


def test_every_phase_reports_its_own_first_call(monkeypatch):
    """sdpa_math_mask's (and FlexAttention's) `combined` first call repeated the backward's: each phase's first
    call is now timed on its own."""
    _library_or_skip()
    from flashspan.bench.runners import Inputs, SdpaRunner
    from flashspan.bench.timing import Timer
    from flashspan.bench.workloads import Workload

    wl = Workload(name="causal", kind="flex", batch=1, heads_q=2, heads_kv=2, seqlen=32, head_dim_qk=16,
                  head_dim_v=16, mask_func=fm.causal(32), mask_name="causal", sdpa_causal=True)
    timer = Timer(torch.device("cpu"), warmup=0, reps=1)
    ticks = iter(range(1, 100))
    monkeypatch.setattr(Timer, "first_call", lambda self, fn: (fn(), float(next(ticks)))[1])
    for runner in (SdpaRunner(wl, Inputs(wl, torch.float32, torch.device("cpu"), 0), timer, "sdpa_math_mask"),
                   FlashspanRunner(wl, Inputs(wl, torch.float32, torch.device("cpu"), 0), timer)):
        runner.prepare(("forward", "backward", "combined"))
        first = runner.first_call_ms
        assert set(first) == {"forward", "backward", "combined"}, (runner.name, first)
        assert len(set(first.values())) == 3, (runner.name, first)
        runner.close()


def test_preparation_timings_use_the_configured_reps(tmp_path):
    """Plan-build and dense-mask rows said "reps": 2 while the config said 3."""
    _library_or_skip()
    rc, out = _run(tmp_path, "--reps", "3", "--phase", "forward")
    assert rc == 0
    doc = json.loads((out / "results.json").read_text())
    assert doc["config"]["reps"] == 3
    prep = [r for r in doc["results"] if r["phase"] in ("plan_fwd", "plan_fwd_bwd", "dense_mask")]
    assert {r["phase"] for r in prep} == {"plan_fwd", "plan_fwd_bwd", "dense_mask"}
    assert all(r["reps"] == 3 for r in prep), [(r["phase"], r["reps"]) for r in prep]
