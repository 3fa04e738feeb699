"""What runs on every task: derive the rank, start the process group, call ``entry(ctx)``, clean up.

:class:`Runner` is the callable that submitit pickles on the login node and calls on each task, so
this module must stay importable without torch (torch is imported inside ``__call__``). The plain
sbatch templates reach the same code through ``python -m hpctrain.launch``.
"""

from __future__ import annotations

import dataclasses
import importlib
import os
import socket
import sys
import time
import typing as tp
from pathlib import Path

from hpctrain._atomic import atomic_write_json
from hpctrain.errors import UsageError

__all__ = ["Runner", "load_entry", "split_entry"]


def split_entry(entry: str) -> tp.Tuple[str, str]:
    """``"pkg.mod:fn"`` -> ``("pkg.mod", "fn")``; anything else is a UsageError naming --entry."""
    if len(entry) > 1000:  # a name no filesystem holds; keep the error line short
        raise UsageError(f"--entry {entry[:40]!r}... is {len(entry)} characters; name a module:function")
    module, sep, func = entry.partition(":")
    if not sep or not module or not func or not all(p.isidentifier() for p in module.split(".") + func.split(".")):
        raise UsageError(f"--entry {entry!r} is not of the form 'package.module:function'")
    return module, func


def load_entry(entry: str) -> tp.Callable[..., tp.Any]:
    """Import ``module:function`` (on the node) and return the function."""
    module_name, func = split_entry(entry)
    try:
        obj: tp.Any = importlib.import_module(module_name)
    except Exception as exc:
        raise UsageError(f"--entry {entry!r}: importing {module_name!r} failed: {type(exc).__name__}: {exc}") from exc
    for part in func.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise UsageError(f"--entry {entry!r}: {module_name!r} has no attribute {func!r}") from None
    if not callable(obj):
        raise UsageError(f"--entry {entry!r} is not callable")
    return tp.cast(tp.Callable[..., tp.Any], obj)


def _local_address(master_addr: str, port: int) -> str:
    """The address this host uses to reach the master: proves which network a task sits on."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((master_addr, port))  # UDP connect sends nothing; it only picks the route
            return str(s.getsockname()[0])
    except OSError:
        return ""


class Runner:
    """The job body: ``Runner(entry=..., run_dir=...)()`` on every task.

    Parameters are plain strings and numbers so that the pickle submitit writes stays small and
    loads on the nodes without hpctrain's torch-side modules.
    """

    def __init__(
        self,
        *,
        entry: str,
        run_dir: str,
        entry_args: tp.Sequence[str] = (),
        gpus_per_node: int = 0,
        dist_timeout_s: float = 600.0,
    ) -> None:
        split_entry(entry)
        self.entry = entry
        self.run_dir = str(run_dir)
        self.entry_args = tuple(entry_args)
        self.gpus_per_node = int(gpus_per_node)
        self.dist_timeout_s = float(dist_timeout_s)

    def __repr__(self) -> str:
        return f"Runner(entry={self.entry!r}, run_dir={self.run_dir!r})"

    def __call__(self) -> tp.Any:
        started = time.time()  # before torch is imported: the records show what start-up costs
        # Before torch loads: c10d warns about every peer whose reverse DNS fails (common on clusters).
        os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
        from hpctrain.launch.context import RunContext
        from hpctrain.runtime import env as dist_env
        from hpctrain.runtime import process_group

        env = dist_env.from_environ()
        device = process_group.select_device(env, self.gpus_per_node)
        backend = process_group.init_process_group(env, device, timeout_s=self.dist_timeout_s)
        joined = time.time()
        try:
            process_group.check_distinct_gpus(env, device)
            ctx = RunContext(
                **{f.name: getattr(env, f.name) for f in dataclasses.fields(env)},
                run_dir=Path(self.run_dir),
                device=device,
                backend=backend,
                hostname=socket.gethostname(),
                args=self.entry_args,
            )
            self._record_rank(ctx, started, joined)
            print(
                f"hpctrain: rank {ctx.rank}/{ctx.world_size} on {ctx.hostname} (node {ctx.node_rank}, "
                f"local {ctx.local_rank}, {device}, {backend}) joined {ctx.master_addr}:{ctx.master_port} "
                f"in {joined - started:.2f}s; calling {self.entry}",
                flush=True,
            )
            fn = load_entry(self.entry)
            result = fn(ctx)
        except BaseException:
            process_group.destroy_process_group(synchronize=False)
            raise
        process_group.destroy_process_group()
        return result

    def _record_rank(self, ctx: tp.Any, started: float, joined: float) -> None:
        """``run_dir/ranks/<job>-r<restart>/rank-<N>.json``: what the login-node tools read about each task."""
        folder = Path(self.run_dir) / "ranks" / f"{ctx.job_id or 'local'}-r{ctx.restart_count}"
        folder.mkdir(parents=True, exist_ok=True)
        atomic_write_json(
            folder / f"rank-{ctx.rank}.json",
            {
                "rank": ctx.rank,
                "local_rank": ctx.local_rank,
                "node_rank": ctx.node_rank,
                "world_size": ctx.world_size,
                "hostname": ctx.hostname,
                "address": _local_address(ctx.master_addr, ctx.master_port),
                "pid": os.getpid(),
                "device": str(ctx.device),
                "backend": ctx.backend,
                "job_id": ctx.job_id,
                "restart_count": ctx.restart_count,
                "started_at": started,
                "joined_at": joined,
                "python": sys.executable,
            },
        )


def main(argv: tp.Optional[tp.Sequence[str]] = None) -> int:
    """``srun python -m hpctrain.launch --entry mod:fn --run-dir DIR [--gpus-per-node N] -- ARGS``."""
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m hpctrain.launch", description="Run an hpctrain entry on this task (use under srun)."
    )
    parser.add_argument("--entry", required=True, help="module:function taking a RunContext")
    parser.add_argument("--run-dir", required=True, help="run directory shared by all nodes")
    parser.add_argument("--gpus-per-node", type=int, default=0)
    parser.add_argument("--dist-timeout", type=float, default=600.0, help="seconds to wait for all ranks")
    args, rest = parser.parse_known_args(argv)
    if rest and rest[0] == "--":
        rest = rest[1:]
    Runner(
        entry=args.entry,
        run_dir=args.run_dir,
        entry_args=rest,
        gpus_per_node=args.gpus_per_node,
        dist_timeout_s=args.dist_timeout,
    )()
    return 0
