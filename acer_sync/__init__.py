"""acer_sync: synchronous, vectorized ACER (Wang et al. 2017) in PyTorch."""

__version__ = "0.1.0"
