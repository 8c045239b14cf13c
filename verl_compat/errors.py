"""Errors raised at start-up, before any GPU work. Each one says what to change."""

from __future__ import annotations


class VerlCompatError(Exception):
    """Base class for verl-compat errors."""


class UnknownDeviceProfileError(VerlCompatError, ValueError):
    """`VERL_COMPAT_DEVICE` names a profile that is not in the catalog."""


class IncompatibleRequestError(VerlCompatError, ValueError):
    """A value the user set explicitly cannot run on this device.

    The message always names the config key, the device, the reason and the fix.
    """

    def __init__(self, key: str, value: object, device: str, reason: str, fix: str):
        self.key = key
        self.value = value
        self.device = device
        self.reason = reason
        self.fix = fix
        super().__init__(f"{key}={value!r} cannot run on {device}: {reason}. Fix: {fix}")


class InvalidSettingError(VerlCompatError, ValueError):
    """A setting that cannot work anywhere (a missing model folder, a fraction out of range, a broken checkpoint).

    Same four parts as IncompatibleRequestError: the config key, the device (or host), the reason and the fix.
    """

    def __init__(self, key: str, value: object, device: str, reason: str, fix: str):
        self.key = key
        self.value = value
        self.device = device
        self.reason = reason
        self.fix = fix
        super().__init__(f"{key}={value!r} cannot be used on {device}: {reason}. Fix: {fix}")
