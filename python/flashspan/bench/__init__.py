"""Benchmark CLI (``python -m flashspan.bench`` / ``flashspan-bench``): docs/BENCHMARK.md workloads vs PyTorch peers."""
