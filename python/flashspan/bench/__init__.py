"""Benchmark CLI (``python -m flashspan.bench`` / ``flashspan-bench``): BENCHMARK.md workloads vs PyTorch peers."""
