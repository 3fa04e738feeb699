"""Which bytes a key names, and whether they are still the bytes the scan saw.

- Links are followed component by component, so a dangling soft or external link is one clear error
  naming the link, not a ``KeyError`` from deep inside h5py.
- A dataset reached through an external link lives in *another file*: its byte offset is an offset in
  that file, so the contiguous ``preadv`` path (which reads the file named in the config) must not be
  used for it. :func:`dataset_files` reports that file so the reader goes through libhdf5 instead.
- A virtual dataset (VDS) whose source file or dataset is missing reads as fill values without any error
  in libhdf5; such a dataset is refused here. Data in external *raw* files (``external=`` storage) is
  resolved by libhdf5 relative to the process's working directory, which workers need not share: refused.
- The identity of every file (device, inode, size, mtime) is recorded at the scan; a worker that opens the
  file later compares it, so a file regenerated after ``H5Loader()`` is an error instead of wrong data.

numpy + h5py only (the login-node CLI uses this).
"""

from __future__ import annotations

import os
import typing as tp

from hpctrain.errors import HpctrainError, UsageError

__all__ = ["Identity", "identity", "open_identity", "open_dataset", "dataset_files", "check_identity"]

Identity = tp.Tuple[int, int, int, int]
"""(st_dev, st_ino, st_size, st_mtime_ns): a regenerated or replaced file differs in at least one."""


def identity(st: os.stat_result) -> Identity:
    return (int(st.st_dev), int(st.st_ino), int(st.st_size), int(st.st_mtime_ns))


def open_identity(f: tp.Any) -> Identity:
    """Identity of the file libhdf5 actually opened for ``f`` (its descriptor, so a rename cannot race)."""
    try:
        return identity(os.fstat(int(f.id.get_vfd_handle())))
    except (OSError, ValueError, TypeError, RuntimeError):  # a driver without a POSIX descriptor
        return identity(os.stat(f.filename))


def _describe_link(link: tp.Any) -> str:
    import h5py

    if isinstance(link, h5py.ExternalLink):
        return f"an external link to {link.path!r} in file {link.filename!r}"
    if isinstance(link, h5py.SoftLink):
        return f"a soft link to {link.path!r}"
    return "a hard link"


def open_dataset(path: str, f: tp.Any, key: str) -> tp.Any:
    """``f[key]`` as an ``h5py.Dataset``, or a one-line :class:`UsageError` naming what is wrong."""
    import h5py

    parts = [p for p in key.split("/") if p]
    if not parts:
        raise UsageError(f"{path}: key {key!r} names no dataset; fix H5DataConfig.keys")
    node: tp.Any = f
    for i, part in enumerate(parts):
        here = "/".join(parts[: i + 1])
        try:
            link = node.get(part, getlink=True)
        except (KeyError, OSError, ValueError, RuntimeError, TypeError) as exc:
            raise UsageError(f"{path}: cannot look up {here!r}: {' '.join(str(exc).split())[:160]}") from None
        if link is None:
            have = sorted(node.keys())[:10] if isinstance(node, h5py.Group) else []
            raise UsageError(
                f"{path}: key {key!r} not found ({'/'.join(parts[:i]) or 'top-level'} entries: "
                f"{', '.join(have) or 'none'}); fix H5DataConfig.keys"
            )
        try:
            node = node[part]
        except (KeyError, OSError, ValueError, RuntimeError, TypeError):
            raise UsageError(
                f"{path}: {here!r} is {_describe_link(link)} that does not resolve (missing file or object); "
                f"fix the link or copy the data into {os.path.basename(path)}"
            ) from None
        if i < len(parts) - 1 and not isinstance(node, h5py.Group):
            raise UsageError(f"{path}: {here!r} is not a group, so {key!r} cannot exist; fix H5DataConfig.keys")
    if isinstance(node, h5py.Group):
        raise UsageError(f"{path}: {key!r} is a group, not a dataset; name the dataset inside it")
    if not isinstance(node, h5py.Dataset):
        raise UsageError(f"{path}: {key!r} is a {type(node).__name__}, not a dataset")
    return node


def _vds_source(path: str, name: str) -> tp.Optional[str]:
    """The source file libhdf5 would open for a VDS mapping (``.``: the file itself), or None."""
    if name == ".":
        return path
    if os.path.isabs(name):
        return name if os.path.isfile(name) else None
    prefix = os.environ.get("HDF5_VDS_PREFIX")
    origin = os.path.dirname(os.path.abspath(path))
    candidates = [os.path.join(prefix.replace("${ORIGIN}", origin), name)] if prefix else []
    candidates += [os.path.join(origin, name), os.path.abspath(name)]
    return next((c for c in candidates if os.path.isfile(c)), None)


def dataset_files(path: str, ds: tp.Any) -> tp.Dict[str, Identity]:
    """Files other than ``path`` whose bytes reading ``ds`` returns, with their identities.

    Raises a one-line :class:`UsageError` for storage the loader cannot read exactly as h5py does."""
    import h5py

    key = ds.name
    if ds.external:
        raise UsageError(
            f"{path}: {key!r} keeps its data in external raw files ({ds.external[0][0]!r}, ...), which libhdf5 "
            f"finds relative to the working directory; copy it into the file (h5repack) to train on it"
        )
    deps: tp.Dict[str, Identity] = {}
    home = os.path.realpath(ds.file.filename)
    if home != os.path.realpath(path):  # reached through an external link
        deps[home] = open_identity(ds.file)
    if ds.is_virtual:
        for src in ds.virtual_sources():
            found = _vds_source(path, src.file_name)
            if found is None:
                raise UsageError(
                    f"{path}: virtual dataset {key!r} maps source file {src.file_name!r}, which does not exist "
                    f"(libhdf5 would return fill values); restore the source files or rebuild the dataset"
                )
            real = os.path.realpath(found)
            try:
                if real == os.path.realpath(path) or real == home:
                    ok = isinstance(ds.file.get(src.dset_name), h5py.Dataset)
                else:
                    with h5py.File(found, "r", locking=False) as sf:
                        ok = isinstance(sf.get(src.dset_name), h5py.Dataset)
                        deps[real] = open_identity(sf)
            except (OSError, KeyError, ValueError, RuntimeError):
                ok = False
            if not ok:
                raise UsageError(
                    f"{path}: virtual dataset {key!r} maps {src.dset_name!r} in {found}, which cannot be read "
                    f"(libhdf5 would return fill values); restore the source or rebuild the dataset"
                )
    return deps


def check_identity(path: str, recorded: Identity, now: Identity) -> None:
    """Raise when a file is no longer the one the loader scanned (regenerated, replaced, grown, touched)."""
    if tuple(recorded) == tuple(now):
        return
    names = ("device", "inode", "size", "mtime_ns")
    what = ", ".join(f"{n} {a} -> {b}" for n, a, b in zip(names, recorded, now) if a != b)
    raise HpctrainError(
        f"{path}: the file changed after the loader scanned it ({what}): it was regenerated or replaced while "
        f"the job ran; do not rewrite input files under a running loader, and create the H5Loader again"
    )
