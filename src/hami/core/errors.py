"""Errors raised by the core. Every message names the object, the field and the value."""

from __future__ import annotations


class CoreError(ValueError):
    """Base class: bad input that the caller should report as one clear line."""


class CodecError(CoreError):
    """An annotation value does not follow its grammar (node registration, pod allocation)."""


class RequestError(CoreError):
    """A container's resources or a pod's scheduling annotations are invalid."""


class ConfigError(CoreError):
    """A `device-config.yaml` key has an invalid value."""
