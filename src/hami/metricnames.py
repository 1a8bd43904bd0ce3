"""What HAMi's two metric endpoints share, written once: the scheduler's (:mod:`hami.scheduler.metrics`,
what was allocated) and the node monitor's (:mod:`hami.monitor.exporter`, what is used).

Owns the ``zone`` label value every HAMi metric carries, ``hami_build_info`` (its name, labels
and values), and the names of the monitor's metrics that another program reads back (the web
UI's live usage, :mod:`hami.ui.live`), and the DRA node agent's families (its optional third
endpoint, :mod:`hami.draplugin.metrics`). Each other endpoint's families are named in its own module.
It does not collect or format anything. Imports only the standard library and ``hami``'s version.
"""

from __future__ import annotations

import platform

import hami

ZONE = "vGPU"  # the value of the "zone" label on every HAMi metric

BUILD_INFO = "hami_build_info"
BUILD_INFO_HELP = "hami build information"
BUILD_LABELS = ("version", "revision", "build_date", "go_version", "compiler", "platform")

# the node monitor's usage metrics the UI joins into its answers
HOST_MEMORY_USED = "hami_host_gpu_memory_used_bytes"  # per device: label device_uuid
HOST_UTILIZATION = "hami_host_gpu_utilization_ratio"
CONTAINER_MEMORY_USED = "hami_vgpu_memory_used_bytes"  # per container: namespace, pod, container, device_uuid
CONTAINER_UTILIZATION = "hami_container_device_utilization_ratio"

# the scheduler's allocation metrics the UI's history reads back from Prometheus (hami.ui.prometheus)
GPU_MEMORY_ALLOCATED = "hami_gpu_memory_allocated_bytes"  # per device: node, device_uuid, device_type, ...
GPU_CORES_ALLOCATED = "hami_gpu_core_allocated_ratio"  # per device, percent of the GPU (HAMi)
POD_MEMORY_ALLOCATED = "hami_vgpu_memory_allocated_bytes"  # per pod and device: namespace, node, pod, device_uuid
POD_CORES_ALLOCATED = "hami_vgpu_core_allocated_ratio"

# the DRA node agent (`hami dra --metrics-bind-address`): its prepare/unprepare work and the sweep
DRA_PREPARE_TOTAL = "hami_dra_prepare_total"  # counter, label result: ok / error (one per claim)
DRA_PREPARE_SECONDS = "hami_dra_prepare_seconds"  # histogram: one claim's prepare
DRA_UNPREPARE_TOTAL = "hami_dra_unprepare_total"  # counter, label result (the kubelet's calls)
DRA_UNPREPARE_SECONDS = "hami_dra_unprepare_seconds"  # histogram: one claim's unprepare
DRA_PREPARED_CLAIMS = "hami_dra_prepared_claims"  # gauge: claims in the checkpoint
DRA_PREPARED_DEVICES = "hami_dra_prepared_devices"  # gauge: their devices (one per GPU share)
DRA_SWEPT_CLAIMS_TOTAL = "hami_dra_swept_claims_total"  # counter, label reason: deleted / recreated
DRA_SWEEP_ERRORS_TOTAL = "hami_dra_sweep_errors_total"  # counter: claims the sweep could not check
DRA_PREPARE_ERRORS_TOTAL = "hami_dra_prepare_errors_total"  # counter, label reason (draplugin.metrics)
DRA_UNPREPARE_ERRORS_TOTAL = "hami_dra_unprepare_errors_total"  # counter, label reason


def build_info_values() -> tuple[str, ...]:
    """``hami_build_info`` label values; ``go_version`` is kept for HAMi dashboards and says "none"."""
    return (
        hami.__version__,
        "",
        "",
        "none",
        f"{platform.python_implementation().lower()}-{platform.python_version()}",
        f"{platform.system().lower()}/{platform.machine()}",
    )
