"""Fork tooling: the pinned upstream verl wheel plus `patches/series`, materialised into `verl/`.

This package must import with the standard library only: setup.py runs it before any dependency exists.
"""
