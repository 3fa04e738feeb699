"""The demo entry as a researcher runs it: DDP fed by HDF5 data, checkpointed, resumed.

Real processes (gloo on CPU) through hpctrain's own Runner, as ``hpctrain.submit`` starts them.
"""

from __future__ import annotations

import json

import pytest

from tests.multiproc import run_world


def _demo(rank, world_size, run_dir, args):
    from hpctrain.launch.runner import Runner

    return Runner(entry="hpctrain.examples.demo:main", run_dir=run_dir, entry_args=args)()


def _run(tmp_path, name, world, args):
    run_dir = tmp_path / name
    results = run_world(_demo, world, str(run_dir), list(args), init_pg=False).results
    assert json.loads((run_dir / "demo_result.json").read_text())["steps"] == results[0]["steps"]
    return results[0]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    from hpctrain.data import make_dataset

    path = tmp_path_factory.mktemp("data") / "train.h5"
    make_dataset(path, 400, shape=(3, 8, 8), chunk_samples=32, compression="gzip", fill="random")
    return str(path)


def test_stopped_and_resumed_run_ends_with_the_weights_of_an_uninterrupted_one(tmp_path, data):
    common = ["--data", data, "--batch-size", "32", "--workers", "1", "--ckpt-every", "3"]
    straight = _run(tmp_path, "straight", 2, ["--steps", "20", "--ckpt-dir", str(tmp_path / "ck-a"), *common])
    assert straight["resumed"] is None and straight["steps_run"] == 20 and straight["weights_in_sync"]

    ck = str(tmp_path / "ck-b")
    first = _run(tmp_path, "first", 2, ["--steps", "11", "--ckpt-dir", ck, *common])  # mid-epoch (12 batches/epoch)
    second = _run(tmp_path, "second", 2, ["--steps", "20", "--ckpt-dir", ck, *common])
    assert first["steps"] == 11 and second["resumed"]["step"] == 11 and second["steps_run"] == 9
    # same world size: the resumed run reproduces the uninterrupted one bit for bit (model, optimizer, data order)
    assert second["weights_checksum"] == straight["weights_checksum"]
    assert second["final_loss"] == straight["final_loss"]

    # and it goes on with another number of ranks from the newest checkpoint
    third = _run(tmp_path, "third", 1, ["--steps", "23", "--ckpt-dir", ck, *common])
    assert third["resumed"] == {"step": 20, "saved_world_size": 2, "path": third["resumed"]["path"]}
    assert third["steps_run"] == 3 and third["world_size"] == 1


def test_synthetic_demo_resumes_too(tmp_path):
    ck = str(tmp_path / "ck")
    straight = _run(tmp_path, "straight", 2, ["--steps", "8", "--ckpt-every", "4", "--ckpt-dir", str(tmp_path / "a")])
    _run(tmp_path, "first", 2, ["--steps", "4", "--ckpt-every", "4", "--ckpt-dir", ck])
    second = _run(tmp_path, "second", 2, ["--steps", "8", "--ckpt-every", "4", "--ckpt-dir", ck])
    assert second["resumed"]["step"] == 4 and second["weights_checksum"] == straight["weights_checksum"]
