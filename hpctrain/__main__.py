"""``python -m hpctrain <command> ...``: one front door for the login-node tools.

Each command lives in its own module and is imported only when asked for, so that ``ckpt ls`` or
``data inspect`` never pay for (or need) torch. Every command follows ``hpctrain._cli``: one error
line ``hpctrain <command>: error: ...``, exit 0 ok / 1 failed check / 2 bad input, ``--json`` reports.
"""

from __future__ import annotations

import importlib
import sys
import typing as tp

from hpctrain._cli import EXIT_USAGE, run_main

# command -> (module with ``main(argv) -> int``, one-line help)
COMMANDS: tp.Dict[str, tp.Tuple[str, str]] = {
    "submit": ("hpctrain.submit.cli", "submit a training job to Slurm (or run it locally)"),
    "ckpt": ("hpctrain.ckpt.cli", "list, verify, digest and clean checkpoints"),
    "data": ("hpctrain.data.cli", "inspect, hash and synthesise HDF5 inputs"),
    "status": ("hpctrain.status.cli", "where a training run stands: job, progress, throughput, checkpoints, ledger"),
    "capacity": (
        "hpctrain.capacity.cli",
        "nodes, time to train, GPU-hours, checkpoint interval: predicted from calibration runs",
    ),
    "approve": ("hpctrain.approvals", "approve or reject a committed checkpoint in the run's hash-chained log"),
    "bundle": ("hpctrain.bundle.cli", "write a run's recoverable bundle (RO-Crate), or verify one"),
    "report": ("hpctrain.report.cli", "one self-contained HTML report of a run: curves, breakdown, ranks, ledger"),
    "export-tensorboard": ("hpctrain.report.tensorboard", "write a run's metrics as TensorBoard event files"),
    "reproduce": ("hpctrain.bundle.reproduce_cli", "rebuild a bundled run, submit it again, compare its loss"),
    "logs": ("hpctrain.logs.cli", "the log of any rank of any attempt of a run; --all, --errors, --follow"),
    "runs": ("hpctrain.runs.cli", "every run you submitted: state, step, loss, checkpoint, run dir (one squeue)"),
    "cancel": ("hpctrain.cancel", "cancel a run's job, recorded and never requeued; --save checkpoints first"),
}


def _usage() -> str:
    lines = ["usage: python -m hpctrain <command> [args...]", "", "commands:"]
    width = max(map(len, COMMANDS))
    lines += [f"  {name:<{width}}  {text}" for name, (_, text) in COMMANDS.items()]
    lines += ["", "python -m hpctrain <command> --help for the command's own flags"]
    return "\n".join(lines)


def main(argv: tp.Optional[tp.Sequence[str]] = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print(_usage(), file=sys.stdout if args else sys.stderr)
        return 0 if args else EXIT_USAGE
    name, rest = args[0], args[1:]
    if name not in COMMANDS:
        print(f"hpctrain: error: unknown command {name!r}; choose one of {', '.join(COMMANDS)}", file=sys.stderr)
        return EXIT_USAGE
    module = importlib.import_module(COMMANDS[name][0])
    return run_main(module.main, name, rest)


def run() -> None:
    """Console-script entry (``hpctrain ...``)."""
    sys.exit(main())


if __name__ == "__main__":
    run()
