"""Where a restore's time goes (``RestoreResult.phases``): disjoint phases that add up to the call, each naming
the work it holds: a read slowed on one rank shows in that rank's ``read`` phase, and in the phase where the other
ranks wait for it (the reports' gather of ``verify``), not anywhere else."""

from __future__ import annotations

import pytest

from hpctrain.ckpt import RESTORE_PHASES
from tests.ckpt import workers as w
from tests.multiproc import run_world

SLEEP = 0.4


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> str:
    d = tmp_path_factory.mktemp("phases")
    run_world(w.save_steps, 2, str(d), [1, 2])
    return str(d)


def _check_adds_up(got: dict) -> None:
    phases = got["phases"]
    assert set(phases) <= set(RESTORE_PHASES) and list(phases) == [p for p in RESTORE_PHASES if p in phases]
    assert all(v["wall_s"] >= 0 and v["cpu_s"] >= 0 for v in phases.values()), phases
    total = sum(v["wall_s"] for v in phases.values())
    # the phases cover the call but for the clock's own start and the return (microseconds)
    assert got["wall_s"] - 0.005 <= total <= got["wall_s"], (total, got["wall_s"])


def test_one_process_reports_its_phases_and_they_add_up_to_the_call(tmp_path):
    run_world(w.save_steps, 1, str(tmp_path), [1], init_pg=False)
    got = w.restore_phases(0, 1, str(tmp_path))
    assert got["hash"] == w.expected_hash(1)
    _check_adds_up(got)
    assert {"index", "plan", "read", "views", "verify", "load", "other"} <= set(got["phases"])
    assert "index_exchange" not in got["phases"]  # one process exchanges nothing


@pytest.mark.parametrize("exchange", ["node", "host"])
def test_a_slow_read_on_one_rank_shows_in_its_read_and_where_the_other_waits(saved, exchange):
    got = run_world(w.restore_phases, 2, saved, f"restore_read:1:sleep{SLEEP}", exchange).results
    for g in got:
        assert g["hash"] == w.expected_hash(2)
        _check_adds_up(g)
        assert {"index", "index_exchange", "plan", "read", "exchange", "views", "verify", "load"} <= set(g["phases"])
    slow, other = got[1]["phases"], got[0]["phases"]
    assert slow["read"]["wall_s"] >= SLEEP and slow["read"]["cpu_s"] < SLEEP / 2, slow["read"]  # asleep, not busy
    # rank 0 waits for rank 1's bytes: in the exchange (a gather over gloo) or, through the node's buffer, in the
    # reports' gather that tells it every rank has read its part
    waited = other["exchange"]["wall_s"] + other["verify"]["wall_s"]
    assert waited >= SLEEP * 0.8, other
    assert other["read"]["wall_s"] < SLEEP / 2, other
    for name in ("index", "plan", "views", "load", "other"):
        assert slow[name]["wall_s"] < SLEEP / 2 and other[name]["wall_s"] < SLEEP / 2, (name, slow, other)
