"""The page at / in a real headless Chromium (Debian's `chromium`): a person types a question and answers, clicks
Rank, and sees the kept answers in `medrank rank`'s order with their scores, the dropped ones greyed out. Slow set."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from tests.conftest import REPO
from tests.helpers.browser import Browser, find_browser
from tests.helpers.tiny_project import FIXTURES

pytestmark = pytest.mark.slow


@pytest.fixture
def browser():
    exe = find_browser()
    if exe is None:
        pytest.skip("no Chromium here (Debian: apt-get install chromium): the page's browser test needs one")
    b = Browser(exe)
    yield b
    b.close()


@pytest.fixture
def server(tiny_project, tmp_path):
    """`medrank serve` as a user starts it, in the tiny project, on a free loopback port."""
    import socket

    import httpx

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    cmd = [sys.executable, "-m", "medrank.cli", "serve", "--port", str(port), "--threads", "1"]
    log = tmp_path / "server.log"
    proc = subprocess.Popen(cmd, cwd=tiny_project, env=env, stdout=subprocess.DEVNULL, stderr=log.open("w"))
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while True:
        assert proc.poll() is None, log.read_text()[-2000:]
        try:
            if httpx.get(f"{url}/readyz", timeout=2).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        assert time.monotonic() < deadline, "the server was not ready in time"
        time.sleep(0.2)
    yield url
    proc.terminate()
    # SIGTERM: a graceful stop (uvicorn re-raises the signal once it has shut down, so the exit status names it)
    assert proc.wait(60) in (0, -signal.SIGTERM) and "Application shutdown complete" in log.read_text()


def test_a_person_ranks_answers_on_the_page(browser, server, tiny_project, tmp_path, monkeypatch, capsys):
    from medrank.cli import main

    given = json.loads((FIXTURES / "rank_input.json").read_text())
    browser.open(server + "/")
    assert browser.eval("document.title").startswith("medrank")
    browser.type_into("#question", given["question"])
    browser.click("#add")  # a fourth answer box
    for i, a in enumerate(given["answers"]):
        browser.type_into(f".answer:nth-of-type({i + 1}) .answer-text", a["text"])
        if a.get("url"):
            browser.type_into(f".answer:nth-of-type({i + 1}) .answer-url", a["url"])
    browser.click("#submit")
    browser.wait_for("!document.getElementById('results').hidden || document.getElementById('error').textContent")
    assert browser.eval("document.getElementById('error').textContent") == ""

    # what `medrank rank` says of the same input, with the page's ids (the boxes' positions)
    for i, a in enumerate(given["answers"]):
        a["id"] = str(i + 1)
    (tmp_path / "page_input.json").write_text(json.dumps(given))
    monkeypatch.chdir(tmp_path)
    assert main(["rank", "page_input.json", "--all", "--models", str(tiny_project / "models")]) == 0
    want = json.loads(capsys.readouterr().out)
    kept = [a for a in want["answers"] if a["kept"]]
    dropped = [a for a in want["answers"] if not a["kept"]]

    seen = browser.eval("document.body.innerText")
    assert f"{want['n_kept']} of {want['n_answers']} answers kept." in seen
    lines = browser.eval("[...document.querySelectorAll('#kept li .scores')].map(e => e.innerText)")
    assert lines == [
        f"answer {a['id']}: filter {a['filter_score']:.3f}, rank score {a['rank_score']:.3f}" for a in kept
    ]
    assert browser.eval("[...document.querySelectorAll('#kept li')].map(e => e.dataset.id)") == [a["id"] for a in kept]
    texts = browser.eval("[...document.querySelectorAll('#kept li .text')].map(e => e.innerText)")
    assert texts == [given["answers"][int(a["id"]) - 1]["text"] for a in kept]
    grey = browser.eval(
        "[...document.querySelectorAll('#dropped li')].map(e => [e.dataset.id, getComputedStyle(e).color])"
    )
    assert [i for i, _ in grey] == [a["id"] for a in dropped]
    assert all(color == "rgb(136, 136, 136)" for _, color in grey)  # greyed out
    kept_colors = browser.eval("[...document.querySelectorAll('#kept li')].map(e => getComputedStyle(e).color)")
    assert all(c != "rgb(136, 136, 136)" for c in kept_colors)


def test_the_page_shows_a_bad_input_error_in_one_line(browser, server):
    browser.open(server + "/")
    browser.type_into(".answer:nth-of-type(1) .answer-text", "An answer without a question.")
    browser.eval("document.getElementById('question').removeAttribute('required')")  # past the form's own check
    browser.click("#submit")
    browser.wait_for("document.getElementById('error').textContent")
    assert browser.eval("document.getElementById('error').textContent") == (
        "body: 'question' must be a non-empty string"
    )
    assert browser.eval("document.getElementById('results').hidden")
