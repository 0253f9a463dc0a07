"""cpuperf's benchmark suite: `python -m benchmarks --quick` (about 10 minutes) or `--full`."""
