"""Turn surfaces: what a chat-like entrance may show, run and point at (pure).

A surface (say `chat`) is declared by the application in its registry
(`Registry.add_surface`) and named by a turn's server context
(`ServerContext.surface`, set by `start_turn(surface=...)`, an API key or
`TOOLFENCE_TURN_SURFACE`; never by the model). It says four things:

- **its catalog** (`tools`): the only tools its turns are shown and may run. The
  roles still apply: a tool is offered when the roles expose it *and* the
  catalog holds it. The same answer serves exposure (prompts, provider exports)
  and enforcement (the allowlist gate, the worker's re-check), so what a turn is
  shown and what it may run cannot drift apart;
- **its write rule** (`writes`): `approval` makes every write proposed under it
  a pending approval, whatever the tool's own approval policy (the most a turn
  can do is leave a card; the write runs after a person approves, once), decided
  by the tool's own approvers when it declares them, else the surface's;
  `never` offers no write at all; `policy` keeps each tool's own policy (a
  surface that only narrows the catalog);
- **its targets** (`targets`): a source the server asks, per model step, for
  the requester's own items (pending cards, recent operations, the
  application's orders); they are shown as a numbered list, and a tool argument
  declared `listed` must name one of them (`target_not_offered` otherwise,
  before the tool's access rule runs), so "cancel that one" can only pick among
  what the server listed;
- **provider-run calls** (`hosted`): off unless the surface says so. A call the
  provider ran itself (an OpenAI `mcp_call`, an Anthropic `server_tool_use`)
  has already happened when toolfence reads it, so it cannot become a card: in
  a surface's turns every one is refused (the turn ends
  `hosted_call_not_allowed`) unless `hosted=True`, and then the application's
  hosted policy decides, as without a surface.

Everything here is checked twice, like every safety promise: at admission (the
friendly early answer) and by the worker just before the handler, on the
context stored with the operation (the truth).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from executor.core.approvers import ApproverPolicy
from executor.core.identifiers import identifier_problem
from executor.core.sanitize import shown_text
from executor.core.types import ServerContext
from executor.errors import ConfigurationError

if TYPE_CHECKING:
    from executor.core.tools import Registry, Tool

MAX_TARGETS = 50
"""The most items a surface may list per step (a prompt, and every stored
context of the step's calls, carries them)."""
TARGET_LABEL_MAX_CHARS = 200
WRITE = "write"
"""`executor.core.tools.Mode.WRITE`'s value (a StrEnum: equal to it). The registry
imports this module to declare surfaces, so this module does not import it back."""


class Writes(StrEnum):
    """A surface's write rule."""

    APPROVAL = "approval"
    NEVER = "never"
    POLICY = "policy"


CARD_INSTRUCTIONS = (
    "A write you propose is not done when you propose it: it becomes an approval card, and "
    "it happens only if a person approves it later. Never tell the user a write was done, "
    "sent or paid; say it is waiting for approval."
)
READ_ONLY_INSTRUCTIONS = (
    "You can only look things up here: none of the tools you are offered changes anything."
)
TARGETS_INSTRUCTIONS = (
    "The requester's items are listed below by number. An argument that names an item must be "
    "the id of a listed item, copied exactly; any other id is refused."
)


class SurfaceDeclarationError(ConfigurationError):
    """A surface was declared inconsistently, or a context names one the registry
    does not have."""


@dataclass(frozen=True)
class Target:
    """One item the server lists to the model: its id (what a listed argument
    names) and a short label the server wrote (never model text)."""

    id: str
    label: str


TargetSource = Callable[[Any, ServerContext], Iterable[Target]]
"""Asked per model step with a read-only database connection and the turn's context
(who asks): the requester's own items, newest first."""


@dataclass(frozen=True)
class TurnSurface:
    """A named entrance for turns: its catalog, its write rule and its targets."""

    name: str
    tools: frozenset[str]
    writes: Writes
    approvers: ApproverPolicy | None = None
    targets: TargetSource | None = None
    max_targets: int = 20
    instructions: str = ""
    hosted: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or identifier_problem(self.name, 64) is not None:
            raise SurfaceDeclarationError("a surface's name is printable text of at most 64 characters")
        if isinstance(self.tools, str) or not isinstance(self.tools, Iterable):
            raise SurfaceDeclarationError(
                f"surface {self.name!r}: tools is a collection of tool names, not {self.tools!r}"
            )
        tools = frozenset(self.tools)
        if not tools or not all(isinstance(t, str) and t for t in tools):
            raise SurfaceDeclarationError(f"surface {self.name!r}: tools names at least one tool")
        try:
            writes = Writes(self.writes)
        except ValueError:
            raise SurfaceDeclarationError(
                f"surface {self.name!r}: writes must be one of {[w.value for w in Writes]}, "
                f"not {self.writes!r}"
            ) from None
        if writes is Writes.APPROVAL and not isinstance(self.approvers, ApproverPolicy):
            # No default, as for a tool that can need approval: a card nobody may
            # decide would wait for ever.
            raise SurfaceDeclarationError(
                f"surface {self.name!r} turns writes into approvals and must declare approvers "
                "(ApproverPolicy.for_roles(...), allow_self_approval=True for the requester's own cards)"
            )
        if self.approvers is not None and not isinstance(self.approvers, ApproverPolicy):
            raise SurfaceDeclarationError(f"surface {self.name!r}: approvers must be an ApproverPolicy")
        if self.targets is not None and not callable(self.targets):
            raise SurfaceDeclarationError(f"surface {self.name!r}: targets must be callable")
        if not isinstance(self.hosted, bool):
            raise SurfaceDeclarationError(f"surface {self.name!r}: hosted is True or False")
        if not isinstance(self.instructions, str):
            raise SurfaceDeclarationError(f"surface {self.name!r}: instructions is text")
        if not isinstance(self.max_targets, int) or not 1 <= self.max_targets <= MAX_TARGETS:
            raise SurfaceDeclarationError(
                f"surface {self.name!r}: max_targets must be between 1 and {MAX_TARGETS}"
            )
        object.__setattr__(self, "tools", tools)
        object.__setattr__(self, "writes", writes)

    def offers(self, tool: Tool[Any]) -> bool:
        """The catalog half of exposure: is `tool` shown and runnable in this surface's
        turns (the roles are the other half)?"""
        if tool.name not in self.tools:
            return False
        return not (self.writes is Writes.NEVER and tool.mode == WRITE)

    def forces_approval(self, tool: Tool[Any]) -> bool:
        """Does this surface make a call of `tool` wait for a person, whatever the
        tool's own approval policy?"""
        return self.writes is Writes.APPROVAL and tool.mode == WRITE

    def prompt_instructions(self) -> str:
        """What a turn of this surface is told, beside the tools: the write rule's
        instruction (a card is not a done deed), the targets' and the surface's own."""
        parts = [
            {Writes.APPROVAL: CARD_INSTRUCTIONS, Writes.NEVER: READ_ONLY_INSTRUCTIONS}.get(self.writes, ""),
            TARGETS_INSTRUCTIONS if self.targets is not None else "",
            self.instructions,
        ]
        return " ".join(p for p in parts if p)


class UnknownSurface(SurfaceDeclarationError):
    """A context names a surface the registry does not declare. Fails closed: no
    tool is offered, nothing is admitted, nothing runs."""

    def __init__(self, name: str) -> None:
        super().__init__("the context names a surface this registry does not declare")
        self.name = name


def surface_of(registry: Registry, ctx: ServerContext) -> TurnSurface | None:
    """The surface `ctx` names, None when it names none. Raises `UnknownSurface`
    for a name the registry does not declare."""
    if ctx.surface is None:
        return None
    surface = registry.surface(ctx.surface)
    if surface is None:
        raise UnknownSurface(ctx.surface)
    return surface


def surface_offers(registry: Registry, tool: Tool[Any], ctx: ServerContext) -> bool:
    """The catalog half of exposure for `ctx`: True without a surface; False for a
    surface the registry does not declare (fail closed)."""
    try:
        surface = surface_of(registry, ctx)
    except UnknownSurface:
        return False
    return surface is None or surface.offers(tool)


def surface_forces_approval(registry: Registry, tool: Tool[Any], ctx: ServerContext) -> bool:
    """Does `ctx`'s surface make this call wait for a person? An unknown surface
    does (fail closed); no surface does not."""
    try:
        surface = surface_of(registry, ctx)
    except UnknownSurface:
        return True
    return surface is not None and surface.forces_approval(tool)


def approvers_for(registry: Registry, tool: Tool[Any] | None, ctx: ServerContext) -> ApproverPolicy | None:
    """Who may decide an approval of `tool` requested under `ctx`: the tool's own
    approver policy when it declares one (a surface never loosens it), else the
    surface's (the cards of a tool that needs no approval of its own)."""
    if tool is not None and tool.approvers is not None:
        return tool.approvers
    try:
        surface = surface_of(registry, ctx)
    except UnknownSurface:
        return None
    return None if surface is None else surface.approvers


def unlisted_argument(tool: Tool[Any], arguments: Mapping[str, Any], ctx: ServerContext) -> str | None:
    """The first of the tool's `listed` arguments whose value the server did not
    list (`ctx.offered`), or None when every one names listed items. A listed
    argument holds an id or a list of ids; absent (an optional field left unset)
    or null names nothing and passes. Nothing listed (`offered` None) lists
    nothing: any id is refused."""
    offered = frozenset(ctx.offered or ())
    for name in sorted(tool.listed):
        value = arguments.get(name)
        if value is None:
            continue
        values = value if isinstance(value, list | tuple) else [value]
        if not all(isinstance(v, str) and v in offered for v in values):
            return name
    return None


def checked_targets(surface: TurnSurface, found: Iterable[Target]) -> tuple[Target, ...]:
    """What a source answered, made safe to show and to store: items whose id is a
    valid identifier, each id once, at most `surface.max_targets`, labels through the
    sanitiser and clipped. A source's bad item is dropped, never shown."""
    seen: set[str] = set()
    kept: list[Target] = []
    for item in found:
        if len(kept) >= surface.max_targets:
            break
        if not isinstance(item, Target) or not isinstance(item.id, str):
            continue
        if identifier_problem(item.id) is not None or item.id in seen:
            continue
        seen.add(item.id)
        label = shown_text(str(item.label))[:TARGET_LABEL_MAX_CHARS]
        kept.append(Target(item.id, label))
    return tuple(kept)


def targets_block(targets: Iterable[Target]) -> str:
    """The numbered list a model step is shown."""
    items = list(targets)
    if not items:
        return "Listed items: none."
    lines = ["Listed items (id: description):"]
    lines.extend(f"{n}. {item.id}: {item.label}" for n, item in enumerate(items, start=1))
    return "\n".join(lines)
