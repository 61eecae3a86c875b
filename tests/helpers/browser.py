"""A real headless Chromium driven over the DevTools protocol on a pipe (--remote-debugging-pipe: fd 3 in, fd 4 out,
messages of JSON ended by NUL), so an end-to-end page test needs the browser alone: no driver, no websocket client."""

from __future__ import annotations

import json
from pathlib import Path
import os
import shutil
import subprocess
import tempfile
import threading
import time
from typing import Any

BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


def find_browser() -> str | None:
    return next((p for p in map(shutil.which, BROWSERS) if p), None)


class Browser:
    """One headless browser with one page (`open`), typed into and clicked as a person would."""

    def __init__(self, executable: str, timeout: float = 60.0) -> None:
        self.timeout = timeout
        self.profile = tempfile.mkdtemp(prefix="medrank-chromium-")
        cmd_r, self._cmd_w = os.pipe()  # we write commands; the browser reads them on its fd 3
        self._res_r, res_w = os.pipe()  # the browser writes answers and events on its fd 4

        def fds() -> None:
            a, b = os.dup(cmd_r), os.dup(res_w)  # copies first: 3 or 4 may be one of the two already
            os.dup2(a, 3)
            os.dup2(b, 4)

        args = [
            executable,
            "--headless=new",
            "--no-sandbox",  # root in a container
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--no-first-run",
            "--no-default-browser-check",
            "--disable-extensions",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--remote-debugging-pipe",
            f"--user-data-dir={self.profile}",
            "about:blank",
        ]
        self.proc = subprocess.Popen(
            args, preexec_fn=fds, close_fds=False, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        os.close(cmd_r)
        os.close(res_w)
        self._next = 0
        self._answers: dict[int, dict] = {}
        self._cond = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self.session: str | None = None

    def _read(self) -> None:
        buf = b""
        while True:
            chunk = os.read(self._res_r, 1 << 16)
            if not chunk:
                return
            buf += chunk
            while b"\0" in buf:
                raw, buf = buf.split(b"\0", 1)
                msg = json.loads(raw)
                if "id" in msg:
                    with self._cond:
                        self._answers[msg["id"]] = msg
                        self._cond.notify_all()

    def send(self, method: str, params: dict | None = None, to_page: bool = True) -> dict:
        """One command, to the open page (else to the browser), and its result."""
        self._next += 1
        msg: dict[str, Any] = {"id": self._next, "method": method, "params": params or {}}
        if to_page and self.session:
            msg["sessionId"] = self.session
        os.write(self._cmd_w, json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + self.timeout
        with self._cond:
            while self._next not in self._answers:
                if not self._cond.wait(max(0.0, deadline - time.monotonic())):
                    raise TimeoutError(f"the browser did not answer {method}")
            answer = self._answers.pop(self._next)
        if "error" in answer:
            raise RuntimeError(f"{method}: {answer['error']}")
        return answer.get("result", {})

    def open(self, url: str) -> None:
        target = self.send("Target.createTarget", {"url": url}, to_page=False)["targetId"]
        attached = self.send("Target.attachToTarget", {"targetId": target, "flatten": True}, to_page=False)
        self.session = attached["sessionId"]
        # the new target starts on about:blank, already 'complete': wait for the page asked for
        self.wait_for("location.href !== 'about:blank' && document.readyState === 'complete'")

    def eval(self, expression: str) -> Any:
        out = self.send("Runtime.evaluate", {"expression": expression, "returnByValue": True, "awaitPromise": True})
        if "exceptionDetails" in out:
            raise RuntimeError(f"{expression}: {out['exceptionDetails'].get('text')}")
        return out["result"].get("value")

    def wait_for(self, condition: str, timeout: float | None = None) -> None:
        deadline = time.monotonic() + (timeout or self.timeout)
        while not self.eval(f"Boolean({condition})"):
            if time.monotonic() > deadline:
                raise TimeoutError(f"still false: {condition}")
            time.sleep(0.1)

    def type_into(self, selector: str, text: str) -> None:
        """Focus the element and type `text` as keyboard input (Input.insertText: what a paste does)."""
        self.eval(f"document.querySelector({json.dumps(selector)}).focus()")
        self.send("Input.insertText", {"text": text})

    def click(self, selector: str) -> None:
        """A left click at the element's centre, as a mouse would."""
        box = self.eval(
            f"(() => {{ const e = document.querySelector({json.dumps(selector)}); e.scrollIntoView();"
            " const r = e.getBoundingClientRect(); return [r.x + r.width / 2, r.y + r.height / 2]; })()"
        )
        for kind in ("mousePressed", "mouseReleased"):
            self.send(
                "Input.dispatchMouseEvent", {"type": kind, "x": box[0], "y": box[1], "button": "left", "clickCount": 1}
            )

    def screenshot(self, path: Path, width: int = 1000, max_height: int | None = None) -> None:
        """The page as a PNG at `path` (CDP Page.captureScreenshot beyond the viewport), its top `max_height` pixels
        where given."""
        import base64

        height = int(self.eval("document.documentElement.scrollHeight"))
        height = min(height, max_height) if max_height else height
        self.send(
            "Emulation.setDeviceMetricsOverride",
            {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False},
        )
        shot = self.send("Page.captureScreenshot", {"format": "png", "captureBeyondViewport": not max_height})
        Path(path).write_bytes(base64.b64decode(shot["data"]))

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.send("Browser.close", to_page=False)
            except (OSError, TimeoutError, RuntimeError):
                pass
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        os.close(self._cmd_w)
        shutil.rmtree(self.profile, ignore_errors=True)
