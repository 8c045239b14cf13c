"""How a job that verl-compat refuses at start-up ends: one short message and a non-zero exit.

Hydra would print its whole override list and the traceback before the one line that matters, so a refusal looks
like a crash. A refusal is not a crash: the message (key, device, reason, fix) is all the user needs. With
`HYDRA_FULL_ERROR=1` the exception propagates unchanged, as Hydra does for its own errors.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator

from verl_compat.errors import VerlCompatError

EXIT_CODE = 2  # a configuration the job cannot start with (Hydra uses 1 for its own errors)
FULL_ERROR_ENV = "HYDRA_FULL_ERROR"


def full_error_wanted() -> bool:
    return os.environ.get(FULL_ERROR_ENV, "").strip() == "1"


def message(error: VerlCompatError) -> str:
    return f"verl-compat: the job cannot start: {error}\n(set {FULL_ERROR_ENV}=1 for the full traceback)"


@contextlib.contextmanager
def refusals() -> Iterator[None]:
    """Turn a VerlCompatError raised inside into the short message on stderr and SystemExit(EXIT_CODE).

    SystemExit is not an Exception, so Hydra's job runner lets it through without printing anything else.
    """
    try:
        yield
    except VerlCompatError as error:
        if full_error_wanted():
            raise
        sys.stderr.write(message(error) + "\n")
        sys.stderr.flush()
        raise SystemExit(EXIT_CODE) from None
