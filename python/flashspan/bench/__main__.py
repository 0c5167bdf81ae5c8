"""flashspan-bench: the docs/BENCHMARK.md workloads, flashspan side by side with PyTorch FlexAttention and SDPA.

Run ``python -m flashspan.bench --help``. Examples::

    python -m flashspan.bench                       # 8 masks, S=131072, D=128, all phases (GPU)
    python -m flashspan.bench --quick               # S=32768, fewer reps
    python -m flashspan.bench --mask causal,local --head-dim 128 --head-dim 256 --phase forward
    python -m flashspan.bench --dense --no-masks    # the dense SDPA shapes only
    python -m flashspan.bench --seqlen 512          # without a GPU: the CPU reference backend
    python -m flashspan.bench --quick --mask causal --phase backward --switch FLASHSPAN_SM90_BWD_ORDER=0,4
                                                    # an A/B of a per-call switch in one process

Every flashspan result is spot-checked against a float32 PyTorch math reference (sampled
rows and key columns, outputs poisoned with NaN first) before it is timed; a failed check
is printed loudly, marked in every result file, and makes the exit status 1.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import traceback
from typing import Optional

import torch

from . import report
from .reference import lse_error, make_sample, reference, rel_error, tolerances
from .runners import DENSE_MASK_MAX_SEQLEN, PEERS, FlashspanRunner, Inputs, Unavailable, make_peer, time_phase
from .switches import scoped_env
from .timing import Timer, Timing, tflops
from .workloads import BENCHMARK_HEAD_DIMS, HEAD_DIMS, PHASES, Workload, dense_workloads, flex_workloads

_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def _csv_list(values, allowed, what, all_items=None):
    """The comma-separated items of repeated options, each in `allowed`; "all" adds `all_items` (default: `allowed`)."""
    out = []
    for v in values or []:
        for item in str(v).split(","):
            item = item.strip()
            if not item:
                continue
            if item == "all":
                out.extend(a for a in (allowed if all_items is None else all_items) if a not in out)
                continue
            if item not in allowed:
                choices = ", ".join(map(str, allowed))
                raise SystemExit(f"flashspan-bench: unknown {what} {item!r}; choose from {choices}")
            if item not in out:
                out.append(item)
    return out


def _switch_arg(text: Optional[str]) -> Optional[tuple[str, list[str]]]:
    """--switch's NAME=V1[,V2...] as (NAME, [V1, V2, ...]), or None when not given."""
    if text is None:
        return None
    name, eq, values = text.partition("=")
    name = name.strip()
    vals = [v.strip() for v in values.split(",")]
    if not eq or not name.replace("_", "").isalnum() or not name.isupper() or not all(vals):
        raise SystemExit(f"flashspan-bench: --switch must be NAME=V1[,V2...] with an upper-case variable name and "
                         f"non-empty values (e.g. FLASHSPAN_SM90_BWD_ORDER=0,4), got {text!r}")
    if len(set(vals)) != len(vals):
        raise SystemExit(f"flashspan-bench: --switch {name}: a value is given twice in {values!r}")
    return name, vals


def switch_label(name: str, value: str) -> str:
    """The backend name of flashspan's rows with the switch NAME set to value (--switch)."""
    short = name[len("FLASHSPAN_"):] if name.startswith("FLASHSPAN_") else name
    return f"flashspan[{short}={value}]"


def parse_args(argv=None) -> argparse.Namespace:
    from ..masks import BENCHMARK_MASKS

    p = argparse.ArgumentParser(
        prog="flashspan-bench",
        description="Benchmark flashspan flex attention against PyTorch FlexAttention and SDPA "
                    "(docs/BENCHMARK.md workloads). Without a CUDA device it runs the CPU reference backend at S=512.")
    p.add_argument("--mask", action="append", metavar="NAME[,NAME]",
                   help=f"benchmark mask(s), repeatable or comma-separated (default all: {', '.join(BENCHMARK_MASKS)})")
    p.add_argument("--no-masks", action="store_true", help="skip the flex-mask workloads (with --dense)")
    p.add_argument("--dense", action="store_true", help="also run the dense SDPA shapes of docs/BENCHMARK.md")
    p.add_argument("--dense-only", action="append", metavar="TEXT",
                   help="with --dense: keep only the dense shapes whose label contains TEXT (repeatable; "
                        "e.g. 'H16 S32768' for B1 H16 S32768 D128, causal and not)")
    p.add_argument("--seqlen", type=int, help="S (default 131072 on a GPU, 32768 with --quick, 512 on CPU)")
    p.add_argument("--phase", action="append", metavar="PHASE[,PHASE]",
                   help="forward, backward, combined (default all three)")
    p.add_argument("--head-dim", action="append", metavar="D",
                   help="128 -> (128,128), 192 -> (192,128), 256 -> (256,256), 64 -> (64,64); repeatable, 'all' "
                        "(BENCHMARK.md's: 128, 192, 256; default 128)")
    p.add_argument("--heads", type=int, default=4, help="Hq = Hkv for the mask workloads (default 4)")
    p.add_argument("--batch", type=int, default=1, help="B for the mask workloads (default 1)")
    p.add_argument("--dtype", choices=sorted(_DTYPES), default="bf16")
    p.add_argument("--peers", default=None,
                   help=f"comma list of peers to time, or 'none' ({', '.join(PEERS)}); default: on GPU "
                        "flex_endpoints,flex_natural,sdpa_cudnn,sdpa_flash, plus sdpa_math_mask when "
                        f"S <= {DENSE_MASK_MAX_SEQLEN}; on CPU sdpa_math_mask (SDPA math with a dense bool "
                        "attn_mask from the endpoints: every mask), plus sdpa_math (is_causal) with --dense")
    p.add_argument("--quick", action="store_true", help="S=32768 (GPU), fewer repetitions, fewer dense shapes")
    p.add_argument("--warmup", type=int, help="untimed calls before timing (default 3; quick 1; CPU 1)")
    p.add_argument("--reps", type=int, help="timed repetitions of every phase and preparation (plan build, block "
                   "mask), median and min-max reported (default 10; quick 5; CPU 3)")
    p.add_argument("--device", choices=["auto", "cuda", "cpu"], default="auto")
    p.add_argument("--seed", type=int, default=0, help="seed of inputs, document lengths and tree jitter")
    p.add_argument("--check-rows", type=int, default=128, help="rows (and half as many key columns) spot-checked")
    p.add_argument("--no-check", action="store_true", help="skip the correctness spot-check (not recommended)")
    p.add_argument("--output-dir", default="bench_out", help="where results.{json,csv,md,png} go (default bench_out/)")
    p.add_argument("--no-progress", action="store_true",
                   help="plain prints instead of a tqdm bar (automatic when stderr is not a terminal)")
    p.add_argument("--merge", nargs="+", metavar="DIR",
                   help="instead of running: merge the results.json of earlier runs (e.g. split to fit a time "
                        "limit) into one set of result files in --output-dir")
    p.add_argument("--time-limit", type=float, default=None, metavar="SECONDS",
                   help="start no new workload after this many seconds (results so far are written)")
    p.add_argument("--switch", metavar="NAME=V1[,V2...]",
                   help="A/B of a switch flashspan reads per call (e.g. FLASHSPAN_SM90_BWD_ORDER=0,4): after the "
                        "usual flashspan rows, each value is spot-checked and its phases timed again with NAME set "
                        "to it, the values alternated over --switch-rounds rounds in this one process; rows "
                        "'flashspan[NAME=V]' (NAME without 'FLASHSPAN_'), median of the rounds' medians")
    p.add_argument("--switch-rounds", type=int, default=2, metavar="R",
                   help="rounds of --switch's values (default 2: V1 V2 .. V1 V2 ..)")
    args = p.parse_args(argv)
    if args.merge:
        return args
    args.switch = _switch_arg(args.switch)
    if args.switch_rounds < 1:
        raise SystemExit("flashspan-bench: --switch-rounds must be >= 1")
    args.masks = [] if args.no_masks else (_csv_list(args.mask, BENCHMARK_MASKS, "mask") or list(BENCHMARK_MASKS))
    args.phases = _csv_list(args.phase, PHASES, "phase") or list(PHASES)
    hd = _csv_list(args.head_dim, [str(d) for d in HEAD_DIMS], "head dim",
                   [str(d) for d in BENCHMARK_HEAD_DIMS]) or ["128"]
    args.head_dims = [int(d) for d in hd]
    if not args.masks and not args.dense:
        raise SystemExit("flashspan-bench: nothing to run (--no-masks without --dense)")
    for name in ("heads", "batch", "check_rows"):
        if getattr(args, name) < 1:
            raise SystemExit(f"flashspan-bench: --{name.replace('_', '-')} must be >= 1")
    if args.seqlen is not None and args.seqlen < 16:
        raise SystemExit("flashspan-bench: --seqlen must be >= 16")
    return args


class Progress:
    """tqdm when installed and wanted, else plain prints (always to stderr for the bar)."""

    def __init__(self, total: int, enabled: bool):
        self.bar = None
        if enabled:
            try:
                from tqdm import tqdm

                self.bar = tqdm(total=total, unit="step", dynamic_ncols=True)
            except ImportError:
                self.bar = None
        self.total, self.done = total, 0

    def step(self, label: str) -> None:
        self.done += 1
        if self.bar is not None:
            self.bar.set_description_str(label[:60])
            self.bar.update(1)
        else:
            print(f"[{self.done}/{self.total}] {label}", flush=True)

    def write(self, msg: str) -> None:
        if self.bar is not None:
            self.bar.write(msg)
        else:
            print(msg, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def loud(progress: Progress, msg: str) -> None:
    bar = "!" * 78
    progress.write(f"\n{bar}\n!! {msg}\n{bar}\n")


def pick_device(args) -> tuple[torch.device, Optional[str]]:
    """(device, why CPU) — CUDA only when torch sees a GPU and the library has CUDA kernels."""
    from .. import _lib

    lib_cuda = False
    why = None
    try:
        lib_cuda = bool(_lib.cuda_available())
    except Exception as e:
        why = f"libflashspan not loadable ({e})"
    if args.device == "cpu":
        return torch.device("cpu"), "--device cpu"
    if torch.cuda.is_available() and lib_cuda:
        return torch.device("cuda", torch.cuda.current_device()), None
    if why is None:
        why = "torch sees no CUDA device" if not torch.cuda.is_available() else \
            "libflashspan was built without CUDA kernels (fs_cuda_available() == 0)"
    if args.device == "cuda":
        raise SystemExit(f"flashspan-bench: --device cuda, but {why}")
    return torch.device("cpu"), why


def _sampled(outs: dict, sample) -> dict:
    rows, cols = sample.rows.to(next(iter(outs.values())).device), sample.cols
    res = {}
    for key, t in outs.items():
        if key == "lse":
            res[key] = t[:, :, rows]
        elif key in ("out", "dq"):
            res[key] = t[:, rows]
        else:
            res[key] = t[:, cols.to(t.device)]
    return res


def spot_check(backend: str, outs: dict, ref: dict, sample, tol: dict) -> dict:
    """Errors of the sampled outputs against the reference, and the verdict."""
    got = _sampled(outs, sample)
    errors, failed = {}, []
    for key in ("out", "lse", "dq", "dk", "dv"):
        if key not in got or key not in ref:
            continue
        r = ref[key]
        g = got[key].to(r.device)
        err = lse_error(g, r) if key == "lse" else rel_error(g.float(), r)
        errors[key] = err
        if not err <= tol[key]:
            failed.append(f"{key} error {err:.3g} > {tol[key]:.3g}")
    return {"backend": backend, "passed": not failed, "errors": errors, "tolerance": tol,
            "reason": "; ".join(failed)}


def api_agreement(explicit: dict, api: dict, tol: dict) -> list[str]:
    """flex_attn_func (allocating autograd API) must agree with the timed explicit objects."""
    problems = []
    for key, a in api.items():
        if key not in explicit:
            continue
        e = explicit[key]
        err = lse_error(a, e) if key == "lse" else rel_error(a.float(), e.float())
        if not err <= tol[key]:
            op = "FlexAttentionFwd" if key in ("out", "lse") else "FlexAttentionBwd"
            problems.append(f"flex_attn_func {key} differs from {op} by {err:.3g}")
    return problems


def _row(base: dict, backend: str, phase: str, status: str, timing=None, flops=None, reason=None, check=None):
    r = dict(base)
    r.update(backend=backend, phase=phase, status=status, reason=reason, check=check)
    if timing is not None:
        r.update(median_ms=timing.median_ms, min_ms=timing.min_ms, max_ms=timing.max_ms, reps=timing.reps,
                 first_call_ms=timing.first_call_ms)
        if flops is not None:
            r["tflops"] = tflops(flops, timing.median_ms)
    return r


def run_workload(wl: Workload, args, timer: Timer, device, dtype, peers, progress: Progress,
                 failed: list) -> tuple[list, list]:
    base = wl.describe()
    rows, checks = [], []
    inputs = Inputs(wl, dtype, device, args.seed)
    need_grad = any(p in args.phases for p in ("backward", "combined"))
    ref = sample = None
    tol = tolerances(dtype)
    if not args.no_check:
        n_rows = wl.seqlen if wl.seqlen <= 1024 else args.check_rows
        n_cols = wl.seqlen if wl.seqlen <= 1024 else max(1, args.check_rows // 2)
        sample = make_sample(wl.seqlen, n_rows, n_cols, args.seed, device, wl.mask_func)
        t0 = time.perf_counter()
        try:
            ref = reference(inputs.q, inputs.k, inputs.v, inputs.do if need_grad else None, wl.mask_func, sample,
                            inputs.scale)
            progress.write(f"  reference for {wl.name}: {time.perf_counter() - t0:.1f}s")
        except Exception as e:  # e.g. out of memory: time anyway, but say loudly that nothing was checked
            ref = None
            loud(progress, f"reference FAILED on {wl.name} ({type(e).__name__}: {str(e)[:300]}); "
                           "its results are NOT checked")
            if device.type == "cuda":
                torch.cuda.empty_cache()

    # flashspan ----------------------------------------------------------------------------
    runner = FlashspanRunner(wl, inputs, timer)
    fs_check = "not checked" if ref is None else None
    try:
        runner.prepare(args.phases)
        for key, t in runner.prep_timings.items():
            rows.append(_row(base, "flashspan", key, "ok", t))
        if ref is not None:
            c = spot_check("flashspan", runner.outputs(), ref, sample, tol)
            problems = api_agreement(runner.outputs(), runner.api_outputs(), tol)
            if problems:
                c["passed"] = False
                c["reason"] = "; ".join(filter(None, [c["reason"]] + problems))
            c.update(workload=wl.name, plan=runner.plan_info)
            checks.append(c)
            fs_check = "pass" if c["passed"] else f"FAILED: {c['reason']}"
            if not c["passed"]:
                failed.append(wl.name)
                loud(progress, f"CORRECTNESS CHECK FAILED: flashspan on {wl.name}: {c['reason']} "
                               "(timings below are marked CHECK FAILED)")
        for phase in args.phases:
            t = time_phase(runner, phase, timer)
            status = "ok" if fs_check in ("pass", "not checked") else "check_failed"
            rows.append(_row(base, "flashspan", phase, status, t, wl.flops(phase), check=fs_check))
        if args.switch:
            rows += time_switch(runner, wl, args, timer, base, ref, sample, tol, checks, failed, progress)
    except Exception as e:  # flashspan itself failed: loud, recorded, the run goes on
        failed.append(wl.name)
        msg = f"{type(e).__name__}: {e}"
        loud(progress, f"flashspan FAILED on {wl.name}: {msg}")
        progress.write(traceback.format_exc(limit=4))
        rows.append(_row(base, "flashspan", "-", "error", reason=msg[:500]))
    finally:
        runner.close()
        del runner
    progress.step(f"{wl.name}: flashspan")

    # peers -------------------------------------------------------------------------------
    for name in peers_for(wl, peers):
        peer = make_peer(name, wl, inputs, timer)
        try:
            try:
                peer.prepare(args.phases)
            except Exception as e:
                reason = str(e) if isinstance(e, Unavailable) else f"{type(e).__name__}: {str(e)[:400]}"
                rows.append(_row(base, name, "-", "unavailable", reason=reason))
                progress.write(f"  {name} unavailable on {wl.name}: {reason}")
                if device.type == "cuda":
                    torch.cuda.empty_cache()
                continue
            for key, t in peer.prep_timings.items():
                rows.append(_row(base, name, key, "ok", t, reason=getattr(peer, "block_mask_note", None)))
            peer_check = None
            if ref is not None:
                c = spot_check(name, peer.outputs(), ref, sample, tol)
                c.update(workload=wl.name, informational=True)
                checks.append(c)
                peer_check = "pass" if c["passed"] else f"mismatch: {c['reason']}"
                if not c["passed"]:
                    progress.write(f"  warning: peer {name} disagrees with the reference on {wl.name}: {c['reason']}")
            status = "ok" if peer_check in (None, "pass") else "check_mismatch"
            timed = {}
            for phase in args.phases:
                why = peer.unsupported(phase)
                if why:
                    rows.append(_row(base, name, phase, "unavailable", reason=why))
                    progress.write(f"  {name} {phase} unavailable on {wl.name}: {why}")
                    continue
                try:
                    timed[phase] = t = time_phase(peer, phase, timer)
                    rows.append(_row(base, name, phase, status, t, wl.flops(phase), check=peer_check))
                except Exception as e:
                    reason = f"{type(e).__name__}: {str(e)[:300]}"
                    rows.append(_row(base, name, phase, "error", reason=reason))
                    progress.write(f"  {name} {phase} failed on {wl.name}: {reason}")
            derive_backward(rows, base, name, timed, wl, args.phases, peer_check)
        finally:
            peer.close()
            del peer
            progress.step(f"{wl.name}: {name}")
    add_speedups(rows)
    del inputs, ref
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return rows, checks


def time_switch(runner: FlashspanRunner, wl: Workload, args, timer: Timer, base: dict, ref, sample, tol: dict,
                checks: list, failed: list, progress: Progress) -> list:
    """--switch: flashspan's phases with the switch set to each value in turn (the prepared plan and objects; the
    switch is read per call), each value's outputs spot-checked first (poisoned, run once, compared), then the
    values timed alternately for --switch-rounds rounds. One row per value and phase: the median of the rounds'
    medians, min / max over all repetitions, the rounds' medians in ``round_medians_ms``."""
    name, values = args.switch
    verdict = {}
    for v in values:
        label = switch_label(name, v)
        verdict[v] = "not checked"
        if ref is None:
            continue
        with scoped_env(**{name: v}):
            runner.rerun()
            c = spot_check(label, runner.outputs(), ref, sample, tol)
        c.update(workload=wl.name, switch=f"{name}={v}")
        checks.append(c)
        verdict[v] = "pass" if c["passed"] else f"FAILED: {c['reason']}"
        if not c["passed"]:
            failed.append(wl.name)
            loud(progress, f"CORRECTNESS CHECK FAILED: {label} on {wl.name}: {c['reason']}")
    timed = {(v, phase): [] for v in values for phase in args.phases}
    for _ in range(args.switch_rounds):
        for v in values:
            with scoped_env(**{name: v}):
                for phase in args.phases:
                    timed[(v, phase)].append(time_phase(runner, phase, timer))
    rows = []
    for v in values:
        label = switch_label(name, v)
        parts, first = [], len(rows)
        for phase in args.phases:
            ts = timed[(v, phase)]
            t = Timing(statistics.median(x.median_ms for x in ts), min(x.min_ms for x in ts),
                       max(x.max_ms for x in ts), sum(x.reps for x in ts))
            status = "ok" if verdict[v] in ("pass", "not checked") else "check_failed"
            row = _row(base, label, phase, status, t, wl.flops(phase), check=verdict[v])
            row["round_medians_ms"] = [x.median_ms for x in ts]
            rows.append(row)
        unit, factor = report.throughput_unit(rows[first:])
        for row in rows[first:]:
            rounds = "/".join(f"{x:.4g}" for x in row["round_medians_ms"])
            parts.append(f"{_phase_text(row, unit, factor)} (rounds {rounds} ms)")
        progress.write(f"   {label}: " + "; ".join(parts))
    return rows


def peers_for(wl: Workload, peers: list) -> list:
    """The peers that run a workload: BENCHMARK.md compares dense shapes with SDPA only, and
    there with is_causal (a dense attn_mask, sdpa_math_mask, adds nothing but memory)."""
    if wl.kind == "dense":
        return [p for p in peers if p.startswith("sdpa_") and p != "sdpa_math_mask"]
    return list(peers)


def default_peers(cpu: bool, seqlen: int, dense: bool) -> list:
    """Peers timed when --peers is not given (see --help)."""
    if cpu:
        # On CPU only SDPA's math backend runs; with a dense bool mask it runs every mask
        # (S = 512 by default: the mask is 256 KiB).
        return ["sdpa_math_mask"] + (["sdpa_math"] if dense else [])
    peers = ["flex_endpoints", "flex_natural", "sdpa_cudnn", "sdpa_flash"]
    if seqlen <= DENSE_MASK_MAX_SEQLEN:  # the dense mask materialises S^2 per sample
        peers.append("sdpa_math_mask")
    return peers


def derive_backward(rows: list, base: dict, name: str, timed: dict, wl: Workload, phases, check) -> None:
    """When a peer's backward-only timing failed (e.g. a second backward through a compiled
    graph) but forward and forward+backward worked, record backward = combined - forward."""
    if "backward" not in phases or "backward" in timed or not {"forward", "combined"} <= set(timed):
        return
    failed = [r for r in rows if r["backend"] == name and r["phase"] == "backward" and r["status"] == "error"]
    if not failed:
        return
    fwd, comb = timed["forward"], timed["combined"]
    t = Timing(comb.median_ms - fwd.median_ms, comb.min_ms - fwd.min_ms, comb.max_ms - fwd.max_ms,
               min(comb.reps, fwd.reps), comb.first_call_ms)
    rows.remove(failed[0])
    rows.append(_row(base, name, "backward", "derived", t, wl.flops("backward"), check=check,
                     reason=f"combined minus forward; backward-only timing failed: {failed[0]['reason']}"))


def add_speedups(rows: list) -> None:
    """speedup_vs_<peer> = peer median / flashspan median, per phase (on flashspan's rows; --switch's
    flashspan[NAME=V] rows are flashspan's, not peers)."""
    for r in rows:
        if r["backend"] != "flashspan" or r.get("median_ms") is None or r["phase"] not in PHASES:
            continue
        for p in rows:
            if not p["backend"].startswith("flashspan") and p["phase"] == r["phase"] and p.get("median_ms") \
                    and p["status"] in ("ok", "derived", "check_mismatch"):
                r[f"speedup_vs_{p['backend']}"] = p["median_ms"] / r["median_ms"]


def _phase_text(row: dict, unit: str, factor: float) -> str:
    """One row's phase, median time and throughput, as the progress lines print them."""
    return f"{row['phase']} {row['median_ms']:.4g} ms {row['tflops'] * factor:.4g} {unit}"


def summary_line(rows: list) -> str:
    parts = []
    unit, factor = report.throughput_unit(rows)
    for r in rows:
        if r["phase"] in PHASES and r.get("tflops") is not None and r["backend"] == "flashspan":
            sp = " ".join(f"{k[len('speedup_vs_'):]}={r[k]:.2f}x" for k in sorted(r) if k.startswith("speedup_vs_"))
            parts.append(f"{_phase_text(r, unit, factor)} {sp}".strip())
    return "; ".join(parts)


def merge(dirs: list, output_dir: str) -> int:
    """Concatenates the results of several runs (same machine) into one report."""
    docs = []
    for d in dirs:
        path = os.path.join(d, "results.json") if os.path.isdir(d) else d
        with open(path) as f:
            docs.append(json.load(f))
    if not docs:
        raise SystemExit("flashspan-bench --merge: nothing to merge")
    gpus = {doc["environment"].get("gpu") for doc in docs}
    if len(gpus) > 1:
        print(f"flashspan-bench --merge: warning: results come from different devices: {gpus}", file=sys.stderr)
    first = docs[0]
    doc = {
        "environment": first["environment"],
        "config": dict(first["config"], merged_from=[os.path.abspath(d) for d in dirs]),
        "results": [r for d in docs for r in d["results"]],
        "checks": [c for d in docs for c in d["checks"]],
        "failed_checks": sorted({n for d in docs for n in d.get("failed_checks", [])}),
        "complete": all(d.get("complete") for d in docs),
        "merged_environments": [d["environment"] for d in docs],
    }
    os.makedirs(output_dir, exist_ok=True)
    chart = report.write_chart(os.path.join(output_dir, "results.png"), doc["results"],
                               f"flashspan vs peers — {first['environment'].get('gpu') or 'CPU'} (merged)")
    doc["chart"] = chart or "results.png"
    report.write_json(os.path.join(output_dir, "results.json"), doc)
    report.write_csv(os.path.join(output_dir, "results.csv"), doc["results"])
    report.write_markdown(os.path.join(output_dir, "results.md"), doc)
    print(f"merged {len(docs)} runs ({len(doc['results'])} results) into {os.path.abspath(output_dir)}")
    return 1 if doc["failed_checks"] else 0


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.merge:
        return merge(args.merge, args.output_dir)
    try:
        import flashspan  # noqa: F401
        from .. import _lib

        _lib.lib()  # fail early, with the loader's message (it names FLASHSPAN_LIBRARY)
    except Exception as e:
        print(f"flashspan-bench: cannot load flashspan: {e}", file=sys.stderr)
        return 2
    device, why_cpu = pick_device(args)
    cpu = device.type == "cpu"
    dtype = _DTYPES[args.dtype]
    if not cpu and dtype == torch.float32:
        raise SystemExit("flashspan-bench: fp32 runs only on the CPU backend (GPU kernels take fp16/bf16)")
    seqlen = args.seqlen or (512 if cpu else (32768 if args.quick else 131072))
    warmup = args.warmup if args.warmup is not None else (1 if (cpu or args.quick) else 3)
    reps = args.reps if args.reps is not None else (3 if cpu else (5 if args.quick else 10))
    if args.peers is None:
        peers = default_peers(cpu, seqlen, args.dense)
    elif args.peers.strip() == "none":
        peers = []
    else:
        peers = _csv_list([args.peers], PEERS, "peer")
    os.makedirs(args.output_dir, exist_ok=True)

    if cpu:
        print("=" * 78 + f"\nflashspan-bench: NO GPU RUN ({why_cpu}).\n"
              f"Running the {len(args.masks)} masks at S={seqlen} through flashspan's CPU reference backend, "
              "checked against a PyTorch float32 math reference.\nThese timings are NOT GPU performance numbers.\n"
              + "=" * 78, flush=True)
    torch.manual_seed(args.seed)
    workloads = []
    if args.masks:
        workloads += flex_workloads(args.masks, seqlen, args.head_dims, args.heads, args.batch, args.seed, device)
    if args.dense:
        dense = dense_workloads(args.quick, seqlen if cpu else None, device)
        if args.dense_only:
            dense = [w for w in dense if any(t in w.name for t in args.dense_only)]
            if not dense:
                raise SystemExit(f"flashspan-bench: --dense-only {args.dense_only} matches no dense shape")
        workloads += dense
    timer = Timer(device, warmup, reps)
    env = report.environment(device, argv)
    config = {
        "mode": "cpu-reference" if cpu else "gpu", "why_cpu": why_cpu, "seqlen": seqlen, "dtype": args.dtype,
        "phases": args.phases, "head_dims": [HEAD_DIMS[d] for d in args.head_dims], "heads": args.heads,
        "batch": args.batch, "masks": args.masks, "dense": args.dense, "peers": peers, "warmup": warmup,
        "reps": reps, "quick": args.quick, "seed": args.seed, "checked": not args.no_check,
        "l2_flush_bytes": 256 * 2**20 if not cpu else 0,
        "switch": None if args.switch is None else {"name": args.switch[0], "values": args.switch[1],
                                                    "rounds": args.switch_rounds},
    }
    print(f"flashspan-bench: {len(workloads)} workloads on {env.get('gpu') or 'CPU'}, peers: "
          f"{', '.join(peers) or 'none'}; results -> {os.path.abspath(args.output_dir)}", flush=True)
    n_steps = sum(1 + len(peers_for(wl, peers)) for wl in workloads)
    progress = Progress(n_steps, enabled=not args.no_progress and sys.stderr.isatty())
    rows, checks, failed = [], [], []
    paths = {ext: os.path.join(args.output_dir, f"results.{ext}") for ext in ("json", "csv", "md", "png")}

    def flush_files(final: bool) -> None:
        doc = {"environment": env, "config": config, "results": rows, "checks": checks,
               "failed_checks": sorted(set(failed)), "complete": final}
        try:
            chart_err = report.write_chart(
                paths["png"], rows,
                f"flashspan vs peers — {env.get('gpu') or 'CPU reference backend'}, S={seqlen}, {args.dtype}")
        except Exception as e:  # a chart problem must never lose the numbers
            chart_err = f"chart failed: {type(e).__name__}: {e}"
        doc["chart"] = chart_err or os.path.basename(paths["png"])
        report.write_json(paths["json"], doc)
        report.write_csv(paths["csv"], rows)
        report.write_markdown(paths["md"], doc)

    start = time.perf_counter()
    try:
        for wl in workloads:
            if args.time_limit and time.perf_counter() - start > args.time_limit:
                progress.write(f"-- time limit ({args.time_limit:.0f}s) reached: skipping {wl.name}")
                rows.append(_row(wl.describe(), "flashspan", "-", "skipped", reason="--time-limit reached"))
                continue
            progress.write(f"== {wl.name}: B={wl.batch} H={wl.heads_q}/{wl.heads_kv} S={wl.seqlen} "
                           f"D=({wl.head_dim_qk},{wl.head_dim_v}) density={wl.density:.4f}")
            try:
                wrows, wchecks = run_workload(wl, args, timer, device, dtype, peers, progress, failed)
            except Exception as e:  # inputs or reference could not even be set up: record, go on
                failed.append(wl.name)
                loud(progress, f"workload {wl.name} FAILED to run: {type(e).__name__}: {str(e)[:300]}")
                wrows, wchecks = [_row(wl.describe(), "flashspan", "-", "error",
                                       reason=f"{type(e).__name__}: {str(e)[:400]}")], []
                if device.type == "cuda":
                    torch.cuda.empty_cache()
            rows += wrows
            checks += wchecks
            line = summary_line(wrows)
            if line:
                progress.write(f"   flashspan: {line}")
            flush_files(final=False)  # partial results survive a timeout
    finally:
        progress.close()
        flush_files(final=True)
    for ext in ("json", "csv", "md", "png"):
        if os.path.exists(paths[ext]):
            print(f"wrote {paths[ext]}")
    if failed:
        names = ", ".join(sorted(set(failed)))
        print("\n" + "!" * 78 + f"\n!! CORRECTNESS CHECK FAILED or flashspan error for: {names}\n" + "!" * 78,
              file=sys.stderr)
        return 1
    if cpu:
        print(f"CPU reference run complete ({why_cpu}); all flashspan results matched the float32 reference.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
