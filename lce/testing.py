"""Helpers for tests and analysis that need lce's internals on purpose."""

from .plan import emulate_device_kind

__all__ = ["emulate_device_kind"]
