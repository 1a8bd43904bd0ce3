"""Where the pinned Kubernetes binaries live and which of them are installed.

``scripts/install-kube.sh`` builds them from Go modules into ``<cache>/kube/<version>/bin``;
:func:`find_binaries` says which are there and names the missing required ones.
"""

from __future__ import annotations

import os
from pathlib import Path

from hami_devkit.errors import ClusterError

# keep the default equal to KUBE_DEFAULT in scripts/install-kube.sh; HAMI_KUBE_VERSION opts into
# another version the script can build (docs/dra.md says which)
KUBE_VERSION = os.environ.get("HAMI_KUBE_VERSION") or "v1.37.2"
REQUIRED_BINARIES = ("etcd", "kube-apiserver", "kube-scheduler", "kwok")
OPTIONAL_BINARIES = (
    "kube-controller-manager",
    "kubectl",
    "helm",
    "kubelet",
    "kube-proxy",
    # the real node's runtime (CDI-capable; Debian 12's containerd 1.6 is not)
    "containerd",
    "containerd-shim-runc-v2",
    "ctr",
)


class MissingBinaries(ClusterError):
    """Some required binaries are not installed; ``missing`` names them."""

    def __init__(self, missing: list[str], directory: Path) -> None:
        self.missing = missing
        self.directory = directory
        super().__init__(
            f"Kubernetes binaries not installed: {', '.join(missing)} (looked in {directory}); "
            "run scripts/install-kube.sh (or `make kube`) to build them"
        )


def cache_dir() -> Path:
    """``$HAMI_CACHE``, else ``~/.cache/hami``."""
    return Path(os.environ.get("HAMI_CACHE") or Path.home() / ".cache" / "hami")


def bin_dir() -> Path:
    """Where the pinned binaries live: ``$HAMI_KUBE_BIN``, else ``<cache>/kube/<version>/bin``."""
    override = os.environ.get("HAMI_KUBE_BIN")
    return Path(override) if override else cache_dir() / "kube" / KUBE_VERSION / "bin"


def find_binaries(directory: Path | None = None) -> dict[str, Path]:
    """Paths of the installed binaries; raises :class:`MissingBinaries` if a required one is absent."""
    directory = directory or bin_dir()
    found = {
        name: directory / name for name in REQUIRED_BINARIES + OPTIONAL_BINARIES if os.access(directory / name, os.X_OK)
    }
    missing = [name for name in REQUIRED_BINARIES if name not in found]
    if missing:
        raise MissingBinaries(missing, directory)
    return found
