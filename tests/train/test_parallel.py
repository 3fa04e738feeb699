"""The Trainer under fsdp / hsdp / ddp on real processes (gloo on CPU): it learns; a stopped run resumed at the
same world size and mode ends bit-identical; a checkpoint moves between world sizes (2 -> 4, 4 -> 2, 4 -> 3
with uneven shards) and modes (fsdp -> ddp, ddp -> fsdp, fsdp -> hsdp) with every parameter in place and the
loss going on as the uninterrupted run's; tied, frozen, tiny and bf16 parameters; activation checkpointing;
the memory and exposed-communication fields.

Four launches (world 2, 4, 3, 2) each run several fits (a launch costs seconds on two cores); the
fixtures run them once for the module, in order, as later ones resume from earlier ones' checkpoints.
"""

from __future__ import annotations

import math

import pytest
import torch

from hpctrain.ckpt.metering import digest
from hpctrain.errors import UsageError
from hpctrain.rundir import RunDir
from tests.multiproc import run_world
from tests.train.parallel_workers import plan

FS = {"mode": "fsdp"}


def _launch(world, root, jobs):
    results = run_world(plan, world, str(root), jobs, timeout=300).results
    for name in results[0]:  # every rank ends at the same step with the same global parameters
        assert len({(r[name]["step"], r[name]["hash"]) for r in results}) == 1, name
    return results[0]


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    from hpctrain.data import make_dataset

    path = tmp_path_factory.mktemp("parallel")
    make_dataset(path / "data.h5", 96, shape=(16,), classes=10)  # 4 batches of 24 an epoch
    return path


@pytest.fixture(scope="module")
def w2(root):
    return _launch(
        2,
        root,
        [
            ("fsdp", dict(steps=6, ckpt_every=3, **FS)),
            ("copy", ("fsdp", "c2")),
            ("fsdp9", dict(dir="fsdp", steps=9, ckpt_every=3, **FS)),  # the uninterrupted run's steps 7..9
            ("stopped", dict(steps=6, ckpt_every=3, stop_at=4, **FS)),  # saved at 3, and at 4 by the stop
            ("resumed", dict(dir="stopped", steps=6, ckpt_every=3, **FS)),
            ("ac", dict(steps=4, activation_checkpoint="full", **FS)),
            ("edges", dict(steps=4, edges=True, grad_clip=0.05, grad_accum=2, mode="hsdp", hsdp_shape=(1, 2))),
            ("edges_ddp", dict(steps=4, edges=True, grad_clip=0.05, grad_accum=2, mode="ddp")),
            ("bf16", dict(steps=4, dtype=torch.bfloat16, **FS)),
            ("hook", dict(steps=4, parallelize="tests.train.parallel_workers:shard_root", **FS)),
            ("h5", dict(steps=6, h5=str(root / "data.h5"), grad_accum=2, **FS)),
            ("h5_ddp", dict(steps=6, h5=str(root / "data.h5"), grad_accum=2, mode="ddp")),
        ],
    )


@pytest.fixture(scope="module")
def w4(root, w2):
    return _launch(
        4,
        root,
        [
            ("copy", ("c2", "c2h")),
            ("from2", dict(dir="c2", steps=9, ckpt_every=3, per_node=2, **FS)),
            ("hsdp_from2", dict(dir="c2h", steps=9, ckpt_every=3, mode="hsdp", per_node=2)),
            ("fsdp4", dict(steps=6, ckpt_every=6, per_node=2, **FS)),
            ("copy", ("fsdp4", "c4")),
            ("copy", ("fsdp4", "c4b")),
            ("fsdp4_9", dict(dir="fsdp4", steps=9, ckpt_every=6, per_node=2, **FS)),
            ("hsdp4", dict(steps=4, mode="hsdp", per_node=2)),
            ("ddp4", dict(steps=6, ckpt_every=6, mode="ddp")),
        ],
    )


@pytest.fixture(scope="module")
def w3(root, w4):
    return _launch(
        3,
        root,
        [
            ("from4", dict(dir="c4", steps=9, ckpt_every=6, **FS)),
            ("ddp_to_fsdp", dict(dir="ddp4", steps=9, ckpt_every=6, **FS)),
        ],
    )


@pytest.fixture(scope="module")
def w2b(root, w4):
    return _launch(2, root, [("to_ddp", dict(dir="c4b", steps=9, ckpt_every=6, mode="ddp"))])


def _falls(losses):
    steps = sorted(losses)
    first, last = losses[steps[0]], losses[steps[-1]]
    assert math.isfinite(last) and last < 0.8 * first, (first, last)


def _close(a, b, steps, rel=2e-3):
    for s in steps:
        assert a[s] == pytest.approx(b[s], rel=rel), (s, a[s], b[s])


def test_fsdp_and_hsdp_lower_the_loss_at_world_2_and_4(w2, w4):
    for name in ("fsdp", "ac", "edges", "bf16"):
        _falls(w2[name]["losses"])
        assert w2[name]["fsdp"], name
    for name in ("fsdp4", "hsdp4"):
        _falls(w4[name]["losses"])
    assert not w4["ddp4"]["fsdp"]
    # the same global batches: fsdp and hsdp at world 4 follow ddp up to the order of float sums
    _close(w4["fsdp4"]["losses"], w4["ddp4"]["losses"], range(1, 7))
    _close(w4["hsdp4"]["losses"], w4["ddp4"]["losses"], range(1, 5))


def test_a_stopped_fsdp_run_resumed_on_the_same_world_is_bit_identical(w2, root):
    stopped, resumed, ref = w2["stopped"], w2["resumed"], w2["fsdp"]
    assert stopped["step"] == 4 and stopped["stopped"] and resumed["start"] == 4 and resumed["step"] == 6
    assert resumed["hash"] == ref["hash"]
    assert resumed["losses"] == ref["losses"]  # steps 1..6, the stop's interval included
    ck = lambda name: digest(RunDir(root / name).checkpoints / f"step-{6:09d}")  # noqa: E731
    assert ck("stopped")["model"] == ck("c2")["model"]
    assert ck("stopped")["optimizer"] == ck("c2")["optimizer"]


def test_activation_checkpointing_gives_the_same_loss(w2):
    ac, ref = w2["ac"]["losses"], w2["fsdp"]["losses"]
    assert len(ac) == 4 and all(ac[s] == ref[s] for s in ac)  # bit for bit: the same ops, recomputed


def test_tied_frozen_tiny_parameters_and_clipping_when_sharded_match_ddp(w2):
    # hsdp (1, 2) with a 1-element parameter (one rank's shard is empty), a frozen one and a tied head;
    # grad_clip far below the gradient norm, so every step clips: only the *global* norm over the shards
    # gives ddp's steps
    # (a clip by each rank's local norm instead misses ddp's loss by 7.5e-4 at step 4; the global one by 6e-8)
    _close(w2["edges"]["losses"], w2["edges_ddp"]["losses"], range(1, 5), rel=1e-5)
    assert w2["bf16"]["dtypes"] == ["torch.bfloat16"]


def test_a_checkpoint_moves_between_world_sizes_and_modes(w2, w4, w3, w2b):
    # each resumed run's parameters, gathered right after the restore, are the saved ones bit for bit, and
    # its losses follow the uninterrupted run's (the same global batches) up to the order of float sums
    saved, ref = w2["fsdp"]["hash"], w2["fsdp9"]["losses"]  # fsdp at world 2, step 6
    for name in ("from2", "hsdp_from2"):  # 2 -> 4 under fsdp; fsdp -> hsdp (2 x 2)
        assert w4[name]["start"] == 6 and w4[name]["start_hash"] == saved, name
        _close(w4[name]["losses"], ref, range(7, 10))
    saved, ref = w4["fsdp4"]["hash"], w4["fsdp4_9"]["losses"]  # fsdp at world 4, step 6
    assert w3["from4"]["start_hash"] == saved  # 4 -> 3: uneven shards (32 rows: 11, 11, 10)
    assert w2b["to_ddp"]["start_hash"] == saved  # 4 -> 2 and fsdp -> ddp
    _close(w3["from4"]["losses"], ref, range(7, 10))
    _close(w2b["to_ddp"]["losses"], ref, range(7, 10))
    assert w3["ddp_to_fsdp"]["start_hash"] == w4["ddp4"]["hash"]  # ddp (world 4) -> fsdp (world 3)
    _close(w3["ddp_to_fsdp"]["losses"], ref, range(7, 10))


def test_memory_and_exposed_communication_are_in_every_record(w4):
    full = w4["ddp4"]["record"]["memory"]["state_bytes"]
    shard = w4["fsdp4"]["record"]["memory"]["state_bytes"]
    half = w4["hsdp4"]["record"]["memory"]["state_bytes"]
    assert full["min"] == full["max"] > 0
    # fsdp: each rank holds ~1/4 of parameters and optimizer state (the optimizer's step counters are whole)
    assert full["max"] / 4 <= shard["max"] <= full["max"] / 4 * 1.05
    assert full["max"] / 2 <= half["max"] <= full["max"] / 2 * 1.05  # hsdp (2, 2): sharded over 2
    for name in ("ddp4", "fsdp4", "hsdp4"):
        rec = w4[name]["record"]
        mem = rec["memory"]
        assert mem["rss_bytes"]["min"] > 10e6
        assert mem["peak_allocated_bytes"] is None and mem["peak_reserved_bytes"] is None  # CPU: no device peak
        assert rec["comm_measure"] == ("ddp_last_bucket" if name == "ddp4" else "fsdp_waits")
        exposed = rec["per_step"]["grad_comm_exposed_s"]
        assert 0 < exposed["median"] < rec["per_step"]["step_s"]["max"]


def test_what_parallel_refuses_is_one_line_naming_the_option():
    from hpctrain.train import ParallelConfig, TrainConfig

    with pytest.raises(UsageError, match="TrainConfig.parallel.mode"):
        ParallelConfig(mode="zero3")
    with pytest.raises(UsageError, match="TrainConfig.parallel.activation_checkpoint"):
        ParallelConfig(activation_checkpoint="some")
    with pytest.raises(UsageError, match="TrainConfig.parallel.hsdp_shape"):
        ParallelConfig(mode="hsdp", hsdp_shape=(2, 0))
    with pytest.raises(UsageError, match="TrainConfig.parallel.cpu_offload applies to mode"):
        ParallelConfig(cpu_offload=True)
    with pytest.raises(UsageError, match="TrainConfig.parallel.parallelize"):
        ParallelConfig(parallelize="no_colon")
    with pytest.raises(UsageError, match="TrainConfig.parallel"):
        TrainConfig(steps=1, parallel="fsdp")
    d = TrainConfig(steps=1, parallel=ParallelConfig(mode="hsdp", hsdp_shape=(1, 2), init_weights=print)).to_dict()
    assert d["parallel"]["hsdp_shape"] == [1, 2] and d["parallel"]["init_weights"] == "builtins:print"


def test_state_bytes_counts_a_tied_weight_once_with_the_optimizer_state():
    from hpctrain.train.memory import state_bytes

    lin = torch.nn.Linear(4, 4)  # 16 + 4 floats
    model = torch.nn.ModuleDict({"a": lin, "b": torch.nn.Linear(4, 4)})
    model["b"].weight = lin.weight  # tied: one more bias only
    assert state_bytes(model) == (16 + 4 + 4) * 4
    opt = torch.optim.Adam(model.parameters())
    model["a"](torch.ones(1, 4)).sum().backward()
    model["b"](torch.ones(1, 4)).sum().backward()
    opt.step()
    # two moments per parameter + a scalar step counter per parameter (3 parameters)
    assert state_bytes(model, opt) == 3 * (16 + 4 + 4) * 4 + 3 * 4


def test_memory_probe_reads_device_peaks_and_resets_them_per_interval():
    from hpctrain.train.memory import MemoryProbe

    class FakeCuda:
        def __init__(self):
            self.peak, self.resets = 5 << 30, 0

        def max_memory_allocated(self, device):
            return self.peak

        def max_memory_reserved(self, device):
            return self.peak + (1 << 30)

        def reset_peak_memory_stats(self, device):
            self.resets += 1
            self.peak = 1 << 30

    cuda = FakeCuda()
    probe = MemoryProbe("cuda:0", cuda=cuda)
    alloc, reserved, rss, state = probe.read()
    assert (alloc, reserved, state) == (5 << 30, 6 << 30, -1) and rss > 0 and cuda.resets == 1
    probe.state_bytes = 123
    assert probe.read()[0] == 1 << 30 and probe.read()[3] == 123  # the next interval's own peak
    cpu = MemoryProbe("cpu").read()
    assert cpu[0] == cpu[1] == -1  # no device peak off GPU: null in the record


def test_fsdp_communication_spans_are_carved_out_of_the_phase_they_fell_in():
    import time

    from hpctrain.train.metrics import PHASES, StepTimer

    timer = StepTimer("cpu")
    timer.start()
    token = timer.comm_begin()
    time.sleep(0.02)
    timer.comm_end(token)
    time.sleep(0.01)
    timer.mark("forward_backward")
    timer.mark("optimizer")
    timer.end()
    steps, step_s, sums = timer.take()
    part = dict(zip(PHASES, sums))
    assert steps == 1 and part["grad_comm_exposed"] >= 0.02 and part["forward_backward"] >= 0.01
    assert part["grad_comm_exposed"] + part["forward_backward"] + part["optimizer"] == pytest.approx(step_s, abs=1e-3)


def test_hdf5_data_with_accumulation_and_evaluation_under_fsdp_as_under_ddp(w2):
    # the loader, its epochs (2 steps of 2 micro-batches an epoch) and the eval pass on the sharded module
    got, ref = w2["h5"], w2["h5_ddp"]
    assert sorted(got["evals"]) == sorted(ref["evals"]) == [3, 6]
    _close(got["evals"], ref["evals"], [3, 6])
    _close(got["losses"], ref["losses"], range(1, 7))
    assert got["eval_loss"] == pytest.approx(ref["eval_loss"], rel=2e-3)


def test_a_parallelize_hook_replaces_the_trainer_s_wrapping(w2):
    # one FSDP group for the whole model instead of one per block: the same sums, the same losses
    hook, ref = w2["hook"]["losses"], w2["fsdp"]["losses"]
    assert w2["hook"]["fsdp"] and len(hook) == 4 and all(hook[s] == ref[s] for s in hook)
