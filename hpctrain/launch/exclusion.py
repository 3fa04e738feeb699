"""Which hosts failed an attempt, and keeping the job's next start off them (stdlib only).

Slurm 22.05, measured on the dev cluster (docs/preemption.md, "Node failures"):

* A node set DOWN under a job without ``--no-kill``: Slurm cancels every step ("CANCELLED ... DUE TO NODE
  FAILURE"), SIGTERMs the tasks it can still reach (on the dev cluster, whose "failed" node keeps a healthy
  slurmd, those on that node too; a really failed node's tasks die with it), and — the job asked for
  ``--requeue`` — requeues the job **itself**: while the survivors unwind, ``scontrol show job`` already says
  ``JobState=COMPLETING Restarts=<one more>``; ``sacct -D`` later shows that run as ``NODE_FAIL``.
  From the survivors' side that looks like a preemption without GraceTime or an ``scancel``; what tells them
  apart is the node's state (``down*``/``drained``/..., while ``ReturnToService`` has not brought it back)
  and the ranks that never recorded an end (their node took them down).
* ``scontrol update JobId=J ExcNodeList=...`` is refused while the job runs ("Job is no longer pending
  execution") and accepted once it is requeued (COMPLETING or PENDING). A requeued job waits out its
  BeginTime (``cred_expire`` + 1 s: 11 s on the dev cluster, 121 s by default) before it can start, so an
  update right after the requeue lands before the next start.

The bound (:func:`plan_exclusion`): a job never excludes so many hosts that fewer of its partition's nodes
than it needs stay outside the exclusion list (it would pend forever, ``ReqNodeNotAvail``); the hosts
beyond the bound are recorded as not excluded. Down nodes still count as usable for the bound: they come
back (``ReturnToService``), an exclusion does not.
"""

from __future__ import annotations

import time
import typing as tp
from dataclasses import dataclass, field
from pathlib import Path

from hpctrain.launch.records import claim_decision
from hpctrain.rundir import RunDir, read_json

__all__ = [
    "SPARES_LEFT_ENV",
    "Exclusion",
    "is_failed_state",
    "failed_hosts",
    "attempt_hosts",
    "silent_hosts",
    "earlier_exclusions",
    "plan_exclusion",
    "exclude_hosts",
    "suspects",
]

SPARES_LEFT_ENV = "HPCTRAIN_SPARES_LEFT"
"""Set by the spare-node loop (:mod:`hpctrain.launch.spares`) on every step it starts: how many more in-job
restarts it can make. The deciding rank does not requeue a node failure or hang while it is above zero
(:class:`Failure`, :func:`attribute_end`)."""

# sinfo %T base states of a node that cannot run the job; a trailing '*' means "not responding".
_FAILED = ("down", "drain", "fail", "not_responding", "no_respond", "future", "reboot")


def is_failed_state(state: str) -> bool:
    """``down*``, ``drained``, ``draining``, ``failing``, ``idle*`` (not responding), ...: True."""
    state = state.strip().lower()
    return state.endswith("*") or state.rstrip("~#!%$@^-+").startswith(_FAILED)


def failed_hosts(slurm: tp.Any, hosts: tp.Sequence[str]) -> tp.List[str]:
    """The hosts among ``hosts`` that Slurm holds in a failed state now ([] when sinfo does not answer)."""
    from hpctrain._slurm import SlurmCommandError

    try:
        states = slurm.node_states(list(hosts))
    except SlurmCommandError:
        return []
    return [h for h in hosts if is_failed_state(states.get(h, ""))]


def attempt_hosts(run_dir: Path, job_id: str, restart_count: int, world_size: int) -> tp.Dict[int, str]:
    """``{rank: host}`` from the ranks' join records (:meth:`RunDir.rank_record`) of one attempt."""
    paths, hosts = RunDir(run_dir), {}
    for rank in range(world_size):
        record = read_json(paths.rank_record(job_id, restart_count, rank), [])
        if record is not None and isinstance(record.get("hostname"), str):
            hosts[rank] = record["hostname"]
    return hosts


def silent_hosts(run_dir: Path, job_id: str, restart_count: int, world_size: int, wait_s: float = 0.0) -> tp.List[str]:
    """Hosts none of whose ranks recorded an end (:meth:`RunDir.rank_end`) within ``wait_s``: their processes
    died with them. A host some of whose ranks did record an end is alive."""
    hosts = attempt_hosts(run_dir, job_id, restart_count, world_size)
    paths = RunDir(run_dir)
    deadline = time.monotonic() + wait_s
    while True:
        ended = {r for r in hosts if paths.rank_end(job_id, restart_count, r).exists()}
        silent = sorted({h for h in hosts.values()} - {hosts[r] for r in ended})
        if not silent or time.monotonic() >= deadline:
            return silent
        time.sleep(0.2)


def earlier_exclusions(run_dir: Path) -> tp.List[str]:
    """Every host the run's ledger says hpctrain excluded before (``excluded_nodes`` of exit records)."""
    from hpctrain.ledger import Ledger

    hosts: tp.List[str] = []
    for record in Ledger(run_dir).records():
        for h in record.get("excluded_nodes") or []:
            if isinstance(h, str) and h not in hosts:
                hosts.append(h)
    return hosts


@dataclass
class Exclusion:
    """What :func:`exclude_hosts` did; its fields go into the ledger's exit record."""

    excluded_nodes: tp.List[str] = field(default_factory=list)
    """The job's whole exclusion list after this (the user's own ``--exclude`` and every earlier one)."""
    added: tp.List[str] = field(default_factory=list)
    """Hosts excluded now."""
    refused: tp.List[str] = field(default_factory=list)
    """Suspect hosts left in because of the bound (or because Slurm refused the update)."""
    note: str = ""
    """One line for the log and ``status``."""

    def record(self) -> tp.Dict[str, tp.Any]:
        return {
            "excluded_nodes": self.excluded_nodes,
            "newly_excluded": self.added,
            "not_excluded": self.refused,
            "exclusion": self.note,
        }


def plan_exclusion(
    *, suspects: tp.Sequence[str], already: tp.Sequence[str], partition_nodes: tp.Sequence[str], nodes_needed: int
) -> Exclusion:
    """Add ``suspects`` to ``already``, in order, while at least ``nodes_needed`` of ``partition_nodes`` stay
    outside the list. Hosts outside the partition (a mistyped name, another partition) are excluded freely:
    they cost the job nothing."""
    excluded = list(already)
    members = set(partition_nodes)
    plan = Exclusion()
    for host in suspects:
        if host in excluded:
            continue
        left = len(members - set(excluded) - {host})
        if members and host in members and left < nodes_needed:
            plan.refused.append(host)
            continue
        excluded.append(host)
        plan.added.append(host)
    plan.excluded_nodes = excluded
    parts = []
    if plan.added:
        parts.append(f"excluded {','.join(plan.added)}")
    if plan.refused:
        parts.append(
            f"kept {','.join(plan.refused)}: excluding it would leave fewer than the job's {nodes_needed} nodes "
            f"of its partition's {len(members)}"
        )
    plan.note = "; ".join(parts)
    return plan


def _expand(hostlist: str) -> tp.List[str]:
    from hpctrain.runtime.env import expand_hostlist

    text = (hostlist or "").strip()
    return [] if text in ("", "(null)") else expand_hostlist(text)


def exclude_hosts(
    slurm: tp.Any, run_dir: Path, job_id: str, suspects: tp.Sequence[str], *, nodes_needed: tp.Optional[int] = None
) -> Exclusion:
    """Exclude ``suspects`` from the job's next start (``scontrol update ExcNodeList``; call it once the job is
    requeued), accumulated with the job's own list and the ledger's earlier exclusions, within the bound.
    ``nodes_needed``: the nodes one start of the job needs (default: Slurm's NumNodes for the job)."""
    from hpctrain._slurm import SlurmCommandError

    if not suspects:
        return Exclusion(note="")
    info = slurm.job_info(job_id)
    already = _expand(info.get("ExcNodeList", ""))
    for host in earlier_exclusions(run_dir):
        if host not in already:
            already.append(host)
    if nodes_needed is None:
        nodes_needed = int((info.get("NumNodes") or "1").split("-")[0] or 1)
    partition = (info.get("Partition") or "").split(",")[0]
    features = info.get("Features", "")
    try:
        # the nodes the job can run on: its partition's, with its --constraint
        members = slurm.partition_nodes(partition, "" if features == "(null)" else features) if partition else []
    except SlurmCommandError:
        members = []
    # a host the job asked for by name (--nodelist) is never excluded: the job could not start at all
    required = set(_expand(info.get("ReqNodeList", "")))
    plan = plan_exclusion(
        suspects=[h for h in suspects if h not in required],
        already=already,
        partition_nodes=members,
        nodes_needed=nodes_needed,
    )
    plan.refused += [h for h in suspects if h in required]
    if plan.added or set(plan.excluded_nodes) - set(_expand(info.get("ExcNodeList", ""))):
        try:
            slurm.exclude_nodes(job_id, plan.excluded_nodes)
        except SlurmCommandError as exc:
            plan.refused = list(plan.added) + plan.refused
            plan.added = []
            plan.note = f"not excluded: {exc}"
    return plan


def suspects(run_dir: Path, job_id: str, restart_count: int, cause: str, failed: tp.Sequence[str]) -> tp.List[str]:
    """The hosts to keep the next start off: the failed nodes of a node failure, and the hosts the watchdog
    blames for this attempt (``suspect_hosts`` of :mod:`hpctrain.runtime.watchdog`: a hung rank's host always,
    a straggler's with ``--exclude-stragglers``), whatever ended it."""
    hosts = list(failed)
    try:
        from hpctrain.runtime.watchdog import suspect_hosts
    except ImportError:
        return hosts
    try:
        found = suspect_hosts(run_dir, job_id, restart_count)
    except Exception:  # noqa: BLE001 - attribution helps; it must never stop the requeue
        found = []
    for entry in found:
        host = entry.get("host") if isinstance(entry, dict) else entry
        if isinstance(host, str) and host and host not in hosts:
            hosts.append(host)
    return hosts


# Causes after which the deciding rank asks Slurm whether a node failed: a node failure reaches the
# survivors as a SIGTERM (cancelled / preemption to the signal's eyes) or as a peer's dropped connection.
CHECKED_CAUSES = frozenset({"cancelled", "preemption", "node_failure", "hang"})


@dataclass
class Failure:
    """What Slurm says about an attempt's end, for :func:`hpctrain.launch.ending.finish_attempt`."""

    cause: str
    """The cause, ``node_failure`` when a host of the attempt failed."""
    failed_nodes: tp.List[str] = field(default_factory=list)
    requeued_by_slurm: bool = False
    """Slurm already requeued the job itself (``--requeue`` and NODE_FAIL): no ``scontrol requeue`` on top."""
    spares_left: int = 0
    """Spare nodes the in-job restart loop (:mod:`hpctrain.launch.spares`) still has for this job."""

    def decide(self, requeued: bool, reason: str) -> tp.Tuple[bool, str]:
        """Amend the policy's decision: Slurm's own requeue stands; with spares left, no requeue."""
        if self.requeued_by_slurm:
            why = "" if requeued else f" ({reason.replace('not requeued: ', 'hpctrain would not have: ')})"
            return True, f"requeued by Slurm itself (--requeue) after {self.cause.replace('_', ' ')}{why}"
        if self.in_job_restart:  # bounded by the spares, not by --max-requeues: no queue wait is at stake
            return False, f"restarting inside the allocation ({self.spares_left} spare node(s) left)"
        return requeued, reason

    @property
    def in_job_restart(self) -> bool:
        return not self.requeued_by_slurm and self.spares_left > 0 and self.cause in ("node_failure", "hang")


def attribute_end(
    slurm: tp.Any,
    run_dir: Path,
    job_id: str,
    restart_count: int,
    world_size: int,
    cause: str,
    *,
    environ: tp.Mapping[str, str],
    silent_wait_s: float = 3.0,
) -> Failure:
    """Did a node fail under this attempt? Failed Slurm node states among the attempt's hosts; and, when Slurm
    requeued the job by itself (which a scancel never does), the hosts whose ranks all died silently."""
    failure = Failure(cause=cause, spares_left=int(environ.get(SPARES_LEFT_ENV) or 0))
    info = slurm.job_info(job_id)
    restarts = info.get("Restarts", "")
    slurm_restart = int(environ.get("SLURM_RESTART_COUNT") or 0)
    failure.requeued_by_slurm = restarts.isdigit() and int(restarts) > slurm_restart
    hosts = sorted(set(attempt_hosts(run_dir, job_id, restart_count, world_size).values()))
    failed = failed_hosts(slurm, hosts)
    if not failed and (failure.requeued_by_slurm or failure.spares_left > 0) and cause != "hang":
        failed = silent_hosts(run_dir, job_id, restart_count, world_size, wait_s=silent_wait_s)
    failure.failed_nodes = failed
    if failed:
        failure.cause = "node_failure"
    elif cause == "cancelled" and failure.requeued_by_slurm:
        failure.cause = "preemption"  # a SIGTERM and a requeue by Slurm without a failed node: no GraceTime
    return failure


def exclude_after(
    failure: Failure, slurm: tp.Any, run_dir: Path, job_id: str, restart_count: int, *, requeued: bool
) -> tp.Dict[str, tp.Any]:
    """The exit record's fields about failed and excluded hosts; excludes them when the job was requeued."""
    hosts = suspects(run_dir, job_id, restart_count, failure.cause, failure.failed_nodes)
    fields: tp.Dict[str, tp.Any] = {"failed_nodes": failure.failed_nodes, "suspect_nodes": hosts}
    if failure.in_job_restart:
        fields["in_job_restart"] = True  # the spares loop excludes them from its next step
    elif requeued and hosts:
        fields.update(exclude_hosts(slurm, run_dir, job_id, hosts).record())
    return fields


def record_unseen_end(
    run_dir: Path, job_id: str, restart_count: int, world_size: int, *, slurm: tp.Any
) -> tp.Optional[tp.Dict[str, tp.Any]]:
    """At the start of a restart (rank 0, before the entry): when the previous attempt of this job left no exit
    record (every rank died with it, e.g. a node failure that took rank 0 and left no survivor; Slurm requeued
    the job by itself), record its end now from Slurm's view: ``node_failure`` when ``sacct -D`` shows that run
    as NODE_FAIL or one of its hosts is still down, else ``killed``. Too late to exclude anything from this
    attempt (the job runs); the failed hosts are recorded. Returns the record written, or None."""
    from hpctrain.ledger import Ledger

    paths = RunDir(run_dir)
    earlier = [n for n in paths.attempt_numbers(job_id) if n < restart_count]
    if not earlier:
        return None
    prev = earlier[-1]
    ledger = Ledger(run_dir)
    if any(str(r.get("job_id")) == str(job_id) and r.get("restart_count") == prev for r in ledger.records("exit")):
        return None
    if not claim_decision(run_dir, job_id, prev, -1):
        return None  # a slow deciding rank of that attempt is writing it after all
    hosts = sorted(set(attempt_hosts(run_dir, job_id, prev, world_size).values()))
    runs = slurm.past_runs(job_id)  # oldest first; the last one is this attempt's own
    slurm_state = runs[-2][0] if len(runs) >= 2 else ""
    failed = failed_hosts(slurm, hosts)
    cause = "node_failure" if failed or slurm_state == "NODE_FAIL" else "killed"
    record = {
        "event": "exit",
        "time": time.time(),
        "job_id": job_id,
        "restart_count": prev,
        "cause": cause,
        "requeued": True,
        "reason": (
            f"recorded at the start of attempt {restart_count}: no rank of attempt {prev} recorded its end "
            f"(Slurm: {slurm_state or 'no accounting record'}); the job was requeued by Slurm"
        ),
        "slurm_state": slurm_state or None,
        "failed_nodes": failed,
        "suspect_nodes": failed or hosts,
        "decided_by_rank": None,
    }
    ledger.append(record)
    return record
