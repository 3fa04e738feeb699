"""HDF5 input pipeline: deterministic, elastic-resumable, prefetching batches per rank (see docs/data.md).

Importing this package does not import torch: the login-node CLI (``python -m hpctrain data ...``)
uses only the h5py/numpy parts. ``H5Loader`` (torch) is imported on first access.
"""

from __future__ import annotations

import typing as tp

from hpctrain.data.config import H5DataConfig
from hpctrain.data.metering import contiguous_regions, epoch_order, meters, open_h5
from hpctrain.data.metrics import LoaderMetrics, StepMetrics
from hpctrain.data.synth import make_dataset

__all__ = [
    "H5DataConfig",
    "H5Loader",
    "LoaderMetrics",
    "StepMetrics",
    "make_dataset",
    "meters",
    "open_h5",
    "contiguous_regions",
    "epoch_order",
]

if tp.TYPE_CHECKING:
    from hpctrain.data.loader import H5Loader


def __getattr__(name: str) -> tp.Any:
    if name == "H5Loader":
        from hpctrain.data.loader import H5Loader

        return H5Loader
    raise AttributeError(f"module 'hpctrain.data' has no attribute {name!r}")
