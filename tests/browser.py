"""Headless Chromium for the tests, without any driver.

Two ways in:
* `dump_dom` / `screenshot`: chromium's own --dump-dom and --screenshot flags;
* `page_text`: the DevTools protocol over --remote-debugging-pipe (JSON messages ending in NUL on
  fds 3 and 4), to read text inside shadow DOM (TensorBoard's Polymer dashboards), which
  --dump-dom does not serialise.

Tests call `require_chromium()` first: it skips them with the reason when there is no Chromium
(`make browser` installs Debian's when run as root).
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import struct
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-quic",
    "--hide-scrollbars",
    "--mute-audio",
]
# Every host but the loopback unreachable: requests go to a dead proxy (loopback bypasses
# proxies) and names do not resolve. For pages that must work offline.
OFFLINE = ["--proxy-server=127.0.0.1:9", "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1"]


def find_chromium() -> str | None:
    env = os.environ.get("TRAINPROF_CHROMIUM")
    if env and Path(env).is_file():
        return env
    for name in ("chromium", "chromium-browser", "google-chrome", "chrome"):
        path = shutil.which(name)
        if path:
            return path
    return None


def require_chromium() -> str:
    path = find_chromium()
    if path is None:
        pytest.skip("no Chromium found (install Debian's with `make browser` as root, or set "
                    "TRAINPROF_CHROMIUM to a chromium binary)")
    return path


def _run(args: list[str], timeout: float) -> subprocess.CompletedProcess:
    with tempfile.TemporaryDirectory(prefix="trainprof-chromium-") as profile:
        return subprocess.run(
            [require_chromium(), *FLAGS, f"--user-data-dir={profile}", *args],
            capture_output=True, timeout=timeout, check=False,
        )


def dump_dom(url: str, budget_ms: int = 3000, timeout: float = 30) -> str:
    """The page's DOM after `budget_ms` of virtual time (scripts run, fetches complete)."""
    r = _run([f"--virtual-time-budget={budget_ms}", "--dump-dom", url], timeout)
    assert r.returncode == 0, r.stderr.decode(errors="replace")[-2000:]
    return r.stdout.decode("utf-8", errors="replace")


def screenshot(url: str, out: Path, size: tuple[int, int] = (1200, 1600),
               budget_ms: int = 2000, timeout: float = 30) -> Path:
    r = _run([f"--window-size={size[0]},{size[1]}", f"--virtual-time-budget={budget_ms}",
              f"--screenshot={out}", url], timeout)
    assert Path(out).is_file(), r.stderr.decode(errors="replace")[-2000:]
    return Path(out)


# ---- screenshots -------------------------------------------------------------------------------
def png_size(path: Path) -> tuple[int, int]:
    """(width, height) from the PNG header."""
    data = Path(path).read_bytes()[:24]
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR", "not a PNG"
    return struct.unpack(">II", data[16:24])


def png_colors(path: Path) -> set[tuple[int, int, int]]:
    """Every distinct RGB colour of the image (Pillow comes with torchvision)."""
    from PIL import Image

    with Image.open(path) as im:
        return {c for _, c in im.convert("RGB").getcolors(maxcolors=1 << 24)}


# ---- the DevTools protocol over a pipe -----------------------------------------------------------
# Text of the page including every open shadow root, as a promise that polls until all `wanted`
# strings are present or `ms` pass.
_DEEP_TEXT = """
(async (wanted, ms) => {
  const text = () => {
    const out = [];
    const walk = (node) => {
      if (node.nodeType === Node.TEXT_NODE) { out.push(node.textContent); return; }
      if (node.nodeName === 'STYLE' || node.nodeName === 'SCRIPT') return;
      if (node.shadowRoot) walk(node.shadowRoot);
      // Plugins in same-origin iframes (XProf): their documents too.
      if (node.nodeName === 'IFRAME' && node.contentDocument) walk(node.contentDocument);
      for (const c of node.childNodes) walk(c);
    };
    walk(document.documentElement);
    return out.join(' ');
  };
  const t0 = Date.now();
  let t = text();
  while (Date.now() - t0 < ms && !wanted.every((w) => t.includes(w))) {
    await new Promise((r) => setTimeout(r, 250));
    t = text();
  }
  return t;
})
"""


class _Pipe:
    def __init__(self, chromium: str, profile: str, size: tuple[int, int],
                 flags: list[str] | None = None):
        # chromium reads commands on fd 3 and writes replies on fd 4
        self._cmd_r, self._cmd_w = os.pipe()
        self._out_r, self._out_w = os.pipe()

        def fds() -> None:
            # Our pipe ends may themselves be fds 3 and 4 (close-on-exec): copy them out of the
            # way first, then dup2 clears close-on-exec on 3 and 4.
            cmd_r, out_w = os.dup(self._cmd_r), os.dup(self._out_w)
            os.dup2(cmd_r, 3)
            os.dup2(out_w, 4)

        self.proc = subprocess.Popen(
            [chromium, *FLAGS, *(flags or []), f"--user-data-dir={profile}",
             "--remote-debugging-pipe",
             f"--window-size={size[0]},{size[1]}", "about:blank"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            # close_fds=False: subprocess would close 3 and 4 after preexec_fn; every other fd
            # of ours is close-on-exec anyway.
            preexec_fn=fds, close_fds=False,
        )
        os.close(self._cmd_r)
        os.close(self._out_w)
        self._buf = b""
        self._id = 0
        self.events: list[dict] = []

    def _read(self, deadline: float) -> None:
        assert time.monotonic() < deadline, "chromium did not answer in time"
        chunk = os.read(self._out_r, 1 << 16)
        assert chunk, "chromium closed the DevTools pipe"
        self._buf += chunk

    def _messages(self):
        while b"\0" in self._buf:
            raw, self._buf = self._buf.split(b"\0", 1)
            msg = json.loads(raw)
            if "id" not in msg:
                self.events.append(msg)
            yield msg

    def call(self, method: str, params: dict | None = None, session: str | None = None,
             timeout: float = 30) -> dict:
        self._id += 1
        msg = {"id": self._id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        os.write(self._cmd_w, json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:
            for reply in self._messages():
                if reply.get("id") == self._id:
                    assert "error" not in reply, reply["error"]
                    return reply["result"]
            self._read(deadline)

    def wait_event(self, method: str, timeout: float = 30) -> dict:
        deadline = time.monotonic() + timeout
        while True:
            list(self._messages())
            for ev in self.events:
                if ev.get("method") == method:
                    self.events.remove(ev)
                    return ev
            self._read(deadline)

    def close(self) -> None:
        try:
            self.call("Browser.close", timeout=5)
        except (AssertionError, OSError):
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        os.close(self._cmd_w)
        os.close(self._out_r)


def page_text(url: str, wanted: list[str], wait_s: float = 15.0,
              size: tuple[int, int] = (1400, 4000), offline: bool = False,
              screenshot_to: Path | None = None) -> str:
    """The rendered text of `url` (shadow DOM and same-origin iframes included) once every
    string of `wanted` shows, or after `wait_s` (the caller asserts on what came back).
    `offline`: every host but the loopback blocked. `screenshot_to`: a PNG of the view then."""
    chromium = require_chromium()
    with tempfile.TemporaryDirectory(prefix="trainprof-chromium-") as profile:
        pipe = _Pipe(chromium, profile, size, OFFLINE if offline else None)
        try:
            target = pipe.call("Target.createTarget", {"url": "about:blank"})["targetId"]
            session = pipe.call("Target.attachToTarget",
                                {"targetId": target, "flatten": True})["sessionId"]
            pipe.call("Page.enable", session=session)
            # Dashboards render only the cards in view: make the view tall.
            pipe.call("Emulation.setDeviceMetricsOverride",
                      {"width": size[0], "height": size[1], "deviceScaleFactor": 1,
                       "mobile": False}, session=session)
            pipe.call("Page.navigate", {"url": url}, session=session)
            pipe.wait_event("Page.loadEventFired", timeout=wait_s + 15)
            expr = f"{_DEEP_TEXT}({json.dumps(wanted)}, {int(wait_s * 1000)})"
            res = pipe.call("Runtime.evaluate",
                            {"expression": expr, "awaitPromise": True, "returnByValue": True},
                            session=session, timeout=wait_s + 30)
            if screenshot_to is not None:
                png = pipe.call("Page.captureScreenshot", {"format": "png"}, session=session)
                Path(screenshot_to).write_bytes(base64.b64decode(png["data"]))
            return str(res["result"].get("value", ""))
        finally:
            pipe.close()
