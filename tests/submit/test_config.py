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
