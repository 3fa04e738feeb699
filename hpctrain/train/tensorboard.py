"""TensorBoard scalars from metrics records: the one mapping both the live writer and ``export-tensorboard`` use.

:func:`scalars` turns one record of ``RUN_DIR/train/metrics.jsonl`` (an ``interval`` or an ``eval`` record,
:mod:`hpctrain.train.metrics`) into ``(tag, value, step)`` triples; :data:`INTERVAL_TAGS` and :data:`EVAL_TAGS`
name every tag with its description. :func:`open_writer` is the writer both use: the ``tensorboard``
package's own ``tensorboard.summary.Writer`` (numpy and protobuf, no torch, no TensorFlow) over its
``EventFileWriter``, so a live run and an export of the same run hold the same summaries (tensor-form
scalars of the scalars plugin, the first value of each tag carrying its description).

:class:`LiveWriter` is what ``TrainConfig.tensorboard`` turns on (rank 0 only; docs/report.md, "TensorBoard,
live"): every attempt opens a new event file in the same directory and starts it with a
``SessionLog.START`` event at ``purge_step`` = the resumed step + 1. TensorBoard's readers drop the
earlier events at steps >= that step (the steps the attempt redoes after its checkpoint), so a requeued
run stays one TensorBoard run with each step once. The START is written on a fresh start too (step 1,
nothing to drop): TensorBoard's UI reader (``plugin_event_accumulator``) takes the first START of a run as
the session's beginning and purges only on later ones; a first attempt without it would make the second
attempt's START the "first" one and leave its redone steps doubled there.

This module imports neither torch nor a login-side command (the node side writes with it, the report side
exports with it); ``tensorboard`` itself is imported only when a writer is opened.
"""

from __future__ import annotations

import math
import os
import time
import typing as tp

__all__ = [
    "INTERVAL_TAGS",
    "EVAL_TAGS",
    "DESCRIPTIONS",
    "scalars",
    "open_writer",
    "LiveWriter",
    "missing_package",
]

Getter = tp.Callable[[tp.Mapping[str, tp.Any]], tp.Optional[float]]

_PARTS = (
    ("step_s", "step"),
    ("data_wait_s", "data_wait"),
    ("forward_backward_s", "forward_backward"),
    ("grad_comm_exposed_s", "grad_comm_exposed"),
    ("optimizer_s", "optimizer"),
    ("checkpoint_s", "checkpoint"),
)


def _number(value: tp.Any) -> tp.Optional[float]:
    """A finite int or float (not a bool), else None: what the report's sanitising keeps of a number."""
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None


def _median_ms(part: str) -> Getter:
    def get(rec: tp.Mapping[str, tp.Any]) -> tp.Optional[float]:
        per_step = rec.get("per_step")
        stats = per_step.get(part) if isinstance(per_step, dict) else None
        value = _number(stats.get("median")) if isinstance(stats, dict) else None
        return 1e3 * value if value is not None else None

    return get


def _field(name: str) -> Getter:
    def get(rec: tp.Mapping[str, tp.Any]) -> tp.Optional[float]:
        return _number(rec.get(name))

    return get


INTERVAL_TAGS: tp.Tuple[tp.Tuple[str, Getter, str], ...] = (
    ("train/loss", _field("loss"), "mean training loss of the log interval over its steps and all ranks"),
    ("train/lr", _field("lr"), "learning rate of the first parameter group"),
    ("throughput/samples_per_s", _field("samples_per_s"), "samples of all ranks / the slowest rank's interval time"),
    ("throughput/mfu", _field("mfu"), "model FLOPs utilisation: achieved FLOP/s per device / the device's peak"),
    ("throughput/flops_per_s", _field("flops_per_s"), "achieved FLOP/s of all ranks"),
    ("throughput/data_wait_frac", _field("data_wait_frac"), "data wait / step time, summed over ranks"),
    *(
        (f"step_time_ms/{name}", _median_ms(part), f"median over ranks of each rank's mean {name} time per step, ms")
        for part, name in _PARTS
    ),
)
"""``(tag, value of an interval record or None, description)`` of every scalar an interval gives."""

EVAL_TAGS: tp.Tuple[tp.Tuple[str, Getter, str], ...] = (
    ("eval/loss", _field("loss"), "mean evaluation loss over ranks (an interrupted evaluation: fewer batches)"),
)
"""The same for an eval record."""

DESCRIPTIONS: tp.Dict[str, str] = {tag: text for tag, _, text in INTERVAL_TAGS + EVAL_TAGS}
"""Each tag's description (written with its first value in an event file)."""

_BY_KIND = {"interval": INTERVAL_TAGS, "eval": EVAL_TAGS}


def scalars(record: tp.Mapping[str, tp.Any]) -> tp.List[tp.Tuple[str, float, int]]:
    """``(tag, value, step)`` of every scalar ``record`` gives: an ``interval`` or ``eval`` metrics record (as
    written, or as the report reads it back); a value that is missing, not a number or not finite gives
    nothing, nor does a record of another kind or without an integer step."""
    tags = _BY_KIND.get(tp.cast(str, record.get("kind")))
    step = record.get("step")
    if tags is None or not isinstance(step, int) or isinstance(step, bool) or step < 0:
        return []
    out = []
    for tag, get, _ in tags:
        value = get(record)
        if value is not None:
            out.append((tag, value, step))
    return out


def missing_package() -> tp.Optional[str]:
    """None when the ``tensorboard`` package is installed, else why not (one line, with the install hint).
    Looked up, not imported (a config check on every rank must stay cheap)."""
    import importlib.util

    if importlib.util.find_spec("tensorboard") is None:
        return "the tensorboard package is not installed; pip install 'hpctrain[tensorboard]'"
    return None


def _output(logdir: str) -> tp.Any:
    """A ``tensorboard.summary.Output`` on a new event file (``EventFileWriter``): what the package's own
    ``DirectoryOutput`` writes for a scalar, plus ``start`` (a ``SessionLog.START`` event), which it has
    no public call for."""
    from tensorboard.compat.proto import event_pb2, summary_pb2
    from tensorboard.summary import Output
    from tensorboard.summary.writer.event_file_writer import EventFileWriter
    from tensorboard.util import tensor_util

    class _Events(Output):  # type: ignore[misc]
        def __init__(self, path: str) -> None:
            self._events = EventFileWriter(path)

        def start(self, step: int) -> None:
            status = event_pb2.SessionLog(status=event_pb2.SessionLog.START)
            self._events.add_event(event_pb2.Event(wall_time=time.time(), step=step, session_log=status))

        def emit_scalar(self, *, plugin_name, tag, data, step, wall_time, tag_metadata=None, description=None):  # type: ignore[no-untyped-def]
            metadata = summary_pb2.SummaryMetadata(
                plugin_data=summary_pb2.SummaryMetadata.PluginData(plugin_name=plugin_name, content=tag_metadata),
                summary_description=description,
                data_class=summary_pb2.DataClass.DATA_CLASS_SCALAR,
            )
            event = event_pb2.Event(wall_time=wall_time, step=step)
            event.summary.value.add(tag=tag, tensor=tensor_util.make_tensor_proto(data), metadata=metadata)
            self._events.add_event(event)

        def flush(self) -> None:
            self._events.flush()

        def close(self) -> None:
            self._events.close()

    return _Events(logdir)


def open_writer(logdir: tp.Union[str, "os.PathLike[str]"], *, purge_step: tp.Optional[int] = None) -> tp.Any:
    """A ``tensorboard.summary.Writer`` on a new event file in ``logdir`` (created). With ``purge_step`` the
    file starts with a ``SessionLog.START`` event at that step: readers drop the events of earlier files (and
    earlier in this one) at steps >= ``purge_step``. Raises ImportError without the tensorboard package."""
    from tensorboard.summary import Writer

    output = _output(os.fspath(logdir))
    if purge_step is not None:
        output.start(int(purge_step))
        output.flush()
    return Writer(output)


class LiveWriter:
    """Rank 0's TensorBoard events while training: :meth:`write` each metrics record as it is appended to
    the JSONL (the same :func:`scalars`, the record's step as x and its time as the wall time), flushed to the
    file at once (a log interval, an eval, before the stop's save), :meth:`close` at the end of ``fit``."""

    def __init__(self, logdir: tp.Union[str, "os.PathLike[str]"], *, start_step: int) -> None:
        self.logdir = os.fspath(logdir)
        self.purge_step = int(start_step) + 1
        self._writer = open_writer(self.logdir, purge_step=self.purge_step)
        self._described: tp.Set[str] = set()
        self.scalars = 0
        self.write_s = 0.0
        """Seconds spent in :meth:`write` and :meth:`flush` (the measured overhead)."""

    def write(self, record: tp.Mapping[str, tp.Any], *, flush: bool = True) -> None:
        if self._writer is None:
            return
        t0 = time.perf_counter()
        wall = _number(record.get("time"))
        for tag, value, step in scalars(record):
            self._writer.add_scalar(
                tag,
                value,
                step,
                wall_time=wall,
                description=None if tag in self._described else DESCRIPTIONS[tag],
            )
            self._described.add(tag)
            self.scalars += 1
        if flush:
            self._writer.flush()
        self.write_s += time.perf_counter() - t0

    def flush(self) -> None:
        if self._writer is not None:
            t0 = time.perf_counter()
            self._writer.flush()
            self.write_s += time.perf_counter() - t0

    def close(self) -> None:
        if self._writer is not None:
            writer, self._writer = self._writer, None
            writer.close()
