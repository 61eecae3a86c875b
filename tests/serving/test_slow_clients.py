"""Slow clients (issue 64): headers and body bounded in time (408 in one line of JSON, then the connection closes),
slow connections cannot hold every slot up to uvicorn's limit, a slow body no longer holds a graceful shutdown, and
`medrank serve` gives both deadlines to the one process and to each of `--workers`. A real uvicorn server on
127.0.0.1, the tiny project's models; 2 s deadlines, every wait bounded at 15 s."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import pickle
import socket
import threading
import time

import pytest
import uvicorn

from medrank.serving.app import CONFIG_ENV, ServeConfig, create_app
from medrank.serving.slow_clients import SlowClientProtocol, slow_client_protocol
from tests.conftest import error_lines
from tests.helpers.tiny_project import FIXTURES

pytestmark = pytest.mark.usefixtures("one_thread")  # the 2 cores are shared

BOUND_S = 15.0  # every wait on the server; its deadlines are 2 s
SLOW_BODY = b'POST /rank HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{"'
SLOW_HEADERS = b"POST /rank HTTP/1.1\r\nHost: t\r\nContent-Le"


@contextlib.contextmanager
def serving(ranker, header_timeout_s=2.0, body_timeout_s=2.0, **options):
    """`medrank serve`'s server (SlowClientProtocol, BodyDeadline) in a thread; yields (port, server)."""
    config = ServeConfig(threads=1, warmup=False, header_timeout_s=header_timeout_s, body_timeout_s=body_timeout_s)
    server = uvicorn.Server(
        uvicorn.Config(
            create_app(config, ranker),
            host="127.0.0.1",
            port=0,
            log_config=None,
            access_log=False,
            http=slow_client_protocol(header_timeout_s),
            **options,
        )
    )
    thread = threading.Thread(target=lambda: asyncio.run(server.serve()), daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 60
        while not (server.started and server.servers):
            assert time.monotonic() < deadline and thread.is_alive()
            time.sleep(0.02)
        port = server.servers[0].sockets[0].getsockname()[1]
        while b" 200 " not in request(port, b"GET /readyz HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")[:20]:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        yield port, server, thread
    finally:
        server.should_exit = True
        thread.join(30)
        if thread.is_alive():  # held by a slow client (the bug): drop them rather than hang the suite
            server.force_exit = True
            thread.join(30)


def connect(port: int, payload: bytes) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port), timeout=BOUND_S)
    s.sendall(payload)
    return s


def read_to_close(s: socket.socket) -> tuple[bytes, float]:
    """Everything the server sends until it closes, and when (monotonic); a socket timeout (BOUND_S) fails the test."""
    data = b""
    try:
        while chunk := s.recv(65536):
            data += chunk
    except socket.timeout:
        raise AssertionError(f"held open for {BOUND_S:g} s; got {data[:200]!r}") from None
    finally:
        s.close()
    return data, time.monotonic()


def request(port: int, raw: bytes) -> bytes:
    return read_to_close(connect(port, raw))[0]


def one_line_408(answer: bytes, *parts: str) -> str:
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 408 "), answer[:300]
    assert b"connection: close" in head.lower() and b"application/json" in head.lower(), head
    error = json.loads(body)["error"]
    assert set(json.loads(body)) == {"error"} and "\n" not in error, body
    for p in parts:
        assert p in error, (p, error)
    return error


def test_slow_request_headers_are_answered_408_then_closed(ranker):
    """Before: a partial request line, an empty connection and a partial second request on a kept-alive connection
    were all held open for good (uvicorn times out only the idle wait between requests)."""
    with serving(ranker, header_timeout_s=2.0, body_timeout_s=60.0) as (port, _, _):
        t0 = time.monotonic()  # the server's clock starts later, when it accepts
        partial = connect(port, SLOW_HEADERS)
        silent = connect(port, b"")
        kept = connect(port, b"GET /healthz HTTP/1.1\r\nHost: t\r\n\r\n")
        first = b""
        while b'{"status":"ok"}' not in first:
            first += kept.recv(65536)
        assert first.startswith(b"HTTP/1.1 200 ")
        kept.sendall(b"GET /healthz HTTP/1.1\r\nHo")  # the next request, never finished
        answer, closed = read_to_close(partial)
        one_line_408(answer, "request headers not received within 2 s")
        assert 1.5 < closed - t0 < BOUND_S
        assert read_to_close(silent)[0] == b""  # nothing was asked: closed without a word
        one_line_408(read_to_close(kept)[0], "request headers not received within 2 s")
        assert request(port, b"GET /healthz HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n").startswith(
            b"HTTP/1.1 200 "
        )


def test_a_slow_body_is_answered_408_then_closed(ranker, caplog):
    """Before: `Content-Length: 100` and 2 bytes sent got no answer and no close (30 of them held for 47 s)."""
    with caplog.at_level(logging.INFO, logger="medrank.serving.access"):
        with serving(ranker, header_timeout_s=60.0, body_timeout_s=2.0) as (port, _, _):
            t0 = time.monotonic()
            answer, closed = read_to_close(connect(port, SLOW_BODY))
            one_line_408(answer, "body: not received within 2 s")
            assert 1.5 < closed - t0 < BOUND_S
            body = json.dumps(json.loads((FIXTURES / "rank_input.json").read_text())).encode()
            head = f"POST /rank HTTP/1.1\r\nHost: t\r\nConnection: close\r\nContent-Length: {len(body)}\r\n\r\n"
            assert request(port, head.encode() + body).startswith(b"HTTP/1.1 200 ")  # others are served
    log = [json.loads(r.getMessage()) for r in caplog.records if r.name == "medrank.serving.access"]
    assert [x["status"] for x in log if x["path"] == "/rank"] == [408, 200]


def test_a_client_gone_mid_body_is_not_an_internal_error(ranker, caplog):
    """Before: a client that closed after 2 of its 100 bytes was logged as an internal error, twice with a traceback
    (the app's handler, then uvicorn's), and 500 in the access log."""
    with caplog.at_level(logging.INFO):
        with serving(ranker, header_timeout_s=60.0, body_timeout_s=60.0) as (port, _, _):
            connect(port, SLOW_BODY).close()
            deadline = time.monotonic() + BOUND_S
            while not any(r.name == "medrank.serving.access" and "/rank" in r.getMessage() for r in caplog.records):
                assert time.monotonic() < deadline, "the request never ended"
                time.sleep(0.05)
    rank = [json.loads(r.getMessage()) for r in caplog.records if r.name == "medrank.serving.access"]
    assert [x["status"] for x in rank if x["path"] == "/rank"] == [499]
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []


@pytest.mark.parametrize("payload", [SLOW_HEADERS, SLOW_BODY], ids=["headers", "body"])
def test_slow_clients_cannot_hold_every_connection(ranker, payload, caplog):
    """Before: slow clients up to uvicorn's limit_concurrency made every other request a plain-text 503 for as long as
    they stayed (for good: nothing timed them out). Now a new connection at the limit closes the one that has waited
    longest for its request (408) and is served."""
    limit = 8
    with caplog.at_level(logging.INFO):
        with serving(ranker, header_timeout_s=60.0, body_timeout_s=60.0, limit_concurrency=limit) as (port, srv, _):
            slow = []
            for _ in range(limit - 1):  # the next connection reaches the limit
                slow.append(connect(port, payload))
                time.sleep(0.05)  # in order: the first is the oldest
            deadline = time.monotonic() + BOUND_S
            while len(srv.server_state.connections) < limit - 1:
                assert time.monotonic() < deadline
                time.sleep(0.02)
            time.sleep(1.5)  # past EVICT_AFTER_S: a connection just made is never evicted
            healthz = request(port, b"GET /healthz HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
            assert healthz.startswith(b"HTTP/1.1 200 "), healthz
            one_line_408(read_to_close(slow[0])[0], "the request had not arrived after", "limit of 8 connections")
            body = (FIXTURES / "rank_input.json").read_bytes()
            head = f"POST /rank HTTP/1.1\r\nHost: t\r\nConnection: close\r\nContent-Length: {len(body)}\r\n\r\n"
            assert request(port, head.encode() + body).startswith(b"HTTP/1.1 200 ")
            for s in slow[1:]:  # the younger ones are still waited on
                s.setblocking(False)
                with pytest.raises(BlockingIOError):
                    s.recv(1)
                s.close()
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []


def test_a_slow_body_does_not_hold_a_graceful_shutdown(ranker):
    """Before: SIGTERM (`should_exit`, with `medrank serve`'s timeout_graceful_shutdown=None) waited for good on a
    request whose body never came."""
    with serving(ranker, header_timeout_s=60.0, body_timeout_s=2.0, timeout_graceful_shutdown=None) as (port, srv, t):
        slow = connect(port, SLOW_BODY)
        deadline = time.monotonic() + BOUND_S
        while not srv.server_state.tasks:  # the request reached the app
            assert time.monotonic() < deadline
            time.sleep(0.02)
        srv.should_exit = True
        t.join(BOUND_S)
        assert not t.is_alive(), "shutdown held by the slow body"
        one_line_408(read_to_close(slow)[0], "body: not received within 2 s")


@pytest.mark.parametrize(
    "args, line",
    [
        (["--header-timeout", "0"], "error: --header-timeout must be a number of seconds from 0.5, got 0.0"),
        (["--header-timeout", "inf"], "error: --header-timeout must be a number of seconds from 0.5, got inf"),
        (["--body-timeout", "0.1"], "error: --body-timeout must be a number of seconds from 0.5, got 0.1"),
        (["--body-timeout", "nan"], "error: --body-timeout must be a number of seconds from 0.5, got nan"),
    ],
)
def test_bad_deadlines_are_one_line(tmp_path, monkeypatch, capsys, args, line):
    from medrank.cli import main

    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as e:
        main(["serve", *args])
    assert e.value.code == 2 and error_lines(capsys.readouterr().err) == [line]


@pytest.mark.parametrize("workers", [1, 2])
def test_medrank_serve_gives_both_deadlines_to_every_process(monkeypatch, workers):
    """One process: the app and protocol uvicorn runs; --workers: the config each worker reads and a protocol that
    pickles to them (uvicorn spawns its workers)."""
    import medrank.serving.app as app_module
    from medrank.cli import main

    seen: dict = {}
    monkeypatch.setattr(app_module, "load_ranker", lambda config: object())
    monkeypatch.setattr(uvicorn, "run", lambda app, **kw: seen.update(app=app, **kw))
    monkeypatch.setenv(CONFIG_ENV, "")  # restored after: the workers path sets it
    assert main(["serve", "--workers", str(workers), "--header-timeout", "3", "--body-timeout", "7"]) in (0, None)
    protocol = pickle.loads(pickle.dumps(seen["http"]))
    assert protocol.func is SlowClientProtocol and protocol.keywords == {"header_timeout_s": 3.0}
    assert seen["limit_concurrency"] == 4 * (16 + 1) + 16
    if workers == 1:
        config = seen["app"].state.service.config
    else:
        assert seen["app"] == "medrank.serving.app:app_from_env" and seen["workers"] == 2
        config = ServeConfig(**json.loads(os.environ[CONFIG_ENV]))
    assert (config.header_timeout_s, config.body_timeout_s) == (3.0, 7.0)
