"""The environment a run ran in: Python, installed distributions, torch/CUDA/cuDNN/NCCL/driver, GPUs, hosts,
CPU, environment modules, container, Slurm variables.

Stdlib only at import. The distributions come from :mod:`importlib.metadata` (no ``pip`` subprocess).
torch is imported only by :func:`torch_info`, which :func:`capture_runtime` calls with ``node=True`` (rank 0
on the nodes, where the Runner has imported torch already); the login node records torch's installed version
from its metadata instead. Every probe is guarded: a missing ``/proc`` file or a CUDA call that fails is
an ``error`` entry, never an exception.

Environment variables are recorded through :func:`hpctrain.identity.redact.redact_env`: the value of one whose
name looks like a secret (``SLURM_JWT``, ``*TOKEN*``, ``*SECRET*``, ``*PASSWORD*``, ``*KEY*``, ``AWS_*``) is
``<redacted>``, URLs lose their credentials; text that is not UTF-8 is escaped (a record is valid UTF-8 JSON).
"""

from __future__ import annotations

import os
import platform
import socket
import sys
import typing as tp

from hpctrain._files import shorten
from hpctrain.identity.code import json_safe
from hpctrain.identity.redact import redact_env

__all__ = ["capture_runtime", "runtime_essentials", "distributions", "torch_info", "cpu_model", "container"]

_CONTAINER_VARS = ("APPTAINER_NAME", "APPTAINER_CONTAINER", "SINGULARITY_NAME", "SINGULARITY_CONTAINER")


def distributions() -> tp.Dict[str, str]:
    """``{normalised name: version}`` of every installed distribution visible on ``sys.path``; the first
    one found wins (as for imports)."""
    import importlib.metadata as md

    out: tp.Dict[str, str] = {}
    for dist in md.distributions():
        try:
            name = dist.metadata["Name"]
        except Exception:  # a broken METADATA file
            continue
        if not name:
            continue
        key = name.lower().replace("_", "-").replace(".", "-")
        out.setdefault(key, str(dist.version))
    return dict(sorted(out.items()))


def _read_small(path: str, limit: int = 1 << 20) -> tp.Optional[str]:
    from hpctrain._files import read_bounded

    try:
        return read_bounded(path, limit=limit)[0].decode("utf-8", "replace")
    except OSError:
        return None


def cpu_model() -> tp.Dict[str, tp.Any]:
    text = _read_small("/proc/cpuinfo", 8 << 20) or ""
    model = None
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("model name", "Model", "cpu model", "Hardware"):
            model = value.strip()
            break
    return {"model": model or platform.processor() or None, "count": os.cpu_count(), "machine": platform.machine()}


def container() -> tp.Optional[tp.Dict[str, tp.Any]]:
    found = redact_env({k: os.environ[k] for k in _CONTAINER_VARS if os.environ.get(k)})
    if os.path.exists("/.dockerenv"):
        found["docker"] = "/.dockerenv"
    if os.path.exists("/run/.containerenv"):
        found["podman"] = "/run/.containerenv"
    return found or None


def _driver_version() -> tp.Optional[str]:
    text = _read_small("/proc/driver/nvidia/version")
    if text:
        for word in text.split():
            if word.count(".") >= 1 and word.replace(".", "").isdigit():
                return word
    return None


def torch_info(cuda: tp.Any = None) -> tp.Dict[str, tp.Any]:
    """torch and its CUDA stack on this node: versions, and model, UUID and memory of every GPU it sees.

    Imports torch (call it on the nodes only). ``cuda``: the CUDA seam (:class:`hpctrain._cuda.CudaRuntime`;
    tests pass :class:`hpctrain.testing.FakeCuda`)."""
    from hpctrain._cuda import CudaRuntime

    cuda = cuda or CudaRuntime()
    info: tp.Dict[str, tp.Any] = {}
    try:
        import torch
    except Exception as exc:  # not installed on this node
        return {"error": f"import torch failed: {type(exc).__name__}: {exc}"}
    info["version"] = str(torch.__version__)
    info["cuda"] = getattr(torch.version, "cuda", None)
    info["hip"] = getattr(torch.version, "hip", None)
    try:
        info["cudnn"] = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    except Exception as exc:
        info["cudnn"] = f"error: {type(exc).__name__}"
    try:
        available = bool(cuda.is_available())
    except Exception:
        available = False
    info["cuda_available"] = available
    info["driver"] = _driver_version()
    info["nccl"] = None
    gpus: tp.List[tp.Dict[str, tp.Any]] = []
    if available:
        try:
            version = torch.cuda.nccl.version()
            info["nccl"] = ".".join(str(v) for v in version) if isinstance(version, tuple) else str(version)
        except Exception as exc:
            info["nccl"] = f"error: {type(exc).__name__}"
        try:
            count = int(cuda.count())
        except Exception as exc:
            count = 0
            gpus.append({"error": f"{type(exc).__name__}: {exc}"})
        for i in range(count):
            gpu: tp.Dict[str, tp.Any] = {"index": i}
            try:
                gpu["uuid"] = str(cuda.uuid(i))
                props = torch.cuda.get_device_properties(i)
                gpu.update(
                    name=props.name, memory_bytes=int(props.total_memory), capability=f"{props.major}.{props.minor}"
                )
            except Exception as exc:
                gpu["error"] = f"{type(exc).__name__}: {shorten(exc, 160)}"
            gpus.append(gpu)
    info["gpus"] = gpus
    info["visible_devices"] = json_safe(os.environ.get("CUDA_VISIBLE_DEVICES"))
    return info


def capture_runtime(*, node: bool, hostnames: tp.Sequence[str] = (), cuda: tp.Any = None) -> tp.Dict[str, tp.Any]:
    """The ``runtime`` section. ``node``: on a compute node (torch/CUDA probed through ``cuda``, the CUDA seam);
    else the login node."""
    import hpctrain

    dists = distributions()
    record: tp.Dict[str, tp.Any] = {
        "python": {
            "version": platform.python_version(),
            "implementation": platform.python_implementation(),
            "executable": sys.executable,
            "prefix": sys.prefix,
        },
        "platform": platform.platform(),
        "hpctrain": hpctrain.__version__,
        "distributions": dists,
        "host": socket.gethostname(),
        "hostnames": list(hostnames) or [socket.gethostname()],
        "cpu": cpu_model(),
        "modules": [m for m in os.environ.get("LOADEDMODULES", "").split(":") if m],
        "container": container(),
        "slurm": redact_env({k: v for k, v in sorted(os.environ.items()) if k.startswith("SLURM_")}),
        "where": "node" if node else "login",
    }
    if node:
        record["torch"] = torch_info(cuda)
    else:
        record["torch"] = {"version": dists.get("torch"), "imported": False}
    return json_safe(record)


def runtime_essentials(runtime: tp.Optional[tp.Mapping[str, tp.Any]]) -> tp.Any:
    """What of the runtime makes the identity: Python, hpctrain, torch (its installed version, the same on the
    login node and the nodes) and every distribution. Not hosts, GPUs, Slurm ids or times."""
    if not runtime:
        return None
    dists = dict(runtime.get("distributions") or {})
    python = runtime.get("python") or {}
    return {
        "python": f"{python.get('implementation')} {python.get('version')}",
        "hpctrain": runtime.get("hpctrain"),
        "torch": dists.get("torch"),
        "distributions": dists,
    }
