"""Tool declarations and the registry.

A tool author states, with no defaults for anything that decides safety, who may
call the tool (`access`), whether a person must approve it (`approval`) and, for
writes, what the downstream promises when a call is repeated (`effect`).
Forgetting one is a `ToolDeclarationError` naming the tool, raised where the tool
is declared, so a misdeclared tool never reaches a worker.
"""

from __future__ import annotations

import importlib
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from pydantic import BaseModel, ValidationError

from executor.core.amounts import Amount
from executor.core.approvers import ApproverPolicy
from executor.core.budgets import ToolBudget
from executor.core.sanitize import ERROR_MESSAGE_MAX_CHARS, sanitize_error_text, sanitize_json
from executor.core.types import ErrorCode, ErrorDetail, ServerContext
from executor.errors import AdmissionError, ConfigurationError, WorkerError

if TYPE_CHECKING:
    from executor.core.surfaces import TurnSurface

ArgsT = TypeVar("ArgsT", bound=BaseModel)


class Mode(StrEnum):
    READ = "read"
    WRITE = "write"


class Effect(StrEnum):
    """What the downstream promises when a write is repeated (docs/design.md §Effect contracts)."""

    IDEMPOTENT = "idempotent"
    FENCED = "fenced"
    LOOKUP = "lookup"
    UNSAFE = "unsafe"


class ToolDeclarationError(ConfigurationError):
    """A tool was declared without a safety-relevant field, or inconsistently."""


class ToolFailure(Exception):
    """Raised by a tool (or its downstream client) to end a call with a stable code."""

    def __init__(
        self,
        code: ErrorCode,
        message: str,
        *,
        retryable: bool,
        details: tuple[ErrorDetail, ...] = (),
    ) -> None:
        # A tool's message is shown to the model and stored: it is sanitised here,
        # whoever raised it (a tool, its downstream client, a `check` hook).
        message = sanitize_error_text(str(message), ERROR_MESSAGE_MAX_CHARS)
        super().__init__(message)
        self.code = code
        self.message = message
        self.retryable = retryable
        self.details = tuple(_sealed_detail(detail) for detail in details)
        # True when the request may have reached the downstream and acted (a timeout
        # after sending): a write that is not takeover-safe must then be reconciled.
        self.outcome_unknown = False


def _sealed_detail(detail: ErrorDetail) -> ErrorDetail:
    """A detail whose text a tool wrote, sanitised like its message."""
    if not isinstance(detail, ErrorDetail):
        return detail
    return detail.model_copy(
        update={
            name: sanitize_error_text(text, ERROR_MESSAGE_MAX_CHARS)
            for name, text in detail.model_dump().items()
            if isinstance(text, str)
        }
    )


class RetryableError(ToolFailure):
    def __init__(self, message: str, code: ErrorCode = ErrorCode.UPSTREAM_UNAVAILABLE) -> None:
        super().__init__(code, message, retryable=True)


class TerminalError(ToolFailure):
    def __init__(self, message: str, code: ErrorCode = ErrorCode.EXECUTION_FAILED) -> None:
        super().__init__(code, message, retryable=False)


class BusinessRuleViolation(ToolFailure):
    """Raised by a tool's `check` hook; `message` is shown to the model, so keep it safe."""

    def __init__(self, message: str, details: tuple[ErrorDetail, ...] = ()) -> None:
        super().__init__(
            ErrorCode.BUSINESS_RULE_VIOLATION, message, retryable=False, details=details
        )


class StaleFencingToken(Exception):
    """A fenced downstream refused a write: a newer generation already wrote for this key."""

    def __init__(self, key: str, token: int, highest: int) -> None:
        super().__init__(f"fencing token {token} below highest seen {highest} for this key")
        self.key = key
        self.token = token
        self.highest = highest


class InvalidResult(WorkerError, ValueError):
    """A tool's value does not fit its output model, or its projection failed."""


class LostOwnership(Exception):
    """The worker no longer holds the operation's lease; it must not write downstream."""


@dataclass(frozen=True)
class Access:
    """Who may call a tool.

    `roles`: the allowlist, checked first and without arguments (`tool_not_allowed`).
    `rule`: authorization against the server context and validated arguments
    (`permission_denied`); it may look the resource up through the tool's own code.
    """

    roles: frozenset[str] | None
    rule: Callable[[Any, ServerContext], bool] | None = None
    public: bool = False

    @classmethod
    def public_tool(cls) -> Access:
        """Explicitly public: any principal, no resource rule."""
        return cls(roles=None, rule=None, public=True)

    @classmethod
    def for_roles(
        cls, *roles: str, rule: Callable[[Any, ServerContext], bool] | None = None
    ) -> Access:
        if not roles:
            raise ToolDeclarationError("Access.for_roles needs at least one role")
        return cls(roles=frozenset(roles), rule=rule)

    def exposed_to(self, ctx: ServerContext) -> bool:
        return self.public or (self.roles is not None and bool(self.roles & ctx.roles))

    def authorizes(self, args: Any, ctx: ServerContext) -> bool:
        return self.rule is None or bool(self.rule(args, ctx))


@dataclass(frozen=True)
class Approval:
    """When a person must approve a call before it runs."""

    kind: str
    predicate: Callable[[Any, ServerContext], bool] | None = None
    ttl_seconds: float = 24 * 3600.0

    @classmethod
    def never(cls) -> Approval:
        return cls(kind="never")

    @classmethod
    def always(cls, ttl_seconds: float = 24 * 3600.0) -> Approval:
        return cls(kind="always", ttl_seconds=ttl_seconds)

    @classmethod
    def when(
        cls, predicate: Callable[[Any, ServerContext], bool], ttl_seconds: float = 24 * 3600.0
    ) -> Approval:
        return cls(kind="when", predicate=predicate, ttl_seconds=ttl_seconds)

    def required(self, args: Any, ctx: ServerContext) -> bool:
        if self.kind == "always":
            return True
        if self.kind == "when":
            assert self.predicate is not None
            return bool(self.predicate(args, ctx))
        return False


@dataclass(frozen=True)
class RetryPolicy:
    """Per-tool retry budget; backoff is exponential with jitter (tenacity's strategy)."""

    max_attempts: int = 5
    initial_backoff_seconds: float = 0.2
    max_backoff_seconds: float = 30.0


@dataclass(frozen=True)
class Written:
    """What a write returns: its output and the downstream's receipt (its id for the effect).

    `changed_resources`: the resource ids the write changed, as the downstream reports
    them. Required from a tool that declares `resources` (the set it was approved for):
    the worker compares the two, and a write that changed more than it was approved
    for never ends `succeeded`.
    """

    output: Any
    receipt: str
    changed_resources: frozenset[str] | None = None

    def __post_init__(self) -> None:
        if self.changed_resources is not None and not isinstance(self.changed_resources, frozenset):
            # Any iterable of ids is accepted; a frozenset is what is compared and kept.
            object.__setattr__(self, "changed_resources", frozenset(self.changed_resources))


@dataclass(frozen=True)
class Observed:
    """What a read may return instead of its bare output, to say when the data was true
    at the source: `source_time` is the source's own timestamp (timezone-aware), on the
    source's clock. toolfence reports it beside `observed_at`, its own database clock."""

    output: Any
    source_time: datetime


class LookupAnswer(StrEnum):
    DONE = "done"
    NOT_DONE = "not_done"
    UNKNOWN = "unknown"


@dataclass(frozen=True)
class LookupResult:
    answer: LookupAnswer
    written: Written | None = None


@dataclass
class RunContext:
    """What a tool's `run` receives besides its arguments."""

    operation_id: str
    idempotency_key: str
    fencing_token: int
    deadline: float
    server: ServerContext
    attempt: int
    call_id: str = ""
    # The resource ids this write was admitted (and, if asked, approved) for, as recorded
    # on the operation; None for a tool that declares no `resources`. A careful
    # downstream refuses, in the effect's own transaction, anything outside it.
    approved_resources: frozenset[str] | None = None
    still_owner: Callable[[], bool] = field(default=lambda: True)
    on_receipt: Callable[[str, bool], None] = field(default=lambda receipt, accepted: None)
    # The W3C trace context of this call's `execute_tool` span, for a tool to pass
    # downstream (an HTTP `traceparent` header); None when tracing is off.
    traceparent: str | None = None
    tracestate: str | None = None

    def ensure_owner(self) -> None:
        """Call before each downstream write: raises when the lease was lost."""
        if not self.still_owner():
            raise LostOwnership(self.operation_id)


_MISSING: Any = object()


def _declared_effects(name: str, effect: object) -> frozenset[Effect]:
    """A tool's `effect` argument as a set of effects, or a declaration error that
    says what was wrong: a collection is required (a bare string or Effect would be
    read one character at a time), and each member must be a known effect."""
    if isinstance(effect, str) or not isinstance(effect, Iterable):
        raise ToolDeclarationError(
            f"tool {name!r}: effect must be a collection of effects, such as "
            f"{{Effect.IDEMPOTENT}}, not {effect!r}"
        )
    effects = set()
    for member in effect:
        try:
            effects.add(Effect(member))
        except ValueError:
            raise ToolDeclarationError(
                f"tool {name!r}: unknown effect {member!r} "
                f"(one of {[e.value for e in Effect]})"
            ) from None
    return frozenset(effects)


class Tool(Generic[ArgsT]):
    """A declared tool. Use keyword arguments; docs/tools.md ("What each field is for") says what each is."""

    def __init__(
        self,
        *,
        name: str,
        description: str,
        mode: Mode,
        input_model: type[ArgsT],
        output_model: type[BaseModel],
        run: Callable[[ArgsT, RunContext], Any],
        access: Access = _MISSING,
        approval: Approval = _MISSING,
        approvers: ApproverPolicy | None = _MISSING,
        effect: Iterable[Effect] = _MISSING,
        schema_version: int = 1,
        check: Callable[[ArgsT, ServerContext], None] | None = None,
        impact: Callable[[ArgsT, ServerContext], Mapping[str, Any]] | None = None,
        amounts: Mapping[str, Amount] | None = None,
        lookup: Callable[[ArgsT, RunContext], LookupResult] | None = None,
        model_view: Callable[[Any], Any] | None = None,
        render_view: Callable[[Any], Any] | None = None,
        resource_ids: Callable[[ArgsT, ServerContext], Iterable[str]] | None = None,
        resources: Callable[[ArgsT, ServerContext], Iterable[str]] | None = None,
        untrusted_output: bool = _MISSING,
        retry: RetryPolicy = RetryPolicy(),
        retryable_exceptions: tuple[type[BaseException], ...] = (),
        timeout_seconds: float = 30.0,
        max_age_seconds: float | None = None,
        repeatable: bool = False,
        budget: ToolBudget | None = None,
        listed: Iterable[str] = (),
    ) -> None:
        if not name or not isinstance(name, str):
            raise ToolDeclarationError("a tool needs a non-empty name")
        # Normalised before any check reads it: the checks below compare with
        # `Mode.WRITE` by identity, so a plain "write" must become the member first
        # (otherwise a write would skip the effect it must declare).
        try:
            mode = Mode(mode)
        except ValueError:
            raise ToolDeclarationError(
                f"tool {name!r}: mode must be one of {[m.value for m in Mode]}, not {mode!r}"
            ) from None
        missing = [
            label
            for label, value in (
                ("access", access), ("approval", approval), ("untrusted_output", untrusted_output)
            )
            if value is _MISSING
        ]
        if mode is Mode.WRITE and effect is _MISSING:
            missing.append("effect")
        if missing:
            raise ToolDeclarationError(
                f"tool {name!r} must declare {', '.join(missing)} explicitly "
                "(there is no safe default; use Access.public_tool() for a public tool)"
            )
        if not isinstance(access, Access):
            raise ToolDeclarationError(f"tool {name!r}: access must be an Access")
        if not access.public and not access.roles:
            raise ToolDeclarationError(f"tool {name!r}: access names no role and is not public")
        if not isinstance(approval, Approval):
            raise ToolDeclarationError(f"tool {name!r}: approval must be an Approval")
        if approvers is _MISSING or approvers is None:
            if approval.kind != "never":
                raise ToolDeclarationError(
                    f"tool {name!r} can need approval and must declare approvers explicitly "
                    "(ApproverPolicy.for_roles(...) or ApproverPolicy.when(...))"
                )
            approvers = None
        elif not isinstance(approvers, ApproverPolicy):
            raise ToolDeclarationError(f"tool {name!r}: approvers must be an ApproverPolicy")
        elif not approvers.roles and approvers.rule is None:
            raise ToolDeclarationError(f"tool {name!r}: approvers names no role and no rule")
        effects = frozenset() if effect is _MISSING else _declared_effects(name, effect)
        if mode is Mode.WRITE and not effects:
            raise ToolDeclarationError(f"tool {name!r}: a write must declare at least one effect")
        if mode is Mode.READ and effects:
            raise ToolDeclarationError(f"tool {name!r}: a read declares no effect")
        if Effect.UNSAFE in effects and len(effects) > 1:
            raise ToolDeclarationError(
                f"tool {name!r}: 'unsafe' contradicts {sorted(effects - {Effect.UNSAFE})}"
            )
        if Effect.LOOKUP in effects and lookup is None:
            raise ToolDeclarationError(f"tool {name!r}: effect 'lookup' needs a lookup hook")
        if resources is not None and mode is not Mode.WRITE:
            raise ToolDeclarationError(
                f"tool {name!r}: only a write declares the resources it may change"
            )
        if not (isinstance(input_model, type) and issubclass(input_model, BaseModel)):
            raise ToolDeclarationError(f"tool {name!r}: input_model must be a pydantic model")
        if input_model.model_config.get("extra") != "forbid":
            raise ToolDeclarationError(
                f"tool {name!r}: input_model must forbid extra fields "
                "(model_config = ConfigDict(extra='forbid'))"
            )
        if not (isinstance(output_model, type) and issubclass(output_model, BaseModel)):
            raise ToolDeclarationError(f"tool {name!r}: output_model must be a pydantic model")
        if retry.max_attempts < 1:
            raise ToolDeclarationError(f"tool {name!r}: retry.max_attempts must be >= 1")
        if max_age_seconds is not None and mode is Mode.WRITE:
            # A write's result is a receipt of what happened: it never goes stale, and
            # "stale" would invite doing the write again.
            raise ToolDeclarationError(f"tool {name!r}: max_age_seconds is for reads only")
        if max_age_seconds is not None and not max_age_seconds > 0:
            raise ToolDeclarationError(f"tool {name!r}: max_age_seconds must be > 0")
        if not isinstance(untrusted_output, bool):
            raise ToolDeclarationError(f"tool {name!r}: untrusted_output must be True or False")
        if render_view is not None and model_view is None:
            # Without its own model view, the model would be shown the full output,
            # which is what a render view exists to keep from it.
            raise ToolDeclarationError(
                f"tool {name!r} declares a render view and must declare a model view"
            )
        if budget is not None and not isinstance(budget, ToolBudget):
            raise ToolDeclarationError(f"tool {name!r}: budget must be a ToolBudget")
        if isinstance(listed, str) or not isinstance(listed, Iterable):
            raise ToolDeclarationError(f"tool {name!r}: listed is a collection of argument names")
        amount_hints = dict(amounts or {})
        if any(not isinstance(hint, Amount) for hint in amount_hints.values()):
            raise ToolDeclarationError(f"tool {name!r}: amounts maps impact names to Amount hints")
        listed_names = frozenset(listed)
        if unknown := sorted(listed_names - set(input_model.model_fields)):
            raise ToolDeclarationError(f"tool {name!r}: listed names no argument {unknown[0]!r}")
        self.name = name
        self.description = description
        self.mode = mode
        self.input_model = input_model
        self.output_model = output_model
        self.run = run
        self.access = access
        self.approval = approval
        self.approvers: ApproverPolicy | None = approvers
        self.effects: frozenset[Effect] = effects
        self.schema_version = schema_version
        self.check = check
        self.impact = impact
        # Display hints for the impact's integer amounts (executor/core/impact.py).
        self.amounts: dict[str, Amount] = amount_hints
        self.lookup = lookup
        self.model_view = model_view
        self.render_view = render_view
        self.resource_ids = resource_ids
        self.resources = resources
        self.untrusted_output = untrusted_output
        # Arguments that must name an item the server listed (executor/core/surfaces.py).
        self.listed: frozenset[str] = listed_names
        self.retry = retry
        self.retryable_exceptions = retryable_exceptions
        self.timeout_seconds = timeout_seconds
        self.max_age_seconds = max_age_seconds
        # A write repeated in its request or conversation runs again only when the
        # author says repeats are meant (two identical small payments).
        self.repeatable = repeatable
        self.budget = budget

    def stored_result(self, value: Any) -> dict[str, Any]:
        """What is stored for a successful call, whoever saw it succeed (worker or
        reconciler): the output validated against the output model, the model's
        view of it (the tool's `model_view`, sanitised), whether it is untrusted
        data, the tool's `render_view` if it declares one (for people; no
        model-facing reader returns it); for a read, also the source's timestamp
        (`Observed`) and the tool's max age.
        """
        freshness: dict[str, float] = {}
        if isinstance(value, Observed) and self.mode is Mode.READ:
            source_time = value.source_time
            if not isinstance(source_time, datetime) or source_time.utcoffset() is None:
                raise InvalidResult("source_time must be a timezone-aware datetime")
            freshness["source_time"] = source_time.timestamp()
            value = value.output
        if self.max_age_seconds is not None:
            freshness["max_age_seconds"] = self.max_age_seconds
        try:
            output = self.output_model.model_validate(
                value.model_dump(mode="json") if isinstance(value, BaseModel) else value
            )
        except ValidationError:
            raise InvalidResult(
                "the tool returned a result that does not match its output model"
            ) from None
        full = output.model_dump(mode="json")
        view: Any = full
        if self.model_view is not None:
            try:
                view = self.model_view(output)
            except Exception:
                raise InvalidResult("the output's model view failed") from None
        # Sealed: what a model can be shown is sanitised here, once, where the result
        # is produced, so every reader (results(), final(), the five surfaces, the
        # CLI) gets the same safe value. `output` stays whole, for operators.
        stored = {
            "output": full,
            "model_view": sanitize_json(view),
            "untrusted": self.untrusted_output,
            **freshness,
        }
        if self.render_view is not None:
            try:
                stored["render_view"] = self.render_view(output)
            except Exception:
                raise InvalidResult("the output's render view failed") from None
        return stored

    @property
    def takeover_allowed(self) -> bool:
        """May a new owner simply run this again after a lost lease?

        Reads always; writes only when the downstream dedupes or fences.
        """
        if self.mode is Mode.READ:
            return True
        return bool(self.effects & {Effect.IDEMPOTENT, Effect.FENCED})

    def __repr__(self) -> str:
        return f"Tool({self.name!r}, mode={self.mode.value})"


RoleResolver = Callable[[ServerContext], Iterable[str]]


class RoleResolutionFailed(AdmissionError):
    """The application's role resolver raised: whoever asked must fail closed."""


_DECLARED_NAMES: set[str] = set()


def is_declared_tool_name(name: str) -> bool:
    """Has a `Registry` in this process held a tool of this name? Names are code's
    declarations, never a model's or a caller's text: the closed set of the
    metrics' `tool` label."""
    return name in _DECLARED_NAMES


class Registry:
    """The set of tools a deployment exposes. Thread-safe for reads after setup.

    `role_resolver`: the application's answer to "which roles does this principal
    of this tenant hold *now*?". The worker asks it just before running a call
    and the store before accepting an approver, so a role revoked after admission
    stops the call; without one, the roles stored at admission stand.
    """

    def __init__(
        self, tools: Iterable[Tool[Any]] = (), *, role_resolver: RoleResolver | None = None
    ) -> None:
        self._tools: dict[str, Tool[Any]] = {}
        self._surfaces: dict[str, TurnSurface] = {}
        self._lock = threading.Lock()
        self.role_resolver = role_resolver
        for tool in tools:
            self.add(tool)

    def set_role_resolver(self, resolver: RoleResolver | None) -> None:
        self.role_resolver = resolver

    def current_context(
        self, ctx: ServerContext, *, reraise: tuple[type[BaseException], ...] = ()
    ) -> ServerContext:
        """`ctx` with the principal's current roles (unchanged without a resolver).

        Raises `RoleResolutionFailed` when the resolver raises or answers with
        something that is not a collection of role names; what it raises of
        `reraise` propagates as it is (the worker and the approver check: a lost
        connection decided nothing, and is tried again rather than refused).
        """
        if self.role_resolver is None:
            return ctx
        try:
            answered = self.role_resolver(ctx)
            if isinstance(answered, str):
                raise TypeError("a role resolver returns role names, not one string")
            roles = frozenset(answered)
            if not all(isinstance(role, str) for role in roles):
                raise TypeError("a role resolver returns role names")
        except reraise:
            raise
        except Exception as exc:
            raise RoleResolutionFailed(ctx.principal) from exc
        return ctx.model_copy(update={"roles": roles})

    def add(self, tool: Tool[Any]) -> Tool[Any]:
        with self._lock:
            if tool.name in self._tools:
                raise ToolDeclarationError(f"tool {tool.name!r} is declared twice")
            self._tools[tool.name] = tool
            _DECLARED_NAMES.add(tool.name)
        return tool

    def replace(self, tool: Tool[Any]) -> None:
        """Swap a tool's declaration (a policy change, a new schema version)."""
        with self._lock:
            self._tools[tool.name] = tool
            _DECLARED_NAMES.add(tool.name)

    def remove(self, name: str) -> None:
        with self._lock:
            self._tools.pop(name, None)

    def get(self, name: str) -> Tool[Any] | None:
        return self._tools.get(name)

    def __contains__(self, name: object) -> bool:
        return name in self._tools

    def __iter__(self) -> Any:
        return iter(list(self._tools.values()))

    def names(self) -> list[str]:
        return sorted(self._tools)

    def add_surface(self, surface: TurnSurface) -> TurnSurface:
        """Declare a turn surface (executor/core/surfaces.py). A catalog may name a
        tool registered later (an MCP server's); a name with no tool offers nothing."""
        from executor.core.surfaces import SurfaceDeclarationError, TurnSurface

        if not isinstance(surface, TurnSurface):
            raise SurfaceDeclarationError("add_surface takes a TurnSurface")
        with self._lock:
            if surface.name in self._surfaces:
                raise SurfaceDeclarationError(f"surface {surface.name!r} is declared twice")
            self._surfaces[surface.name] = surface
        return surface

    def surface(self, name: str) -> TurnSurface | None:
        return self._surfaces.get(name)

    def surface_names(self) -> list[str]:
        return sorted(self._surfaces)


def load_registry(spec: str) -> Registry:
    """`module:attribute` naming a Registry (TOOLFENCE_TOOLS)."""
    module_name, _, attribute = spec.partition(":")
    module = importlib.import_module(module_name)
    registry = getattr(module, attribute or "registry")
    if callable(registry) and not isinstance(registry, Registry):
        registry = registry()
    if not isinstance(registry, Registry):
        raise TypeError(f"{spec} is not a toolfence Registry")
    return registry
