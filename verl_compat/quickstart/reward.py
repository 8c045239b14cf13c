"""Rule-based scorer for the arithmetic tasks: 1.0 when the last number in the response equals the answer.

verl's reward loop loads this file by path (`reward.custom_reward_function.path`), so it imports only the
standard library.
"""

from __future__ import annotations

import re

_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


def last_number(text: str) -> float | None:
    found = _NUMBER.findall(text)
    if not found:
        return None
    try:
        return float(found[-1].replace(",", ""))
    except ValueError:
        return None


def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs) -> float:
    """verl's custom reward signature. The answer after the model's last `=` or in its last sentence counts."""
    want = last_number(str(ground_truth))
    got = last_number(solution_str)
    if want is None or got is None:
        return 0.0
    return 1.0 if abs(got - want) <= 1e-6 * max(1.0, abs(want)) else 0.0
