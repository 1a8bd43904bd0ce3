"""hami: share GPUs and other AI accelerators between Kubernetes pods (HAMi-compatible)."""

__version__ = "0.1.0"
