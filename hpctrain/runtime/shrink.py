"""The smaller world of an in-job recovery that has no warm spare left (``RecoveryConfig.shrink``). No torch.

:func:`smaller_world` is the one place that decides who the survivors are in it: the dead ranks no spare
replaces are dropped, every other member keeps its order and is renumbered ``0..W'-1`` by its old rank. So the
slots of a global batch keep their order across the renumbered ranks: the loader's own rank split at ``W'``
(:class:`hpctrain.data.H5Loader`, the one a resume on ``W'`` ranks uses) hands out the same samples at each step
in the same slot order, ``B/W'`` per rank instead of ``B/W``. DDP averages the ranks' mean losses over ``W'``
equal shares of the same ``B`` samples: the gradient is the full world's, up to the order of the float sums.
"""

from __future__ import annotations

import typing as tp

__all__ = ["smaller_world", "renumbered"]


def smaller_world(members: tp.Mapping[int, str], dropped: tp.Iterable[int]) -> tp.Dict[str, tp.Any]:
    """The plan's ``elastic`` field: ``members`` (old rank -> process uid: the survivors and the spares in the
    ranks they took) and the ``dropped`` ranks (dead, no spare for them): ``world_size_was``, ``world_size``,
    ``dropped`` and ``ranks`` (old rank -> new rank, str keys: the plan is JSON)."""
    gone = {int(r) for r in dropped}
    kept = sorted(int(r) for r in members if int(r) not in gone)
    return {
        "world_size_was": len(kept) + len(gone),
        "world_size": len(kept),
        "dropped": sorted(gone),
        "ranks": {str(old): new for new, old in enumerate(kept)},
    }


def renumbered(elastic: tp.Mapping[str, tp.Any], old: int) -> int:
    """``old``'s rank in the smaller world (KeyError: it was dropped)."""
    return int(elastic["ranks"][str(int(old))])
