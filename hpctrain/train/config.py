"""The Trainer's configuration: nested keyword-only dataclasses, checked on construction (no torch).

Every check raises :class:`~hpctrain.errors.UsageError` naming the option as ``TrainConfig.<field>``,
``TrainConfig.checkpoint.<field>`` or ``TrainConfig.metrics.<field>``, so a bad value fails before any rank
builds a model. How the checkpointer saves, keeps and restores is a :class:`~hpctrain.ckpt.CheckpointConfig`
(``TrainConfig.checkpoint.config``), the same class a hand-written loop gives the Checkpointer.
"""

from __future__ import annotations

import dataclasses
import os
import typing as tp
from dataclasses import asdict, dataclass, field

from hpctrain._files import shorten
from hpctrain._validate import check_bool, check_choice, check_instance, check_int, check_number, check_path, check_str
from hpctrain.ckpt.config import CheckpointConfig, check_field
from hpctrain.defaults import DEFAULT_MTBF_NODE_HOURS
from hpctrain.errors import UsageError
from hpctrain.runtime.recovery_config import RecoveryConfig

__all__ = [
    "TrainConfig",
    "CheckpointPolicy",
    "MetricsConfig",
    "ParallelConfig",
    "AMP_MODES",
    "PARALLEL_MODES",
    "MAX_SEED",
]

AMP_MODES = ("off", "bf16", "fp16")
PARALLEL_MODES = ("ddp", "fsdp", "hsdp", "none")
PARAM_DTYPES = ("float32", "bfloat16", "float16")
MAX_SEED = 2**64 - 1
"""Largest ``TrainConfig.seed``: ``torch.manual_seed`` takes at most a 64-bit unsigned value (python's
``random.seed`` takes any integer; numpy gets ``seed % 2**32``)."""

PathLike = tp.Union[str, os.PathLike]


@dataclass(kw_only=True)
class CheckpointPolicy:
    """When the Trainer saves, and the :class:`~hpctrain.ckpt.CheckpointConfig` it saves with. Saving is on
    when ``every_steps``, ``every_minutes`` or ``config.local_every_steps`` (the local tier: docs/checkpoint.md,
    "Tiers") is set.

    ``dir`` and ``keep_last`` are shorthands for ``config.dir`` and ``config.keep_last``:
    ``CheckpointPolicy(every_steps=200, dir="/lustre/ck", keep_last=5)`` is
    ``CheckpointPolicy(every_steps=200, config=CheckpointConfig(dir="/lustre/ck", keep_last=5))``. Reading
    ``policy.dir`` or ``policy.keep_last`` reads the config.
    """

    _option_name = "TrainConfig.checkpoint.{name}"

    every_steps: int = 0
    """Save every N optimizer steps (0 = not by step count)."""
    every_minutes: tp.Union[float, str] = 0.0
    """Save when this many minutes passed since the last save (0 = not by time). Rank 0's clock decides,
    at the next log interval, so that every rank saves at the same step. ``"auto"``: the interval Young/Daly
    gives (Daly's higher-order form, :func:`hpctrain.reliability.daly_interval`) for the save cost measured
    in this attempt (the mean of its last saves' stall; 1 s until the first is measured) and the job's MTBF,
    ``mtbf_node_hours`` / nodes; recomputed after every save (docs/capacity.md)."""
    mtbf_node_hours: float = DEFAULT_MTBF_NODE_HOURS
    """Hours between unplanned failures of one node, for ``every_minutes="auto"``. Default about 3692 h: the
    6.50 failures per 1000 node-days of Meta's RSC-1 (Kokolis et al., HPCA 2025), a 512-node job failing
    every ~7 h."""
    async_save: bool = True
    """Periodic saves return after copying the state to host memory; a background thread writes it.
    The final save (end of training or stop) always blocks until committed."""
    resume: bool = True
    """Restore from the newest committed checkpoint in ``dir`` at start (False: start fresh even if one exists)."""
    config: tp.Optional[CheckpointConfig] = None
    """The checkpointer's settings (``keep_last``, ``keep_every``, ``lustre_stripe``, ``restore_mode``, ...;
    see docs/checkpoint.md). Its ``dir`` None = ``RUN_DIR/checkpoints``. None = ``CheckpointConfig()`` with
    the ``dir`` and ``keep_last`` given here; always a CheckpointConfig after construction."""
    dir: dataclasses.InitVar[tp.Optional[PathLike]] = None
    """Shorthand for ``config.dir``: the checkpoint directory (shared by all nodes); None = ``RUN_DIR/checkpoints``.
    A run resumes from the newest committed checkpoint found here."""
    keep_last: dataclasses.InitVar[tp.Optional[int]] = None
    """Shorthand for ``config.keep_last``: committed checkpoints to keep (0 = all; default
    ``CheckpointConfig.keep_last``)."""

    @property
    def enabled(self) -> bool:
        return bool(self.every_steps or self.every_minutes or (self.config and self.config.local_every_steps))

    def __post_init__(self, dir: tp.Optional[PathLike], keep_last: tp.Optional[int]) -> None:
        check_int(self, "every_steps", self.every_steps, min=0, hint="0 = not by step count")
        if self.every_minutes != "auto":
            check_number(self, "every_minutes", self.every_minutes, min=0, hint='0 = not by time, or "auto"')
        check_number(self, "mtbf_node_hours", self.mtbf_node_hours, above=0, hint="hours between failures of a node")
        check_bool(self, "async_save", self.async_save)
        check_bool(self, "resume", self.resume)
        check_instance(self, "config", self.config, CheckpointConfig, none_ok=True)
        given = {name: value for name, value in (("dir", dir), ("keep_last", keep_last)) if value is not None}
        for name, value in given.items():
            check_field(self, name, value)  # CheckpointConfig's rule, named TrainConfig.checkpoint.<name>
        if self.config is None:
            self.config = CheckpointConfig(**given)
            return
        for name, value in given.items():
            if value != getattr(self.config, name):
                raise UsageError(
                    f"TrainConfig.checkpoint.{name}={value!r} disagrees with TrainConfig.checkpoint.config.{name}="
                    f"{getattr(self.config, name)!r}: give it in one place"
                )

    def checkpointer_config(self, default_dir: PathLike) -> CheckpointConfig:
        """``config`` as the Checkpointer takes it: ``dir`` None replaced by ``default_dir`` (the run's
        ``RUN_DIR/checkpoints``)."""
        assert self.config is not None  # set by __post_init__
        if self.config.dir is not None:
            return self.config
        return dataclasses.replace(self.config, dir=default_dir)


def _config_attr(name: str, doc: str) -> property:
    def get(self: CheckpointPolicy) -> tp.Any:
        return getattr(self.config, name)

    def set(self: CheckpointPolicy, value: tp.Any) -> None:
        check_field(self, name, value)
        self.config = dataclasses.replace(tp.cast(CheckpointConfig, self.config), **{name: value})

    return property(get, set, doc=doc)


# Read and written through the config; set here, after @dataclass read the shorthands' defaults (None).
CheckpointPolicy.dir = _config_attr("dir", "``config.dir``: the checkpoint directory; None = RUN_DIR/checkpoints.")  # type: ignore[assignment]
CheckpointPolicy.keep_last = _config_attr("keep_last", "``config.keep_last``: committed checkpoints kept (0 = all).")  # type: ignore[assignment]


@dataclass(kw_only=True)
class MetricsConfig:
    """The always-on measurement (see docs/train.md for the JSONL schema)."""

    _option_name = "TrainConfig.metrics.{name}"

    enabled: bool = True
    """Time every step's phases on every rank and gather them at each log interval. False keeps only the
    loss and samples/s (for A/B measurements of the measurement itself)."""
    display: bool = True
    """Rank 0 shows a live view (rich) of each interval; other ranks never print."""
    flops_per_sample: tp.Optional[float] = None
    """Training FLOPs (forward + backward) per sample; None = counted once with
    ``torch.utils.flop_counter`` on the first step of each start."""
    peak_flops_per_device: tp.Optional[float] = None
    """Peak FLOP/s of one device for MFU; None = looked up for known GPUs (dense bf16), else MFU is null."""

    def __post_init__(self) -> None:
        check_bool(self, "enabled", self.enabled)
        check_bool(self, "display", self.display)
        check_number(self, "flops_per_sample", self.flops_per_sample, above=0, none_ok=True, hint="None = counted")
        check_number(
            self, "peak_flops_per_device", self.peak_flops_per_device, above=0, none_ok=True, hint="None = known GPUs"
        )


Hook = tp.Union[str, tp.Callable[..., tp.Any]]
"""A user function: the callable itself, or ``"package.module:function"`` (recorded by name in the ledger)."""


def _check_hook(owner: tp.Any, name: str, value: tp.Any) -> None:
    if value is None or callable(value):
        return
    if not (isinstance(value, str) and value.count(":") == 1 and all(value.split(":"))):
        raise UsageError(
            f"TrainConfig.parallel.{name}={value!r} must be a callable or 'package.module:function', or None"
        )


@dataclass(kw_only=True)
class ParallelConfig:
    """How the model is spread over the ranks (docs/train.md, "Models larger than one GPU")."""

    _option_name = "TrainConfig.parallel.{name}"

    mode: str = "ddp"
    """'ddp': a full replica per rank, gradients all-reduced (DistributedDataParallel). 'fsdp': FSDP2
    ``fully_shard`` over all ranks (parameters, gradients and optimizer state split ~1/world per rank). 'hsdp':
    shard within a node, replicate across nodes (a 2-D mesh, ``hsdp_shape``). 'none': no wrapper (one rank)."""
    hsdp_shape: tp.Optional[tp.Tuple[int, int]] = None
    """'hsdp' mesh ``(replicate, shard)``; None = ``(world / ranks_per_node, ranks_per_node)`` from the run
    context's ``local_world_size`` (the ranks of one node)."""
    wrap: tp.Optional[str] = None
    """Class name of the modules sharded one by one (fsdp/hsdp), each its own all-gather group, before the root;
    None = the children of the model's largest ``nn.ModuleList`` (its blocks); '' = the root only."""
    parallelize: tp.Optional[Hook] = None
    """``parallelize(model, mesh) -> model``: your own wrapping (tensor parallel, another FSDP layout), called
    instead of the Trainer's with the mode's DeviceMesh (1-D for ddp/fsdp, 2-D ``("replicate", "shard")`` for
    hsdp). Activation checkpointing and compile are applied before it."""
    param_dtype: tp.Optional[str] = None
    """FSDP mixed precision, GPU only: the dtype parameters are all-gathered and computed in ('bfloat16',
    'float16', 'float32'); the sharded master copy keeps the model's dtype. None = the model's dtype."""
    reduce_dtype: tp.Optional[str] = None
    """FSDP mixed precision, GPU only: the dtype gradients are reduce-scattered in; None = ``param_dtype``."""
    cpu_offload: bool = False
    """FSDP: keep the sharded parameters, gradients and optimizer state in host memory (FSDP2
    ``CPUOffloadPolicy``); the optimizer steps on the CPU. GPU only."""
    reshard_after_forward: bool = True
    """FSDP: free each block's gathered parameters after its forward and gather them again in backward
    (False: keep them, more memory, one all-gather less per block)."""
    activation_checkpoint: tp.Union[str, int] = "none"
    """Recompute block activations in backward instead of keeping them: 'none', 'full' (every block) or an
    integer k (every k-th block). Any mode; the blocks are those ``wrap`` names."""
    compile: bool = False
    """``torch.compile`` each block (before sharding)."""
    compile_cache: tp.Optional[str] = "run"
    """Where ``compile``'s on-disk caches live (Inductor's FX-graph and AOTAutograd caches): 'run' = the run
    directory (``RunDir.compile_cache``), so a requeued attempt on other nodes compiles warm; a path = that
    directory (e.g. one shared by a project's runs); None = torch's default (node-local
    ``/tmp/torchinductor_$USER``). A ``TORCHINDUCTOR_CACHE_DIR`` set in the job's environment wins (unless it names
    torch's default, which a parent that compiled passes down)."""
    meta_init: bool = False
    """Build the model on the meta device (no memory), shard it, then materialise each rank's shards
    (``to_empty``) and initialise them with ``init_weights``; a restore then overwrites them."""
    init_weights: tp.Optional[Hook] = None
    """``init_weights(model)`` after a meta build, on the sharded model; None = ``reset_parameters()`` of
    every submodule that has one."""

    def __post_init__(self) -> None:
        check_choice(self, "mode", self.mode, PARALLEL_MODES)
        if self.hsdp_shape is not None:
            shape = tuple(self.hsdp_shape) if isinstance(self.hsdp_shape, (tuple, list)) else None
            if shape is None or len(shape) != 2 or not all(isinstance(n, int) and n >= 1 for n in shape):
                raise UsageError(
                    f"TrainConfig.parallel.hsdp_shape={self.hsdp_shape!r} must be (replicate, shard), two ints >= 1"
                )
            self.hsdp_shape = (int(shape[0]), int(shape[1]))
        check_str(self, "wrap", self.wrap, none_ok=True, hint="a class name; None = the largest ModuleList's blocks")
        _check_hook(self, "parallelize", self.parallelize)
        _check_hook(self, "init_weights", self.init_weights)
        for name in ("param_dtype", "reduce_dtype"):
            if getattr(self, name) is not None:
                check_choice(self, name, getattr(self, name), PARAM_DTYPES)
        for name in ("cpu_offload", "reshard_after_forward", "compile", "meta_init"):
            check_bool(self, name, getattr(self, name))
        check_str(self, "compile_cache", self.compile_cache, none_ok=True, hint="'run', a directory, or None")
        if self.compile_cache == "":
            raise UsageError("TrainConfig.parallel.compile_cache='' names no directory: use 'run', a path, or None")
        ac = self.activation_checkpoint
        if not (ac in ("none", "full") or (isinstance(ac, int) and not isinstance(ac, bool) and ac >= 1)):
            raise UsageError(
                f"TrainConfig.parallel.activation_checkpoint={ac!r} must be 'none', 'full' or an int k >= 1 "
                "(every k-th block)"
            )
        sharded = self.mode in ("fsdp", "hsdp")
        for name in ("param_dtype", "reduce_dtype", "cpu_offload", "hsdp_shape"):
            if getattr(self, name) not in (None, False) and not sharded and self.parallelize is None:
                raise UsageError(f"TrainConfig.parallel.{name} applies to mode 'fsdp' or 'hsdp', not {self.mode!r}")
        if self.hsdp_shape is not None and self.mode != "hsdp":
            raise UsageError(f"TrainConfig.parallel.hsdp_shape applies to mode 'hsdp', not {self.mode!r}")

    def to_dict(self) -> tp.Dict[str, tp.Any]:
        """JSON-ready: hooks by name (``module:qualname``)."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        for name in ("parallelize", "init_weights"):
            hook = out[name]
            if callable(hook):
                out[name] = f"{getattr(hook, '__module__', '?')}:{getattr(hook, '__qualname__', repr(hook))}"
        if out["hsdp_shape"] is not None:
            out["hsdp_shape"] = list(out["hsdp_shape"])
        return out


@dataclass(kw_only=True)
class TrainConfig:
    """What the Trainer does. Give exactly one of ``steps`` or ``epochs``."""

    steps: tp.Optional[int] = None
    """Total optimizer steps of the run (a resumed run counts from its checkpoint's step)."""
    epochs: tp.Optional[int] = None
    """Total epochs over the training data (HDF5 data only): ``epochs * batches_per_epoch // grad_accum`` steps."""
    log_every: int = 10
    """Optimizer steps per metrics interval: one JSONL record, one collective, one display update."""
    eval_every: int = 0
    """Evaluate on the eval data every N steps (0 = only at the end, when eval data is given)."""
    eval_batches: int = 0
    """Eval batches per evaluation (0 = one whole pass over the eval data)."""
    grad_accum: int = 1
    """Micro-batches per optimizer step; gradients are synchronised only on the last one (DDP no_sync)."""
    grad_clip: float = 0.0
    """Clip the gradient norm to this value before each optimizer step (0 = off)."""
    amp: str = "off"
    """Mixed precision on GPU: 'off', 'bf16' (autocast) or 'fp16' (autocast + GradScaler, checkpointed)."""
    seed: int = 0
    """Seeds python, numpy and torch before the model is built (the same initial weights on every rank);
    0 to ``MAX_SEED`` (2**64 - 1, what ``torch.manual_seed`` takes)."""
    checkpoint: CheckpointPolicy = field(default_factory=CheckpointPolicy)
    """When and where to checkpoint."""
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    """Measurement and display."""
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    """How the model is spread over the ranks: ddp (default), fsdp, hsdp or none; see ParallelConfig."""
    accept_data_change: bool = False
    """Resume although the input data's fingerprint changed since the previous attempt (a file added or
    removed, its size, HDF5 structure or sampled content): the change is recorded in the run's identity.
    Without it such a resume stops with one line naming the file (docs/bundle.md, "Run identity")."""
    recovery: tp.Optional[RecoveryConfig] = None
    """In-job recovery (:class:`hpctrain.runtime.recovery.RecoveryConfig`, docs/preemption.md, "In-job
    recovery"): when a rank's process dies, the living ranks keep their processes and a warm spare takes its
    place with the state of the last completed step from a survivor's memory; only the interrupted step is
    redone. DDP only (sharded state falls back with one line to the restart from the last commit); needs the
    recovery store the launcher serves (``HPCTRAIN_RECOVERY_STORE``). None = off."""
    tensorboard: tp.Union[bool, PathLike, None] = None
    """Write TensorBoard events while training (rank 0, the scalars ``export-tensorboard`` writes, flushed at
    every log interval): True = ``RUN_DIR/tensorboard/``, a path = that directory (a relative one under
    RUN_DIR), None or False = off. A requeued attempt continues the same TensorBoard run, its redone steps
    once (docs/report.md, "TensorBoard, live"). Needs the tensorboard package."""

    def __post_init__(self) -> None:
        if (self.steps is None) == (self.epochs is None):
            raise UsageError(
                f"TrainConfig: give exactly one of steps or epochs (got steps={self.steps!r}, epochs={self.epochs!r})"
            )
        check_int(self, "steps", self.steps, min=1, none_ok=True)
        check_int(self, "epochs", self.epochs, min=1, none_ok=True)
        check_int(self, "log_every", self.log_every, min=1)
        check_int(self, "eval_every", self.eval_every, min=0, hint="0 = only at the end")
        check_int(self, "eval_batches", self.eval_batches, min=0, hint="0 = a whole pass")
        check_int(self, "grad_accum", self.grad_accum, min=1)
        check_number(self, "grad_clip", self.grad_clip, min=0, hint="0 = off")
        check_int(self, "seed", self.seed, min=0, max=MAX_SEED, hint="what torch.manual_seed takes")
        check_choice(self, "amp", self.amp, AMP_MODES)
        check_instance(self, "checkpoint", self.checkpoint, CheckpointPolicy)
        check_instance(self, "metrics", self.metrics, MetricsConfig)
        check_instance(self, "parallel", self.parallel, ParallelConfig)
        check_bool(self, "accept_data_change", self.accept_data_change)
        check_instance(self, "recovery", self.recovery, RecoveryConfig, none_ok=True)
        self._check_tensorboard()

    def _check_tensorboard(self) -> None:
        value = self.tensorboard
        if value is None or isinstance(value, bool):
            pass
        else:
            check_path(self, "tensorboard", value, what="True, a directory", none_ok=True, hint="None or False = off")
        if value not in (None, False):
            from hpctrain.train.tensorboard import missing_package

            why = missing_package()
            if why is not None:
                raise UsageError(f"TrainConfig.tensorboard={shorten(repr(value))}: {why}")

    def tensorboard_dir(self, run_dir: PathLike) -> tp.Optional[str]:
        """Where ``tensorboard`` writes for a run in ``run_dir``: None when off."""
        if self.tensorboard in (None, False):
            return None
        if self.tensorboard is True:
            return os.path.join(os.fspath(run_dir), "tensorboard")
        return os.path.join(os.fspath(run_dir), os.fspath(tp.cast(PathLike, self.tensorboard)))

    def to_dict(self) -> tp.Dict[str, tp.Any]:
        """Plain JSON-ready values (the ledger records it). ``checkpoint.dir`` and ``checkpoint.keep_last``
        repeat ``checkpoint.config``'s, as the shorthands read."""
        out = asdict(self)
        out["parallel"] = self.parallel.to_dict()
        ck = out["checkpoint"]
        if ck["config"]["dir"] is not None:
            ck["config"]["dir"] = os.fspath(ck["config"]["dir"])
        ck["config"]["lustre_stripe"] = list(ck["config"]["lustre_stripe"])
        ck["dir"], ck["keep_last"] = ck["config"]["dir"], ck["config"]["keep_last"]
        if self.tensorboard is not None and not isinstance(self.tensorboard, bool):
            out["tensorboard"] = os.fspath(self.tensorboard)
        return out
