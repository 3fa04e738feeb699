"""What is never stored (docs/bundle.md): files that look like credentials (untracked, changed, committed, in a
package outside git, and the user's ``[run] secret_patterns``) are named and hashed but not kept in the code
snapshot, with one warning line; secret-looking environment variables, flags and URL credentials are redacted.
The rule has one owner, :mod:`hpctrain.identity.redact`."""

from __future__ import annotations

import gzip
import hashlib
import json
import secrets
import tarfile
from pathlib import Path

import pytest

from hpctrain.errors import UsageError
from hpctrain.identity import redact
from hpctrain.identity.code import capture_code, capture_repository, public_code
from hpctrain.identity.redact import REDACTED, SecretRule, redact_argv, redact_env, secret_name
from hpctrain.identity.runtime import capture_runtime
from hpctrain.identity.snapshot import restore_snapshot, write_snapshot
from hpctrain.rundir import RunDir
from hpctrain.submit import backend
from hpctrain.submit.config import SubmitConfig, load_toml

from .conftest import fake_cfg, git

# The secret values are made at run time: this file is itself untracked or changed in hpctrain's own checkout,
# which the captures record too, so a literal here would be found in every snapshot. And the key header is
# built from parts: no line of this file is one (the rule would withhold this file).
S = secrets.token_hex(8)
KEY = ("-----BEGIN " + "OPENSSH PRIVATE KEY-----\n" + "b3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAA\n").encode()
SECRETS = {
    ".env": f"HF_TOKEN=hf_{S}_dotenv\n".encode(),
    "id_rsa": KEY + f"rsa-{S}\n".encode(),
    "conf/.env.production": f"DB_PASSWORD={S}_prod\n".encode(),
    "deploy/server.pem": f"pem-{S}\n".encode(),
    "hf_token": f"hf_{S}_tokenfile\n".encode(),
    "notes/looks-harmless.txt": KEY + f"content-{S}\n".encode(),  # found by its content
}


def snapshot_bytes(path: Path) -> bytes:
    """Every byte the snapshot's members hold, uncompressed (names and contents)."""
    return gzip.decompress(path.read_bytes())


def members(path: Path) -> set:
    with tarfile.open(path) as tar:
        return set(tar.getnames())


@pytest.mark.parametrize(
    "rel, why",
    [
        (".env", True),
        ("sub/.env.local", True),
        ("id_rsa", True),
        ("keys/id_ed25519", True),
        ("id_rsa.pub", False),
        ("certs/site.pem", True),
        ("tls.KEY", True),
        ("credentials.json", True),
        (".netrc", True),
        (".pgpass", True),
        (".git-credentials", True),
        ("hf_token", True),
        ("github-token.txt", True),
        ("api.token", True),
        ("mypkg/tokenizer.json", False),
        ("mypkg/tokenizer.py", False),
        ("special_tokens_map.json", False),
        ("token.py", False),
        ("mypkg/keys.py", False),
        (".envrc.py", False),
    ],
)
def test_the_default_rule_on_names(rel, why):
    assert bool(SecretRule().name(rel)) is why


def test_user_patterns_add_to_the_defaults():
    rule = SecretRule(("*.secret", "mycreds/*", "/top/", "vault"))
    assert rule.name("a/b.secret") and rule.name("mycreds/x.txt") and rule.name("mycreds/deep/y")
    assert rule.name("top/z.py") and rule.name("x/vault/y") and rule.name(".env")
    assert not rule.name("other/mycreds.txt") and not rule.name("a/top/z.py") and not rule.name("b.SECRET")
    assert SecretRule.content(b"\n  " + KEY) and not SecretRule.content(b"# " + KEY)


@pytest.mark.parametrize(
    "name, secret",
    [
        ("HF_TOKEN", True),
        ("GITHUB_TOKEN", True),
        ("AWS_REGION", True),
        ("WANDB_API_KEY", True),
        ("SLURM_JWT", True),
        ("DB_PASSWORD", True),
        ("apiKey", True),
        ("--api-key", True),
        ("MY_SECRET_THING", True),
        ("TOKENIZERS_PARALLELISM", False),
        ("--max-tokens", False),
        ("SLURM_JOB_ID", False),
        ("PWD", False),
        ("--keep", False),
    ],
)
def test_secret_names(name, secret):
    assert secret_name(name) is secret


def test_argv_and_env_values_are_redacted():
    argv = ["--lr", "1", "--token", "ghp_x", "--api-key=zzz", "HF_TOKEN=abc", "--password", "--verbose"]
    argv += ["https://bob:pw@git.example.org/r.git", "--url=https://h/x?private_token=t0k&page=2", "--max-tokens", "5"]
    assert redact.redact_text("see ssh://u:pw@h/x and ftp://a@b/c?x=1") == "see ssh://u@h/x and ftp://b/c?x=1"
    assert (
        redact.redact_text("s3://b/k?sig=1&X-Amz-Security-Token=t") == f"s3://b/k?sig=1&X-Amz-Security-Token={REDACTED}"
    )
    assert redact_argv(argv) == [
        "--lr",
        "1",
        "--token",
        REDACTED,
        f"--api-key={REDACTED}",
        f"HF_TOKEN={REDACTED}",
        "--password",
        "--verbose",
        "https://git.example.org/r.git",
        "--url=https://h/x",  # a web URL's query string goes (as for remotes)
        "--max-tokens",
        "5",
    ]
    env = {"SLURM_JWT": "eyJ.x.y", "SLURM_JOB_ID": "7", "X": "postgres://u:pw@db/x"}
    assert redact_env(env) == {"SLURM_JWT": REDACTED, "SLURM_JOB_ID": "7", "X": "postgres://u@db/x"}


def test_the_recorded_environment_and_command_line_hold_no_secret(repo, monkeypatch):
    monkeypatch.setenv("SLURM_JWT", f"eyJhbGciOi.jwt-{S}")
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    runtime = capture_runtime(node=False)
    assert runtime["slurm"]["SLURM_JWT"] == REDACTED and runtime["slurm"]["SLURM_JOB_ID"] == "4242"
    code = capture_code(
        "mypkg.train:main",
        argv=["-m", "hpctrain.submit", "--", "--hf-token", f"hf_argv_{S}"],
        entry_args=[f"--wandb-api-key=wb_{S}"],
    )
    text = json.dumps(public_code(code)) + json.dumps(runtime)
    assert S not in text and code["argv"][-1] == REDACTED
    assert code["entry_args"] == [f"--wandb-api-key={REDACTED}"]


def test_untracked_credentials_are_hashed_not_stored_with_one_warning(repo, tmp_path):
    for rel, data in SECRETS.items():
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        (repo / rel).write_bytes(data)
    (repo / "mypkg" / "tokenizer.json").write_text('{"vocab": 1}\n')  # not a token file: stored
    (repo / "mycreds").mkdir()
    (repo / "mycreds" / "db.txt").write_bytes(f"user-pattern-{S}\n".encode())
    (repo / "vault.secret").write_bytes(f"user-glob-{S}\n".encode())
    code = capture_code("mypkg.train:main", secret_patterns=["*.secret", "mycreds/*"])
    rec = code["repositories"]["entry"]
    untracked = {u["path"]: u for u in rec["untracked"]}
    hidden = set(SECRETS) | {"mycreds/db.txt", "vault.secret"}
    assert {p for p, u in untracked.items() if u.get("withheld")} == hidden == set(rec["withheld"])
    for rel in hidden:  # recorded: name, size and hash
        data = (repo / rel).read_bytes()
        assert untracked[rel]["sha256"] == hashlib.sha256(data).hexdigest() and untracked[rel]["stored"] is False
    assert "[run] secret_patterns '*.secret'" == untracked["vault.secret"]["withheld"]
    assert untracked["mypkg/tokenizer.json"]["stored"] and "withheld" not in untracked["mypkg/tokenizer.json"]
    assert set(rec["_untracked"]) == {"mypkg/tokenizer.json"}
    lines: list = []
    out = tmp_path / "code.tar.gz"
    info = write_snapshot(out, code, warn=lines.append)
    assert S.encode() not in snapshot_bytes(out) and "entry/untracked/mypkg/tokenizer.json" in members(out)
    assert len(lines) == 1 and lines[0].startswith(
        "hpctrain: 8 files that look like credentials were not stored in the code snapshot (names and hashes "
        "recorded): "
    )
    assert all(name in lines[0] for name in hidden) and "\n" not in lines[0]
    assert {w["path"] for w in info["withheld"]} == hidden and all(w["where"] == "untracked" for w in info["withheld"])
    results = restore_snapshot(out, tmp_path / "rebuilt")
    assert results["entry"]["problems"] == [], results["entry"]["problems"]
    assert sum("withheld from the snapshot as a credential" in n for n in results["entry"]["notes"]) == 8
    assert not (tmp_path / "rebuilt" / "entry" / ".env").exists()
    assert (tmp_path / "rebuilt" / "entry" / "mypkg" / "tokenizer.json").read_text() == '{"vocab": 1}\n'


def test_committed_and_changed_credentials_are_left_out_of_the_tree_and_the_diff(repo, tmp_path):
    (repo / ".env").write_bytes(f"A=committed-{S}\n".encode())
    (repo / "deploy").mkdir()
    (repo / "deploy" / "key.txt").write_bytes(KEY + f"committed-key-{S}\n".encode())  # by content
    (repo / "mypkg" / "settings.py").write_text("X = 1\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "oops")
    (repo / ".env").write_bytes(f"A=changed-{S}\n".encode())  # a changed tracked secret: no diff, no worktree copy
    (repo / "mypkg" / "settings.py").write_bytes(b"X = 2\nPEM = '''\n" + KEY + f"inline-{S}\n'''\n".encode())
    (repo / "mypkg" / "train.py").write_text("def main(ctx):\n    return 2\n")  # an ordinary change
    rec = capture_repository(repo)
    modified = {m["path"]: m for m in rec["modified"]}
    assert modified[".env"]["withheld"] and modified["mypkg/settings.py"]["withheld"] == "its diff holds a private key"
    assert "withheld" not in modified["mypkg/train.py"]
    assert S.encode() not in rec["_diff"] and S not in rec["diff"]["text"] and b"return 2" in rec["_diff"]
    assert set(rec["_modified"]) == {"mypkg/train.py"} and rec["diff"]["withheld"] == [".env", "mypkg/settings.py"]
    full = git(repo, "diff", "HEAD", "--binary", "--no-color").encode()
    assert rec["diff"]["sha256"] == hashlib.sha256(full).hexdigest()  # the identity: the whole diff's hash
    assert rec["diff"]["stored_sha256"] == hashlib.sha256(rec["_diff"]).hexdigest()
    code = capture_code("mypkg.train:main")
    out = tmp_path / "code.tar.gz"
    lines: list = []
    info = write_snapshot(out, code, warn=lines.append)
    assert S.encode() not in snapshot_bytes(out)
    names = members(out)
    assert "entry/tree/mypkg/train.py" in names and "entry/tree/.env" not in names
    assert "entry/tree/deploy/key.txt" not in names and "entry/tree/mypkg/settings.py" in names
    where = {(w["path"], w["where"]) for w in info["withheld"]}
    assert where == {
        (".env", "modified"),
        ("mypkg/settings.py", "modified"),
        (".env", "commit"),
        ("deploy/key.txt", "commit"),
    }
    committed = next(w for w in info["withheld"] if w["path"] == "deploy/key.txt")
    assert committed["sha256"] == hashlib.sha256(KEY + f"committed-key-{S}\n".encode()).hexdigest()
    assert (
        len(lines) == 1
        and lines[0].startswith("hpctrain: 3 files that look like credentials")
        and "deploy/key.txt" in lines[0]
    )
    results = restore_snapshot(out, tmp_path / "rebuilt")
    entry = results["entry"]
    assert entry["problems"] == [], entry["problems"]
    assert entry["diff_matches"] is True  # the rebuilt tree's diff is the stored one
    tree = tmp_path / "rebuilt" / "entry"
    assert (tree / "mypkg" / "train.py").read_text() == "def main(ctx):\n    return 2\n"
    assert not (tree / ".env").exists() and not (tree / "deploy" / "key.txt").exists()
    assert (tree / "mypkg" / "settings.py").read_text() == "X = 1\n"  # the committed version
    assert any("deploy/key.txt: committed, withheld" in n for n in entry["notes"])


def test_a_package_outside_git_leaves_its_credentials_out(package, tmp_path):
    (package / "plainpkg" / ".env").write_bytes(f"T=pkg-{S}\n".encode())
    code = capture_code("plainpkg.train:main")
    rec = code["repositories"]["entry"]
    assert rec["withheld"] == [".env"] and next(f for f in rec["files"] if f["path"] == ".env")["sha256"]
    out = tmp_path / "snap.tar.gz"
    lines: list = []
    write_snapshot(out, code, warn=lines.append)
    assert S.encode() not in snapshot_bytes(out) and len(lines) == 1
    results = restore_snapshot(out, tmp_path / "rebuilt")
    assert results["entry"]["problems"] == [] and any(".env: withheld" in n for n in results["entry"]["notes"])


def test_submission_warns_once_and_the_records_hold_no_secret(repo, tmp_path, capsys):
    (repo / ".env").write_bytes(f"HF_TOKEN=hf_submit_{S}\n".encode())
    (repo / "run.secret").write_bytes(f"user-{S}\n".encode())  # untracked, and the user's pattern
    run = tmp_path / "run"
    record = backend._capture_identity(fake_cfg(secret_patterns=["*.secret"]), run, ["-m", "hpctrain.submit"])
    assert "error" not in record, record
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "hpctrain: 2 files that look like credentials were not stored in the code snapshot (names and hashes "
        "recorded): .env, run.secret"
    ]
    paths = RunDir(run)
    submit = json.loads(paths.identity_submit.read_text())
    assert S not in paths.identity_submit.read_text() and S.encode() not in snapshot_bytes(paths.code_snapshot)
    assert {w["path"] for w in submit["code"]["snapshot"]["withheld"]} == {".env", "run.secret"}
    assert submit["code"]["repositories"]["entry"]["secret_patterns"] == ["*.secret"]


def test_a_start_uses_the_submitted_deny_list(repo, tmp_path, monkeypatch):
    from hpctrain.identity import capture_start
    from hpctrain.identity import manifest as mf

    monkeypatch.setattr(mf, "capture_runtime", lambda node, hostnames=(), cuda=None: capture_runtime(node=False))
    (repo / "a.secret").write_bytes(b"s\n")
    run = tmp_path / "run"
    RunDir(run).root.mkdir(parents=True)
    RunDir(run).submission.write_text(json.dumps({"config": {"secret_patterns": ["*.secret"]}}))
    m = capture_start(run, job_id="7", restart_count=0, entry="mypkg.train:main", world_size=1, gpus_per_node=0)
    untracked = {u["path"]: u for u in m["code"]["repositories"]["entry"]["untracked"]}
    assert untracked["a.secret"]["withheld"] == "[run] secret_patterns '*.secret'"


def test_the_deny_list_is_read_from_run_and_checked(tmp_path):
    good = tmp_path / "good.toml"
    good.write_text('[run]\nsecret_patterns = ["*.secret", "mycreds/*"]\n')
    kwargs = load_toml(good)
    assert SubmitConfig(**kwargs).secret_patterns == ["*.secret", "mycreds/*"]
    for value in ('"*.secret"', "[1]", '[""]', "5"):
        bad = tmp_path / "bad.toml"
        bad.write_text(f"[run]\nsecret_patterns = {value}\n")
        with pytest.raises(UsageError) as err:
            SubmitConfig(**load_toml(bad))
        assert str(err.value).startswith("[run] secret_patterns") and "\n" not in str(err.value)
    job = tmp_path / "job.toml"
    job.write_text('[job]\nsecret_patterns = ["x"]\n')
    with pytest.raises(UsageError, match=r"unknown key\(s\) \['secret_patterns'\] in \[job\]"):
        load_toml(job)


def test_patterns_in_effect_are_scoped_and_checked():
    with redact.using_patterns(["*.x"]):
        assert redact.active_rule().patterns == ("*.x",)
    assert redact.active_rule().patterns == ()
    with pytest.raises(UsageError, match=r"^\[run\] secret_patterns must be a list"):
        redact.active_rule("*.x")  # type: ignore[arg-type]
