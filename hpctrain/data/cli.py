"""``python -m hpctrain data inspect|synth|hash``: login-node tools. h5py/numpy/rich only; never imports torch."""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import typing as tp

import numpy as np

from hpctrain._cli import FORCE_HINT, add_json_flag, add_output, add_subcommands, command_parser, print_json
from hpctrain._human import fmt_bytes
from hpctrain._lustre import LustreCommands
from hpctrain._output import output_file
from hpctrain.data._h5 import DAMAGE_ERRORS, TORCH_DTYPES, damaged, open_h5
from hpctrain.data._resolve import dataset_files, open_dataset
from hpctrain.errors import UsageError

__all__ = ["main", "build_parser", "inspect_file", "SCHEMAS"]

SCHEMAS = {"inspect": "hpctrain.data.inspect/1", "synth": "hpctrain.data.synth/1", "hash": "hpctrain.data.hash/1"}
"""The ``schema`` of each sub-command's ``--json`` object."""

MiB = 1 << 20
_ONE_OST_WARN_BYTES = 1 << 30  # a file this large on one OST serialises every reader on one server


def _datasets(f: tp.Any, warnings: tp.List[str]) -> tp.List[tp.Tuple[str, tp.Any, tp.Optional[str]]]:
    """Every dataset reachable in ``f`` as (name, dataset, link description or None). Soft and external
    links are followed (the loader follows them); a dangling one becomes a warning, not an error."""
    import h5py

    found: tp.List[tp.Tuple[str, tp.Any, tp.Optional[str]]] = []

    def visit(name: str, link: tp.Any) -> None:
        # never raise here: an exception inside libhdf5's iteration comes back as a SystemError
        try:
            if isinstance(link, h5py.HardLink):
                obj = f.get(name)
                if isinstance(obj, h5py.Dataset):
                    found.append((name, obj, None))
                return
            if isinstance(link, h5py.ExternalLink):
                kind, target = "external link", f"{link.filename}:{link.path}"
            elif isinstance(link, h5py.SoftLink):
                kind, target = "soft link", str(link.path)
            else:
                warnings.append(f"{name}: a link of a type h5py cannot read; the loader refuses this key")
                return
            try:
                obj = f[name]
            except DAMAGE_ERRORS:
                warnings.append(f"{name}: dangling {kind} to {target}; the loader refuses this key")
                return
            if isinstance(obj, h5py.Dataset):
                found.append((name, obj, f"{kind} to {target}"))
        except DAMAGE_ERRORS as exc:
            warnings.append(f"{name}: cannot be read ({' '.join(str(exc).split())[:160]})")

    try:
        f.visititems_links(visit)
    except DAMAGE_ERRORS as exc:
        warnings.append(f"the file's structure could not be read completely: {' '.join(str(exc).split())[:160]}")
    return found


def _describe(path: str, name: str, ds: tp.Any, link: tp.Optional[str], warnings: tp.List[str]) -> tp.Dict[str, tp.Any]:
    chunk_bytes = int(np.prod(ds.chunks, dtype=np.int64)) * ds.dtype.itemsize if ds.chunks else None
    row = {
        "key": name,
        "shape": [int(n) for n in ds.shape] if ds.shape is not None else None,
        "dtype": str(ds.dtype),
        "chunks": [int(c) for c in ds.chunks] if ds.chunks else None,
        "chunk_bytes": chunk_bytes,
        "compression": ds.compression,
        "compression_opts": ds.compression_opts if isinstance(ds.compression_opts, (int, type(None))) else None,
        "nbytes": int(ds.size or 0) * ds.dtype.itemsize,
        "link": link,
        "virtual": bool(ds.is_virtual),
    }
    if ds.shape is None or ds.ndim == 0:
        warnings.append(f"{name}: scalar or empty dataset, cannot be read by sample")
        return row
    if ds.dtype.hasobject or ds.dtype.fields is not None or ds.dtype.newbyteorder("=").str not in TORCH_DTYPES:
        warnings.append(f"{name}: dtype {ds.dtype} cannot be held by a torch tensor; the loader refuses this key")
    try:
        dataset_files(path, ds)
    except UsageError as exc:  # missing VDS source, external raw storage
        warnings.append(f"{name}: {str(exc).split(': ', 1)[-1]}")
    if ds.chunks:
        if tuple(ds.chunks[1:]) != tuple(ds.shape[1:]):
            warnings.append(
                f"{name}: chunks {list(ds.chunks)} split a sample {list(ds.shape[1:])}; "
                f"each sample read touches several chunks (rechunk to (k, *sample_shape))"
            )
        if chunk_bytes is not None and row["nbytes"] >= MiB and not MiB <= chunk_bytes <= 8 * MiB:
            warnings.append(
                f"{name}: chunk is {fmt_bytes(chunk_bytes)}, outside the 1-8 MiB sweet spot for parallel filesystems"
            )
    return row


def inspect_file(
    path: str, keys: tp.Optional[tp.Sequence[str]] = None, lustre: tp.Optional[LustreCommands] = None
) -> tp.Dict[str, tp.Any]:
    """Describe a file's datasets and list the warnings a loader user should act on (JSON-able).

    ``keys``: only these datasets (an error names a missing one); ``lustre``: the ``lfs`` seam (a fake in
    tests), used for the stripe layout when the Lustre client exists."""
    rows: tp.List[tp.Dict[str, tp.Any]] = []
    warnings: tp.List[str] = []
    with open_h5(path) as f:
        try:
            chosen = [(k, open_dataset(path, f, k), None) for k in keys] if keys else _datasets(f, warnings)
        except DAMAGE_ERRORS as exc:
            raise damaged(path, exc) from None
        for name, ds, link in chosen:
            try:
                rows.append(_describe(path, name, ds, link, warnings))
            except DAMAGE_ERRORS as exc:  # damaged metadata
                warnings.append(f"{name}: metadata cannot be read ({' '.join(str(exc).split())[:160]})")
        lengths = {r["key"]: r["shape"][0] for r in rows if r["shape"]}
        if len(set(lengths.values())) > 1:
            warnings.append(
                "datasets differ in length along axis 0: " + ", ".join(f"{k}={n}" for k, n in lengths.items())
            )
    size = os.path.getsize(path)
    stripe = (lustre or LustreCommands()).stripe(path)
    if stripe is not None and stripe.count == 1 and size > _ONE_OST_WARN_BYTES:
        warnings.append(
            f"{fmt_bytes(size)} on a single OST (stripe {stripe}); ask your centre about striping or a PFL layout"
        )
    return {
        "path": path,
        "size": size,
        "stripe": None if stripe is None else {"count": stripe.count, "size": stripe.size},
        "datasets": rows,
        "warnings": warnings,
    }


def _inspect(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    keys = [k for k in args.keys.split(",") if k] if args.keys else None
    reports = [inspect_file(path, keys) for path in args.files]  # every file checked before any output
    if args.json:
        print_json({"files": reports}, schema=SCHEMAS["inspect"])
        return 0
    console = Console()
    code = 0
    for info in reports:
        stripe = info["stripe"]
        title = f"{escape(str(info['path']))}  ({fmt_bytes(info['size'])}" + (
            f", stripe {stripe['count']} x {fmt_bytes(stripe['size'])})" if stripe else ")"
        )
        table = Table(title=title, title_justify="left")
        for col in ("key", "shape", "dtype", "chunks", "chunk", "compression"):
            table.add_column(col)
        for r in info["datasets"]:
            comp = r["compression"] or "-"
            if r["compression_opts"] is not None:
                comp += f" ({r['compression_opts']})"
            table.add_row(
                escape(r["key"])
                + (f" -> {escape(r['link'])}" if r["link"] else "")
                + (" (virtual)" if r["virtual"] else ""),
                str(tuple(r["shape"] or ())),
                escape(r["dtype"]),
                str(tuple(r["chunks"])) if r["chunks"] else "contiguous",
                fmt_bytes(r["chunk_bytes"]) if r["chunk_bytes"] else "-",
                comp,
            )
        console.print(table)
        for w in info["warnings"]:
            console.print(f"[yellow]warning:[/yellow] {escape(w)}", highlight=False)
    return code


def _positive_ints(text: str, flag: str) -> tp.Tuple[int, ...]:
    parts = [p.strip() for p in text.split(",")] if text.strip() else []
    if not all(p.isdigit() and int(p) > 0 for p in parts):
        raise UsageError(f"data synth: {flag} {text!r} must be positive integers separated by commas, e.g. 3,32,32")
    return tuple(int(p) for p in parts)


_SYNTH_MAX_SAMPLE_BYTES = 1 << 30  # synth holds at least one sample in memory while writing


def _synth(args: argparse.Namespace) -> int:
    from hpctrain.data.synth import make_dataset

    if (args.out is None) == (args.output is None):
        raise UsageError("data synth: name the file to write once: -o OUT.h5 (or the older positional OUT.h5)")
    out_name = args.output if args.output is not None else args.out
    shape = _positive_ints(args.shape, "--shape")
    if args.samples < 0:
        raise UsageError(f"data synth: --samples must be >= 0, got {args.samples}")
    try:
        dtype = np.dtype(args.dtype)
    except (TypeError, ValueError):
        dtype = None
    if dtype is None or dtype.kind not in "fiu" or dtype.str not in TORCH_DTYPES:
        raise UsageError(
            f"data synth: --dtype {args.dtype!r} is not a numeric type the loader can read; "
            f"use float32, float16, float64, int8-64 or uint8-64"
        )
    if args.chunk_samples < 0:
        raise UsageError(f"data synth: --chunk-samples must be >= 1 (or 0 for the default), got {args.chunk_samples}")
    if not 0 <= args.level <= 9:
        raise UsageError(f"data synth: --level must be a gzip level 0-9, got {args.level}")
    comp = None if args.compression == "none" else args.compression
    sample_bytes = dtype.itemsize * int(np.prod(shape, dtype=object))
    if sample_bytes > _SYNTH_MAX_SAMPLE_BYTES:
        raise UsageError(
            f"data synth: one sample of --shape {args.shape} is {sample_bytes / 2**30:.3g} GiB; lower --shape"
        )
    # the one owner of user-named outputs: a file is replaced atomically, a symlink's target written, a device or
    # FIFO written through; a directory or a parent that is not one is one line, before anything is written
    target = output_file(out_name, overwrite=args.force, label="data synth: ", hint=FORCE_HINT)
    if target.to_stdout and args.json:
        raise UsageError("data synth: -o names standard output, where --json prints the summary; name a file")
    parent = tempfile.gettempdir() if target.stream else os.fspath(target.path.parent)
    total = (sample_bytes + 8) * args.samples
    free = os.statvfs(parent).f_bavail * os.statvfs(parent).f_frsize
    if comp is None and total > free:
        raise UsageError(
            f"data synth: {args.samples} samples need {total / 2**30:.3g} GiB but {parent} has {free / 2**30:.3g} "
            f"GiB free; lower --samples or --shape"
        )
    target.write_with(
        lambda tmp: make_dataset(
            tmp,
            args.samples,
            shape=shape,
            dtype=dtype.name,
            chunk_samples=args.chunk_samples or None,
            compression=comp,
            level=args.level,
            seed=args.seed,
        )
    )
    chunk = min(args.chunk_samples or 64, max(1, args.samples))
    if args.json:
        summary = {
            "output": out_name,
            "samples": args.samples,
            "shape": list(shape),
            "dtype": dtype.name,
            "chunk_samples": chunk if comp or args.chunk_samples else None,
            "compression": comp,
            "bytes": target.size,
        }
        print_json(summary, schema=SCHEMAS["synth"])
        return 0
    print(
        f"wrote {out_name}: {args.samples} samples of x{list(shape)} {dtype.name} + y int64, "
        f"{f'chunk {chunk}' if comp or args.chunk_samples else 'contiguous'}"
        f"{', ' + comp if comp else ''} ({fmt_bytes(target.size)})",
        file=sys.stderr if target.to_stdout else sys.stdout,
    )
    return 0


def _hash(args: argparse.Namespace) -> int:
    """A full sha256 of each file (every byte; the run identity's content tier is only a sample)."""
    from hpctrain.data.fingerprint import full_hash

    for path in args.files:  # every name checked before the first (slow) read
        if not os.path.exists(path):
            raise UsageError(f"data hash: {path}: no such file; check the path")
        if not os.path.isfile(path):
            raise UsageError(f"data hash: {path}: not a regular file; give files")
    results = []
    for path in args.files:
        result = full_hash(path)
        results.append(result)
        if not args.json:
            print(f"{result['sha256']}  {path}", flush=True)  # sha256sum's format
    if args.json:
        print_json({"files": results}, schema=SCHEMAS["hash"])
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = command_parser(
        "data", "Inspect HDF5 inputs, hash them (the run identity's full content tier), and synthesise demo datasets."
    )
    sub = add_subcommands(parser)
    p = sub.add_parser("inspect", help="keys, shapes, dtypes, chunking, compression, stripes, warnings")
    p.add_argument("files", nargs="+", metavar="FILE")
    p.add_argument("--keys", help="comma-separated dataset names (default: all)")
    add_json_flag(p)
    p.set_defaults(fn=_inspect)
    s = sub.add_parser("synth", help="write a demo/benchmark dataset (x float32 samples, y int64 labels)")
    s.add_argument("out", nargs="?", metavar="OUT.h5", help="the older spelling of -o OUT.h5")
    add_output(s, kind="file", help="the HDF5 file")
    s.add_argument("--samples", type=int, required=True, help="samples to write")
    s.add_argument("--shape", default="3,32,32", help="sample shape, comma-separated (default 3,32,32)")
    s.add_argument("--dtype", default="float32")
    s.add_argument(
        "--chunk-samples", type=int, default=0, help="samples per chunk (default: contiguous, or 64 with compression)"
    )
    s.add_argument("--compression", choices=("none", "gzip", "lzf"), default="none")
    s.add_argument("--level", type=int, default=4, help="gzip level (default 4)")
    s.add_argument("--seed", type=int, default=0)
    add_json_flag(s)
    s.set_defaults(fn=_synth)
    h = sub.add_parser("hash", help="full sha256 of every byte of each file (sha256sum's output; --json: size, time)")
    h.add_argument("files", nargs="+", metavar="FILE")
    add_json_flag(h)
    h.set_defaults(fn=_hash)
    return parser


def main(argv: tp.Optional[tp.Sequence[str]] = None) -> int:
    args = build_parser().parse_args(list(argv) if argv is not None else None)
    return int(args.fn(args))
