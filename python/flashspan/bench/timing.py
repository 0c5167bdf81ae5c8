"""Timers: CUDA events with an L2 flush between repetitions, or wall clock on CPU; medians."""

from __future__ import annotations

import dataclasses
import statistics
import time
from typing import Callable, Optional

import torch

# Writing this many bytes between repetitions evicts the H200's 60 MB L2 (and any
# smaller one), so every repetition starts cold, as in a real model step.
L2_FLUSH_BYTES = 256 * 1024 * 1024


@dataclasses.dataclass
class Timing:
    """Median and spread of ``reps`` timed calls in milliseconds, and the first call apart."""

    median_ms: float
    min_ms: float
    max_ms: float
    reps: int
    first_call_ms: Optional[float] = None

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


class Timer:
    """Times a zero-argument callable.

    On CUDA: one CUDA event pair per repetition around the call only, with a 256 MB
    buffer written before each (outside the events) to flush L2; the first call is
    timed apart by wall clock with synchronisation (it includes compilation, autotuning
    and lazy initialisation). On CPU: ``time.perf_counter`` around each call.
    """

    def __init__(self, device: torch.device, warmup: int, reps: int, flush_l2: bool = True):
        self.device = device
        self.cuda = device.type == "cuda"
        self.warmup = max(0, int(warmup))
        self.reps = max(1, int(reps))
        self._flush = None
        if self.cuda and flush_l2:
            self._flush = torch.empty(L2_FLUSH_BYTES, dtype=torch.uint8, device=device)

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize(self.device)

    def first_call(self, fn: Callable[[], object]) -> float:
        """Wall-clock milliseconds of one synchronised call (use for the very first call)."""
        self.sync()
        t0 = time.perf_counter()
        fn()
        self.sync()
        return (time.perf_counter() - t0) * 1e3

    def flush(self) -> None:
        if self._flush is not None:
            self._flush.fill_(1)

    def measure(self, fn: Callable[[], object], first_call_ms: Optional[float] = None) -> Timing:
        for _ in range(self.warmup):
            fn()
        times = []
        if self.cuda:
            starts = [torch.cuda.Event(enable_timing=True) for _ in range(self.reps)]
            ends = [torch.cuda.Event(enable_timing=True) for _ in range(self.reps)]
            self.sync()
            for i in range(self.reps):
                self.flush()
                starts[i].record()
                fn()
                ends[i].record()
            self.sync()
            times = [s.elapsed_time(e) for s, e in zip(starts, ends)]
        else:
            for _ in range(self.reps):
                t0 = time.perf_counter()
                fn()
                times.append((time.perf_counter() - t0) * 1e3)
        return Timing(statistics.median(times), min(times), max(times), len(times), first_call_ms)

    def measure_host(self, fn: Callable[[], object], reps: int) -> Timing:
        """Synchronised wall-clock timing (for host-driven work like plan building): the
        first call is reported apart, then the median of ``reps`` more calls."""
        first = self.first_call(fn)
        times = [self.first_call(fn) for _ in range(max(1, reps))]
        return Timing(statistics.median(times), min(times), max(times), len(times), first)


def tflops(flops: float, ms: Optional[float]) -> Optional[float]:
    if not ms or ms <= 0:
        return None
    return flops / (ms * 1e-3) / 1e12
