"""Errors of the local Kubernetes harness (control plane, kwok, real node)."""

from __future__ import annotations

import json


class ClusterError(RuntimeError):
    """The control plane could not be started, reached or stopped."""


class ApiError(ClusterError):
    """The API server answered with an unexpected HTTP status."""

    def __init__(self, method: str, path: str, status: int, body: str) -> None:
        self.status = status
        try:
            message = json.loads(body).get("message", body)
        except (ValueError, AttributeError):
            message = body
        super().__init__(f"{method} {path}: HTTP {status}: {message}")


class RealNodeError(ClusterError):
    """The real node could not be started, used or stopped."""


class RealNodeUnavailable(RealNodeError):
    """This machine cannot run a real node; ``missing`` names what it lacks, in one line."""

    def __init__(self, missing: list[str]) -> None:
        self.missing = missing
        super().__init__("real node unavailable: " + "; ".join(missing))


class RealNodeBusy(RealNodeError):
    """Another real node holds the machine-wide lock."""
