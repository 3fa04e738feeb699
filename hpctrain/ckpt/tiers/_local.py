"""The local tier: every rank's shard on its node's local storage, a replica on its partner's node.

A :class:`LocalCheckpointer` is a :class:`~hpctrain.ckpt.Checkpointer` whose root is this node's local tier
directory (``<local root>/<tier key>``) and whose commit is the local protocol, so that a local save stages
exactly as a global one (the same shard bytes: header + data + crc) and restores through the same reader:

1. every rank writes + fsyncs its shard into ``step-N.tmp-*`` in its node's directory; one all-gather of
   (ok, size, crc32, layout, save count, step);
2. partner exchange: every rank sends its shard's bytes to its partner (:meth:`Nodes.partner`, same local
   index on the next node) over the checkpointer's gloo group; the partner checks the crc32 agreed in 1,
   writes and fsyncs the replica beside its own; one all-gather of ok;
3. each node's leader writes the manifest (the global one's fields plus ``tier``/``tier_key``) and renames
   the directory to ``step-N``: a node shows a committed local step only when every rank's shard and its
   replica were durable. A last all-gather of ok.

Restore (:meth:`LocalCheckpointer.restore_local`): each rank reports the committed local steps of its node
(which shard files, regular and of the right size, and a digest of the manifest, which carries its own crc32);
a local file that is not usable (a damaged manifest, a shard of the wrong size, a link or a directory in place
of a file) is left out with one line naming it, logged by rank 0; the ranks take the newest step newer than
``newer_than`` whose shards are all held somewhere; the ranks of each node verify the crc32 of that step's files
on their node (bad ones are removed) and agree again; then the ordinary restore reads it from each node's
directory (each byte read once across the ranks in ``read_once`` mode). Before it opens a file, each node is
sent the shards its own ranks open that it lacks (:meth:`LocalCheckpointer._before_read`: after a node was replaced, its
ranks' shards from their partner copies), checked against the manifest's crc32 on arrival. A step with some
shard held nowhere is never loaded: the next older one is tried, then the global tier.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import shutil
import socket
import stat
import typing as tp
from pathlib import Path

import torch

from hpctrain._atomic import atomic_write_bytes, atomic_write_json, fsync_dir
from hpctrain.ckpt._commit import ShardPlan, fault, write_shard
from hpctrain.ckpt._format import MANIFEST, crc32, parse_name, shard_name, step_name, tmp_name
from hpctrain.ckpt._scan import remove_dir, scan
from hpctrain.ckpt.checkpointer import Checkpointer, RestoreResult
from hpctrain.ckpt.config import CheckpointConfig
from hpctrain.ckpt.tiers._nodes import Nodes, base_dir, layout, tier_key
from hpctrain.errors import HpctrainError

__all__ = [
    "LocalCheckpointer",
    "TIER_FAULT_POINTS",
    "LOCAL_KEEP",
    "LOCAL_FIELDS",
    "seal_manifest",
    "local_manifest_problem",
]

log = logging.getLogger("hpctrain.ckpt")

TIER_FAULT_POINTS = ("local_before_write", "partner_send", "partner_write", "local_before_publish")
"""Fault points of the local protocol (``HPCTRAIN_CKPT_FAULT``, as in :mod:`hpctrain.ckpt._commit`)."""
LOCAL_KEEP = 2
"""Committed local steps a node keeps (the newest); older ones are removed after each local commit."""
MANIFEST_CRC = "manifest_crc32"
LOCAL_FIELDS = ("tier", "tier_key", "global_dir", "node_of", "host_of", MANIFEST_CRC)
"""The fields a local step's manifest has beyond a global one's (a copy into the global tier leaves them out):
``local``, the tier key, the global directory it belongs to, each rank's node and host (which node wrote a shard),
and the manifest's own crc32 (:func:`seal_manifest`)."""


class LocalCheckpointer(Checkpointer):
    """Call every method on every rank (collective), like the Checkpointer it is."""

    def __init__(self, config: CheckpointConfig, *, run_id: str = "", identity: str = "") -> None:
        assert config.dir is not None
        self.global_dir = Path(config.dir)
        hosts = _hosts(identity)
        # rank 0's identity names the run on every rank (the Trainer records it on rank 0 only)
        self.key = tier_key(config.dir, hosts[2] if hosts else identity)
        self.nodes: Nodes = layout(hosts[0], hosts[1]) if hosts else layout(0, [socket.gethostname()])
        rank = hosts[0] if hosts else 0
        local_root = base_dir(config.local_dir, self.nodes, rank) / self.key
        local = dataclasses.replace(config, dir=local_root, clean_abandoned=False, lustre_stripe=(), keep_last=0)
        super().__init__(local, run_id=run_id, identity=identity)
        self.node = self.nodes.node_of[self.rank]
        self.leader = self.nodes.leader(self.node) == self.rank
        self.pending_global_copy: tp.Optional[tp.Callable[[int, Path, tp.Dict[str, tp.Any]], None]] = None
        """Called once, on every rank, after the next local commit with (step, its directory, its manifest), in
        the thread that committed it: the tiered checkpointer's drain to the global tier."""
        self.refilled: tp.List[int] = []
        """The shards the last :meth:`restore_local` took from a copy on another node than the one that wrote
        them (a partner's copy: that node was lost, replaced or its copy bad)."""
        self.sent_bytes = 0
        """Bytes this rank sent to other nodes in local restores (shards those nodes lacked)."""
        self._serving: tp.Optional[tp.Tuple[Path, tp.Dict[int, tp.Dict[str, tp.Any]], tp.Dict[int, tp.Set[int]]]]
        self._serving = None  # (step dir, its shards by rank, the ranks holding a verified copy) in restore_local
        self._manifests: tp.Dict[int, tp.Dict[str, tp.Any]] = {}  # this node's usable manifests (restore_local)

    # ------------------------------------------------------------------ save
    def _commit(self, step: int, plan: ShardPlan, manifest_extra: tp.Dict[str, tp.Any]) -> Path:
        comm, root, nodes = self._comm, self.root, self.nodes
        rank, world = comm.rank, comm.world
        comm.saves += 1
        tmp = root / tmp_name(step, f"{comm.tag}-{comm.saves}")
        name = shard_name(rank, world)
        err, size, crc = "", 0, 0
        try:
            root.mkdir(parents=True, exist_ok=True)
            if self.leader:
                self._prune(LOCAL_KEEP - 1)  # room for the new step: the newest committed one stays meanwhile
            err = self._space_error(plan)
            if not err:
                tmp.mkdir(exist_ok=True)
                fault("local_before_write", rank)
                size, crc = write_shard(tmp / name, plan, rank)
        except OSError as exc:
            hint = " (disk full)" if getattr(exc, "errno", None) == 28 else ""
            err = f"rank {rank} could not write {root}/{name}: {exc.strerror or exc}{hint}"
        layout_id = int(plan.layout[:15], 16) if plan.layout else 0
        results = comm.all_gather_ints([0 if err else 1, size, crc, layout_id, comm.saves, step])
        self._fail_if(err, results, step, tmp)
        if len({(r[3], r[4], r[5]) for r in results}) > 1:
            self._fail_if("ranks disagree on the save sequence or the state's layout", results, step, tmp, True)
        err = ""
        try:
            self._exchange(tmp, name, size, results)
        except (OSError, HpctrainError) as exc:
            err = f"rank {rank}: partner exchange failed: {exc}"
        self._fail_if(err, comm.all_gather_ints([0 if err else 1]), step, tmp)
        final = root / step_name(step)
        shards = [
            {"file": shard_name(r, world), "rank": r, "bytes": res[1], "crc32": res[2]} for r, res in enumerate(results)
        ]
        manifest = seal_manifest(
            {
                "format": "hpctrain-ckpt",
                "format_version": manifest_extra.get("format_version", 1),
                "step": step,
                "world_size": world,
                "shards": shards,
                "torch": torch.__version__,
                **manifest_extra,
                **dict(
                    zip(LOCAL_FIELDS, ("local", self.key, str(self.global_dir), list(nodes.node_of), nodes.host_of))
                ),
            }
        )
        err = ""
        if self.leader:
            try:
                fault("local_before_publish", rank)
                atomic_write_json(tmp / MANIFEST, manifest)
                _clear(final)  # a re-save of a step (the local tier is a cache, the old copy goes), or damage
                os.rename(tmp, final)
                fsync_dir(root)
            except OSError as exc:
                err = f"node {self.node} could not publish local step {step}: {exc}"
        self._fail_if(err, comm.all_gather_ints([0 if err else 1]), step, tmp)
        if self.leader:
            self._prune(LOCAL_KEEP, temporaries=True)
        copy_to_global, self.pending_global_copy = self.pending_global_copy, None
        if copy_to_global is not None:
            copy_to_global(step, final, manifest)
        return final

    def _fail_if(self, err: str, results: tp.List[tp.List[int]], step: int, tmp: Path, force: bool = False) -> None:
        """Raise on every rank (the same error) when any rank failed; the node leaders remove the tmp dir."""
        if not force and all(r[0] for r in results):
            return
        errors = [e for e in self._comm.all_gather(err) if e] or [err]
        if self.leader:
            shutil.rmtree(tmp, ignore_errors=True)
        raise HpctrainError(f"local step {step} not committed (earlier local steps are intact): {errors[0]}")

    def _space_error(self, plan: ShardPlan) -> str:
        """The node's bytes for this step (its ranks' shards and the replicas it holds, estimated from the
        total) against ``local_max_bytes`` (with the newest committed step, kept meanwhile) and free space."""
        nodes, world = self.nodes, self._comm.world
        mine = nodes.ranks(self.node)
        held = len(mine) + sum(len(nodes.replicas_of(r)) for r in mine)
        need = plan.total_bytes * held // max(world, 1)
        bound = self.config.local_max_bytes
        if bound:
            kept = _dir_bytes(self._committed()[:1])
            if kept + need > bound:
                return (
                    f"the local tier on node {self.node} would hold {(kept + need) / 2**20:.1f} MiB, over "
                    f"CheckpointConfig.local_max_bytes={bound} ({bound / 2**20:.1f} MiB)"
                )
        st = os.statvfs(self.root)
        free = st.f_bavail * st.f_frsize
        if free < need * self.config.free_space_margin:
            return f"not enough free space in {self.root}: {need / 2**20:.1f} MiB needed, {free / 2**20:.1f} MiB free"
        return ""

    def _exchange(self, tmp: Path, name: str, size: int, results: tp.List[tp.List[int]]) -> None:
        """Send this rank's shard to its partner, receive the shards this rank holds as partner, check their
        crc32 against the agreed one, write and fsync them."""
        partner = self.nodes.partner(self.rank)
        sources = self.nodes.replicas_of(self.rank)
        if partner is None:
            return
        import torch.distributed as dist

        group = self._comm.group
        out = _read_file(tmp / name, size)
        fault("partner_send", self.rank)
        works = [dist.isend(out, dst=partner, group=group)]
        bufs = {}
        for src in sources:
            bufs[src] = torch.empty(results[src][1], dtype=torch.uint8)
            works.append(dist.irecv(bufs[src], src=src, group=group))
        for w in works:
            w.wait()
        fault("partner_write", self.rank)
        for src, buf in bufs.items():
            view = memoryview(buf.numpy())
            if crc32(view) != results[src][2]:
                raise HpctrainError(f"the replica of rank {src} arrived damaged (crc32 mismatch)")
            _write_durable(tmp / shard_name(src, self._comm.world), view)

    def _committed(self) -> tp.List[Path]:
        """This node's committed local steps of this tier, newest first."""
        return [
            e.path
            for e in sorted(scan(self.root), key=lambda e: -e.step)
            if e.status == "committed" and e.manifest is not None and not local_manifest_problem(e.manifest, self.key)
        ]

    def _prune(self, keep: int, temporaries: bool = False) -> None:
        """Keep the newest ``keep`` committed local steps on this node and remove the older ones; with
        ``temporaries`` (after a commit) also the temporaries of earlier runs and interrupted saves. This
        checkpointer's own are left alone: another rank of the node may already be writing the next save."""
        kept = set(self._committed()[:keep])
        for e in scan(self.root, read_manifests=False):
            final = e.status in ("committed", "incomplete")  # a final name (without reading its manifest)
            if final and e.path not in kept:
                remove_dir(e.path)
            elif temporaries and not final and self._comm.tag not in e.name:
                remove_dir(e.path)

    # --------------------------------------------------------------- restore
    def restore_local(self, newer_than: int, **restore_kw: tp.Any) -> tp.Tuple[tp.Optional[RestoreResult], str]:
        """Restore the newest complete local step newer than ``newer_than`` (collective). Return the result
        (None: none usable) and a line saying why a newer local step was not usable (empty: none was skipped).

        Every local file a node cannot use (a damaged or foreign manifest, a shard of the wrong size, not a
        regular file, failing its crc32, a directory or link where a step should be) is left out with one line
        naming it (logged by rank 0 from what every node reported); each decision is taken from what every rank
        reported, so that the ranks agree whichever of them saw the damage."""
        comm = self._comm
        self.refilled = []
        held, notes = self._held()
        reports = comm.all_gather((held, notes if self.leader else [], str(self.root)))
        self._log([n for _, ns, _ in reports for n in ns])
        holders: tp.Dict[int, tp.Dict[int, tp.Set[int]]] = {}  # step -> shard -> ranks holding it
        digests: tp.Dict[int, tp.Dict[str, tp.List[int]]] = {}  # step -> manifest digest -> ranks (one unless re-saved)
        counts: tp.Dict[int, int] = {}  # step -> its shard count (its world size: any; the reader reshards)
        for r, (rep, _, _) in enumerate(reports):
            for s, (files, digest, count) in rep.items():
                digests.setdefault(s, {}).setdefault(digest, []).append(r)
                counts[s] = count
                for i in files:
                    holders.setdefault(s, {}).setdefault(i, set()).add(r)
        newer = sorted((s for s in digests if s > newer_than), reverse=True)
        why = ""
        for s in newer:
            if len(digests[s]) > 1:  # nodes hold different manifests of this step: never mix them
                a, b = (rs[0] for rs in list(digests[s].values())[:2])
                self._log(
                    [
                        f"{reports[b][2]}/{step_name(s)}/{MANIFEST} and {reports[a][2]}/{step_name(s)}/{MANIFEST} "
                        f"differ (different saves of step {s}, or one damaged): step {s} not used"
                    ]
                )
                why = why or f"local step {s}: the nodes hold different saves of it"
                continue
            saved = counts[s]
            missing = [i for i in range(saved) if i not in holders.get(s, {})]
            if missing:
                why = why or f"local step {s}: no surviving copy of the shards of ranks {missing[:8]}"
                continue
            good = comm.all_gather(self._verify(s, held.get(s, ([], "", 0))[0]))
            self._log([n for _, ns in good for n in ns])
            verified: tp.Dict[int, tp.Set[int]] = {}
            for r, (files, _) in enumerate(good):
                for i in files:
                    verified.setdefault(i, set()).add(r)
            missing = [i for i in range(saved) if i not in verified]
            if missing:
                why = why or f"local step {s}: no verified copy of the shards of ranks {missing[:8]}"
                continue
            err = self._complete(s, verified, reports)
            errors = [e for e in comm.all_gather(err) if e]
            if errors:
                why = why or f"local step {s}: {errors[0]}"
                continue
            # every file the read opens was checked against the manifest's crc32 (a node's own in _verify, a
            # received one on arrival in _before_read): the read skips a second pass over the bytes
            verify = self.config
            self.config = dataclasses.replace(verify, verify_checksums=False)
            try:
                return self.restore(step=s, **restore_kw), why
            except HpctrainError as exc:
                why = why or f"local step {s}: {exc}"
            finally:
                self.config, self._serving = verify, None
        return None, why

    def _log(self, notes: tp.Sequence[str]) -> None:
        """One line per local file left out (rank 0: every node's notes reach it in the collectives)."""
        if self.rank == 0:
            for note in notes:
                log.error("hpctrain.ckpt: local tier file not used: %s", note)

    def _held(self) -> tp.Tuple[tp.Dict[int, tp.Tuple[tp.List[int], str, int]], tp.List[str]]:
        """This node's usable committed local steps, saved at any world size: step -> (the shard files present
        as regular files of the manifest's size, the manifest's digest, its shard count); and a line for each
        file that is not usable (never raises: every rank must reach the collective that follows). Reported by
        every rank of the node (the same answer)."""
        self._manifests = {}
        out: tp.Dict[int, tp.Tuple[tp.List[int], str, int]] = {}
        notes: tp.List[str] = []
        root = self.root
        try:
            if not os.path.lexists(root):
                return out, notes  # a new or replaced node
            if not root.is_dir():
                return out, [f"{root}: not a directory"]
            for name in sorted(os.listdir(root)):  # a committed step's name on something scan skips
                parsed = parse_name(name)
                if parsed is not None and parsed[1] == "committed" and not _real_dir(root / name):
                    what = "a symbolic link" if os.path.islink(root / name) else "not a directory"
                    notes.append(f"{root / name}: {what}")
            entries = scan(root)
        except Exception as exc:  # noqa: BLE001 - an unreadable tier directory: nothing of this node is used
            return {}, notes + [f"{root}: cannot read: {exc}"]
        host = self.nodes.host_of[self.rank] if self.nodes.host_of else socket.gethostname()
        for e in entries:
            try:
                if e.status == "incomplete":
                    notes.append(f"{root}/{e.error}")
                if e.status != "committed" or e.manifest is None:
                    continue
                m = e.manifest
                bad = local_manifest_problem(m, self.key)
                if bad:
                    notes.append(f"{e.path / MANIFEST}: {bad}")
                    continue
                wrote = m.get("host_of") or []
                files = []
                for i, sh in enumerate(m["shards"]):
                    f = e.path / sh["file"]
                    try:
                        st = os.lstat(f)
                    except FileNotFoundError:
                        if i < len(wrote) and wrote[i] == host:  # written here: a healthy node still has it
                            notes.append(f"{f}: missing")
                        continue
                    if stat.S_ISLNK(st.st_mode):
                        notes.append(f"{f}: a symbolic link")
                    elif not stat.S_ISREG(st.st_mode):
                        notes.append(f"{f}: not a regular file")
                    elif st.st_size != sh["bytes"]:
                        notes.append(f"{f}: {st.st_size} bytes, its manifest says {sh['bytes']}")
                    else:
                        files.append(i)
                out[e.step] = (files, _digest(m), len(m["shards"]))
                self._manifests[e.step] = m
            except Exception as exc:  # noqa: BLE001 - damage of any kind leaves the step out, never escapes
                out.pop(e.step, None)
                self._manifests.pop(e.step, None)
                notes.append(f"{e.path}: cannot read: {type(exc).__name__}: {exc}")
        return out, notes

    def _verify(self, step: int, files: tp.List[int]) -> tp.Tuple[tp.List[int], tp.List[str]]:
        """The crc32 of this rank's share of the node's files of ``step`` (the node's ranks split them):
        the good ones, and a line for each bad one, which is removed, so that a verified copy replaces it."""
        mine = self.nodes.ranks(self.node)
        path = self.root / step_name(step)
        ok: tp.List[int] = []
        notes: tp.List[str] = []
        m = self._manifests.get(step)
        if m is None:
            return ok, notes
        shards = m["shards"]
        for j, i in enumerate(sorted(files)):
            if mine[j % len(mine)] != self.rank:
                continue
            f = path / shards[i]["file"]
            try:
                got = crc32(memoryview(_read_file(f, shards[i]["bytes"]).numpy()))
            except Exception as exc:  # noqa: BLE001 - unreadable: not a verified copy
                notes.append(f"{f}: cannot read: {exc}")
                continue
            if got == shards[i]["crc32"]:
                ok.append(i)
                continue
            notes.append(f"{f}: fails its checksum (crc32 {got:08x}, its manifest says {shards[i]['crc32']:08x})")
            try:
                f.unlink()
            except OSError:
                pass
        return ok, notes

    def _complete(self, step: int, verified: tp.Dict[int, tp.Set[int]], reports: tp.List[tp.Any]) -> str:
        """Give every node without a usable manifest of ``step`` (a replaced node, a damaged one) the manifest
        of a node with one, and note which shards a node's restore can take from which verified copy:
        :meth:`_before_read` then brings each node only the shards its own ranks open (its own shards, as a
        rule), never the whole step. Collective; return this rank's error (empty: none)."""
        nodes = self.nodes
        path = self.root / step_name(step)
        src = next(r for r, rep in enumerate(reports) if step in rep[0])
        mine = self._manifests.get(step)
        raw = b""
        if any(step not in rep[0] for rep in reports):  # the same on every rank: all or none broadcast
            raw = self._broadcast(json.dumps(mine).encode() if self.rank == src else b"", src)
        try:
            m = mine if mine is not None else json.loads(raw)
            if self.leader and mine is None:
                self._install(step, raw)
            wrote = m.get("host_of") or []  # the host that wrote each shard (its own copy)
            self.refilled = [
                i
                for i in range(len(m["shards"]))
                if i >= len(wrote)
                or not any(nodes.host_of[r] == wrote[i] for r in verified[i] if r < len(nodes.host_of))
            ]
            self._serving = (path, {i: sh for i, sh in enumerate(m["shards"])}, verified)
        except Exception as exc:  # noqa: BLE001 - reported to every rank, the step is not used
            return f"rank {self.rank}: {type(exc).__name__}: {exc}"
        return ""

    def _broadcast(self, raw: bytes, src: int) -> bytes:
        if self._comm.world == 1:
            return raw
        import torch.distributed as dist

        box = [raw]
        try:
            dist.broadcast_object_list(box, src=src, group=self._comm.group)
        except Exception as exc:  # noqa: BLE001 - a peer died or timed out
            raise self._comm._fail(exc) from exc
        return tp.cast(bytes, box[0])

    def _install(self, step: int, raw: bytes) -> None:
        """This node's manifest of ``step`` from another node's (the leader): whatever stands in the way (a
        file or a link where the tier's or the step's directory should be, a damaged manifest) goes first; the
        shard files there stay, unverified, and are replaced by verified copies where this node's ranks read."""
        root, path = self.root, self.root / step_name(step)
        if os.path.lexists(root) and not _real_dir(root) and not root.is_dir():
            _clear(root)
        root.mkdir(parents=True, exist_ok=True)
        if os.path.lexists(path) and not _real_dir(path):
            _clear(path)
        if _real_dir(path):
            if os.path.lexists(path / MANIFEST) and not stat.S_ISREG(os.lstat(path / MANIFEST).st_mode):
                _clear(path / MANIFEST)  # a directory or a link (a file is replaced atomically)
            atomic_write_bytes(path / MANIFEST, raw)
            return
        tmp = root / tmp_name(step, f"restore-{self._comm.tag}")
        _clear(tmp)
        tmp.mkdir()
        atomic_write_bytes(tmp / MANIFEST, raw)
        os.rename(tmp, path)
        fsync_dir(root)

    def _index_waits_for_files(self) -> bool:
        return self._serving is not None

    def _before_read(self, path: Path, shards: tp.Optional[tp.Set[int]]) -> None:
        """In a local restore (collective): send every shard a node's ranks are about to open and the node lacks
        from a rank holding a verified copy to the node's leader, which checks its crc32 and writes it."""
        if self._serving is None or self._serving[0] != path:
            return
        import torch.distributed as dist

        _, manifest, verified = self._serving
        nodes, world, group = self.nodes, self._comm.world, self._comm.group
        if shards is None:  # the headers this rank parses (build_index shares them out: i, i + world, ...)
            shards = set(range(self.rank, len(manifest), world))
        wanted = self._comm.all_gather(sorted(shards))
        works, arriving, err = [], [], ""
        for i in sorted(set().union(*map(set, wanted))):  # the same order on every rank: sends and receives pair up
            for node in range(nodes.count):
                dst, readers = nodes.leader(node), nodes.ranks(node)
                if not any(i in wanted[r] for r in readers) or any(nodes.node_of[r] == node for r in verified[i]):
                    continue
                src = min(verified[i])
                size = int(manifest[i]["bytes"])
                if self.rank == src:
                    try:
                        data = _read_file(path / manifest[i]["file"], size)
                    except OSError as exc:  # still send (a buffer that fails its crc32 there): the pairs must match
                        err, data = (
                            err or f"rank {src} could not read its copy of rank {i}'s shard: {exc}",
                            torch.zeros(size, dtype=torch.uint8),
                        )
                    works.append((dist.isend(data, dst=dst, group=group), data))
                    self.sent_bytes += size
                elif self.rank == dst:
                    buf = torch.empty(size, dtype=torch.uint8)
                    works.append((dist.irecv(buf, src=src, group=group), buf))
                    arriving.append((i, src, buf))
                verified[i].add(dst)  # the node holds it now (or the step fails below, on every rank)
        for work, _ in works:  # all in flight at once: the nodes' transfers overlap
            work.wait()
        for i, src, buf in arriving:
            data = memoryview(buf.numpy())
            if crc32(data) != manifest[i]["crc32"]:
                err = err or f"the copy of rank {i}'s shard from rank {src} arrived damaged"
                continue
            try:
                _clear(path / manifest[i]["file"])  # a directory or a link in its place
                atomic_write_bytes(path / manifest[i]["file"], data.tobytes())
            except OSError as exc:
                err = err or f"node {self.node} could not write its copy of rank {i}'s shard: {exc}"
        errors = [e for e in self._comm.all_gather(err) if e]
        if errors:
            raise HpctrainError(f"local step {path.name}: {errors[0]}")


def _hosts(identity: str) -> tp.Optional[tp.Tuple[int, tp.List[str], str]]:
    """(rank, every rank's host name, rank 0's ``identity``) over the default group; None outside a group."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return None
    out: tp.List[tp.Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, (socket.gethostname(), identity))
    return dist.get_rank(), [h for h, _ in out], str(out[0][1])


def _read_file(path: Path, size: int) -> torch.Tensor:
    """``size`` bytes of the regular file ``path`` (never through a link, never blocking on a FIFO)."""
    buf = torch.empty(size, dtype=torch.uint8)
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    with open(fd, "rb", buffering=0) as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(f"{path}: not a regular file")
        view, got = memoryview(buf.numpy()), 0
        while got < size:  # one read returns at most ~2 GiB
            n = f.readinto(view[got:])
            if not n:
                raise OSError(f"{path}: shorter than its {size} bytes")
            got += n
    return buf


def _write_durable(path: Path, data: memoryview) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    try:
        while data:
            data = data[os.write(fd, data[: 1 << 30]) :]
        os.fsync(fd)
    finally:
        os.close(fd)


def _real_dir(path: Path) -> bool:
    """A directory, not a link to one."""
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except OSError:
        return False


def _clear(path: Path) -> None:
    """Remove whatever is at ``path``: a file or a link (never what it points to), or a directory."""
    if _real_dir(path):
        shutil.rmtree(path)
    elif os.path.lexists(path):
        os.unlink(path)


def _canonical(m: tp.Dict[str, tp.Any]) -> bytes:
    """The manifest's JSON as read back (keys as strings, sorted), whatever wrote it."""
    return json.dumps(json.loads(json.dumps(m, sort_keys=True)), sort_keys=True).encode()


def seal_manifest(m: tp.Dict[str, tp.Any]) -> tp.Dict[str, tp.Any]:
    """``m`` with its own crc32 (:data:`MANIFEST_CRC`, over the rest of it): a local manifest is never used
    with a field changed by damage that still parses (a digit of ``data_state``, a shard's crc32)."""
    body = {k: v for k, v in m.items() if k != MANIFEST_CRC}
    return {**body, MANIFEST_CRC: crc32(_canonical(body))}


def local_manifest_problem(m: tp.Dict[str, tp.Any], key: str) -> str:
    """What makes a (well-formed, :func:`~hpctrain.ckpt._reader.read_manifest`) manifest in a local tier
    directory unusable there; empty when nothing does."""
    if m.get("tier_key") != key:
        return f"not this tier's manifest (tier_key {str(m.get('tier_key'))[:40]!r}, expected {key})"
    body = {k: v for k, v in m.items() if k != MANIFEST_CRC}
    if MANIFEST_CRC not in m:
        return f"no {MANIFEST_CRC} (damaged, or written by an hpctrain older than its local tier's checksums)"
    if type(m[MANIFEST_CRC]) is not int or crc32(_canonical(body)) != m[MANIFEST_CRC]:
        return f"its content does not match its checksum ({MANIFEST_CRC}): damaged"
    n = m["world_size"]
    for field, kind in (("host_of", str), ("node_of", int)):
        v = m.get(field, [])
        if not (isinstance(v, list) and len(v) in (0, n) and all(type(x) is kind for x in v)):
            return f"{field} is not a list of {n} {kind.__name__}s"
    if not isinstance(m.get("global_dir", ""), str) or m.get("tier", "local") != "local":
        return "global_dir or tier is not this tier's"
    return ""


_PER_LEADER = ("time", "host", "identity", MANIFEST_CRC)
"""Manifest fields that differ between the nodes' leaders in one save: the clock, the host, the run identity (the
Trainer records it on rank 0 only), the checksum over them."""


def _digest(m: tp.Dict[str, tp.Any]) -> str:
    """What the nodes' manifests of one save share: all but :data:`_PER_LEADER`."""
    return hashlib.sha256(_canonical({k: v for k, v in m.items() if k not in _PER_LEADER})).hexdigest()


def _dir_bytes(paths: tp.Iterable[Path]) -> int:
    total = 0
    for p in paths:
        for f in p.iterdir():
            try:
                total += f.lstat().st_size
            except OSError:
                continue
    return total
