"""trainprof: profile a PyTorch training loop and rank its bottlenecks by GPU time lost."""

__version__ = "0.1.0"
