"""Run identity: what code, config, data and environment a run ran with, and who owns it (docs/bundle.md).

Stdlib only at import (plus h5py/numpy when data is fingerprinted); torch only inside the functions that
run on the nodes. The login node calls :func:`capture_submit`; rank 0 calls :func:`capture_start` at every
start; the Trainer calls :func:`record_data` and :func:`record_config`, and carries
:meth:`RunIdentity.as_record` into its ledger, metrics and checkpoint records.

:func:`capture_submit` and :func:`capture_start` here are :mod:`hpctrain.identity.manifest`'s with the user's
deny-list of secret files (``[run] secret_patterns``, :mod:`hpctrain.identity.redact`) in effect: the submit
config's at submission, the submitted one (``submission.json``) at a start.
"""

from __future__ import annotations

import functools
import typing as tp
from pathlib import Path

from hpctrain.identity import manifest as _manifest
from hpctrain.identity.manifest import (
    SCHEMA,
    RunIdentity,
    attempt_history,
    current_identity,
    identity_hash,
    ownership_record,
    record_config,
    record_data,
    require_clean,
)
from hpctrain.identity.redact import using_patterns

__all__ = [
    "SCHEMA",
    "RunIdentity",
    "attempt_history",
    "capture_start",
    "capture_submit",
    "current_identity",
    "identity_hash",
    "ownership_record",
    "record_config",
    "record_data",
    "require_clean",
]


@functools.wraps(_manifest.capture_submit)
def capture_submit(cfg: tp.Any, *args: tp.Any, **kwargs: tp.Any) -> tp.Dict[str, tp.Any]:
    with using_patterns(getattr(cfg, "secret_patterns", None)):
        return _manifest.capture_submit(cfg, *args, **kwargs)


def _submitted_patterns(run_dir: tp.Union[str, Path]) -> tp.Optional[tp.List[str]]:
    """The deny-list the run was submitted with (None: none, or no readable submission record)."""
    from hpctrain.identity.redact import check_secret_patterns
    from hpctrain.rundir import RunDir, read_json

    try:
        record = read_json(RunDir(run_dir).submission, []) or {}
        config = record.get("config") if isinstance(record.get("config"), dict) else {}
        return list(check_secret_patterns(config.get("secret_patterns"))) or None
    except Exception:  # a damaged record: the default rule still applies (a start never fails on this)
        return None


@functools.wraps(_manifest.capture_start)
def capture_start(run_dir: tp.Union[str, Path], *args: tp.Any, **kwargs: tp.Any) -> tp.Dict[str, tp.Any]:
    with using_patterns(_submitted_patterns(run_dir)):
        return _manifest.capture_start(run_dir, *args, **kwargs)
