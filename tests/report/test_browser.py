"""The report of a real run, in a real browser: Debian's headless Chromium (``apt-get install chromium``;
``tools/test`` installs it).

The run: the demo on 2 local ranks (real processes, gloo, HDF5 data, checkpoints, evaluations), stopped by
SIGUSR2 mid-run (the Runner's stop: every rank agrees on a step, saves it, the attempt ends "stopped") and
started again, resuming from that checkpoint: two attempts with a gap between them. Then an approval whose
text is hostile HTML, then ``python -m hpctrain report``.

In Chromium (one headless run: ``--dump-dom`` and ``--screenshot``, console messages on stderr with
``--enable-logging=stderr``): every section and every ``<svg>`` is in the rendered DOM, no console message at
all (the page's own Content-Security-Policy turns any attempt to fetch something into one; a control page
shows the detector works), the only image is a data: URI that decodes, and the screenshot is a real page,
not a blank one: decoded with the standard library (zlib and the PNG filters), it holds the header's colour,
the loss curve's colour and many colours in all.

``HPCTRAIN_REPORT_SCREENSHOT=FILE`` copies the screenshot there (how docs/img/report.png was made).
"""

from __future__ import annotations

import base64
import os
import re
import shutil
import signal
import struct
import subprocess
import sys
import threading
import time
import zlib
from pathlib import Path

import pytest

from hpctrain.report.page import SECTIONS
from hpctrain.rundir import RunDir, read_jsonl
from tests.multiproc import run_world
from tests.report.pagecheck import parse

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
ROOT = Path(__file__).resolve().parents[2]
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(CHROMIUM is None, reason="no chromium on PATH (apt-get install chromium; tools/test does)"),
]
HOSTILE_BY = "Grace <b>Hopper</b>"
HOSTILE_REASON = "<script>alert(1)</script> eval loss within 1% of baseline"


def _demo(rank, world_size, run_dir, args):
    from hpctrain.launch.runner import Runner

    try:
        return Runner(entry="hpctrain.examples.demo:main", run_dir=run_dir, entry_args=args)()
    except SystemExit as exc:  # a stopped attempt exits (1 on rank 0: stopped for good, not requeued)
        return {"exit": exc.code}


def _stop_at(run_dir: Path, step: int, done: threading.Event, sent: list) -> None:
    """SIGUSR2 to the rank processes (this process's spawned children) once an interval reaches ``step``."""
    import psutil

    me = psutil.Process()
    deadline = time.monotonic() + 240
    while not done.is_set() and time.monotonic() < deadline:
        records = read_jsonl(RunDir(run_dir).metrics)[0]
        if any(r.get("kind") == "interval" and (r.get("step") or 0) >= step for r in records):
            for child in me.children():
                try:
                    if "spawn_main" in " ".join(child.cmdline()):
                        child.send_signal(signal.SIGUSR2)
                        sent.append(child.pid)
                except psutil.Error:
                    pass
            return
        time.sleep(0.05)


@pytest.fixture(scope="module")
def real_run(tmp_path_factory):
    from hpctrain.data import make_dataset

    tmp = tmp_path_factory.mktemp("browser")
    data = str(make_dataset(tmp / "train.h5", 640, shape=(3, 8, 8), chunk_samples=32, fill="random"))
    run = tmp / "demo-run"
    args = ["--steps", "600", "--data", data, "--eval-data", data, "--batch-size", "32", "--workers", "1"]
    args += ["--ckpt-every", "50", "--log-every", "10", "--eval-every", "100", "--quiet"]
    done, sent = threading.Event(), []
    stopper = threading.Thread(target=_stop_at, args=(run, 60, done, sent), daemon=True)
    stopper.start()
    try:
        first = run_world(_demo, 2, str(run), args, init_pg=False, timeout=300, env={"TORCHELASTIC_RUN_ID": "7001"})
    finally:
        done.set()
        stopper.join()
    assert len(sent) == 2, "the stop signal did not reach both ranks"
    assert "exit" in first.results[0], "the first attempt was not stopped"
    end = [r for r in read_jsonl(RunDir(run).ledger)[0] if r.get("event") == "end"]
    assert len(end) == 1 and end[0]["status"] == "stopped" and 60 <= end[0]["step"] < 600, end
    stopped_at = end[0]["step"]
    time.sleep(2.0)  # the gap between the attempts
    env = {"TORCHELASTIC_RUN_ID": "7001", "TORCHELASTIC_RESTART_COUNT": "1"}
    second = run_world(_demo, 2, str(run), args, init_pg=False, timeout=300, env=env)
    assert second.results[0]["steps"] == 600 and second.results[0]["resumed"]["step"] == stopped_at
    approve = [sys.executable, "-m", "hpctrain", "approve", str(run), "--decision", "approved"]
    res = subprocess.run(
        [*approve, "--by", HOSTILE_BY, "--reason", HOSTILE_REASON], capture_output=True, text=True, cwd=ROOT
    )
    assert res.returncode == 0, res.stderr
    return run, stopped_at


def _chromium(page: Path, out: Path) -> tuple:
    """``(rendered DOM, console lines, screenshot path)`` of one headless run."""
    png = out / f"{page.stem}.png"
    cmd = [
        CHROMIUM,
        "--headless",
        "--disable-gpu",
        "--no-sandbox",
        "--no-first-run",
        "--hide-scrollbars",
        f"--user-data-dir={out / 'profile'}",
        "--enable-logging=stderr",
        "--v=0",
        "--window-size=1280,4000",
        f"--screenshot={png}",
        "--dump-dom",
        page.as_uri(),
    ]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    assert res.returncode == 0, res.stderr[-2000:]
    console = [line for line in res.stderr.splitlines() if ":CONSOLE" in line]
    return res.stdout, console, png


def _png_pixels(path: Path) -> tuple:
    """``(width, height, bytes per pixel, rows)`` of an 8-bit RGB/RGBA PNG: Pillow when it is installed
    (tensorboard brings it), else the standard library (zlib and the five PNG filters; about 8 s here)."""
    raw = path.read_bytes()
    assert raw[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    try:
        from PIL import Image
    except ImportError:
        return _png_pixels_stdlib(raw)
    with Image.open(path) as im:
        rgb = im.convert("RGB")
        w, h = rgb.size
        data = rgb.tobytes()
    return w, h, 3, [data[y * w * 3 : (y + 1) * w * 3] for y in range(h)]


def _png_pixels_stdlib(raw: bytes) -> tuple:
    pos, idat, header = 8, b"", None
    while pos < len(raw):
        (length,) = struct.unpack(">I", raw[pos : pos + 4])
        kind, body = raw[pos + 4 : pos + 8], raw[pos + 8 : pos + 8 + length]
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    width, height, depth, color, _, _, interlace = header
    assert depth == 8 and color in (2, 6) and interlace == 0, header
    bpp = 3 if color == 2 else 4
    data, stride = zlib.decompress(idat), width * bpp
    rows, prev = [], bytearray(stride)
    for y in range(height):
        f, line = data[y * (stride + 1)], bytearray(data[y * (stride + 1) + 1 : (y + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - bpp] if i >= bpp else 0
            b = prev[i]
            c = prev[i - bpp] if i >= bpp else 0
            if f == 1:
                line[i] = (line[i] + a) & 0xFF
            elif f == 2:
                line[i] = (line[i] + b) & 0xFF
            elif f == 3:
                line[i] = (line[i] + (a + b) // 2) & 0xFF
            elif f == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 0xFF
        rows.append(bytes(line))
        prev = line
    return width, height, bpp, rows


def test_console_detector_sees_errors_of_a_control_page(tmp_path):
    bad = tmp_path / "bad.html"
    bad.write_text(
        "<!DOCTYPE html><html><head><meta charset='utf-8'><meta http-equiv='Content-Security-Policy' "
        "content=\"default-src 'none'; img-src data:\"></head><body><img src='missing.png'>"
        "<script>console.error('boom')</script></body></html>"
    )
    _, console, _ = _chromium(bad, tmp_path)
    assert len(console) >= 2, console  # the blocked image and the blocked script


def test_report_of_a_stopped_and_resumed_run_renders_in_chromium(real_run, tmp_path):
    run, stopped_at = real_run
    res = subprocess.run(
        [sys.executable, "-m", "hpctrain", "report", str(run), "-o", str(tmp_path / "report.html")],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert res.returncode == 0, res.stderr
    assert "2 attempt(s)" in res.stdout and "0 note(s)" in res.stdout, res.stdout
    page = (tmp_path / "report.html").read_text()
    problems, tags = parse(page)
    assert problems == [] and "script" not in tags
    # what the run did is on the page: two attempts, the first stopped, the gap, the approval (escaped)
    assert "#1 7001-r0" in page and "#2 7001-r1" in page and ">stopped<" in page and ">completed<" in page
    assert len(re.findall(r"restart · [^<]+</text>", page)) >= 6
    assert f"steps 0→{stopped_at}" in page and f"steps {stopped_at}→600" in page
    assert "Grace &lt;b&gt;Hopper&lt;/b&gt;" in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    identity = page[page.index('<section id="identity">') :].split("</section>", 1)[0]
    assert "the chain verifies" in identity and identity.count("<td>7001-r") == 2  # both attempts' identity
    for src in re.findall(r'<img[^>]* src="([^"]*)"', page):  # the capacity plot, where there is one
        head, payload = src.split(",", 1)
        assert head.startswith("data:image/") and head.endswith(";base64")
        blob = base64.b64decode(payload, validate=True)
        assert blob.startswith(b"\x89PNG") or b"<svg" in blob[:2000]

    dom, console, png = _chromium(tmp_path / "report.html", tmp_path)
    assert console == [], console
    for sid, _ in SECTIONS:
        assert f'<section id="{sid}">' in dom, sid
    assert dom.count("<svg") == page.count("<svg") >= 8
    assert "<script" not in dom and "&lt;script&gt;alert(1)&lt;/script&gt;" in dom

    width, height, bpp, rows = _png_pixels(png)
    assert (width, height) == (1280, 4000) and png.stat().st_size > 100_000
    header = rows[10][40 * bpp : 40 * bpp + 3]
    assert all(abs(v - w) <= 8 for v, w in zip(header, (0x26, 0x32, 0x38))), header  # the dark header bar
    colors, loss_px, ink = set(), 0, 0
    for row in rows[::2]:
        for x in range(0, width * bpp, 2 * bpp):
            px = row[x : x + 3]
            colors.add(px)
            if abs(px[0] - 0x1F) < 24 and abs(px[1] - 0x5F) < 24 and abs(px[2] - 0xBF) < 24:
                loss_px += 1
            if sum(px) < 600:
                ink += 1
    assert len(colors) > 200 and loss_px > 50 and ink > 20_000, (len(colors), loss_px, ink)
    keep = os.environ.get("HPCTRAIN_REPORT_SCREENSHOT")
    if keep:
        shutil.copyfile(png, keep)
