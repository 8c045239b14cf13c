"""`verl-compat fork ...`: materialize, check, refresh, rebase."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from verl_compat.fork.pin import Layout, find_root


def _layout(args) -> Layout:
    if args.root:
        root = Path(args.root).resolve()
    else:  # the checkout we are run from, else the one this (editable) install lives in
        try:
            root = find_root(Path.cwd())
        except FileNotFoundError:
            root = find_root()
    return Layout(root=root, cache_dir=Path(args.cache).resolve() if args.cache else None)


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="verl-compat fork", description="maintain the patch series on upstream verl")
    ap.add_argument("--root", help="checkout root (default: found from the current folder)")
    ap.add_argument("--cache", help="folder for downloaded wheels and scratch trees (default ROOT/.verl-compat)")
    sub = ap.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("materialize", help="build verl/ from the pinned wheel + patches/series")
    m.add_argument("--force", action="store_true", help="discard hand edits in verl/")
    sub.add_parser("check", help="every patch has its header and applies exactly to the pinned upstream")
    r = sub.add_parser("refresh", help="regenerate patches/ from the edited verl/ tree")
    r.add_argument("--into", help="patch (already in series) that receives changes no patch owns yet")
    rb = sub.add_parser("rebase", help="report how the series applies to another upstream release")
    rb.add_argument("--to", required=True, metavar="VERSION")
    args = ap.parse_args(argv)
    try:
        return _run(args, _layout(args))
    except Exception as e:  # the CLI reports any failure as one clear line and a non-zero status
        print(f"verl-compat fork {args.cmd}: error: {e}", file=sys.stderr)
        return 1


def _run(args, layout: Layout) -> int:
    if args.cmd == "materialize":
        from verl_compat.fork.materialize import materialize

        print(f"verl-compat fork materialize: {materialize(layout, force=args.force)}")
        return 0
    if args.cmd == "check":
        from verl_compat.fork.check import check

        res = check(layout)
        for p in res.problems:
            print(f"FAIL {p}")
        print(
            f"{res.patches} patches, {res.files} upstream files, upstream lines touched: "
            f"{res.lines_removed} replaced or removed, {res.lines_added} added"
        )
        print("fork check: OK" if res.ok else f"fork check: {len(res.problems)} problem(s)")
        return 0 if res.ok else 1
    if args.cmd == "refresh":
        from verl_compat.fork.refresh import refresh

        res = refresh(layout, into=args.into)
        for n in res.written:
            print(f"wrote patches/{n}")
        for u in res.unassigned:
            print(f"UNASSIGNED change at {u}: no patch touches this region; rerun with --into PATCH")
        print(f"refresh: {len(res.written)} written, {len(res.unchanged)} unchanged, {len(res.unassigned)} unassigned")
        return 1 if res.unassigned else 0
    if args.cmd == "rebase":
        from verl_compat.fork.rebase import format_report, rebase_report
        from verl_compat.fork.series import load_series

        reports = rebase_report(layout, args.to)
        print(format_report(args.to, reports, {p.name: p for p in load_series(layout)}))
        return 1 if any(r.status == "conflict" for r in reports) else 0
    raise AssertionError(args.cmd)
