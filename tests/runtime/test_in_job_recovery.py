"""In-job recovery, real processes: gloo on CPU, a TCPStore served by the test (it outlives every rank), SIGKILL.

Each test starts at most 4 processes of a tiny model (8 -> 32 -> 1 with dropout, Adam); a DDP step is
milliseconds, so a run is the processes' start-up plus the recovery. Nothing here asserts a speed (the figures
are benchmarks/bench_recovery.py's).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import signal
import typing as tp

import pytest

from hpctrain.errors import UsageError
from tests.multiproc import report_to, run_roles

STEPS = 10
QUICK = {"collective_timeout_s": 20.0, "agree_timeout_s": 40.0, "dead_after_s": 1.0, "heartbeat_s": 0.1}


class ToyLoader:
    """One global batch per step from (seed, position), rank r reads its slice: the state is the global position
    (rank-free, like H5Loader's), so a survivor's is right for the replacement's shard."""

    def __init__(self, rank: int, world_size: int) -> None:
        self.rank, self.world_size, self.position = rank, world_size, 0

    def set_rank(self, rank: int) -> None:
        self.rank = rank

    def state_dict(self) -> tp.Dict[str, int]:
        return {"position": self.position}

    def load_state_dict(self, state: tp.Mapping[str, int]) -> None:
        self.position = int(state["position"])

    def __iter__(self) -> tp.Iterator[tp.Any]:
        import torch

        while True:
            g = torch.Generator().manual_seed(1000 + self.position)
            x = torch.randn(self.world_size * 4, 8, generator=g)
            y = x.sum(1, keepdim=True).sin()
            self.position += 1
            mine = slice(self.rank * 4, (self.rank + 1) * 4)
            yield x[mine], y[mine]


def _loss(model: tp.Any, batch: tp.Any) -> tp.Any:
    import torch.nn.functional as F

    return F.mse_loss(model(batch[0]), batch[1])


def _wrap(model: tp.Any, loader: ToyLoader, world_size: int) -> tp.Tuple[tp.Any, tp.Iterator[tp.Any]]:
    """DDP over the current generation's (default) group, and the batches from the loader's position, after the
    house's bucket warm-up (a fresh DDP's first layout would change the last bits of a 3-rank all-reduce)."""
    import torch
    from torch.nn.parallel import DistributedDataParallel

    from hpctrain.train.ddp_warmup import warm_up_buckets

    ddp = DistributedDataParallel(model)
    batches = warm_up_buckets(
        ddp,
        model,
        iter(loader),
        loss_fn=_loss,
        autocast=contextlib.nullcontext(),
        device=torch.device("cpu"),
        world_size=world_size,
    )
    return ddp, batches


def _digest(model: tp.Any) -> str:
    h = hashlib.sha256()
    for name, p in model.state_dict().items():
        h.update(name.encode())
        h.update(p.detach().contiguous().numpy().tobytes())
    return h.hexdigest()


def _train(role: str, index: int, world_size: int, port: int, opts: tp.Dict[str, tp.Any]) -> tp.Dict[str, tp.Any]:
    import torch

    from hpctrain.runtime.recovery import InJobRecovery, RecoveryConfig
    from hpctrain.runtime.state_transfer import ReplicatedState

    torch.set_num_threads(1)
    torch.manual_seed(0)  # every process builds the same weights (the spare too, though it receives them)
    model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Dropout(0.1), torch.nn.Linear(32, 1))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    loader = ToyLoader(index if role == "rank" else 0, world_size)
    state = ReplicatedState(module=model, optimizer=optimizer, loader=loader)
    who = {"rank": index} if role == "rank" else {"spare": index}
    rec = InJobRecovery(
        RecoveryConfig(**opts["config"]),
        host="127.0.0.1",
        port=port,
        world_size=world_size,
        state=state,
        run_dir=opts.get("run_dir"),
        job_id="test",
        **who,
    )
    if role == "rank":
        rec.start()
    else:

        def take(rank: int) -> None:
            if opts.get("spare_dies"):
                os.kill(os.getpid(), signal.SIGKILL)  # a second failure: the spare dies as it takes the rank
            loader.set_rank(rank)

        if rec.stand_by(on_rank=take) is None:
            return {"role": role, "index": index, "idle": True}
    step = rec.step
    ddp, batches = _wrap(model, loader, world_size)
    while step < opts["steps"]:
        try:
            batch = next(batches)
            out = ddp(batch[0])
            if role == "rank" and index == opts.get("victim") and step + 1 == opts.get("kill_at"):
                # mid-step: after the forward, before the backward's all-reduce. SIGSTOP: a rank whose sockets stay
                # open (its node hangs): the survivors' collective ends only at collective_timeout_s
                os.kill(os.getpid(), opts.get("signal", signal.SIGKILL))
            torch.nn.functional.mse_loss(out, batch[1]).backward()
            rec.check()  # a no-op on gloo (NCCL reports a failure here)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            step += 1
            rec.completed(step)
        except Exception as exc:  # noqa: BLE001 - recover() re-raises what it cannot handle
            got = rec.recover(exc)
            step = got.step
            ddp, batches = _wrap(model, loader, world_size)
    rec.finish()
    return {
        "role": role,
        "index": index,
        "rank": rec.rank,
        "step": step,
        "digest": _digest(model),
        "records": rec.records,
    }


def _process(role, index, world_size, port, opts, out):  # pragma: no cover - child
    os.environ["TORCH_CPP_LOG_LEVEL"] = "ERROR"
    import faulthandler
    import sys

    # a process still running 30 s before the launcher gives up prints where it is (pytest shows the stderr)
    faulthandler.dump_traceback_later(opts.get("dump_after_s", 120.0), exit=False, file=sys.stderr)
    report_to(out, lambda: _train(role, index, world_size, port, opts))


def _launch(world_size: int, spares: int, opts: tp.Dict[str, tp.Any], timeout: float = 150.0):
    """Every rank and spare of one job; ``(results by (role, index), exit codes by (role, index))``."""
    import torch.distributed as dist

    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    who = [("rank", r) for r in range(world_size)] + [("spare", i) for i in range(spares)]
    frozen = ("rank", opts["victim"]) if opts.get("signal") == signal.SIGSTOP else None
    got = run_roles(_process, who, (world_size, store.port, opts), timeout=timeout, frozen=frozen)
    del store
    return got


@pytest.fixture(scope="module")
def reference_digest() -> str:
    """The same training, 3 ranks, uninterrupted."""
    results, codes = _launch(3, 0, {"config": QUICK, "steps": STEPS})
    assert set(codes.values()) == {0}, results
    digests = {r[1]["digest"] for r in results.values()}
    assert len(digests) == 1
    return digests.pop()


def test_a_killed_rank_is_replaced_by_the_warm_spare_and_the_model_is_bit_identical(tmp_path, reference_digest):
    from hpctrain.ledger import Ledger

    kill_at = 6
    opts = {"config": {**QUICK, "spares": 1}, "steps": STEPS, "victim": 1, "kill_at": kill_at, "run_dir": str(tmp_path)}
    results, codes = _launch(3, 1, opts)
    assert codes[("rank", 1)] == -signal.SIGKILL
    assert codes[("rank", 0)] == codes[("rank", 2)] == codes[("spare", 0)] == 0, results
    spare = results[("spare", 0)][1]
    assert spare["rank"] == 1 and spare["step"] == STEPS  # the spare took rank 1's place and finished
    finals = [results[w][1] for w in (("rank", 0), ("rank", 2), ("spare", 0))]
    assert {f["digest"] for f in finals} == {reference_digest}  # bit-identical to the uninterrupted run

    (record,) = Ledger(tmp_path).records("in_job_recovery")
    assert record["failed_ranks"] == [1]
    assert record["agreed_step"] == kill_at - 1 and record["interrupted_step"] == kill_at
    assert record["steps_redone"] == 1
    assert record["survivor_steps"] == {"0": kill_at - 1, "2": kill_at - 1}
    assert record["replaced"] == [{"rank": 1, "was": "r1", "by": "s0", "spare": 0}]
    assert record["source_rank"] == 0 and record["spares_left"] == 0 and record["fallback"] is None
    phases = record["phases_s"]
    assert set(phases) == {"detect", "abort", "agree", "reform", "transfer", "first_step"}
    assert all(v is not None and v >= 0 for v in phases.values()), phases
    assert record["failure_to_first_step_s"] > 0
    assert finals[0]["records"][0]["agreed_step"] == kill_at - 1  # every rank keeps it; only the source writes it


def test_four_ranks_every_survivor_learns_of_the_failure_from_a_closed_connection_not_the_timeout(tmp_path):
    """In a ring of 4 the rank opposite the dead one waits on a survivor, not on the dead rank: it learns of the
    failure only because that survivor half-closes its sockets when it leaves the group."""
    from hpctrain.ledger import Ledger

    opts = {"config": {**QUICK, "spares": 1}, "steps": 8, "victim": 3, "kill_at": 4, "run_dir": str(tmp_path)}
    results, codes = _launch(4, 1, opts)
    assert [codes[("rank", r)] for r in range(3)] == [0, 0, 0] and codes[("spare", 0)] == 0, results
    assert len({results[w][1]["digest"] for w in results if w != ("rank", 3)}) == 1
    (record,) = Ledger(tmp_path).records("in_job_recovery")
    assert sorted(record["survivor_errors"]) == ["0", "1", "2"]
    assert not [e for e in record["survivor_errors"].values() if "timed out" in e.lower()], record["survivor_errors"]


def test_a_frozen_rank_is_found_by_the_collective_timeout_and_replaced(tmp_path, reference_digest):
    from hpctrain.ledger import Ledger

    opts = {
        "config": {**QUICK, "spares": 1, "collective_timeout_s": 4.0},
        "steps": STEPS,
        "victim": 2,
        "kill_at": 5,
        "signal": signal.SIGSTOP,
        "run_dir": str(tmp_path),
    }
    results, codes = _launch(3, 1, opts)
    assert codes[("rank", 0)] == codes[("rank", 1)] == codes[("spare", 0)] == 0, results
    assert {results[w][1]["digest"] for w in (("rank", 0), ("rank", 1), ("spare", 0))} == {reference_digest}
    (record,) = Ledger(tmp_path).records("in_job_recovery")
    assert record["failed_ranks"] == [2] and record["agreed_step"] == 4
    assert record["phases_s"]["detect"] >= 3.0  # found by the bounded collective, not by a closed socket


def test_without_a_spare_the_survivors_fall_back_with_one_line_as_a_peer_failure(tmp_path, capfd):
    from hpctrain.ledger import Ledger

    opts = {"config": QUICK, "steps": STEPS, "victim": 2, "kill_at": 4, "run_dir": str(tmp_path)}
    results, codes = _launch(3, 0, opts)
    assert codes == {("rank", 0): 1, ("rank", 1): 1, ("rank", 2): -signal.SIGKILL}
    for r in (0, 1):
        status, got = results[("rank", r)]
        assert status == "error" and got["type"] == "InJobRecoveryFallback", got
        assert got["peer_failure"]  # so the Runner's end classifies it as the peer failure it is (the spare path)
        assert "no warm spare left for rank(s) [2]" in got["message"]
    err = capfd.readouterr().err
    lines = [x for x in err.splitlines() if "in-job recovery" in x]
    assert len(lines) == 2 and all("falling back to the restart from the last commit" in x for x in lines), lines
    (record,) = Ledger(tmp_path).records("in_job_recovery")
    assert record["failed_ranks"] == [2] and record["agreed_step"] == 3
    assert record["fallback"].startswith("no warm spare left")


def test_two_survivors_that_compute_the_same_plan_have_one_author(tmp_path):
    """The race CI met once: both survivors saw the dead rank in the same poll, wrote the same plan text, and
    both took compare_set's answer (their own text) as a win: two fallback records. Made certain here by
    publishing the same plan from two survivors, one after the other."""
    import torch.distributed as dist

    from hpctrain.ledger import Ledger
    from hpctrain.runtime.recovery import InJobRecovery, RecoveryConfig

    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    cfg = RecoveryConfig(**QUICK)
    survivors = [
        InJobRecovery(cfg, host="127.0.0.1", port=store.port, world_size=3, state=None, rank=r, run_dir=tmp_path)
        for r in (0, 1)
    ]
    try:
        plan = {
            "generation": 1,
            "failed_ranks": [2],
            "agreed_step": 3,
            "fallback": "no warm spare left for rank(s) [2]",
        }
        published = [s._publish("test/g0/plan", plan) for s in survivors]
        assert [won for _, won in published] == [True, False]
        assert published[0][0] == published[1][0] == plan
        for s, (got, won) in zip(survivors, published):
            if won:
                s._assign(got)
        assert [r["failed_ranks"] for r in Ledger(tmp_path).records("in_job_recovery")] == [[2]]
        # a different plan from a later survivor: the stored one stands, and it is not its author
        later, won = survivors[1]._publish("test/g0/plan", {**plan, "agreed_step": 2})
        assert later == plan and not won
    finally:
        for s in survivors:
            s.close()
        del store


def test_a_spare_that_dies_taking_the_rank_is_a_second_failure_and_falls_back(tmp_path):
    opts = {
        "config": {**QUICK, "spares": 1, "collective_timeout_s": 8.0, "agree_timeout_s": 20.0},
        "steps": STEPS,
        "victim": 1,
        "kill_at": 3,
        "spare_dies": True,
        "run_dir": str(tmp_path),
    }
    results, codes = _launch(3, 1, opts)
    assert codes[("rank", 1)] == codes[("spare", 0)] == -signal.SIGKILL
    assert codes[("rank", 0)] == codes[("rank", 2)] == 1
    for r in (0, 2):
        got = results[("rank", r)][1]
        assert got["type"] == "InJobRecoveryFallback" and got["peer_failure"], got
        assert "a second failure during the recovery" in got["message"]


@pytest.mark.parametrize(
    ("kwargs", "option"),
    [
        ({"spares": -1}, "RecoveryConfig.spares"),
        ({"dead_after_s": 0.1}, "RecoveryConfig.dead_after_s"),
        ({"collective_timeout_s": 0}, "RecoveryConfig.collective_timeout_s"),
        ({"collective_timeout_s": 100.0, "agree_timeout_s": 50.0}, "RecoveryConfig.agree_timeout_s"),
        ({"enabled": "yes"}, "RecoveryConfig.enabled"),
        ({"shrink": 1}, "RecoveryConfig.shrink"),
    ],
)
def test_a_bad_option_is_one_line_naming_it(kwargs, option):
    from hpctrain.runtime.recovery import RecoveryConfig

    with pytest.raises(UsageError) as got:
        RecoveryConfig(**kwargs)
    assert str(got.value).startswith(option) and "\n" not in str(got.value)


def _broadcast(rank: int, world_size: int) -> tp.Any:
    import torch

    from hpctrain.runtime.state_transfer import broadcast_state

    torch.manual_seed(7)
    state = {
        "w": torch.randn(3, 5, dtype=torch.float64),
        "mask": torch.rand(4) > 0.5,
        "nested": [torch.arange(6, dtype=torch.int64).view(2, 3), (torch.tensor(3.0), "text", 5)],
        "empty": torch.empty(0, 2),
        "strided": torch.randn(4, 4).t(),
        "plain": {"epoch": 2, "name": None},
    }
    got = broadcast_state(state if rank == 0 else None, src=0, rank=rank)
    if rank == 0:
        return got is state
    same = all(
        a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
        for a, b in [
            (got["w"], state["w"]),
            (got["mask"], state["mask"]),
            (got["nested"][0], state["nested"][0]),
            (got["nested"][1][0], state["nested"][1][0]),
            (got["empty"], state["empty"]),
            (got["strided"], state["strided"]),
        ]
    )
    return same and got["nested"][1][1:] == ("text", 5) and got["plain"] == state["plain"]


def test_broadcast_state_copies_every_dtype_and_shape_exactly():
    from tests.multiproc import run_world

    assert run_world(_broadcast, 2).results == [True, True]
