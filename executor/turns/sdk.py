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
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from executor.turns.drivers import DriverError
from executor.turns.values import JSON_MODE, ModelRequest, ModelResponse, Usage

MAX_OUTPUT_TOKENS = 4096


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
        raw = _dump(completion)
        usage = raw.get("usage") or {}
        record = Usage(
            model=str(raw.get("model") or self.model), purpose=request.purpose,
            input_tokens=int(usage.get("prompt_tokens") or 0),
            output_tokens=int(usage.get("completion_tokens") or 0),
            latency_seconds=time.perf_counter() - started,
        )
        if self.mode == JSON_MODE:
            choices = raw.get("choices") or [{}]
            return ModelResponse(usage=record, text=(choices[0].get("message") or {}).get("content") or "")
        return ModelResponse(usage=record, raw=raw)


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
        raw = _dump(response)
        usage = raw.get("usage") or {}
        record = Usage(
            model=str(raw.get("model") or self.model), purpose=request.purpose,
            input_tokens=int(usage.get("input_tokens") or 0),
            output_tokens=int(usage.get("output_tokens") or 0),
            latency_seconds=time.perf_counter() - started,
        )
        if self.mode == JSON_MODE:
            from executor.turns.native import READ_TEXT

            return ModelResponse(usage=record, text=READ_TEXT["openai-responses"](raw))
        return ModelResponse(usage=record, raw=raw)


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
        try:
            message = self.client.messages.create(
                model=self.model, max_tokens=MAX_OUTPUT_TOKENS,
                messages=[{"role": "user", "content": request.prompt}], **kwargs,
            )
        except Exception as exc:
            raise _error(exc) from None
        raw = _dump(message)
        usage = raw.get("usage") or {}
        record = Usage(
            model=str(raw.get("model") or self.model), purpose=request.purpose,
            input_tokens=int(usage.get("input_tokens") or 0),
            output_tokens=int(usage.get("output_tokens") or 0),
            latency_seconds=time.perf_counter() - started,
        )
        if self.mode == JSON_MODE:
            from executor.turns.native import READ_TEXT

            return ModelResponse(usage=record, text=READ_TEXT["anthropic"](raw))
        return ModelResponse(usage=record, raw=raw)


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
        raw = _dump(response)
        usage = raw.get("usage_metadata") or {}
        record = Usage(
            model=str(raw.get("model_version") or self.model), purpose=request.purpose,
            input_tokens=int(usage.get("prompt_token_count") or 0),
            output_tokens=int(usage.get("candidates_token_count") or 0),
            latency_seconds=time.perf_counter() - started,
        )
        if self.mode == JSON_MODE:
            from executor.turns.native import READ_TEXT

            return ModelResponse(usage=record, text=READ_TEXT["gemini"](raw))
        return ModelResponse(usage=record, raw=raw)


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
