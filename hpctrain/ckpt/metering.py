"""Public meters of the checkpoint code, and the primitives a benchmark's ceiling needs (see docs/checkpoint.md).

Benchmarks and tests read what hpctrain did through these names only, never through the private modules,
so that a refactor of those cannot silently change what a measured figure means. Importing this module
does not import torch; only :func:`replicated_share` needs it (imported when called).
"""

from __future__ import annotations

import os
import typing as tp

if tp.TYPE_CHECKING:  # pragma: no cover
    import torch

__all__ = ["meters", "digest", "replicated_share", "RESTORE_PHASES"]

RESTORE_PHASES = {
    "index": "parse this rank's share of the shard headers and build the index from every rank's share",
    "index_exchange": "the collective that exchanges the index shares (with the agreement on the committed steps)",
    "plan": "map the index onto the objects passed to restore(), check shapes and dtypes, agree on the plan",
    "fetch": "bring this node the shard files it lacks (the local tier's partner copies)",
    "read": "read this rank's byte regions from the shard files, with their crc32",
    "exchange": "hand every rank the bytes the others read (gather, or the node's shared buffer)",
    "views": "tensors from the exchanged bytes (views; a copy for a tensor split at an unaligned cut)",
    "verify": "gather every rank's report and decide every shard's checksum together",
    "load": "load_state_dict of the objects, and the RNG state",
    "other": "the rest of restore(): the scan of committed steps, fallbacks after a damaged step, bookkeeping",
}
"""Every phase of a restore that ``RestoreResult.phases`` reports, and what it covers, in the order they come
(docs/checkpoint.md, "Where a restore's time goes")."""


def meters() -> tp.Dict[str, tp.Any]:
    """This process's checkpoint meters, as a new dict (JSON-able):

    * ``bytes_read``: tensor bytes read from shard files by this process so far (restores and
      :func:`digest`; headers and manifests not counted). Take the difference around what you measure;
      summed over ranks and divided by the checkpoint's size it is the read amplification.
    * ``crc32_impl``: which crc32 checksums shards on save and restore: ``"isal"`` (the ``[fast]`` extra,
      ISA-L) or ``"zlib"``.
    """
    from hpctrain.ckpt._format import CRC32_IMPL
    from hpctrain.ckpt._reader import bytes_read

    return {"bytes_read": bytes_read(), "crc32_impl": CRC32_IMPL}


def digest(step_dir: tp.Union[str, os.PathLike]) -> tp.Dict[str, str]:
    """sha256 per top-level state entry (``model``, ``optimizer``, ...) of one checkpoint directory
    (``.../step-NNNNNNNNN``), independent of the world size and the sharding that wrote it.

    The same digests as ``python -m hpctrain ckpt digest``: each covers the entry's structure and, for
    every tensor, dtype, shape and the element bytes in order; rank-local state (RNG) is excluded. Reads
    every tensor byte once (counted in ``meters()["bytes_read"]``). Torch-free. Raises
    :class:`hpctrain.errors.CheckpointFormatError` on a damaged checkpoint.
    """
    from hpctrain.ckpt._index import digest_dir

    return digest_dir(step_dir)


def replicated_share(states: tp.Mapping[str, tp.Any], rank: int, world_size: int) -> tp.List["torch.Tensor"]:
    """The bytes rank ``rank`` of ``world_size`` writes when :meth:`Checkpointer.save` saves ``states``
    (``{"model": model_state_dict, "optimizer": optimizer_state_dict, ...}``, every tensor the same on
    every rank, as under DDP): 1-D views of the state's tensors, in the order of the rank's shard file.

    The checkpointer cuts the concatenated bytes of all tensors into ``world_size`` near-equal ranges at
    element boundaries, one per rank; this returns this rank's range, so a raw-write ceiling can write the
    same bytes. Sharded DTensors are not covered (each rank writes its own chunk of those): a
    :class:`hpctrain.errors.UsageError`.
    """
    from hpctrain.ckpt._dtensor import is_dtensor
    from hpctrain.ckpt._state import flatten, split_replicated
    from hpctrain.errors import UsageError

    if not (0 <= rank < world_size):
        raise UsageError(f"replicated_share(rank={rank}, world_size={world_size}): need 0 <= rank < world_size")
    tensors: tp.Dict[str, tp.Any] = {}
    for name, state in states.items():
        flatten(state, name, tensors)
    sharded = [k for k, t in tensors.items() if is_dtensor(t)]
    if sharded:
        raise UsageError(f"replicated_share: {sharded[0]} is a DTensor; only replicated (plain) state is covered")
    return [p.tensor.reshape(-1)[p.start : p.stop] for p in split_replicated(tensors, rank, world_size)]
