"""``hami monitor``: per-node GPU usage exporter (HAMi's vGPUmonitor). See docs/metrics.md."""
