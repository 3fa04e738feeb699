"""Rectangles of row-major tensors: which bytes of a stored piece land where in a wanted region. Pure stdlib.

A stored piece is either a *flat range* (elements ``start:stop`` of the flattened tensor: replicated state,
split at byte boundaries by the writer) or a *box* (a DTensor's local chunk: per-dimension offsets and
lengths, its elements stored row-major within the box). A reader wants a box too: the whole tensor for
replicated targets, its new local chunk for a sharded one. :func:`runs` turns (stored piece, wanted box)
into contiguous element runs, so a rank reads exactly the bytes that overlap what it needs (one run per
piece when chunks are cut along dim 0, one per row of the overlap when they are cut along a later dim).

Also the crc32 arithmetic that lets ranks verify a shard file together from the parts each one read.
"""

from __future__ import annotations

import bisect
import itertools
import math
import typing as tp

try:
    from isal.isal_zlib import crc32_combine as _crc32_combine
except ImportError:  # pragma: no cover - the [fast] extra is optional
    _crc32_combine = None

__all__ = ["Box", "whole", "intersect", "runs", "flat_runs", "boxes_tile", "crc32_combine"]

Box = tp.Tuple[tp.Tuple[int, ...], tp.Tuple[int, ...]]
"""(offsets, lengths) per dimension, in elements of the global tensor."""


def whole(shape: tp.Sequence[int]) -> Box:
    return (0,) * len(shape), tuple(shape)


def intersect(a: Box, b: Box) -> tp.Optional[Box]:
    lo = tuple(max(x, y) for x, y in zip(a[0], b[0]))
    hi = tuple(min(x + lx, y + ly) for x, lx, y, ly in zip(a[0], a[1], b[0], b[1]))
    if any(h <= a for a, h in zip(lo, hi)):
        return None
    return lo, tuple(h - a for a, h in zip(lo, hi))


def _strides(lengths: tp.Sequence[int]) -> tp.List[int]:
    out, acc = [], 1
    for d in reversed(lengths):
        out.append(acc)
        acc *= d
    return out[::-1]


def runs(src: Box, dst: Box) -> tp.List[tp.Tuple[int, int, int]]:
    """``(src_element, dst_element, count)`` runs copying ``src ∩ dst``; element offsets are row-major
    within each box. Trailing dimensions that the overlap covers fully in both boxes merge into one run."""
    inter = intersect(src, dst)
    if inter is None:
        return []
    nd = len(inter[0])
    if nd == 0:
        return [(0, 0, 1)]
    lo, ilen = inter
    k = nd - 1  # dims after k are whole in src, dst and the overlap: dims k.. are one contiguous run
    while k > 0 and ilen[k] == src[1][k] == dst[1][k]:
        k -= 1
    n = math.prod(ilen[k:])
    ss, ds = _strides(src[1]), _strides(dst[1])
    s0 = sum((lo[d] - src[0][d]) * ss[d] for d in range(nd))
    d0 = sum((lo[d] - dst[0][d]) * ds[d] for d in range(nd))
    out = []
    for idx in itertools.product(*(range(ilen[d]) for d in range(k))):
        out.append((s0 + sum(i * ss[d] for d, i in enumerate(idx)), d0 + sum(i * ds[d] for d, i in enumerate(idx)), n))
    return out


def flat_runs(
    pieces: tp.Sequence[tp.Tuple[int, int]], shape: tp.Sequence[int], dst: Box
) -> tp.List[tp.Tuple[int, int, int, int]]:
    """For flat pieces ``[(start, stop)]`` (sorted, tiling the tensor): ``(piece, element in piece, dst element,
    count)`` runs filling box ``dst``."""
    starts = [p[0] for p in pieces]
    out = []
    for g, d, n in runs(whole(shape), dst):
        while n:
            i = bisect.bisect_right(starts, g) - 1
            start, stop = pieces[i]
            m = min(n, stop - g)
            out.append((i, g - start, d, m))
            g, d, n = g + m, d + m, n - m
    return out


def boxes_tile(shape: tp.Sequence[int], boxes: tp.Sequence[Box]) -> str:
    """'' when ``boxes`` lie inside ``shape``, do not overlap and cover it; else what is wrong."""
    for off, ln in boxes:
        if len(off) != len(shape) or any(o + n > s for o, n, s in zip(off, ln, shape)):
            return "a stored chunk lies outside the tensor"
    full = [b for b in boxes if math.prod(b[1])]
    if sum(math.prod(b[1]) for b in full) != math.prod(shape):
        return "the stored chunks do not cover the tensor exactly"
    if not shape:
        return "" if len(full) == 1 else "the stored chunks overlap"
    full.sort(key=lambda b: b[0][0])
    active: tp.List[Box] = []  # sweep along dim 0: only chunks whose dim-0 ranges overlap are compared
    for b in full:
        active = [a for a in active if a[0][0] + a[1][0] > b[0][0]]
        if any(intersect(a, b) for a in active):
            return "the stored chunks overlap"
        active.append(b)
    return ""


# ------------------------------------------------------------------------------------------- crc32 algebra
_POLY = 0xEDB88320


def _gf2_mul(a: int, b: int) -> int:
    """a * b modulo the CRC-32 polynomial, in the reflected bit order zlib uses."""
    p = 0
    m = 1 << 31
    while m:
        if a & m:
            p ^= b
        b = (b >> 1) ^ _POLY if b & 1 else b >> 1
        m >>= 1
    return p


_X2N = [1 << 30]  # _X2N[k] = x^(2^k) mod P (bit 31 is x^0 in the reflected order)
for _ in range(63):
    _X2N.append(_gf2_mul(_X2N[-1], _X2N[-1]))


def _x8n(n: int) -> int:
    """x^(8n) mod P."""
    p, k = 1 << 31, 3
    while n:
        if n & 1:
            p = _gf2_mul(_X2N[k & 63], p)
        n >>= 1
        k += 1
    return p


def crc32_combine(crc1: int, crc2: int, len2: int) -> int:
    """crc32 of A + B from crc32(A), crc32(B) and len(B) (zlib's crc32_combine; ISA-L's when installed)."""
    if _crc32_combine is not None:
        return int(_crc32_combine(crc1, crc2, len2))
    return _gf2_mul(_x8n(len2), crc1) ^ crc2
