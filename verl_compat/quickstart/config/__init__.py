"""Hydra configs of the default job (a package so `pkg://verl_compat.quickstart.config` finds them)."""
