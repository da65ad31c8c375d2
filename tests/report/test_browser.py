"""The report loads in a real browser (headless Chromium) offline: no console errors, no network
requests, every embedded figure decodes, the page prints, and a screenshot is not blank.

Chromium is driven over the DevTools protocol (aiohttp websocket). `.ci/run` installs Debian's
`chromium` when missing; the test skips only where no Chromium binary exists.
A control page with a script error and a remote image proves the checks can fail.
"""

from __future__ import annotations

import asyncio
import base64
import io
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

import report_fixtures as rf

CHROMIUM = next((p for p in (shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome")) if p), None)
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--remote-debugging-port=0", "--remote-allow-origins=*"]

pytestmark = pytest.mark.skipif(
    CHROMIUM is None, reason="no chromium binary: .ci/run installs Debian's `chromium` with apt; "
                             "run `apt-get install -y chromium` where apt is available")


@pytest.fixture(scope="session")
def fx(tmp_path_factory):
    return rf.build(tmp_path_factory.getbasetemp() / "report-fixtures")


class Browser:
    """One headless Chromium process with its DevTools websocket URL."""

    def __init__(self, tmp: Path):
        self.proc = subprocess.Popen([CHROMIUM, *FLAGS, f"--user-data-dir={tmp}", "about:blank"],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True)
        deadline = time.monotonic() + 60
        self.port = None
        for line in self.proc.stderr:  # "DevTools listening on ws://127.0.0.1:PORT/devtools/browser/ID"
            m = re.search(r"DevTools listening on ws://[^:]+:(\d+)/", line)
            if m:
                self.port = int(m.group(1))
                break
            if time.monotonic() > deadline:
                break
        if self.port is None:
            self.close()
            raise RuntimeError("chromium did not print its DevTools port")
        # keep draining stderr so chromium never blocks on a full pipe
        import threading

        threading.Thread(target=lambda: [None for _ in self.proc.stderr], daemon=True).start()

    def close(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)


async def _inspect(port: int, url: str, shot: Path | None, width: int = 1280) -> dict:
    """Load `url` in the browser's page and report console errors, requests, image state, screenshot, PDF."""
    import aiohttp

    async with aiohttp.ClientSession() as http:
        async with http.get(f"http://127.0.0.1:{port}/json/list") as r:
            targets = await r.json(content_type=None)
        page = next(t for t in targets if t.get("type") == "page")
        async with http.ws_connect(page["webSocketDebuggerUrl"], max_msg_size=0) as ws:
            seq, events, pending = 0, [], {}

            async def reader():
                async for msg in ws:
                    m = json.loads(msg.data)
                    if "id" in m and m["id"] in pending:
                        pending.pop(m["id"]).set_result(m)
                    elif "method" in m:
                        events.append(m)

            task = asyncio.create_task(reader())

            async def call(method, **params):
                nonlocal seq
                seq += 1
                fut = asyncio.get_running_loop().create_future()
                pending[seq] = fut
                await ws.send_str(json.dumps({"id": seq, "method": method, "params": params}))
                m = await asyncio.wait_for(fut, 60)
                assert "error" not in m, m
                return m.get("result", {})

            for domain in ("Page", "Runtime", "Log", "Network"):
                await call(f"{domain}.enable")
            await call("Emulation.setDeviceMetricsOverride", width=width, height=2000, deviceScaleFactor=1, mobile=False)
            await call("Page.navigate", url=url)
            for _ in range(600):
                if any(e["method"] == "Page.loadEventFired" for e in events):
                    break
                await asyncio.sleep(0.05)
            else:
                raise AssertionError(f"{url} never finished loading")
            await asyncio.sleep(0.3)  # late console messages / requests
            images = (await call("Runtime.evaluate", returnByValue=True, expression=(
                "Array.from(document.images).map(i => [i.complete, i.naturalWidth, i.naturalHeight])")))["result"]["value"]
            overflow = (await call("Runtime.evaluate", returnByValue=True, expression=(  # tables behind a scrollbar
                "Array.from(document.querySelectorAll('.table-wrap')).map(w => [w.closest('section').id, "
                "w.scrollWidth, w.clientWidth])")))["result"]["value"]
            shot_png = base64.b64decode((await call("Page.captureScreenshot", format="png"))["data"])
            pdf = base64.b64decode((await call("Page.printToPDF", printBackground=True))["data"])
            task.cancel()
    if shot is not None:
        shot.write_bytes(shot_png)
    errors = [e["params"] for e in events if
              (e["method"] == "Runtime.consoleAPICalled" and e["params"].get("type") in ("error", "assert"))
              or e["method"] == "Runtime.exceptionThrown"
              or (e["method"] == "Log.entryAdded" and e["params"]["entry"].get("level") == "error")]
    requests = [e["params"]["request"]["url"] for e in events if e["method"] == "Network.requestWillBeSent"]
    foreign = [u for u in requests if not (u.startswith("data:") or u == url)]
    return {"errors": errors, "foreign_requests": foreign, "images": images, "png": shot_png, "pdf": pdf,
            "overflow": overflow}


def inspect(urls: list[str], shots: list[Path | None], width: int = 1280) -> list[dict]:
    with tempfile.TemporaryDirectory(prefix="ddtree-bench-chromium-") as tmp:
        b = Browser(Path(tmp))
        try:
            async def all_pages():
                return [await _inspect(b.port, u, s, width) for u, s in zip(urls, shots)]

            return asyncio.run(all_pages())
        finally:
            b.close()


def _not_blank(png: bytes) -> tuple[int, float]:
    """(distinct colours, share of non-white pixels) of a screenshot."""
    import numpy as np
    from PIL import Image

    px = np.asarray(Image.open(io.BytesIO(png)).convert("RGB"), dtype=np.int32).reshape(-1, 3)
    colours = len(np.unique(px, axis=0))
    ink = float((px.sum(axis=1) < 700).mean())
    return colours, ink


def test_report_loads_offline_in_chromium(fx, tmp_path):
    from ddtree_bench.report import write_report

    sweep_html = write_report([fx.sweep], tmp_path / "sweep.html")
    run_html = write_report([fx.run], tmp_path / "run.html", [json.loads(fx.compare.read_text())], title=rf.HOSTILE)
    bad = tmp_path / "control.html"
    bad.write_text('<!DOCTYPE html><html><body><p>control</p><img src="http://127.0.0.1:9/x.png">'
                   '<script>console.error("boom")</script></body></html>', encoding="utf-8")
    shots = [tmp_path / "sweep.png", tmp_path / "run.png", None]
    res_sweep, res_run, res_bad = inspect([f.resolve().as_uri() for f in (sweep_html, run_html, bad)], shots)

    # the checks can fail: the control page's script error and remote image are both seen
    assert res_bad["errors"], "console errors are not being captured"
    assert any(u.startswith("http://127.0.0.1:9/") for u in res_bad["foreign_requests"]), res_bad["foreign_requests"]

    for name, res in (("sweep", res_sweep), ("run", res_run)):
        assert res["errors"] == [], f"{name}: console errors {res['errors']}"
        assert res["foreign_requests"] == [], f"{name}: network requests {res['foreign_requests']}"
        assert res["images"], f"{name}: no figures"
        assert all(ok and w > 100 and h > 50 for ok, w, h in res["images"]), f"{name}: a figure did not decode: {res['images']}"
        colours, ink = _not_blank(res["png"])
        assert colours > 20 and ink > 0.01, f"{name}: screenshot looks blank ({colours} colours, {ink:.1%} ink)"
        assert res["pdf"].startswith(b"%PDF") and res["pdf"].count(b"/Type /Page") + res["pdf"].count(b"/Type/Page") >= 2, \
            f"{name}: printing produced no pages"
    assert len(res_sweep["images"]) == 7  # every figure a sweep of 3 budgets x 2 concurrencies has
    print(f"screenshots: {shots[0]} {shots[1]}")


def test_the_headline_table_fits_a_1400_px_window_with_real_point_ids_and_notes(fx, tmp_path):
    """Issue 33: at 1400 px the note column sat behind a horizontal scrollbar (point ids did not wrap)."""
    from ddtree_bench.report import write_report

    sweep = tmp_path / "sweep"
    shutil.copytree(fx.sweep, sweep)
    for d in sorted((sweep / "points").iterdir()):  # the ids a real sweep writes: backend-model-method-...-hash
        d.rename(d.with_name(f"inprocess-random-{d.name}-smoke-t0-0123456789ab"))
    page = write_report([sweep], tmp_path / "sweep.html")
    (res,) = inspect([page.resolve().as_uri()], [tmp_path / "sweep-1400.png"], width=1400)
    headline = [o for o in res["overflow"] if o[0] == "headline"]
    assert headline, res["overflow"]
    assert all(scroll <= client + 1 for _, scroll, client in res["overflow"] if _ in ("headline", "takeaways")), res["overflow"]
