"""Host cost per call of flashspan's Python entry points on a tiny shape (issue 24, "Host cost").

Entry points timed, each on B=1, H=1, S=128, D=64 (``--seqlen`` / ``--head-dim`` change it), no mask (every key
visible), no gradients:

  flex_attn_func                  flashspan.flex_attn_func(q, k, v, mask_plan=plan) (q, k, v BSHD; plan built once)
  flex_attn_func (requires_grad)  the same with q, k, v requiring grad (records the autograd node; forward only)
  FlexAttentionFwd.execute        the explicit API: compiled once, caller buffers and workspace, execute() timed
  flashspan.sdpa                  flashspan.sdpa(q, k, v, attn_scale=...) forward (q, k, v BHSD)
  torch.ops.flashspan.sdpa_fwd    the custom op (the seed's cudnn::sdpa_fwd schema), return_lse=False
  torch SDPA                      torch.nn.functional.scaled_dot_product_attention (the peer)

Timing: ``--rounds`` rounds of ``--reps`` calls after ``--warmup`` calls; each call is timed alone
(time.perf_counter_ns around it) and the table gives the median and the 90th percentile of those per-call times,
plus the mean of a round's loop including one synchronisation after it. On CUDA the calls launch asynchronously and
the device is synchronised once after each round only, so the per-call figure is what the host spends per call (the
kernels of this shape are shorter than that; if the GPU were slower the launch queue would fill and the figures
would grow towards the kernel time: compare with ``--sync-each`` then, which synchronises after every call).

``--device cpu`` is a smoke run on flex's CPU reference backend (fp32 by default, ``--dtype bf16`` too): there the
figures include the CPU reference's compute. ``--stub-kernels`` (CPU only) replaces the C layer's execute calls by
no-ops, so what remains is the Python layer's own cost per call (descriptor binding, checks, caches, allocation of
the outputs). (``--sdpa-route flex``, which sent flashspan.sdpa on CPU tensors down the flex lowering, went with that
route: flashspan.sdpa runs the C layer's SDPA operation on every device.)

``--profile`` prints a cProfile breakdown (top 25 by cumulative time) of the flex_attn_func loop (and, with
``--profile-all``, of every entry point).

Usage (on a CUDA machine, from the repository root)::

    FLASHSPAN_LIBRARY=$PWD/build/libflashspan.so PYTHONPATH=python python3 benchmarks/host_cost.py [--profile]

CPU (no GPU)::

    PYTHONPATH=python python3 benchmarks/host_cost.py --device cpu --stub-kernels [--profile]

Exits 1 when an entry point fails (the error is printed), 2 for bad arguments (CUDA asked for but not available).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import math
import pstats
import statistics
import sys
import time
import traceback

_DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}


def _parse(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--dtype", choices=tuple(_DTYPES), default=None, help="default: bf16 on CUDA, fp32 on the CPU")
    p.add_argument("--seqlen", type=int, default=128)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--reps", type=int, default=None, help="calls per round (default: 2000 on CUDA, 200 on the CPU)")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--warmup", type=int, default=50)
    p.add_argument("--only", default="", help="comma-separated subset of: " + ", ".join(_KEYS))
    p.add_argument("--sync-each", action="store_true", help="synchronise after every call (device time per call)")
    p.add_argument("--stub-kernels", action="store_true",
                   help="CPU only: the C layer's execute calls become no-ops (the Python layer's cost alone)")
    p.add_argument("--profile", action="store_true", help="cProfile of the flex_attn_func loop (top 25, cumulative)")
    p.add_argument("--profile-all", action="store_true", help="cProfile of every entry point's loop")
    return p.parse_args(argv)


_KEYS = ("flex_attn_func", "flex_attn_func_grad", "execute", "sdpa", "sdpa_op", "torch_sdpa")
_LABELS = {
    "flex_attn_func": "flashspan.flex_attn_func",
    "flex_attn_func_grad": "flex_attn_func (requires_grad)",
    "execute": "FlexAttentionFwd.execute",
    "sdpa": "flashspan.sdpa",
    "sdpa_op": "torch.ops.flashspan.sdpa_fwd",
    "torch_sdpa": "torch SDPA",
}


def _stub_kernels(flashspan) -> None:
    """Replace the C layer's execute calls (flex and SDPA) by no-ops returning success (CPU measurement of the Python
    layer alone). Creation, check_support, compile and the argument checks still run."""
    from flashspan import _sdpa_lib, execution

    execution._OpBase._launch = lambda self, handle, args, ws_ptr, ws_bytes, stream: 0
    _sdpa_lib.Op.execute = lambda self, pointers, workspace, stream: None


def _entry_points(torch, flashspan, dev, dtype, S, D):
    """name -> a zero-argument callable running one call (everything it needs is built here, once)."""
    import torch.nn.functional as F

    B, H = 1, 1
    g = torch.Generator(device="cpu").manual_seed(0)
    mk = lambda *shape: torch.randn(*shape, generator=g).to(device=dev, dtype=dtype)  # noqa: E731
    # flex: BSHD
    q, k, v = mk(B, S, H, D), mk(B, S, H, D), mk(B, S, H, D)
    mask_func = torch.full((1, 1, B * S), S, dtype=torch.int32, device=dev)  # row r sees keys [0, S)
    plan = flashspan.create_mask_plan(mask_func, q, k, v, build_backward=True)
    qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))
    scale = 1.0 / math.sqrt(D)
    out = torch.empty_like(q)
    lse = torch.empty((B, H, S), dtype=torch.float32, device=dev)
    fwd = flashspan.FlexAttentionFwd(q, k, v, out, plan, lse)
    fwd.check_support()
    fwd.compile()
    ws = torch.empty(fwd.workspace_size, dtype=torch.uint8, device=dev) if fwd.workspace_size else None
    # SDPA: BHSD
    qs, ks, vs = mk(B, H, S, D), mk(B, H, S, D), mk(B, H, S, D)
    op = torch.ops.flashspan.sdpa_fwd

    calls = {
        "flex_attn_func": lambda: flashspan.flex_attn_func(q, k, v, mask_plan=plan),
        "flex_attn_func_grad": lambda: flashspan.flex_attn_func(qg, kg, vg, mask_plan=plan),
        "execute": lambda: fwd.execute(q, k, v, out, plan, lse, workspace=ws, softmax_scale=scale),
        "sdpa": lambda: flashspan.sdpa(qs, ks, vs, attn_scale=scale),
        "sdpa_op": lambda: op(qs, ks, vs, scale, return_lse=False),
        "torch_sdpa": lambda: F.scaled_dot_product_attention(qs, ks, vs, scale=scale),
    }
    keep = (plan, fwd)  # alive while the callables are
    return calls, keep


def _time(torch, fn, dev, reps, rounds, warmup, sync_each):
    """(median us, p90 us, loop mean us incl. one sync per round) over rounds * reps single-call timings."""
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    for _ in range(warmup):
        fn()
    sync()
    per_call, loop_means = [], []
    clock = time.perf_counter_ns
    for _ in range(rounds):
        samples = [0] * reps
        t_round = clock()
        for i in range(reps):
            t0 = clock()
            fn()
            if sync_each:
                sync()
            samples[i] = clock() - t0
        sync()
        loop_means.append((clock() - t_round) / reps / 1e3)
        per_call.extend(samples)
    per_call.sort()
    med = statistics.median(per_call) / 1e3
    p90 = per_call[min(len(per_call) - 1, int(0.9 * len(per_call)))] / 1e3
    return med, p90, statistics.median(loop_means)


def _profile(torch, name, fn, dev, reps) -> str:
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(reps):
        fn()
    sync()
    prof.disable()
    buf = io.StringIO()
    stats = pstats.Stats(prof, stream=buf).strip_dirs().sort_stats("cumulative")
    buf.write(f"cProfile of {reps} calls of {_LABELS[name]} (top 25 by cumulative time)\n")
    stats.print_stats(25)
    return buf.getvalue()


def main(argv=None) -> int:
    args = _parse(argv)
    import torch

    import flashspan

    if args.device == "cuda" and not torch.cuda.is_available():
        print("host_cost: --device cuda but torch sees no CUDA device (use --device cpu for the CPU smoke run)",
              file=sys.stderr)
        return 2
    if args.stub_kernels and args.device != "cpu":
        print("host_cost: --stub-kernels is for --device cpu only", file=sys.stderr)
        return 2
    only = [s.strip() for s in args.only.split(",") if s.strip()] or list(_KEYS)
    unknown = [s for s in only if s not in _KEYS]
    if unknown:
        print(f"host_cost: --only: unknown entry point(s) {unknown}; choose from {', '.join(_KEYS)}", file=sys.stderr)
        return 2
    dev = torch.device(args.device)
    dtype = getattr(torch, _DTYPES[args.dtype or ("bf16" if dev.type == "cuda" else "fp32")])
    reps = args.reps or (2000 if dev.type == "cuda" else 200)
    if args.stub_kernels:
        _stub_kernels(flashspan)
    from flashspan import _lib

    where = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "CPU"
    print(f"host_cost: {where}; torch {torch.__version__}; library {_lib.library_path()}")
    print(f"shape B=1 H=1 S={args.seqlen} D={args.head_dim} {dtype}; {args.rounds} rounds x {reps} calls "
          f"(+{args.warmup} warm-up)"
          + ("; C execute stubbed (Python layer only)" if args.stub_kernels else "")
          + ("; synchronised after every call" if args.sync_each else ""))
    if dev.type == "cpu" and not args.stub_kernels:
        print("note: CPU figures include the CPU reference backend's compute (--stub-kernels leaves it out)")
    try:
        calls, _keep = _entry_points(torch, flashspan, dev, dtype, args.seqlen, args.head_dim)
    except Exception:
        traceback.print_exc()
        print("host_cost: setting up the inputs failed", file=sys.stderr)
        return 1
    failed = []
    rows = []
    for name in only:
        try:
            med, p90, mean = _time(torch, calls[name], dev, reps, args.rounds, args.warmup, args.sync_each)
        except Exception:
            traceback.print_exc()
            failed.append(name)
            rows.append((name, None, None, None))
            continue
        rows.append((name, med, p90, mean))
    width = max(len(_LABELS[n]) for n in only)
    print()
    print(f"| {'entry point'.ljust(width)} | median us/call | p90 us/call | loop mean us/call |")
    print(f"|{'-' * (width + 2)}|---------------:|------------:|------------------:|")
    for name, med, p90, mean in rows:
        if med is None:
            print(f"| {_LABELS[name].ljust(width)} | FAILED | | |")
        else:
            print(f"| {_LABELS[name].ljust(width)} | {med:14.1f} | {p90:11.1f} | {mean:17.1f} |")
    if args.profile or args.profile_all:
        names = [n for n in only if n not in failed]
        if not args.profile_all:
            names = [n for n in names if n == "flex_attn_func"]
            if not names:
                print("host_cost: --profile profiles flex_attn_func, which --only left out", file=sys.stderr)
        for name in names:
            print()
            print(_profile(torch, name, calls[name], dev, reps))
    if failed:
        print(f"host_cost: FAILED: {', '.join(_LABELS[n] for n in failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
