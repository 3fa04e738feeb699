"""The pieces together: DDP training fed by H5Loader, checkpointed with the data position, stopped
mid-epoch, and resumed from the checkpoint on a different world size and worker count.

Proves the contract between the data layer and the checkpoint (the loader's global JSON state goes
in once and comes back to every rank) and that nothing is replayed or skipped across the resume.
"""

from __future__ import annotations

import json
from pathlib import Path

from tests.multiproc import run_world

STOP_AT = 5  # global batches before the "preemption"
SAMPLES, BATCH = 700, 24


def _train(rank, world_size, files, ckpt_dir, out_dir, workers, stop_at):
    import torch
    import torch.distributed as dist

    from hpctrain.ckpt import CheckpointConfig, Checkpointer
    from hpctrain.data import H5DataConfig, H5Loader
    from hpctrain.runtime.process_group import wrap_ddp

    torch.manual_seed(0)
    model = wrap_ddp(torch.nn.Linear(3 * 8 * 8, 10), torch.device("cpu"))
    optim = torch.optim.SGD(model.parameters(), lr=0.01)
    cfg = H5DataConfig(
        files=files, keys=("x", "y"), global_batch_size=BATCH, seed=3, tail="drop", num_workers=workers, window_chunks=4
    )
    ckpt = Checkpointer(CheckpointConfig(dir=ckpt_dir, keep_last=2), run_id="e2e")
    restored = ckpt.restore(model=model.module, optimizer=optim)
    seen, step = [], 0
    with H5Loader(cfg) as loader:
        if restored is not None:
            loader.load_state_dict(restored.data_state)
            step = restored.step
        for batch in loader:
            x = batch["x"].reshape(len(batch["index"]), -1).float()
            loss = torch.nn.functional.cross_entropy(model(x), batch["y"].long())
            optim.zero_grad()
            loss.backward()
            optim.step()
            seen += batch["index"].tolist()
            step += 1
            if stop_at is not None and step == stop_at:
                ckpt.save(step, model=model.module, optimizer=optim, data_state=loader.state_dict())
                break
        total_batches = len(loader)
    ckpt.close()
    gathered = [None] * world_size
    dist.all_gather_object(gathered, seen)
    if rank == 0:
        Path(out_dir, f"seen-w{world_size}.json").write_text(json.dumps(sorted(i for part in gathered for i in part)))
    return {
        "step": step,
        "restored": None if restored is None else restored.step,
        "saved_world": None if restored is None else restored.saved_world_size,
        "batches": total_batches,
    }


def test_stop_mid_epoch_on_2_ranks_resume_on_4_ranks_sees_every_sample_once(tmp_path):
    from hpctrain.data import make_dataset

    data = tmp_path / "train.h5"
    make_dataset(data, SAMPLES, shape=(3, 8, 8), chunk_samples=32, compression="gzip", fill="fast")
    ckpt_dir, out = tmp_path / "ckpt", tmp_path
    first = run_world(_train, 2, [str(data)], str(ckpt_dir), str(out), 2, STOP_AT).results
    assert [r["step"] for r in first] == [STOP_AT, STOP_AT] and first[0]["restored"] is None

    second = run_world(_train, 4, [str(data)], str(ckpt_dir), str(out), 1, None).results
    assert all(r["restored"] == STOP_AT and r["saved_world"] == 2 for r in second)
    epoch_batches = SAMPLES // BATCH  # tail="drop"
    assert all(r["step"] == epoch_batches for r in second)

    before = json.loads((out / "seen-w2.json").read_text())
    after = json.loads((out / "seen-w4.json").read_text())
    assert len(before) == STOP_AT * BATCH and len(after) == (epoch_batches - STOP_AT) * BATCH
    union = before + after
    assert len(union) == len(set(union)) == epoch_batches * BATCH  # no sample twice, none skipped
    assert set(union) <= set(range(SAMPLES))
