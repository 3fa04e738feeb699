"""TrainConfig checks every option on construction and names it in the error."""

from __future__ import annotations

import pytest

from hpctrain.errors import UsageError
from hpctrain.train import CheckpointPolicy, MetricsConfig, TrainConfig


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
