"""A fake of ``lfs`` behind :class:`hpctrain._lustre.LustreCommands`: records calls, keeps stripes in memory."""

from __future__ import annotations

import os
import typing as tp

from hpctrain._lustre import LustreCommandError, LustreCommands


class FakeLustre(LustreCommands):
    def __init__(self, *, fail: bool = False, default: tp.Tuple[int, int] = (1, 1 << 20)) -> None:
        self.calls: tp.List[tp.List[str]] = []
        self.stripes: tp.Dict[str, tp.Tuple[int, int]] = {}
        self.fail = fail
        self.default = default

    def available(self) -> bool:
        return True

    def run(self, argv: tp.Sequence[str]) -> str:
        argv = list(argv)
        self.calls.append(argv)
        if self.fail:
            raise LustreCommandError(f"lfs {' '.join(argv)} failed: Operation not supported")
        path = argv[-1]
        if argv[0] == "setstripe":
            opts = dict(zip(argv[1:-1:2], argv[2:-1:2]))
            size = opts.get("-S", "1M")
            mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(size[-1:].upper(), 1)
            self.stripes[os.path.realpath(path)] = (int(opts.get("-c", 1)), int(size.rstrip("KMGkmg")) * mult)
            open(path, "xb").close()  # lfs setstripe creates the empty file
            return ""
        if argv[0] == "getstripe":
            count, size = self.stripes.get(os.path.realpath(path), self.default)
            return f"{count}\n{size}\n"
        raise LustreCommandError(f"lfs {argv[0]} is not faked")
