"""Import BFCL (the `bfcl-eval` package's data) into toolfence eval fixtures.

BFCL's data is JSONL files beside its code: `BFCL_v4_<category>.json` (each line
an `id`, a `question`: a list of turns, each a list of messages, and a `function`
list of function docs) and `possible_answer/BFCL_v4_<category>.json` (the
`ground_truth`: a list of `{function: {argument: [accepted values]}}`, `""` among
them meaning the argument may be left out). Irrelevance categories have no
answer: no call is right.

Function docs use BFCL's own types (`dict`, `float`, `tuple`, `any`, ...): they are
mapped to JSON Schema here, and the tools are then declared through the same
JSON-schema path as MCP tools (`executor.eval.declared`). Only single-turn
categories are imported (`simple_*`, `multiple`, `parallel`, `parallel_multiple`,
`live_*` and the irrelevance ones); the dataset's version is recorded in the
fixtures' header.

Read from a directory (`bfcl_eval/data` of an unpacked wheel, e.g. after
`pip download bfcl-eval --no-deps`) or from the installed package
(`pip install 'toolfence[eval]'`), never a runtime dependency.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from executor.eval.fixtures import FixtureError

PREFIX = "BFCL_v4_"
CATEGORIES = (
    "simple_python", "simple_java", "simple_javascript", "multiple", "parallel", "parallel_multiple",
    "live_simple", "live_multiple", "live_parallel", "live_parallel_multiple",
    "irrelevance", "live_irrelevance",
)
NO_CALL = frozenset({"irrelevance", "live_irrelevance"})
HEADER_TOOLS = "executor.eval.declared:registry"
HEADER_DOWNSTREAM = "executor.eval.declared:downstream"
_TYPES = {
    "dict": "object", "float": "number", "double": "number", "long": "integer", "int": "integer",
    "integer": "integer", "tuple": "array", "list": "array", "array": "array", "ArrayList": "array",
    "HashMap": "object", "Hashtable": "object", "bool": "boolean", "boolean": "boolean",
    "Boolean": "boolean", "str": "string", "string": "string", "String": "string", "char": "string",
    "byte": "integer", "short": "integer", "number": "number", "object": "object",
}


def json_schema(schema: Any) -> Any:
    """A BFCL parameter schema as JSON Schema: BFCL's types mapped, `any` (and unknown
    types, such as Java class names) left unconstrained, `optional`/`default` kept as
    annotations, `required` kept."""
    if isinstance(schema, list):
        return [json_schema(item) for item in schema]
    if not isinstance(schema, Mapping):
        return schema
    converted: dict[str, Any] = {}
    for key, value in schema.items():
        if key == "type":
            mapped = _TYPES.get(value) if isinstance(value, str) else None
            if mapped is not None:
                converted["type"] = mapped
        elif key == "properties" and isinstance(value, Mapping):
            converted["properties"] = {name: json_schema(prop) for name, prop in value.items()}
        elif key in ("items", "additionalProperties") and isinstance(value, Mapping):
            converted[key] = json_schema(value)
        elif key in ("description", "enum", "required", "default", "format", "maximum", "minimum"):
            converted[key] = value
    if converted.get("type") == "object" and "properties" not in converted:
        converted["properties"] = {}
    return converted


def _lines(path: Path) -> list[dict[str, Any]]:
    try:
        return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    except (OSError, ValueError) as exc:
        raise FixtureError(f"{path}: cannot read BFCL data ({exc})") from None


def data_dir_of_package() -> tuple[Path, str]:
    """The installed `bfcl_eval` package's data directory and version."""
    try:
        import importlib.metadata
        import importlib.util

        spec = importlib.util.find_spec("bfcl_eval")
        version = importlib.metadata.version("bfcl-eval")
    except (ImportError, ValueError, importlib.metadata.PackageNotFoundError):
        spec, version = None, ""
    if spec is None or not spec.submodule_search_locations:
        raise FixtureError(
            "bfcl-eval is not installed: pip install 'toolfence[eval]', or give its data directory"
        )
    return Path(next(iter(spec.submodule_search_locations))) / "data", version


def _expected(ground_truth: Sequence[Mapping[str, Mapping[str, list[Any]]]]) -> list[dict[str, Any]]:
    calls = []
    for entry in ground_truth:
        [(tool, arguments)] = entry.items()
        chosen: dict[str, Any] = {}
        alternatives: dict[str, list[Any]] = {}
        optional: list[str] = []
        for name, accepted in arguments.items():
            # "" (and None, the declared default null) mean "may be left out".
            values = [v for v in accepted if v != "" and v is not None]
            if len(values) != len(accepted):
                optional.append(name)
            if values:
                chosen[name] = values[0]
                alternatives[name] = values
            else:
                alternatives[name] = []
        call: dict[str, Any] = {"tool": tool, "arguments": chosen, "alternatives": alternatives}
        if optional:
            call["optional"] = optional
        calls.append(call)
    return calls


def convert(category: str, question: Mapping[str, Any], answer: Mapping[str, Any] | None) -> dict[str, Any]:
    """One BFCL entry as a fixture case (single-turn)."""
    [turn] = question["question"]
    users = [n for n, m in enumerate(turn) if m.get("role") == "user"]
    if not users:
        raise FixtureError(f"{question['id']}: no user message")
    last = users[-1]
    prior = [{"role": m["role"], "content": m["content"]}
             for m in turn[:last] if m.get("role") in ("user", "assistant")]
    tools = [
        {"name": f["name"], "description": f.get("description", ""),
         "parameters": json_schema(f.get("parameters", {"type": "dict", "properties": {}}))}
        for f in question["function"]
    ]
    calls = [] if answer is None else _expected(answer["ground_truth"])
    effects: dict[str, int] = {}
    for call in calls:
        effects[call["tool"]] = effects.get(call["tool"], 0) + 1
    return {
        "id": str(question["id"])[:40], "category": category, "messages": [turn[last]["content"]],
        "prior": prior,
        "tools": tools, "expect": {"calls": calls, "effects": effects},
    }


def import_bfcl(
    data_dir: Path, version: str, categories: Iterable[str], *, sample: int | None, seed: int = 31
) -> list[dict[str, Any]]:
    """The header and the cases of the chosen categories (`sample` per category, drawn
    with a fixed seed; cases whose tools clash with an earlier case's are skipped)."""
    categories_seen: list[str] = []
    header = {"eval": 1, "tools": HEADER_TOOLS, "downstream": HEADER_DOWNSTREAM,
              "dataset": {"name": "bfcl-eval", "version": version, "categories": categories_seen,
                          "sample": sample, "seed": seed},
              "description": "BFCL, imported by executor.eval.bfcl"}
    declared: dict[str, Any] = {}
    cases: list[dict[str, Any]] = []
    for category in categories:
        if category not in CATEGORIES:
            raise FixtureError(f"BFCL category {category!r}: one of {', '.join(CATEGORIES)}")
        questions = _lines(data_dir / f"{PREFIX}{category}.json")
        answers = {} if category in NO_CALL else {
            a["id"]: a for a in _lines(data_dir / "possible_answer" / f"{PREFIX}{category}.json")
        }
        chosen = random.Random(f"{seed}:{category}").sample(questions, min(sample, len(questions))) \
            if sample else questions
        categories_seen.append(category)
        for question in chosen:
            case = convert(category, question, answers.get(question["id"]) if answers else None)
            if any(declared.get(t["name"], t) != t for t in case["tools"]):
                continue  # a function of the same name declared otherwise by another case
            if not _ground_truth_valid(case):
                continue  # BFCL's answer does not satisfy its own function doc as JSON Schema
            declared.update({t["name"]: t for t in case["tools"]})
            cases.append(case)
    return [header, *cases]


def _ground_truth_valid(case: Mapping[str, Any]) -> bool:
    from executor.core.tools import ToolDeclarationError
    from executor.mcp.schema import compile_validator, effective_input_schema

    schemas = {tool["name"]: tool["parameters"] for tool in case["tools"]}
    for call in case["expect"]["calls"]:
        if call["tool"] not in schemas:
            return False
        try:
            validator = compile_validator(effective_input_schema(schemas[call["tool"]]))
        except ToolDeclarationError:
            return False
        if not validator.is_valid(call["arguments"]):
            return False
    return True


def write_fixtures(lines: Sequence[Mapping[str, Any]], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(line, sort_keys=True) + "\n" for line in lines), encoding="utf-8")


def ground_truth_recording(lines: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """A recording (executor.eval.drivers, `recorded:FILE`) of the answers a model that
    matches BFCL's ground truth would give, as OpenAI chat completions: the expected
    calls in one response, then a short answer; for "no call", the answer alone. A
    baseline for the executor's half and a smoke test of the native adapter path."""
    recordings = []
    for case in lines[1:]:
        responses: list[dict[str, Any]] = []
        calls = case["expect"]["calls"]
        if calls:
            responses.append({"choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
                "role": "assistant", "content": None,
                "tool_calls": [
                    {"id": f"call_{n}", "type": "function",
                     "function": {"name": call["tool"], "arguments": json.dumps(call["arguments"])}}
                    for n, call in enumerate(calls, start=1)
                ],
            }}]})
        text = "Done." if calls else "None of the available tools can answer this."
        responses.append({"choices": [{"index": 0, "finish_reason": "stop",
                                       "message": {"role": "assistant", "content": text}}]})
        recordings.append({"case": case["id"], "surface": "openai-chat", "turns": [responses]})
    return recordings
