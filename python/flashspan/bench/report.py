"""Environment capture and the result files: results.json, results.csv, results.md, results.png."""

from __future__ import annotations

import csv
import datetime
import json
import os
import platform
import socket
import subprocess
import sys
from typing import Optional

import torch

CSV_FIELDS = [
    "workload", "kind", "mask", "B", "Hq", "Hkv", "S", "Dqk", "Dv", "nfunc", "density", "visible_pairs",
    "backend", "phase", "status", "median_ms", "min_ms", "max_ms", "reps", "first_call_ms", "tflops",
    "speedup_vs_flex_endpoints", "speedup_vs_flex_natural", "speedup_vs_sdpa_cudnn", "speedup_vs_sdpa_flash",
    "speedup_vs_sdpa_math", "speedup_vs_sdpa_math_mask", "check", "reason",
]


def _run(cmd: list[str], cwd: Optional[str] = None) -> Optional[str]:
    try:
        r = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=10)
        return r.stdout.strip() if r.returncode == 0 else None
    except (OSError, subprocess.SubprocessError):
        return None


def git_revision(repo: Optional[str]) -> str:
    """Revision of the flashspan that runs: HEAD of its source checkout (with -dirty when tracked
    files changed) when imported from one (``repo``), else the revision recorded when the
    installed package was built (flashspan/_build_info.py), else $FLASHSPAN_GIT_REVISION, else
    "unknown". An installed package never asks git about the folders around it (a pyenv or
    home-directory repository there is not flashspan's)."""
    if repo is not None:
        rev = _run(["git", "rev-parse", "HEAD"], cwd=repo)
        if rev:
            dirty = _run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=repo)
            return rev + ("-dirty" if dirty else "")
    try:
        from flashspan import _build_info

        if _build_info.GIT_REVISION and _build_info.GIT_REVISION != "unknown":
            return f"{_build_info.GIT_REVISION} (recorded at build time)"
    except ImportError:
        pass
    env = os.environ.get("FLASHSPAN_GIT_REVISION")
    return f"{env} (from $FLASHSPAN_GIT_REVISION)" if env else "unknown"


def source_checkout(package_dir: str) -> Optional[str]:
    """The flashspan source checkout ``package_dir`` (the imported flashspan/) lives in, or None for an
    installed package: a checkout has it at <repo>/python/flashspan next to <repo>/CMakeLists.txt."""
    python_dir = os.path.dirname(os.path.abspath(package_dir))
    repo = os.path.dirname(python_dir)
    if os.path.basename(python_dir) != "python" or not os.path.isfile(os.path.join(repo, "CMakeLists.txt")):
        return None
    try:
        with open(os.path.join(repo, "CMakeLists.txt")) as f:
            return repo if "project(flashspan" in f.read(4096) else None
    except OSError:
        return None


def environment(device: torch.device, argv: Optional[list] = None) -> dict:
    """GPU, driver, CUDA, cuDNN, PyTorch, flashspan version, library path and git revision."""
    import flashspan

    env = {
        "date_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "host": socket.gethostname(),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "flashspan": getattr(flashspan, "__version__", None),
        "command": " ".join(["python -m flashspan.bench"] + list(sys.argv[1:] if argv is None else argv)),
    }
    try:
        import triton

        env["triton"] = triton.__version__
    except Exception:
        env["triton"] = None
    try:
        from flashspan import _lib

        env["flashspan_library"] = _lib.library_path()
        env["flashspan_library_version"] = _lib.version()
        env["flashspan_cuda_archs"] = ";".join(_lib.built_cuda_archs())
        env["flashspan_cuda_available"] = bool(_lib.cuda_available())
    except Exception as e:  # recorded, never fatal
        env["flashspan_library"] = f"unavailable: {e}"
    env["git_revision"] = git_revision(source_checkout(os.path.dirname(flashspan.__file__)))
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        env["gpu"] = props.name
        env["gpu_memory_gib"] = round(props.total_memory / 2**30, 1)
        env["gpu_sm_count"] = props.multi_processor_count
        env["gpu_capability"] = f"{props.major}.{props.minor}"
        smi = _run(["nvidia-smi", "--query-gpu=driver_version,clocks.max.sm,power.limit",
                    "--format=csv,noheader", "-i", str(device.index or 0)])
        if smi:
            parts = [p.strip() for p in smi.split(",")]
            env["driver"] = parts[0]
            env["gpu_max_sm_clock"] = parts[1] if len(parts) > 1 else None
            env["gpu_power_limit"] = parts[2] if len(parts) > 2 else None
        else:
            env["driver"] = None
    else:
        env["gpu"] = None
        env["cpu"] = platform.processor() or platform.machine()
        env["cpu_threads"] = torch.get_num_threads()
    return env


def _fmt(x, digits=3):
    if x is None or x == "":
        return "—"
    if isinstance(x, float):
        if x != x:  # NaN
            return "nan"
        if abs(x) >= 100:
            return f"{x:.0f}"
        return f"{x:.{digits}g}"
    return str(x)


def write_json(path: str, doc: dict) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(doc, f, indent=1, default=str)
    os.replace(tmp, path)


def write_csv(path: str, rows: list[dict]) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=CSV_FIELDS, extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow({k: ("" if r.get(k) is None else r.get(k)) for k in CSV_FIELDS})
    os.replace(tmp, path)


def throughput_unit(rows: list[dict]) -> tuple[str, float]:
    """(unit, factor from TFLOP/s) for the throughputs of a report: GFLOP/s when every one is below 1 TFLOP/s
    (CPU runs, where TFLOP/s would read 0.000), else TFLOP/s. One unit for the chart and every table."""
    values = [r["tflops"] for r in rows if r.get("tflops") is not None]
    if values and max(values) < 1.0:
        return "GFLOP/s", 1e3
    return "TFLOP/s", 1.0


def _spread(r: dict) -> str:
    """min–max of a timing row (the spread next to its median)."""
    if r.get("min_ms") is None or r.get("max_ms") is None:
        return "—"
    return f"{_fmt(r['min_ms'])}–{_fmt(r['max_ms'])}"


def summary_table(rows: list[dict], workloads: list[str]) -> list[str]:
    """One line per (workload, phase): throughput of flashspan and of every peer that ran (unit: throughput_unit)."""
    phases = [p for p in ("forward", "backward", "combined") if any(r["phase"] == p for r in rows)]
    backends = []
    for r in rows:
        if r["phase"] in phases and r.get("tflops") is not None and r["backend"] not in backends:
            backends.append(r["backend"])
    if "flashspan" in backends:
        backends.remove("flashspan")
        backends.insert(0, "flashspan")
    if not backends:
        return []
    unit, factor = throughput_unit(rows)
    out = [f"## Summary ({unit} over visible pairs; flashspan speedup in parentheses)", "",
           "| workload | phase | " + " | ".join(backends) + " |",
           "|---|---|" + "---|" * len(backends)]
    for wl in workloads:
        for phase in phases:
            cells = []
            fs = next((r for r in rows if r["workload"] == wl and r["phase"] == phase
                       and r["backend"] == "flashspan"), None)
            for be in backends:
                r = next((r for r in rows if r["workload"] == wl and r["phase"] == phase and r["backend"] == be), None)
                if r is None or r.get("tflops") is None:
                    cells.append("—")
                    continue
                cell = _fmt(r["tflops"] * factor)
                if be != "flashspan" and fs is not None and fs.get(f"speedup_vs_{be}") is not None:
                    cell += f" ({fs[f'speedup_vs_{be}']:.2f}×)"
                if r["status"] not in ("ok",):
                    cell += f" **{r['status']}**"
                cells.append(cell)
            if any(c != "—" for c in cells):
                out.append(f"| {wl} | {phase} | " + " | ".join(cells) + " |")
    return out + [""]


def write_markdown(path: str, doc: dict) -> None:
    env, cfg, rows, checks = doc["environment"], doc["config"], doc["results"], doc["checks"]
    lines = ["# flashspan benchmark", ""]
    if cfg.get("mode") == "cpu-reference":
        lines += ["> **CPU run.** No usable CUDA device: flashspan ran its CPU reference backend at "
                  f"S={cfg['seqlen']} and was checked against a PyTorch float32 math reference. "
                  "These timings say nothing about GPU performance.", ""]
    if doc.get("failed_checks"):
        lines += [f"> **CORRECTNESS CHECK FAILED** for: {', '.join(doc['failed_checks'])}. "
                  "Their timings are marked `CHECK FAILED` and must not be quoted.", ""]
    keys = ["gpu", "driver", "torch", "torch_cuda", "cudnn", "triton", "flashspan", "git_revision",
            "flashspan_library", "date_utc", "host", "command"]
    lines += ["| | |", "|---|---|"] + [f"| {k} | `{env.get(k)}` |" for k in keys if k in env] + [""]
    how = ("CUDA events, L2 flushed with a 256 MB write before every rep" if cfg.get("mode") == "gpu"
           else "wall clock")
    unit, factor = throughput_unit(rows)
    lines += [f"Config: dtype {cfg['dtype']}, phases {', '.join(cfg['phases'])}, warmup {cfg['warmup']}, "
              f"reps {cfg['reps']} (median and min–max of the reps, plan builds included; {how}; the first call "
              f"of each phase timed apart). {unit} count visible pairs "
              "only: 2·(Dqk+Dv) FLOP per pair forward, 2.5× that backward, 3.5× for forward+backward "
              "(`combined`). Speedup of flashspan over X = X time / flashspan time (> 1: flashspan faster).", ""]
    workloads = []
    for r in rows:
        if r["workload"] not in workloads:
            workloads.append(r["workload"])
    lines += summary_table(rows, workloads)
    for wl in workloads:
        wrows = [r for r in rows if r["workload"] == wl]
        d = wrows[0]
        lines += [f"## {wl}", "",
                  f"B={d['B']} Hq={d['Hq']} Hkv={d['Hkv']} S={d['S']} D=({d['Dqk']},{d['Dv']}) "
                  f"nfunc={d['nfunc']} density={_fmt(d['density'])} visible pairs={d['visible_pairs']}", ""]
        plan = next((c.get("plan") for c in checks if c["workload"] == wl and c.get("plan")), None)
        if plan:
            lines += [f"flashspan plan: forward tiles {plan['fwd_block_q']}x{plan['fwd_block_k']}, "
                      f"{plan['fwd_partial_blocks']} partial / {plan['fwd_full_blocks']} full blocks forward, "
                      f"{plan['bwd_partial_blocks']} / {plan['bwd_full_blocks']} backward, {plan['num_tasks']} tasks, "
                      f"{plan['bytes']} bytes, consumer sm{plan['arch']}", ""]
        prep = [r for r in wrows if r["phase"] in ("plan_fwd", "plan_fwd_bwd", "block_mask", "dense_mask")]
        if prep:
            lines += ["| preparation | backend | median ms | min–max ms | first call ms | status |",
                      "|---|---|---|---|---|---|"]
            for r in prep:
                lines.append(f"| {r['phase']} | {r['backend']} | {_fmt(r.get('median_ms'))} | {_spread(r)} | "
                             f"{_fmt(r.get('first_call_ms'))} | {r['status']} |")
            lines.append("")
        timed = [r for r in wrows if r["phase"] in ("forward", "backward", "combined")]
        if timed:
            lines += [f"| phase | backend | median ms | min–max ms | {unit} | first call ms | speedup of flashspan "
                      "| status |", "|---|---|---|---|---|---|---|---|"]
            for r in timed:
                sp = ", ".join(f"{k[len('speedup_vs_'):]} {r[k]:.2f}×" for k in CSV_FIELDS
                               if k.startswith("speedup_vs_") and r.get(k) is not None)
                status = r["status"] if r["status"] == "ok" else f"**{r['status']}** {r.get('reason') or ''}"
                thr = None if r.get("tflops") is None else r["tflops"] * factor
                lines.append(f"| {r['phase']} | {r['backend']} | {_fmt(r.get('median_ms'))} | {_spread(r)} | "
                             f"{_fmt(thr)} | {_fmt(r.get('first_call_ms'))} | {sp or '—'} | {status} |")
            lines.append("")
        unavailable = [r for r in wrows if r["phase"] == "-"]
        for r in unavailable:
            status = r["status"] if r["status"] == "unavailable" else f"**{r['status']}**"
            lines.append(f"- {r['backend']}: {status} — {r.get('reason')}")
        wchecks = [c for c in checks if c["workload"] == wl]
        if wchecks:
            lines += ["" if unavailable else "", "| spot-check vs fp32 reference | verdict | errors |",
                      "|---|---|---|"]
            for c in wchecks:
                errs = ", ".join(f"{k} {_fmt(v, 2)}" for k, v in c.get("errors", {}).items())
                verdict = "pass" if c["passed"] else ("info" if c.get("informational") else "**FAILED**")
                lines.append(f"| {c['backend']} | {verdict} | {errs or c.get('reason', '')} |")
            lines.append("")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


def write_chart(path: str, rows: list[dict], title: str) -> Optional[str]:
    """Grouped bars of throughput (throughput_unit) per workload, one panel per phase. Returns None on success,
    else why no chart was written (matplotlib missing, nothing timed)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        return f"matplotlib not available ({e})"
    phases = [p for p in ("forward", "backward", "combined") if any(r["phase"] == p for r in rows)]
    ok = [r for r in rows if r["phase"] in phases and r.get("tflops") is not None]
    if not ok:
        return "no timed results"
    workloads = []
    for r in ok:
        if r["workload"] not in workloads:
            workloads.append(r["workload"])
    backends = []
    for r in ok:
        if r["backend"] not in backends:
            backends.append(r["backend"])
    fig_width = max(8.0, 0.65 * len(workloads) * max(1, len(backends)))
    fig, axes = plt.subplots(len(phases), 1, figsize=(fig_width, 3.6 * len(phases)), squeeze=False)
    width = 0.8 / max(1, len(backends))
    # The unit of the tables (GFLOP/s for a CPU run, whose TFLOP/s would read 0.000).
    unit, scale = throughput_unit(ok)
    for ax, phase in zip(axes[:, 0], phases):
        for j, be in enumerate(backends):
            xs, ys, bad = [], [], []
            for i, wl in enumerate(workloads):
                r = next((r for r in ok if r["workload"] == wl and r["backend"] == be and r["phase"] == phase), None)
                if r is not None:
                    xs.append(i + (j - (len(backends) - 1) / 2) * width)
                    ys.append(r["tflops"] * scale)
                    bad.append(r["status"] not in ("ok", "derived"))
            bars = ax.bar(xs, ys, width, label=be)
            for b, is_bad in zip(bars, bad):
                if is_bad:
                    b.set_hatch("xx")
                    b.set_edgecolor("red")
            # The value on every bar (the tables' numbers, readable without the axis).
            ax.bar_label(bars, labels=[_fmt(y) for y in ys], fontsize=6, rotation=90, padding=2)
        ax.set_xticks(range(len(workloads)))
        ax.set_xticklabels(workloads, rotation=30, ha="right", fontsize=8)
        ax.set_ylabel(f"{unit} (visible pairs)")
        ax.set_title(phase)
        ax.grid(axis="y", alpha=0.3)
        ax.margins(y=0.18)  # room for the bar labels
        # A legend on every panel: each one reads on its own.
        ax.legend(fontsize=7, ncol=min(len(backends), 5), loc="upper right")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path + ".tmp", dpi=110, format="png")
    plt.close(fig)
    os.replace(path + ".tmp", path)
    return None


def finish_checks(script: str, failures: list[str], checked: str = "every output") -> None:
    """The end of a benchmark script that checks its outputs (tests/python/criteria.py): with failures, prints
    "<script>: CORRECTNESS CHECK FAILED" and each failure to stderr and exits with status 1; else prints that
    ``checked`` matches the fp32 reference."""
    if failures:
        print(f"\n{script}: CORRECTNESS CHECK FAILED", file=sys.stderr)
        for f in failures:
            print("  " + f, file=sys.stderr)
        sys.exit(1)
    print(f"\ncorrectness: {checked} matches the fp32 reference (tests/python/criteria.py)")
