"""How a job that verl-compat refuses at start-up ends: one short message and a non-zero exit.

Hydra would print its whole override list and the traceback before the one line that matters, so a refusal looks
like a crash. A refusal is not a crash: the message (key, device, reason, fix) is all the user needs. With
`HYDRA_FULL_ERROR=1` the exception propagates unchanged, as Hydra does for its own errors.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

from verl_compat.config_sources import COMMAND_LINE
from verl_compat.errors import VerlCompatError

EXIT_CODE = 2  # a configuration the job cannot start with (Hydra uses 1 for its own errors)
FULL_ERROR_ENV = "HYDRA_FULL_ERROR"


def full_error_wanted() -> bool:
    return os.environ.get(FULL_ERROR_ENV, "").strip() == "1"


def message(error: VerlCompatError) -> str:
    return f"verl-compat: the job cannot start: {error}\n(set {FULL_ERROR_ENV}=1 for the full traceback)"


@dataclass
class Origins:
    """Where each requested key was set (verl_compat.user_keys.RequestedKeys.origins); filled in once known."""

    by_key: Mapping[str, str] = field(default_factory=dict)

    def of(self, error: VerlCompatError) -> str | None:
        key = getattr(error, "key", None)
        origin = self.by_key.get(key) if isinstance(key, str) else None
        return None if origin in (None, COMMAND_LINE) else origin


@contextlib.contextmanager
def refusals() -> Iterator[Origins]:
    """Turn a VerlCompatError raised inside into the short message on stderr and SystemExit(EXIT_CODE), naming
    the user's file that set the key when it was not the command line.

    SystemExit is not an Exception, so Hydra's job runner lets it through without printing anything else.
    """
    origins = Origins()
    try:
        yield origins
    except VerlCompatError as error:
        origin = origins.of(error)
        if origin is not None:
            error.args = (f"{error} (the key is set in {origin})",)
        if full_error_wanted():
            raise
        sys.stderr.write(message(error) + "\n")
        sys.stderr.flush()
        raise SystemExit(EXIT_CODE) from None
