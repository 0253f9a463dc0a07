"""cpuperf: probe, install, tune and launch PyTorch training on CPUs and NVIDIA GPUs."""

__version__ = "0.1.0"
