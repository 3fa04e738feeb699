"""CheckpointConfig: its own torch-free module, one rule per field, the same object everywhere it is exported."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hpctrain.ckpt.config import (
    ABANDONED_AFTER_S,
    RESTORE_EXCHANGES,
    RESTORE_MODES,
    CheckpointConfig,
    check_field,
)
from hpctrain.defaults import DEFAULT_DIST_TIMEOUT_S
from hpctrain.errors import UsageError

ROOT = Path(__file__).resolve().parents[2]


def test_login_node_import_is_torch_free_and_exports_one_class():
    code = (
        "import sys\n"
        "import hpctrain.ckpt\n"
        "from hpctrain.ckpt import CheckpointConfig\n"
        "from hpctrain.ckpt.config import CheckpointConfig as C\n"
        "assert CheckpointConfig is C and CheckpointConfig(dir='/x').keep_last == 3\n"
        "bad = [m for m in sys.modules if m.split('.')[0] in ('torch', 'numpy')]\n"
        "assert not bad, bad\n"
    )
    r = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert r.returncode == 0, r.stderr


def test_the_torch_side_uses_the_same_class_and_values():
    pytest.importorskip("torch")
    from hpctrain.ckpt import _fetch, _restore, _scan, checkpointer

    assert checkpointer.CheckpointConfig is CheckpointConfig
    # defined once in ckpt/config.py; these modules must agree (better: import them from there)
    assert tuple(_restore.RESTORE_MODES) == RESTORE_MODES
    assert tuple(_fetch.EXCHANGES) == RESTORE_EXCHANGES
    assert _scan.ABANDONED_AFTER_S == ABANDONED_AFTER_S


def test_defaults():
    cfg = CheckpointConfig()
    assert cfg.dir is None and cfg.keep_last == 3 and cfg.keep_every == 0
    assert cfg.agreement_timeout_s == DEFAULT_DIST_TIMEOUT_S and cfg.abandoned_after_s == ABANDONED_AFTER_S
    assert (cfg.restore_mode, cfg.restore_exchange) == ("auto", "auto")


@pytest.mark.parametrize(
    "kw, message",
    [
        ({"dir": 5}, r"CheckpointConfig.dir must be a directory path \(a str or os.PathLike\) or None"),
        ({"dir": b"/x"}, "CheckpointConfig.dir must be a directory path"),
        ({"dir": ""}, "CheckpointConfig.dir must be a directory path"),
        ({"keep_last": -1}, r"CheckpointConfig.keep_last must be an integer >= 0 \(0 = keep all\), got -1"),
        ({"keep_last": True}, "CheckpointConfig.keep_last must be an integer"),
        ({"keep_every": 2.0}, "CheckpointConfig.keep_every must be an integer"),
        ({"verify_checksums": "no"}, "CheckpointConfig.verify_checksums must be True or False, got 'no'"),
        ({"check_free_space": 0}, "CheckpointConfig.check_free_space must be True or False"),
        ({"clean_abandoned": "yes"}, "CheckpointConfig.clean_abandoned must be True or False"),
        ({"agreement_timeout_s": 0}, "CheckpointConfig.agreement_timeout_s must be a number > 0"),
        ({"agreement_timeout_s": float("inf")}, "CheckpointConfig.agreement_timeout_s must be a number > 0"),
        ({"abandoned_after_s": -1.0}, "CheckpointConfig.abandoned_after_s must be a number > 0"),
        ({"free_space_margin": 0.5}, "CheckpointConfig.free_space_margin must be a number >= 1.0"),
        ({"lustre_stripe": "-c -1"}, "CheckpointConfig.lustre_stripe must be a tuple of strings"),
        ({"lustre_stripe": ("-c", 1)}, "CheckpointConfig.lustre_stripe must be a tuple of strings"),
        ({"restore_mode": "read_some"}, "CheckpointConfig.restore_mode must be one of auto, read_once, read_all"),
        ({"restore_exchange": "nccl"}, "CheckpointConfig.restore_exchange must be one of auto, host, device, node"),
    ],
)
def test_each_field_is_checked_and_named_in_one_line(kw, message):
    with pytest.raises(UsageError, match=message) as e:
        CheckpointConfig(**kw)
    assert "\n" not in str(e.value)


def test_every_field_has_a_rule_and_lists_become_tuples():
    for f in dataclasses.fields(CheckpointConfig):
        check_field(CheckpointConfig(), f.name, getattr(CheckpointConfig(), f.name))
    assert CheckpointConfig(lustre_stripe=["-c", "4"]).lustre_stripe == ("-c", "4")
    assert CheckpointConfig(dir=Path("/x")).dir == Path("/x")


def test_a_checkpointer_needs_a_directory():
    pytest.importorskip("torch")
    from hpctrain.ckpt import Checkpointer

    with pytest.raises(UsageError, match="CheckpointConfig.dir must be a directory path for a Checkpointer"):
        Checkpointer(CheckpointConfig())
