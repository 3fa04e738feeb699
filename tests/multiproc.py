"""Run a function on N real processes with a real gloo process group (the CPU stand-in for NCCL).

Shared by every multi-rank test: ``run_world(fn, 4, arg)`` spawns 4 processes (spawn start method,
so no torch state is inherited), each calls ``fn(rank, world_size, *args)`` after
``init_process_group("gloo")``, and the per-rank return values come back in rank order. A rank that
raises makes the whole call raise with that rank's traceback; a rank that dies (SIGKILL in a fault
injection test) is reported through ``WorldResult.exitcodes`` when ``allow_failures=True``.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import pickle
import tempfile
import traceback
import typing as tp
from dataclasses import dataclass, field
from pathlib import Path

from hpctrain.runtime.ports import free_port

__all__ = ["run_world", "WorldResult", "free_port", "run_roles", "report_to"]


@dataclass
class WorldResult:
    results: tp.List[tp.Any]
    """Per-rank return values (None for a rank that died)."""
    exitcodes: tp.List[tp.Optional[int]]
    """Per-rank process exit codes (negative = killed by that signal)."""
    errors: tp.List[str] = field(default_factory=list)
    """What the ranks that raised reported (their tracebacks), for a test's failure message."""


def _worker(fn, rank, world_size, port, out_dir, init_pg, env, args):  # pragma: no cover - child
    os.environ.update(env)
    os.environ.update(
        RANK=str(rank),
        WORLD_SIZE=str(world_size),
        LOCAL_RANK=str(rank),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        TORCH_CPP_LOG_LEVEL="ERROR",
    )
    out = Path(out_dir) / f"rank{rank}.pkl"
    try:
        if init_pg:
            import datetime

            import torch.distributed as dist

            dist.init_process_group("gloo", rank=rank, world_size=world_size, timeout=datetime.timedelta(seconds=120))
        value = fn(rank, world_size, *args)
        payload = ("ok", value)
    except BaseException as exc:  # noqa: BLE001 - reported to the parent
        payload = ("error", f"rank {rank}: {type(exc).__name__}: {exc}\n{traceback.format_exc()}")
    finally:
        if init_pg:
            # hpctrain's: frees the groups once their gloo workers rest (hpctrain.runtime.gloo_teardown)
            from hpctrain.runtime.process_group import destroy_process_group

            destroy_process_group(synchronize=False)
    out.write_bytes(pickle.dumps(payload))
    os._exit(0 if payload[0] == "ok" else 1)


def run_world(
    fn: tp.Callable[..., tp.Any],
    world_size: int,
    *args: tp.Any,
    timeout: float = 180.0,
    init_pg: bool = True,
    allow_failures: bool = False,
    env: tp.Optional[tp.Dict[str, str]] = None,
) -> WorldResult:
    """Run ``fn(rank, world_size, *args)`` on ``world_size`` spawned processes; see the module doc."""
    ctx = mp.get_context("spawn")
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="hpctrain-world-") as out_dir:
        procs = [
            ctx.Process(target=_worker, args=(fn, r, world_size, port, out_dir, init_pg, env or {}, args))
            for r in range(world_size)
        ]
        for p in procs:
            p.start()
        for p in procs:
            p.join(timeout)
        hung = [r for r, p in enumerate(procs) if p.is_alive()]
        for r in hung:
            procs[r].kill()
            procs[r].join()
        if hung and not allow_failures:
            raise TimeoutError(f"ranks {hung} still running after {timeout}s")
        results: tp.List[tp.Any] = []
        errors: tp.List[str] = []
        for r in range(world_size):
            f = Path(out_dir) / f"rank{r}.pkl"
            if not f.exists():
                results.append(None)
                continue
            status, value = pickle.loads(f.read_bytes())
            if status == "error":
                errors.append(value)
                results.append(None)
            else:
                results.append(value)
        exitcodes = [p.exitcode for p in procs]
    if not allow_failures and (errors or any(c != 0 for c in exitcodes)):
        raise RuntimeError("\n".join(errors) or f"ranks exited with {exitcodes}")
    return WorldResult(results=results, exitcodes=exitcodes, errors=errors)


Role = tp.Tuple[str, int]


def report_to(out: str, run: tp.Callable[[], tp.Any]) -> None:  # pragma: no cover - child
    """In a child of :func:`run_roles`: ``run()``, its result or its error pickled to ``out``, then exit (0: ok)."""
    try:
        payload = ("ok", run())
    except BaseException as exc:  # noqa: BLE001 - reported to the parent
        from hpctrain.runtime.preemption import is_peer_failure

        payload = ("error", {"type": type(exc).__name__, "message": str(exc), "peer_failure": is_peer_failure(exc),
                             "traceback": traceback.format_exc()})  # fmt: skip
    Path(out).write_bytes(pickle.dumps(payload))
    os._exit(0 if payload[0] == "ok" else 1)


def run_roles(
    target: tp.Callable[..., None],
    who: tp.Sequence[Role],
    args: tp.Sequence[tp.Any],
    *,
    timeout: float = 150.0,
    frozen: tp.Optional[Role] = None,
) -> tp.Tuple[tp.Dict[Role, tp.Any], tp.Dict[Role, tp.Optional[int]]]:
    """One spawned process per ``(role, index)`` of ``who`` running ``target(role, index, *args, out)`` (it calls
    :func:`report_to`); ``(results, exit codes)`` by role, a result None where nothing was reported. ``frozen``:
    a process the test stopped (SIGSTOP), not waited for but killed once the others are done, as its node's
    failure would end it. Any other still running after ``timeout`` fails the test."""
    ctx = mp.get_context("spawn")
    with tempfile.TemporaryDirectory(prefix="hpctrain-roles-") as tmp:
        outs = {w: f"{tmp}/{w[0]}{w[1]}.pkl" for w in who}
        procs = {w: ctx.Process(target=target, args=(w[0], w[1], *args, outs[w])) for w in who}
        for p in procs.values():
            p.start()
        for w, p in procs.items():
            if w != frozen:
                p.join(timeout)
        if frozen is not None:
            procs[frozen].kill()
        hung = [w for w, p in procs.items() if p.is_alive() and w != frozen]
        for w in hung:
            procs[w].kill()
            procs[w].join()
        assert not hung, f"still running after {timeout}s: {hung}"
        results = {w: pickle.loads(Path(outs[w]).read_bytes()) if Path(outs[w]).exists() else None for w in who}
        codes = {w: p.exitcode for w, p in procs.items()}
    return results, codes
