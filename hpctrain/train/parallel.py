"""How the Trainer spreads a model over the ranks: ``TrainConfig.parallel`` (ddp | fsdp | hsdp | none).

The build, in order (docs/train.md, "Models larger than one GPU"):

1. the model factory runs after seeding, on the meta device when ``meta_init`` (no memory: a model larger
   than one device can be described before any rank holds it);
2. the *blocks* are found (children of modules of class ``wrap``, default the children of the largest
   ``nn.ModuleList``); activation checkpointing and ``torch.compile`` are applied to them in place (the
   module tree, hence the state-dict keys, stay as they were: a checkpoint moves between modes);
3. the DeviceMesh is built from the run context: 1-D over all ranks, or for hsdp ``(replicate, shard)`` with
   the shard dimension the ranks of one node (``ctx.local_world_size``; Slurm's block distribution puts a
   node's ranks next to each other, so each shard group is one node);
4. the wrapping: the user's ``parallelize(model, mesh)``, else DDP, else FSDP2 ``fully_shard`` on every block
   and then the root (one all-gather / reduce-scatter group per block), with the mixed-precision and
   offload policies;
5. a meta build is materialised shard by shard (``to_empty``: each rank allocates only its local chunks)
   and initialised by ``init_weights`` (default ``reset_parameters()`` of every submodule); a restore then
   overwrites it.

Also here: :func:`grad_sync` (gradient accumulation under DDP or FSDP) and :func:`attach_fsdp_timing` (the
exposed-communication measure of FSDP, docs/train.md); what this rank holds is
:func:`~hpctrain.train.memory.state_bytes`.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import os
import typing as tp
from pathlib import Path

import torch

from hpctrain.errors import UsageError
from hpctrain.rundir import RunDir
from hpctrain.train.config import ParallelConfig

__all__ = [
    "Wrapped",
    "build_model",
    "find_blocks",
    "build_mesh",
    "grad_sync",
    "attach_fsdp_timing",
    "is_fsdp",
    "compile_cache_dir",
    "use_compile_cache",
]

# torch reads it whenever Inductor asks for its cache directory (cache_dir_utils.cache_dir), and the first ask
# writes torch's default into it (importing torch._dynamo asks): the job's own value is the one seen when this
# module was first imported, before any compile
COMPILE_CACHE_ENV = "TORCHINDUCTOR_CACHE_DIR"
_JOB_COMPILE_CACHE = os.environ.get(COMPILE_CACHE_ENV) or None  # empty names nothing (torch would take the cwd)


def _torch_default_compile_cache() -> tp.Optional[str]:
    """Inductor's own default (``/tmp/torchinductor_$USER``), as torch computes it; None if torch moved it."""
    try:
        from torch._inductor.runtime.cache_dir_utils import default_cache_dir
    except ImportError:
        return None
    return default_cache_dir()


class Wrapped(tp.NamedTuple):
    model: torch.nn.Module
    """What the steps run: the DDP wrapper, or the (FSDP2-sharded) module itself."""
    module: torch.nn.Module
    """What is saved, restored and evaluated."""
    mesh: tp.Any
    """The DeviceMesh of the mode (None under ddp/none or without a process group)."""


def _dist_up() -> bool:
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized()


def resolve_hook(hook: tp.Any, name: str) -> tp.Optional[tp.Callable[..., tp.Any]]:
    """A callable, or ``'package.module:function'`` imported."""
    if hook is None or callable(hook):
        return hook
    mod, _, fn = hook.partition(":")
    try:
        return tp.cast(tp.Callable[..., tp.Any], functools.reduce(getattr, fn.split("."), importlib.import_module(mod)))
    except (ImportError, AttributeError) as exc:
        raise UsageError(f"TrainConfig.parallel.{name}={hook!r}: cannot import it ({exc})") from None


def find_blocks(model: torch.nn.Module, wrap: tp.Optional[str]) -> tp.List[torch.nn.Module]:
    """The modules wrapped (and checkpointed) one by one: instances of class ``wrap`` (by name, outermost
    only), or with ``wrap`` None the children of the largest ``nn.ModuleList`` (by parameter count); '' none."""
    if wrap == "":
        return []
    if wrap is not None:
        found: tp.List[torch.nn.Module] = []
        inside: tp.Set[int] = set()
        for m in model.modules():  # pre-order: an outer match is seen before what it contains
            if id(m) in inside:
                continue
            if type(m).__name__ == wrap and m is not model:
                found.append(m)
                inside.update(id(s) for s in m.modules())
        if not found:
            raise UsageError(f"TrainConfig.parallel.wrap={wrap!r}: the model has no submodule of that class")
        return found
    lists = [m for m in model.modules() if isinstance(m, torch.nn.ModuleList) and len(m)]
    if not lists:
        return []
    biggest = max(lists, key=lambda m: sum(p.numel() for p in m.parameters()))
    return list(biggest)


def _checkpointed(block: torch.nn.Module) -> None:
    """Recompute ``block``'s activations in backward (non-reentrant ``torch.utils.checkpoint``, which replays
    the RNG state). The forward is replaced on the instance, not wrapped in a new module, so the state-dict
    keys stay those of the bare model."""
    from torch.utils.checkpoint import checkpoint

    inner = block.forward

    def forward(*args: tp.Any, **kwargs: tp.Any) -> tp.Any:
        return checkpoint(inner, *args, use_reentrant=False, **kwargs)

    block.forward = forward  # type: ignore[method-assign]


def apply_block_options(blocks: tp.Sequence[torch.nn.Module], cfg: ParallelConfig) -> None:
    ac = cfg.activation_checkpoint
    if ac != "none" and not blocks:
        raise UsageError(
            "TrainConfig.parallel.activation_checkpoint: the model has no blocks (no nn.ModuleList; name their "
            "class with TrainConfig.parallel.wrap)"
        )
    for i, block in enumerate(blocks):
        if ac == "full" or (isinstance(ac, int) and i % ac == 0):
            _checkpointed(block)
        if cfg.compile:
            block.compile()


def compile_cache_dir(cfg: ParallelConfig, run_dir: tp.Optional[os.PathLike]) -> tp.Optional[Path]:
    """Where ``cfg.compile``'s caches go (``ParallelConfig.compile_cache``): None = torch's default."""
    if not cfg.compile or cfg.compile_cache is None:
        return None
    if cfg.compile_cache == "run":
        return RunDir(run_dir).compile_cache if run_dir is not None else None
    return Path(cfg.compile_cache).expanduser()


def use_compile_cache(path: tp.Optional[Path]) -> tp.Optional[tp.Tuple[Path, int]]:
    """Point Inductor's caches at ``path`` (unless the job's environment named a directory) before the first
    compile; returns the directory in use and how many files it held (0: this attempt compiles cold; at most
    1000 are counted).
    Inductor writes its entries atomically (a temporary file, then a rename), so every rank of every attempt
    shares one directory."""
    if path is None:
        return None
    # torch writes its default into the environment on its first ask, so a parent that compiled before it
    # started this process passes that down: the default is nobody's choice, the run's cache still wins over it.
    job_own = _JOB_COMPILE_CACHE if _JOB_COMPILE_CACHE != _torch_default_compile_cache() else None
    chosen = Path(job_own) if job_own else path
    try:
        chosen.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UsageError(
            f"TrainConfig.parallel.compile_cache: cannot create {chosen} ({e.strerror}); "
            "name a writable directory, or None for torch's default"
        ) from None
    os.environ[COMPILE_CACHE_ENV] = str(chosen)
    return chosen, _count_files(chosen, limit=1000)


def _count_files(root: Path, *, limit: int) -> int:
    """Files under ``root``, counted up to ``limit`` (a shared cache can hold many: this is for one log line)."""
    n = 0
    for _, _, files in os.walk(root):
        n += len(files)
        if n >= limit:
            return limit
    return n


def local_world_size(ctx: tp.Any, world_size: int) -> int:
    """Ranks per node: the context's ``local_world_size`` (a RunContext has it), else the world (one node)."""
    n = getattr(ctx, "local_world_size", None)
    return int(n) if n else world_size


def build_mesh(cfg: ParallelConfig, *, device: torch.device, world_size: int, per_node: int) -> tp.Any:
    """The mode's DeviceMesh: 1-D over all ranks, or hsdp's ``(replicate, shard)``."""
    from torch.distributed.device_mesh import init_device_mesh

    if cfg.mode != "hsdp":
        return init_device_mesh(device.type, (world_size,), mesh_dim_names=("dp",))
    shape = cfg.hsdp_shape or (world_size // max(per_node, 1), per_node)
    if shape[0] * shape[1] != world_size:
        where = "TrainConfig.parallel.hsdp_shape" if cfg.hsdp_shape else f"{per_node} ranks per node"
        raise UsageError(f"hsdp mesh {tuple(shape)} ({where}) does not multiply to the world size {world_size}")
    return init_device_mesh(device.type, tuple(shape), mesh_dim_names=("replicate", "shard"))


def _fsdp_kwargs(cfg: ParallelConfig, device: torch.device) -> tp.Dict[str, tp.Any]:
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy

    kw: tp.Dict[str, tp.Any] = {}
    if cfg.param_dtype or cfg.reduce_dtype:
        if device.type != "cuda":
            raise UsageError("TrainConfig.parallel.param_dtype/reduce_dtype: FSDP mixed precision is GPU only")
        pd = getattr(torch, cfg.param_dtype) if cfg.param_dtype else None
        rd = getattr(torch, cfg.reduce_dtype) if cfg.reduce_dtype else None
        kw["mp_policy"] = MixedPrecisionPolicy(param_dtype=pd, reduce_dtype=rd)
    if cfg.cpu_offload:
        if device.type != "cuda":
            raise UsageError("TrainConfig.parallel.cpu_offload: offloading to the host is for GPU runs")
        kw["offload_policy"] = CPUOffloadPolicy()
    return kw


def _shard(
    model: torch.nn.Module,
    blocks: tp.Sequence[torch.nn.Module],
    mesh: tp.Any,
    cfg: ParallelConfig,
    device: torch.device,
) -> None:
    from torch.distributed.fsdp import fully_shard

    kw = _fsdp_kwargs(cfg, device)
    for block in blocks:
        fully_shard(block, mesh=mesh, reshard_after_forward=cfg.reshard_after_forward, **kw)
    fully_shard(model, mesh=mesh, **kw)  # the root: what no block holds (embeddings, heads, norms)


def _default_init(model: torch.nn.Module) -> None:
    for m in model.modules():
        reset = getattr(m, "reset_parameters", None)
        if callable(reset):
            reset()


def build_model(
    factory: tp.Callable[[], torch.nn.Module],
    cfg: ParallelConfig,
    *,
    device: torch.device,
    world_size: int,
    per_node: int,
) -> Wrapped:
    """Steps 1-5 of the module doc; every rank calls it (the wrapping is collective)."""
    up = _dist_up()
    mode = cfg.mode
    if mode == "none" and world_size > 1:
        raise UsageError(f"TrainConfig.parallel.mode='none' runs one rank; this job has {world_size}")
    if mode in ("fsdp", "hsdp") and not up:
        raise UsageError(f"TrainConfig.parallel.mode={mode!r} needs a process group (launch with hpctrain)")
    with torch.device("meta") if cfg.meta_init else contextlib.nullcontext():
        module = factory()
    if not isinstance(module, torch.nn.Module):
        raise UsageError(f"Trainer(model=...): the factory returned a {type(module).__name__}, not an nn.Module")
    if not cfg.meta_init:
        module = module.to(device)
    blocks = find_blocks(module, cfg.wrap)
    apply_block_options(blocks, cfg)
    user = resolve_hook(cfg.parallelize, "parallelize")
    model: torch.nn.Module = module
    sharded = user is None and mode in ("fsdp", "hsdp")
    # DDP needs no mesh (and hsdp's would create process groups): built for what uses it
    wanted = up and (sharded or user is not None)
    mesh = build_mesh(cfg, device=device, world_size=world_size, per_node=per_node) if wanted else None
    if user is not None:
        module = model = user(module, mesh)
        if not isinstance(model, torch.nn.Module):
            raise UsageError(f"TrainConfig.parallel.parallelize returned a {type(model).__name__}, not an nn.Module")
    elif sharded:
        _shard(module, blocks, mesh, cfg, device)
    if cfg.meta_init:
        module.to_empty(device=device)  # each rank allocates its own shards only
        init = resolve_hook(cfg.init_weights, "init_weights") or _default_init
        with torch.no_grad():
            init(module)
        model = module
    if user is None and mode == "ddp" and up:
        from hpctrain.runtime.process_group import wrap_ddp

        model = wrap_ddp(module, device)
    return Wrapped(model, module, mesh)


def is_fsdp(model: tp.Any) -> bool:
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


@contextlib.contextmanager
def grad_sync(model: torch.nn.Module, sync: bool) -> tp.Iterator[None]:
    """Reduce gradients in this backward or not (gradient accumulation): FSDP2's
    ``set_requires_gradient_sync`` (no reduce-scatter / all-reduce, unsharded gradients accumulate), DDP's
    ``no_sync``; nothing to do for a bare module."""
    if is_fsdp(model):
        model.set_requires_gradient_sync(sync)  # type: ignore[operator]
        yield
    elif not sync and hasattr(model, "no_sync"):
        with model.no_sync():  # type: ignore[operator]
            yield
    else:
        yield


def attach_fsdp_timing(module: torch.nn.Module, timer: tp.Any) -> tp.Callable[[], None]:
    """Time what FSDP2 makes the training stream wait for, charged to ``grad_comm_exposed``.

    Each FSDP parameter group (one per block, one for the root) is timed inside ``unshard`` and
    ``wait_for_unshard`` (the all-gather of a block's parameters before its forward and backward: the
    compute waits there for whatever of the all-gather a prefetch did not hide) and ``post_backward`` /
    ``finalize_backward`` (the reduce-scatter of its gradients, and the final wait for the last ones).
    On GPU the span is two CUDA events on the compute stream, so it is the time that stream was blocked
    (collectives on FSDP's own streams that overlap compute do not count); on CPU, where gloo's
    collectives run while the training thread waits for them, it is the host time spent in those calls.
    Returns a function that undoes the timing."""
    from torch.distributed.fsdp import FSDPModule

    depth = [0]
    undo: tp.List[tp.Callable[[], None]] = []

    def timed(group: tp.Any, name: str) -> None:
        inner = getattr(group, name)

        def call(*args: tp.Any, **kwargs: tp.Any) -> tp.Any:
            if depth[0]:
                return inner(*args, **kwargs)
            depth[0] += 1
            token = timer.comm_begin()
            try:
                return inner(*args, **kwargs)
            finally:
                timer.comm_end(token)
                depth[0] -= 1

        setattr(group, name, call)
        undo.append(lambda: delattr(group, name))

    for m in module.modules():
        if isinstance(m, FSDPModule):
            state = m._get_fsdp_state()
            for group in getattr(state, "_fsdp_param_groups", []):
                for name in ("unshard", "wait_for_unshard", "post_backward", "finalize_backward"):
                    if callable(getattr(group, name, None)):  # another torch may name them otherwise: not timed
                        timed(group, name)

    def remove() -> None:
        for u in undo:
            u()
        undo.clear()

    return remove
