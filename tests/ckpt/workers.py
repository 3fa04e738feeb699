"""Per-rank functions for ``run_world`` (module top level so that spawn can import them) and state builders.

Every builder is deterministic in its arguments, so the "replicated" state is identical on every rank
(as under DDP) and a test can rebuild the exact state a checkpoint should hold.
"""

from __future__ import annotations

import hashlib
import logging
import os
import time
import typing as tp

import torch

from hpctrain.ckpt import CheckpointConfig, Checkpointer


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(16, 33)
        self.drop = torch.nn.Dropout(0.2)
        self.fc2 = torch.nn.Linear(33, 4)
        self.register_buffer("counter", torch.zeros((), dtype=torch.int64))
        self.register_buffer("bf", torch.zeros(7, dtype=torch.bfloat16))
        self.register_buffer("empty", torch.zeros(0, 3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.drop(torch.relu(self.fc1(x))))


def build(seed: int, steps: int = 2) -> tp.Tuple[Net, torch.optim.Optimizer, tp.Any]:
    """Model + Adam + scheduler after ``steps`` deterministic training steps (on a fixed generator)."""
    g = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    model = Net()
    model.bf.copy_(torch.randn(7, generator=g).to(torch.bfloat16))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
    for _ in range(steps):
        x = torch.randn(8, 16, generator=g)
        model(x).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()
        sched.step()
        model.counter += 1
    return model, opt, sched


def state_hash(model: torch.nn.Module, opt: tp.Any = None, sched: tp.Any = None) -> str:
    """Bitwise hash of model + optimizer tensors (+ scheduler) for equality across processes.

    DTensors are hashed by their global value (gathered: a test-side check, never what the checkpointer does),
    so sharded and replicated copies of one state hash the same."""
    h = hashlib.sha256()

    def feed(obj: tp.Any) -> None:
        if hasattr(obj, "full_tensor"):
            obj = obj.full_tensor()
        if isinstance(obj, torch.Tensor):
            h.update(str(obj.dtype).encode() + str(list(obj.shape)).encode())
            h.update(obj.detach().contiguous().view(-1).view(torch.uint8).numpy().tobytes() if obj.numel() else b"")
        elif isinstance(obj, dict):
            for k in sorted(obj, key=str):
                h.update(str(k).encode())
                feed(obj[k])
        elif isinstance(obj, (list, tuple)):
            for v in obj:
                feed(v)
        else:
            h.update(repr(obj).encode())

    feed(model.state_dict())
    if opt is not None:
        feed(opt.state_dict())
    if sched is not None:
        feed(sched.state_dict())
    return h.hexdigest()


class LogLines(logging.Handler):
    """The log messages (warnings and above) of the logger it is added to, while it is."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: tp.List[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def cfg(d: str, **kw: tp.Any) -> CheckpointConfig:
    kw.setdefault("agreement_timeout_s", 30.0)
    # the multi-rank tests run on one host; they test the read_once exchange whatever "auto" picks there (with
    # the default restore_exchange "auto": the node's shared memory; tests/ckpt/fetch_workers.py takes "host")
    kw.setdefault("restore_mode", "read_once")
    return CheckpointConfig(dir=d, **kw)


def save_steps(
    rank: int,
    world: int,
    d: str,
    steps: tp.Sequence[int],
    blocking: bool = True,
    fault_at: tp.Optional[int] = None,
    fault: str = "",
    keep_last: int = 0,
) -> tp.List[str]:
    """Save each step (state built with seed=step); optionally arm HPCTRAIN_CKPT_FAULT for step ``fault_at``."""
    ck = Checkpointer(cfg(d, keep_last=keep_last), run_id="run-abc")
    out = []
    for s in steps:
        model, opt, sched = build(seed=s)
        if s == fault_at:
            os.environ["HPCTRAIN_CKPT_FAULT"] = fault
        try:
            ck.save(
                s,
                model=model,
                optimizer=opt,
                scheduler=sched,
                data_state={"epoch": s, "samples": 100 * s},
                extra={"note": f"step {s}", "t": torch.arange(s + 3)},
                blocking=blocking,
            )
            ck.wait()
            out.append(f"ok {s}")
        except Exception as exc:  # noqa: BLE001 - reported to the test
            out.append(f"error {s}: {exc}")
        finally:
            os.environ.pop("HPCTRAIN_CKPT_FAULT", None)
    ck.close()
    return out


def restore_hash(rank: int, world: int, d: str, **kw: tp.Any) -> tp.Optional[tp.Dict[str, tp.Any]]:
    """Restore into fresh objects; return the step, hashes, data state and what the restore reported."""
    ck = Checkpointer(cfg(d, **kw))
    model, opt, sched = build(seed=999, steps=0)
    res = ck.restore(model=model, optimizer=opt, scheduler=sched)
    ck.close()
    if res is None:
        return None
    return {
        "step": res.step,
        "hash": state_hash(model, opt, sched),
        "data_state": res.data_state,
        "extra_note": res.extra["note"],
        "extra_t": res.extra["t"].tolist(),
        "saved_world": res.saved_world_size,
        "rng_restored": res.rng_restored,
        "quarantined": res.quarantined,
        "run_id": res.run_id,
    }


def restore_hash_own_dir(rank: int, world: int, d: str) -> tp.Optional[tp.Dict[str, tp.Any]]:
    """:func:`restore_hash` from ``d/r<rank>``: each rank its own copy of the checkpoint directory."""
    return restore_hash(rank, world, os.path.join(d, f"r{rank}"))


def expected_hash(step: int) -> str:
    model, opt, sched = build(seed=step)
    return state_hash(model, opt, sched)


def train_resume(rank: int, world: int, d: str, total: int, save_at: int) -> tp.Tuple[str, str]:
    """DDP training with dropout + Adam + scheduler: run to ``total`` (saving at ``save_at``), then restore
    in the same processes and run again to ``total``; return both final hashes (must be equal)."""
    import torch.distributed as dist

    def loop(model: tp.Any, opt: tp.Any, sched: tp.Any, start: int, ck: tp.Optional[Checkpointer]) -> None:
        for step in range(start, total):
            x = torch.randn(8, 16)  # global torch RNG: must be restored per rank
            model(x).pow(2).mean().backward()
            opt.step()
            opt.zero_grad()
            sched.step()
            if ck is not None and step + 1 == save_at:
                ck.save(
                    step + 1, model=model, optimizer=opt, scheduler=sched, data_state={"step": step + 1}, blocking=False
                )

    torch.manual_seed(1234 + rank)  # rank-local RNG streams (dropout differs per rank)
    ddp = torch.nn.parallel.DistributedDataParallel(build(seed=5, steps=0)[0]) if dist.is_initialized() else None
    model = ddp if ddp is not None else build(seed=5, steps=0)[0]
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.5)
    ck = Checkpointer(cfg(d))
    loop(model, opt, sched, 0, ck)
    ck.wait()
    first = state_hash(model, opt, sched)
    torch.manual_seed(777)  # scramble RNG: restore must bring it back
    model2 = torch.nn.parallel.DistributedDataParallel(build(seed=6, steps=0)[0]) if ddp is not None else build(6, 0)[0]
    opt2 = torch.optim.Adam(model2.parameters(), lr=1e-2)
    sched2 = torch.optim.lr_scheduler.StepLR(opt2, step_size=3, gamma=0.5)
    res = ck.restore(model=model2, optimizer=opt2, scheduler=sched2)
    assert res is not None and res.step == save_at and res.data_state == {"step": save_at}
    loop(model2, opt2, sched2, save_at, None)
    ck.close()
    return first, state_hash(model2, opt2, sched2)


def save_mismatched(rank: int, world: int, d: str) -> str:
    """Ranks pass differently shaped state (not DDP-replicated): every rank must refuse, nothing committed."""
    ck = Checkpointer(cfg(d))
    model, opt, _ = build(seed=1)
    try:
        ck.save(1, model=model, extra={"t": torch.zeros(rank + 1)})
        return "saved"
    except Exception as exc:  # noqa: BLE001 - reported to the test
        return str(exc)
    finally:
        ck.close()


def save_one(rank: int, world: int, d: str, step: int, seed: int, fault: str = "") -> str:
    """Save ``step`` holding the state built with ``seed`` (a re-save when ``step`` exists), with a fault armed."""
    ck = Checkpointer(cfg(d, keep_last=0))
    model, opt, sched = build(seed=seed)
    if fault:
        os.environ["HPCTRAIN_CKPT_FAULT"] = fault
    try:
        ck.save(step, model=model, optimizer=opt, scheduler=sched, extra={"note": f"seed {seed}", "t": torch.arange(3)})
        return "ok"
    finally:
        os.environ.pop("HPCTRAIN_CKPT_FAULT", None)
        ck.close()


def save_many_small(rank: int, world: int, d: str, n: int) -> None:
    """Save step 1 of a model of ``n`` small parameters and an Adam-like state for each (``step``, ``exp_avg``,
    ``exp_avg_sq``), laid out as a model and its optimizer are: the optimizer's 3n small tensors come last."""
    model = {f"blocks.{i // 4}.w{i % 4}": torch.full((64,), float(i)) for i in range(n)}
    optim = {
        "state": {
            i: {"step": torch.tensor(3.0), "exp_avg": t + 1, "exp_avg_sq": t + 2} for i, t in enumerate(model.values())
        },
        "param_groups": [{"lr": 1e-3, "params": list(range(n))}],
    }
    ck = Checkpointer(cfg(d))
    ck.save(1, extra={"model": model, "optimizer": optim})
    ck.close()


def restore_phases(rank: int, world: int, d: str, fault: str = "", exchange: str = "auto") -> tp.Dict[str, tp.Any]:
    """Restore into fresh objects (``HPCTRAIN_CKPT_FAULT=fault`` during the call, the bytes exchanged by route
    ``exchange``); the call's wall time and the phases it reported."""
    ck = Checkpointer(cfg(d, restore_exchange=exchange))
    model, opt, sched = build(seed=999, steps=0)
    os.environ["HPCTRAIN_CKPT_FAULT"] = fault
    try:
        t0 = time.perf_counter()
        res = ck.restore(model=model, optimizer=opt, scheduler=sched)
        wall = time.perf_counter() - t0
    finally:
        os.environ.pop("HPCTRAIN_CKPT_FAULT", None)
    ck.close()
    assert res is not None
    return {"wall_s": wall, "phases": res.phases, "hash": state_hash(model, opt, sched)}


def restore_read_ahead(rank: int, world: int, d: str, mode: str = "read_once") -> tp.Dict[str, tp.Any]:
    """Restore into fresh objects in ``mode`` with the read-ahead's kernel call recorded instead of made (the
    checkpointer's own hint otherwise: which files, and when); the files, the threads of the hint still alive after
    the restore, and the state's hash."""
    import threading

    import hpctrain.ckpt.checkpointer as checkpointer_module
    from hpctrain.ckpt._readahead import readahead

    advised: tp.List[str] = []

    def recorded(*args: tp.Any, **kwargs: tp.Any) -> tp.Any:
        kwargs["advise"] = lambda fd, path, offset, length: advised.append(f"{path.parent.name}/{path.name}")
        return readahead(*args, **kwargs)

    ck = Checkpointer(cfg(d, restore_mode=mode))
    model, opt, sched = build(seed=999, steps=0)
    checkpointer_module.readahead = recorded  # type: ignore[assignment]
    try:
        res = ck.restore(model=model, optimizer=opt, scheduler=sched)
    finally:
        checkpointer_module.readahead = readahead  # type: ignore[assignment]
    alive = [t.name for t in threading.enumerate() if t.name == "hpctrain-ckpt-readahead"]
    ck.close()
    assert res is not None
    return {"advised": advised, "alive": alive, "step": res.step, "hash": state_hash(model, opt, sched)}


def restore_collectives(rank: int, world: int, d: str) -> tp.Dict[str, tp.Any]:
    """Restore into fresh objects; the collectives the restore took (every ``Comm`` gather: the checkpointer's
    collectives all go through it) and the state's hash."""
    from hpctrain.ckpt._commit import Comm

    ck = Checkpointer(cfg(d))  # its constructor's agreement is not the restore's
    model, opt, sched = build(seed=999, steps=0)
    calls: tp.List[str] = []
    ints, gather_with = Comm.all_gather_ints, Comm.all_gather_with

    def counted_ints(self: Comm, values: tp.Sequence[int]) -> tp.List[tp.List[int]]:
        calls.append("all_gather_ints")
        return ints(self, values)

    def counted_with(self: Comm, *args: tp.Any, **kw: tp.Any) -> tp.Any:
        calls.append("all_gather_with")
        return gather_with(self, *args, **kw)

    Comm.all_gather_ints, Comm.all_gather_with = counted_ints, counted_with  # type: ignore[method-assign]
    try:
        res = ck.restore(model=model, optimizer=opt, scheduler=sched)
    finally:
        Comm.all_gather_ints, Comm.all_gather_with = ints, gather_with  # type: ignore[method-assign]
    ck.close()
    assert res is not None
    return {"calls": calls, "hash": state_hash(model, opt, sched), "step": res.step}
