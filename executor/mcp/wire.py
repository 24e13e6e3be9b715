"""The JSON-RPC wire between the SDK's session and the stdio transport, observed.

The SDK's dispatcher correlates responses by id and silently drops one whose id
it does not know, so a server that answers under the wrong id leaves the call
hanging until its timeout and the answer unattributed. The ids are only
visible on the message streams, so the transport's two streams are wrapped
here:

- the write side records every request id before it is handed to the
  transport, and links `tools/call` ids to the toolfence call through a
  correlation token the call carries in `params._meta`;
- the read side checks every response id against the requests still
  outstanding. A late answer to a request we abandoned (timed out, cancelled)
  is dropped, as the SDK would. Any other unknown id (never sent, answered
  twice, `null`, or the right number as a string) is a protocol violation:
  the response is refused, never delivered, and the stream is ended, which
  fails every pending request of the session with "connection closed"; the
  caller sees the violation recorded here and reports it as such.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter, OrderedDict
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Literal, TextIO

import anyio
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.shared.message import SessionMessage
from mcp_types import JSONRPCError, JSONRPCNotification, JSONRPCRequest, JSONRPCResponse

from executor.mcp.correlation import JsonRpcId
from executor.mcp.process import ServerProcess

logger = logging.getLogger("toolfence.mcp.wire")

CORRELATION_META_KEY = "io.toolfence/correlation"
_SETTLED_MEMORY = 4096

_IdKey = tuple[str, JsonRpcId]


def _key(request_id: JsonRpcId) -> _IdKey:
    # Type-strict: JSON-RPC requires the response id to be the request's value,
    # and 7 and "7" are different values (the SDK would coerce them).
    return (type(request_id).__name__, request_id)


@dataclass
class WireStats:
    """Counters over every session of one connection (they survive restarts)."""

    requests_sent: Counter[str] = field(default_factory=Counter)
    refused_responses: int = 0
    late_responses_dropped: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def count_request(self, method: str) -> None:
        with self._lock:
            self.requests_sent[method] += 1

    def count_refused(self) -> None:
        with self._lock:
            self.refused_responses += 1

    def count_late(self) -> None:
        with self._lock:
            self.late_responses_dropped += 1

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            return {
                "requests_sent": dict(self.requests_sent),
                "refused_responses": self.refused_responses,
                "late_responses_dropped": self.late_responses_dropped,
            }


@dataclass
class InFlightCall:
    """What the wire saw of one toolfence call."""

    correlation_token: str
    jsonrpc_request_ids: list[JsonRpcId] = field(default_factory=list)
    # True once a request was handed to the transport: from then on the server
    # may have acted on it, whatever happens next.
    delivered: bool = False
    # True once the server's own response to it arrived. An error without one
    # was made up locally by the SDK (timeout, connection closed).
    answered: bool = False


class WireObserver:
    """Outstanding request ids of one session and the calls they belong to.

    Lives on the session's event loop; only touched from it.
    """

    def __init__(self, stats: WireStats) -> None:
        self.stats = stats
        self.violation: str | None = None
        self.ended = anyio.Event()
        self._outstanding: dict[_IdKey, str] = {}
        self._settled: OrderedDict[_IdKey, None] = OrderedDict()
        self._calls: dict[str, InFlightCall] = {}
        self._call_by_request: dict[_IdKey, InFlightCall] = {}

    # ------------------------------------------------ calls

    def begin_call(self, correlation_token: str) -> InFlightCall:
        call = InFlightCall(correlation_token)
        self._calls[correlation_token] = call
        return call

    def end_call(self, correlation_token: str) -> None:
        call = self._calls.pop(correlation_token, None)
        if call is None:
            return
        for request_id in call.jsonrpc_request_ids:
            self._call_by_request.pop(_key(request_id), None)
            # Still outstanding means abandoned (timeout, cancellation): its
            # answer may yet arrive and is then dropped, not treated as rogue.
            if self._outstanding.pop(_key(request_id), None) is not None:
                self._remember_settled(_key(request_id))

    # ------------------------------------------------ outbound

    def request_written(self, message: JSONRPCRequest) -> None:
        self._outstanding[_key(message.id)] = message.method
        self.stats.count_request(message.method)
        call = self._call_of(message)
        if call is not None:
            call.jsonrpc_request_ids.append(message.id)
            call.delivered = True
            self._call_by_request[_key(message.id)] = call

    def request_not_delivered(self, message: JSONRPCRequest) -> None:
        self._outstanding.pop(_key(message.id), None)
        call = self._call_of(message)
        if call is not None and call.jsonrpc_request_ids == [message.id]:
            call.delivered = False

    def request_cancelled(self, request_id: Any) -> None:
        if isinstance(request_id, int | str) and not isinstance(request_id, bool):
            key = _key(request_id)
            if self._outstanding.pop(key, None) is not None:
                self._remember_settled(key)

    def _call_of(self, message: JSONRPCRequest) -> InFlightCall | None:
        if message.method != "tools/call" or not message.params:
            return None
        meta = message.params.get("_meta")
        token = meta.get(CORRELATION_META_KEY) if isinstance(meta, dict) else None
        return self._calls.get(token) if isinstance(token, str) else None

    def _remember_settled(self, key: _IdKey) -> None:
        self._settled[key] = None
        while len(self._settled) > _SETTLED_MEMORY:
            self._settled.popitem(last=False)

    # ------------------------------------------------ inbound

    def response_received(self, response_id: JsonRpcId | None) -> Literal["accept", "late", "refuse"]:
        if response_id is None:
            return "refuse"
        key = _key(response_id)
        if self._outstanding.pop(key, None) is not None:
            call = self._call_by_request.get(key)
            if call is not None:
                call.answered = True
            return "accept"
        if key in self._settled:
            self.stats.count_late()
            return "late"
        return "refuse"

    def refuse(self, reason: str) -> None:
        self.stats.count_refused()
        if self.violation is None:
            self.violation = reason
        self.ended.set()

    def mark_ended(self) -> None:
        self.ended.set()


class ObservedReadStream:
    """The transport's read stream, refusing responses whose id matches no request."""

    def __init__(self, inner: Any, observer: WireObserver) -> None:
        self._inner = inner
        self._observer = observer
        self._stopped = False

    async def receive(self) -> SessionMessage | Exception:
        while True:
            if self._stopped:
                raise anyio.EndOfStream
            try:
                item: SessionMessage | Exception = await self._inner.receive()
            except (anyio.EndOfStream, anyio.ClosedResourceError):
                self._observer.mark_ended()
                raise anyio.EndOfStream from None
            if isinstance(item, SessionMessage) and isinstance(
                item.message, JSONRPCResponse | JSONRPCError
            ):
                verdict = self._observer.response_received(item.message.id)
                if verdict == "late":
                    logger.debug("dropped a late response to an abandoned request")
                    continue
                if verdict == "refuse":
                    logger.warning(
                        "MCP server answered with a response id that matches no pending "
                        "request; refusing it and closing the session"
                    )
                    self._stopped = True
                    self._observer.refuse("response id matches no pending request")
                    raise anyio.EndOfStream
            return item

    def __aiter__(self) -> ObservedReadStream:
        return self

    async def __anext__(self) -> SessionMessage | Exception:
        try:
            return await self.receive()
        except anyio.EndOfStream:
            raise StopAsyncIteration from None

    async def aclose(self) -> None:
        self._observer.mark_ended()
        await self._inner.aclose()

    async def __aenter__(self) -> ObservedReadStream:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc_val: BaseException | None,
        exc_tb: TracebackType | None,
    ) -> bool | None:
        await self.aclose()
        return None


class ObservedWriteStream:
    """The transport's write stream, recording request ids before they leave."""

    def __init__(self, inner: Any, observer: WireObserver) -> None:
        self._inner = inner
        self._observer = observer

    async def send(self, item: SessionMessage, /) -> None:
        message = item.message
        if isinstance(message, JSONRPCRequest):
            # Recorded before the send: a fast answer must find its id outstanding.
            self._observer.request_written(message)
            try:
                await self._inner.send(item)
            except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                # Only these prove the message never reached the transport; any
                # other interruption may have delivered it.
                self._observer.request_not_delivered(message)
                raise
            return
        if isinstance(message, JSONRPCNotification) and message.method == "notifications/cancelled":
            self._observer.request_cancelled((message.params or {}).get("requestId"))
        await self._inner.send(item)

    async def aclose(self) -> None:
        await self._inner.aclose()

    async def __aenter__(self) -> ObservedWriteStream:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc_val: BaseException | None,
        exc_tb: TracebackType | None,
    ) -> bool | None:
        await self.aclose()
        return None


class ObservedStdioTransport:
    """`stdio_client` with observed streams; an `mcp.client.Transport` for `Client`."""

    def __init__(
        self, params: StdioServerParameters, observer: WireObserver, errlog: TextIO
    ) -> None:
        self._params = params
        self._observer = observer
        self._errlog = errlog
        self._context: Any = None
        # Set once the server is spawned: what healing kills.
        self.server_process: ServerProcess | None = None

    async def __aenter__(self) -> tuple[ObservedReadStream, ObservedWriteStream]:
        self._context = stdio_client(self._params, errlog=self._errlog)
        read_stream, write_stream = await self._context.__aenter__()
        self.server_process = ServerProcess.from_stdio_context(self._context)
        return (
            ObservedReadStream(read_stream, self._observer),
            ObservedWriteStream(write_stream, self._observer),
        )

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc_val: BaseException | None,
        exc_tb: TracebackType | None,
    ) -> bool | None:
        self._observer.mark_ended()
        try:
            result: bool | None = await self._context.__aexit__(exc_type, exc_val, exc_tb)
        finally:
            if self.server_process is not None:
                self.server_process.release()
        return result
