"""The page at / in a real headless Chromium (Debian's `chromium`): a person types a question and answers, clicks
Rank, and sees the kept answers in `medrank rank`'s order with their scores, the dropped ones greyed out. Slow set."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

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


@contextlib.contextmanager
def _serve(folder: Path, tmp_path: Path):
    """`medrank serve` as a user starts it, in `folder`, on a free loopback port; its URL."""
    import socket

    import httpx

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    cmd = [sys.executable, "-m", "medrank.cli", "serve", "--port", str(port), "--threads", "1"]
    log = tmp_path / "server.log"
    proc = subprocess.Popen(cmd, cwd=folder, env=env, stdout=subprocess.DEVNULL, stderr=log.open("w"))
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    try:
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
    finally:
        proc.terminate()
        # SIGTERM: a graceful stop (uvicorn re-raises the signal once it has shut down, so the exit status names it)
        assert proc.wait(60) in (0, -signal.SIGTERM) and "Application shutdown complete" in log.read_text()


@pytest.fixture
def server(tiny_project, tmp_path):
    with _serve(tiny_project, tmp_path) as url:
        yield url


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


@pytest.fixture
def examples_folder(tiny_project, tmp_path) -> Path:
    """A serving folder with the tiny models (linked) and cleaned answers holding two validation questions."""
    import pandas as pd

    from medrank.core import layout

    root = tmp_path / "served"
    root.mkdir()
    (root / "models").symlink_to(tiny_project / "models")
    given = json.loads((FIXTURES / "rank_input.json").read_text())
    rows = [
        {
            "split": split,
            "qid": qid,
            "question": q,
            "aid": f"{qid}-{i}",
            "answer": a["text"],
            "url": a.get("url", ""),
            "system_rank": i,
        }
        for split, qid, q in (
            ("val", "v1", given["question"]),
            ("val", "v2", "How is the flu treated?"),
            ("train_liveqa", "t1", "Not an example"),
        )
        for i, a in enumerate(given["answers"], start=1)
    ]
    path = root / layout.CLEAN_ANSWERS
    path.parent.mkdir(parents=True)
    pd.DataFrame(rows).to_parquet(path)
    return root


def test_one_click_loads_a_real_example_and_ranks_it(browser, examples_folder, tmp_path, monkeypatch, capsys):
    from medrank.cli import main

    with _serve(examples_folder, tmp_path) as url:
        browser.open(url + "/")
        browser.wait_for("document.getElementById('example')")
        browser.click("#example")
        browser.wait_for("document.getElementById('question').value")
        assert (
            browser.eval("document.getElementById('question').value")
            == "What causes Noonan syndrome and is it inherited?"
        )
        assert browser.eval("document.querySelectorAll('.answer').length") == 4
        assert "validation question v1 (1 of 2)" in browser.eval(
            "document.getElementById('example-status').textContent"
        )
        browser.click("#submit")
        browser.wait_for("!document.getElementById('results').hidden || document.getElementById('error').textContent")
        assert browser.eval("document.getElementById('error').textContent") == ""
        given = json.loads((FIXTURES / "rank_input.json").read_text())
        body = {
            "question": given["question"],
            "answers": [
                {"id": str(i), "text": a["text"], **({"url": a["url"]} if a.get("url") else {})}
                for i, a in enumerate(given["answers"], start=1)
            ],
        }
        (tmp_path / "in.json").write_text(json.dumps(body))
        monkeypatch.chdir(tmp_path)
        assert main(["rank", "in.json", "--all", "--models", str(examples_folder / "models")]) == 0
        want = json.loads(capsys.readouterr().out)
        kept = browser.eval("[...document.querySelectorAll('#kept li')].map(e => e.dataset.id)")
        dropped = browser.eval("[...document.querySelectorAll('#dropped li')].map(e => e.dataset.id)")
        assert kept == [a["id"] for a in want["answers"] if a["kept"]] and len(kept) >= 1
        assert dropped == [a["id"] for a in want["answers"] if not a["kept"]]
        browser.screenshot(tmp_path / "page.png")
        assert (tmp_path / "page.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        browser.click("#example")  # the next one
        browser.wait_for("document.getElementById('question').value.startsWith('How is the flu')")
