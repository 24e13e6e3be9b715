"""SDK drivers: OpenAI (Chat Completions, Responses), Anthropic Messages, Gemini.

Each is built on the provider's official SDK, imported only when the driver is
built (a worker that never runs one never loads it). A driver sends one
request (the assembled prompt as the user message, plus, in native mode, the
tools in the surface's own declaration format from `executor.providers`) and
returns the SDK's response as JSON (`model_dump(mode="json")`), which the
surface's adapter reads; `+json` drivers (`openai-chat+json:MODEL`) send no
tools and return the text for the JSON contract. Drivers execute nothing and
hold no tools of their own. The SDK's client is injectable (`client=`), so tests
round-trip recorded responses through the SDK's own HTTP layer with a mock
transport; by default each SDK reads its API key from its usual environment
variable.

The Anthropic driver continues a response the API paused (`stop_reason:
pause_turn`, a long-running server tool): it sends the paused content back as
the assistant's turn, as the API expects, at most `request.max_continuations`
times (what is left of the turn's step budget), and answers with every round's
content in order (the provider-run calls of each round included) and the
tokens of all of them. Still paused after that, the turn ends
`response_refused` (`pause_turn`), as it does when a continuation fails (the
rounds before it are answered, never lost); the `+json` variant, whose contract
sees only the text, raises a permanent `DriverError` `pause_turn` instead.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from executor.turns.drivers import DriverError
from executor.turns.values import JSON_MODE, ModelRequest, ModelResponse, Usage

MAX_OUTPUT_TOKENS = 4096
PAUSE_TURN = "pause_turn"  # executor.providers.anthropic_messages.PAUSE_TURN, without importing the adapters


def _error(exc: Exception) -> DriverError:
    """An SDK failure as a driver error: retryable for connection trouble, timeouts,
    rate limits and 5xx; never the SDK's message (it may quote the request)."""
    status = getattr(exc, "status_code", None) or getattr(exc, "code", None)
    name = type(exc).__name__
    retryable = (
        "Connection" in name or "Timeout" in name or "RateLimit" in name
        or (isinstance(status, int) and (status == 429 or status >= 500))
    )
    return DriverError("provider_error", f"{name} (status {status})", retryable=retryable)


def _dump(value: Any) -> dict[str, Any]:
    dumped: dict[str, Any] = value.model_dump(mode="json")
    return dumped


def _answer(
    raw: dict[str, Any], request: ModelRequest, *, surface: str, mode: str, model: str,
    started: float, usage_field: str, input_field: str, output_field: str, model_field: str = "model",
) -> ModelResponse:
    """One SDK response as the driver's answer: the usage record (each surface names its
    token counts differently), then the text for the JSON contract or the raw response
    for the surface's adapter."""
    usage = raw.get(usage_field) or {}
    record = Usage(
        model=str(raw.get(model_field) or model), purpose=request.purpose,
        input_tokens=int(usage.get(input_field) or 0),
        output_tokens=int(usage.get(output_field) or 0),
        latency_seconds=time.perf_counter() - started,
    )
    if mode == JSON_MODE:
        from executor.turns.native import READ_TEXT

        return ModelResponse(usage=record, text=READ_TEXT[surface](raw))
    return ModelResponse(usage=record, raw=raw)


@dataclass
class OpenAIChatDriver:
    model: str
    client: Any = None
    mode: str = "openai-chat"

    def call(self, request: ModelRequest) -> ModelResponse:
        if self.client is None:
            import openai

            self.client = openai.OpenAI()
        started = time.perf_counter()
        kwargs: dict[str, Any] = {}
        if self.mode != JSON_MODE and request.native_tools:
            kwargs["tools"] = list(request.native_tools)
        try:
            completion = self.client.chat.completions.create(
                model=self.model, messages=[{"role": "user", "content": request.prompt}],
                max_completion_tokens=MAX_OUTPUT_TOKENS, **kwargs,
            )
        except Exception as exc:
            raise _error(exc) from None
        return _answer(
            _dump(completion), request, surface="openai-chat", mode=self.mode, model=self.model,
            started=started, usage_field="usage", input_field="prompt_tokens",
            output_field="completion_tokens",
        )


@dataclass
class OpenAIResponsesDriver:
    model: str
    client: Any = None
    mode: str = "openai-responses"

    def call(self, request: ModelRequest) -> ModelResponse:
        if self.client is None:
            import openai

            self.client = openai.OpenAI()
        started = time.perf_counter()
        kwargs: dict[str, Any] = {}
        if self.mode != JSON_MODE and request.native_tools:
            kwargs["tools"] = list(request.native_tools)
        try:
            response = self.client.responses.create(
                model=self.model, input=request.prompt, max_output_tokens=MAX_OUTPUT_TOKENS,
                store=False, **kwargs,
            )
        except Exception as exc:
            raise _error(exc) from None
        return _answer(
            _dump(response), request, surface="openai-responses", mode=self.mode, model=self.model,
            started=started, usage_field="usage", input_field="input_tokens", output_field="output_tokens",
        )


@dataclass
class AnthropicDriver:
    model: str
    client: Any = None
    mode: str = "anthropic"

    def call(self, request: ModelRequest) -> ModelResponse:
        if self.client is None:
            import anthropic

            self.client = anthropic.Anthropic()
        started = time.perf_counter()
        kwargs: dict[str, Any] = {}
        if self.mode != JSON_MODE and request.native_tools:
            kwargs["tools"] = list(request.native_tools)
        messages: list[dict[str, Any]] = [{"role": "user", "content": request.prompt}]
        content: list[Any] = []
        input_tokens = output_tokens = 0
        raw: dict[str, Any] = {}
        for round_ in range(max(0, request.max_continuations) + 1):
            if round_:
                # Every round's content so far, sent back as the assistant's turn (and the
                # code-execution container it ran in): the API continues it.
                messages = [messages[0], {"role": "assistant", "content": list(content)}]
                container = raw.get("container")
                if isinstance(container, dict) and isinstance(container.get("id"), str):
                    kwargs["container"] = container["id"]
            try:
                message = self.client.messages.create(
                    model=self.model, max_tokens=MAX_OUTPUT_TOKENS, messages=messages, **kwargs,
                )
            except Exception as exc:
                if not round_:
                    raise _error(exc) from None
                # A continuation failed: the rounds before it happened (their server
                # tools ran), so they are answered, still paused, for the turn to record
                # their hosted calls and end `pause_turn`; raising would lose them, and
                # a retry would run them again.
                break
            raw = _dump(message)
            usage = raw.get("usage") or {}
            input_tokens += int(usage.get("input_tokens") or 0)
            output_tokens += int(usage.get("output_tokens") or 0)
            content.extend(raw.get("content") or [])
            if raw.get("stop_reason") != PAUSE_TURN:
                break
        else:
            if self.mode == JSON_MODE:
                # The JSON contract sees only the text, and a paused turn's text is not
                # an answer: say so (the native mode's adapter path refuses it itself).
                raise DriverError(
                    PAUSE_TURN, f"the response was still paused after {request.max_continuations} "
                    "continuations", retryable=False,  # a retry would run the paused tools again
                )
        raw = {**raw, "content": content,
               "usage": {**usage, "input_tokens": input_tokens, "output_tokens": output_tokens}}
        return _answer(
            raw, request, surface="anthropic", mode=self.mode, model=self.model,
            started=started, usage_field="usage", input_field="input_tokens", output_field="output_tokens",
        )


@dataclass
class GeminiDriver:
    model: str
    client: Any = None
    mode: str = "gemini"

    def call(self, request: ModelRequest) -> ModelResponse:
        from google.genai import types

        if self.client is None:
            from google import genai

            self.client = genai.Client()
        started = time.perf_counter()
        config: dict[str, Any] = {"max_output_tokens": MAX_OUTPUT_TOKENS}
        if self.mode != JSON_MODE and request.native_tools:
            config["tools"] = list(request.native_tools)
            # toolfence runs the calls: the SDK must never call a Python function itself.
            config["automatic_function_calling"] = {"disable": True}
        try:
            response = self.client.models.generate_content(
                model=self.model, contents=request.prompt, config=types.GenerateContentConfig(**config),
            )
        except Exception as exc:
            raise _error(exc) from None
        return _answer(
            _dump(response), request, surface="gemini", mode=self.mode, model=self.model,
            started=started, usage_field="usage_metadata", input_field="prompt_token_count",
            output_field="candidates_token_count", model_field="model_version",
        )


_DRIVERS: Mapping[str, Any] = {
    "openai-chat": OpenAIChatDriver,
    "openai-responses": OpenAIResponsesDriver,
    "anthropic": AnthropicDriver,
    "gemini": GeminiDriver,
}


def build(kind: str, model: str, *, env: Mapping[str, str] | None = None, client: Any = None) -> Any:
    """The SDK driver of `kind` (`+json` for the JSON contract) for `model`."""
    base, _, variant = kind.partition("+")
    factory = _DRIVERS.get(base)
    if factory is None:
        raise DriverError("unknown_driver", f"no SDK driver {kind[:40]!r}")
    if variant not in ("", "json"):
        raise DriverError("bad_driver_spec", f"unknown driver variant {variant[:20]!r}")
    return factory(model=model, client=client, mode=JSON_MODE if variant == "json" else base)
