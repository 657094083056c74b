"""Limits uvicorn does not enforce by itself: a deadline for the request head and a bounded,
timed body read.

uvicorn (h11 protocol) bounds the request head's size (``h11_max_incomplete_event_size``,
16 KiB by default: larger → 400 and close) and closes a keep-alive connection idle for
``timeout_keep_alive`` after a response, but arms no timer before a connection's first
request, and cancels the keep-alive timer at the first byte of the next one: a client that
connects and sends nothing, or half a request line, holds its connection (and a slot of
``limit_concurrency``) for ever. :func:`protocol_class` adds one timer: from the moment a
connection opens, or a response completes, the next request head must be complete within
``head_timeout_s``, else the connection is closed (RFC 9110 §15.5.9 lets a server close an
idle connection without a 408). A request h11 cannot parse gets a JSON 400 like every other
error (uvicorn's own is plain text).

:func:`read_body` reads a request body through the ASGI ``receive`` stream (chunked bodies
arrive there decoded) with a byte limit checked before anything is read (Content-Length)
and again as the bytes arrive, and a time limit for the whole body; uvicorn stops reading
the socket while more than 64 KiB wait unread (its flow control), so what a too-large or
stalled body costs the server is bounded by the limit.
"""

from __future__ import annotations

import asyncio
import json

import h11
from starlette.requests import ClientDisconnect, Request
from uvicorn.protocols.http.h11_impl import H11Protocol


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


def protocol_class(head_timeout_s: float) -> type[H11Protocol]:
    """uvicorn's h11 protocol with a deadline for each request head (module docstring)."""
    if not head_timeout_s > 0:
        raise ValueError(f"head_timeout_s: expected > 0, got {head_timeout_s!r}")

    class HeadTimeoutProtocol(H11Protocol):
        _head_timer: asyncio.TimerHandle | None = None

        def _arm_head(self) -> None:
            self._disarm_head()
            self._head_timer = self.loop.call_later(head_timeout_s, self._head_timeout)

        def _disarm_head(self) -> None:
            if self._head_timer is not None:
                self._head_timer.cancel()
                self._head_timer = None

        def _in_request(self) -> bool:  # a request head arrived and its response is not complete
            return self.conn.our_state in (h11.SEND_RESPONSE, h11.SEND_BODY)

        def _head_timeout(self) -> None:
            self._head_timer = None
            if not self._in_request() and not self.transport.is_closing():
                self.transport.close()

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._arm_head()

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            if self._head_timer is not None and self._in_request():
                self._disarm_head()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.transport.is_closing() and not self._in_request():
                self._arm_head()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm_head()
            super().connection_lost(exc)

        def send_400_response(self, msg: str) -> None:  # a request h11 cannot parse: JSON like every error
            body = json.dumps({"error": f"{msg} (not HTTP/1.1, or a head over the size limit)"}).encode()
            headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                       (b"connection", b"close")]
            for event in (h11.Response(status_code=400, headers=headers, reason=b"Bad Request"), h11.Data(data=body),
                          h11.EndOfMessage()):
                self.transport.write(self.conn.send(event) or b"")
            self.transport.close()

    return HeadTimeoutProtocol


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
