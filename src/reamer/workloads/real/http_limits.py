"""Limits uvicorn does not enforce by itself: a deadline and a size limit for the request
head, and a bounded, timed body read.

The server runs uvicorn's httptools protocol (the C parser llhttp; with uvloop it costs a
third of the CPU per request of the pure-Python h11 one: 0.085 against 0.22 ms for a 503
to a 12 KiB POST on this machine, bench/overload.py's reason to care). uvicorn closes a
keep-alive connection idle for ``timeout_keep_alive`` after a response, but arms no timer
before a connection's first request and cancels the keep-alive timer at the first byte of
the next one, and with httptools it bounds neither the request line nor the headers: a
client that connects and sends nothing, or half a request line, or an endless header, holds
its connection (and a slot of ``limit_concurrency``) for ever, the last one with growing
memory. :func:`protocol_class` adds both limits: from the moment a connection opens, or a
response completes, the next request head must be complete within ``head_timeout_s``, else
the connection is closed (RFC 9110 §15.5.9 lets a server close an idle connection without a
408); and at most ``max_head_bytes`` may arrive while a head is incomplete (a read that
completes it may carry more: the event loop reads at most 256 KiB at a time), else 431 and
close. A request the parser rejects gets a JSON 400 like every other error (uvicorn's own is
plain text).

:func:`read_body` reads a request body through the ASGI ``receive`` stream (chunked bodies
arrive there decoded) with a byte limit checked before anything is read (Content-Length)
and again as the bytes arrive, and a time limit for the whole body; uvicorn stops reading
the socket while more than 64 KiB wait unread (its flow control), so what a too-large or
stalled body costs the server is bounded by the limit.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable

import httptools
from starlette.requests import ClientDisconnect, Request
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

RECEIVED_AT = "reamer.received_at"  # ASGI scope key: time.monotonic() when the request's first byte was parsed
MAX_HEAD_BYTES = 16 * 1024  # what h11 allows an incomplete head (its DEFAULT_MAX_INCOMPLETE_EVENT_SIZE)


def _raw_json(status: int, reason: str, obj: dict) -> bytes:
    body = json.dumps(obj).encode()
    return (f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\n"
            "connection: close\r\n\r\n").encode() + body


class RequestError(Exception):
    """A request the server answers with ``status`` and ``{"error": message}`` (``close``: the
    connection is closed after the answer). Without ``close`` an unread rest of the body is
    read and discarded (uvicorn drops body data that arrives after the response), for at most
    the head timeout, which the response re-arms: closing a socket with unread data makes
    the kernel send a reset, and a client still sending its body would lose the answer."""

    def __init__(self, status: int, message: str, *, close: bool = False, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.message, self.close = status, message, close
        self.headers = headers or {}


EarlyAnswer = Callable[[bytes, bytes, list[tuple[bytes, bytes]], float], bytes | None]


def protocol_class(head_timeout_s: float, max_head_bytes: int = MAX_HEAD_BYTES,
                   early: EarlyAnswer | None = None) -> type[HttpToolsProtocol]:
    """uvicorn's httptools protocol with a deadline and a size limit for each request head
    (module docstring). ``early(method, path, headers, received_at)`` may answer a request
    from its head alone: the raw HTTP response it returns is written at once (it must say
    ``connection: close``), the body is read and dropped (for at most ``head_timeout_s``) and
    the connection closed after it; the ASGI app never sees the request (what costs least
    for a request that is refused anyway)."""
    if not head_timeout_s > 0 or max_head_bytes < 1:
        raise ValueError(f"expected head_timeout_s > 0 and max_head_bytes >= 1, got {head_timeout_s!r}, {max_head_bytes!r}")

    class LimitedHeadProtocol(HttpToolsProtocol):
        _head_timer: asyncio.TimerHandle | None = None
        _head_bytes = 0  # received since the last head completed (or the connection opened)
        _in_body = False  # between a head's end and its message's end
        _dropping = False  # the body of a request answered early: read, not kept

        def _in_request(self) -> bool:  # a head arrived and its response is not complete
            return self.cycle is not None and not self.cycle.response_complete

        def _arm_head(self) -> None:
            self._disarm_head()
            self._head_timer = self.loop.call_later(head_timeout_s, self._head_timeout)

        def _disarm_head(self) -> None:
            if self._head_timer is not None:
                self._head_timer.cancel()
                self._head_timer = None

        def _head_timeout(self) -> None:
            self._head_timer = None
            if not self._in_request() and not self.transport.is_closing():
                self.transport.close()

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._arm_head()

        def data_received(self, data: bytes) -> None:
            counted = not self._in_body
            super().data_received(data)
            if counted and not self._in_body and not self._in_request() and not self.transport.is_closing():
                self._head_bytes += len(data)  # still no complete head
                if self._head_bytes > max_head_bytes:
                    self.transport.write(_raw_json(431, "Request Header Fields Too Large", {
                        "error": f"request head over {max_head_bytes} bytes"}))
                    self.transport.close()

        def on_message_begin(self) -> None:
            super().on_message_begin()
            self.scope[RECEIVED_AT] = time.monotonic()  # type: ignore[typeddict-unknown-key]

        def on_headers_complete(self) -> None:
            self._disarm_head()
            self._head_bytes, self._in_body = 0, True
            if early is not None and not self._in_request() and not self.pipeline:
                raw = early(self.parser.get_method(), httptools.parse_url(self.url).path, self.headers,
                            self.scope[RECEIVED_AT])  # type: ignore[typeddict-item]
                if raw is not None:
                    self.transport.write(raw)
                    self._dropping = True
                    self._arm_head()  # bounds the wait for the rest of the body
                    return
            super().on_headers_complete()

        def on_body(self, body: bytes) -> None:
            if not self._dropping:
                super().on_body(body)

        def on_message_complete(self) -> None:
            self._in_body = False
            if self._dropping:  # the whole request read: closing now sends no reset
                self.transport.close()
                return
            super().on_message_complete()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.transport.is_closing() and not self._in_request():
                self._arm_head()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm_head()
            super().connection_lost(exc)

        def send_400_response(self, msg: str) -> None:  # a request the parser rejects: JSON like every error
            self.transport.write(_raw_json(400, "Bad Request", {"error": f"{msg} (not HTTP/1.1)"}))
            self.transport.close()

    return LimitedHeadProtocol


async def read_body(request: Request, limit: int, timeout_s: float) -> bytes:
    """The whole body, at most ``limit`` bytes (413 otherwise: before reading when the
    Content-Length says so, else as soon as the bytes read pass it), within ``timeout_s``
    (408). Raises :class:`RequestError`; ``ClientDisconnect`` passes through."""
    cl = request.headers.get("content-length")
    if cl is not None:
        if not cl.isdigit():
            raise RequestError(400, f"Content-Length: expected a number of bytes, got {cl[:40]!r}", close=True)
        if int(cl) > limit:
            raise RequestError(413, f"body of {int(cl)} bytes exceeds the limit of {limit} bytes")
    buf = bytearray()
    try:
        async with asyncio.timeout(timeout_s):
            async for chunk in request.stream():
                buf += chunk
                if len(buf) > limit:
                    raise RequestError(413, f"body exceeds the limit of {limit} bytes")
    except TimeoutError:
        raise RequestError(408, f"body not received within {timeout_s:g} s ({len(buf)} bytes read)",
                           close=True) from None
    return bytes(buf)


__all__ = ["ClientDisconnect", "RequestError", "protocol_class", "read_body"]
