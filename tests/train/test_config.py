"""TrainConfig checks every option on construction and names it in the error."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from hpctrain.ckpt import CheckpointConfig
from hpctrain.errors import UsageError
from hpctrain.train import CheckpointPolicy, MetricsConfig, TrainConfig
from hpctrain.train.config import MAX_SEED


@pytest.mark.parametrize(
    "kwargs, named",
    [
        ({}, "exactly one of steps or epochs"),
        ({"steps": 10, "epochs": 2}, "exactly one of steps or epochs"),
        ({"steps": 0}, "TrainConfig.steps"),
        ({"epochs": -1}, "TrainConfig.epochs"),
        ({"steps": 5, "log_every": 0}, "TrainConfig.log_every"),
        ({"steps": 5, "grad_accum": 0}, "TrainConfig.grad_accum"),
        ({"steps": 5, "grad_clip": -1.0}, "TrainConfig.grad_clip"),
        ({"steps": 5, "grad_clip": float("nan")}, "TrainConfig.grad_clip"),
        ({"steps": 5, "amp": "fp8"}, "TrainConfig.amp"),
        ({"steps": 5, "seed": -3}, "TrainConfig.seed"),
        ({"steps": 5, "eval_every": True}, "TrainConfig.eval_every"),
        # issue 17 §3: torch.manual_seed refuses 2**64 with an OverflowError deep inside fit()
        ({"steps": 5, "seed": 2**64}, r"TrainConfig.seed must be an integer from 0 to 18446744073709551615"),
        ({"steps": 5, "seed": "1"}, "TrainConfig.seed"),
        ({"steps": 5, "checkpoint": {"every_steps": 5}}, "TrainConfig.checkpoint must be a CheckpointPolicy"),
        ({"steps": 5, "metrics": None}, "TrainConfig.metrics must be a MetricsConfig"),
    ],
)
def test_bad_values_name_the_option(kwargs, named):
    with pytest.raises(UsageError, match=named):
        TrainConfig(**kwargs)


@pytest.mark.parametrize(
    "make, named",
    [
        (lambda: CheckpointPolicy(every_steps=-1), "TrainConfig.checkpoint.every_steps"),
        (lambda: CheckpointPolicy(every_minutes=-0.5), "TrainConfig.checkpoint.every_minutes"),
        (lambda: CheckpointPolicy(keep_last=1.5), "TrainConfig.checkpoint.keep_last"),
        (lambda: CheckpointPolicy(dir=""), "TrainConfig.checkpoint.dir"),
        (lambda: MetricsConfig(flops_per_sample=0), "TrainConfig.metrics.flops_per_sample"),
        (lambda: MetricsConfig(peak_flops_per_device=-1e12), "TrainConfig.metrics.peak_flops_per_device"),
        # issue 17 §3: a one-line error naming the option, not a TypeError traceback from Path()
        (lambda: CheckpointPolicy(dir=5), r"TrainConfig.checkpoint.dir must be a directory path .*got 5$"),
        (
            lambda: CheckpointPolicy(dir=b"/x/ck"),
            r"TrainConfig.checkpoint.dir must be a directory path .*got b'/x/ck'$",
        ),
        # issue 17 §3: truthy strings were accepted ("no" is True); booleans must be bool
        (
            lambda: CheckpointPolicy(async_save="no"),
            "TrainConfig.checkpoint.async_save must be True or False, got 'no'",
        ),
        (lambda: CheckpointPolicy(resume=1), "TrainConfig.checkpoint.resume must be True or False"),
        (lambda: MetricsConfig(enabled="no"), "TrainConfig.metrics.enabled must be True or False, got 'no'"),
        (lambda: MetricsConfig(display="false"), "TrainConfig.metrics.display must be True or False"),
        (lambda: CheckpointPolicy(config={"keep_last": 2}), "TrainConfig.checkpoint.config must be a CheckpointConfig"),
        (lambda: CheckpointPolicy(config=CheckpointConfig(keep_every=-1)), "CheckpointConfig.keep_every"),
    ],
)
def test_nested_sections_name_their_option(make, named):
    with pytest.raises(UsageError, match=named):
        make()


def test_checkpointing_is_on_when_an_interval_is_set_and_the_config_serialises():
    assert not CheckpointPolicy().enabled
    assert CheckpointPolicy(every_steps=5).enabled and CheckpointPolicy(every_minutes=0.5).enabled
    cfg = TrainConfig(epochs=3, checkpoint=CheckpointPolicy(dir="/x/ck", every_steps=4))
    d = cfg.to_dict()
    assert d["epochs"] == 3 and d["steps"] is None and d["checkpoint"]["dir"] == "/x/ck"
    assert d["checkpoint"]["every_steps"] == 4 and d["metrics"]["enabled"] is True


def test_seed_bound_is_what_torch_accepts():
    torch = pytest.importorskip("torch")
    assert TrainConfig(steps=1, seed=MAX_SEED).seed == MAX_SEED
    torch.Generator().manual_seed(MAX_SEED)  # the largest accepted seed is accepted by torch too
    with pytest.raises((RuntimeError, ValueError, OverflowError)):  # what the config spares the user
        torch.Generator().manual_seed(MAX_SEED + 1)


@pytest.mark.parametrize("make", [lambda: CheckpointPolicy(dir=5), lambda: TrainConfig(steps=1, seed=2**64)])
def test_errors_are_one_line(make):
    with pytest.raises(UsageError) as e:
        make()
    assert "\n" not in str(e.value)


def test_policy_carries_a_checkpoint_config_and_the_shorthands_still_work():
    pol = CheckpointPolicy(every_steps=200, config=CheckpointConfig(keep_every=1000, restore_mode="read_all"))
    assert pol.config.keep_every == 1000 and pol.config.restore_mode == "read_all" and pol.dir is None
    assert pol.keep_last == CheckpointConfig().keep_last == 3  # one default, CheckpointConfig's
    # the spelling users and tests already use: shorthands for config.dir / config.keep_last
    short = CheckpointPolicy(dir="/x/ck", keep_last=5, every_steps=2)
    assert short.config == CheckpointConfig(dir="/x/ck", keep_last=5)
    assert (short.dir, short.keep_last) == ("/x/ck", 5)
    assert short == CheckpointPolicy(every_steps=2, config=CheckpointConfig(dir="/x/ck", keep_last=5))
    assert dataclasses.replace(short, every_steps=3).config == short.config  # replace() keeps the config
    short.keep_last = 7  # writes go through the config and its check
    assert short.config.keep_last == 7
    with pytest.raises(UsageError, match="TrainConfig.checkpoint.keep_last"):
        short.keep_last = -1
    # the same value in both places is fine; two different ones are refused
    assert CheckpointPolicy(dir="/a", config=CheckpointConfig(dir="/a")).dir == "/a"
    with pytest.raises(UsageError, match=r"TrainConfig.checkpoint.dir='/a' disagrees with .*config.dir='/b'"):
        CheckpointPolicy(dir="/a", config=CheckpointConfig(dir="/b"))


def test_checkpointer_config_fills_in_the_run_default_dir():
    run_default = Path("/runs/r1/checkpoints")
    pol = CheckpointPolicy(every_steps=1, config=CheckpointConfig(keep_last=4, lustre_stripe=("-c", "4")))
    got = pol.checkpointer_config(run_default)
    assert got == CheckpointConfig(dir=run_default, keep_last=4, lustre_stripe=("-c", "4"))
    assert pol.config.dir is None  # the policy itself is unchanged
    own = CheckpointPolicy(every_steps=1, dir="/lustre/ck")
    assert own.checkpointer_config(run_default) is own.config


def test_to_dict_is_json_ready():
    import json

    cfg = TrainConfig(steps=1, checkpoint=CheckpointPolicy(dir=Path("/x/ck"), config=None, every_steps=1))
    d = json.loads(json.dumps(cfg.to_dict()))
    assert d["checkpoint"]["dir"] == d["checkpoint"]["config"]["dir"] == "/x/ck"
    assert d["checkpoint"]["keep_last"] == d["checkpoint"]["config"]["keep_last"] == 3
