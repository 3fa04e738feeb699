"""Per-rank functions for the restore read-path tests (``tests/ckpt/test_fetch.py``): a state of plain tensors
of a few KiB each (so a shard holds alignment padding and more than one read region), and restores of
several checkpoint directories in one process group."""

from __future__ import annotations

import logging
import os
import typing as tp

import torch

from hpctrain.ckpt import Checkpointer
from hpctrain.ckpt._commit import _FIRED
from tests.ckpt.workers import LogLines, cfg

SIZES = (37, 1000, 3001, 17, 5000, 1, 2048, 999)


class Holder:
    """``state_dict`` / ``load_state_dict`` over a dict of tensors, copied into place like a module's."""

    def __init__(self, sd: tp.Dict[str, torch.Tensor]) -> None:
        self.sd = sd

    def state_dict(self) -> tp.Dict[str, torch.Tensor]:
        return self.sd

    def load_state_dict(self, sd: tp.Dict[str, torch.Tensor], strict: bool = True) -> None:
        for k, v in sd.items():
            self.sd[k].copy_(v)


def state(seed: int) -> tp.Tuple[tp.Dict[str, torch.Tensor], tp.Dict[str, torch.Tensor], tp.Dict[str, torch.Tensor]]:
    """(model, optimizer, unwanted): the third is saved as ``scaler`` and never restored (16 KiB: a gap no
    read region spans)."""
    g = torch.Generator().manual_seed(seed)
    model = {f"w{i}": torch.randn(n, generator=g) for i, n in enumerate(SIZES)}
    model["half"] = torch.randn(3, 333, generator=g).half()
    model["i64"] = torch.arange(77) * seed
    model["scalar"] = torch.tensor(float(seed))
    model["empty"] = torch.zeros(0, 4)
    opt = {f"m{i}": torch.randn(n, generator=g) for i, n in enumerate(SIZES)}
    return model, opt, {"big": torch.randn(4096, generator=g)}


def save(rank: int, world: int, d: str, steps: tp.Sequence[int]) -> None:
    ck = Checkpointer(cfg(d, keep_last=0))
    for s in steps:
        model, opt, unwanted = state(s)
        ck.save(s, model=Holder(model), optimizer=Holder(opt), scaler=Holder(unwanted))
    ck.close()


def restore(rank: int, world: int, jobs: tp.Sequence[tp.Tuple[str, str, str]]) -> tp.List[tp.Dict[str, tp.Any]]:
    """Restore model and optimizer (not the ``scaler``) from each ``(dir, restore_mode[+exchange], fault)``: the
    step, what was quarantined, and whether the values are bit-exact the saved step's."""
    out = []
    for d, mode, fault in jobs:
        if fault:
            _FIRED.clear()  # each job's "raiseonce" fires once in it, whatever an earlier job fired
            os.environ["HPCTRAIN_CKPT_FAULT"] = fault
        mode, _, exchange = mode.partition("+")
        said = LogLines()
        logging.getLogger("hpctrain.ckpt").addHandler(said)
        try:
            ck = Checkpointer(cfg(d, restore_mode=mode, restore_exchange=exchange or "host"))
            model, opt, _ = state(999)
            res = ck.restore(model=Holder(model), optimizer=Holder(opt))
            ck.close()
        finally:
            os.environ.pop("HPCTRAIN_CKPT_FAULT", None)
            logging.getLogger("hpctrain.ckpt").removeHandler(said)
        if res is None:
            out.append({"step": None})
            continue
        want_model, want_opt, _ = state(res.step)
        exact = all(torch.equal(model[k], want_model[k]) for k in want_model)
        exact = exact and all(torch.equal(opt[k], want_opt[k]) for k in want_opt)
        out.append({"step": res.step, "quarantined": res.quarantined, "exact": exact})
        if exchange == "node":  # the node exchange's buffer files: none left once the restore returned
            out[-1]["node_files_left"] = _node_files(ck._comm.tag)
            out[-1]["exchanges"] = ck._comm.exchanges
            out[-1]["read_again_over_gloo"] = any("exchanges over gloo" in m for m in said.lines)
    return out


def _node_files(tag: str) -> tp.List[str]:
    from hpctrain.ckpt._nodebuf import NODE_DIR, NODE_PREFIX

    return sorted(n for n in os.listdir(NODE_DIR) if n.startswith(f"{NODE_PREFIX}{tag}-"))


def device_gather(rank: int, world: int, chunk: int, round_bytes: int) -> bool:
    """The exchange through device buffers (CPU buffers, gloo) in rounds of ``round_bytes``: every rank ends
    with every rank's ``chunk`` bytes in place."""
    from hpctrain.ckpt._fetch import Route, _gather_through_device

    def part(r: int) -> torch.Tensor:
        return ((torch.arange(chunk) * (r + 1) + r) % 251).to(torch.uint8)

    buf = torch.full((chunk * world,), 255, dtype=torch.uint8)
    buf[rank * chunk : (rank + 1) * chunk] = part(rank)
    _gather_through_device(buf, chunk, rank, world, Route(None, torch.device("cpu")), round_bytes=round_bytes)
    return bool(torch.equal(buf, torch.cat([part(r) for r in range(world)])))


class Keep:
    """``load_state_dict`` that keeps the restored tensors (as an optimizer does its state)."""

    def __init__(self, sd: tp.Dict[str, torch.Tensor]) -> None:
        self.sd = sd

    def state_dict(self) -> tp.Dict[str, torch.Tensor]:
        return self.sd

    def load_state_dict(self, sd: tp.Dict[str, torch.Tensor], strict: bool = True) -> None:
        self.sd = dict(sd)


def node_private(rank: int, world: int, d: str) -> tp.Dict[str, bool]:
    """Restore through the node exchange keeping the tensors (views of the node's bytes), then each rank in turn
    writes its own: no rank sees another's writes (the mapping is copy-on-write), every rank sees its own."""
    import torch.distributed as dist

    ck = Checkpointer(cfg(d, restore_mode="read_once", restore_exchange="node"))
    model, opt, _ = state(999)
    keep_opt = Keep(opt)
    res = ck.restore(model=Holder(model), optimizer=keep_opt)
    ck.close()
    assert res is not None
    want = state(res.step)[1]
    got = keep_opt.sd
    exact = all(torch.equal(got[k], want[k]) for k in want)
    for turn in range(world):
        if turn == rank:
            for t in got.values():
                t.add_(rank + 1)
        dist.barrier()
    own = all(torch.equal(got[k], want[k] + (rank + 1)) for k in want)
    return {"exact": exact, "own_writes_only": own}


def separate_node_dirs(rank: int, world: int, d: str, base: str) -> tp.Dict[str, tp.Any]:
    """Restore through the node exchange where every rank has its own ``/dev/shm`` behind one host name (as
    containers or machines that report the same name): no rank may read its part into memory the others do not
    see; every rank falls back to gloo and the restore is exact."""
    from hpctrain.ckpt import _nodebuf

    _nodebuf.NODE_DIR = os.path.join(base, f"rank{rank}")
    os.makedirs(_nodebuf.NODE_DIR, exist_ok=True)
    ck = Checkpointer(cfg(d, restore_mode="read_once", restore_exchange="node"))
    model, opt, _ = state(999)
    res = ck.restore(model=Holder(model), optimizer=Holder(opt))
    ck.close()
    assert res is not None
    want_model, want_opt, _ = state(res.step)
    exact = all(torch.equal(model[k], want_model[k]) for k in want_model)
    exact = exact and all(torch.equal(opt[k], want_opt[k]) for k in want_opt)
    return {"step": res.step, "exact": exact, "left": os.listdir(_nodebuf.NODE_DIR)}
