"""``python -m hpctrain data inspect|synth``: login-node tools. h5py/numpy/rich only; never imports torch."""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import typing as tp

import numpy as np

from hpctrain._cli import add_subcommands, command_parser
from hpctrain.data._h5 import open_h5
from hpctrain.errors import UsageError

__all__ = ["main", "inspect_file"]

MiB = 1 << 20


def _stripe(path: str) -> tp.Optional[str]:
    """``count x size`` from ``lfs getstripe`` when the Lustre client tools exist, else None."""
    if shutil.which("lfs") is None:
        return None
    try:
        out = subprocess.run(["lfs", "getstripe", "-c", "-S", path], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return None
    parts = out.stdout.split()
    if out.returncode != 0 or len(parts) < 2:
        return None
    return f"{parts[0]} x {int(parts[1]) // 1024} KiB" if parts[1].isdigit() else " ".join(parts[:2])


def inspect_file(path: str, keys: tp.Optional[tp.Sequence[str]] = None) -> tp.Dict[str, tp.Any]:
    """Describe a file's datasets and list the warnings a loader user should act on (JSON-able)."""
    import h5py

    rows: tp.List[tp.Dict[str, tp.Any]] = []
    warnings: tp.List[str] = []
    with open_h5(path) as f:
        if keys:
            names = list(keys)
            for k in names:
                if k not in f or not isinstance(f[k], h5py.Dataset):
                    raise UsageError(f"{path}: key {k!r} not found or not a dataset")
        else:
            names = []
            f.visititems(lambda name, obj: names.append(name) if isinstance(obj, h5py.Dataset) else None)
        for name in names:
            ds = f[name]
            chunk_bytes = int(np.prod(ds.chunks, dtype=np.int64)) * ds.dtype.itemsize if ds.chunks else None
            row = {
                "key": name,
                "shape": list(ds.shape),
                "dtype": str(ds.dtype),
                "chunks": list(ds.chunks) if ds.chunks else None,
                "chunk_bytes": chunk_bytes,
                "compression": ds.compression,
                "compression_opts": ds.compression_opts,
                "nbytes": int(ds.size) * ds.dtype.itemsize,
            }
            rows.append(row)
            if ds.ndim == 0:
                warnings.append(f"{name}: scalar dataset, cannot be read by sample")
                continue
            if ds.chunks:
                if tuple(ds.chunks[1:]) != tuple(ds.shape[1:]):
                    warnings.append(
                        f"{name}: chunks {list(ds.chunks)} split a sample {list(ds.shape[1:])}; "
                        f"each sample read touches several chunks (rechunk to (k, *sample_shape))"
                    )
                if chunk_bytes is not None and ds.nbytes >= MiB and not MiB <= chunk_bytes <= 8 * MiB:
                    warnings.append(
                        f"{name}: chunk is {chunk_bytes / MiB:.3g} MiB, outside the 1-8 MiB sweet spot "
                        f"for parallel filesystems"
                    )
        lengths = {r["key"]: r["shape"][0] for r in rows if r["shape"]}
        if len(set(lengths.values())) > 1:
            warnings.append(
                "datasets differ in length along axis 0: " + ", ".join(f"{k}={n}" for k, n in lengths.items())
            )
    size = os.path.getsize(path)
    stripe = _stripe(path)
    if stripe and stripe.split()[0] == "1" and size > 1 << 30:
        warnings.append(
            f"{size / 2**30:.1f} GiB on a single OST (stripe {stripe}); ask your centre about striping or a PFL layout"
        )
    return {"path": path, "size": size, "stripe": stripe, "datasets": rows, "warnings": warnings}


def _inspect(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    console = Console()
    keys = args.keys.split(",") if args.keys else None
    code = 0
    for path in args.files:
        info = inspect_file(path, keys)
        title = f"{escape(str(path))}  ({info['size'] / MiB:.1f} MiB" + (
            f", stripe {info['stripe']})" if info["stripe"] else ")"
        )
        table = Table(title=title, title_justify="left")
        for col in ("key", "shape", "dtype", "chunks", "chunk MiB", "compression"):
            table.add_column(col)
        for r in info["datasets"]:
            comp = r["compression"] or "-"
            if r["compression_opts"] is not None:
                comp += f" ({r['compression_opts']})"
            table.add_row(
                escape(r["key"]),
                str(tuple(r["shape"])),
                r["dtype"],
                str(tuple(r["chunks"])) if r["chunks"] else "contiguous",
                f"{r['chunk_bytes'] / MiB:.3f}" if r["chunk_bytes"] else "-",
                comp,
            )
        console.print(table)
        for w in info["warnings"]:
            console.print(f"[yellow]warning:[/yellow] {escape(w)}", highlight=False)
    return code


def _synth(args: argparse.Namespace) -> int:
    from hpctrain.data.synth import make_dataset

    shape = tuple(int(s) for s in args.shape.split(",")) if args.shape else ()
    if args.samples < 0:
        raise UsageError("data synth: --samples must be >= 0")
    comp = None if args.compression == "none" else args.compression
    parent = os.path.dirname(os.path.abspath(args.out))
    if not os.path.isdir(parent):
        raise UsageError(f"data synth: {parent} is not a directory; create it first or choose another OUT")
    try:
        make_dataset(
            args.out,
            args.samples,
            shape=shape,
            dtype=args.dtype,
            chunk_samples=args.chunk_samples or None,
            compression=comp,
            level=args.level,
            seed=args.seed,
        )
    except OSError as exc:
        raise UsageError(f"data synth: cannot write {args.out}: {exc.strerror or exc}") from None
    print(
        f"wrote {args.out}: {args.samples} samples of x{list(shape)} {args.dtype} + y int64, "
        f"{'chunk ' + str(args.chunk_samples or 64) if comp or args.chunk_samples else 'contiguous'}"
        f"{', ' + comp if comp else ''} ({os.path.getsize(args.out) / MiB:.1f} MiB)"
    )
    return 0


def main(argv: tp.Optional[tp.Sequence[str]] = None) -> int:
    parser = command_parser("data", "Inspect HDF5 inputs and synthesise demo datasets.")
    sub = add_subcommands(parser)
    p = sub.add_parser("inspect", help="keys, shapes, dtypes, chunking, compression, stripes, warnings")
    p.add_argument("files", nargs="+", metavar="FILE")
    p.add_argument("--keys", help="comma-separated dataset names (default: all)")
    p.set_defaults(fn=_inspect)
    s = sub.add_parser("synth", help="write a demo/benchmark dataset (x float32 samples, y int64 labels)")
    s.add_argument("out", metavar="OUT.h5")
    s.add_argument("--samples", type=int, required=True)
    s.add_argument("--shape", default="3,32,32", help="sample shape, comma-separated (default 3,32,32)")
    s.add_argument("--dtype", default="float32")
    s.add_argument(
        "--chunk-samples", type=int, default=0, help="samples per chunk (default: contiguous, or 64 with compression)"
    )
    s.add_argument("--compression", choices=("none", "gzip", "lzf"), default="none")
    s.add_argument("--level", type=int, default=4, help="gzip level (default 4)")
    s.add_argument("--seed", type=int, default=0)
    s.set_defaults(fn=_synth)
    args = parser.parse_args(list(argv) if argv is not None else None)
    return int(args.fn(args))
