"""Real rank processes (gloo group) and a preempted parent: the things a single process cannot show."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from tests.multiproc import run_world

ROOT = Path(__file__).resolve().parents[2]


def _consume(rank, world_size, files, workers, state, stop_after):
    """Runs on each rank: rank/world come from the initialised process group (no arguments)."""
    import torch.distributed as dist

    from hpctrain.data import H5DataConfig, H5Loader
    from hpctrain.data.synth import sample_ids

    cfg = H5DataConfig(
        files=files,
        keys=("x", "y"),
        global_batch_size=48,
        seed=11,
        partitions=4,
        tail="pad",
        num_workers=workers,
        start_method="forkserver",
        window_chunks=4,
    )
    seen = []
    with H5Loader(cfg) as loader:
        assert (loader.rank, loader.world_size) == (dist.get_rank(), dist.get_world_size())
        loader.load_state_dict(state)
        for step, batch in enumerate(loader):
            idx = batch["index"]
            assert (sample_ids(batch["x"]) == idx.numpy()).all()
            seen += idx.tolist()
            if stop_after is not None and step + 1 == stop_after:
                break
        return seen, loader.state_dict(), len(loader)


def test_resume_audit_across_real_world_sizes(files):
    """2 ranks x 2 workers stop mid-epoch; 4 ranks x 1 worker finish it: every sample once, pads aside."""
    f = files["multi"]
    first = run_world(_consume, 2, f, 2, {}, 7)
    states = [r[1] for r in first.results]
    assert states[0] == states[1] and states[0]["samples_consumed"] == 7 * 48
    second = run_world(_consume, 4, f, 1, json.loads(json.dumps(states[0])), None)
    per_rank_batches = {len(r[0]) for r in second.results}
    assert len(per_rank_batches) == 1  # equal batches per rank
    seen = sum((r[0] for r in first.results + second.results), [])
    nb = first.results[0][2]
    assert len(seen) == nb * 48
    assert set(seen) == set(range(1000)) and len(seen) - 1000 == nb * 48 - 1000  # only the pad repeats


CHILD = textwrap.dedent("""
    import sys, time
    from hpctrain.data import H5DataConfig, H5Loader
    cfg = H5DataConfig(files=sys.argv[1:], keys=("x",), global_batch_size=8, num_workers=2,
                       start_method=__START__)
    loader = H5Loader(cfg, rank=0, world_size=1)
    it = iter(loader)
    next(it)
    print(" ".join(map(str, loader.worker_pids())), flush=True)
    time.sleep(600)
""")


@pytest.mark.parametrize("method", ["fork", "forkserver"])
def test_workers_exit_when_the_training_process_is_killed(files, method):
    code = CHILD.replace("__START__", repr(method))
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen([sys.executable, "-c", code, *files["gzip"]], stdout=subprocess.PIPE, text=True, env=env)
    try:
        pids = [int(p) for p in proc.stdout.readline().split()]
        assert len(pids) == 2
        proc.send_signal(signal.SIGKILL)  # preemption: no cleanup code runs in the parent
        proc.wait(10)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            alive = [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
            if not alive:
                break
            time.sleep(0.2)
        assert not alive, f"orphan data workers {alive}"
    finally:
        if proc.poll() is None:
            proc.kill()
