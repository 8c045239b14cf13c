"""verl-compat: run verl on the GPUs people own (P40, P100, V100, T4, ...) and on CPU.

`detect()` returns the device profile; the resolvers turn a verl config plus a profile into decisions.
On sm_80+ every resolver returns exactly what upstream verl uses.
"""

# `detect` is imported eagerly on purpose: the submodule `verl_compat.detect` shares its name with this function,
# and the import system rebinds `verl_compat.detect` to the module when the submodule is first loaded. Binding
# the function here, after that load, keeps `verl_compat.detect()` callable. detect.py imports no torch at
# import time (torch is read inside detect()). Reach the module's other names with `from verl_compat.detect import`.
from verl_compat.decision import Candidate, Decision, Reason
from verl_compat.detect import detect
from verl_compat.errors import IncompatibleRequestError, UnknownDeviceProfileError, VerlCompatError
from verl_compat.profile import DeviceProfile, PackageStatus

__version__ = "0.9.1+compat.1"


__all__ = [
    "Candidate",
    "Decision",
    "DeviceProfile",
    "IncompatibleRequestError",
    "PackageStatus",
    "Reason",
    "UnknownDeviceProfileError",
    "VerlCompatError",
    "detect",
]
