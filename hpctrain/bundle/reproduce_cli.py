"""``python -m hpctrain reproduce run BUNDLE --data PATH... [-o NEW] [submit flags] [--from-checkpoint]
[--steps K] [--json]`` (short form: ``reproduce BUNDLE ...``):
rebuild a bundled run and submit it again, then compare its loss with the recorded one.

On the login node, without torch, in this order (nothing is written before the checks pass):

1. **verify** the bundle (:func:`hpctrain.bundle.verify.verify_bundle`; a tar is unpacked once, member by
   member, beside the new run directory): a failed check is exit 1 naming it, a path that is not a bundle exit 2;
2. **data**: map the run's recorded input files (the identity record's ``data`` section) to the ``--data``
   paths, by file name, else by order, and check each against its fingerprint: the cheap tier, then the sampled
   content tier (:mod:`hpctrain.bundle.inputs`); a mismatch is exit 1 naming the file and what differs;
3. **environment**: the recorded Python, hpctrain, torch and distributions against this one
   (:mod:`hpctrain.bundle.envdiff`), a table; the CPU threads each rank ran with are pinned for the job
   (``OMP_NUM_THREADS``: another count splits a GEMM's sums otherwise, and the last bits differ);
4. **code**: rebuild every repository of the code snapshot into ``NEW/code/<repository>/``
   (:func:`hpctrain.identity.snapshot.restore_snapshot`: the archived commit, re-created as a git commit, with the
   run's uncommitted changes and untracked files laid over it), checked against the recorded hashes; the job
   runs the entry from that tree, ahead of anything installed (``SubmitConfig.code_path``: the Runner puts it
   first on ``sys.path``), in the tree's equivalent of the directory it was submitted from;
5. **submit** the recorded settings (``submission.json``'s config, written as ``NEW/code/submit.toml``), with
   the entry arguments that named the old input files (or paths inside the old run directory) rewritten, through
   the normal path (:func:`hpctrain.submit.cli.main`): flags given here override, ``--cluster``, ``--follow``
   and the rest work as in ``hpctrain.submit``;
   a containerised run is submitted with its recorded image, runtime and mounts, once the image's digest now
   (:func:`hpctrain._container.image_record`, what submit recorded) equals the identity's: a different one is
   one line naming both, exit 2, nothing submitted, unless ``--accept-image-digest`` (then the record says so);
6. ``--from-checkpoint``: the bundled checkpoint is hard-linked (or copied) into the new run's checkpoint
   directory and verified, so the Trainer resumes from it; ``--steps K`` replays K steps from it (entries that
   take ``--steps`` as the **total** step count get the bundled step + K);
7. **compare** the loss of every recorded interval the reproduction covers with its own
   (:mod:`hpctrain.bundle.loss_intervals`) once the job has ended (a local job, or Slurm with ``--follow``);
   exit 1 when one differs. Later: ``python -m hpctrain reproduce compare NEW``.

``-o/--output NEW`` is the new run directory (``--run-dir``, the older spelling, is accepted too); it must
not exist yet (a reproduction never resumes or replaces a run, so there is no ``--force``).

This module is the command line (the arguments, ``main``); the steps above are
:class:`hpctrain.bundle.reproduce_steps.Reproduction`'s, the settings handed to ``hpctrain.submit``
:mod:`hpctrain.bundle.submit_settings`'s, the record and the comparison (``reproduce compare``)
:mod:`hpctrain.bundle.loss_compare`'s. The pieces taken from the bundle (verify, code, checkpoint, threads) are
:mod:`hpctrain.bundle.unpack`'s.
Nothing of the bundle is imported or executed here, except the entry, which ``hpctrain.submit`` imports in a
child interpreter as for any submission, and which the job runs. What reproduce did is in
``NEW/code/reproduce.json`` (:data:`RECORD`).
"""

from __future__ import annotations

import argparse
import sys
import typing as tp

from hpctrain._cli import add_json_flag, add_subcommands, command_parser, implicit_subcommand
from hpctrain.bundle.loss_compare import RECORD, RECORD_SCHEMA, _compare_arguments, _compare_main, compare_run
from hpctrain.bundle.reproduce_steps import Reproduction
from hpctrain.bundle.submit_settings import _NOT_PASSED, SUBMIT_TOML

__all__ = ["main", "build_parser", "RECORD", "SUBMIT_TOML", "RECORD_SCHEMA", "compare_run"]

_SUBCOMMANDS = ("run", "compare")

_DESCRIPTION = """\
Rebuild a bundled run and submit it again: verify the bundle, check the data you give against the recorded
fingerprints, show how this environment differs from the recorded one, rebuild the code (the commit, the
uncommitted changes, the untracked files) into NEW/code/ and run the entry from it, submit the recorded
settings, and compare the loss of every recorded interval with the reproduction's.

  python -m hpctrain reproduce run BUNDLE --data PATH... [-o NEW] [submit flags] [--json]
  python -m hpctrain reproduce run BUNDLE --data PATH... --from-checkpoint  # resume from the bundled checkpoint
  python -m hpctrain reproduce run BUNDLE --data PATH... --steps K          # replay K steps from it and compare
  python -m hpctrain reproduce compare RUN_DIR [--json]                     # compare a reproduction that ended

A run that ran in a container is resubmitted with the same image, runtime and mounts; an image whose digest
differs from the recorded one is refused unless --accept-image-digest.

`reproduce BUNDLE ...` is short for `reproduce run BUNDLE ...` when BUNDLE exists and is not "run" or
"compare" (a bundle named "compare": `reproduce run compare ...`, or ./compare).

--steps K gives the entry `--steps <bundled step + K>`: entries that take --steps as the total step count (the
demo, the Trainer's TrainConfig.steps). On CPU the loss is expected to match bit for bit (--tolerance 0).
Exit 0 ok, 1 a failed check, job or comparison, 2 bad input."""


# ---------------------------------------------------------------------------------------------- the command line
def build_parser() -> argparse.ArgumentParser:
    p = command_parser("reproduce", _DESCRIPTION)
    sub = add_subcommands(p)
    r = sub.add_parser(
        "run",
        help="rebuild a bundled run, submit it again, compare its loss (the default: `reproduce BUNDLE ...`)",
        description="Rebuild a bundled run and submit it again, then compare its loss with the recorded one.",
    )
    _run_arguments(r)
    c = sub.add_parser(
        "compare",
        help="compare a reproduction's loss with the bundled run's, once it ended",
        description="Compare a reproduction's loss with the bundled run's, once it ended.",
    )
    _compare_arguments(c)
    return p


def _run_arguments(p: argparse.ArgumentParser) -> None:
    from hpctrain.submit.cli import build_parser as submit_parser

    p.add_argument("bundle", metavar="BUNDLE", help="a bundle directory or its tar (python -m hpctrain bundle)")
    p.add_argument("--data", nargs="+", default=[], metavar="PATH", help="your copies of the run's input files")
    # -o/--output NEW, never --force: a reproduction is a new run directory; it never replaces one
    p.add_argument(
        "-o",
        "--output",
        dest="run_dir",
        metavar="DIR",
        help="write the new run directory to DIR (default runs/<job-name>-reproduce-<time>); it must not exist",
    )
    p.add_argument("--run-dir", dest="run_dir", metavar="DIR", help=argparse.SUPPRESS)
    p.add_argument(
        "--from-checkpoint", action="store_true", help="resume from the bundled checkpoint instead of from scratch"
    )
    p.add_argument(
        "--steps",
        type=int,
        metavar="K",
        help="replay K steps from the bundled checkpoint and compare them (implies --from-checkpoint)",
    )
    p.add_argument(
        "--tolerance",
        type=float,
        default=0.0,
        metavar="REL",
        help="relative loss difference accepted (default 0: bit-exact, what CPU runs give)",
    )
    p.add_argument(
        "--accept-image-digest",
        action="store_true",
        help="a container image whose digest differs from the recorded one: reproduce with it anyway (recorded)",
    )
    add_json_flag(p)
    group = p.add_argument_group("submit flags (as python -m hpctrain.submit; they override the recorded settings)")
    for action in submit_parser()._actions:
        if action.dest in _NOT_PASSED or action.dest == "help":
            continue
        group._add_action(action)


def main(argv: tp.Optional[tp.Sequence[str]] = None) -> int:
    args = implicit_subcommand(sys.argv[1:] if argv is None else argv, _SUBCOMMANDS, "run")
    opts = build_parser().parse_args(args)
    if opts.cmd == "compare":
        return _compare_main(opts)
    return Reproduction(opts).run()
