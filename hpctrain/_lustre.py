"""The one seam between hpctrain and the Lustre client command ``lfs`` (``setstripe``, ``getstripe``).

:class:`LustreCommands` runs the real ``lfs``; tests pass a fake with the same :meth:`run`
(:class:`hpctrain.testing.FakeLustre`), as :class:`hpctrain._slurm.SlurmCommands` does for Slurm. Striping is
a performance hint everywhere hpctrain uses it: where ``lfs`` is missing or fails, the caller goes on
with the filesystem's default layout. Stdlib only (login-node tools use it).
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import typing as tp

from hpctrain.errors import HpctrainError

__all__ = ["LustreCommands", "LustreCommandError", "Stripe"]

log = logging.getLogger("hpctrain.lustre")


class LustreCommandError(HpctrainError):
    """``lfs`` is missing, timed out or failed."""


class Stripe(tp.NamedTuple):
    count: int
    """OSTs the file is striped over (-1: all)."""
    size: int
    """Stripe size in bytes."""

    def __str__(self) -> str:
        return f"{self.count} x {self.size // 1024} KiB"


class LustreCommands:
    """Run ``lfs``; override :meth:`run` (or pass a fake) in tests."""

    timeout_s = 60.0

    def available(self) -> bool:
        return shutil.which("lfs") is not None

    def run(self, argv: tp.Sequence[str]) -> str:
        """Run ``lfs ARGV...``; return stdout, or raise :class:`LustreCommandError`."""
        if not self.available():
            raise LustreCommandError("lfs is not on PATH (not a Lustre client)")
        try:
            proc = subprocess.run(["lfs", *argv], capture_output=True, text=True, timeout=self.timeout_s)
        except subprocess.TimeoutExpired:
            raise LustreCommandError(f"lfs {' '.join(argv)} did not answer in {self.timeout_s:.0f}s") from None
        except OSError as exc:
            raise LustreCommandError(f"lfs {' '.join(argv)}: {exc.strerror or exc}") from None
        if proc.returncode != 0:
            detail = (proc.stderr or proc.stdout).strip().splitlines()
            raise LustreCommandError(
                f"lfs {' '.join(argv)} failed: {detail[-1] if detail else f'exit {proc.returncode}'}"
            )
        return proc.stdout

    def create_striped(self, path: tp.Union[str, os.PathLike], args: tp.Sequence[str]) -> bool:
        """Create the new, empty file ``path`` with ``lfs setstripe ARGS``; False (nothing left behind) when
        ``args`` is empty, ``lfs`` is missing or it fails: the caller then creates the file itself."""
        if not args or not self.available():
            return False
        try:
            self.run(["setstripe", *args, os.fspath(path)])
        except LustreCommandError as exc:
            log.warning("hpctrain: %s (continuing with the default layout)", exc)
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
            return False
        return os.path.exists(path)

    def stripe(self, path: tp.Union[str, os.PathLike]) -> tp.Optional[Stripe]:
        """The file's stripe count and size, or None off Lustre (or when ``lfs`` cannot tell)."""
        if not self.available():
            return None
        try:
            parts = self.run(["getstripe", "-c", "-S", os.fspath(path)]).split()
        except LustreCommandError:
            return None
        if len(parts) < 2 or not all(p.lstrip("-").isdigit() for p in parts[:2]):
            return None
        return Stripe(int(parts[0]), int(parts[1]))
