"""The bundle's RO-Crate: ``ro-crate-metadata.json`` (RO-Crate 1.1, Process Run Crate 0.5) and its preview.

Written as plain JSON-LD by this module (standard library only) rather than with the ``rocrate`` library:
the graph is a few dozen entities of fixed shape, the bundle must be buildable on a login node without
extra packages, and the output must be byte-for-byte deterministic for a given run; ``roc-validator``
(``../shared/tools/rocrate-validate BUNDLE -l recommended``) is the judge of conformance.

The graph:

* the root ``./`` Dataset: name, description, datePublished, license, author (the owner), ``hasPart`` every
  file of the bundle (and the checkpoint directory), ``mentions`` every action, ``conformsTo`` the Process
  Run Crate 0.5 profile (the version ``roc-validator`` 0.13 knows: ``https://w3id.org/ro/wfrun/process/0.5``);
* the software: hpctrain (``SoftwareApplication`` with its version) and the user's code (a
  ``SoftwareApplication`` whose id is its repository's URL and whose version is the commit) when the code
  record names a web remote; the code snapshot file carries the commit and the dirty flag in any case;
* one ``CreateAction`` per Slurm attempt from the ledger: startTime, endTime, actionStatus, agent (the
  owner), instrument (the software), object (the input files' fingerprints as ``PropertyValue``s, the
  fingerprint file, the code snapshot, the submission), result (the checkpoint it committed when that is
  the bundled one, the committed step, the metrics), description (job id, restart count, hosts, steps
  resumed from / reached / committed, how it ended), ``environment`` = the attempt's ``SLURM_*`` variables;
* one ``OrganizeAction`` per Slurm job, whose ``result`` is its attempts;
* a containerised run's image (the submit identity's ``container`` record): a ``ContainerImage`` (Process Run
  Crate, "Representing container images": ``additionalType`` ``DockerImage`` or ``SIFImage``, ``registry``,
  ``name``, ``tag``, ``sha256``) that every CreateAction names as its ``containerImage``.

The Process Run Crate's ``environment`` term lives in the workflow-run context; it is declared inline
(``{"environment": "https://w3id.org/ro/terms/workflow-run#environment"}``, the same IRI) so that no tool
needs the network to read the crate; so are ``containerImage``, ``ContainerImage``, ``registry``, ``tag`` and
``sha256`` when the run ran in a container.
"""

from __future__ import annotations

import datetime
import html
import json
import re
import typing as tp

from hpctrain.bundle._records import code_repo, data_files, hpctrain_code, http_url, slurm_environment
from hpctrain.run import Attempt

__all__ = [
    "PROFILE",
    "RO_CRATE",
    "build_crate",
    "command_line",
    "container_image",
    "crate_gaps",
    "preview_html",
    "iso",
    "encoding_format",
]

RO_CRATE = "https://w3id.org/ro/crate/1.1"
PROFILE = "https://w3id.org/ro/wfrun/process/0.5"
WFRUN = "https://w3id.org/ro/terms/workflow-run#"
WFRUN_ENVIRONMENT = WFRUN + "environment"
CONTAINER_IMAGE_ID = "#container-image"
_CONTAINER_TERMS = ("containerImage", "ContainerImage", "registry", "tag", "sha256")
COMPLETED = "http://schema.org/CompletedActionStatus"
FAILED = "http://schema.org/FailedActionStatus"
_SAFE_ID = re.compile(r"[^A-Za-z0-9_.-]")
_HOST = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9-]{0,62})(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,62}))*$")

_FORMATS = {
    ".json": "application/json",
    ".jsonl": "application/x-ndjson",
    ".md": "text/markdown",
    ".html": "text/html",
    ".sh": "text/x-shellscript",
    ".gz": "application/gzip",
    ".lock": "text/plain",
    ".sha256": "text/plain",
    ".shard": "application/octet-stream",
}


def iso(t: tp.Optional[float]) -> tp.Optional[str]:
    """ISO 8601 in UTC with milliseconds and ``+00:00`` (the form the profile's shapes accept)."""
    if t is None:
        return None
    return datetime.datetime.fromtimestamp(t, datetime.timezone.utc).isoformat(timespec="milliseconds")


def encoding_format(rel: str) -> str:
    for suffix, mime in _FORMATS.items():
        if rel.endswith(suffix):
            return mime
    return "application/octet-stream"


def _ref(i: str) -> tp.Dict[str, str]:
    return {"@id": i}


def command_line(record: tp.Mapping[str, tp.Any]) -> str:
    """The submit command line as recorded (``python`` put back in front of ``-m ...``)."""
    argv = (record.get("submission") or {}).get("argv")
    if not isinstance(argv, list) or not argv:
        return ""
    return " ".join(map(str, ["python", *argv] if argv[0] == "-m" else argv))


def _action_id(a: Attempt) -> str:
    return f"#attempt-{a.index}-{_SAFE_ID.sub('_', a.label)}"


def _one_or_list(values: tp.Sequence[tp.Any]) -> tp.Any:
    """RO-Crate 1.1 recommends no one-element arrays."""
    return values[0] if len(values) == 1 else list(values)


_DESCRIBE = {
    "README.md": "How to verify and reproduce this run",
    "bundle.json": "The bundle's own record: where each part is, the chosen checkpoint, identity, approvals",
    "MANIFEST.sha256": "sha256 of every file of the bundle (sha256sum -c MANIFEST.sha256), and of itself",
    "ro-crate-preview.html": "This crate's metadata for a browser",
    "run/submission.json": "What was submitted: resolved configuration, argv, cluster, job id",
    "run/sbatch.sh": "The exact script given to sbatch",
    "run/ledger.jsonl": "One record per start, end and exit of every attempt",
    "run/metrics.jsonl": "The loss curve and per-interval step measurements",
    "run/approvals.jsonl": "The append-only, hash-chained approval log",
    "identity/submit.json": "The run identity manifest written at submit",
    "code/snapshot.tar.gz": "The code snapshot (git archive of the commit + diff + untracked files, or package files)",
    "environment/requirements.lock": "name==version of every distribution the run's Python had",
    "data/fingerprint.json": "The input data fingerprint (not the data)",
    "data/content-cache.json": "The content-tier fingerprints the run had computed",
}


def _image_reference(ref: str) -> tp.Tuple[str, str, tp.Optional[str]]:
    """``(registry, name, tag)`` of a registry reference: ``nvcr.io/nvidia/pytorch:24.01-py3``, pyxis's
    ``nvcr.io#nvidia/pytorch:24.01-py3``, ``docker://...``, ``localhost/x:latest``; no registry: docker.io."""
    ref = ref.split("://", 1)[1] if "://" in ref else ref
    ref = ref.split("@", 1)[0]  # a pinned @sha256:... is the digest, not the name
    if "#" in ref:
        registry, rest = ref.split("#", 1)
    else:
        first, _, after = ref.partition("/")
        if after and ("." in first or ":" in first or first == "localhost"):
            registry, rest = first, after
        else:
            registry, rest = "docker.io", ref
    head, _, last = rest.rpartition("/")
    name, tag = (last.split(":", 1) + [None])[:2] if ":" in last else (last, None)
    return registry, f"{head}/{name}" if head else str(name), tag


def container_image(container: tp.Optional[tp.Mapping[str, tp.Any]]) -> tp.Optional[tp.Dict[str, tp.Any]]:
    """The run's image as the Process Run Crate's ``ContainerImage`` (None: the run had no container): a docker or
    OCI reference (podman, pyxis, apptainer ``docker://``) is a ``DockerImage`` with its registry, name and tag; an
    image file (apptainer's ``.sif``, pyxis's squashfs) is a ``SIFImage`` (a squashfs: a ``DockerImage`` flattened
    by enroot) named by its file; ``sha256`` is the digest the identity recorded (podman's image id, the file's)."""
    if not isinstance(container, dict) or not isinstance(container.get("image"), str) or not container["image"]:
        return None
    image, runtime = container["image"], str(container.get("runtime") or "unknown")
    kind = container.get("kind")
    if kind == "file":
        path = str(container.get("path") or image)
        name, tag = path.rsplit("/", 1)[-1], None
        registry = "(none: a local image file)"
        squashfs = path.endswith((".sqsh", ".squashfs"))
        what = "DockerImage" if squashfs else "SIFImage"
        where = f"the image file {path}" + (" (an enroot squashfs)" if squashfs else "")
    else:
        ref = image.split(":", 1)[1] if image.startswith(("oci-archive:", "docker-archive:")) else image
        registry, name, tag = _image_reference(ref)
        what = "SIFImage" if image.startswith(("library://", "oras://", "shub://")) else "DockerImage"
        where = f"the image {image}"
    digest = container.get("digest") if isinstance(container.get("digest"), str) else None
    mounts = [str(m) for m in container.get("mounts") or []]
    version = container.get("version")
    entity: tp.Dict[str, tp.Any] = {
        "@id": CONTAINER_IMAGE_ID,
        "@type": "ContainerImage",
        "additionalType": _ref(WFRUN + what),
        "registry": registry,
        "name": name,
        "description": f"Every task ran in {where} through {runtime}"
        + (f" ({version})" if isinstance(version, str) and version else "")
        + (f"; digest {digest}" if digest else "; no digest recorded (a registry reference resolved on the node)")
        + (f"; mounts {', '.join(mounts)}" if mounts else "")
        + ".",
    }
    if tag:
        entity["tag"] = tag
    if digest and digest.startswith("sha256:"):
        entity["sha256"] = digest.split(":", 1)[1]
    return entity


def build_crate(
    *,
    record: tp.Mapping[str, tp.Any],
    files: tp.Sequence[tp.Tuple[str, tp.Optional[int]]],
    attempts: tp.Sequence[Attempt],
    identity: tp.Optional[tp.Mapping[str, tp.Any]],
    attempt_identity: tp.Mapping[tp.Tuple[str, int], tp.Mapping[str, tp.Any]],
    owner: tp.Mapping[str, tp.Optional[str]],
    license: tp.Optional[str],
    hpctrain_version: str,
    hpctrain_url: str,
    torch_version: tp.Optional[str],
    container: tp.Optional[tp.Mapping[str, tp.Any]] = None,
) -> tp.Dict[str, tp.Any]:
    """The JSON-LD document. ``files``: (path in the bundle, size or None) of every file but the metadata;
    ``container``: the submit identity's container record (:func:`hpctrain._container.image_record`), if any."""
    graph: tp.List[tp.Dict[str, tp.Any]] = []
    ck = record["checkpoint"]
    ck_dir = ck["dir"].rstrip("/") + "/"
    run_name = record.get("run_name") or "run"
    created = record["created"]

    # --- who and under which terms
    owner_name = owner.get("owner") or record.get("user") or "unknown"
    owner_id = owner.get("orcid") if (owner.get("orcid") or "").startswith("https://orcid.org/") else "#owner"
    person: tp.Dict[str, tp.Any] = {"@id": owner_id, "@type": "Person", "name": owner_name}
    team = owner.get("team")
    team_url = owner.get("team_url") or http_url(code_repo(identity).get("remote_url"))
    if team or team_url:
        org: tp.Dict[str, tp.Any] = {
            "@id": "#team",
            "@type": "Organization",
            "name": team or "the owner's team (name not recorded)",
        }
        if team_url:
            org["url"] = team_url
        if not owner.get("team_url") and team_url:
            org["description"] = "url: the run's code repository (no team URL was recorded)"
    else:
        org = derived_organisation(owner, identity, attempt_identity, record)
    person["affiliation"] = _ref(org["@id"])
    if license:
        lic_id = license if "://" in license else f"https://spdx.org/licenses/{license}"
        lic = {"@id": lic_id, "@type": "CreativeWork", "name": license.rsplit("/", 1)[-1], "identifier": license}
    else:
        lic_id = "#license"
        lic = {
            "@id": lic_id,
            "@type": "CreativeWork",
            "name": "No license stated",
            "description": f"The run's owner ({owner_name}) stated no license; ask them before reusing this bundle.",
        }

    # --- software
    hp_code = hpctrain_code(identity)
    hpctrain = {
        "@id": hpctrain_url,
        "@type": "SoftwareApplication",
        "name": "hpctrain",
        "version": hpctrain_version,
        "url": hpctrain_url,
        "description": "Slurm-native PyTorch training toolkit: launched every rank, checkpointed, recorded the run"
        + (f" (commit {hp_code['commit']})" if isinstance(hp_code.get("commit"), str) else ""),
    }
    software = [hpctrain]
    requirements = []
    if torch_version:
        torch = {
            "@id": f"https://pypi.org/project/torch/{torch_version.split('+')[0]}/",
            "@type": "SoftwareApplication",
            "name": "PyTorch",
            "version": torch_version,
            "url": "https://pytorch.org/",
        }
        software.append(torch)
        requirements.append(_ref(torch["@id"]))
    repo = code_repo(identity)
    commit = repo.get("commit") if isinstance(repo.get("commit"), str) else None
    package_hash = repo.get("sha256") if repo.get("kind") == "files" and isinstance(repo.get("sha256"), str) else None
    code_version = commit or (f"sha256:{package_hash}" if package_hash else None)
    dirty = repo.get("dirty")
    repo_url = http_url(repo.get("remote_url"))
    entry = repo.get("entry")
    instruments = []
    if repo_url:
        user_code = {
            "@id": repo_url,
            "@type": "SoftwareApplication",
            "name": str(entry or repo_url.rsplit("/", 1)[-1]),
            "url": repo_url,
            "version": (code_version or "unknown") + ("-dirty" if dirty else ""),
            "description": f"The training entry {entry or '(not recorded)'}: commit {commit or 'not recorded'}"
            + (", with uncommitted changes (in the code snapshot)" if dirty else ""),
            "softwareRequirements": _one_or_list([_ref(hpctrain_url), *requirements]),
        }
        software.append(user_code)
        instruments.append(_ref(repo_url))
    instruments.append(_ref(hpctrain_url))
    image = container_image(container)

    # --- files
    file_ids = [rel for rel, _ in files]
    ckpt_files = [rel for rel in file_ids if rel.startswith(ck_dir)]
    entities: tp.Dict[str, tp.Dict[str, tp.Any]] = {}
    for rel, size in files:
        ent: tp.Dict[str, tp.Any] = {
            "@id": rel,
            "@type": "File",
            "name": rel.rsplit("/", 1)[-1],
            "encodingFormat": encoding_format(rel),
        }
        if size is not None:
            ent["contentSize"] = str(size)
        if rel in _DESCRIBE:
            ent["description"] = _DESCRIBE[rel]
        elif rel.startswith("identity/"):
            ent["description"] = "The run identity manifest written at the start of one attempt"
        elif rel.startswith("run/submission-"):
            ent["description"] = "An earlier submission of this run (continued with submit --resume)"
        elif rel in ckpt_files:
            ent["description"] = f"Checkpoint step {ck['step']}: " + (
                "commit manifest (shard sizes and crc32)" if rel.endswith(".json") else "one rank's shard"
            )
        entities[rel] = ent
    snapshot = record.get("parts", {}).get("code_snapshot")
    if snapshot in entities and code_version:
        entities[snapshot]["version"] = code_version
        entities[snapshot]["description"] = (
            f"The code snapshot: commit {commit}" if commit else f"The code snapshot: package files {package_hash}"
        ) + (", with the uncommitted diff and untracked files" if dirty else "")
    ckpt_entity = {
        "@id": ck_dir,
        "@type": "Dataset",
        "name": f"Checkpoint step {ck['step']}",
        "description": (
            f"The committed checkpoint of step {ck['step']} as hpctrain wrote it ({ck.get('world_size')} shards); "
            f"MANIFEST.json sha256 {ck['manifest_sha256']}. Verify: python -m hpctrain ckpt verify {ck_dir}"
        ),
        "hasPart": _one_or_list([_ref(r) for r in ckpt_files]),
    }

    # --- inputs
    inputs: tp.List[tp.Dict[str, tp.Any]] = []
    for i, item in enumerate(data_files(identity)):
        desc = [f"size {item['size']} bytes" if item["size"] is not None else "size not recorded"]
        if item["content"]:
            desc.append(
                "value: sha256 over a deterministic SAMPLE of its chunks, not of the whole file"
                if item["sampled"]
                else "value: sha256 of its content"
            )
        inputs.append(
            {
                "@id": f"#input-{i}",
                "@type": "PropertyValue",
                "name": str(item["path"]),
                "value": item["content"] or "(no content hash recorded: see data/fingerprint.json)",
                "description": "Input data file fingerprint: " + "; ".join(desc),
            }
        )
    parts = record.get("parts", {})
    objects = [_ref(p["@id"]) for p in inputs]
    for key in ("data_fingerprint", "code_snapshot", "submission"):
        if parts.get(key) in entities:
            objects.append(_ref(parts[key]))

    # --- actions
    actions: tp.List[tp.Dict[str, tp.Any]] = []
    extra: tp.List[tp.Dict[str, tp.Any]] = []
    jobs: tp.Dict[str, tp.List[Attempt]] = {}
    metrics_ref = parts.get("metrics") if parts.get("metrics") in entities else None
    for a in attempts:
        jobs.setdefault(a.job_id, []).append(a)
        aid = _action_id(a)
        end, end_from = a.end_time
        start = a.start_time
        status = a.status
        where = a.where
        steps = [
            f"resumed from step {a.resumed_from_step}" if a.resumed_from_step is not None else None,
            f"reached step {a.step}" if a.step is not None else None,
            f"committed step {a.committed_step}" if a.committed_step is not None else None,
        ]
        how = {
            "completed": "completed",
            "stopped": "stopped cleanly",
            "failed": "failed",
            "killed": "killed without an end record",
            "unknown": "no end record (still running, or killed)",
        }[status]
        if a.cause:
            how += f" ({a.cause.replace('_', ' ')}{', requeued' if a.requeued else ''})"
        hosts = ", ".join(a.hosts) or "hosts not recorded"
        command = f" Submitted as: {command_line(record)}." if command_line(record) else ""
        description = (
            f"{where}, restart {a.restart_count}: {a.world_size or '?'} ranks on {hosts}; "
            + ", ".join(s for s in steps if s)
            + f"; {how}."
            + (f" End time from the {end_from}." if end_from and end_from != "end record" else "")
            + command
        )
        action: tp.Dict[str, tp.Any] = {
            "@id": aid,
            "@type": "CreateAction",
            "name": f"Training attempt {a.index}: {a.label} ({status})",
            "description": description,
            "agent": _ref(owner_id),
            "instrument": _one_or_list(instruments),
        }
        if image is not None:
            action["containerImage"] = _ref(image["@id"])
        if start is not None:
            action["startTime"] = iso(start)
        if end is not None:
            action["endTime"] = iso(end)
        if status in ("completed", "stopped"):
            action["actionStatus"] = COMPLETED  # a literal: what the profile's SHACL shape compares with
        elif status in ("failed", "killed"):
            action["actionStatus"] = FAILED
            action["error"] = (a.error or "failed")[:1000]
        if objects:
            action["object"] = _one_or_list(objects)
        results = []
        resumed = a.resumed_from_step if a.resumed_from_step is not None else -1
        if a.committed_step is not None and a.committed_step >= ck["step"] > resumed:
            results.append(_ref(ck_dir))
        if a.committed_step is not None:
            pv = {
                "@id": f"{aid}-committed",
                "@type": "PropertyValue",
                "name": "committed_step",
                "value": a.committed_step,
                "description": "The newest checkpoint step committed when the attempt ended",
            }
            extra.append(pv)
            results.append(_ref(pv["@id"]))
        if metrics_ref:
            results.append(_ref(metrics_ref))
        if results:
            action["result"] = _one_or_list(results)
        env = slurm_environment(attempt_identity.get(a.key))
        if env:
            env_refs = []
            for name, value in env.items():
                pv = {"@id": f"{aid}-env-{name}", "@type": "PropertyValue", "name": name, "value": value}
                extra.append(pv)
                env_refs.append(_ref(pv["@id"]))
            action["environment"] = _one_or_list(env_refs)
        actions.append(action)
    for job, its in jobs.items():
        starts = [a.start_time for a in its if a.start_time is not None]
        ends = [a.end_time[0] for a in its if a.end_time[0] is not None]
        org_action: tp.Dict[str, tp.Any] = {
            "@id": f"#job-{_SAFE_ID.sub('_', job or 'local')}",
            "@type": "OrganizeAction",
            "name": its[0].where[:1].upper() + its[0].where[1:],
            "description": f"{len(its)} attempt(s): "
            + ", ".join(f"restart {a.restart_count} {a.status}" + (" (requeued)" if a.requeued else "") for a in its),
            "agent": _ref(owner_id),
            "instrument": _ref(hpctrain_url),
            "result": _one_or_list([_ref(_action_id(a)) for a in its]),
        }
        sub = [_ref(parts[k]) for k in ("submission", "sbatch_script") if parts.get(k) in entities]
        if sub:
            org_action["object"] = _one_or_list(sub)
        if starts:
            org_action["startTime"] = iso(min(starts))
        if ends:
            org_action["endTime"] = iso(max(ends))
        actions.append(org_action)

    # --- the root
    identity_hash = record.get("run_identity")
    held = [
        what
        for key, what in (
            ("code_snapshot", "code snapshot"),
            ("environment_lock", "environment lock"),
            ("data_fingerprint", "data fingerprint"),
        )
        if parts.get(key) in entities
    ]
    desc = [
        f"The recoverable training bundle of run {run_name}: "
        + ", ".join([*held, f"committed checkpoint of step {ck['step']}"])
        + f", metrics, ledger of {len(attempts)} attempt(s) and approvals.",
        f"Owner: {owner_name}" + (f" ({team})" if team else "") + ".",
        f"Run identity: {identity_hash}." if identity_hash else "Run identity: not recorded.",
    ]
    if owner.get("notes"):
        desc.append(f"Notes: {owner['notes']}")
    desc.append("Verify with: python -m hpctrain bundle verify <this directory>.")
    root: tp.Dict[str, tp.Any] = {
        "@id": "./",
        "@type": "Dataset",
        "name": f"hpctrain run {run_name}, checkpoint step {ck['step']}",
        "description": " ".join(desc),
        "datePublished": iso(created),
        "license": _ref(lic_id),
        "author": _ref(owner_id),
        "conformsTo": _ref(PROFILE),
        "hasPart": [_ref(r) for r in file_ids] + [_ref(ck_dir)],
        "mentions": _one_or_list([_ref(a["@id"]) for a in actions]),
    }
    if identity_hash:
        root["identifier"] = f"hpctrain-run-identity:{identity_hash}"
    root["publisher"] = _ref(org["@id"])
    graph = [
        {"@id": "ro-crate-metadata.json", "@type": "CreativeWork", "conformsTo": _ref(RO_CRATE), "about": _ref("./")},
        root,
        {"@id": PROFILE, "@type": "CreativeWork", "name": "Process Run Crate", "version": "0.5"},
        lic,
        person,
        org,
        *software,
        *([image] if image is not None else []),
        *entities.values(),
        ckpt_entity,
        *inputs,
        *actions,
        *extra,
    ]
    terms = {"environment": WFRUN_ENVIRONMENT}
    if image is not None:
        terms.update({t: WFRUN + t for t in _CONTAINER_TERMS})
    return {"@context": [f"{RO_CRATE}/context", terms], "@graph": graph}


DERIVED_ORG = "#organisation"
"""The id of an organisation the crate derived (no team recorded): the site, the Slurm account, or a placeholder."""


def _first(values: tp.Iterable[tp.Any], limit: int = 200) -> tp.Optional[str]:
    for v in values:
        if isinstance(v, str) and v.strip() and len(v) <= limit and not re.search(r"[\x00-\x1f\x7f]", v):
            return v.strip()
    return None


def _host_domain(
    identity: tp.Optional[tp.Mapping[str, tp.Any]], records: tp.Sequence[tp.Mapping[str, tp.Any]], bundled_on: tp.Any
) -> tp.Tuple[tp.Optional[str], tp.Optional[str]]:
    """``(host, domain)``: the first recorded host name with a domain (the attempts' nodes, then where the bundle
    was written), else the first recorded host name and no domain."""
    hosts: tp.List[tp.Any] = []
    for r in records:
        runtime = r.get("runtime") if isinstance(r.get("runtime"), dict) else {}
        names = runtime.get("hostnames") if isinstance(runtime.get("hostnames"), list) else []
        hosts += [runtime.get("host"), *names]
    hosts.append(bundled_on)
    named = [h.strip(".").lower() for h in hosts if isinstance(h, str) and _HOST.match(h.strip("."))]
    host = next((h for h in named if "." in h), named[0] if named else None)
    return host, (host.split(".", 1)[1] if host and "." in host else None)


def derived_organisation(
    owner: tp.Mapping[str, tp.Optional[str]],
    identity: tp.Optional[tp.Mapping[str, tp.Any]],
    attempt_identity: tp.Mapping[tp.Tuple[str, int], tp.Mapping[str, tp.Any]],
    record: tp.Mapping[str, tp.Any],
) -> tp.Dict[str, tp.Any]:
    """The crate's organisation when the run records no team: the site (the Slurm cluster name its attempts
    recorded, ``SLURM_CLUSTER_NAME``), else the Slurm account the job was charged to (``--account``,
    ``SLURM_JOB_ACCOUNT``), else a placeholder named after the host domain. Its ``url`` is a ``urn:`` that
    locates nothing. Its description says where both came
    from: roc-validator's recommended level asks for a publisher, an author affiliation and an organisation URL,
    and a crate must not pass off a guess as the owner's team."""
    records = [*reversed(list(attempt_identity.values())), *([identity] if identity else [])]
    envs = [slurm_environment(r) for r in records]
    created_by = record.get("created_by") if isinstance(record.get("created_by"), dict) else {}
    host, domain = _host_domain(identity, records, created_by.get("host"))
    cluster = _first(e.get("SLURM_CLUSTER_NAME") for e in envs)
    account = _first([owner.get("account"), *(e.get("SLURM_JOB_ACCOUNT") for e in envs)])
    if cluster:
        name = f"Slurm cluster {cluster}"
        source = (
            f"the site that ran the job: the Slurm cluster name its attempts recorded (SLURM_CLUSTER_NAME={cluster})"
        )
        slug = f"slurm-cluster:{cluster}"
    elif account:
        name = f"Slurm account {account}"
        source = f"the Slurm account the job was charged to ({account}; the run recorded no cluster name)"
        slug = f"slurm-account:{account}"
    else:
        where = domain or host or "an unrecorded host"
        name = f"Unknown organisation at {where} (placeholder)"
        source = (
            f"a placeholder, not a recorded organisation: derived from the host {host or '(not recorded)'} the run "
            "was recorded on, because the run recorded no team, Slurm cluster name or account"
        )
        slug = f"host:{where}"
    # A urn, never a web address guessed from the host domain: a provenance record says what it knows, and a
    # guessed https URL would read as a checked one.
    url = "urn:hpctrain:organisation:" + _SAFE_ID.sub("_", slug.replace(":", "-"))
    how_url = "url: a urn that names the source and locates nothing (no team URL was given)"
    return {
        "@id": DERIVED_ORG,
        "@type": "Organization",
        "name": name,
        "url": url,
        "description": f"Organisation derived by hpctrain bundle, since the run recorded no team: {source}; {how_url}. "
        "Give submit --team NAME and bundle --team-url URL to name the owner's team instead.",
    }


def crate_gaps(crate: tp.Mapping[str, tp.Any]) -> tp.List[str]:
    """What the crate lacks that only the user can supply (it passes roc-validator's recommended level without)."""
    gaps = []
    for e in crate["@graph"]:
        if e.get("@type") == "Organization" and e.get("@id") == DERIVED_ORG:
            gaps.append(
                f"the run records no team: the crate's organisation is {e.get('name')}, derived from what the run "
                "knows; give --team-url URL (and submit --team NAME) to name the owner's team"
            )
        elif e.get("@type") == "Organization" and "url" not in e:
            gaps.append("the team has no URL: give --team-url URL for the crate's organisation")
    return gaps


# ---------------------------------------------------------------------------------------------- preview
_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:2em auto;max-width:72em;color:#222}
h1{font-size:1.5em}h2{font-size:1.15em;margin-top:1.6em;border-bottom:1px solid #ccc}
table{border-collapse:collapse;width:100%;font-size:.9em}td,th{border:1px solid #ddd;padding:.3em .5em;
text-align:left;vertical-align:top}th{background:#f3f3f3}code{font-size:.9em;word-break:break-all}
.ok{color:#176717}.bad{color:#a11}.muted{color:#666}
"""


def _e(value: tp.Any) -> str:
    return html.escape("" if value is None else str(value), quote=True)


def _table(headers: tp.Sequence[str], rows: tp.Iterable[tp.Sequence[tp.Any]]) -> str:
    head = "".join(f"<th>{_e(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{_e(c)}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def preview_html(crate: tp.Mapping[str, tp.Any], record: tp.Mapping[str, tp.Any]) -> str:
    """A self-contained page (inline CSS, no script, no external resource): every value HTML-escaped."""
    by_id = {e["@id"]: e for e in crate["@graph"]}
    root = by_id["./"]
    actions = [e for e in crate["@graph"] if e.get("@type") == "CreateAction"]
    jobs = [e for e in crate["@graph"] if e.get("@type") == "OrganizeAction"]
    files = [e for e in crate["@graph"] if e.get("@type") == "File"]
    software = [e for e in crate["@graph"] if e.get("@type") == "SoftwareApplication"]
    images = [e for e in crate["@graph"] if e.get("@type") == "ContainerImage"]
    status = {COMPLETED: "completed", FAILED: "failed"}
    ck = record["checkpoint"]
    approvals = record.get("approvals") or {}
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{_e(root.get('name'))}</title><style>{_CSS}</style></head><body>",
        f"<h1>{_e(root.get('name'))}</h1>",
        f"<p>{_e(root.get('description'))}</p>",
        _table(
            ("", ""),
            [
                ("Published", root.get("datePublished")),
                ("Author", by_id.get(root.get("author", {}).get("@id"), {}).get("name")),
                ("License", by_id.get(root.get("license", {}).get("@id"), {}).get("name")),
                ("Run identity", record.get("run_identity") or "not recorded"),
                ("Checkpoint", f"step {ck['step']} · MANIFEST.json sha256 {ck['manifest_sha256']}"),
                ("Approvals", f"{approvals.get('entries', 0)} entries · head {approvals.get('head') or '-'}"),
                ("Conforms to", f"{RO_CRATE} · {PROFILE}"),
                *[("Container image", f"{c.get('name')} · {c.get('description')}") for c in images],
            ],
        ),
        "<h2>Attempts (one CreateAction each)</h2>",
        _table(
            ("attempt", "status", "start", "end", "what happened"),
            [
                (
                    a.get("name"),
                    status.get(a.get("actionStatus"), "unknown"),
                    a.get("startTime"),
                    a.get("endTime"),
                    a.get("description"),
                )
                for a in actions
            ],
        ),
        "<h2>Jobs</h2>",
        _table(
            ("job", "start", "end", "attempts"),
            [(j.get("name"), j.get("startTime"), j.get("endTime"), j.get("description")) for j in jobs],
        ),
        "<h2>Software</h2>",
        _table(("name", "version", "id"), [(s.get("name"), s.get("version"), s.get("@id")) for s in software]),
        "<h2>Files</h2>",
        _table(
            ("path", "bytes", "format", "what"),
            [(f["@id"], f.get("contentSize", ""), f.get("encodingFormat"), f.get("description", "")) for f in files],
        ),
        "<h2>Verify</h2>",
        "<p><code>python -m hpctrain bundle verify BUNDLE</code> checks every file's sha256, the checkpoint's "
        "own checksums, the approval chain and the identity manifests; <code>sha256sum -c MANIFEST.sha256</code> "
        "checks the files without hpctrain.</p>",
        '<h2>Metadata</h2><pre class="muted">' + _e(json.dumps(crate, indent=1)) + "</pre>",
        "</body></html>",
        "",
    ]
    return "\n".join(parts)
