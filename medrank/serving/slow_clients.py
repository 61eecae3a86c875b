"""Slow clients bounded: a request's headers must arrive within `header_timeout_s` (of the connection, or of its first
byte on a kept-alive one) and its body within `body_timeout_s` of the headers; past either, 408 in the app's one-line
JSON where a response is still possible, else the connection is closed. At uvicorn's `limit_concurrency` open
connections, a new one closes the connection that has waited longest for its request, so slow ones cannot hold every
slot. The headers are the protocol's (SlowClientProtocol, uvicorn's h11 one); the body is the app's (BodyDeadline)."""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import math
import time
from typing import Any

from uvicorn.protocols.http.h11_impl import H11Protocol

from medrank.core.errors import MedrankError
from medrank.serving.protocol import RequestError

HEADER_TIMEOUT_S = 10.0
BODY_TIMEOUT_S = 30.0
MIN_TIMEOUT_S = 0.5  # below it a healthy client on a slow link could not make it
EVICT_AFTER_S = 1.0  # a request waited on for less is not evicted: a client that just connected is mid-send
EVICTED = "medrank.evicted"  # scope key: the protocol closed this request mid-body (BodyDeadline answers 408 for it)

access_log = logging.getLogger("medrank.serving.access")


def check_timeout(name: str, value: float) -> None:
    if not MIN_TIMEOUT_S <= value < math.inf:  # NaN fails both comparisons
        raise MedrankError(f"{name} must be a number of seconds from {MIN_TIMEOUT_S:g}, got {value}")


def timeout_response(message: str) -> bytes:
    """A whole 408 answer with the app's {"error": ...} body, written where no request reached the app."""
    body = json.dumps({"error": message}, separators=(",", ":")).encode()
    head = (
        "HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
    )
    return head.encode() + body


class SlowClientProtocol(H11Protocol):
    """uvicorn's h11 protocol with a deadline on the request headers (uvicorn has none: its keep-alive timer only
    runs between requests, and the first byte of the next one cancels it) and eviction of the slowest request."""

    def __init__(self, *args: Any, header_timeout_s: float = HEADER_TIMEOUT_S, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.header_timeout_s = header_timeout_s
        self.header_timer: asyncio.TimerHandle | None = None
        self.waiting_since = time.monotonic()  # since when this connection's current request has been awaited

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self.waiting_since = time.monotonic()
        self.watch_headers(True)  # a connection that sends nothing is bounded too
        self.evict_if_full()

    def connection_lost(self, exc: Exception | None) -> None:
        self.stop_header_timer()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        self.watch_headers(True)

    def on_response_complete(self) -> None:
        self.waiting_since = time.monotonic()
        super().on_response_complete()  # arms uvicorn's keep-alive timer for the idle wait; may start a pipelined one
        self.watch_headers(bool(self.conn.trailing_data[0]))  # part of the next request came with the last one

    def awaiting_headers(self) -> bool:
        return self.cycle is None or self.cycle.response_complete

    def incomplete(self) -> bool:
        """Its request has not all arrived (headers, or body before any answer): evictable, nothing is lost."""
        c = self.cycle
        return self.awaiting_headers() or (c.more_body and not c.response_started and not c.disconnected)

    def watch_headers(self, started: bool) -> None:
        if not self.awaiting_headers() or self.transport.is_closing():
            self.stop_header_timer()
        elif started and self.header_timer is None:
            self.header_timer = self.loop.call_later(self.header_timeout_s, self.headers_timed_out)

    def stop_header_timer(self) -> None:
        if self.header_timer is not None:
            self.header_timer.cancel()
            self.header_timer = None

    def headers_timed_out(self) -> None:
        self.header_timer = None
        if self.awaiting_headers() and not self.transport.is_closing():
            self.give_up(f"request headers not received within {self.header_timeout_s:g} s")

    def evict_if_full(self) -> None:
        """At the limit, close the connections (not this one) waiting longest for their request, till there is room."""
        limit = self.config.limit_concurrency
        while limit is not None and len(self.connections) >= limit:
            now = time.monotonic()
            waiting = [
                c
                for c in self.connections
                if isinstance(c, SlowClientProtocol)
                and c is not self
                and c.incomplete()
                and now - c.waiting_since >= EVICT_AFTER_S
            ]
            if not waiting:
                return  # every other connection has a request in flight: uvicorn answers 503
            victim = min(waiting, key=lambda c: c.waiting_since)
            victim.give_up(
                f"the request had not arrived after {now - victim.waiting_since:.1f} s and the server is at its "
                f"limit of {limit} connections"
            )

    def give_up(self, message: str) -> None:
        """408 with `message` where part of a request came and nothing was answered, then close; uncounted at once."""
        self.stop_header_timer()
        self.connections.discard(self)
        if self.transport.is_closing():
            return
        cycle, pending = self.cycle, self.conn.trailing_data[0]
        if self.awaiting_headers():
            if pending:  # a connection that sent nothing is closed without a word, as an idle one is
                self.transport.write(timeout_response(message))
                record = {"method": None, "path": None, "status": 408, "bytes_in": len(pending), "error": message}
                access_log.info(json.dumps({**record, "client": (self.client or [None])[0]}, separators=(",", ":")))
        else:  # mid-body: its handler sees the client go (BodyDeadline answers 408, which the access log records)
            self.transport.write(timeout_response(message))
            cycle.scope[EVICTED] = message  # type: ignore[literal-required]
            cycle.disconnected = True  # as connection_lost does; set now, so nothing else is written
            cycle.message_event.set()
        self.transport.close()


def slow_client_protocol(header_timeout_s: float) -> Any:
    """uvicorn's `http` option: SlowClientProtocol with this header deadline (a partial pickles to --workers)."""
    return functools.partial(SlowClientProtocol, header_timeout_s=header_timeout_s)


class BodyDeadline:
    """ASGI middleware: the request body must have arrived `timeout_s` after the headers, else 408 (one line, then
    close); a client gone mid-body ends its request quietly (499, as nginx logs it), not as an internal error."""

    def __init__(self, app: Any, timeout_s: float = BODY_TIMEOUT_S) -> None:
        self.app, self.timeout_s = app, timeout_s

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeout_s
        state = {"body_done": False, "answered": False}

        async def bounded_receive() -> dict:
            if state["body_done"] or state["answered"]:
                return await receive()
            try:
                message = await asyncio.wait_for(receive(), max(deadline - loop.time(), 0))
            except asyncio.TimeoutError:
                raise RequestError(
                    408, f"body: not received within {self.timeout_s:g} s", {"Connection": "close"}
                ) from None
            if message["type"] == "http.request" and not message.get("more_body", False):
                state["body_done"] = True
            elif message["type"] == "http.disconnect":
                if scope.get(EVICTED):
                    raise RequestError(408, scope[EVICTED])
                raise RequestError(499, "the client closed the connection before its body was complete")
            return message

        async def watching_send(message: dict) -> None:
            state["answered"] = True
            await send(message)

        await self.app(scope, bounded_receive, watching_send)
