"""Per-rank functions for the sharded-state tests (FSDP2 ``fully_shard`` and 2-D DTensor meshes on CPU/gloo).

Tiny models with uneven shards on purpose: Linear(8, 10) and Linear(10, 5) on 4 ranks give FSDP chunks of
3,3,3,1 and 2,2,1,0 rows. States are compared by a hash of their *global* values (``full_tensor()``), so
a model sharded one way and restored another compares equal only when every element landed in place.
"""

from __future__ import annotations

import json
import os
import typing as tp
from pathlib import Path

import torch

from hpctrain.ckpt import Checkpointer
from tests.ckpt.workers import cfg, state_hash


def make(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(8, 10), torch.nn.ReLU(), torch.nn.Linear(10, 5))


def fsdp(model: torch.nn.Module, mesh: tp.Any) -> torch.nn.Module:
    from torch.distributed.fsdp import fully_shard

    fully_shard(model[0], mesh=mesh)
    fully_shard(model[2], mesh=mesh)
    return fully_shard(model, mesh=mesh)


def tp2d(model: torch.nn.Module, mesh: tp.Any) -> torch.nn.Module:
    """Every parameter a DTensor on a 2-D mesh: weights Shard(0) x Shard(1), biases Shard(0) x Replicate."""
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    for mod in (model[0], model[2]):
        for name, p in list(mod.named_parameters()):
            pl = [Shard(0), Shard(1)] if p.dim() == 2 else [Shard(0), Replicate()]
            setattr(mod, name, torch.nn.Parameter(distribute_tensor(p.detach(), mesh, pl)))
    return model


def adamw(model: torch.nn.Module) -> torch.optim.Optimizer:
    return torch.optim.AdamW(model.parameters(), lr=1e-2)


def train(model: torch.nn.Module, opt: torch.optim.Optimizer, steps: tp.Iterable[int], rank: int) -> None:
    for s in steps:
        x = torch.randn(4, 8, generator=torch.Generator().manual_seed(100 * s + rank))
        model(x).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()


def full_hash(model: torch.nn.Module, opt: tp.Optional[torch.optim.Optimizer] = None) -> str:
    """Hash of the global values (DTensors gathered by :func:`tests.ckpt.workers.state_hash`)."""
    return state_hash(model, opt)


def _restore(d: Path, model: torch.nn.Module, opt: tp.Any = None, **kw: tp.Any) -> tp.Any:
    ck = Checkpointer(cfg(str(d), **kw))
    try:
        return ck.restore(model=model, optimizer=opt)
    finally:
        ck.close()


def _save(d: Path, step: int, model: torch.nn.Module, opt: tp.Any, **kw: tp.Any) -> None:
    ck = Checkpointer(cfg(str(d), keep_last=0))
    ck.save(step, model=model, optimizer=opt, extra={"note": "same"}, data_state={"epoch": 1}, **kw)
    ck.close()


def world4(rank: int, world: int, root: str) -> tp.Dict[str, tp.Any]:
    """DDP save -> FSDP2 restore; FSDP2 save, bit-exact continuation; restore onto a 2x2 mesh and save from it."""
    from torch.distributed.device_mesh import init_device_mesh

    root_p = Path(root)
    out: tp.Dict[str, tp.Any] = {}
    base = make(1)
    opt = adamw(base)
    train(base, opt, [0], rank=0)  # the same data on every rank: replicated state, as DDP keeps it
    ddp = torch.nn.parallel.DistributedDataParallel(base)
    _save(root_p / "ddp4", 1, ddp, opt)
    out["plain"] = full_hash(base, opt)
    mesh = init_device_mesh("cpu", (world,))
    m, o = fsdp(make(99), mesh), None
    o = adamw(m)
    _restore(root_p / "ddp4", m, o)
    out["ddp_into_fsdp"] = full_hash(m, o)
    _save(root_p / "fsdp4-same", 1, m, o)  # the same state, sharded: digests equal the DDP checkpoint's
    train(m, o, [1, 2], rank)
    _save(root_p / "fsdp4", 3, m, o, blocking=False)  # async: staged chunks, committed in the background
    out["h3"] = full_hash(m, o)
    train(m, o, [3, 4], rank)
    out["h5"] = full_hash(m, o)
    m2 = fsdp(make(7), mesh)
    o2 = adamw(m2)
    res = _restore(root_p / "fsdp4", m2, o2)
    out["resumed"] = [res.step, full_hash(m2, o2)]
    train(m2, o2, [3, 4], rank)
    out["continued"] = full_hash(m2, o2)
    mesh2 = init_device_mesh("cpu", (2, 2))
    m3 = tp2d(make(8), mesh2)
    o3 = adamw(m3)
    _restore(root_p / "fsdp4", m3, o3)
    out["fsdp4_into_2x2"] = full_hash(m3, o3)
    _save(root_p / "tp2x2", 3, m3, o3)
    # HSDP (fully_shard on a 2-D mesh: Replicate x Shard(0)): the two replicas of a chunk read it once between
    # them in read_once mode, each its own copy in read_all mode; both exact
    from hpctrain.ckpt._reader import bytes_read

    mh = fsdp(make(11), init_device_mesh("cpu", (2, 2), mesh_dim_names=("replicate", "shard")))
    oh = adamw(mh)
    for mode in ("read_once", "read_all"):
        before = bytes_read()
        _restore(root_p / "fsdp4", mh, oh, restore_mode=mode)
        out[f"hsdp_{mode}"] = [full_hash(mh, oh), bytes_read() - before]
    return out


def world2(rank: int, world: int, root: str) -> tp.Dict[str, tp.Any]:
    """4 -> 2 and 2x2 -> 2 reshards, 2 -> 2, FSDP -> plain, unmappable layouts, read-once fault fallback; then a
    SIGKILL during a sharded save (results are written to a file first: rank 1 dies)."""
    from torch.distributed.device_mesh import init_device_mesh

    root_p = Path(root)
    mesh = init_device_mesh("cpu", (world,))
    out: tp.Dict[str, tp.Any] = {}
    m, o = fsdp(make(5), mesh), None
    o = adamw(m)
    out["fsdp4_into_fsdp2"] = [_restore(root_p / "fsdp4", m, o).step, full_hash(m, o)]
    m_tp = fsdp(make(6), mesh)
    o_tp = adamw(m_tp)
    _restore(root_p / "tp2x2", m_tp, o_tp, restore_mode="read_all")
    out["tp2x2_into_fsdp2"] = full_hash(m_tp, o_tp)
    _save(root_p / "fsdp2", 2, make(3), None)  # an older step to fall back to
    _save(root_p / "fsdp2", 3, m, o)
    m2 = fsdp(make(9), mesh)
    o2 = adamw(m2)
    _restore(root_p / "fsdp2", m2, o2)
    out["fsdp2_into_fsdp2"] = full_hash(m2, o2)
    plain = make(10)
    op = adamw(plain)
    _restore(root_p / "fsdp4", plain, op)
    out["fsdp4_into_plain"] = full_hash(plain, op)
    # layouts that cannot be mapped: one line naming the tensor; model and optimizer (with state) untouched
    errors = []
    for build in (
        lambda: torch.nn.Sequential(torch.nn.Linear(8, 11), torch.nn.ReLU(), torch.nn.Linear(11, 5)),
        lambda: torch.nn.Sequential(torch.nn.Linear(8, 10), torch.nn.ReLU(), torch.nn.Linear(10, 5, bias=False)),
    ):
        torch.manual_seed(0)
        bad = fsdp(build(), mesh)
        ob = adamw(bad)
        train(bad, ob, [0], rank)
        before = full_hash(bad, ob)
        try:
            _restore(root_p / "fsdp4", bad, ob)
            errors.append("loaded")
        except Exception as exc:  # noqa: BLE001 - reported to the test
            errors.append(str(exc))
        errors.append(full_hash(bad, ob) == before)
    out["errors"] = errors
    # read-once: rank 1 cannot read -> every rank falls back to step 2 together (step 3 quarantined)
    os.environ["HPCTRAIN_CKPT_FAULT"] = "restore_read:1:raiseonce"
    try:
        res = _restore(root_p / "fsdp2", make(3), None)
    finally:
        os.environ.pop("HPCTRAIN_CKPT_FAULT")
    out["fault_fallback"] = [res.step, res.quarantined]
    (root_p / f"result-{rank}.json").write_text(json.dumps(out))
    # SIGKILL (rank 1) after writing, before fsync, of a sharded save: step 3 stays the newest committed
    _save(root_p / "kill", 3, m, o)
    os.environ["HPCTRAIN_CKPT_FAULT"] = "after_write:1"
    try:
        _save(root_p / "kill", 4, m2, o2)
    except Exception as exc:  # noqa: BLE001 - rank 0: the save is not committed
        out["kill"] = str(exc)
    (root_p / f"result-{rank}.json").write_text(json.dumps(out))
    return out
