"""``python -m hpctrain <command> ...``: one front door for the login-node tools.

Each command lives in its own module and is imported only when asked for, so that ``ckpt ls`` or
``data inspect`` never pay for (or need) torch.
"""

from __future__ import annotations

import importlib
import sys
import typing as tp

# command -> (module with ``main(argv) -> int``, one-line help)
COMMANDS: tp.Dict[str, tp.Tuple[str, str]] = {
    "submit": ("hpctrain.submit.cli", "submit a training job to Slurm (or run it locally)"),
    "ckpt": ("hpctrain.ckpt.cli", "list, verify, digest and clean checkpoints"),
    "data": ("hpctrain.data.cli", "inspect HDF5 inputs and synthesise demo datasets"),
}


def _usage() -> str:
    lines = ["usage: python -m hpctrain <command> [args...]", "", "commands:"]
    lines += [f"  {name:<8} {text}" for name, (_, text) in COMMANDS.items()]
    return "\n".join(lines)


def main(argv: tp.Optional[tp.Sequence[str]] = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print(_usage())
        return 0 if args else 2
    name, rest = args[0], args[1:]
    if name not in COMMANDS:
        print(f"hpctrain: error: unknown command {name!r}; choose one of {', '.join(COMMANDS)}", file=sys.stderr)
        return 2
    module = importlib.import_module(COMMANDS[name][0])
    return int(module.main(rest) or 0)


def run() -> None:
    """Console-script entry: errors become one line on stderr and a non-zero exit."""
    from hpctrain._errors import cli_entry

    cli_entry(main, "hpctrain")


if __name__ == "__main__":
    run()
