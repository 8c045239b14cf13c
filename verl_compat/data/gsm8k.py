"""`verl-compat data gsm8k`: GSM8K as verl's RL parquet, scored by verl's own `verl.utils.reward_score.gsm8k`.

verl's wheel has no GSM8K preparation (upstream keeps it in an example script outside the package). Each row:
`data_source="openai/gsm8k"` (what verl's default scorer dispatches on), a one-message chat prompt asking for the
answer after "####" (the strict format the scorer extracts), and `reward_model.ground_truth` = the number after
"#### " in the dataset's answer, commas removed, as the scorer compares it.

Sources: a folder written by `datasets`' save_to_disk (a Dataset or a DatasetDict), a .parquet file, a .jsonl
(or .json lines) file with `question` and `answer`, or the hub dataset `openai/gsm8k` when no --from is given.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

DATA_SOURCE = "openai/gsm8k"
HUB_NAME, HUB_CONFIG = "openai/gsm8k", "main"
INSTRUCTION = 'Let\'s think step by step and output the final answer after "####".'
REQUIRED = ("question", "answer")
SPLITS = ("train", "test")
_ANSWER = re.compile(r"####\s*(-?[0-9.,$]+)")


class DataError(ValueError):
    """Bad input data: names the file and what is wrong with it."""


def ground_truth(answer: str, where: str) -> str:
    """The final number of a GSM8K answer ("... #### 1,234" -> "1234"), as verl's strict extractor returns it."""
    found = _ANSWER.findall(answer or "")
    if not found:
        raise DataError(f"{where}: the answer has no '#### N' final number: {answer[-80:]!r}")
    return found[-1].replace(",", "").replace("$", "").rstrip(".")


def to_verl_rows(records: Iterable[Mapping[str, Any]], split: str, source: str) -> list[dict[str, Any]]:
    rows = []
    for index, rec in enumerate(records):
        question = rec["question"]
        rows.append(
            {
                "data_source": DATA_SOURCE,
                "prompt": [{"role": "user", "content": f"{question} {INSTRUCTION}"}],
                "ability": "math",
                "reward_model": {"style": "rule", "ground_truth": ground_truth(rec["answer"], f"{source} row {index}")},
                "extra_info": {"split": split, "index": index, "question": question, "answer": rec["answer"]},
            }
        )
    return rows


def _check_columns(columns: Iterable[str], source: str) -> None:
    have = list(columns)
    missing = [c for c in REQUIRED if c not in have]
    if missing:
        raise DataError(
            f"{source}: missing column(s) {', '.join(missing)}; it has {', '.join(have) or 'no columns'}. "
            "GSM8K needs 'question' and 'answer' (the answer ending in '#### N')"
        )


def _split_of(path: Path, forced: str | None) -> str:
    if forced:
        return forced
    stem = path.name.lower()
    for split in SPLITS:
        if split in stem:
            return split
    raise DataError(
        f"{path}: cannot tell whether this file is the train or the test split from its name; "
        "rename it (train.jsonl / test.parquet) or pass --split train|test"
    )


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    import json

    records = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as e:
            raise DataError(f"{path} line {n}: not a JSON object ({e.msg}); expected one JSON object per line") from e
        if not isinstance(rec, dict):
            raise DataError(f"{path} line {n}: expected a JSON object, got {type(rec).__name__}")
        records.append(rec)
    return records


def read_source(path: Path, split: str | None = None) -> dict[str, list[dict[str, Any]]]:
    """{split: records} from a local source; raises DataError naming the file and the problem."""
    if not path.exists():
        raise DataError(f"{path}: no such file or folder")
    if path.is_dir():
        return _read_saved_dataset(path, split)
    suffix = path.suffix.lower()
    if suffix == ".parquet":
        import pandas as pd

        try:
            frame = pd.read_parquet(path)
        except Exception as e:
            raise DataError(f"{path}: not a readable parquet file ({type(e).__name__}: {e})") from e
        _check_columns(frame.columns, str(path))
        records = frame[list(REQUIRED)].to_dict("records")
    elif suffix in (".jsonl", ".json"):
        records = _read_jsonl(path)
        if records:
            _check_columns(records[0].keys(), str(path))
            for n, rec in enumerate(records):
                if any(c not in rec for c in REQUIRED):
                    _check_columns(rec.keys(), f"{path} row {n}")
    else:
        raise DataError(
            f"{path}: unknown format {suffix or '(no suffix)'!r}; give a save_to_disk folder, a .parquet file or a "
            ".jsonl file with 'question' and 'answer'"
        )
    if not records:
        raise DataError(f"{path}: the file holds no rows")
    return {_split_of(path, split): records}


def _read_saved_dataset(path: Path, split: str | None) -> dict[str, list[dict[str, Any]]]:
    if not ((path / "dataset_dict.json").is_file() or (path / "state.json").is_file()):
        raise DataError(
            f"{path}: a folder, but not one written by datasets' save_to_disk (no dataset_dict.json or state.json)"
        )
    from datasets import DatasetDict, load_from_disk

    try:
        loaded = load_from_disk(str(path))
    except Exception as e:
        raise DataError(f"{path}: datasets could not load this folder ({type(e).__name__}: {e})") from e
    parts = dict(loaded.items()) if isinstance(loaded, DatasetDict) else {_split_of(path, split): loaded}
    out = {}
    for name, ds in parts.items():
        where = f"{path} (split {name})"
        _check_columns(ds.column_names, where)
        if len(ds) == 0:
            raise DataError(f"{where}: the split holds no rows")
        out[name] = [{c: ds[i][c] for c in REQUIRED} for i in range(len(ds))]
    return out


def read_hub() -> dict[str, list[dict[str, Any]]]:
    from datasets import load_dataset

    try:
        loaded = load_dataset(HUB_NAME, HUB_CONFIG)
    except Exception as e:
        raise DataError(
            f"hub dataset {HUB_NAME}: could not load it ({type(e).__name__}: {e}). Offline, pass --from PATH "
            "(a save_to_disk folder, a .parquet or a .jsonl with question/answer)"
        ) from e
    return {name: [{c: ds[i][c] for c in REQUIRED} for i in range(len(ds))] for name, ds in loaded.items()}


def write(splits: Mapping[str, list[dict[str, Any]]], out: Path, source: str) -> dict[str, Path]:
    """Write `<out>/<split>.parquet` per split; returns {split: path}."""
    import pandas as pd

    out.mkdir(parents=True, exist_ok=True)
    written = {}
    for name, records in splits.items():
        path = out / f"{name}.parquet"
        pd.DataFrame(to_verl_rows(records, name, source)).to_parquet(path)
        written[name] = path
    return written


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="verl-compat data gsm8k", description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True, help="folder for train.parquet / test.parquet")
    ap.add_argument(
        "--from",
        dest="source",
        type=Path,
        action="append",
        default=None,
        help="save_to_disk folder, .parquet or .jsonl (repeat for train and test); default: the hub",
    )
    ap.add_argument("--split", choices=SPLITS, help="the split of a single-split source whose name does not say")
    args = ap.parse_args(argv)
    try:
        splits: dict[str, list[dict[str, Any]]] = {}
        for src in args.source or []:
            for name, records in read_source(src, args.split).items():
                if name in splits:
                    raise DataError(f"{src}: a second source for the {name} split")
                splits[name] = records
        written = write(splits or read_hub(), args.out, ", ".join(map(str, args.source or [HUB_NAME])))
    except DataError as e:
        print(f"verl-compat data gsm8k: {e}", file=sys.stderr)
        return 2
    for name, path in written.items():
        print(f"{name}: {path}")
    missing = [s for s in SPLITS if s not in written]
    if missing:
        print(f"note: no {' / '.join(missing)} split in the source; only the files above were written")
    return 0
