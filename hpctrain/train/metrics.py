"""Always-on measurement of every rank: a step timer, exposed-communication timing, interval aggregation.

Drop-in for a loop you already have::

    rec = MetricsRecorder(rank=ctx.rank, world_size=ctx.world_size, device=ctx.device,
                          run_dir=ctx.run_dir, total_steps=steps, log_every=10)
    rec.attach_ddp(ddp_model)            # optional: exposed gradient communication (before the first forward)
    for step in range(start + 1, steps + 1):
        rec.timer.start()
        batch = next(it);                 rec.timer.mark("data_wait")
        loss = fwd_bwd(batch);            rec.timer.mark("forward_backward")
        opt.step();                       rec.timer.mark("optimizer")
        rec.step_done(loss, samples=len(batch))
        if rec.due(step):
            report = rec.flush(step)      # one collective; rank 0 appends RUN_DIR/train/metrics.jsonl

How each figure is measured (docs/train.md has the schema):

* a phase is the time between two marks; ``start()`` opens the step, so whatever happens between steps
  (evaluation, logging) is not charged to any step. On a CUDA device the marks are CUDA events on the
  current stream, resolved at the log interval: ``data_wait`` is then the time the *GPU* sat between the
  end of the previous step's work and the batch being ready, not the host's time in ``next()`` while
  the GPU still worked through queued kernels.
* exposed gradient communication: DDP launches a bucket's all-reduce when its last gradient is ready,
  so the launch of the last bucket marks the end of backward compute; what remains of the
  ``forward_backward`` phase after it is communication that did not overlap compute. A gradient hook
  on the parameter whose gradient is ready last (:meth:`MetricsRecorder.attach_ddp`) stamps that moment.
* exposed communication under FSDP2 (:func:`hpctrain.train.parallel.attach_fsdp_timing`): the spans the
  training stream spends inside FSDP's all-gather (``unshard``/``wait_for_unshard``) and reduce-scatter
  (``post_backward``/``finalize_backward``) calls, CUDA events on the compute stream on GPU (the time it was
  blocked), host time on CPU; carved out of the phase they fell in.
* memory (:mod:`hpctrain.train.memory`): device peaks reset per interval, RSS, the state bytes this rank holds.
* aggregation: at each log interval every rank contributes one small float64 vector to a single
  ``all_gather``; every rank computes the same min/median/max and the slowest rank from it.
"""

from __future__ import annotations

import statistics
import time
import typing as tp
from pathlib import Path

import torch
import torch.distributed as dist

from hpctrain.rundir import METRICS_SCHEMA, RunDir, dumps_record
from hpctrain.train.memory import FIELDS as MEMORY_FIELDS
from hpctrain.train.memory import MemoryProbe

__all__ = ["PHASES", "StepTimer", "MetricsRecorder", "IntervalReport", "count_flops", "peak_flops"]

PHASES = ("data_wait", "forward_backward", "grad_comm_exposed", "optimizer", "checkpoint")
"""The parts of a step, in order. ``grad_comm_exposed`` is carved out of ``forward_backward`` (see above)."""

_P = {name: i for i, name in enumerate(PHASES)}
# the per-rank vector gathered at each interval: [steps, step_s, *PHASES, samples, wall_s, loss_sum, flops,
# *memory FIELDS, stop, save]
_MEM = 6 + len(PHASES)
_N = 2 + len(PHASES) + 6 + len(MEMORY_FIELDS)

# Dense bf16 peak FLOP/s per GPU for MFU (vendor data sheets; SXM parts). Matched against the device name.
_PEAKS = (("H200", 989e12), ("H100", 989e12), ("A100", 312e12), ("L40S", 362e12), ("MI300X", 1307e12))


def peak_flops(device: tp.Any) -> tp.Optional[float]:
    """The dense bf16 peak of ``device`` when it is a known GPU, else None (CPUs: no MFU)."""
    device = torch.device(device)
    if device.type != "cuda" or not torch.cuda.is_available():
        return None
    name = torch.cuda.get_device_name(device)
    return next((peak for key, peak in _PEAKS if key in name), None)


class StepTimer:
    """Time the phases of each step on this rank; sums per phase until :meth:`take` empties them."""

    def __init__(self, device: tp.Any = "cpu", enabled: bool = True) -> None:
        self.enabled = enabled
        self.cuda = enabled and torch.device(device).type == "cuda"
        self.sums = [0.0] * len(PHASES)
        self.step_s = 0.0
        self.steps = 0
        self._t0 = 0.0
        self._last = 0.0
        self._launch: tp.Any = None  # time (or event) the last gradient bucket's all-reduce was launched
        self._comm = 0.0  # CPU: seconds inside FSDP's communication calls since the last mark
        self._comm_ev: tp.List[tp.Tuple[tp.Any, tp.Any]] = []  # CUDA: their (begin, end) events
        self._pending: tp.List[tp.List[tp.Tuple[int, tp.Any]]] = []  # CUDA: events of steps not yet resolved
        self._marks: tp.List[tp.Tuple[int, tp.Any]] = []
        self._data_waits: tp.List[float] = []  # each step's data wait, until take_data_waits
        self._wait_at_start = 0.0
        self.on_mark: tp.Optional[tp.Callable[[str], None]] = None
        """Called with each mark's phase (and ``grad_comm`` at the last bucket's launch): the hang watchdog's
        progress (:func:`hpctrain.runtime.watchdog.follow_timer`). Called even when timing is off."""

    def _now(self) -> tp.Any:
        if self.cuda:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            return ev
        return time.perf_counter()

    def start(self) -> None:
        """Open a step (time since the previous step's end is not counted)."""
        if not self.enabled:
            return
        self._launch = None
        self._comm, self._comm_ev = 0.0, []
        if self.cuda:
            self._marks = [(-1, self._now())]
        else:
            self._t0 = self._last = time.perf_counter()
            self._wait_at_start = self.sums[_P["data_wait"]]

    def mark(self, phase: str) -> None:
        """Charge the time since the previous mark (or ``start``) to ``phase`` (one of :data:`PHASES`)."""
        if self.on_mark is not None:
            self.on_mark(phase)
        if not self.enabled:
            return
        i = _P[phase]
        if self.cuda:
            self._marks.append((i, self._now()))
            if self._launch is not None:
                self._marks.append((-2, self._launch))  # resolved as the exposed-communication split
                self._launch = None
            elif self._comm_ev:
                self._marks.append((-3, self._comm_ev))  # FSDP spans, summed when resolved
                self._comm_ev = []
            return
        now = time.perf_counter()
        if self._comm:
            exposed = min(self._comm, now - self._last)
            self.sums[_P["grad_comm_exposed"]] += exposed
            self.sums[i] += now - self._last - exposed
            self._comm = 0.0
            self._last = now
            return
        if self._launch is not None:
            exposed = max(0.0, now - self._launch)
            self.sums[_P["grad_comm_exposed"]] += exposed
            self.sums[i] += now - self._last - exposed
            self._launch = None
        else:
            self.sums[i] += now - self._last
        self._last = now

    def comm_launched(self) -> None:
        """Called by the DDP comm hook when a bucket's all-reduce is launched."""
        if self.on_mark is not None:
            self.on_mark("grad_comm")
        if self.enabled:
            self._launch = self._now()

    def comm_begin(self) -> tp.Any:
        """Open a span the training stream spends in (FSDP) communication; pass the result to ``comm_end``."""
        return self._now() if self.enabled else None

    def comm_end(self, token: tp.Any) -> None:
        if token is None:
            return
        if self.cuda:
            self._comm_ev.append((token, self._now()))
        else:
            self._comm += time.perf_counter() - token

    def end(self) -> None:
        """Close the step."""
        if not self.enabled:
            return
        self.steps += 1
        if self.cuda:
            self._pending.append(self._marks)
            self._marks = []
        else:
            self.step_s += time.perf_counter() - self._t0
            self._data_waits.append(self.sums[_P["data_wait"]] - self._wait_at_start)

    def _resolve(self) -> None:
        """CUDA: wait for the last recorded event, then turn event pairs into seconds."""
        if not self._pending:
            return
        self._pending[-1][-1][1].synchronize()
        for marks in self._pending:
            first = prev = marks[0][1]
            wait = 0.0
            k = 1
            while k < len(marks):
                i, ev = marks[k]
                seg = prev.elapsed_time(ev) / 1e3
                if k + 1 < len(marks) and marks[k + 1][0] in (-2, -3):
                    nxt = marks[k + 1][1]
                    if marks[k + 1][0] == -2:
                        exposed = max(0.0, nxt.elapsed_time(ev) / 1e3)
                    else:
                        exposed = min(seg, sum(max(0.0, a.elapsed_time(b)) for a, b in nxt) / 1e3)
                    self.sums[_P["grad_comm_exposed"]] += exposed
                    seg -= exposed
                    k += 1
                self.sums[i] += seg
                if i == _P["data_wait"]:
                    wait += seg
                prev = ev
                k += 1
            self.step_s += first.elapsed_time(prev) / 1e3
            self._data_waits.append(wait)
        self._pending.clear()

    def take(self) -> tp.Tuple[int, float, tp.List[float]]:
        """(steps, summed step seconds, summed seconds per phase) since the last call; resets them."""
        if self.cuda:
            self._resolve()
        out = (self.steps, self.step_s, list(self.sums))
        self.steps, self.step_s, self.sums = 0, 0.0, [0.0] * len(PHASES)
        return out

    def take_data_waits(self) -> tp.List[float]:
        """Each step's data wait (seconds) since the last call, in order; resets them (call after :meth:`take`,
        which resolves a CUDA timer's events)."""
        out, self._data_waits = self._data_waits, []
        return out


def count_flops(fn: tp.Callable[[], tp.Any]) -> float:
    """FLOPs of ``fn()`` (run it under ``torch.utils.flop_counter.FlopCounterMode``), e.g. one forward+backward."""
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False)
    # eager for this one call: under a dispatch mode Dynamo cannot trace a compiled block and marks its code
    # "skip" for good, so TrainConfig.parallel.compile would silently never compile (the step after still does)
    with torch.compiler.set_stance("force_eager"), counter:
        fn()
    return float(counter.get_total_flops())


class IntervalReport(tp.NamedTuple):
    record: tp.Dict[str, tp.Any]
    """The interval's JSONL record (identical on every rank; only rank 0 writes it)."""
    stop: bool
    """Some rank asked to stop (``flush(stop=True)``): every rank sees it at the same step."""
    save: bool
    """Rank 0 asked for a checkpoint (``flush(save=True)``), e.g. its clock says the save interval passed."""


def _spread(values: tp.Sequence[float]) -> tp.Dict[str, tp.Any]:
    """min / median / max over ranks and the rank holding the max."""
    worst = max(range(len(values)), key=values.__getitem__)
    return {
        "min": min(values),
        "median": statistics.median(values),
        "max": values[worst],
        "max_rank": worst,
    }


def _plain(value: tp.Any) -> tp.Any:
    """A tensor or numpy scalar given in ``flush(extra=...)`` (an optimizer may hold its learning rate as a
    tensor: ``Adam(p, lr=torch.tensor(0.01))``) as a Python number or list: the record is not only written
    (``dumps_record`` converts too) but shown and handed back (``IntervalReport.record``, ``last``)."""
    if isinstance(value, torch.Tensor):
        return value.item() if value.numel() == 1 else value.tolist()
    if getattr(value, "ndim", None) == 0 and callable(getattr(value, "item", None)):  # a numpy scalar
        return value.item()
    return value


class MetricsRecorder:
    """Per-step timing (:attr:`timer`), the loss, and one aggregated JSONL record per interval.

    Every rank calls every method; :meth:`flush` is a collective (a no-op gather at world size 1).
    """

    def __init__(
        self,
        *,
        rank: int,
        world_size: int,
        device: tp.Any,
        run_dir: tp.Optional[tp.Union[str, Path]],
        total_steps: int,
        log_every: int = 10,
        enabled: bool = True,
        flops_per_sample: tp.Optional[float] = None,
        peak_flops_per_device: tp.Optional[float] = None,
        static: tp.Optional[tp.Mapping[str, tp.Any]] = None,
        tensorboard: tp.Optional[tp.Any] = None,
    ) -> None:
        self.rank, self.world_size = rank, world_size
        self.device = torch.device(device)
        self.total_steps = total_steps
        self.log_every = log_every
        self.timer = StepTimer(self.device, enabled=enabled)
        self.flops_per_sample = flops_per_sample
        self.peak = peak_flops_per_device if peak_flops_per_device is not None else peak_flops(self.device)
        self.static = dict(static or {})
        self.path = RunDir(run_dir).metrics if run_dir is not None and rank == 0 else None
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file: tp.Optional[tp.IO[str]] = None
        self._loss_sum: tp.Any = None
        self._loss_steps = 0
        self._samples = 0
        self._interval_start = time.perf_counter()
        self.last_step = 0
        self.last: tp.Optional[tp.Dict[str, tp.Any]] = None
        self._hooks: tp.List[tp.Any] = []  # the gradient hooks of attach_ddp
        self._after_step: tp.Optional[tp.Callable[[], None]] = None
        self.memory = MemoryProbe(self.device)
        self.comm_measure: tp.Optional[str] = None
        """How ``grad_comm_exposed`` was measured: 'ddp_last_bucket', 'fsdp_waits' or None (not at all)."""
        self._undo_fsdp: tp.Optional[tp.Callable[[], None]] = None
        self.tensorboard = tensorboard if self.path is not None else None
        """Rank 0's :class:`hpctrain.train.tensorboard.LiveWriter`: each record written is written there too."""

    # ---- per step -----------------------------------------------------------------------------
    def attach_ddp(self, ddp_model: tp.Any) -> None:
        """Time exposed gradient communication of ``ddp_model`` (call before its first backward).

        DDP launches the last gradient bucket's all-reduce the moment the last gradient of the backward is
        accumulated, so a timestamp there marks the end of backward compute. The first backward finds
        which parameter that is (a post-accumulate-grad hook on every parameter records the order; DDP
        then sorts its buckets by the same order); from the second on only that one parameter keeps a
        hook: one Python call per backward. (A Python DDP comm hook around the default all-reduce cost
        72 us per step, 8 % of the demo's step at world 1; the single hook about 10 us, autograd calling
        back into Python.)

        An FSDP2 module is timed by :func:`hpctrain.train.parallel.attach_fsdp_timing` instead."""
        if not self.timer.enabled:
            return
        from hpctrain.train.parallel import attach_fsdp_timing, is_fsdp

        if is_fsdp(ddp_model):
            self._undo_fsdp = attach_fsdp_timing(ddp_model, self.timer)
            self.comm_measure = "fsdp_waits"
            return
        if not hasattr(ddp_model, "register_comm_hook"):
            return
        module = getattr(ddp_model, "module", ddp_model)
        params = [p for p in module.parameters() if p.requires_grad]
        if not params or not hasattr(params[0], "register_post_accumulate_grad_hook"):
            return
        timer = self.timer
        order: tp.List[int] = []

        def first_backward(i: int) -> tp.Callable[[tp.Any], None]:
            def hook(_param: tp.Any) -> None:
                order.append(i)
                timer.comm_launched()

            return hook

        def launched(_param: tp.Any) -> None:
            timer.comm_launched()

        handles = [p.register_post_accumulate_grad_hook(first_backward(i)) for i, p in enumerate(params)]
        self.comm_measure = "ddp_last_bucket"

        def settle() -> None:  # after the first step: keep one hook, on the parameter that was ready last
            for h in handles:
                h.remove()
            self._hooks = [params[order[-1]].register_post_accumulate_grad_hook(launched)] if order else []
            self._after_step = None

        self._hooks = handles
        self._after_step = settle

    def step_done(self, loss: tp.Any, *, samples: int) -> None:
        """End the step: close the timer and add this rank's loss (a tensor: no device sync) and samples."""
        self.timer.end()
        if self._after_step is not None:
            self._after_step()
        detached = loss.detach() if isinstance(loss, torch.Tensor) else torch.tensor(float(loss))
        self._loss_sum = detached.float() if self._loss_sum is None else self._loss_sum + detached.float()
        self._loss_steps += 1
        self._samples += samples

    def start_interval(self, step: int) -> None:
        """Begin measuring from here (after a restore, or to drop start-up from the first interval)."""
        self.last_step = step
        self._interval_start = time.perf_counter()
        self.timer.take()
        self.timer.take_data_waits()

    def due(self, step: int) -> bool:
        return step % self.log_every == 0 or step >= self.total_steps

    # ---- interval -----------------------------------------------------------------------------
    def flush(
        self, step: int, *, stop: bool = False, save: bool = False, extra: tp.Optional[tp.Mapping[str, tp.Any]] = None
    ) -> IntervalReport:
        """Gather every rank's interval (one collective), build the record, write it (rank 0), reset."""
        wall = time.perf_counter() - self._interval_start
        steps, step_s, sums = self.timer.take()
        waits = self.timer.take_data_waits()
        loss_sum = float(self._loss_sum.item()) if self._loss_sum is not None else 0.0
        flops = (self.flops_per_sample or 0.0) * self._samples
        mem = self.memory.read()
        mine = [float(steps), step_s, *sums, float(self._samples), wall, loss_sum, flops, *mem]
        mine += [float(stop), float(save)]
        rows = self._gather(mine)
        record = self._record(step, rows, self._loss_steps, extra)
        if self.timer.enabled:
            record["data_wait_step_max_s"] = self._step_max_wait(waits)
        self._loss_sum, self._loss_steps, self._samples = None, 0, 0
        self._interval_start = time.perf_counter()
        self.last_step, self.last = step, record
        if self.path is not None:
            self._write(record)
        return IntervalReport(record, stop=any(r[_N - 2] for r in rows), save=bool(rows[0][_N - 1]))

    def _gather(self, mine: tp.List[float]) -> tp.List[tp.List[float]]:
        if self.world_size == 1 or not (dist.is_available() and dist.is_initialized()):
            return [mine]
        # NCCL only moves device tensors; gloo wants CPU ones
        dev = self.device if dist.get_backend() == "nccl" else torch.device("cpu")
        n = len(mine)
        t = torch.tensor(mine, dtype=torch.float64, device=dev)
        out = torch.empty(self.world_size * n, dtype=torch.float64, device=dev)
        from hpctrain.runtime.process_group import all_gather_into_tensor

        all_gather_into_tensor()(out, t)
        flat = out.tolist()
        return [flat[r * n : (r + 1) * n] for r in range(self.world_size)]

    def _step_max_wait(self, waits: tp.Sequence[float]) -> tp.Optional[float]:
        """The data wait of the interval's steps as the step saw it: per step the maximum over ranks (a synchronous
        step waits for the last rank's batch; that rank is not the same in every step), then the mean over steps.
        One more all-gather per interval, of ``log_every + 1`` floats per rank (every rank pads to that length)."""
        width = max(1, self.log_every)
        mine = list(waits[-width:])
        rows = self._gather([float(len(mine)), *mine, *([0.0] * (width - len(mine)))])
        steps = int(min(r[0] for r in rows))
        if steps <= 0:
            return None
        return sum(max(r[1 + k] for r in rows) for k in range(steps)) / steps

    def _record(
        self, step: int, rows: tp.List[tp.List[float]], loss_steps: int, extra: tp.Optional[tp.Mapping[str, tp.Any]]
    ) -> tp.Dict[str, tp.Any]:
        n_ranks = len(rows)
        samples = [r[2 + len(PHASES)] for r in rows]
        walls = [max(r[3 + len(PHASES)], 1e-12) for r in rows]
        wall = max(walls)  # ranks step together: the interval took as long as its slowest rank
        losses = [r[4 + len(PHASES)] for r in rows]
        flops = sum(r[5 + len(PHASES)] for r in rows)
        rec: tp.Dict[str, tp.Any] = {
            "schema": METRICS_SCHEMA,
            "kind": "interval",
            "time": time.time(),
            "step": step,
            "steps": step - self.last_step,
            "total_steps": self.total_steps,
            "world_size": n_ranks,
            "loss": sum(losses) / (n_ranks * max(loss_steps, 1)),
            "samples": int(sum(samples)),
            "interval_s": wall,
            "samples_per_s": sum(samples) / wall,
            "samples_per_s_per_rank": _spread([s / w for s, w in zip(samples, walls)]),
            "eta_s": wall / max(step - self.last_step, 1) * max(self.total_steps - step, 0),
            "flops_per_s": flops / wall if self.flops_per_sample else None,
            "mfu": None,
            "measured": self.timer.enabled,
            **self.static,
        }
        if self.flops_per_sample and self.peak:
            rec["mfu"] = flops / wall / n_ranks / self.peak
        if self.timer.enabled:
            per_step = {"step_s": [r[1] / max(r[0], 1) for r in rows]}
            for k, name in enumerate(PHASES):
                per_step[f"{name}_s"] = [r[2 + k] / max(r[0], 1) for r in rows]
            # a rank's own work per step (the step less waiting for the others): what shows a straggler
            per_step["busy_s"] = [s - c for s, c in zip(per_step["step_s"], per_step["grad_comm_exposed_s"])]
            rec["per_step"] = {name: _spread(vals) for name, vals in per_step.items()}
            slowest = rec["per_step"]["step_s"]["max_rank"]
            rec["slowest_rank"] = slowest
            rec["data_wait_frac"] = sum(r[2 + _P["data_wait"]] for r in rows) / max(sum(r[1] for r in rows), 1e-12)
        rec["memory"] = {
            name: (_spread([r[_MEM + k] for r in rows]) if all(r[_MEM + k] >= 0 for r in rows) else None)
            for k, name in enumerate(MEMORY_FIELDS)
        }
        rec["comm_measure"] = self.comm_measure
        if extra:
            rec.update({key: _plain(value) for key, value in extra.items()})
        return rec

    def write(self, record: tp.Mapping[str, tp.Any]) -> None:
        """Append a record of your own (e.g. an evaluation) to the JSONL (rank 0; others: no-op)."""
        if self.path is not None:
            self._write({"schema": METRICS_SCHEMA, "time": time.time(), **record})

    def _write(self, record: tp.Mapping[str, tp.Any]) -> None:
        assert self.path is not None
        if self._file is None:
            self._file = open(self.path, "a", encoding="utf-8")
        # one write per line and a flush: a reader sees whole lines (or, after a crash, one torn last line)
        self._file.write(dumps_record(record) + "\n")
        self._file.flush()
        if self.tensorboard is not None:
            self.tensorboard.write(record)  # the same record's scalars, flushed

    def close(self) -> None:
        if self._undo_fsdp is not None:
            self._undo_fsdp()
            self._undo_fsdp = None
        for h in self._hooks:
            h.remove()
        self._hooks = []
        if self._file is not None:
            self._file.close()
            self._file = None
        if self.tensorboard is not None:
            self.tensorboard.close()
            self.tensorboard = None
