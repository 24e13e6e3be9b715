"""Hypothesis strategies for hostile input, shaped like what reaches toolfence:
JSON values of any type in any position (lone surrogates, NUL, controls, huge
integers, 5,000-deep nesting), provider envelopes of all five surfaces that
are nearly right (each field sometimes replaced by any JSON value), neutral
call lists, and CLI input files. Shared by the suite's bounded targets and
the long `make fuzz` run (bench/fuzz), which draws from the same shapes.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any, TypeVar

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from executor.providers.common import NAME_MARKER

EXAMPLES = int(os.environ.get("TOOLFENCE_FUZZ_EXAMPLES", "2000"))
"""Examples per in-memory target (`TOOLFENCE_FUZZ_EXAMPLES`, 2,000 by default)."""
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
        HealthCheck.filter_too_much,
        HealthCheck.function_scoped_fixture,
    ],
)
DB_FUZZ = settings(FUZZ, max_examples=max(1, EXAMPLES // 2))
"""An example is a rolled-back enqueue."""
SLOW_FUZZ = settings(FUZZ, max_examples=max(1, EXAMPLES // 10))
"""An example is a commit on PostgreSQL (the hosted path) or a request to the app."""

T = TypeVar("T")

# Text as JSON can carry it: any code point, lone surrogates included (`"\ud800"`
# parses), NUL and controls, and the escape shapes tool-name decoding reads.
any_char = st.characters(codec=None, exclude_categories=())
hostile_text = st.one_of(
    st.text(any_char, max_size=40),
    st.sampled_from(
        [
            "",
            " ",
            "\x00",
            "\ud800",
            "\udc80x",
            "a\nb",
            "\x1b[31m",
            "\u202e",
            "x" * 201,
            NAME_MARKER + "_ed_a0_80",
            NAME_MARKER + "_00",
            NAME_MARKER + "_",
            NAME_MARKER + "__",
            NAME_MARKER + "abc--0123456789abcdef",
            "toolfence-gemini-call-0-abc",
            "get_weather",
            "get_time",
            "tf--mcp_2etime_2fget",
            "MAX_TOKENS",
            "tool_use",
            "length",
            "incomplete",
            "requires_action",
            "function_call",
            "function_result",
            "mcp_call",
            "mcp_approval_request",
            "completed",
            "in_progress",
            "STOP",
            "MALFORMED_FUNCTION_CALL",
            "max_tokens",
            "tool_calls",
        ]
    ),
)
numbers = st.one_of(
    st.integers(),
    st.integers(min_value=-(10**400), max_value=10**400),
    st.floats(allow_nan=False, allow_infinity=False),
    st.booleans(),
)
scalars = st.one_of(st.none(), numbers, hostile_text)


def nested(depth: int, leaf: Any = 1, kind: str = "dict") -> Any:
    """`depth` levels of one-member objects (or lists), built without recursion."""
    value = leaf
    for _ in range(depth):
        value = {"a": value} if kind == "dict" else [value]
    return value


deep = st.builds(
    nested, st.integers(min_value=900, max_value=5_000), scalars, st.sampled_from(["dict", "list"])
)

json_values = st.recursive(
    scalars,
    lambda children: st.one_of(
        st.lists(children, max_size=4),
        st.dictionaries(hostile_text, children, max_size=4),
    ),
    max_leaves=12,
)
any_json = st.one_of(json_values, deep)


def maybe(strategy: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """Mostly the right shape, sometimes any JSON value in its place."""
    return st.one_of(strategy, strategy, strategy, any_json)


def obj(
    required: dict[str, st.SearchStrategy[Any]],
    optional: dict[str, st.SearchStrategy[Any]] | None = None,
) -> st.SearchStrategy[Any]:
    """An object with each field nearly right, sometimes extra hostile members,
    sometimes not an object at all."""
    shaped = st.fixed_dictionaries(
        {key: maybe(value) for key, value in required.items()},
        optional={key: maybe(value) for key, value in (optional or {}).items()},
    )
    with_extra = st.builds(
        lambda a, b: {**b, **a}, shaped, st.dictionaries(hostile_text, json_values, max_size=2)
    )
    return st.one_of(shaped, shaped, with_extra, any_json)


tool_names = st.one_of(st.sampled_from(["get_weather", "get_time", "set_alarm"]), hostile_text)
call_ids = st.one_of(st.from_regex(r"call_[a-z0-9]{1,6}", fullmatch=True), hostile_text)
argument_objects = st.one_of(
    st.fixed_dictionaries(
        {"city": maybe(st.text(max_size=10))}, optional={"unit": maybe(st.sampled_from(["c", "f"]))}
    ),
    st.fixed_dictionaries({"timezone": maybe(st.text(max_size=10))}),
    st.dictionaries(hostile_text, json_values, max_size=3),
    deep,
)
argument_texts = st.one_of(
    argument_objects.map(lambda v: _dumps(v)),
    hostile_text,
    st.sampled_from(
        ["[" * 100_000, "1" * 5_000, '{"city": "a", "city": "b"}', "NaN", "1e400", '{"city": "\\ud800"}']
    ),
)


def _dumps(value: Any) -> str:
    import json

    try:
        return json.dumps(value)
    except (RecursionError, ValueError):
        return "{" * 5_000


# ---------------------------------------------------------------- the five surfaces

openai_chat_envelopes = obj(
    {
        "choices": st.lists(
            obj(
                {
                    "message": obj(
                        {"role": st.just("assistant")},
                        {
                            "tool_calls": st.lists(
                                obj(
                                    {
                                        "id": call_ids,
                                        "type": st.just("function"),
                                        "function": obj(
                                            {"name": tool_names, "arguments": argument_texts}
                                        ),
                                    }
                                ),
                                max_size=3,
                            ),
                            "function_call": json_values,
                            "content": hostile_text,
                        },
                    )
                },
                {"finish_reason": st.sampled_from(["stop", "tool_calls", "length", "function_call"])},
            ),
            min_size=1,
            max_size=2,
        ),
    },
)

openai_responses_envelopes = obj(
    {
        "output": st.lists(
            st.one_of(
                obj(
                    {
                        "type": st.just("function_call"),
                        "call_id": call_ids,
                        "name": tool_names,
                        "arguments": argument_texts,
                    },
                    {
                        "status": st.sampled_from(["completed", "incomplete", "in_progress"]),
                        "id": hostile_text,
                        "namespace": hostile_text,
                    },
                ),
                obj(
                    {
                        "type": st.sampled_from(
                            [
                                "mcp_call",
                                "mcp_approval_request",
                                "mcp_list_tools",
                                "web_search_call",
                                "file_search_call",
                                "code_interpreter_call",
                                "custom_tool_call",
                                "tool_search_call",
                                "message",
                            ]
                        ),
                        "id": hostile_text,
                    },
                    {
                        "server_label": hostile_text,
                        "name": tool_names,
                        "arguments": argument_texts,
                        "output": json_values,
                        "error": json_values,
                        "status": hostile_text,
                        "approval_request_id": hostile_text,
                        "tools": json_values,
                        "action": json_values,
                        "queries": json_values,
                        "results": json_values,
                        "code": hostile_text,
                        "outputs": json_values,
                        "execution": st.just("client"),
                    },
                ),
            ),
            max_size=4,
        ),
    },
    {
        "status": st.sampled_from(["completed", "incomplete"]),
        "incomplete_details": obj({"reason": hostile_text}),
    },
)

anthropic_envelopes = obj(
    {
        "content": st.lists(
            st.one_of(
                obj(
                    {
                        "type": st.just("tool_use"),
                        "id": call_ids,
                        "name": tool_names,
                        "input": argument_objects,
                    },
                    {"toolset_name": hostile_text},
                ),
                obj(
                    {
                        "type": st.sampled_from(
                            [
                                "text",
                                "server_tool_use",
                                "mcp_tool_use",
                                "mcp_tool_result",
                                "web_search_tool_result",
                                "thinking",
                            ]
                        )
                    },
                    {
                        "id": hostile_text,
                        "name": tool_names,
                        "input": json_values,
                        "server_name": hostile_text,
                        "tool_use_id": hostile_text,
                        "content": json_values,
                        "is_error": json_values,
                        "text": hostile_text,
                    },
                ),
            ),
            max_size=4,
        ),
    },
    {
        "stop_reason": st.sampled_from(
            ["tool_use", "end_turn", "max_tokens", "model_context_window_exceeded"]
        ),
        "role": st.just("assistant"),
    },
)

_function_call = obj(
    {"name": tool_names},
    {
        "id": call_ids,
        "args": argument_objects,
        "willContinue": st.booleans(),
        "partialArgs": json_values,
        "will_continue": st.booleans(),
    },
)
gemini_envelopes = obj(
    {},
    {
        "candidates": st.lists(
            obj(
                {
                    "content": obj(
                        {
                            "parts": st.lists(
                                obj(
                                    {},
                                    {
                                        "functionCall": _function_call,
                                        "function_call": _function_call,
                                        "text": hostile_text,
                                        "executableCode": obj(
                                            {"code": hostile_text},
                                            {"language": hostile_text, "id": hostile_text},
                                        ),
                                        "codeExecutionResult": obj(
                                            {"outcome": hostile_text}, {"output": json_values}
                                        ),
                                    },
                                ),
                                max_size=4,
                            )
                        },
                        {"role": st.just("model")},
                    )
                },
                {
                    "finishReason": st.sampled_from(
                        ["STOP", "MAX_TOKENS", "MALFORMED_FUNCTION_CALL", "UNEXPECTED_TOOL_CALL"]
                    ),
                    "finish_reason": hostile_text,
                },
            ),
            max_size=2,
        ),
    },
)

interaction_envelopes = obj(
    {
        "steps": st.lists(
            st.one_of(
                obj(
                    {
                        "type": st.just("function_call"),
                        "id": call_ids,
                        "name": tool_names,
                        "arguments": argument_objects,
                    }
                ),
                obj({"type": st.just("function_result"), "call_id": call_ids}, {"result": json_values}),
                obj(
                    {
                        "type": st.sampled_from(
                            [
                                "google_search_call",
                                "code_execution_result",
                                "mcp_server_tool_call",
                                "mcp_server_tool_result",
                                "thought",
                            ]
                        )
                    },
                    {
                        "id": hostile_text,
                        "call_id": hostile_text,
                        "name": tool_names,
                        "server_name": hostile_text,
                        "arguments": json_values,
                        "result": json_values,
                        "is_error": json_values,
                    },
                ),
            ),
            max_size=4,
        ),
    },
    {"status": st.sampled_from(["completed", "requires_action", "incomplete", "in_progress"])},
)

ENVELOPES: dict[str, st.SearchStrategy[Any]] = {
    "openai-chat": openai_chat_envelopes,
    "openai-responses": openai_responses_envelopes,
    "anthropic": anthropic_envelopes,
    "gemini": gemini_envelopes,
    "gemini-interactions": interaction_envelopes,
}

# ---------------------------------------------------------------- neutral call lists and CLI files

neutral_calls = st.fixed_dictionaries(
    {
        "call_id": maybe(call_ids),
        "tool_name": maybe(tool_names),
        "arguments": maybe(st.one_of(argument_texts, argument_objects)),
    }
)
neutral_call_lists = st.one_of(st.lists(neutral_calls, max_size=4), any_json)

cli_files = st.one_of(
    neutral_call_lists.map(_dumps),
    st.sampled_from(
        [
            "[" * 100_000,
            "1" * 5_000,
            "",
            "\x00",
            "[{]",
            '[{"call_id": "a", "call_id": "b"}]',
            "\ufeff[]",
            "\ud800",
        ]
    ),
    st.text(any_char, max_size=60),
)


# ---------------------------------------------------------------- choices (tests/fuzz/shapes.py)


class DataPicker:
    """A `shapes.Picker` drawing from Hypothesis data: the shapes atheris explores,
    shrunk by Hypothesis when one fails."""

    def __init__(self, data: st.DataObject) -> None:
        self._data = data

    def pick(self, menu: Sequence[T]) -> T:
        return self._data.draw(st.sampled_from(menu))

    def text(self, most: int) -> str:
        return self._data.draw(st.text(any_char, max_size=most))

    def count(self, most: int) -> int:
        return self._data.draw(st.integers(min_value=0, max_value=most))

    def flag(self) -> bool:
        return self._data.draw(st.booleans())

    def raw(self, most: int) -> bytes:
        return self._data.draw(st.binary(max_size=most))
