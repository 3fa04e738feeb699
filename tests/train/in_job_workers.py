"""What the Trainer's in-job recovery tests share (test_in_job_trainer.py, test_in_job_shrink.py): each process
is what the Runner would start (a rank joins a default gloo group from the launcher's address and gets a
RunContext with a stop agreement; a warm spare, ``HPCTRAIN_RECOVERY_SPARE``, gets one without a group), and the
recovery's TCPStore is served by the test, which outlives every rank (on Slurm: the batch script's process)."""

from __future__ import annotations

import os
import typing as tp
from pathlib import Path

from tests.multiproc import free_port, report_to, run_roles

QUICK = {"collective_timeout_s": 20.0, "agree_timeout_s": 40.0, "dead_after_s": 1.0, "heartbeat_s": 0.1}
"""RecoveryConfig timeouts short enough for a test, long enough for a loaded 2-core machine."""

Fit = tp.Callable[[str, int, int, int, str, str, tp.Dict[str, tp.Any]], tp.Any]
"""``fit(role, index, world, master_port, run_dir, h5, opts)``: a process's work; its result is reported."""


def rank_context(role: str, index: int, world: int, master_port: int, run_dir: str, *, job_id: str,
                 restart_count: int = 0) -> tp.Any:  # fmt: skip
    """A rank's RunContext after joining the default gloo group (a spare's: rank -1, no group)."""
    import datetime

    import torch
    import torch.distributed as dist

    from hpctrain.launch.context import RunContext
    from hpctrain.runtime.preemption import StopAgreement, StopSignals

    torch.set_num_threads(1)
    if role == "rank":
        dist.init_process_group(
            "gloo",
            init_method=f"tcp://127.0.0.1:{master_port}",
            rank=index,
            world_size=world,
            timeout=datetime.timedelta(seconds=120),
        )
    return RunContext(
        rank=index if role == "rank" else -1,
        local_rank=0,
        world_size=world,
        local_world_size=1,
        node_rank=0,
        num_nodes=world,
        master_addr="127.0.0.1",
        master_port=master_port,
        job_id=job_id,
        restart_count=restart_count,
        hostnames=("host",),
        launcher="single",
        run_dir=Path(run_dir),
        device=torch.device("cpu"),
        backend="gloo",
        hostname="host",
        stop=StopAgreement(StopSignals()),
    )


def _process(role, index, fit, world, master_port, store_port, run_dir, h5, opts, out):  # pragma: no cover - child
    os.environ["TORCH_CPP_LOG_LEVEL"] = "ERROR"
    os.environ["HPCTRAIN_RECOVERY_STORE"] = f"127.0.0.1:{store_port}"
    if role == "spare":
        os.environ["HPCTRAIN_RECOVERY_SPARE"] = str(index)
    report_to(out, lambda: fit(role, index, world, master_port, run_dir, h5, opts))


def launch(fit: Fit, world: int, spares: int, run_dir: Path, h5: str, opts: tp.Dict[str, tp.Any],
           timeout: float = 150.0) -> tp.Tuple[tp.Dict[tp.Any, tp.Any], tp.Dict[tp.Any, tp.Optional[int]]]:  # fmt: skip
    """``world`` ranks and ``spares`` warm spares running ``fit`` (a module-level function: it is pickled by name),
    with the recovery store served from here; ``(results, exit codes)`` by role as :func:`run_roles` gives them."""
    import torch.distributed as dist

    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    who = [("rank", r) for r in range(world)] + [("spare", i) for i in range(spares)]
    args = (fit, world, free_port(), store.port, str(run_dir), h5, opts)
    got = run_roles(_process, who, args, timeout=timeout)
    del store
    return got


def tensorboard_steps(run_dir: Path, tag: str) -> tp.List[int]:
    """The steps the TensorBoard UI's reader sees for ``tag`` in the run's live event files (``purge_step``
    honoured; tests/train/test_tensorboard_live.py reads them the same way)."""
    from tensorboard.backend.event_processing import plugin_event_multiplexer as pem

    mux = pem.EventMultiplexer()
    mux.AddRunsFromDirectory(str(run_dir / "tensorboard"))
    mux.Reload()
    assert list(mux.Runs()) == ["."]  # one TensorBoard run
    return [e.step for e in mux.Tensors(".", tag)]
