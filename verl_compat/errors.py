"""Errors raised at start-up, before any GPU work. Each one says what to change."""

from __future__ import annotations


class VerlCompatError(Exception):
    """Base class for verl-compat errors."""


class UnknownDeviceProfileError(VerlCompatError, ValueError):
    """`VERL_COMPAT_DEVICE` names a profile that is not in the catalog."""


class _SettingError(VerlCompatError, ValueError):
    """A message that always names the config key, the device (or host), the reason and the fix."""

    verb = "cannot run on"

    def __init__(self, key: str, value: object, device: str, reason: str, fix: str):
        self.key = key
        self.value = value
        self.device = device
        self.reason = reason
        self.fix = fix
        super().__init__(f"{key}={value!r} {self.verb} {device}: {reason}. Fix: {fix}")


class IncompatibleRequestError(_SettingError):
    """A value the user set explicitly cannot run on this device."""


class InvalidSettingError(_SettingError):
    """A setting that cannot work anywhere (a missing model folder, a fraction out of range, a broken checkpoint)."""

    verb = "cannot be used on"
