"""The checkpointer owns "when": SaveCadence is the one rule both checkpointers answer ``should_save`` with."""

from __future__ import annotations

import pytest

from hpctrain.ckpt.config import CheckpointConfig, SaveCadence
from hpctrain.errors import UsageError


def test_global_every_n_steps_local_in_between_and_global_wins_a_shared_step():
    c = SaveCadence(every_steps=6, local_every_steps=2)
    assert [c.tier(s) for s in range(1, 13)] == [
        None, "auto", None, "auto", None, "global", None, "auto", None, "auto", None, "global"
    ]  # fmt: skip


def test_a_requested_save_is_global_and_no_cadence_saves_nothing():
    assert SaveCadence().tier(7) is None
    assert SaveCadence().tier(7, requested=True) == "global"
    assert SaveCadence(local_every_steps=3).tier(4, requested=True) == "global"


def test_a_plain_checkpointer_answers_global_only(tmp_path):
    from hpctrain.ckpt import Checkpointer

    ck = Checkpointer(CheckpointConfig(dir=tmp_path, local_every_steps=2), every_steps=4)
    assert ck.tiers == ("global",)
    assert [ck.should_save(s) for s in (2, 4)] == [None, "global"]  # the local cadence is the tiered one's
    with pytest.raises(UsageError, match="save\\(tier=...\\)"):
        ck.save(1, tier="local")
    ck.close()


def test_the_tiered_checkpointer_adds_the_local_cadence(tmp_path):
    from hpctrain.ckpt.tiers import TieredCheckpointer

    cfg = CheckpointConfig(dir=tmp_path / "g", local_dir=tmp_path / "l", local_every_steps=2)
    ck = TieredCheckpointer(cfg, every_steps=6)
    assert ck.tiers == ("local", "global")
    assert [ck.should_save(s) for s in (1, 2, 6)] == [None, "auto", "global"]
    ck.close()


def test_the_renamed_option_says_what_it_counts():
    with pytest.raises(UsageError, match="CheckpointConfig.global_every_local_saves"):
        CheckpointConfig(global_every_local_saves=0)
    with pytest.raises(TypeError):
        CheckpointConfig(global_every=3)  # the old name is gone, not silently ignored
