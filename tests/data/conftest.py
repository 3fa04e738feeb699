"""Small real HDF5 files shared by the data tests (session-scoped: written once)."""

from __future__ import annotations

import typing as tp

import pytest

from hpctrain.data.synth import make_dataset


@pytest.fixture(scope="session")
def h5dir(tmp_path_factory: pytest.TempPathFactory) -> tp.Any:
    return tmp_path_factory.mktemp("h5")


@pytest.fixture(scope="session")
def files(h5dir: tp.Any) -> tp.Dict[str, tp.List[str]]:
    """Named datasets: each a list of files; ``x[i].flat[0]`` holds the global sample id
    (``hpctrain.data.synth.sample_ids`` reads it back)."""
    shape = (2, 4, 4)
    out = {
        "gzip": [make_dataset(h5dir / "gz.h5", 1000, shape=shape, chunk_samples=32, compression="gzip")],
        "lzf": [make_dataset(h5dir / "lzf.h5", 700, shape=shape, chunk_samples=50, compression="lzf")],
        "contig": [make_dataset(h5dir / "contig.h5", 900, shape=(3, 8, 8))],  # rows >= 256 B: preadv path
        "multi": [
            make_dataset(h5dir / "m0.h5", 333, shape=shape, chunk_samples=16, compression="gzip"),
            make_dataset(h5dir / "m1.h5", 250, shape=shape, id_offset=333),
            make_dataset(h5dir / "m2.h5", 417, shape=shape, chunk_samples=40, id_offset=583),
        ],
        "multicontig": [
            make_dataset(h5dir / "mc0.h5", 301, shape=(3, 8, 8)),  # preadv path across files
            make_dataset(h5dir / "mc1.h5", 257, shape=(3, 8, 8), id_offset=301),
            make_dataset(h5dir / "mc2.h5", 342, shape=(3, 8, 8), id_offset=558),
        ],
    }
    return {k: [str(p) for p in v] for k, v in out.items()}
