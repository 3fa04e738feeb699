"""The seam to container runtimes: Apptainer, pyxis (``srun --container-image``) and podman (stdlib only).

One code path makes every runtime's command line (:func:`task_wrapper`), so the three differ only where their
documented options differ. The login side checks what it can before anything is submitted (:func:`check_image`,
:func:`check_runtime`, :func:`check_mounts`: one :class:`~hpctrain.errors.UsageError` line each) and records the
image's digest (:func:`image_record`).

Slurm stays outside. Images rarely carry the Slurm client (and when they do it does not match the site's
slurmctld: Lightning #21404, pyxis #129, submitit #1601), yet a rank decides requeues, exclusions and node-failure
attribution with ``scontrol``/``squeue``/``sinfo``/``sacct``. So the batch script, which runs outside the container,
starts :func:`relay` in the background; a task inside the container whose probe (:func:`probe_node`) finds no
``scontrol`` puts the relay's small forwarding scripts first on its PATH, and every Slurm command hpctrain runs
there is answered by the real client outside, through request/answer files in the run directory (shared by every
node). The node side's code is unchanged: it still calls :class:`~hpctrain._slurm.SlurmCommands`.
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
import typing as tp
import uuid
from dataclasses import dataclass
from pathlib import Path

from hpctrain._files import shorten
from hpctrain.errors import UsageError

__all__ = [
    "RUNTIMES",
    "Mount",
    "parse_mounts",
    "job_mounts",
    "check_mounts",
    "check_runtime",
    "check_image",
    "task_wrapper",
    "relay_setup",
    "start_orphan_guard",
    "image_record",
    "probe_node",
    "relay",
    "ask",
    "RELAY_ENV",
]

RUNTIMES = ("apptainer", "pyxis", "podman")
RELAY_ENV = "HPCTRAIN_SLURM_RELAY"
RELAY_DIR = ".slurm-relay"  # under the run directory: every node sees it
# The Slurm clients hpctrain runs on a node; the relay runs nothing else.
RELAYED = ("scontrol", "squeue", "sinfo", "sacct", "scancel")
# What podman must pass into the container (it passes no environment by default; apptainer and pyxis pass all):
# Slurm's and submitit's task variables, hpctrain's, and what CUDA/NCCL/torch read.
PODMAN_ENV = ("SLURM_*", "SUBMITIT_*", "HPCTRAIN_*", "CUDA_VISIBLE_DEVICES", "NVIDIA_*", "NCCL_*", "TORCH*", "MASTER_*")
ASK_TIMEOUT_S = 120.0
# How long the relay outlives its batch script. Slurm's SIGKILL of the job's processes misses it where the job's
# processes are tracked by parentage (proctrack/linuxproc, pgid): the batch script gone, the relay is init's child.
# The tasks inside still ask it until their orphan guard ends them (their task process is SIGKILLed at KillWait,
# 30 s by default, 10 on the dev cluster); 180 s covers a KillWait of two minutes, then the relay exits.
RELAY_ORPHAN_GRACE_S = 180.0


@dataclass(frozen=True)
class Mount:
    """One bind mount: ``src`` on the node is ``dst`` in the container (both absolute)."""

    src: str
    dst: str

    @property
    def spec(self) -> str:
        return self.src if self.src == self.dst else f"{self.src}:{self.dst}"


def parse_mounts(value: tp.Union[str, tp.Sequence[str], None], *, option: str = "--container-mounts") -> tp.List[Mount]:
    """``SRC[:DST][,SRC[:DST]...]`` (a TOML list of ``SRC[:DST]`` too); DST defaults to SRC; paths absolute."""
    if value is None:
        return []
    items = value.split(",") if isinstance(value, str) else list(value)
    mounts = []
    for item in items:
        if not isinstance(item, str):
            raise UsageError(f"{option}: every mount must be a string SRC[:DST], got {shorten(repr(item))}")
        item = item.strip()
        if not item:
            continue
        parts = item.split(":")
        if len(parts) > 2 or any(not p for p in parts):
            raise UsageError(f"{option} {shorten(repr(item))}: use SRC:DST (absolute paths, no ':' or ',' in them)")
        src, dst = parts[0], parts[-1]
        for path in (src, dst):
            if not os.path.isabs(path) or any(c in path for c in "\n\r\t\0") or "%" in path:
                raise UsageError(f"{option} {shorten(repr(item))}: {shorten(repr(path))} must be an absolute path")
        mounts.append(Mount(os.path.normpath(src), os.path.normpath(dst)))
    return mounts


def _inside(path: str, top: str) -> bool:
    return path == top or path.startswith(top.rstrip("/") + "/")


def check_mounts(
    mounts: tp.Sequence[Mount], run_dir: tp.Union[str, Path], *, option: str = "--container-mounts"
) -> None:
    """Every source exists on the login node (the shared file systems are the same on the nodes); no mount hides
    or replaces the run directory, which hpctrain mounts itself at its own path."""
    run = os.path.normpath(str(run_dir))
    for m in mounts:
        if not os.path.exists(m.src):
            raise UsageError(f"{option} {shorten(m.spec)}: the source {shorten(m.src)} does not exist")
        # /scratch:/scratch above the run directory is the usual case and harmless; anything else over it is not
        if _inside(m.dst, run) or (_inside(run, m.dst) and m.src != m.dst):
            raise UsageError(
                f"{option} {shorten(m.spec)}: mounts over the run directory {shorten(run)}; hpctrain mounts it at "
                "its own path (choose another destination)"
            )


def job_mounts(user: tp.Sequence[Mount], *, same_path: tp.Sequence[tp.Union[str, Path]]) -> tp.List[Mount]:
    """The job's mounts: ``same_path`` (the run directory, checkpoint directory, code) each at its own path, unless
    a user mount of the same path above it carries it already, then the user's own."""
    out: tp.List[Mount] = []
    for raw in same_path:
        path = os.path.normpath(str(raw))
        covered = any(_inside(path, m.dst) and m.src == m.dst for m in [*user, *out])
        if not covered:
            out.append(Mount(path, path))
    return out + [m for m in user if m not in out]


def check_runtime(runtime: tp.Optional[str], run: tp.Callable[..., tp.Any] = subprocess.run) -> tp.Dict[str, str]:
    """The runtime's name and version on the login node; a UsageError line when it is not installed here.
    pyxis is an srun plugin: it is there when ``srun --help`` lists ``--container-image``."""
    runtime = runtime or "apptainer"
    binary = "srun" if runtime == "pyxis" else runtime
    if runtime == "apptainer" and shutil.which("apptainer") is None and shutil.which("singularity"):
        binary = "singularity"  # the same program under its old name (SingularityCE, older clusters)
    if shutil.which(binary) is None:
        raise UsageError(
            f"--container-runtime {runtime}: {binary} is not on PATH on this machine; install it or load its module"
        )
    argv = [binary, "--help"] if runtime == "pyxis" else [binary, "--version"]
    try:
        out = run(argv, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError) as exc:
        raise UsageError(f"--container-runtime {runtime}: {shorten(' '.join(argv))} failed ({exc})") from None
    text = (out.stdout or "") + (out.stderr or "")
    if runtime == "pyxis":
        if "--container-image" not in text:
            raise UsageError(
                "--container-runtime pyxis: srun has no --container-image here (the pyxis plugin is not installed)"
            )
        version = run(["srun", "--version"], capture_output=True, text=True, timeout=30).stdout.strip()
        return {"runtime": runtime, "version": f"pyxis plugin of {version}".strip()}
    return {"runtime": runtime, "version": text.strip().splitlines()[0] if text.strip() else "unknown"}


def _is_file_image(runtime: str, image: str) -> bool:
    # pyxis takes a squashfs file or a registry reference (nvcr.io#nvidia/pytorch:24.01-py3); podman a local image
    # name, or an archive through a transport (oci-archive:/p, docker-archive:/p); apptainer a file, or docker://...
    if runtime == "podman":
        return image.startswith(("oci-archive:", "docker-archive:"))
    return "://" not in image and (image.startswith(("/", "./", "~")) or image.endswith((".sif", ".sqsh", ".simg")))


def _file_of(runtime: str, image: str) -> str:
    return image.split(":", 1)[1] if runtime == "podman" else image


def check_image(runtime: str, image: str, run: tp.Callable[..., tp.Any] = subprocess.run) -> None:
    """The image exists: a file image as a file; a podman image in podman's store (``podman image exists``)."""
    if not image.strip() or any(c in image for c in "\n\r\0"):
        raise UsageError(f"--container {shorten(repr(image))} must name an image on one line")
    if _is_file_image(runtime, image):
        path = Path(_file_of(runtime, image)).expanduser()
        if not path.is_file():
            raise UsageError(f"--container {shorten(image)}: no such image file {shorten(str(path))}")
    elif runtime == "podman" and shutil.which("podman"):  # without podman, check_runtime says so
        found = run(["podman", "image", "exists", image], capture_output=True, text=True, timeout=60)
        if found.returncode != 0:
            raise UsageError(
                f"--container {shorten(image)}: podman has no such image here (podman images lists them; "
                "give a local name, or oci-archive:/path/image.tar)"
            )


def sha256_file(path: tp.Union[str, Path]) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return "sha256:" + h.hexdigest()


def image_record(
    runtime: str, image: str, mounts: tp.Sequence[Mount], run: tp.Callable[..., tp.Any] = subprocess.run
) -> tp.Dict[str, tp.Any]:
    """What the identity says about the container: the image (its file's content digest, or podman's image id and
    repository digest), the runtime and its version, the mounts. A registry reference pyxis pulls on the node has
    no digest here (no registry is asked from the login node): ``digest`` is then None and says so."""
    record: tp.Dict[str, tp.Any] = {"image": image, "runtime": runtime, "mounts": [m.spec for m in mounts]}
    try:
        record.update({k: v for k, v in check_runtime(runtime, run=run).items() if k == "version"})
    except UsageError as exc:
        record["version"] = None
        record["version_error"] = str(exc)
    if _is_file_image(runtime, image):
        path = Path(_file_of(runtime, image)).expanduser().resolve()
        record.update(kind="file", path=str(path), size=path.stat().st_size, digest=sha256_file(path))
    elif runtime == "podman":
        out = run(
            ["podman", "image", "inspect", "--format", "{{.Id}} {{.Digest}}", image],
            capture_output=True,
            text=True,
            timeout=60,
        )
        image_id, _, repo_digest = out.stdout.strip().partition(" ")
        record.update(kind="podman", digest=f"sha256:{image_id}" if image_id else None, repo_digest=repo_digest or None)
    else:
        record.update(kind="reference", digest=None, digest_note="a registry reference: resolved on the node")
    return record


def task_wrapper(
    runtime: str,
    image: str,
    mounts: tp.Sequence[Mount],
    *,
    gpus: bool,
    workdir: str,
    as_root: bool = False,
) -> tp.Tuple[tp.List[str], tp.List[str]]:
    """``(srun arguments, command prefix)`` that run each task inside ``image``: pyxis adds srun options, the
    others put their runtime in front of the task's command. Host network and IPC (NCCL and gloo talk across
    nodes and through /dev/shm exactly as outside), host PIDs (the watchdog's stack dumps and signals), GPUs
    passed through, the working directory kept."""
    specs = ",".join(m.spec for m in mounts)
    if runtime == "pyxis":
        args = [f"--container-image={image}", f"--container-workdir={workdir}"]
        if specs:
            args.append(f"--container-mounts={specs}")
        return args, []
    if runtime == "apptainer":
        prefix = ["apptainer", "exec"] + (["--nv"] if gpus else [])
        prefix += ["--pwd", workdir] + (["--bind", specs] if specs else [])
        return [], [*prefix, image]
    # --log-driver=none: the output goes to the task's stdout/stderr (Slurm's log files) only, not also to podman's
    # store. The OCI runtime, cgroup manager and default ulimits are the site's containers.conf (CONTAINERS_CONF).
    prefix = ["podman", "run", "--rm", "--network=host", "--ipc=host", "--pid=host"]
    prefix += ["--security-opt=label=disable", "--log-driver=none", "--workdir", workdir]
    if not as_root:
        prefix.append("--userns=keep-id")  # rootless: files written in the run directory belong to the user
    if gpus:
        prefix += [
            "--device",
            "nvidia.com/gpu=all",
        ]  # CDI (nvidia-container-toolkit); Slurm's CUDA_VISIBLE_DEVICES picks
    for m in mounts:
        prefix += ["--volume", f"{m.src}:{m.dst}"]
    for name in PODMAN_ENV:
        prefix += ["--env", name]
    return [], [*prefix, image]


def relay_setup(python: str, run_dir: tp.Union[str, Path]) -> tp.List[str]:
    """The batch script's lines (outside the container) that start the Slurm-command relay of the tasks.

    One directory per attempt (``RUN_DIR/.slurm-relay/<job>-r<restart>``): a task of an ended attempt whose
    container outlived its step is never answered by the next attempt's relay (its late ``scontrol requeue`` would
    requeue the new attempt)."""
    where = shlex.quote(str(Path(run_dir) / RELAY_DIR)) + '/"${SLURM_JOB_ID}-r${SLURM_RESTART_COUNT:-0}"'
    return [
        "# Slurm commands stay outside the container: the tasks inside ask this relay (hpctrain._container)",
        f"export {RELAY_ENV}={where}",
        f'{shlex.quote(python)} -m hpctrain._container relay "${RELAY_ENV}" --batch-pid $$ &',
    ]


def start_orphan_guard(environ: tp.Mapping[str, str] = os.environ, poll_s: float = 1.0) -> tp.Optional[tp.Any]:
    """Node side, inside a container: end this process when its Slurm task process is gone.

    Outside a container Slurm's SIGKILL (KillWait after the SIGTERM) ends a rank that overstays its step. Inside
    podman the rank is a child of conmon, not of the task process (``podman run``) that Slurm kills, so it would
    live on: training, writing to the run directory beside the next attempt. The guard watches the task process
    (``SLURM_TASK_PID``; the containers share the host's PID namespace: ``--pid=host``, apptainer and pyxis do by
    default) and, once it is gone, exits at once, as the SIGKILL would (a checkpoint it was writing is never
    committed, so never loaded). Returns the thread, or None when there is nothing to watch."""
    import threading

    pid = environ.get("SLURM_TASK_PID", "")
    if not environ.get(RELAY_ENV) or not pid.isdigit() or int(pid) == os.getpid():
        return None

    def watch() -> None:
        while True:
            time.sleep(poll_s)
            try:
                os.kill(int(pid), 0)
            except ProcessLookupError:
                print(
                    f"hpctrain: the Slurm task process {pid} of this container is gone (Slurm ended the step): "
                    "exiting as its SIGKILL would",
                    file=sys.stderr,
                    flush=True,
                )
                os._exit(137)
            except OSError:  # EPERM: it exists (another user's namespace view); keep watching
                pass

    thread = threading.Thread(target=watch, name="hpctrain-orphan-guard", daemon=True)
    thread.start()
    return thread


def probe_node(environ: tp.MutableMapping[str, str] = os.environ) -> tp.Optional[str]:
    """Node side, once per task before anything runs a Slurm command: inside a container with no ``scontrol``
    and a relay, put the relay's forwarding scripts first on PATH. Returns the line to log (None: no container)."""
    where = environ.get(RELAY_ENV)
    if not where:
        return None
    if shutil.which("scontrol", path=environ.get("PATH")):
        return (
            f"hpctrain: container probe: scontrol is on PATH here; Slurm commands run in the container ({where} unused)"
        )
    bindir = Path(where) / "bin"
    if not (bindir / "scontrol").exists():
        return f"hpctrain: container probe: no scontrol and no relay scripts in {bindir}; requeue and attribution fail"
    environ["PATH"] = f"{bindir}{os.pathsep}{environ.get('PATH', '')}"
    environ["HPCTRAIN_RELAY_PYTHON"] = sys.executable
    return (
        f"hpctrain: container probe: no scontrol in the container; Slurm commands run outside, relayed through {where}"
    )


def _write_json(path: Path, obj: tp.Any) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(obj))
    os.replace(tmp, path)


def ask(where: tp.Union[str, Path], argv: tp.Sequence[str], timeout_s: float = ASK_TIMEOUT_S) -> int:
    """Inside the container: have the relay run ``argv`` outside, print its output, return its exit status."""
    where = Path(where)
    name = f"{os.uname().nodename}-{os.getpid()}-{uuid.uuid4().hex[:8]}.json"
    _write_json(where / "req" / name, {"argv": list(argv), "time": time.time()})
    answer, deadline = where / "ans" / name, time.monotonic() + timeout_s
    while not answer.exists():
        if time.monotonic() > deadline:
            print(f"hpctrain: no Slurm-command relay answered in {where} within {timeout_s:.0f} s", file=sys.stderr)
            return 1
        time.sleep(0.05)
    record = json.loads(answer.read_text())
    answer.unlink(missing_ok=True)
    sys.stdout.write(record.get("stdout", ""))
    sys.stderr.write(record.get("stderr", ""))
    return int(record.get("rc", 1))


def _forwarder(name: str) -> str:
    return (
        "#!/bin/sh\n# hpctrain: runs this Slurm command outside the container (hpctrain._container)\n"
        f'exec "${{HPCTRAIN_RELAY_PYTHON:-python3}}" -m hpctrain._container ask "${RELAY_ENV}" {name} "$@"\n'
    )


def relay(
    where: tp.Union[str, Path],
    poll_s: float = 0.05,
    orphan_grace_s: float = RELAY_ORPHAN_GRACE_S,
    batch_pid: tp.Optional[int] = None,
) -> None:
    """Outside the container (the batch script, in the background, for the job's life): answer the tasks'
    Slurm commands. A ``scontrol requeue`` signals this process too: its answer is written first. Returns
    ``orphan_grace_s`` after this process stopped being a child of ``batch_pid`` (the batch script's ``$$``: asked
    here, the parent may already be gone when the interpreter is up) — see ``RELAY_ORPHAN_GRACE_S``."""
    where = Path(where)
    parent, orphaned_at = (os.getppid() if batch_pid is None else batch_pid), None
    for sub in ("req", "ans", "bin"):
        (where / sub).mkdir(parents=True, exist_ok=True)
    for stale in [*(where / "req").glob("*.json"), *(where / "ans").glob("*.json")]:
        stale.unlink(missing_ok=True)  # an earlier attempt's: its tasks are gone, and its requeue is not this one's
    for name in RELAYED:
        path = where / "bin" / name
        path.write_text(_forwarder(name))
        path.chmod(0o755)
    # Deaf to the job's signals for its whole life: a requeue or a node failure SIGTERMs the batch script while the
    # survivors inside still need their attribution, exclusion and requeue answered (outside a container they run
    # those themselves until KillWait). Slurm ends the relay with the job's other processes (SIGKILL).
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(sig, signal.SIG_IGN)
    while True:
        for req in sorted((where / "req").glob("*.json")):
            try:
                argv = json.loads(req.read_text())["argv"]
                req.unlink()
            except (OSError, ValueError, KeyError):
                continue
            answer = _run_relayed(argv)
            _write_json(where / "ans" / req.name, answer)
            try:  # what ran outside for the tasks, one line each (RUN_DIR/.slurm-relay/<attempt>/log)
                with open(where / "log", "a") as log:
                    log.write(json.dumps({"time": time.time(), "argv": argv, "rc": answer["rc"]}) + "\n")
            except OSError:
                pass
        if orphaned_at is None and os.getppid() != parent:
            orphaned_at = time.monotonic()  # reparented: the batch script ended without Slurm ending this process
        if orphaned_at is not None and time.monotonic() - orphaned_at >= orphan_grace_s:
            return
        time.sleep(poll_s)


def _run_relayed(argv: tp.Sequence[str]) -> tp.Dict[str, tp.Any]:
    if not argv or os.path.basename(str(argv[0])) not in RELAYED:
        return {"rc": 2, "stdout": "", "stderr": f"hpctrain relay: refused {shorten(repr(list(argv)))}\n"}
    try:
        out = subprocess.run([os.path.basename(argv[0]), *argv[1:]], capture_output=True, text=True, timeout=110)
    except (OSError, subprocess.SubprocessError) as exc:
        return {"rc": 1, "stdout": "", "stderr": f"hpctrain relay: {exc}\n"}
    return {"rc": out.returncode, "stdout": out.stdout, "stderr": out.stderr}


def _main(argv: tp.Sequence[str]) -> int:
    if len(argv) >= 2 and argv[0] == "relay":
        import argparse

        parser = argparse.ArgumentParser(prog="python -m hpctrain._container relay")
        parser.add_argument("dir")
        parser.add_argument("--batch-pid", type=int, help="the batch script's $$: the relay ends after it")
        parser.add_argument("--orphan-grace-s", type=float, default=RELAY_ORPHAN_GRACE_S)
        args = parser.parse_args(argv[1:])  # a bad flag: one usage line, exit 2
        relay(args.dir, orphan_grace_s=args.orphan_grace_s, batch_pid=args.batch_pid)
        return 0
    if len(argv) >= 3 and argv[0] == "ask":
        return ask(argv[1], argv[2:])
    print(
        "usage: python -m hpctrain._container relay DIR [--batch-pid PID] | ask DIR COMMAND [ARG...]", file=sys.stderr
    )
    return 2


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
