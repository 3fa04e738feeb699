"""Every ``torch.optim`` optimizer, and a user-defined one whose state is not shaped like its parameters, resumes
bit-exactly through the Checkpointer; a checkpoint of a differently shaped model is still refused (issue 17 §1).

Single process, no process group, tiny tensors: the whole module runs in seconds.
"""

from __future__ import annotations

import inspect
import typing as tp

import pytest
import torch

from hpctrain.ckpt import CheckpointConfig, Checkpointer
from hpctrain.errors import HpctrainError


class Summarising(torch.optim.Optimizer):
    """SGD that also keeps a running [mean, min, max] of each gradient: per-parameter state of shape [3], unrelated
    to its parameter's ([10, 6] and [10]), the kind a user optimizer may hold."""

    def __init__(self, params: tp.Any, lr: float = 0.1) -> None:
        super().__init__(params, {"lr": lr})

    @torch.no_grad()
    def step(self, closure: tp.Any = None) -> tp.Any:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                st = self.state[p]
                if not st:
                    st["summary"], st["step"] = torch.zeros(3), torch.tensor(0.0)
                st["step"] += 1
                st["summary"].mul_(0.9).add_(torch.stack([p.grad.mean(), p.grad.min(), p.grad.max()]))
                p.add_(p.grad + 0.01 * st["summary"][0], alpha=-group["lr"])
        return loss


# Every optimizer torch.optim exports, found at import time so that a new one is tested when torch adds it.
# Each runs on a Linear(6, 10) (a [10, 6] weight and a [10] bias) with its defaults, except:
# SGD: with momentum (without it, it keeps no state to restore); LBFGS: fewer inner iterations (speed; its
# state is a flat history under the first parameter); Muon: 2-D parameters only (no bias), as it requires;
# SparseAdam: sparse gradients only, so a sparse-gradient Embedding(10, 6). None is skipped.
OPTIMIZERS: tp.Dict[str, type] = {
    name: cls
    for name, cls in vars(torch.optim).items()
    if inspect.isclass(cls) and issubclass(cls, torch.optim.Optimizer) and cls is not torch.optim.Optimizer
}
OPTIMIZERS["Summarising"] = Summarising
KWARGS: tp.Dict[str, tp.Dict[str, tp.Any]] = {
    "SGD": {"lr": 0.05, "momentum": 0.9},
    "LBFGS": {"max_iter": 4, "history_size": 3},
    "Muon": {"lr": 0.02},
}
MODELS: tp.Dict[str, str] = {"Muon": "matrix", "SparseAdam": "embedding"}


def _model(kind: str, out: int = 10) -> torch.nn.Module:
    if kind == "embedding":
        return torch.nn.Embedding(out, 6, sparse=True)
    return torch.nn.Linear(6, out, bias=kind != "matrix")


def _pair(name: str, seed: int, out: int = 10) -> tp.Tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)  # a different seed per copy: whatever the restored copy holds came from the checkpoint
    model = _model(MODELS.get(name, "linear"), out)
    return model, OPTIMIZERS[name](model.parameters(), **KWARGS.get(name, {}))


def _train(model: torch.nn.Module, opt: torch.optim.Optimizer, steps: tp.Iterable[int]) -> None:
    for s in steps:
        g = torch.Generator().manual_seed(100 + s)
        if isinstance(model, torch.nn.Embedding):
            x = torch.randint(0, model.num_embeddings, (5,), generator=g)
        else:
            x = torch.randn(4, 6, generator=g)

        def closure(x: torch.Tensor = x) -> torch.Tensor:  # LBFGS calls it several times per step
            opt.zero_grad()
            loss = model(x).sin().pow(2).mean()
            loss.backward()
            return loss

        opt.step(closure)


def _assert_same(a: tp.Any, b: tp.Any, where: str) -> None:
    """Bitwise equal, recursively: tensors by dtype, shape and values (torch.equal), the rest by ==."""
    assert type(a) is type(b), f"{where}: {type(a).__name__} vs {type(b).__name__}"
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b), where
    elif isinstance(a, dict):
        assert list(a) == list(b), where
        for k in a:
            _assert_same(a[k], b[k], f"{where}/{k}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            _assert_same(x, y, f"{where}/{i}")
    else:
        assert a == b, f"{where}: {a!r} vs {b!r}"


def _assert_pairs_same(m1: tp.Any, o1: tp.Any, m2: tp.Any, o2: tp.Any) -> None:
    _assert_same(dict(m1.named_parameters()), dict(m2.named_parameters()), "params")
    _assert_same(o1.state_dict(), o2.state_dict(), "optimizer")


def _save(d: tp.Any, model: tp.Any, opt: tp.Any) -> None:
    ck = Checkpointer(CheckpointConfig(dir=d))
    ck.save(2, model=model, optimizer=opt)
    ck.close()


def _restore(d: tp.Any, **objs: tp.Any) -> tp.Any:
    ck = Checkpointer(CheckpointConfig(dir=d))
    try:
        return ck.restore(restore_rng=False, **objs)
    finally:
        ck.close()


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_every_optimizer_resumes_bit_exactly(tmp_path, name):
    m1, o1 = _pair(name, seed=0)
    _train(m1, o1, [0, 1])
    _save(tmp_path, m1, o1)
    m2, o2 = _pair(name, seed=1)
    assert _restore(tmp_path, model=m2, optimizer=o2).step == 2
    _assert_pairs_same(m1, o1, m2, o2)
    _train(m1, o1, [2])  # the next step from the restored state is the step the original takes
    _train(m2, o2, [2])
    _assert_pairs_same(m1, o1, m2, o2)


def test_the_user_optimizer_state_is_really_unlike_its_parameters():
    """The cases the old check refused are in the parametrisation above (guards against a vacuous test)."""
    shapes = {}
    for name in ("Adafactor", "LBFGS", "Summarising"):
        m, o = _pair(name, seed=0)
        _train(m, o, [0])
        shapes[name] = {k: list(v.shape) for k, v in o.state_dict()["state"][0].items() if isinstance(v, torch.Tensor)}
    assert shapes["Adafactor"]["row_var"] == [10, 1] and shapes["Adafactor"]["col_var"] == [1, 6]
    assert shapes["LBFGS"]["d"] == [70]  # the [10, 6] weight and the [10] bias, flat
    assert shapes["Summarising"]["summary"] == [3]


@pytest.mark.parametrize("stepped", [False, True], ids=["fresh", "stepped"])
def test_adafactor_optimizer_alone_restores_into_a_fresh_or_stepped_optimizer(tmp_path, stepped):
    """The issue's case without the model (no model check to lean on): the factored state fits the optimizer
    whether it holds state of its own (compared entry by entry) or none yet; the old refusal is gone."""
    m1, o1 = _pair("Adafactor", seed=0)
    _train(m1, o1, [0, 1])
    _save(tmp_path, m1, o1)
    m2, o2 = _pair("Adafactor", seed=1)
    if stepped:
        _train(m2, o2, [5])
    with torch.no_grad():  # the model as saved (not restored here: the caller restores it some other way)
        m2.weight.copy_(m1.weight)
        m2.bias.copy_(m1.bias)
    try:
        _restore(tmp_path, optimizer=o2)
    except HpctrainError as exc:  # the message of issue 17, should it come back
        assert "row_var has shape [10, 1] saved, its parameter [10, 6] here" not in str(exc)
        raise
    _assert_same(o1.state_dict(), o2.state_dict(), "optimizer")
    _train(m1, o1, [2])
    _train(m2, o2, [2])
    _assert_pairs_same(m1, o1, m2, o2)


def _state_of(model: tp.Any, opt: tp.Any) -> tp.Dict[str, tp.Any]:
    return {k: v.clone() for k, v in model.state_dict().items()} | {
        f"{i}/{k}": v.clone() if isinstance(v, torch.Tensor) else v
        for i, s in opt.state_dict()["state"].items()
        for k, v in s.items()
    }


# (optimizer, restore the model too, the optimizer has stepped) -> what the one-line error names
REFUSALS = {
    ("Adam", True, False): r"does not fit the model passed to restore\(\): weight has global shape \[10, 6\] saved, "
    r"\[11, 6\] here",
    ("Adam", False, False): r"does not fit the optimizer passed to restore\(\): optimizer/state/0/exp_avg has shape "
    r"\[10, 6\] saved, its parameter \[11, 6\] here",
    ("Adam", False, True): r"does not fit the optimizer passed to restore\(\): optimizer/state/0/exp_avg has shape "
    r"\[10, 6\] saved, \[11, 6\] in this optimizer's state \(parameter \[11, 6\]\)",
    ("Adafactor", False, False): r"optimizer/state/0/row_var has shape \[10, 1\] saved, its parameter \[11, 6\] here",
    ("Adafactor", False, True): r"optimizer/state/0/row_var has shape \[10, 1\] saved, \[11, 1\] in this optimizer's",
    ("Adagrad", False, False): r"optimizer/state/0/sum has shape \[10, 6\] saved, \[11, 6\] in this optimizer's",
}


@pytest.mark.parametrize(
    "name,with_model,stepped", sorted(REFUSALS), ids=lambda v: v if isinstance(v, str) else str(int(v))
)
def test_a_checkpoint_of_a_differently_shaped_model_is_refused_in_one_line(tmp_path, name, with_model, stepped):
    """A genuinely different model still fails before anything is loaded, naming the tensor: through the model
    check, else against the optimizer's own state (Adagrad holds some from the start), else against the
    parameter a parameter-shaped saved tensor was meant for."""
    m1, o1 = _pair(name, seed=0)
    _train(m1, o1, [0, 1])
    _save(tmp_path, m1, o1)
    m2, o2 = _pair(name, seed=1, out=11)
    if stepped:
        _train(m2, o2, [0])
    before = _state_of(m2, o2)
    objs = {"model": m2, "optimizer": o2} if with_model else {"optimizer": o2}
    with pytest.raises(HpctrainError, match=REFUSALS[name, with_model, stepped]) as err:
        _restore(tmp_path, **objs)
    assert "\n" not in str(err.value) and err.value.exit_code == 1
    _assert_same(before, _state_of(m2, o2), "untouched")
