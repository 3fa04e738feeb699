"""Stop signals are only recorded; every rank agrees on the stop step; the requeue policy."""

from __future__ import annotations

import os
import signal
import time

import pytest

from hpctrain.runtime.preemption import StopAgreement, StopCause, StopSignals, classify_stop, requeue_decision
from tests.multiproc import run_world


def test_handler_only_records_and_uninstall_restores():
    before = signal.getsignal(signal.SIGUSR2)
    sigs = StopSignals().install()
    try:
        assert not sigs.requested
        os.kill(os.getpid(), signal.SIGUSR2)
        deadline = time.monotonic() + 5
        while not sigs.requested and time.monotonic() < deadline:
            time.sleep(0.01)
        assert sigs.first is not None and sigs.first[0] == signal.SIGUSR2
        assert abs(sigs.first[1] - time.time()) < 5
    finally:
        sigs.uninstall()
    assert signal.getsignal(signal.SIGUSR2) == before


def _loop(rank, world, signal_rank, signal_at, every):
    sigs = StopSignals().install()
    agree = StopAgreement(sigs, every=every)
    for step in range(1, 200):
        if rank == signal_rank and step == signal_at:
            os.kill(os.getpid(), signal.SIGUSR2)
        if rank != signal_rank:
            time.sleep(0.002 * rank)  # ranks run at different speeds
        if agree.should_stop(step):
            return step, agree.decision.signum, sigs.requested
    return None, 0, sigs.requested


@pytest.mark.parametrize("every", [1, 4])
def test_a_signal_on_one_rank_stops_every_rank_at_the_same_step(every):
    results = run_world(_loop, 3, 1, 7, every).results
    steps = {r[0] for r in results}
    assert len(steps) == 1 and None not in steps, results
    (stop,) = steps
    # pipelined: the poll after the one that carried the signal, never earlier, never much later
    assert 7 < stop < 7 + 2 * every
    assert all(r[1] == signal.SIGUSR2 for r in results)
    assert [r[2] for r in results] == [False, True, False]  # only rank 1 was signalled


def test_classify_by_the_clock():
    # USR2 at the lead before a 10 min limit: the time limit; 3 minutes in: a preemption.
    assert classify_stop(signal.SIGUSR2, elapsed_s=480, time_limit_s=600, lead_s=120) == StopCause.TIME_LIMIT
    assert classify_stop(signal.SIGTERM, elapsed_s=180, time_limit_s=600, lead_s=120) == StopCause.PREEMPTION
    assert classify_stop(signal.SIGTERM, elapsed_s=180, time_limit_s=None, lead_s=120) == StopCause.PREEMPTION


def test_requeue_policy():
    ok, why = requeue_decision(StopCause.PREEMPTION, restarts=0, max_requeues=3, committed_new_step=True)
    assert ok and "1 of 3" in why
    ok, why = requeue_decision(StopCause.TIME_LIMIT, restarts=3, max_requeues=3, committed_new_step=True)
    assert not ok and "--max-requeues 3" in why
    ok, why = requeue_decision(StopCause.TIME_LIMIT, restarts=0, max_requeues=3, committed_new_step=False)
    assert not ok and "no new checkpoint step" in why
    for cause in (StopCause.CANCELLED, StopCause.USER_ERROR, StopCause.FINISHED):
        ok, why = requeue_decision(cause, restarts=0, max_requeues=3, committed_new_step=True)
        assert not ok and "not requeued" in why


def test_after_the_attempt_a_late_warning_is_ignored_not_fatal():
    sigs = StopSignals().install()
    try:
        sigs.ignore_from_now()
        assert signal.getsignal(signal.SIGUSR2) == signal.SIG_IGN
        os.kill(os.getpid(), signal.SIGUSR2)  # would end the process with the default action
        time.sleep(0.05)
        assert not sigs.requested
        assert signal.getsignal(signal.SIGTERM) == sigs._record  # a cancel still counts
    finally:
        sigs.uninstall()
