"""Rank bodies for the tier tests (tests/ckpt/test_tiers*.py): save steps through the tiers, restore, report."""

from __future__ import annotations

import logging
import os
import typing as tp

from hpctrain.ckpt.tiers import TieredCheckpointer
from tests.ckpt.workers import LogLines, build, cfg, state_hash


def _ck(gdir: str, ldir: str, identity: str, **kw: tp.Any) -> TieredCheckpointer:
    kw.setdefault("local_every_steps", 1)
    kw.setdefault("global_every_local_saves", 3)
    return TieredCheckpointer(cfg(gdir, local_dir=ldir, keep_last=0, **kw), run_id="run-t", identity=identity)


def save(
    rank: int,
    world: int,
    gdir: str,
    ldir: str,
    steps: tp.Sequence[int],
    identity: tp.Union[str, tp.Sequence[str]] = "id-A",
    fault_at: tp.Optional[int] = None,
    fault: str = "",
    blocking: bool = True,
    opts: tp.Optional[tp.Dict[str, tp.Any]] = None,
    **kw: tp.Any,
) -> tp.List[tp.Tuple[int, str]]:
    """Save each step (state built with seed=step) with ``tier="auto"``; return (step, tier) per save; arm
    ``HPCTRAIN_CKPT_FAULT`` for step ``fault_at``. Errors of failed local saves are logged, not raised."""
    ck = _ck(gdir, ldir, _mine(identity, rank), **{**kw, **(opts or {})})
    out = []
    for s in steps:
        model, opt, sched = build(seed=s)
        if s == fault_at:
            os.environ["HPCTRAIN_CKPT_FAULT"] = fault
        try:
            ck.save(s, model=model, optimizer=opt, scheduler=sched, data_state={"step": s}, blocking=blocking)
            ck.wait()
        finally:
            os.environ.pop("HPCTRAIN_CKPT_FAULT", None)
        out.append((s, ck.last_tier))
    ck.close()
    return out


def _mine(identity: tp.Union[str, tp.Sequence[str]], rank: int) -> str:
    """The run identity of ``rank``: one for all, or one per rank (the Trainer's: rank 0's, "" elsewhere)."""
    return identity if isinstance(identity, str) else identity[rank]


def restore(
    rank: int, world: int, gdir: str, ldir: str, identity: tp.Union[str, tp.Sequence[str]] = "id-A", **kw: tp.Any
) -> tp.Dict[str, tp.Any]:
    """Restore into fresh objects: the step, tier, newest global step, state hash and the log lines."""
    lines = LogLines()
    logging.getLogger("hpctrain.ckpt").addHandler(lines)
    ck = _ck(gdir, ldir, _mine(identity, rank), **kw)
    model, opt, sched = build(seed=999, steps=0)
    res = ck.restore(model=model, optimizer=opt, scheduler=sched)
    sent = ck.local.sent_bytes if ck.local is not None else 0
    ck.close()
    logging.getLogger("hpctrain.ckpt").removeHandler(lines)
    if res is None:
        return {"step": None, "lines": lines.lines}
    return {
        "step": res.step,
        "tier": res.tier,
        "global_step": res.global_step,
        "hash": state_hash(model, opt, sched),
        "data_state": res.data_state,
        "lines": lines.lines,
        "sent": sent,
    }


def _replace(path: tp.Any) -> None:
    """Remove whatever is at ``path`` (a file, a link, a directory), never following a link."""
    import shutil

    if path.is_symlink() or (path.exists() and not path.is_dir()):
        path.unlink()
    elif path.exists():
        shutil.rmtree(path)


def _apply(op: tp.Sequence[tp.Any]) -> None:
    """One damage: ``(what, path[, arg])``, applied by rank 0 while the other ranks wait."""
    import json
    import random
    import shutil
    from pathlib import Path

    what, path = op[0], op[1]
    arg = op[2] if len(op) > 2 else None
    p = Path(path)
    if what == "garbage":  # random bytes of the file's size (at least 64)
        size = max(p.stat().st_size if p.is_file() else 0, 64)
        data = random.Random(str(p)).randbytes(size)
        _replace(p)
        p.write_bytes(data)
    elif what == "bytes":  # exactly these bytes
        _replace(p)
        p.write_bytes(arg)
    elif what == "truncate_to":
        os.truncate(p, arg if arg >= 0 else p.stat().st_size // 2)
    elif what == "grow_to":  # sparse: a huge file without the disk
        os.truncate(p, arg)
    elif what == "flip_at":  # (offset, bit)
        data = bytearray(p.read_bytes())
        data[arg[0] % len(data)] ^= 1 << arg[1]
        p.write_bytes(bytes(data))
    elif what == "dir":  # a directory where a file (or a directory) should be
        _replace(p)
        p.mkdir()
        (p / "junk").write_bytes(b"x" * 64)
    elif what == "file":  # a file where a directory should be
        _replace(p)
        p.write_bytes(b"not a directory")
    elif what == "symlink":  # a link to ``arg`` (elsewhere)
        _replace(p)
        p.symlink_to(arg)
    elif what == "mkdir":
        p.mkdir(parents=True, exist_ok=True)
    elif what == "manifest":  # the manifest's JSON with fields replaced (``arg``: {field: value}); sealed: its
        # checksum made to match, so that only the field checks can tell
        from hpctrain.ckpt.tiers._local import seal_manifest

        src = Path(arg.get("__from__", path))
        m = json.loads(src.read_text())
        sealed = arg.get("__sealed__", True)
        for k, v in arg.items():
            if k.startswith("__"):
                continue
            if k.startswith("shards."):  # "shards.<i>.<field>"
                _, i, field = k.split(".")
                m["shards"][int(i)][field] = v
            else:
                m[k] = v
        if sealed:
            m = seal_manifest(m)
        _replace(p)
        p.write_text(json.dumps(m))
    elif what == "rmtree":
        shutil.rmtree(path)
    elif what == "unlink":
        Path(path).unlink()
    elif what == "discard":  # unlink if present
        Path(path).unlink(missing_ok=True)
    elif what == "flip":
        data = bytearray(Path(path).read_bytes())
        data[-100] ^= 0xFF
        Path(path).write_bytes(bytes(data))
    elif what == "copytree":
        src, dst = path.split("|")
        shutil.copytree(src, dst, symlinks=True)
    else:
        raise ValueError(f"unknown damage {what!r}")


def scenarios(
    rank: int,
    world: int,
    gdir: str,
    ldir: str,
    steps: tp.Sequence[int],
    cases: tp.Sequence[tp.Tuple[tp.Sequence[tp.Tuple[str, str]], tp.Dict[str, tp.Any]]],
    opts: tp.Optional[tp.Dict[str, tp.Any]] = None,
) -> tp.Dict[str, tp.Any]:
    """One launch, several checks: save ``steps``, then per case rank 0 applies its damage (ops), every rank
    restores with the case's arguments (``identity``, ``gdir``), and the results are collected. ``opts``: more
    CheckpointConfig fields for the saves."""
    import torch.distributed as dist

    lines = LogLines()
    logging.getLogger("hpctrain.ckpt").addHandler(lines)
    saved = save(rank, world, gdir, ldir, steps, opts=opts) if steps else []
    logging.getLogger("hpctrain.ckpt").removeHandler(lines)
    out = []
    for ops, args in cases:
        dist.barrier()
        if rank == 0:
            for op in ops:
                _apply(op)
        dist.barrier()
        out.append(restore(rank, world, args.get("gdir", gdir), ldir, args.get("identity", "id-A")))
    return {"saved": saved, "save_lines": lines.lines, "restores": out}


def damaged(
    rank: int,
    world: int,
    gdir: str,
    ldir: str,
    pristine: tp.Tuple[str, str],
    cases: tp.Sequence[tp.Sequence[tp.Sequence[tp.Any]]],
    identity: tp.Union[str, tp.Sequence[str]] = "id-A",
) -> tp.List[tp.Dict[str, tp.Any]]:
    """One launch, many damages of one saved tier set: per case rank 0 puts back the pristine copies
    (``pristine``: the global and local directories as saved) and applies the case's ops, then every rank
    restores. The same paths every case: the tier key depends on the global directory's path."""
    import shutil

    import torch.distributed as dist

    out = []
    for ops in cases:
        dist.barrier()
        if rank == 0:
            for src, dst in zip(pristine, (gdir, ldir)):
                shutil.rmtree(dst, ignore_errors=True)
                shutil.copytree(src, dst, symlinks=True)
            for op in ops:
                _apply(op)
        dist.barrier()
        out.append(restore(rank, world, gdir, ldir, identity, agreement_timeout_s=20.0))
    return out


def sharded(rank: int, world: int, gdir: str, ldir: str, mode: str) -> tp.Dict[str, tp.Any]:
    """FSDP2 (``mode="fsdp"``, 1-D mesh) or HSDP (``"hsdp"``, 2 x 2) state through the tiers on 2 simulated nodes:
    local saves at 1 and 2, step 3 copied to the global tier; restores into a fresh sharded model from the
    local tier with every node intact, with node 1's directory wiped (partner copies), and from the global copy
    with a plain Checkpointer. Hashes are of the global values."""
    import shutil
    from pathlib import Path

    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from hpctrain.ckpt import Checkpointer
    from tests.ckpt.sharded_workers import adamw, fsdp, full_hash, make, train
    from tests.ckpt.workers import cfg

    def mesh() -> tp.Any:
        if mode == "hsdp":
            return init_device_mesh("cpu", (2, 2), mesh_dim_names=("replicate", "shard"))
        return init_device_mesh("cpu", (world,))

    model = fsdp(make(1), mesh())
    opt = adamw(model)
    ck = _ck(gdir, ldir, "id-A")
    out: tp.Dict[str, tp.Any] = {"saved": {}, "tiers": []}
    for s in (1, 2, 3):
        train(model, opt, [s], rank)
        ck.save(s, model=model, optimizer=opt, blocking=False)
        ck.wait()
        out["saved"][s] = full_hash(model, opt)
        out["tiers"].append(ck.last_tier)
    train(model, opt, [4], rank)
    ck.save(4, model=model, optimizer=opt)  # a local step newer than the global copy (3)
    out["saved"][4] = full_hash(model, opt)
    ck.close()

    def restore(ops: tp.Sequence[str]) -> tp.Tuple[int, str, str]:
        dist.barrier()
        if rank == 0:
            for path in ops:
                shutil.rmtree(path)
        dist.barrier()
        m = fsdp(make(99), mesh())
        o = adamw(m)
        ck = _ck(gdir, ldir, "id-A")
        res = ck.restore(model=m, optimizer=o)
        ck.close()
        return res.step, res.tier, full_hash(m, o)

    out["local"] = restore([])
    out["partner"] = restore([str(Path(ldir) / "node-1")])
    m = fsdp(make(98), mesh())
    o = adamw(m)
    plain = Checkpointer(cfg(gdir))
    res = plain.restore(model=m, optimizer=o)
    plain.close()
    out["global"] = (res.step, full_hash(m, o))
    return out
