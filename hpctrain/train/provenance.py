"""What the Trainer adds to the run's identity at each start (docs/bundle.md, "Run identity").

The Runner's rank 0 wrote this attempt's identity record (code, submitted config, runtime) before the entry
ran; the Trainer knows the rest: the training config and seed it runs with, and the input files. Rank 0
records them; a changed input (the files' fingerprints against the previous attempt's) stops every rank
together with rank 0's one line, unless ``TrainConfig.accept_data_change`` accepts it. Anything else that
goes wrong while recording is one warning line: identity must never cost a run.
"""

from __future__ import annotations

import os
import sys
import typing as tp
from pathlib import Path

from hpctrain.errors import UsageError

__all__ = ["record_training_identity", "input_files"]

ACCEPT_HINT = "TrainConfig.accept_data_change=True (the demo: --accept-data-change)"


def input_files(*datas: tp.Any) -> tp.List[str]:
    """The files of every HDF5 data config among ``datas`` (a data factory has none), in order, once each."""
    out: tp.List[str] = []
    for data in datas:
        for f in getattr(data, "files", None) or ():
            path = os.fspath(f)
            if path not in out:
                out.append(path)
    return out


def _any_rank(ctx: tp.Any, flag: bool) -> bool:
    """True on every rank when ``flag`` is True on any (the run context's agreement); local without one."""
    agree = getattr(ctx, "agree", None)
    return bool(agree(int(flag), "max")) if callable(agree) else flag


def record_training_identity(
    ctx: tp.Any, run_dir: Path, config: tp.Any, data: tp.Any, eval_data: tp.Any, *, rank: int
) -> tp.Optional[tp.Dict[str, tp.Any]]:
    """Record the training config, seed and input files (rank 0); the identity fields that the ledger,
    metrics and checkpoint records carry (``RunIdentity.as_record``), or None where none was recorded.
    Every rank must call it: a data-change refusal is agreed so that no rank is left in a collective."""
    refusal, ident = "", None
    if rank == 0:
        from hpctrain import identity

        job, restart = str(getattr(ctx, "job_id", "") or ""), int(getattr(ctx, "restart_count", 0) or 0)
        try:
            ident = identity.record_config(run_dir, job, restart, train=config.to_dict(), seed=config.seed)
            files = input_files(data, eval_data)
            if files:
                ident = identity.record_data(
                    run_dir, job, restart, files, accept_change=config.accept_data_change, accept_hint=ACCEPT_HINT
                )
        except UsageError as exc:
            refusal = str(exc)
        except Exception as exc:  # noqa: BLE001 - a record we could not write is a warning, not a lost run
            print(f"hpctrain.train: warning: could not record the run identity: {exc}", file=sys.stderr, flush=True)
    if _any_rank(ctx, bool(refusal)):
        raise UsageError(refusal or "rank 0 refused to resume: the input data changed (its log names the file)")
    if ident is None:
        return None
    if ident.changed:
        print(
            f"hpctrain.train: the run identity changed since {ident.previous_attempt}: {', '.join(ident.changed)}"
            f" ({ident.short})",
            file=sys.stderr,
            flush=True,
        )
    return ident.as_record()
