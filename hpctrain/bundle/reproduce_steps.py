"""One ``python -m hpctrain reproduce BUNDLE ...`` call, in order (:class:`Reproduction`): the checks that
write nothing (the bundle verified, the data against its fingerprints, the entry arguments rewritten, the settings
resolved, the environment against the recorded one), then the writes (the rebuilt code, the placed checkpoint, the
record), the submission through ``hpctrain.submit``, and the loss comparison once the job has ended.

The command line is :mod:`hpctrain.bundle.reproduce_cli`'s; the settings handed to ``hpctrain.submit`` are
:mod:`hpctrain.bundle.submit_settings`'s; the record and the comparison :mod:`hpctrain.bundle.loss_compare`'s.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import sys
import tempfile
import time
import typing as tp
from pathlib import Path

from hpctrain._cli import EXIT_FAILED, EXIT_OK, print_json
from hpctrain.bundle import inputs, unpack
from hpctrain.bundle.loss_compare import RECORD, RECORD_SCHEMA, _title, compare_run
from hpctrain.bundle.submit_settings import (
    SUBMIT_TOML,
    _entry_visible,
    _new_run_dir,
    _submit_flags,
    _toml,
    refuse_nested,
)
from hpctrain.errors import HpctrainError, UsageError
from hpctrain.run import recorded_checkpoint_dir
from hpctrain.rundir import JSONL_LIMIT, RunDir, parse_label, read_json, read_jsonl

RUN_SCHEMA = "hpctrain.reproduce.run/1"
"""The shape of ``reproduce run --json``'s object."""

__all__ = ["Reproduction"]


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
        if opts.run_dir:  # before anything is read or unpacked: never a run inside the bundle
            refuse_nested(Path(opts.run_dir).expanduser().absolute(), bundle)
        # a tar is unpacked beside the new run, where its checkpoint can be hard-linked from
        parent = Path(opts.run_dir).expanduser().absolute().parent if opts.run_dir else Path.cwd() / "runs"
        opened = unpack.open_bundle(bundle, parent, checkpoint=opts.from_checkpoint or opts.steps is not None)
        try:
            return self._run(opened, data)
        finally:
            opened.close()

    # --------------------------------------------------------------------------------- the checks (no writes)
    def _run(self, opened: unpack.Opened, data: tp.List[str]) -> int:
        from rich.markup import escape

        from hpctrain.bundle import envdiff, loss_intervals
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
        submission = unpack.need(opened, lay.submission, "what was submitted")
        config = submission.get("config") if isinstance(submission.get("config"), dict) else None
        if not config or not config.get("entry"):
            raise HpctrainError(f"{lay.rel(lay.submission)}: no submitted config with an entry; cannot resubmit")
        ident = unpack.identity_source(opened)
        cfg_values = {k: v for k, v in config.items() if k in SubmitConfig.__dataclass_fields__}
        job_name = str(self.submit_values.get("job_name") or cfg_values.get("job_name") or "run")
        new_run = _new_run_dir(opts, job_name, Path(self.opts.bundle).expanduser().absolute())
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
        recorded_intervals = loss_intervals.intervals(metrics)
        after = step if from_ckpt else 0
        until = step + opts.steps if opts.steps is not None and step is not None else None
        expected = loss_intervals.expected_intervals(recorded_intervals, after or 0, until)
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
        self._image(opened, final)  # a container job: the image's digest now against the recorded one

        # --- environment
        env = envdiff.environment_diff(
            ident.get("runtime") if isinstance(ident.get("runtime"), dict) else None,
            (read_json(lay.identity_submit, []) or {}).get("code"),
        )
        self.report["environment"] = env
        threads, how_known = unpack.recorded_threads(ident)
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
            code = unpack.restore_code(opened, paths.reproduced_code)
            self._say_code(code)
            if from_ckpt:
                placed = unpack.place_checkpoint(opened, ckpt_dir)
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
                loss_intervals.render_comparison(result, self.console, title=_title(record))
        self.report["comparison"] = result
        record["identity"] = self.report["identity"] = self._identity_vs(ident, paths)
        self._write_record(paths, record)
        if opts.json:
            print_json(self.report, schema=RUN_SCHEMA)
        if rc != 0:
            return rc
        return EXIT_FAILED if result is not None and not result["ok"] else EXIT_OK

    # --------------------------------------------------------------------------------- pieces
    def _image(self, opened: unpack.Opened, final: tp.Any) -> None:
        """A container job is resubmitted with the recorded image, runtime and mounts (the recorded settings); before
        anything is written, the image's digest now (:func:`hpctrain._container.image_record`, the function submit
        recorded it with) must equal the submit identity's: another digest is one UsageError line naming both
        (exit 2, nothing submitted) unless ``--accept-image-digest``, and then the report and the record say so. A
        missing image or runtime is submit's own line. With ``--dry-run`` each is a note (the script is shown)."""
        from rich.markup import escape

        from hpctrain._container import check_image, check_runtime, image_record

        doc = read_json(opened.layout.identity_submit, []) if opened.layout.identity_submit.is_file() else None
        recorded = (doc or {}).get("container") if isinstance((doc or {}).get("container"), dict) else None
        if not final.container:
            if recorded:
                self.note(
                    f"the recorded run ran in the image {recorded.get('image')} ({recorded.get('runtime')}), but its "
                    "submitted settings name no container: this reproduction runs without one"
                )
            return
        image, runtime = str(final.container), str(final.container_runtime)
        try:
            check_image(runtime, image)
            check_runtime(runtime)
            now = image_record(runtime, image, [])
        except UsageError as exc:
            if not self.dry_run:
                raise
            self.note(f"{exc} (a real reproduction stops here)")
            now = {"digest": None}
        old = recorded.get("digest") if recorded else None
        digest = now.get("digest")
        accept = bool(getattr(self.opts, "accept_image_digest", False))
        if recorded is None:
            status = "not recorded"
        elif old is None and digest is None:
            status = "unknown"
        elif old == digest:
            status = "same"
        else:
            status = "differs, accepted" if accept else "differs"
        info = {
            "image": image,
            "runtime": runtime,
            "mounts": list(final.container_mounts or []),
            "recorded_image": recorded.get("image") if recorded else None,
            "recorded_digest": old,
            "digest": digest,
            "status": status,
            "accepted": status == "differs, accepted",
        }
        self.report["container"] = info
        if status == "differs":
            why = (
                f"--container {image}: its digest is now {digest}, the run recorded {old}: not the image the run "
                "ran in; pass --accept-image-digest to reproduce with it anyway"
            )
            if not self.dry_run:
                raise UsageError(why)
            self.note(f"{why} (a real reproduction stops here)")
            return
        shown = f"{escape(image)} ({escape(runtime)})"
        if status == "same":
            self.say(f"image      {shown}: digest {escape(str(digest))}, [green]as recorded[/]")
        elif status == "differs, accepted":
            self.say(f"image      {shown}: digest {escape(str(digest))}")
            self.note(
                f"the image's digest differs from the recorded one ({old}); reproducing with it anyway "
                "(--accept-image-digest): the loss is not expected to match bit for bit"
            )
        elif status == "unknown":
            self.note(f"the image {image} is a registry reference resolved on the node: no digest to compare here")
        else:
            self.note(f"the run recorded no container image; this reproduction runs in {image} ({runtime})")
        if recorded and recorded.get("image") != image:
            self.note(f"the recorded run named the image {recorded.get('image')}; this reproduction names {image}")

    def _settings(
        self, opened: unpack.Opened, recorded: tp.Mapping[str, tp.Any], args: tp.Sequence[str], run: Path
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
        job, restart = parse_label(str(history[-1]["attempt"])) or ("", 0)
        mine = read_json(paths.identity_attempt(job, restart or 0), []) or {}
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
        if self.report.get("container"):  # the image the reproduction's submit recorded, against the original's
            ran = (read_json(paths.identity_submit, []) or {}).get("container") or {}
            out["container_digest"] = {
                "original": self.report["container"]["recorded_digest"],
                "reproduction": ran.get("digest") if isinstance(ran, dict) else None,
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
        self, opened: unpack.Opened, old_run: tp.Optional[str], paths: RunDir, args: tp.List[str], cwd: tp.Any
    ) -> tp.Tuple[Path, tp.List[str], tp.List[tp.Dict[str, str]]]:
        """Where the new run's Trainer keeps its checkpoints: the run's checkpoint directory moved into the new run
        when it lay inside the run: the directory the bundled checkpoint was taken from, inside the run directory it
        was bundled from (``bundle`` checked it is the run's own: :func:`hpctrain.run.choose_checkpoint`), else
        the recorded one (the ledger's, :func:`hpctrain.run.recorded_checkpoint_dir`) inside the submitted run
        directory. One outside it (``CheckpointPolicy.dir``) is replaced by the new run's default where an entry
        argument names it, and refused otherwise (the reproduction would share the original's checkpoints).
        ``(directory, arguments, rewrites)``."""
        ledger, _ = read_jsonl(opened.layout.ledger, limit=JSONL_LIMIT)
        recorded = recorded_checkpoint_dir(ledger)
        ck = opened.record.get("checkpoint") if isinstance(opened.record.get("checkpoint"), dict) else {}
        source, source_run = ck.get("source"), opened.record.get("source_run")
        source_dir = os.path.dirname(os.path.normpath(source)) if isinstance(source, str) and source else None
        for base, where in ((source_run, source_dir), (old_run, recorded)):
            if isinstance(base, str) and base and where:
                rel = os.path.relpath(os.path.normpath(where), os.path.normpath(base))
                if not rel.startswith("..") and rel != ".":
                    return paths.root / rel, args, []
        if recorded is None or old_run is None:
            return paths.checkpoints, args, []
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
        opened: unpack.Opened,
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
            "container": self.report.get("container"),
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
        self, opened: unpack.Opened, args: tp.Sequence[str], config: tp.Mapping[str, tp.Any], rec: tp.Any
    ) -> int:
        """--dry-run: the code rebuilt in a scratch directory (the entry must be found), then hpctrain.submit's
        own dry run (the sbatch script); nothing is written under the new run directory."""
        from hpctrain.submit.cli import main as submit_main

        scratch = Path(tempfile.mkdtemp(prefix=".hpctrain-reproduce-dry-"))
        try:
            code = unpack.restore_code(opened, scratch / "code")
            self._say_code(code)
            toml_path = scratch / SUBMIT_TOML
            toml_path.write_text(_toml(config, str(config["entry"]), args, "dry run", code["code_path"]))
            argv = ["--config", str(toml_path), "--run-dir", self.report["run_dir"], *self.submit_argv]
            with _entry_visible(code["code_path"], code["cwd"], self.job_env), self._stdout():
                rc = submit_main(argv, console=self.console)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        if self.opts.json:
            print_json(self.report, schema=RUN_SCHEMA)
        return rc
