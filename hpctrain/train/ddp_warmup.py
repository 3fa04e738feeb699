"""One zero-loss forward/backward before the first step of every attempt, so that resuming is bit-exact.

DDP reduces gradients in buckets laid out in reverse parameter order for its first backward, then rebuilds
them once in the order gradients became ready. An element's place in a bucket decides the order in which the
ranks' values are added (ring all-reduce), so with 3 or more ranks the first step after a restart, on the
initial layout, differs in the last bits from the same step of an uninterrupted run, on the rebuilt one.
This pass lets DDP record the ready order (the grads are zeros and are dropped; eval mode and a forked RNG
leave BatchNorm statistics, dropout and the random streams as they were), so every real step of every
attempt runs on the rebuilt layout. ``loss_fn`` sees this call with ``model.training`` False.
"""

from __future__ import annotations

import itertools
import typing as tp

import torch

__all__ = ["warm_up_buckets"]


def warm_up_buckets(
    model: torch.nn.Module,
    module: torch.nn.Module,
    batches: tp.Iterator[tp.Any],
    *,
    loss_fn: tp.Callable[[torch.nn.Module, tp.Any], torch.Tensor],
    autocast: tp.Any,
    device: torch.device,
    world_size: int,
) -> tp.Iterator[tp.Any]:
    """Run the pass on the first batch of ``batches`` through ``model`` (the DDP wrapper of ``module``) and
    return the batches with that one put back in front. Every rank calls it (the backward all-reduces)."""
    if not hasattr(model, "no_sync") or world_size < 3:
        return batches  # no DDP (fsdp/hsdp/none: no bucket layout), or two ranks: a + b == b + a
    first = next(batches, None)
    if first is None:
        return iter(())  # no data: the first step reports it, naming the option
    was_training = model.training
    model.eval()
    devices = [device.index] if device.type == "cuda" and device.index is not None else []
    with torch.random.fork_rng(devices=devices):
        with autocast:
            loss = loss_fn(model, first)
        (loss.float() * 0.0).backward()
    model.train(was_training)
    for p in module.parameters():
        p.grad = None
    return itertools.chain([first], batches)
