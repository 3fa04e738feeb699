"""``python -m hpctrain reproduce BUNDLE --data PATH... [--run-dir NEW] [submit flags] [--from-checkpoint]
[--steps K] [--json]``: rebuild a bundled run and submit it again, then compare its loss with the recorded one.

On the login node, without torch, in this order (nothing is written before the checks pass):

1. **verify** the bundle (:func:`hpctrain.bundle.verify.verify_bundle`; a tar is unpacked once, member by
   member, beside the new run directory): a failed check is exit 1 naming it, a path that is not a bundle exit 2;
2. **data**: map the run's recorded input files (the identity record's ``data`` section) to the ``--data``
   paths, by file name, else by order, and check each against its fingerprint: the cheap tier, then the sampled
   content tier (:mod:`hpctrain.bundle.inputs`); a mismatch is exit 1 naming the file and what differs;
3. **environment**: the recorded Python, hpctrain, torch and distributions against this one
   (:mod:`hpctrain.bundle.envdiff`), a table; the CPU threads each rank ran with are pinned for the job
   (``OMP_NUM_THREADS``: another count splits a GEMM's sums otherwise, and the last bits differ);
4. **code**: rebuild every repository of the code snapshot into ``NEW/code/<repository>/``
   (:func:`hpctrain.identity.code.restore_snapshot`: the archived commit, re-created as a git commit, with the
   run's uncommitted changes and untracked files laid over it), checked against the recorded hashes; the job
   runs the entry from that tree, ahead of anything installed (``SubmitConfig.code_path``: the Runner puts it
   first on ``sys.path``), in the tree's equivalent of the directory it was submitted from;
5. **submit** the recorded settings (``submission.json``'s config, written as ``NEW/code/submit.toml``), with
   the entry arguments that named the old input files (or paths inside the old run directory) rewritten, through
   the normal path (:func:`hpctrain.submit.cli.main`): flags given here override, ``--cluster``, ``--follow``
   and the rest work as in ``hpctrain.submit``;
6. ``--from-checkpoint``: the bundled checkpoint is hard-linked (or copied) into the new run's checkpoint
   directory and verified, so the Trainer resumes from it; ``--steps K`` replays K steps from it (entries that
   take ``--steps`` as the **total** step count get the bundled step + K);
7. **compare** the loss of every recorded interval the reproduction covers with its own (:mod:`hpctrain.bundle.replay`)
   once the job has ended (a local job, or Slurm with ``--follow``); exit 1 when one differs. Later:
   ``python -m hpctrain reproduce compare NEW``.

The pieces taken from the bundle (verify, code, checkpoint, threads) are :mod:`hpctrain.bundle.rebuild`'s.
Nothing of the bundle is imported or executed here, except the entry, which ``hpctrain.submit`` imports in a
child interpreter as for any submission, and which the job runs. What reproduce did is in
``NEW/code/reproduce.json`` (:data:`RECORD`).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import sys
import tempfile
import time
import typing as tp
from pathlib import Path

from hpctrain._cli import EXIT_FAILED, EXIT_OK, add_json_flag, command_parser
from hpctrain.bundle import inputs, rebuild
from hpctrain.errors import HpctrainError, UsageError
from hpctrain.rundir import JSONL_LIMIT, RunDir, read_json, read_jsonl

__all__ = ["main", "RECORD", "SUBMIT_TOML", "RECORD_SCHEMA", "compare_run"]

RECORD = "reproduce.json"
"""The reproduction's record, in :attr:`hpctrain.rundir.RunDir.reproduced_code`."""
SUBMIT_TOML = "submit.toml"
"""The recorded settings as given to ``hpctrain.submit --config`` (flags given to reproduce override them)."""
RECORD_SCHEMA = "hpctrain.reproduce/1"
_NOT_PASSED = {"entry", "resume", "config", "run_dir", "require_clean"}  # submit flags reproduce owns or refuses
_RUN_KEYS = ("owner", "team", "notes", "require_clean")

_DESCRIPTION = """\
Rebuild a bundled run and submit it again: verify the bundle, check the data you give against the recorded
fingerprints, show how this environment differs from the recorded one, rebuild the code (the commit, the
uncommitted changes, the untracked files) into NEW/code/ and run the entry from it, submit the recorded
settings, and compare the loss of every recorded interval with the reproduction's.

  python -m hpctrain reproduce BUNDLE --data PATH... [--run-dir NEW] [submit flags] [--json]
  python -m hpctrain reproduce BUNDLE --data PATH... --from-checkpoint      # resume from the bundled checkpoint
  python -m hpctrain reproduce BUNDLE --data PATH... --steps K              # replay K steps from it and compare
  python -m hpctrain reproduce compare NEW [--json]                         # compare a reproduction that ended

--steps K gives the entry `--steps <bundled step + K>`: entries that take --steps as the total step count (the
demo, the Trainer's TrainConfig.steps). On CPU the loss is expected to match bit for bit (--tolerance 0).
Exit 0 ok, 1 a failed check, job or comparison, 2 bad input. (A bundle literally named "compare": ./compare)"""


# ---------------------------------------------------------------------------------------------- settings
def _parser() -> argparse.ArgumentParser:
    from hpctrain.submit.cli import build_parser

    p = command_parser("reproduce", _DESCRIPTION)
    p.add_argument("bundle", metavar="BUNDLE", help="a bundle directory or its tar (python -m hpctrain bundle)")
    p.add_argument("--data", nargs="+", default=[], metavar="PATH", help="your copies of the run's input files")
    p.add_argument("--run-dir", metavar="NEW", help="the new run directory (default runs/<job-name>-reproduce-<time>)")
    p.add_argument(
        "--from-checkpoint", action="store_true", help="resume from the bundled checkpoint instead of from scratch"
    )
    p.add_argument(
        "--steps",
        type=int,
        metavar="K",
        help="replay K steps from the bundled checkpoint and compare them (implies --from-checkpoint)",
    )
    p.add_argument(
        "--tolerance",
        type=float,
        default=0.0,
        metavar="REL",
        help="relative loss difference accepted (default 0: bit-exact, what CPU runs give)",
    )
    add_json_flag(p)
    group = p.add_argument_group("submit flags (as python -m hpctrain.submit; they override the recorded settings)")
    for action in build_parser()._actions:
        if action.dest in _NOT_PASSED or action.dest == "help":
            continue
        group._add_action(action)
    return p


def _submit_flags(ns: argparse.Namespace) -> tp.Tuple[tp.List[str], tp.Dict[str, tp.Any]]:
    """The submit flags given (argv for hpctrain.submit, and ``{field: value}``)."""
    from hpctrain.submit.cli import build_parser

    argv: tp.List[str] = []
    values: tp.Dict[str, tp.Any] = {}
    for action in build_parser()._actions:
        if action.dest in _NOT_PASSED or action.dest == "help" or not hasattr(ns, action.dest):
            continue
        value = getattr(ns, action.dest)
        values[action.dest] = value
        if isinstance(action, argparse._StoreTrueAction):
            argv.append(action.option_strings[-1])
        else:
            argv += [action.option_strings[-1], str(value)]
    return argv, values


def _toml_value(value: tp.Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False).replace("\x7f", "\\u007f")
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    raise UsageError(f"the recorded setting {value!r} cannot be written as TOML")


def _toml(config: tp.Mapping[str, tp.Any], entry: str, args: tp.Sequence[str], notes: str, code_path: str) -> str:
    from hpctrain.submit.config import SubmitConfig

    fields = {f for f in SubmitConfig.__dataclass_fields__}
    job = {
        k: v
        for k, v in config.items()
        if k in fields and k not in ("entry", "entry_args", "run_dir", "code_path", *_RUN_KEYS) and v is not None
    }
    job["code_path"] = code_path
    lines = ["# written by python -m hpctrain reproduce: the recorded settings (flags given to it override them)"]
    lines += ["[job]"] + [f"{k} = {_toml_value(v)}" for k, v in sorted(job.items())]
    lines += ["", "[train]", f"entry = {_toml_value(entry)}", f"args = {_toml_value(list(args))}"]
    lines += ["", "[run]", f"notes = {_toml_value(notes)}", ""]
    return "\n".join(lines)


def _new_run_dir(opts: argparse.Namespace, job_name: str) -> Path:
    from hpctrain.submit import backend
    from hpctrain.submit.config import SubmitConfig

    if opts.run_dir:
        path = Path(opts.run_dir).expanduser().absolute()
    else:
        path = backend.default_run_dir(SubmitConfig(job_name=f"{job_name}-reproduce")).absolute()
    if path.exists() and (not path.is_dir() or any(path.iterdir())):
        raise UsageError(f"--run-dir {path} exists and is not empty; a reproduction goes into a new directory")
    return path


@contextlib.contextmanager
def _entry_visible(
    code_path: str, cwd: tp.Optional[str], env: tp.Optional[tp.Mapping[str, str]] = None
) -> tp.Iterator[None]:
    """While hpctrain.submit checks the entry (statically on sys.path, then by importing it in a child) and
    starts the job (which inherits this environment: a local job's processes, and sbatch's default export): the
    rebuilt tree first on this process's path and the child's ``PYTHONPATH``, the working directory the run was
    submitted from (translated into the tree), and ``env`` (``OMP_NUM_THREADS``)."""
    old_path, old_cwd = list(sys.path), os.getcwd()
    extra = dict(env or {})
    previous = {k: os.environ.get(k) for k in ["PYTHONPATH", *extra]}
    sys.path.insert(0, code_path)
    os.environ["PYTHONPATH"] = code_path + (os.pathsep + previous["PYTHONPATH"] if previous["PYTHONPATH"] else "")
    os.environ.update(extra)
    if cwd:
        os.chdir(cwd)
    try:
        yield
    finally:
        os.chdir(old_cwd)
        sys.path[:] = old_path
        for key, value in previous.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


# ---------------------------------------------------------------------------------------------- compare
def compare_run(run_dir: tp.Union[str, Path], expected: tp.Sequence[tp.Mapping[str, tp.Any]], tolerance: float):
    """The reproduction's metrics against the ``expected`` recorded intervals (:func:`replay.compare`)."""
    from hpctrain.bundle import replay

    records, _ = read_jsonl(RunDir(run_dir).metrics, limit=JSONL_LIMIT)
    return replay.compare(expected, replay.intervals(records), tolerance=tolerance)


def _compare_main(argv: tp.Sequence[str]) -> int:
    from rich.console import Console

    from hpctrain.bundle import replay

    p = command_parser("reproduce compare", "Compare a reproduction's loss with the bundled run's, once it ended.")
    p.add_argument("run_dir", metavar="NEW", help="the run directory python -m hpctrain reproduce made")
    p.add_argument("--tolerance", type=float, metavar="REL", help="override the recorded tolerance")
    add_json_flag(p)
    opts = p.parse_args(list(argv))
    paths = RunDir(opts.run_dir)
    problems: tp.List[str] = []
    record = read_json(paths.reproduced_code / RECORD, problems)
    if record is None or record.get("schema") != RECORD_SCHEMA:
        why = problems[0] if problems else f"no {RECORD}"
        raise UsageError(f"{opts.run_dir}: not a reproduction ({why} in {paths.reproduced_code})")
    tolerance = float(record.get("tolerance") or 0.0) if opts.tolerance is None else opts.tolerance
    result = compare_run(paths.root, record.get("expected") or [], tolerance)
    if opts.json:
        print(json.dumps(result, indent=2, sort_keys=True))
    else:
        replay.render_comparison(result, Console(highlight=False, soft_wrap=True), title=_title(record))
    return EXIT_OK if result["ok"] else EXIT_FAILED


def _title(record: tp.Mapping[str, tp.Any]) -> str:
    mode = record.get("mode") or {}
    return f"loss per interval: recorded (bundle) vs {mode.get('what', 'reproduction')}"


# ---------------------------------------------------------------------------------------------- main
def main(argv: tp.Optional[tp.Sequence[str]] = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] == "compare":
        return _compare_main(args[1:])
    opts = _parser().parse_args(args)
    return Reproduction(opts).run()


class Reproduction:
    """One ``reproduce`` call: the checks, the rebuild, the submission, the comparison."""

    def __init__(self, opts: argparse.Namespace) -> None:
        from rich.console import Console

        self.opts = opts
        self.console = Console(file=sys.stderr if opts.json else sys.stdout, highlight=False, soft_wrap=True)
        self.report: tp.Dict[str, tp.Any] = {"notes": []}
        self.job_env: tp.Dict[str, str] = {}
        """Variables the job's environment gets (``OMP_NUM_THREADS``: the original's threads per rank)."""
        if opts.steps is not None and opts.steps < 1:
            raise UsageError(f"--steps {opts.steps}: replay at least one step")
        if not 0 <= opts.tolerance < 1:
            raise UsageError(f"--tolerance {opts.tolerance}: a relative difference in [0, 1)")
        self.submit_argv, self.submit_values = _submit_flags(opts)
        self.dry_run = bool(self.submit_values.get("dry_run"))

    def _stdout(self) -> tp.Any:
        """With --json, what hpctrain.submit writes to stdout (a dry run's sbatch script) goes to stderr: stdout
        holds the report alone."""
        return contextlib.redirect_stdout(sys.stderr) if self.opts.json else contextlib.nullcontext()

    def say(self, text: str) -> None:
        self.console.print(text)

    def note(self, text: str) -> None:
        from rich.markup import escape

        self.report["notes"].append(text)
        self.console.print(f"  [yellow]note[/]: {escape(text)}")

    def run(self) -> int:
        opts = self.opts
        bundle = Path(opts.bundle).expanduser().absolute()
        data = inputs.absolute(opts.data)
        # a tar is unpacked beside the new run, where its checkpoint can be hard-linked from
        parent = Path(opts.run_dir).expanduser().absolute().parent if opts.run_dir else Path.cwd() / "runs"
        opened = rebuild.open_bundle(bundle, parent)
        try:
            return self._run(opened, data)
        finally:
            opened.close()

    # --------------------------------------------------------------------------------- the checks (no writes)
    def _run(self, opened: rebuild.Opened, data: tp.List[str]) -> int:
        from rich.markup import escape

        from hpctrain.bundle import envdiff, replay
        from hpctrain.submit.config import SubmitConfig

        opts, lay, rec = self.opts, opened.layout, opened.record
        ck = rec.get("checkpoint") if isinstance(rec.get("checkpoint"), dict) else {}
        self.report.update(bundle=str(opened.shown), run_identity=rec.get("run_identity"), checkpoint=ck)
        self.say(
            f"bundle     {escape(str(opened.shown))}: [green]verified[/] ({opened.report['checks'][0]['detail']}); "
            f"run {escape(str(rec.get('run_name')))}, identity {escape(str(rec.get('run_identity'))[:12])}, "
            f"checkpoint step {escape(str(ck.get('step')))}"
        )
        for w in opened.warnings:
            self.note(w)
        submission = rebuild.need(opened, lay.submission, "what was submitted")
        config = submission.get("config") if isinstance(submission.get("config"), dict) else None
        if not config or not config.get("entry"):
            raise HpctrainError(f"{lay.rel(lay.submission)}: no submitted config with an entry; cannot resubmit")
        ident = rebuild.identity_source(opened)
        cfg_values = {k: v for k, v in config.items() if k in SubmitConfig.__dataclass_fields__}
        new_run = _new_run_dir(opts, str(self.submit_values.get("job_name") or cfg_values.get("job_name") or "run"))
        paths = RunDir(new_run)
        self._settings(opened, cfg_values, [str(a) for a in config.get("entry_args") or []], new_run)  # bad flags

        # --- data: which given file is which recorded one, and is it the same data
        recorded = inputs.recorded_files(ident.get("data") if isinstance(ident.get("data"), dict) else None)
        pairs, how = inputs.map_files(recorded, data)
        checked = inputs.check_files(pairs)
        self.report["data"] = {"matched": how, "files": checked}
        if checked:
            self._data_table(checked, how)
        else:
            self.say("data       the run recorded no input data files")

        # --- what to run: mode, entry arguments
        step = ck.get("step") if isinstance(ck.get("step"), int) else None
        from_ckpt = opts.from_checkpoint or opts.steps is not None
        if from_ckpt and step is None:
            raise HpctrainError(f"BUNDLE {opened.shown} records no checkpoint step: cannot resume from it")
        metrics, _ = read_jsonl(lay.metrics, limit=JSONL_LIMIT)
        recorded_intervals = replay.intervals(metrics)
        after = step if from_ckpt else 0
        until = step + opts.steps if opts.steps is not None and step is not None else None
        expected = replay.expected_intervals(recorded_intervals, after or 0, until)
        last = max(recorded_intervals) if recorded_intervals else None
        if from_ckpt and not expected:
            raise UsageError(
                f"the bundled checkpoint is step {step} and the recorded metrics have no interval after it "
                f"(the last is step {last}): nothing to replay or compare; bundle an earlier checkpoint "
                "(python -m hpctrain bundle RUN --step N -o OUT)"
            )
        if until is not None and last is not None and until > last:
            self.note(
                f"the recorded run ends at step {last}: the replay's steps after it have no recorded loss to compare"
            )
        old_run = submission.get("run_dir") if isinstance(submission.get("run_dir"), str) else None
        args, rewrites = inputs.rewrite_args(
            [str(a) for a in config.get("entry_args") or []],
            {str((f.get("cheap") or {}).get("path")): p for f, p in pairs},
            cwd=submission.get("cwd") if isinstance(submission.get("cwd"), str) else None,
            old_run=old_run,
            new_run=str(new_run),
        )
        named = {r["to"].split("=", 1)[-1] for r in rewrites if r["why"] == "input file"}
        for _, path in pairs:
            if path not in named:
                self.note(
                    f"no recorded entry argument names the input file replaced by {path}: the entry may read a "
                    "fixed path"
                )
        ckpt_dir, args, moved = self._checkpoint_dir(opened, old_run, paths, args, submission.get("cwd"))
        rewrites += moved
        if opts.steps is not None:
            args, before = inputs.with_total_steps(args, int(step) + opts.steps)
            rewrites.append(
                {
                    "from": f"{inputs.STEPS_FLAG} {before}" if before is not None else "(no --steps)",
                    "to": f"{inputs.STEPS_FLAG} {step + opts.steps}",
                    "why": f"replay {opts.steps} step(s) from the bundled step {step}; --steps is the total",
                }
            )
        mode = {
            "what": f"replay of {opts.steps} step(s) from step {step}"
            if opts.steps is not None
            else (f"resumed from step {step}" if from_ckpt else "reproduction from scratch"),
            "from_checkpoint": from_ckpt,
            "start_step": after,
            "steps": opts.steps,
        }
        self.report.update(mode=mode, run_dir=str(new_run))
        self.report["args"] = {"recorded": config.get("entry_args") or [], "submitted": args, "rewrites": rewrites}
        for r in rewrites:
            if r["from"] == r["to"] and r["why"] == "input file":
                continue
            self.say(f"argument   {escape(r['from'])} -> [bold]{escape(r['to'])}[/] ({escape(r['why'])})")

        # --- the settings as they will be submitted (checked before anything is written)
        final = self._settings(opened, cfg_values, args, new_run)
        recorded_world = submission.get("world_size")
        ck_world = ck.get("world_size")
        for label, n in (
            ("the recorded run", recorded_world),
            ("the bundled checkpoint", ck_world if from_ckpt else None),
        ):
            if isinstance(n, int) and n != final.world_size:
                self.note(
                    f"world size {final.world_size} differs from {label}'s {n}: the loss is not expected to match "
                    "bit for bit"
                )

        # --- environment
        env = envdiff.environment_diff(
            ident.get("runtime") if isinstance(ident.get("runtime"), dict) else None,
            (read_json(lay.identity_submit, []) or {}).get("code"),
        )
        self.report["environment"] = env
        threads, how_known = rebuild.recorded_threads(ident)
        here = os.environ.get("OMP_NUM_THREADS", "").strip()
        if threads is None:
            row = {"what": "CPU threads per rank", "recorded": None, "current": here or "hpctrain's choice"}
            row["status"] = "unknown"
        elif here:
            row = {"what": "CPU threads per rank", "recorded": threads, "current": f"OMP_NUM_THREADS={here}"}
            row["status"] = "same" if here == str(threads) else "different"
        else:
            self.job_env["OMP_NUM_THREADS"] = str(threads)
            row = {"what": "CPU threads per rank", "recorded": threads, "current": f"{threads} (OMP_NUM_THREADS)"}
            row["status"] = "same"
        row["how"] = how_known
        env["rows"].append(row)
        self.report["threads"] = {"recorded": threads, "how": how_known, "job_env": self.job_env}
        if not opts.json:
            envdiff.render_environment(env, self.console)
        if threads is None:
            self.note(
                "the original's CPU threads per rank are not recorded: a different count can change the float sums "
                "(set OMP_NUM_THREADS to pin one)"
            )
        elif "OMP_NUM_THREADS" in self.job_env:
            self.say(
                f"threads    {threads} per rank, as the original ran ({escape(how_known)}): the job gets "
                f"OMP_NUM_THREADS={threads}"
            )
        elif here != str(threads):
            self.note(
                f"OMP_NUM_THREADS={here} here, the original ran {threads} thread(s) per rank ({how_known}): "
                "the loss may differ in the last bits"
            )

        if self.dry_run:
            return self._dry_run(opened, args, config, rec)

        # --- writes: the run directory, the code, the checkpoint, the record; then the submission
        created = not new_run.exists()
        new_run.mkdir(parents=True, exist_ok=True)
        submitted = False
        try:
            code = rebuild.restore_code(opened, paths.reproduced_code)
            self._say_code(code)
            if from_ckpt:
                placed = rebuild.place_checkpoint(opened, ckpt_dir)
                self.report["checkpoint_placed"] = placed
                self.say(
                    f"checkpoint step {placed['step']} ({placed['how']}, verified) -> {escape(placed['path'])}: "
                    "the Trainer resumes from it"
                )
            notes = (
                f"reproduction of run {rec.get('run_name')} (identity {str(rec.get('run_identity'))[:12]}) from "
                f"bundle {opened.shown}: {mode['what']}"
            )
            toml_path = paths.reproduced_code / SUBMIT_TOML
            toml_path.write_text(_toml(config, str(config["entry"]), args, notes, code["code_path"]))
            record = self._record(opened, code, expected, mode, toml_path)
            self._write_record(paths, record)
            argv = ["--config", str(toml_path), "--run-dir", str(new_run), *self.submit_argv]
            self.say(f"submit     python -m hpctrain.submit {escape(' '.join(argv))}")
            from hpctrain.submit.cli import main as submit_main

            with _entry_visible(code["code_path"], code["cwd"], self.job_env), self._stdout():
                submitted = True
                rc = submit_main(argv, console=self.console)
        except BaseException:
            if not submitted and not paths.submission.exists():  # nothing ran: leave nothing behind
                if created:
                    shutil.rmtree(new_run, ignore_errors=True)
                else:
                    shutil.rmtree(paths.reproduced_code, ignore_errors=True)
                    placed = self.report.get("checkpoint_placed")
                    if placed:
                        shutil.rmtree(placed["path"], ignore_errors=True)
            raise
        sub = read_json(paths.submission, []) or {}
        record["submission"] = {"exit_code": rc, "job_id": sub.get("job_id"), "cluster": sub.get("cluster")}
        self.report["submission"] = record["submission"]
        waited = sub.get("cluster") == "local" or bool(self.submit_values.get("follow"))
        result: tp.Optional[tp.Dict[str, tp.Any]] = None
        if rc != 0:
            self.say(f"[red]the reproduction's job did not complete (exit {rc})[/]: nothing compared")
        elif not expected:
            self.note("the bundle holds no interval records: no loss to compare")
        elif not waited:
            self.say(
                f"compare    once job {escape(str(sub.get('job_id')))} has ended: "
                f"python -m hpctrain reproduce compare {escape(str(new_run))}"
            )
        else:
            result = compare_run(new_run, expected, opts.tolerance)
            record["comparison"] = result
            if not opts.json:
                replay.render_comparison(result, self.console, title=_title(record))
        self.report["comparison"] = result
        record["identity"] = self.report["identity"] = self._identity_vs(ident, paths)
        self._write_record(paths, record)
        if opts.json:
            print(json.dumps(self.report, indent=2, sort_keys=True, default=str))
        if rc != 0:
            return rc
        return EXIT_FAILED if result is not None and not result["ok"] else EXIT_OK

    # --------------------------------------------------------------------------------- pieces
    def _settings(
        self, opened: rebuild.Opened, recorded: tp.Mapping[str, tp.Any], args: tp.Sequence[str], run: Path
    ) -> tp.Any:
        """The SubmitConfig the submission will resolve to (recorded settings < the flags given here): a bad flag
        is its one UsageError line, before anything is read or written."""
        from hpctrain.submit.config import SubmitConfig

        fields = SubmitConfig.__dataclass_fields__
        merged = {**recorded, **{k: v for k, v in self.submit_values.items() if k in fields}}
        merged.update(entry_args=list(args), run_dir=str(run), code_path=str(run), require_clean=False)
        try:
            return SubmitConfig(**merged)
        except TypeError as exc:
            raise HpctrainError(
                f"{opened.layout.rel(opened.layout.submission)}: the recorded config does not fit this hpctrain ({exc})"
            ) from None

    def _identity_vs(self, original: tp.Mapping[str, tp.Any], paths: RunDir) -> tp.Optional[tp.Dict[str, tp.Any]]:
        """The reproduction's newest attempt identity against the original's, section by section."""
        from rich.markup import escape

        from hpctrain.identity import attempt_history
        from hpctrain.identity.manifest import SECTIONS

        history = attempt_history(paths.root)
        if not history:
            return None
        job, _, restart = str(history[-1]["attempt"]).rpartition("-r")
        mine = read_json(paths.identity_attempt(job if job != "local" else "", int(restart or 0)), []) or {}
        a = original.get("identity_sections") if isinstance(original.get("identity_sections"), dict) else {}
        b = mine.get("identity_sections") if isinstance(mine.get("identity_sections"), dict) else {}
        same = [s for s in SECTIONS if a.get(s) is not None and a.get(s) == b.get(s)]
        differ = [s for s in SECTIONS if a.get(s) != b.get(s)]
        out = {
            "original": original.get("identity"),
            "reproduction": mine.get("identity"),
            "same": same,
            "differ": differ,
        }
        self.say(
            f"identity   this run {escape(str(out['reproduction'])[:12])}, the original "
            f"{escape(str(out['original'])[:12])}: "
            + (f"the same {', '.join(same)}" if same else "no section the same")
            + (f"; {', '.join(differ)} differ" if differ else " (identical)")
            + (" (code: the re-created commit stands in for the original one)" if "code" in differ else "")
        )
        return out

    def _data_table(self, checked: tp.Sequence[tp.Mapping[str, tp.Any]], how: str) -> None:
        from rich.markup import escape
        from rich.table import Table

        if self.opts.json:
            return
        table = Table(title=f"data: your files against the recorded fingerprints (matched {how})")
        for col in ("recorded file", "read by the run as", "yours", "size", "cheap tier", "content tier"):
            table.add_column(col, overflow="fold")
        for c in checked:
            table.add_row(
                escape(str(c["name"])),
                escape(str(c["recorded_path"])),
                escape(str(c["path"])),
                str(c["size"]),
                f"[green]{c['cheap']}[/]",
                f"[green]{escape(c['content'])}[/]" if c["content"].startswith("same") else escape(c["content"]),
            )
        self.console.print(table)

    def _checkpoint_dir(
        self, opened: rebuild.Opened, old_run: tp.Optional[str], paths: RunDir, args: tp.List[str], cwd: tp.Any
    ) -> tp.Tuple[Path, tp.List[str], tp.List[tp.Dict[str, str]]]:
        """Where the new run's Trainer keeps its checkpoints: the recorded directory (the ledger's) moved into the
        new run when it lay inside the old one; one outside it (``CheckpointPolicy.dir``) is replaced by the new
        run's default where an entry argument names it, and refused otherwise (the reproduction would share the
        original's checkpoints). ``(directory, arguments, rewrites)``."""
        ledger, _ = read_jsonl(opened.layout.ledger, limit=JSONL_LIMIT)
        dirs = [r.get("checkpoint_dir") for r in ledger if r.get("event") == "start"]
        recorded = next((d for d in reversed(dirs) if isinstance(d, str) and d), None)
        if recorded is None or old_run is None:
            return paths.checkpoints, args, []
        rel = os.path.relpath(os.path.normpath(recorded), os.path.normpath(old_run))
        if not rel.startswith(".."):
            return paths.root / rel, args, []
        args, done = inputs.rewrite_args(
            args,
            {recorded: str(paths.checkpoints)},
            cwd=cwd if isinstance(cwd, str) else None,
            old_run=None,
            new_run=str(paths.root),
            why="the run's checkpoint directory, outside its run directory: the new run's own",
        )
        if not done:
            raise UsageError(
                f"the run checkpointed to {recorded}, outside its run directory {old_run}, and no entry argument "
                "names it: the reproduction would read and write the original's checkpoints; not reproduced"
            )
        return paths.checkpoints, args, done

    def _say_code(self, code: tp.Mapping[str, tp.Any]) -> None:
        from rich.markup import escape

        self.report["code"] = code
        for name, r in code["repositories"].items():
            if r.get("kind") == "git":
                diff = (
                    "; git diff HEAD hashes as recorded"
                    if r.get("diff_matches")
                    else ("" if r.get("diff_matches") is None else "; git diff HEAD differs (see note)")
                )
                what = (
                    f"git {str(r.get('commit'))[:12]}: {r['checked']} changed/untracked file(s) match the recorded "
                    f"sha256{diff}"
                    + (f"; re-created as commit {str(r['rebuilt_commit'])[:12]}" if r.get("rebuilt_commit") else "")
                )
            else:
                what = f"package files: {r['checked']} file(s), sha256 {str(r.get('files_sha256'))[:12]} as recorded"
            self.say(f"code       {escape(name)}: {escape(what)} -> {escape(str(r.get('tree')))}")
        self.say(f"code       the entry {escape(str(code['entry']))} runs from {escape(code['code_path'])}")
        for n in code["notes"]:
            self.note(n)

    def _record(
        self,
        opened: rebuild.Opened,
        code: tp.Mapping[str, tp.Any],
        expected: tp.Sequence[tp.Mapping[str, tp.Any]],
        mode: tp.Mapping[str, tp.Any],
        toml_path: Path,
    ) -> tp.Dict[str, tp.Any]:
        import socket

        from hpctrain import __version__

        rec = opened.record
        return {
            "schema": RECORD_SCHEMA,
            "time": time.time(),
            "hpctrain_version": __version__,
            "host": socket.gethostname(),
            "bundle": str(opened.shown),
            "bundle_format": opened.report.get("format"),
            "source_run": rec.get("source_run"),
            "run_name": rec.get("run_name"),
            "run_identity": rec.get("run_identity"),
            "checkpoint": rec.get("checkpoint"),
            "mode": dict(mode),
            "data": self.report.get("data"),
            "args": self.report.get("args"),
            "code": {k: v for k, v in code.items()},
            "checkpoint_placed": self.report.get("checkpoint_placed"),
            "environment": {
                "rows": self.report["environment"]["rows"],
                "counts": self.report["environment"]["counts"],
                "differing": [d for d in self.report["environment"]["distributions"] if d["status"] != "same"],
            },
            "threads": self.report.get("threads"),
            "submit_toml": str(toml_path),
            "submit_flags": self.submit_argv,
            "expected": list(expected),
            "tolerance": self.opts.tolerance,
            "notes": self.report["notes"],
            "comparison": None,
        }

    def _write_record(self, paths: RunDir, record: tp.Mapping[str, tp.Any]) -> None:
        from hpctrain._atomic import atomic_write_json

        atomic_write_json(paths.reproduced_code / RECORD, record)

    def _dry_run(
        self, opened: rebuild.Opened, args: tp.Sequence[str], config: tp.Mapping[str, tp.Any], rec: tp.Any
    ) -> int:
        """--dry-run: the code rebuilt in a scratch directory (the entry must be found), then hpctrain.submit's
        own dry run (the sbatch script); nothing is written under the new run directory."""
        from hpctrain.submit.cli import main as submit_main

        scratch = Path(tempfile.mkdtemp(prefix=".hpctrain-reproduce-dry-"))
        try:
            code = rebuild.restore_code(opened, scratch / "code")
            self._say_code(code)
            toml_path = scratch / SUBMIT_TOML
            toml_path.write_text(_toml(config, str(config["entry"]), args, "dry run", code["code_path"]))
            argv = ["--config", str(toml_path), "--run-dir", self.report["run_dir"], *self.submit_argv]
            with _entry_visible(code["code_path"], code["cwd"], self.job_env), self._stdout():
                rc = submit_main(argv, console=self.console)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        if self.opts.json:
            print(json.dumps(self.report, indent=2, sort_keys=True, default=str))
        return rc
