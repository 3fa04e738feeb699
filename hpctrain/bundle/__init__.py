"""The recoverable training bundle: one directory (or tar) another engineer can identify, check and rebuild.

``python -m hpctrain bundle RUN_DIR -o OUT`` (:func:`hpctrain.bundle.build.build_bundle`) and
``python -m hpctrain bundle verify OUT`` (:func:`hpctrain.bundle.verify.verify_bundle`). Standard library
only (``rich`` for the verify report), no torch: both run on a login node. The layout inside a bundle is
:class:`hpctrain.bundle.layout.BundleLayout`'s; its metadata is an RO-Crate (:mod:`hpctrain.bundle.crate`).
"""

from __future__ import annotations

import typing as tp

__all__ = ["build_bundle", "verify_bundle", "BundleLayout"]


def __getattr__(name: str) -> tp.Any:
    if name == "build_bundle":
        from hpctrain.bundle.build import build_bundle

        return build_bundle
    if name == "verify_bundle":
        from hpctrain.bundle.verify import verify_bundle

        return verify_bundle
    if name == "BundleLayout":
        from hpctrain.bundle.layout import BundleLayout

        return BundleLayout
    raise AttributeError(f"module 'hpctrain.bundle' has no attribute {name!r}")
