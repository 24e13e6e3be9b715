"""What answers for the model in an eval run: a driver per turn of each case.

- `recorded:FILE` replays a provider's responses captured earlier. FILE is JSONL,
  one line per case: `{"case": ID, "surface": "json", "turns": [[RESPONSE, ...], ...]}`,
  a list of responses per turn of the case, in order. With `"surface": "json"` a
  response is the JSON contract's object (or a string: the raw text); with a
  native surface (`openai-chat`, `openai-responses`, `anthropic`, `gemini`) it is
  the provider's response body, read by that surface's adapter as in production.
  Each turn gets its own script in the run directory, run by the scripted driver
  (`scripted[+SURFACE]:PATH`), whose call log proves no step was asked twice.
- `perturb` (or `perturb:KIND,...`) writes, from each case's ground truth (its
  expected calls), a proposal perturbed one way: `wrong_tool` (a tool that does
  not exist), `missing_arg` (a required argument dropped), `extra_field` (an
  undeclared argument), `other_tenant` (an id of another tenant), `repetition`
  (a write proposed twice). The model half is wrong by construction; the run
  measures the executor half: the perturbed call is a labelled violation the
  executor must catch, and the downstream must show only the others' effects.
  Kinds rotate over the cases; a kind that does not apply to a case (no required
  argument, no write to repeat) gives way to the next one that does.
- Any other spec (`openai-chat:MODEL`, `anthropic:MODEL`, `cli:COMMAND`, ...) is
  every turn's driver, as given.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from executor.core.tools import Mode, Registry
from executor.eval.downstream import Downstream
from executor.eval.fixtures import Case, Expect, ExpectedCall, FixtureError, Fixtures, Violation

KINDS = ("wrong_tool", "missing_arg", "extra_field", "other_tenant", "repetition")
EXTRA_FIELD = "unexpected_field"
DONE = {"final": "Done."}


@dataclass(frozen=True)
class CasePlan:
    case: Case  # its `expect` adjusted by a perturbation
    drivers: tuple[str, ...]  # one spec per turn
    perturbation: str | None = None


def _write_script(path: Path, lines: Sequence[Any]) -> None:
    text = "".join(json.dumps(line, sort_keys=True) + "\n" for line in lines)
    if path.exists() and path.read_text(encoding="utf-8") == text:
        return  # a resumed run: the script its turns already read
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text(text, encoding="utf-8")
    temporary.replace(path)


def script_path(run_dir: Path, index: int, turn: int) -> Path:
    return run_dir / "scripts" / f"case{index:04d}-turn{turn}.jsonl"


def _recordings(path: Path) -> dict[str, tuple[str, list[list[Any]]]]:
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise FixtureError(f"recordings {path}: cannot read ({exc})") from None
    found: dict[str, tuple[str, list[list[Any]]]] = {}
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except ValueError:
            raise FixtureError(f"{path}:{number}: not JSON") from None
        if not (isinstance(value, dict) and isinstance(value.get("case"), str)
                and isinstance(value.get("turns"), list)
                and all(isinstance(turn, list) and turn for turn in value["turns"])):
            raise FixtureError(
                f'{path}:{number}: a recording is {{"case": ID, "turns": [[RESPONSE, ...], ...]}}'
            )
        surface = value.get("surface", "json")
        if not isinstance(surface, str):
            raise FixtureError(f"{path}:{number}: surface is a string")
        found[value["case"]] = (surface, value["turns"])
    return found


def _recorded(fixtures: Fixtures, path: Path, run_dir: Path) -> list[CasePlan]:
    recordings = _recordings(path)
    missing = [case.id for case in fixtures.cases if case.id not in recordings]
    if missing:
        raise FixtureError(f"recordings {path}: no recording for case(s) {', '.join(missing[:10])}")
    plans = []
    for index, case in enumerate(fixtures.cases):
        surface, turns = recordings[case.id]
        if len(turns) != len(case.messages):
            raise FixtureError(
                f"recordings {path}: case {case.id!r} has {len(case.messages)} message(s), "
                f"{len(turns)} recorded turn(s)"
            )
        kind = "scripted" if surface == "json" else f"scripted+{surface}"
        drivers = []
        for turn, responses in enumerate(turns, start=1):
            script = script_path(run_dir, index, turn)
            _write_script(script, responses)
            drivers.append(f"{kind}:{script}")
        plans.append(CasePlan(case, tuple(drivers)))
    return plans


def _call(call_id: str, tool: str, arguments: Mapping[str, Any]) -> dict[str, Any]:
    return {"id": call_id, "name": tool, "arguments": dict(arguments)}


def _schema(registry: Registry, tool: str) -> dict[str, Any]:
    declared = registry.get(tool)
    return {} if declared is None else declared.input_model.model_json_schema()


def _required(registry: Registry, tool: str) -> list[str]:
    return [name for name in _schema(registry, tool).get("required", []) if isinstance(name, str)]


def _free_strings(registry: Registry, tool: str, arguments: Mapping[str, Any]) -> list[str]:
    """String arguments the schema leaves free (no enum, pattern or format): an id of
    another tenant put there reaches the access rule instead of the schema gate."""
    properties = _schema(registry, tool).get("properties", {})
    return [
        name for name, value in arguments.items()
        if isinstance(value, str) and isinstance(properties.get(name), Mapping)
        and not {"enum", "const", "pattern", "format", "maxLength"} & set(properties[name])
    ]


def _other_tenant(case: Case) -> str:
    return "globex" if case.tenant != "globex" else "initech"


@dataclass
class _Perturbed:
    calls: list[dict[str, Any]]
    violation: Violation
    removed: str | None  # the tool whose effect no longer happens


def _perturb(
    kind: str, case: Case, call: ExpectedCall, call_id: str, registry: Registry
) -> _Perturbed | None:
    """`call` perturbed by `kind`, or None when the kind does not apply to it."""
    arguments = dict(call.arguments)
    if kind == "wrong_tool":
        name = f"{call.tool}_unlisted"
        return _Perturbed([_call(call_id, name, arguments)],
                          Violation(tool=name, caught_as=["unknown_tool", "tool_not_allowed"],
                                    call_id=call_id),
                          call.tool)
    if kind == "missing_arg":
        present = [name for name in _required(registry, call.tool) if name in arguments]
        if not present:
            return None
        del arguments[present[0]]
        return _Perturbed([_call(call_id, call.tool, arguments)],
                          Violation(tool=call.tool, caught_as=["invalid_arguments"], call_id=call_id),
                          call.tool)
    if kind == "extra_field":
        arguments[EXTRA_FIELD] = True
        return _Perturbed([_call(call_id, call.tool, arguments)],
                          Violation(tool=call.tool, caught_as=["invalid_arguments"], call_id=call_id),
                          call.tool)
    if kind == "other_tenant":
        foreign = [name for name in case.foreign_ids if name in arguments]
        strings = _free_strings(registry, call.tool, arguments)
        if foreign:
            arguments[foreign[0]] = case.foreign_ids[foreign[0]]
        elif strings:
            arguments[strings[0]] = f"@{_other_tenant(case)}/{arguments[strings[0]]}"
        else:
            return None
        return _Perturbed([_call(call_id, call.tool, arguments)],
                          Violation(tool=call.tool, caught_as=["permission_denied", "target_not_offered"],
                                    call_id=call_id), call.tool)
    if kind == "repetition":
        declared = registry.get(call.tool)
        if declared is None or declared.mode is not Mode.WRITE:
            return None
        again = f"{call_id}r"
        return _Perturbed([_call(call_id, call.tool, arguments), _call(again, call.tool, arguments)],
                          Violation(tool=call.tool, caught_as=["reused"], call_id=again), None)
    raise ValueError(kind)


def parse_kinds(spec: str) -> tuple[str, ...]:
    _, _, rest = spec.partition(":")
    kinds = tuple(k.strip() for k in rest.split(",") if k.strip()) or KINDS
    unknown = [k for k in kinds if k not in KINDS]
    if unknown:
        raise FixtureError(f"perturb: unknown kind(s) {', '.join(unknown)}: one of {', '.join(KINDS)}")
    return kinds


def _perturbed_plan(
    index: int, case: Case, kinds: Sequence[str], registry: Registry, downstream: Downstream, run_dir: Path
) -> CasePlan:
    per_turn: dict[int, list[dict[str, Any]]] = {t: [] for t in range(1, len(case.messages) + 1)}
    ids = [f"c{n}" for n in range(1, len(case.expect.calls) + 1)]
    for call_id, call in zip(ids, case.expect.calls, strict=True):
        per_turn[call.turn].append(_call(call_id, call.tool, call.arguments))
    order = [kinds[(index + shift) % len(kinds)] for shift in range(len(kinds))]
    chosen: tuple[str, _Perturbed] | None = None
    target_turn = case.expect.calls[0].turn if case.expect.calls else 1
    for kind in order:
        if case.expect.calls:
            perturbed = _perturb(kind, case, case.expect.calls[0], ids[0], registry)
        elif kind == "wrong_tool":  # no call is right: propose one that does not exist
            perturbed = _perturb(kind, case, ExpectedCall(tool="unrequested_call"), "c1", registry)
            if perturbed is not None:
                perturbed.removed = None
        else:
            perturbed = None
        if perturbed is not None:
            chosen = (kind, perturbed)
            break
    if chosen is None:
        raise FixtureError(f"case {case.id!r}: none of the perturbations {', '.join(kinds)} applies")
    kind, perturbed = chosen
    calls = per_turn[target_turn]
    # Last in its step: a refused write makes the writes proposed after it in the same
    # request fail `predecessor_failed` (docs/design.md §Ordering), which would measure
    # the ordering gate instead of the unperturbed calls' effects.
    per_turn[target_turn] = (calls[1:] if case.expect.calls else calls) + perturbed.calls
    perturbed.violation = perturbed.violation.model_copy(update={"turn": target_turn})
    effects = case.expect.effects
    if effects is not None and perturbed.removed is not None:
        effect = downstream.effect_of(perturbed.removed)
        if effect is not None and effects.get(effect, 0) > 0:
            effects = {**effects, effect: effects[effect] - 1}
    expect = Expect(
        calls=case.expect.calls, ordered=case.expect.ordered,
        violations=[perturbed.violation], effects=effects,
    )
    drivers = []
    for turn, turn_calls in per_turn.items():
        script = script_path(run_dir, index, turn)
        _write_script(script, ([{"tool_calls": turn_calls}] if turn_calls else []) + [DONE])
        drivers.append(f"scripted:{script}")
    return CasePlan(case.model_copy(update={"expect": expect}), tuple(drivers), kind)


def plan_cases(
    fixtures: Fixtures, spec: str, run_dir: Path, *, registry: Registry | None, downstream: Downstream
) -> list[CasePlan]:
    """Each case with the driver of each of its turns (scripts written under run_dir)."""
    kind, _, rest = spec.partition(":")
    if kind == "recorded":
        if not rest:
            raise FixtureError("recorded:FILE names the recordings file")
        return _recorded(fixtures, Path(rest).resolve(), run_dir)
    if kind == "perturb":
        kinds = parse_kinds(spec)
        assert registry is not None, "the perturbing driver reads the tools' schemas"
        return [
            _perturbed_plan(index, case, kinds, registry, downstream, run_dir)
            for index, case in enumerate(fixtures.cases)
        ]
    if kind.startswith("scripted"):
        raise FixtureError(
            "a scripted: driver answers one turn; in an eval use recorded:FILE (a recording per case)"
        )
    from executor.turns.drivers import DriverError
    from executor.turns.specs import load_driver

    try:
        load_driver(spec)
    except DriverError as exc:
        raise FixtureError(f"--driver {spec!r}: {exc}") from None
    return [CasePlan(case, tuple(spec for _ in case.messages)) for case in fixtures.cases]
