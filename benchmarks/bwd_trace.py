"""Per-step trace of the sm90 flex backward's dQ writer chain (issue 22, PERF_LOG v2.32's next measurement).

Needs a library built with the CMake option ``FLASHSPAN_BWD_TRACE=ON`` (kernels/sm90/bwd_trace_sm90.cuh): its
flex backward kernels (launch_bwd_sm90.cu) then record, per step of every CTA's dQ writer, ``%globaltimer`` (ns,
one clock for every SM) and ``clock64`` (cycles of the SM) at

  ready     dq_full waited: the consumers' dQ tile is in shared memory
  poll      the tile's rank (its turn) is in from the dQ order warp: the counter poll starts (ordered only)
  turn      the tile's counter equals the rank (ordered only)
  read      the bulk reduce-add has read the shared tile (dq_empty arrives)
  written   the reduce-add is written to global memory (ordered only: bulk_wait_group<0>)
  released  the counter increment is issued (red.release.gpu; ordered only)

and, for thread 0 of consumer warpgroup 0, per step: start (before the Q / dO wait), qdo_full, dq_done (the dQ
GEMM done), dq_empty (the shared tile free: the writer has read the last one), dq_full (stored and handed over),
end (dK / dV of the step done). The buffer is device memory this script allocates (torch) and hands to the
library's debug hook ``flashspan_debug_bwd_trace_sm90(ptr, max_ctas, cap)`` through ctypes: the hook exists only in
trace builds and is not part of the C ABI of flashspan.h (it is looked up by name on the loaded library).

Runs, per mask (default document_causal and causal, B=1 H=4 S=32768 D=128 bf16, as PERF_LOG v2.32), the flex
backward (``torch.autograd.grad`` of ``flex_attn_func`` on a kept graph) deterministic and not: a few warm-up
calls, the median time of ``--reps`` calls with the trace off and with it on (the instrument's own cost), then one
traced call whose buffer is read. Set ``FLASHSPAN_SM90_BWD_DET_UNORDERED=1`` in the environment to trace the
deterministic schedule without the dQ order (its mode is then reported as det_unordered).

Writes ``OUT/<mask>_<mode>_writer.csv.gz`` (a row per writer step: CTA, SM, step, item, key block, tile, head, query
block, rank, the event times in ns from the kernel's first event (globaltimer) and the derived durations from
clock64 converted with the CTA's own measured clock rate), ``OUT/<mask>_<mode>_consumer.csv.gz`` (a row per consumer
step) and ``OUT/summary.txt`` / ``summary.json``: per mask and mode the writer's per-step phase times (mean,
median, p90; total share of the writer's span), the consumers' step time split (waiting on Q / dO, compute, stalled
on the writer's dq_empty, ...), the writer's idle gaps, and for the ordered runs the chain of turns of every dQ tile:
each turn wait split into the time the predecessor (rank - 1) was itself still before its turn ("upstream"), was
holding the turn (writing: turn -> released) and the hand-off (its release -> this turn: the counter's
release-to-acquire latency across SMs), plus per tile the span of its chain and the share of that span in holds and
hand-offs (the critical path of the order).

Usage (GPU machine, repository root; the build takes the whole library, 90a only)::

    cmake -S . -B build-trace -G Ninja -DFLASHSPAN_CUDA_ARCHS=90a -DFLASHSPAN_BWD_TRACE=ON -DFLASHSPAN_BUILD_TESTS=OFF
    cmake --build build-trace --target flashspan -j$(nproc)
    FLASHSPAN_LIBRARY=$PWD/build-trace/libflashspan.so PYTHONPATH=python python3 benchmarks/bwd_trace.py --out $OUT/trace

``--selftest`` (no GPU, no library) runs the decoder and the analysis on a synthetic buffer.
"""

from __future__ import annotations

import argparse
import ctypes
import csv
import gzip
import json
import os
import statistics
import sys
import time

import numpy as np

HEADER_WORDS = 8
REC_WORDS = 16
LAYOUT_VERSION = 1
WRITER_EVENTS = ("ready", "poll", "turn", "read", "written", "released")
CONSUMER_EVENTS = ("start", "qdo_full", "dq_done", "dq_empty", "dq_full", "end")


# ---------------------------------------------------------------------------
# Decoding
# ---------------------------------------------------------------------------

def slot_words(cap: int) -> int:
    return HEADER_WORDS + 2 * REC_WORDS * cap


def decode(buf: np.ndarray, max_ctas: int, cap: int) -> dict:
    """buf: uint64 [max_ctas * slot_words(cap)] -> {'writer': structured rows, 'consumer': rows, 'ctas': headers}."""
    slots = buf.reshape(max_ctas, slot_words(cap))
    ctas, wrows, crows = [], [], []
    for i in range(max_ctas):
        h = slots[i, :HEADER_WORDS]
        nw, nc = int(h[0]), int(h[1])
        if nw == 0 and nc == 0:
            continue
        ctas.append({"cta": i, "smid": int(h[2]), "writer_steps": nw, "consumer_steps": nc, "start_ns": int(h[4]),
                     "writer_truncated": nw > cap, "consumer_truncated": nc > cap})
        w = slots[i, HEADER_WORDS:HEADER_WORDS + REC_WORDS * min(nw, cap)].reshape(-1, REC_WORDS)
        c = slots[i, HEADER_WORDS + REC_WORDS * cap:HEADER_WORDS + REC_WORDS * (cap + min(nc, cap))].reshape(-1, REC_WORDS)
        wrows.append((i, int(h[2]), w))
        crows.append((i, int(h[2]), c))
    return {"ctas": ctas, "writer": wrows, "consumer": crows}


def _split(rec: np.ndarray, nevents: int):
    ns = rec[:, 4:4 + 2 * nevents:2].astype(np.int64)
    clk = rec[:, 5:5 + 2 * nevents:2].astype(np.int64)
    return ns, clk


def _rate(ns: np.ndarray, clk: np.ndarray) -> float:
    """Cycles per ns of one CTA's SM from its (ns, clk) pairs (nonzero ones), first to last."""
    m = (ns > 0) & (clk > 0)
    if m.sum() < 2:
        return float("nan")
    a, b = ns[m], clk[m]
    i, j = int(np.argmin(a)), int(np.argmax(a))
    return float(b[j] - b[i]) / float(a[j] - a[i]) if a[j] > a[i] else float("nan")


def _stats(x) -> dict:
    x = np.asarray([v for v in x if v is not None and np.isfinite(v)], dtype=np.float64)
    if x.size == 0:
        return {"n": 0}
    return {"n": int(x.size), "mean": float(x.mean()), "median": float(np.median(x)),
            "p90": float(np.percentile(x, 90)), "max": float(x.max()), "sum": float(x.sum())}


def _fmt(s: dict, unit: str = "ns") -> str:
    if s.get("n", 0) == 0:
        return "--"
    f = ".0f" if unit else ".3f"
    return f"mean {s['mean']:{f}} / median {s['median']:{f}} / p90 {s['p90']:{f}}{' ' + unit if unit else ''} (n {s['n']})"


# ---------------------------------------------------------------------------
# Analysis
# ---------------------------------------------------------------------------

def analyse(dec: dict, num_q_blocks: int, out_prefix: str | None) -> dict:
    """Per-step rows (CSV) and the summary of one traced launch."""
    summary: dict = {"ctas": len(dec["ctas"]),
                     "writer_truncated": sum(c["writer_truncated"] for c in dec["ctas"]),
                     "consumer_truncated": sum(c["consumer_truncated"] for c in dec["ctas"])}
    if not dec["ctas"]:
        summary["error"] = "no CTA recorded (is the library a FLASHSPAN_BWD_TRACE build? did the flex sm90 kernel run?)"
        return summary
    t0 = min([c["start_ns"] for c in dec["ctas"] if c["start_ns"] > 0] +
             [int(_split(r, n)[0][_split(r, n)[0] > 0].min()) for part, n in (("writer", 6), ("consumer", 6))
              for _, _, r in dec[part] if r.shape[0] and (_split(r, n)[0] > 0).any()])
    ordered = False
    rows = []          # writer rows (dicts)
    gran = []          # positive globaltimer deltas (resolution)
    rates = []
    for cta, smid, rec in dec["writer"]:
        if rec.shape[0] == 0:
            continue
        ns, clk = _split(rec, len(WRITER_EVENTS))
        rate = _rate(ns, clk)
        rates.append(rate)
        prev_end_clk = None
        for n in range(rec.shape[0]):
            tile = int(rec[n, 0])
            rank = int(np.int32(np.uint32(int(rec[n, 1]) >> 32)))
            kb = int(np.int32(np.uint32(int(rec[n, 2]) & 0xFFFFFFFF)))
            s = int(rec[n, 2]) >> 32
            e_ns = {k: int(ns[n, i]) for i, k in enumerate(WRITER_EVENTS)}
            e_clk = {k: int(clk[n, i]) for i, k in enumerate(WRITER_EVENTS)}
            is_ord = rank >= 0
            ordered |= is_ord

            def d(a, b):  # clock64 duration b - a in ns, None when an event is missing
                if e_clk[a] == 0 or e_clk[b] == 0 or not np.isfinite(rate):
                    return None
                return (e_clk[b] - e_clk[a]) / rate
            end_ev = "released" if is_ord else "read"
            idle = None
            if prev_end_clk is not None and e_clk["ready"] and np.isfinite(rate):
                idle = (e_clk["ready"] - prev_end_clk) / rate
            prev_end_clk = e_clk[end_ev] or None
            row = {"cta": cta, "smid": smid, "step": int(rec[n, 1]) & 0xFFFFFFFF, "item": int(rec[n, 3]), "kb": kb,
                   "item_step": s, "tile": tile, "head": tile // num_q_blocks, "q_block": tile % num_q_blocks,
                   "rank": rank}
            for k in WRITER_EVENTS:
                row[f"t_{k}"] = e_ns[k] - t0 if e_ns[k] else ""
            row.update({
                "idle_before": idle,                     # the writer waiting for the consumers' tile
                "rank_wait": d("ready", "poll") if is_ord else None,
                "turn_wait": d("poll", "turn") if is_ord else None,
                "read": d("turn", "read") if is_ord else d("ready", "read"),
                "write": d("turn", "written") if is_ord else None,
                "release": d("written", "released") if is_ord else None,
                "hold": d("turn", "released") if is_ord else None,
                "step_total": d("ready", end_ev),
            })
            rows.append(row)
            seq = sorted(v for v in e_ns.values() if v)
            gran.extend(b - a for a, b in zip(seq, seq[1:]) if b > a)
    summary["ordered"] = ordered
    summary["clock_ghz"] = _stats(rates)
    summary["globaltimer_min_positive_delta_ns"] = int(min(gran)) if gran else None
    summary["writer_steps"] = len(rows)
    ends = [r["t_released"] if ordered and r["t_released"] != "" else r["t_read"] for r in rows]
    ends = [e for e in ends if e != ""]
    summary["span_ns"] = int(max(ends)) if ends else None
    for k in ("idle_before", "rank_wait", "turn_wait", "read", "write", "release", "hold", "step_total"):
        summary[f"writer_{k}"] = _stats(r[k] for r in rows)
    # The writer's busy time by phase, summed over CTAs, against the sum of the writers' spans.
    if ordered:
        summary["chain"] = _chains(rows)

    crow = []
    for cta, smid, rec in dec["consumer"]:
        if rec.shape[0] == 0:
            continue
        ns, clk = _split(rec, len(CONSUMER_EVENTS))
        rate = _rate(ns, clk)
        for n in range(rec.shape[0]):
            c = {k: int(clk[n, i]) for i, k in enumerate(CONSUMER_EVENTS)}
            nxt = int(clk[n + 1, 0]) if n + 1 < rec.shape[0] else 0

            def dc(a, b):
                if not a or not b or not np.isfinite(rate):
                    return None
                return (b - a) / rate
            tile = int(rec[n, 0])
            row = {"cta": cta, "smid": smid, "step": int(rec[n, 1]), "item": int(rec[n, 3]),
                   "kb": int(np.int32(np.uint32(int(rec[n, 2]) & 0xFFFFFFFF))), "item_step": int(rec[n, 2]) >> 32,
                   "tile": tile, "head": tile // num_q_blocks, "q_block": tile % num_q_blocks}
            for i, k in enumerate(CONSUMER_EVENTS):
                row[f"t_{k}"] = int(ns[n, i]) - t0 if ns[n, i] else ""
            row.update({"qdo_wait": dc(c["start"], c["qdo_full"]), "compute_dq": dc(c["qdo_full"], c["dq_done"]),
                        "dq_empty_wait": dc(c["dq_done"], c["dq_empty"]), "store": dc(c["dq_empty"], c["dq_full"]),
                        "tail": dc(c["dq_full"], c["end"]),
                        "step_time": dc(c["start"], nxt) if nxt > c["start"] else None})
            crow.append(row)
    for k in ("qdo_wait", "compute_dq", "dq_empty_wait", "store", "tail", "step_time"):
        summary[f"consumer_{k}"] = _stats(r[k] for r in crow)
    tot = sum(r["step_time"] for r in crow if r["step_time"] is not None)
    if tot > 0:
        summary["consumer_share"] = {k: sum(r[k] for r in crow if r["step_time"] is not None and r[k] is not None) / tot
                                     for k in ("qdo_wait", "compute_dq", "dq_empty_wait", "store", "tail")}
        summary["consumer_share"]["other"] = 1.0 - sum(summary["consumer_share"].values())  # item ends, epilogues
    if out_prefix:
        for name, data in (("writer", rows), ("consumer", crow)):
            if data:
                with gzip.open(f"{out_prefix}_{name}.csv.gz", "wt", newline="") as f:
                    w = csv.DictWriter(f, fieldnames=list(data[0].keys()))
                    w.writeheader()
                    for r in data:
                        w.writerow({k: (f"{v:.1f}" if isinstance(v, float) else ("" if v is None else v))
                                    for k, v in r.items()})
    return summary


def _chains(rows: list) -> dict:
    """The order's chains: per dQ tile its additions by rank, each turn wait split into upstream / hold / hand-off."""
    by_tile: dict = {}
    for r in rows:
        if r["rank"] >= 0 and r["t_turn"] != "" and r["t_released"] != "":
            by_tile.setdefault(r["tile"], []).append(r)
    upstream, holdw, handoff, handoff_polling, waits = [], [], [], [], []
    spans, serial_share, lengths = [], [], []
    gaps_rank = 0
    for tile, rs in by_tile.items():
        rs.sort(key=lambda r: r["rank"])
        lengths.append(len(rs))
        if [r["rank"] for r in rs] != list(range(len(rs))):
            gaps_rank += 1  # a truncated CTA's records are missing: skip the tile's pairs across the gap
        ser = float(sum(r["t_released"] - r["t_turn"] for r in rs))  # every addition's hold
        for a, b in zip(rs, rs[1:]):
            if b["rank"] != a["rank"] + 1:
                continue
            poll, turn = b["t_poll"], b["t_turn"]
            if poll == "" or turn <= poll:
                continue
            w = turn - poll
            waits.append(w)
            up = max(0, min(a["t_turn"], turn) - poll)
            ho = max(0, min(a["t_released"], turn) - max(a["t_turn"], poll))
            hf = max(0, turn - max(a["t_released"], poll))
            upstream.append(up)
            holdw.append(ho)
            handoff.append(hf)
            if poll <= a["t_released"]:
                handoff_polling.append(turn - a["t_released"])
            ser += max(0, turn - a["t_released"])
        span = rs[-1]["t_released"] - rs[0]["t_ready"] if rs[0]["t_ready"] != "" else None
        if span and span > 0:
            spans.append(span)
            serial_share.append(ser / span)
    tw = sum(waits) or 1
    return {"tiles": len(by_tile), "tiles_with_missing_ranks": gaps_rank, "additions_per_tile": _stats(lengths),
            "turn_waits": _stats(waits),
            "turn_wait_split": {"upstream": sum(upstream) / tw, "predecessor_hold": sum(holdw) / tw,
                                "handoff": sum(handoff) / tw},
            "handoff_while_polling_ns": _stats(handoff_polling),
            "tile_span_ns": _stats(spans), "tile_serial_share": _stats(serial_share)}


def summary_text(label: str, s: dict) -> str:
    L = [f"== {label}"]
    if "error" in s:
        return "\n".join(L + ["  " + s["error"]])
    L.append(f"  CTAs {s['ctas']}, writer steps {s['writer_steps']}, span {s['span_ns']} ns, "
             f"clock {s['clock_ghz'].get('median', float('nan')):.3f} GHz (median over CTAs), "
             f"globaltimer min positive delta {s['globaltimer_min_positive_delta_ns']} ns"
             + (f", TRUNCATED CTAs: writer {s['writer_truncated']} consumer {s['consumer_truncated']}"
                if s["writer_truncated"] or s["consumer_truncated"] else ""))
    if "time_ms" in s:
        L.append(f"  backward time (median of reps): trace off {s['time_ms']['off']:.3f} ms, "
                 f"trace on {s['time_ms']['on']:.3f} ms")
    L.append("  writer, per step (clock64):")
    for k in ("idle_before", "rank_wait", "turn_wait", "read", "write", "release", "hold", "step_total"):
        L.append(f"    {k:12s} {_fmt(s['writer_' + k])}")
    L.append("  consumer (thread 0 of warpgroup 0), per step (clock64):")
    for k in ("qdo_wait", "compute_dq", "dq_empty_wait", "store", "tail", "step_time"):
        L.append(f"    {k:12s} {_fmt(s['consumer_' + k])}")
    if "consumer_share" in s:
        L.append("    share of the step time: " +
                 ", ".join(f"{k} {v * 100:.1f} %" for k, v in s["consumer_share"].items()))
    if "chain" in s:
        c = s["chain"]
        L.append(f"  order chains: {c['tiles']} tiles ({c['tiles_with_missing_ranks']} with missing ranks), "
                 f"additions a tile {_fmt(c['additions_per_tile'], '')}")
        L.append(f"    turn waits {_fmt(c['turn_waits'])}")
        sp = c["turn_wait_split"]
        L.append(f"    turn wait time: predecessor before its turn (upstream) {sp['upstream'] * 100:.1f} %, "
                 f"predecessor holding {sp['predecessor_hold'] * 100:.1f} %, hand-off {sp['handoff'] * 100:.1f} %")
        L.append(f"    hand-off (release -> turn, waiter already polling; globaltimer) {_fmt(c['handoff_while_polling_ns'])}")
        L.append(f"    tile chain span {_fmt(c['tile_span_ns'])}; serial (holds + hand-offs) share "
                 f"{_fmt(c['tile_serial_share'], '')}")
    return "\n".join(L)


# ---------------------------------------------------------------------------
# GPU run
# ---------------------------------------------------------------------------

def _hook():
    from flashspan import _lib
    lib = _lib.lib()
    try:
        fn = lib.flashspan_debug_bwd_trace_sm90
        lay = lib.flashspan_debug_bwd_trace_sm90_layout
    except AttributeError:
        raise SystemExit(f"bwd_trace: {_lib.library_path()} is not a FLASHSPAN_BWD_TRACE build "
                         "(cmake -DFLASHSPAN_BWD_TRACE=ON; see the module docstring)")
    fn.restype = ctypes.c_int
    fn.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int]
    lay.restype = None
    lay.argtypes = [ctypes.POINTER(ctypes.c_int64)]
    out = (ctypes.c_int64 * 3)()
    lay(out)
    if (out[0], out[1], out[2]) != (HEADER_WORDS, REC_WORDS, LAYOUT_VERSION):
        raise SystemExit(f"bwd_trace: the library's trace layout {tuple(out)} is not this script's "
                         f"{(HEADER_WORDS, REC_WORDS, LAYOUT_VERSION)}")
    return fn


def run(args) -> int:
    import torch
    import flashspan
    from flashspan import masks as fm

    set_trace = _hook()
    if not torch.cuda.is_available():
        raise SystemExit("bwd_trace: no CUDA device")
    dev = torch.device("cuda")
    if torch.cuda.get_device_capability(dev)[0] != 9:
        raise SystemExit(f"bwd_trace: {torch.cuda.get_device_name(dev)} is not sm_90: the traced kernel (the sm90 "
                         "backward) would not run")
    ctas = torch.cuda.get_device_properties(dev).multi_processor_count
    cap = args.cap
    buf = torch.zeros(ctas * slot_words(cap), dtype=torch.int64, device=dev)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[args.dtype]
    B, H, S, D = args.batch, args.heads, args.seqlen, args.head_dim
    num_q_blocks = B * ((S + 63) // 64)
    os.makedirs(args.out, exist_ok=True)
    unordered = os.environ.get("FLASHSPAN_SM90_BWD_DET_UNORDERED") == "1"
    results, texts = {}, []

    def check(rc):
        if rc != 0:
            raise SystemExit(f"bwd_trace: flashspan_debug_bwd_trace_sm90 failed, cudaError {rc}")

    for mask in args.masks.split(","):
        torch.manual_seed(0)
        q = torch.randn(B, S, H, D, device=dev, dtype=dtype, requires_grad=True)
        k = torch.randn(B, S, H, D, device=dev, dtype=dtype, requires_grad=True)
        v = torch.randn(B, S, H, D, device=dev, dtype=dtype, requires_grad=True)
        do = torch.randn(B, S, H, D, device=dev, dtype=dtype)
        mf = fm.benchmark_mask(mask, S, seed=args.seed, batch=B, device=dev)
        plan = flashspan.create_mask_plan(mf, q, k, v, build_backward=True)
        for mode in args.modes.split(","):
            det = mode == "det"
            label = f"{mask}_{'det_unordered' if det and unordered else mode}"
            out = flashspan.flex_attn_func(q, k, v, mask_plan=plan, deterministic=det)

            def bwd():
                torch.autograd.grad(out, (q, k, v), do, retain_graph=True)

            def timed(n):
                ts = []
                for _ in range(n):
                    torch.cuda.synchronize()
                    t = time.perf_counter()
                    bwd()
                    torch.cuda.synchronize()
                    ts.append((time.perf_counter() - t) * 1e3)
                return statistics.median(ts)

            for _ in range(args.warmup):
                bwd()
            t_off = timed(args.reps)
            torch.cuda.synchronize()
            check(set_trace(ctypes.c_void_p(buf.data_ptr()), ctas, cap))
            t_on = timed(args.reps)
            buf.zero_()
            torch.cuda.synchronize()
            bwd()
            torch.cuda.synchronize()
            check(set_trace(None, 0, 0))
            host = buf.cpu().numpy().view(np.uint64)
            s = analyse(decode(host, ctas, cap), num_q_blocks, os.path.join(args.out, label))
            s["time_ms"] = {"off": t_off, "on": t_on}
            s["shape"] = {"B": B, "H": H, "S": S, "D": D, "dtype": args.dtype, "deterministic": det,
                          "unordered": det and unordered}
            results[label] = s
            texts.append(summary_text(label, s))
            print(texts[-1], flush=True)
    with open(os.path.join(args.out, "summary.txt"), "w") as f:
        f.write("\n\n".join(texts) + "\n")
    with open(os.path.join(args.out, "summary.json"), "w") as f:
        json.dump(results, f, indent=1)
    return 0


# ---------------------------------------------------------------------------
# Self-test (no GPU): a synthetic buffer of two CTAs adding one tile in turn
# ---------------------------------------------------------------------------

def selftest(out_dir: str | None) -> int:
    cap, ctas, nqb = 4, 3, 512
    buf = np.zeros(ctas * slot_words(cap), dtype=np.uint64)
    slots = buf.reshape(ctas, slot_words(cap))
    ghz = 2.0
    # CTA 0 adds tile 7 at rank 0 (kb 2), CTA 1 at rank 1 (kb 1): CTA 1 polls from 1000, turn at 2600.
    plan = {0: [(7, 0, 2, 100, 200, 300, 1300, 2300, 2400)],
            1: [(7, 1, 1, 900, 1000, 2600, 3600, 4600, 4700), (512 + 3, 0, 1, 5000, 5100, 5200, 6200, 7200, 7300)]}
    for cta, steps in plan.items():
        slots[cta, 0] = len(steps)
        slots[cta, 1] = len(steps)
        slots[cta, 2] = 10 + cta
        slots[cta, 4] = 1_000_000 + 50
        for n, (tile, rank, kb, *ev) in enumerate(steps):
            r = slots[cta, HEADER_WORDS + REC_WORDS * n:HEADER_WORDS + REC_WORDS * (n + 1)]
            r[0] = tile
            r[1] = n | (rank << 32)
            r[2] = kb | (n << 32)
            r[3] = 0
            for e, t in enumerate(ev):
                r[4 + 2 * e] = 1_000_000 + t
                r[5 + 2 * e] = int(t * ghz) + 7
            c = slots[cta, HEADER_WORDS + REC_WORDS * (cap + n):HEADER_WORDS + REC_WORDS * (cap + n + 1)]
            c[0], c[1], c[2] = tile, n, kb
            for e, t in enumerate((0, 50, 800, 900, 950, 1000)):
                c[4 + 2 * e] = 1_000_000 + 2000 * n + t
                c[5 + 2 * e] = int((2000 * n + t) * ghz) + 7
    s = analyse(decode(buf, ctas, cap), nqb, os.path.join(out_dir, "selftest") if out_dir else None)
    print(summary_text("selftest", s))
    ch = s["chain"]
    ok = (s["ctas"] == 2 and s["writer_steps"] == 3 and ch["tiles"] == 2
          and abs(s["writer_turn_wait"]["max"] - 1600) < 1e-6          # CTA 1 waited 1000 -> 2600
          and abs(ch["handoff_while_polling_ns"]["mean"] - 200) < 1e-6  # released 2400 -> turn 2600
          and abs(ch["turn_wait_split"]["upstream"] - 0.0) < 1e-9
          and abs(ch["turn_wait_split"]["predecessor_hold"] - 1400 / 1600) < 1e-9
          and abs(s["clock_ghz"]["median"] - ghz) < 0.01
          and abs(s["consumer_dq_empty_wait"]["mean"] - 100) < 1e-6
          and abs(s["consumer_step_time"]["mean"] - 2000) < 1e-6 and abs(s["consumer_qdo_wait"]["mean"] - 50) < 1e-6
          and abs(ch["tile_serial_share"]["max"] - 4400 / 4600) < 1e-9)
    print("selftest", "passed" if ok else "FAILED")
    return 0 if ok else 1


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--masks", default="document_causal,causal")
    p.add_argument("--modes", default="det,nondet", help="comma-separated: det, nondet")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--seqlen", type=int, default=32768)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--dtype", choices=("bf16", "fp16"), default="bf16")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--cap", type=int, default=8192, help="records per CTA and role (buffer: SMs x 256 B x cap)")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--out", default="bwd_trace_out")
    p.add_argument("--selftest", action="store_true")
    args = p.parse_args(argv)
    if args.selftest:
        if args.out != "bwd_trace_out":
            os.makedirs(args.out, exist_ok=True)
        return selftest(args.out if args.out != "bwd_trace_out" else None)
    for m in args.modes.split(","):
        if m not in ("det", "nondet"):
            p.error(f"unknown mode {m!r}")
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
