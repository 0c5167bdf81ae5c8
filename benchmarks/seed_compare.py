"""flashspan against the seed system (NVIDIA cuDNN frontend Flex Attention, ``cudnn.create_mask_plan`` /
``cudnn.flex_attn_func``) in one process, with the GPU's SM clock and power read while each one runs.

Why the clock: at S = 131072 the long runs of both libraries hit the board's power limit and the SM clock drops
(PERF_LOG v1.6 / v2.8); TFLOP/s then measure energy per FLOP as much as the schedule, so a comparison must show
the clock each one ran at. The two libraries run alternately (A B A B ...) on the same inputs and plans, so
drift (temperature, clocks) falls on both.

Install the seed on the GPU machine first (``../shared/tools/seed_system/``: two device calls), then e.g.::

    python3 benchmarks/seed_compare.py --seqlen 131072 --heads 4 --masks causal,document_causal --phases fwd,bwd

Per mask and phase: median TFLOP/s over --reps alternated timings (CUDA events, L2 flushed between calls), the median
SM clock (MHz) and power (W) of ``nvidia-smi`` samples taken every 100 ms during that library's timed calls, and
O (forward) or dQ / dK / dV (backward) of the two compared (max |diff|; reported, not asserted). TFLOP/s over the
visible pairs: forward 4 D pairs, backward 2.5x that (BENCHMARK.md).
"""

import argparse
import contextlib
import statistics
import subprocess
import threading
import time

import torch

import flashspan
from flashspan.bench.timing import Timer
from flashspan.bench.workloads import flex_workloads


class ClockSampler:
    """nvidia-smi samples of (SM clock MHz, power W) while active; one background reader."""

    def __init__(self, period_ms: int = 100):
        self.samples: list[tuple[float, float]] = []
        self.active = False
        self._proc = subprocess.Popen(
            ["nvidia-smi", "--query-gpu=clocks.sm,power.draw", "--format=csv,noheader,nounits", f"-lms={period_ms}",
             "-i", str(torch.cuda.current_device())], stdout=subprocess.PIPE, text=True)
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self):
        for line in self._proc.stdout:
            if self.active:
                try:
                    mhz, watts = (float(x) for x in line.split(","))
                    self.samples.append((mhz, watts))
                except ValueError:
                    pass

    @contextlib.contextmanager
    def window(self, out: list):
        self.samples = []
        self.active = True
        try:
            yield
        finally:
            torch.cuda.synchronize()
            time.sleep(0.15)
            self.active = False
            out.extend(self.samples)

    def close(self):
        self._proc.terminate()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seqlen", type=int, default=131072)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--head-dim", type=int, default=128, help="128, 64, 192 (-> (192, 128)) or 256")
    ap.add_argument("--masks", default="causal,document_causal")
    ap.add_argument("--phases", default="fwd,bwd")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    import cudnn  # the seed system (installed on the GPU machine by ../shared/tools/seed_system/)

    dev = torch.device("cuda")
    timer = Timer(dev, warmup=0, reps=1)
    sampler = ClockSampler()
    name = torch.cuda.get_device_name(dev)
    print(f"{name}, S={args.seqlen} H={args.heads} D={args.head_dim} bf16, B=1; flashspan {flashspan.__version__}, "
          f"seed cudnn frontend {getattr(cudnn, '__version__', '?')}")
    print("| mask | phase | flashspan TFLOP/s | MHz | W | seed TFLOP/s | MHz | W | ratio | max abs diff |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    wls = flex_workloads(args.masks.split(","), args.seqlen, [args.head_dim], args.heads, 1, args.seed, dev)
    for wl in wls:
        g = torch.Generator(device=dev).manual_seed(args.seed)
        B, S, H = wl.batch, wl.seqlen, wl.heads_q
        q = torch.randn(B, S, H, wl.head_dim_qk, device=dev, dtype=torch.bfloat16, generator=g)
        k = torch.randn(B, S, H, wl.head_dim_qk, device=dev, dtype=torch.bfloat16, generator=g)
        v = torch.randn(B, S, H, wl.head_dim_v, device=dev, dtype=torch.bfloat16, generator=g)
        do = torch.randn(B, S, H, wl.head_dim_v, device=dev, dtype=torch.bfloat16, generator=g)
        libs = {"flashspan": (flashspan.create_mask_plan, flashspan.flex_attn_func),
                "seed": (cudnn.create_mask_plan, cudnn.flex_attn_func)}
        plans = {n: mk(wl.mask_func, q, k, v, build_backward=True) for n, (mk, _) in libs.items()}
        flop_fwd = 2.0 * (wl.head_dim_qk + wl.head_dim_v) * wl.visible_pairs
        for phase in args.phases.split(","):  # bwd: timed as forward + backward minus a forward
            results = {n: dict(t=[], clk=[], out=None) for n in libs}

            def call(n):
                fn = libs[n][1]
                if phase == "fwd":
                    with torch.no_grad():
                        return fn(q, k, v, mask_plan=plans[n])
                qq, kk, vv = (x.detach().requires_grad_() for x in (q, k, v))
                o = fn(qq, kk, vv, mask_plan=plans[n])
                o = o[0] if isinstance(o, tuple) else o
                return torch.autograd.grad(o, (qq, kk, vv), do)

            for n in libs:  # warm-up (the seed JIT-compiles its first call of a variant)
                for _ in range(2):
                    results[n]["out"] = call(n)
            for _ in range(args.reps):
                for n in libs:
                    with sampler.window(results[n]["clk"]):
                        results[n]["t"].append(timer.measure(lambda: call(n)).median_ms)
                        if phase == "bwd":  # the backward alone: forward + backward minus a forward
                            with torch.no_grad():
                                results[n]["t"][-1] -= timer.measure(lambda: libs[n][1](q, k, v, mask_plan=plans[n])).median_ms
            flop = flop_fwd * (2.5 if phase == "bwd" else 1.0)
            row = [wl.mask_name, phase]
            tf = {}
            for n in libs:
                ms = statistics.median(results[n]["t"])
                tf[n] = flop / (ms * 1e-3) / 1e12
                clk = results[n]["clk"]
                mhz = statistics.median(c[0] for c in clk) if clk else float("nan")
                watts = statistics.median(c[1] for c in clk) if clk else float("nan")
                row += [f"{tf[n]:.0f}", f"{mhz:.0f}", f"{watts:.0f}"]
            a, b = results["flashspan"]["out"], results["seed"]["out"]
            a = a if isinstance(a, (tuple, list)) else (a,)
            b = b if isinstance(b, (tuple, list)) else (b,)
            diff = max(float((x.float() - y.float()).abs().max()) for x, y in zip(a, b))
            row += [f"{tf['flashspan'] / tf['seed']:.2f}", f"{diff:.3g}"]
            print("| " + " | ".join(row) + " |", flush=True)
    sampler.close()


if __name__ == "__main__":
    main()
