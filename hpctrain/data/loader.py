"""``H5Loader``: the rank's iterator of batches (dict key → torch tensor), resumable on any topology.

Typical use::

    cfg = H5DataConfig(files=["train.h5"], keys=("x", "y"), global_batch_size=1024, seed=0)
    with H5Loader(cfg, device="cuda") as loader:
        loader.load_state_dict(ckpt.get("data", {}))     # no-op on a fresh run
        for epoch in range(loader.epoch, epochs):
            loader.set_epoch(epoch)
            for batch in loader:                          # batch["x"], batch["y"], batch["index"]
                ...; ckpt["data"] = loader.state_dict()   # global, identical on every rank

CPU batches are views of shared memory, valid until the next batch is requested (as DALI's outputs);
``.clone()`` what you keep. With a CUDA device the batch is copied (pinned, non-blocking) and owned;
the stream the step runs on waits for the copy: ``stream=`` when given, else the stream current at
``next()`` (see ``docs/data.md``, GPU batches).
"""

from __future__ import annotations

import math
import time
import typing as tp

import numpy as np
import torch

from hpctrain.data._h5 import Layout, scan
from hpctrain.data._order import EpochOrder, EpochPlan, batches_per_epoch
from hpctrain.data._pinned import PinnedRing
from hpctrain.data._workers import InlineReader, SlotArena, WorkerPool, batch_spec, memory_available
from hpctrain.data.config import H5DataConfig
from hpctrain.data.metrics import LoaderMetrics, StepMetrics
from hpctrain.data.stage import local_files
from hpctrain.errors import HpctrainError, UsageError

__all__ = ["H5Loader", "STATE_FORMAT"]

STATE_FORMAT = "hpctrain.data/1"
_TASK_WINDOWS = 8.0  # a task spans this many shuffle windows per partition: read amplification ≈ 1 + 1/this
_SLOT_BUDGET = 512 << 20  # at most this much shared memory for ready/in-flight batches per rank
_MEMORY_SHARE = 0.5  # the batch slots may take at most this share of the memory left (the model needs the rest)


class _Pipe:
    """Prefetch state that outlives one ``for`` loop, so the next epoch's first tasks are read while the
    current epoch ends. Tasks are (task_id, slots, epoch, first batch), in stream order."""

    def __init__(self, nslots: int, epoch: int, first: int, plan: EpochPlan) -> None:
        self.free = list(range(nslots))
        self.tasks: tp.List[tp.Tuple[int, tp.List[int], int, int]] = []
        self.task_id = 0
        self.epoch, self.next_batch, self.plan = epoch, first, plan  # where the next submission starts

    def at(self, epoch: int, batch: int) -> bool:
        """Is the next batch this pipe will deliver (epoch, batch)?"""
        if self.tasks:
            return self.tasks[0][2:] == (epoch, batch)
        return (self.epoch, self.next_batch) == (epoch, batch)


class H5Loader:
    """Deterministic, elastic-resumable, prefetching HDF5 batches for one rank. See ``docs/data.md``."""

    def __init__(
        self,
        config: H5DataConfig,
        rank: tp.Optional[int] = None,
        world_size: tp.Optional[int] = None,
        device: tp.Union[str, torch.device, None] = None,
        stream: tp.Any = None,
    ) -> None:
        """``rank``/``world_size``: default :func:`hpctrain.runtime.process_group.rank_and_world`.

        ``stream``: the ``torch.cuda.Stream`` the training step consumes batches on, when it is not the
        stream current at ``next()`` (a step inside ``with torch.cuda.stream(s):`` while the ``for``
        loop is outside it); settable later as ``loader.stream``."""
        if rank is None or world_size is None:
            from hpctrain.runtime.process_group import rank_and_world

            r, w = rank_and_world()
            rank = r if rank is None else rank
            world_size = w if world_size is None else world_size
        if world_size < 1 or not 0 <= rank < world_size:
            raise UsageError(f"rank {rank} is not in [0, world_size={world_size})")
        self.config, self.rank, self.world_size = config, int(rank), int(world_size)
        self.device = torch.device(device) if device is not None else None
        if self.device is not None and self.device.type == "cuda" and not torch.cuda.is_available():
            raise UsageError(
                f"H5Loader(device={str(device)!r}) but CUDA is not available on this node; "
                f"pass device=None (CPU batches) or run on a GPU node"
            )
        # a job that stages (submit --stage) reads this node's verified local copies (hpctrain.data.stage)
        self.layout: Layout = scan(local_files(config.files), config.keys, config.block_bytes)
        self.partitions = config.partitions or self.world_size
        self.epoch = 0
        self.samples_consumed = 0  # global samples of the current epoch already handed out (all ranks)
        self.metrics = LoaderMetrics()
        self._check_topology()
        self._check_memory()
        self._pool: tp.Union[WorkerPool, InlineReader, None] = None
        self._arena: tp.Optional[SlotArena] = None
        self._held: tp.Optional[int] = None  # slot the consumer is holding
        self.stream = stream
        self._ring: tp.Optional[PinnedRing] = None
        self._closed = False
        self._active = 0  # generation of the live iterator; older ones stop
        self._pending: tp.Set[int] = set()  # task ids submitted and not yet collected
        self._pipe: tp.Optional[_Pipe] = None

    # ---- topology, plan ------------------------------------------------------------------------
    def _check_topology(self) -> None:
        cfg, n = self.config, self.layout.num_samples
        b = cfg.global_batch_size
        if b % self.world_size:
            raise UsageError(
                f"H5DataConfig.global_batch_size ({b}) is not divisible by the world size "
                f"({self.world_size}); every rank must get the same batch size"
            )
        if b % self.partitions:
            raise UsageError(
                f"partitions ({self.partitions}) must divide global_batch_size ({b}); set H5DataConfig.partitions"
            )
        if n < self.partitions:
            raise UsageError(f"{self._where()}: {n} samples, fewer than partitions={self.partitions}")
        if self.num_batches == 0:
            raise UsageError(
                f"{self._where()}: {n} samples give no full global batch of {b} with tail='drop' "
                f"(each of {self.world_size} ranks would get no batches); lower global_batch_size "
                f"or use tail='pad'"
            )

    def _slots_needed(self, k: int) -> int:
        return (self._tasks_in_flight() + 1) * k + 1  # + the batch the consumer holds

    def _check_memory(self) -> None:
        """Refuse, at construction, batch slots that do not fit in memory: a small file may declare huge
        samples, and the first sign would otherwise be an out-of-memory kill at the first batch."""
        c = self.config
        nslots = self._slots_needed(self._task_batches())
        spec = batch_spec(self.layout, self.local_batch_size, c.tail == "exact")
        need = SlotArena.nbytes(spec, nslots)
        have, where = memory_available()
        if need > _MEMORY_SHARE * have:
            gib = 1 << 30
            raise UsageError(
                f"{self._where()}: one local batch of {self.local_batch_size} samples is "
                f"{need / nslots / gib:.3g} GiB ({self.layout.sample_bytes()} bytes a sample) and the loader "
                f"keeps {nslots} in shared memory ({need / gib:.3g} GiB), more than half of the "
                f"{have / gib:.3g} GiB available ({where}); lower global_batch_size (or raise the world size), "
                f"num_workers or prefetch_depth"
            )

    def _where(self) -> str:
        files = self.layout.files
        return files[0].path + (f" (+{len(files) - 1} files)" if len(files) > 1 else "")

    @property
    def num_batches(self) -> int:
        """Batches per epoch, identical on every rank."""
        c = self.config
        return batches_per_epoch(self.layout.num_samples, c.global_batch_size, self.partitions, c.tail)

    def __len__(self) -> int:
        return self.num_batches

    @property
    def local_batch_size(self) -> int:
        return self.config.global_batch_size // self.world_size

    def interval_metrics(self) -> tp.Dict[str, tp.Any]:
        """This rank's input since the previous call (:meth:`LoaderMetrics.interval`; ``readers`` = the worker
        processes, 1 inline): the Trainer puts it in each metrics interval record as ``input``."""
        return self.metrics.interval(readers=max(1, self.config.num_workers))

    def plan(self, epoch: tp.Optional[int] = None) -> EpochPlan:
        c = self.config
        order = EpochOrder(
            self.layout.block_starts, c.seed, self.epoch if epoch is None else epoch, c.window_chunks, c.shuffle
        )
        return EpochPlan(order, c.global_batch_size, self.partitions, c.tail)

    def _task_batches(self) -> int:
        c, lay = self.config, self.layout
        block_rows = lay.num_samples / max(1, len(lay.block_starts) - 1)
        per_part = c.global_batch_size // self.partitions
        k = math.ceil(_TASK_WINDOWS * c.window_chunks * block_rows / per_part) if c.shuffle else 4
        # bound the shared-memory slots: (tasks in flight + the one being consumed) x k batches
        batch_bytes = self.local_batch_size * max(1, self.layout.sample_bytes())
        cap = (_SLOT_BUDGET // batch_bytes - 1) // (self._tasks_in_flight() + 1)
        return int(max(1, min(k, cap, self.num_batches)))

    def _tasks_in_flight(self) -> int:
        c = self.config
        return c.num_workers * c.prefetch_depth if c.num_workers else 0

    # ---- resume --------------------------------------------------------------------------------
    def state_dict(self) -> tp.Dict[str, tp.Any]:
        """Global position (identical on every rank): store it once, hand it to every rank on resume."""
        c = self.config
        return {
            "format": STATE_FORMAT,
            "epoch": self.epoch,
            "samples_consumed": self.samples_consumed,
            "seed": c.seed,
            "global_batch_size": c.global_batch_size,
            "partitions": self.partitions,
            "shuffle": c.shuffle,
            "window_chunks": c.window_chunks,
            "tail": c.tail,
            "num_samples": self.layout.num_samples,
            "fingerprint": self.layout.fingerprint,
        }

    def load_state_dict(self, state: tp.Mapping[str, tp.Any]) -> None:
        """Continue exactly after the last consumed batch, on any world size and worker count.

        An empty mapping is a fresh start. A state from another dataset or order config is refused."""
        if not state:
            return
        if state.get("format") != STATE_FORMAT:
            raise UsageError(f"data resume state has format {state.get('format')!r}, expected {STATE_FORMAT!r}")
        c = self.config
        mine = {
            "seed": c.seed,
            "global_batch_size": c.global_batch_size,
            "shuffle": c.shuffle,
            "window_chunks": c.window_chunks,
            "tail": c.tail,
            "num_samples": self.layout.num_samples,
            "fingerprint": self.layout.fingerprint,
        }
        if c.partitions is not None:
            mine["partitions"] = c.partitions
        for name, value in mine.items():
            if state.get(name) != value:
                what = "the dataset files changed" if name in ("num_samples", "fingerprint") else "the config changed"
                raise UsageError(
                    f"data resume state does not match this loader: {name} is {state.get(name)!r} in "
                    f"the checkpoint but {value!r} now ({what}; files {self._where()}); restore the "
                    f"original setting or start the data order afresh"
                )
        consumed = int(state["samples_consumed"])
        if consumed % c.global_batch_size:
            raise UsageError(f"data resume state: samples_consumed={consumed} is not a multiple of the global batch")
        self._stop_iteration()
        self._reset_pipe()
        self.partitions = int(state["partitions"])
        self._check_topology()
        self.epoch, self.samples_consumed = int(state["epoch"]), consumed
        if consumed >= self.num_batches * c.global_batch_size:
            self.epoch, self.samples_consumed = self.epoch + 1, 0

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch to iterate. Same epoch as now: keep the position (so it is safe after a resume)."""
        if epoch != self.epoch:
            self._stop_iteration()
            self._reset_pipe()
            self.epoch, self.samples_consumed = int(epoch), 0

    # ---- workers -------------------------------------------------------------------------------
    def _ensure_pool(self, k: int) -> None:
        c = self.config
        nslots = self._slots_needed(k)
        if self._pool is not None and self._arena is not None and self._arena.nslots >= nslots:
            return
        self._shutdown_pool()
        spec = batch_spec(self.layout, self.local_batch_size, c.tail == "exact")
        if c.num_workers == 0:
            self._arena = SlotArena(spec, nslots)
            self._pool = InlineReader(self.layout, c.rdcc_nbytes, self._arena)
        else:
            self._arena = SlotArena(spec, nslots, shared=True)
            self._pool = WorkerPool(
                self.layout, c.rdcc_nbytes, self._arena, c.num_workers, c.start_method, c.worker_timeout_s
            )

    def _shutdown_pool(self) -> None:
        self._pipe, self._held = None, None
        self._pending.clear()
        if self._pool is not None:
            self._pool.close()
            self._pool = None
        if self._arena is not None:
            self._arena.close()
            self._arena = None

    def worker_pids(self) -> tp.List[int]:
        return self._pool.alive_pids() if self._pool is not None else []

    def _stop_iteration(self) -> None:
        """Abandon a live iterator mid-epoch: its prefetched batches are discarded."""
        if self._active:
            self._active += 1
            self._reset_pipe()

    def _reset_pipe(self) -> None:
        """Wait for in-flight tasks (a few batches each), forget them, free every slot."""
        pending, self._pending = self._pending, set()
        self._pipe, self._held = None, None
        if self._pool is not None:
            try:
                for tid in sorted(pending):
                    self._pool.wait(tid)
            except HpctrainError:
                self._shutdown_pool()  # a broken pool restarts lazily

    # ---- iteration -----------------------------------------------------------------------------
    def __iter__(self) -> tp.Iterator[tp.Dict[str, torch.Tensor]]:
        if self._closed:
            raise HpctrainError("H5Loader is closed")
        self._stop_iteration()
        if self.samples_consumed >= self.num_batches * self.config.global_batch_size:
            self.epoch, self.samples_consumed = self.epoch + 1, 0  # the last batch was taken, not the end
        self._active += 1
        return self._run(self._active)

    def _run(self, gen: int) -> tp.Iterator[tp.Dict[str, torch.Tensor]]:
        c, epoch = self.config, self.epoch
        first = self.samples_consumed // c.global_batch_size
        k = self._task_batches()
        self._ensure_pool(k)
        pool, arena = self._pool, self._arena
        assert pool is not None and arena is not None
        if self._pipe is None or not self._pipe.at(epoch, first):
            self._reset_pipe()
            self._pipe = _Pipe(arena.nslots, epoch, first, self.plan(epoch))
        pipe = self._pipe
        with_valid = c.tail == "exact"
        data_keys = self.layout.keys
        self.metrics.start()

        def submit_more() -> None:
            while len(pipe.free) >= k and len(pipe.tasks) <= self._tasks_in_flight():
                if pipe.next_batch >= pipe.plan.num_batches:  # read ahead into the next epoch
                    pipe.epoch, pipe.next_batch = pipe.epoch + 1, 0
                    pipe.plan = self.plan(pipe.epoch)
                size = max(1, k >> max(0, 2 - pipe.task_id))  # ramp k/4, k/2, k: the first batch comes soon
                # ended where a shuffle window ends: the next task shares at most half a batch of its rows
                batches = np.arange(
                    pipe.next_batch, pipe.plan.task_end(pipe.next_batch, size, self.rank, self.world_size)
                )
                ids, valid = pipe.plan.slots(batches, self.rank, self.world_size)
                slots = [pipe.free.pop() for _ in batches]
                self._pending.add(pipe.task_id)
                pool.submit(pipe.task_id, [(s, ids[i], valid[i] if with_valid else None) for i, s in enumerate(slots)])
                pipe.tasks.append((pipe.task_id, slots, pipe.epoch, int(batches[0])))
                pipe.next_batch += len(batches)
                pipe.task_id += 1

        submit_more()
        nb = self.num_batches
        while pipe.tasks and pipe.tasks[0][2] == epoch and gen == self._active:
            tid, slots, _, b0 = pipe.tasks[0]
            for i, slot in enumerate(slots):
                if self._held is not None:
                    pipe.free.append(self._held)
                    self._held = None
                t0 = time.perf_counter()
                depth = sum(len(t[1]) for t in pipe.tasks[1:] if pool.ready(t[0]))
                depth += len(slots) - i if i > 0 or pool.ready(tid) else 0
                if i == 0:
                    nbytes, secs = pool.wait(tid)
                    self._pending.discard(tid)
                    self.metrics.add_read(nbytes, secs)
                batch = self._deliver(arena.views(slot), slot)
                wait = time.perf_counter() - t0
                views = arena.views(slot)
                self.metrics.record(
                    StepMetrics(
                        b0 + i, wait, max(depth, 0), len(views["index"]), sum(views[key].nbytes for key in data_keys)
                    )
                )
                self.samples_consumed = (b0 + i + 1) * c.global_batch_size
                if i == len(slots) - 1:
                    pipe.tasks.pop(0)  # every batch of the head task handed out (the last one is held)
                submit_more()
                yield batch
                if gen != self._active:
                    return
        if gen != self._active:
            return
        if self.samples_consumed < nb * c.global_batch_size:
            raise HpctrainError(
                f"internal error: data pipeline stalled at batch {self.samples_consumed // c.global_batch_size} of {nb}"
            )
        self.epoch, self.samples_consumed = self.epoch + 1, 0
        self._active = 0

    def _deliver(self, views: tp.Dict[str, np.ndarray], slot: int) -> tp.Dict[str, torch.Tensor]:
        dev = self.device
        if dev is None or dev.type == "cpu":
            self._held = slot
            return {k: torch.from_numpy(v) for k, v in views.items()}
        # pinned staging ring → non-blocking copy on a side stream, so the H2D of batch i+1 overlaps the
        # compute of step i; the consumer's stream waits for the copy, not the host
        if self.config.pin_memory and dev.type == "cuda":
            if self._ring is None:
                self._ring = PinnedRing(dev)
            out = self._ring.deliver(views, self.stream)
        else:
            out = {key: torch.from_numpy(v).to(dev) for key, v in views.items()}
        self._held = slot
        return out

    # ---- lifetime ------------------------------------------------------------------------------
    @property
    def pinned_bytes(self) -> int:
        """Pinned host memory held for GPU copies (0 on CPU, before the first batch and after close)."""
        return self._ring.pinned_bytes if self._ring is not None else 0

    def close(self) -> None:
        """Stop the workers (about a second at most), free shared memory, and release the pinned
        buffers and the copy stream (after their copies finished). Idempotent."""
        self._active += 1
        self._closed = True
        self._shutdown_pool()
        ring, self._ring = self._ring, None
        if ring is not None:
            ring.close()

    def __enter__(self) -> "H5Loader":
        return self

    def __exit__(self, *exc: tp.Any) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self._shutdown_pool()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass
