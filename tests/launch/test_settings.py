"""One name per Runner setting (issue 29): every RunnerSettings field is reachable from SubmitConfig by its name and
from ``python -m hpctrain.launch``'s generated flags (and the sbatch template's environment), reaches the Runner
through its pickle, and a Runner pickled by an older hpctrain still loads."""

from __future__ import annotations

import dataclasses
import pickle
import re
import time
import types
import typing as tp
from pathlib import Path

import pytest

from hpctrain.errors import UsageError
from hpctrain.launch import Runner, RunnerSettings
from hpctrain.launch import runner as runner_module
from hpctrain.launch.settings import _kind, env_name, flag
from hpctrain.submit.backend import _runner
from hpctrain.submit.config import SubmitConfig
from hpctrain.submit.sbatch import slurm_parameters

ROOT = Path(__file__).resolve().parents[2]
FIELDS = dataclasses.fields(RunnerSettings)


def _other_value(f: dataclasses.Field) -> tp.Any:
    """A value of the field's type that is not its default."""
    return {int: 7, float: 123.0, str: "/opt/code", bool: f.default is not True}[_kind(f)]


def _launch(argv, monkeypatch, environ=None):
    """``python -m hpctrain.launch ARGV``'s Runner, not called."""
    seen = []
    monkeypatch.setattr(Runner, "__call__", lambda self: seen.append(self))
    if environ is not None:
        for name, value in environ.items():
            monkeypatch.setenv(name, value)
    assert runner_module.main(["--entry", "pkg.mod:fn", "--run-dir", "/r", *argv]) == 0
    return seen[0]


def test_every_setting_is_a_submit_config_attribute_of_the_same_name():
    cfg = SubmitConfig(entry="m:f")
    missing = [f.name for f in FIELDS if not hasattr(cfg, f.name)]
    assert not missing, f"RunnerSettings fields with no SubmitConfig attribute of that name: {missing}"
    settings = RunnerSettings.from_config(cfg)
    assert all(getattr(settings, f.name) == getattr(cfg, f.name) for f in FIELDS)


def test_a_value_set_in_submit_config_reaches_the_runner_by_name(tmp_path):
    cfg = SubmitConfig(entry="m:f", gpus_per_node=2, dist_timeout=77, max_requeues=5, signal_lead=45,
                       time="00:30:00", hang_timeout=90, code_path="/opt/code")  # fmt: skip
    settings = pickle.loads(pickle.dumps(_runner(cfg, tmp_path))).settings  # what submitit hands the nodes
    for f in FIELDS:
        assert getattr(settings, f.name) == getattr(cfg, f.name), f.name
    assert (settings.time_limit, settings.signal_lead_s) == (1800, 45.0)


def test_every_setting_is_a_flag_of_the_launch_command_line(monkeypatch):
    parser = runner_module.build_parser()
    flags = {opt for action in parser._actions for opt in action.option_strings}
    for f in FIELDS:
        assert flag(f.name) in flags, f"{f.name} has no flag {flag(f.name)} on python -m hpctrain.launch"
        value = _other_value(f)
        argv = [flag(f.name)] if value is True else [f"--no-{flag(f.name)[2:]}"] if value is False else []
        argv = argv or [flag(f.name), str(value)]
        got = getattr(_launch(argv, monkeypatch).settings, f.name)
        assert got == value and type(got) is type(value), (f.name, got)
    assert _launch([], monkeypatch).settings == RunnerSettings()  # no flag: the fields' defaults


def test_settings_from_env_read_each_settings_variable_and_flags_win(monkeypatch):
    for f in FIELDS:
        monkeypatch.delenv(env_name(f.name), raising=False)
    environ = {env_name(f.name): str(int(v) if isinstance(v, bool) else v) for f in FIELDS for v in [_other_value(f)]}
    got = _launch(["--settings-from-env"], monkeypatch, environ).settings
    assert got == RunnerSettings(**{f.name: _other_value(f) for f in FIELDS})
    assert _launch([], monkeypatch, environ).settings == RunnerSettings()  # only when asked
    assert _launch(["--settings-from-env", "--max-requeues", "1"], monkeypatch).settings.max_requeues == 1
    monkeypatch.setenv("HPCTRAIN_HANG_TIMEOUT", "soon")
    with pytest.raises(UsageError, match="HPCTRAIN_HANG_TIMEOUT='soon' is not a float"):
        _launch(["--settings-from-env"], monkeypatch)
    monkeypatch.setenv("HPCTRAIN_HANG_TIMEOUT", "")  # empty: not set (the template's unset variables)
    assert _launch(["--settings-from-env"], monkeypatch).settings.hang_timeout is None


def test_the_sbatch_template_uses_the_generated_flags():
    text = (ROOT / "sbatch_templates" / "ddp.sbatch").read_text()
    launch = re.search(r'-m hpctrain\.launch (.*?) -- "\$@"', text)
    assert launch, "the template's python -m hpctrain.launch line"
    parser = runner_module.build_parser()
    flags = {opt for action in parser._actions for opt in action.option_strings}
    used = re.findall(r"(--[a-z-]+)", launch.group(1))
    assert "--settings-from-env" in used and set(used) <= flags, used
    # the settings it documents are named as the fields are (HPCTRAIN_<FIELD>)
    documented = set(re.findall(r"^#   (HPCTRAIN_[A-Z_]+)", text, re.M))
    names = {env_name(f.name) for f in FIELDS}
    template_own = {"HPCTRAIN_ENTRY", "HPCTRAIN_RUN_DIR", "HPCTRAIN_PYTHON", "HPCTRAIN_SPARE_NODES",
                    "HPCTRAIN_EXCLUDE_STRAGGLERS", "HPCTRAIN_STAGE", "HPCTRAIN_STAGE_DIR"}  # fmt: skip
    assert documented - template_own <= names, documented - template_own - names


@pytest.mark.parametrize("time_, lead", [("01:00:00", None), ("4", None), ("00:30:00", 45)])
def test_the_runner_assumes_the_warning_lead_the_job_asks_slurm_for(time_, lead, tmp_path):
    cfg = SubmitConfig(entry="m:f", time=time_, signal_lead=lead)
    settings = _runner(cfg, tmp_path).settings
    assert settings.signal_lead_s == cfg.signal_lead_s == slurm_parameters(cfg)["signal_delay_s"]
    assert RunnerSettings().signal_lead_s == 0.0  # nothing known: unknown, as before


def test_a_value_set_in_submit_config_arrives_in_the_runners_watchdog(tmp_path, monkeypatch):
    from hpctrain.runtime import watchdog

    cfg = SubmitConfig(entry="m:f", hang_timeout=90)
    runner = pickle.loads(pickle.dumps(_runner(cfg, tmp_path)))
    monkeypatch.setattr(watchdog.Watchdog, "start", lambda self: self)  # no thread: the object is what counts
    env = types.SimpleNamespace(job_id="7", restart_count=0, rank=0, world_size=1)
    try:
        watch = runner._start_watchdog(env, time.time())
    finally:
        watchdog.install(None)
    assert watch.hang_timeout == cfg.hang_timeout == 90
    assert watchdog.hang_timeout("train", 0.5, watch.hang_timeout) == 90.0


def test_a_runner_pickled_by_an_older_hpctrain_keeps_its_settings():
    old = object.__new__(Runner)  # the attributes of a Runner from before RunnerSettings
    old.__dict__.update(entry="m:f", run_dir="/r", entry_args=("--x",), gpus_per_node=4, dist_timeout_s=60.0,
                        max_requeues=2, signal_lead_s=30.0, time_limit_s=3600.0)  # fmt: skip
    loaded = pickle.loads(pickle.dumps(old))
    assert (loaded.entry, loaded.run_dir, loaded.entry_args) == ("m:f", "/r", ("--x",))
    assert loaded.settings == RunnerSettings(
        gpus_per_node=4, dist_timeout=60, max_requeues=2, signal_lead=30, time_limit=3600
    )  # hang_timeout and code_path: absent from the oldest ones, their defaults
    assert loaded.settings.signal_lead_s == 30.0 and not hasattr(loaded, "dist_timeout_s")
    new = pickle.loads(pickle.dumps(Runner(entry="m:f", run_dir="/r", settings=RunnerSettings(hang_timeout=5))))
    assert new.settings.hang_timeout == 5.0
