"""Run identity: what code, config, data and environment a run ran with, and who owns it (docs/bundle.md).

Stdlib only at import (plus h5py/numpy when data is fingerprinted); torch only inside the functions that
run on the nodes. The login node calls :func:`capture_submit`; rank 0 calls :func:`capture_start` at every
start; the Trainer calls :func:`record_data` and :func:`record_config`, and carries
:meth:`RunIdentity.as_record` into its ledger, metrics and checkpoint records.
"""

from hpctrain.identity.manifest import (
    SCHEMA,
    RunIdentity,
    attempt_history,
    capture_start,
    capture_submit,
    current_identity,
    identity_hash,
    ownership,
    record_config,
    record_data,
    require_clean,
)

__all__ = [
    "SCHEMA",
    "RunIdentity",
    "attempt_history",
    "capture_start",
    "capture_submit",
    "current_identity",
    "identity_hash",
    "ownership",
    "record_config",
    "record_data",
    "require_clean",
]
