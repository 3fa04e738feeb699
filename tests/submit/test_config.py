import pytest

from hpctrain.errors import UsageError
from hpctrain.submit.cli import resolve_config
from hpctrain.submit.config import SubmitConfig, format_time, load_toml, parse_time


@pytest.mark.parametrize(
    "text, seconds",
    [
        ("30", 1800),
        ("90", 5400),
        ("5:30", 330),
        ("01:00:00", 3600),
        ("2-00", 172800),
        ("1-02:03", 93780),
        ("1-02:03:04", 93784),
        ("0:59:59", 3599),
    ],
)
def test_parse_time_accepts_slurm_formats(text, seconds):
    assert parse_time(text) == seconds


@pytest.mark.parametrize("text", ["25:99", "1:60:00", "1-24:00:00", "0", "abc", "1h", "-5", "1:2:3:4", ""])
def test_parse_time_rejects_bad_values(text):
    with pytest.raises(UsageError, match="--time"):
        parse_time(text)


def test_format_time():
    assert format_time(3599) == "00:59:59" and format_time(93784) == "1-02:03:04"


def test_derived_values():
    cfg = SubmitConfig(nodes=3, gpus_per_node=4, time="00:10:30")
    assert (cfg.ntasks_per_node, cfg.world_size, cfg.time_min, cfg.signal_lead_s) == (4, 12, 11, 120)
    assert SubmitConfig(nodes=2).ntasks_per_node == 1  # CPU job: one task per node
    assert SubmitConfig(time="4").signal_lead_s == 60  # short job: a quarter of the limit


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"nodes": 0}, "--nodes 0 must be at least 1"),
        ({"gpus_per_node": -1}, "--gpus-per-node"),
        ({"tasks_per_node": 0}, "--tasks-per-node"),
        ({"time": "25:99"}, "--time"),
        ({"mem": "lots"}, "--mem"),
        ({"signal_lead": 3600, "time": "30"}, "--signal-lead"),
        ({"cluster": "pbs"}, "--cluster"),
        ({"job_name": "a\nrm -rf /"}, "--job-name"),
        ({"job_name": "50%"}, "--job-name"),
        ({"run_dir": "/tmp/x\ny"}, "--run-dir"),
        ({"partition": "debug;reboot"}, "--partition"),
        ({"nodes": "2"}, "--nodes '2' must be an integer"),
        ({"entry_args": ["ok", "bad\nline"]}, "control characters"),
        ({"warm_spares": True}, "--warm-spares needs spare nodes .* or use --in-job-recovery"),
        ({"in_job_recovery": "yes"}, "--in-job-recovery .yes. must be True or False"),
    ],
)
def test_validation_names_the_option(kwargs, message):
    with pytest.raises(UsageError, match=message.replace("(", r"\(")):
        SubmitConfig(**kwargs)


def test_toml_and_cli_precedence(tmp_path):
    (tmp_path / "hpctrain.toml").write_text(
        '[job]\nnodes = 4\ntime = "02:00:00"\npartition = "low"\n[train]\nentry = "pkg.mod:fn"\nargs = ["--lr", "1"]\n'
    )
    cfg, _ = resolve_config(["--nodes", "2"], cwd=tmp_path)
    assert (cfg.nodes, cfg.time, cfg.partition, cfg.entry, cfg.entry_args) == (
        2,
        "02:00:00",
        "low",
        "pkg.mod:fn",
        ["--lr", "1"],
    )
    cfg, _ = resolve_config(["--entry", "x:y", "--", "--lr", "2", "--", "z"], cwd=tmp_path)
    assert cfg.entry == "x:y" and cfg.entry_args == ["--lr", "2", "--", "z"] and cfg.nodes == 4


def test_explicit_config_file_wins_over_cwd_file(tmp_path):
    (tmp_path / "hpctrain.toml").write_text("[job]\nnodes = 4\n")
    other = tmp_path / "other.toml"
    other.write_text("[job]\nnodes = 7\ntime = 30\n")
    cfg, _ = resolve_config(["--config", str(other)], cwd=tmp_path)
    assert cfg.nodes == 7 and cfg.time_s == 1800


@pytest.mark.parametrize(
    "text, message",
    [
        ("[job]\nnodez = 2\n", r"unknown key\(s\) \['nodez'\] in \[job\]"),
        ("[train]\nentry = 'a:b'\nepochs = 3\n", r"unknown key\(s\) \['epochs'\] in \[train\]"),
        ("[jobs]\nnodes = 2\n", r"unknown table"),
        ("[job\nnodes = 2\n", "not valid TOML"),
        ("[train]\nargs = '--lr 1'\n", "list of strings"),
    ],
)
def test_bad_toml_is_rejected(tmp_path, text, message):
    path = tmp_path / "c.toml"
    path.write_text(text)
    with pytest.raises(UsageError, match=message):
        load_toml(path)


def test_one_default_for_requeues_and_the_dist_timeout(tmp_path, monkeypatch):
    """Issue 18 §4: each default is defined once (hpctrain.defaults); the config, the Runner, its command line
    and the runtime all take it from there."""
    import inspect

    from hpctrain.ckpt import CheckpointConfig
    from hpctrain.defaults import DEFAULT_DIST_TIMEOUT_S, DEFAULT_MAX_REQUEUES
    from hpctrain.launch import runner
    from hpctrain.launch.settings import RunnerSettings

    cfg = SubmitConfig()
    assert (cfg.max_requeues, cfg.dist_timeout) == (DEFAULT_MAX_REQUEUES, DEFAULT_DIST_TIMEOUT_S)
    params = inspect.signature(RunnerSettings).parameters
    assert params["max_requeues"].default == DEFAULT_MAX_REQUEUES
    assert params["dist_timeout"].default == DEFAULT_DIST_TIMEOUT_S
    assert CheckpointConfig().agreement_timeout_s == DEFAULT_DIST_TIMEOUT_S
    seen = []
    monkeypatch.setattr(runner.Runner, "__call__", lambda self: seen.append(self))
    assert runner.main(["--entry", "pkg.mod:fn", "--run-dir", str(tmp_path)]) == 0
    got = seen[0].settings
    assert (got.max_requeues, got.dist_timeout) == (DEFAULT_MAX_REQUEUES, DEFAULT_DIST_TIMEOUT_S)


def test_runtime_defaults_come_from_the_same_place():
    import inspect

    pytest.importorskip("torch")
    from hpctrain.defaults import DEFAULT_DIST_TIMEOUT_S
    from hpctrain.runtime import preemption, process_group

    assert inspect.signature(process_group.init_process_group).parameters["timeout_s"].default == DEFAULT_DIST_TIMEOUT_S
    assert inspect.signature(preemption.StopAgreement).parameters["timeout_s"].default == DEFAULT_DIST_TIMEOUT_S


def test_config_is_frozen_and_keeps_its_checks():
    import dataclasses

    cfg = SubmitConfig(nodes=2)
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.nodes = 0  # type: ignore[misc]
    with pytest.raises(UsageError, match="--nodes 0 must be at least 1"):
        dataclasses.replace(cfg, nodes=0)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"nodes": True}, "--nodes True must be an integer"),
        ({"max_requeues": -1}, "--max-requeues -1 must be at least 0"),
        ({"dist_timeout": 0}, "--dist-timeout 0 must be at least 1"),
        ({"dist_timeout": 1.5}, "--dist-timeout 1.5 must be an integer"),
        ({"cpus_per_task": 10**9}, "--cpus-per-task 1000000000 is too large"),
        ({"entry": 5}, "--entry 5 must be a string"),
        ({"time": 30}, None),  # `time = 30` in TOML: 30 minutes, as in Slurm
    ],
)
def test_flag_named_errors_from_the_shared_checks(kwargs, message):
    if message is None:
        assert SubmitConfig(**kwargs).time == "30"
        return
    with pytest.raises(UsageError, match=message) as e:
        SubmitConfig(**kwargs)
    assert "\n" not in str(e.value)


def test_run_table_and_ownership_flags(tmp_path):
    """[run] in hpctrain.toml: owner, team, notes, require_clean; the flags override it (issue 19)."""
    (tmp_path / "hpctrain.toml").write_text(
        '[train]\nentry = "pkg.mod:fn"\n[run]\nowner = "ada"\nteam = "vision"\n'
        'notes = """two lines\nof purpose"""\nrequire_clean = true\n'
    )
    cfg, _ = resolve_config([], cwd=tmp_path)
    assert (cfg.owner, cfg.team, cfg.notes, cfg.require_clean) == ("ada", "vision", "two lines\nof purpose", True)
    cfg, _ = resolve_config(["--owner", "bob", "--notes", "rerun"], cwd=tmp_path)
    assert (cfg.owner, cfg.team, cfg.notes) == ("bob", "vision", "rerun")
    assert SubmitConfig().owner is None and SubmitConfig().require_clean is False
    cfg, _ = resolve_config(["--require-clean", "--entry", "a:b"], cwd=tmp_path / "nowhere")
    assert cfg.require_clean is True and cfg.to_dict()["require_clean"] is True


@pytest.mark.parametrize(
    "text, message",
    [
        ("[run]\nowner = 3\n", "--owner 3 must be a string or None"),
        ("[run]\nrequire_clean = 'yes'\n", "--require-clean 'yes' must be True or False"),
        (
            "[run]\nowners = 'x'\n",
            r"unknown key\(s\) \['owners'\] in \[run\]; valid keys: notes, owner, require_clean, secret_patterns, team",
        ),
        ("[job]\nowner = 'x'\n", r"unknown key\(s\) \['owner'\] in \[job\]"),
        ('[run]\nteam = "a\\nb"\n', "--team 'a\\\\nb' must be one non-empty line"),
        ("[run]\nowner = ' '\n", "--owner ' ' must be one non-empty line"),
        ('[run]\nnotes = "a\\u0007b"\n', "--notes must be text of at most 10000 characters"),
    ],
)
def test_bad_run_table_is_one_line(tmp_path, text, message):
    path = tmp_path / "c.toml"
    path.write_text(text)
    with pytest.raises(UsageError, match=message) as e:
        SubmitConfig(**load_toml(path))
    assert "\n" not in str(e.value)
