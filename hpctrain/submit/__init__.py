"""Login-node submission: ``python -m hpctrain.submit`` (no torch import on this path)."""

from hpctrain.submit.config import SubmitConfig, parse_time

__all__ = ["SubmitConfig", "parse_time"]
