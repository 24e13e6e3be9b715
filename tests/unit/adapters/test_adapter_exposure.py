"""Exposure is enforcement: every surface exports exactly what admission admits.

`export_tools(registry, context)` declares a tool to the model only when
`executor.core.admission.exposed_to` says this server context may call it, the
predicate the allowlist and authorization gates use. The property below checks
both directions against `admit` itself, over random principals, tenants and
role sets and a registry whose tools have every kind of access rule: each
exported tool is admitted for an argument set its rule accepts, and each tool
not exported is refused `tool_not_allowed` whatever the arguments.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from anthropic.types import ToolChoiceParam
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from openai.types.chat.completion_create_params import CompletionCreateParamsBase
from openai.types.responses.response_create_params import ResponseCreateParamsBase
from pydantic import BaseModel, ConfigDict, TypeAdapter

from executor.core.admission import Admitted, Rejected, admit, exposed_to, gate_authorization
from executor.core.tools import Access, Approval, Effect, Mode, Registry, Tool
from executor.core.types import ErrorCode, ProposedCall, ServerContext
from executor.providers import SURFACES, decode_tool_name

ROLES = ("member", "support", "billing", "admin")


class AccountArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")

    tenant: str
    owner: str
    amount_cents: int


class Out(BaseModel):
    ok: bool


def _unused(args: Any, ctx: Any) -> Any:
    raise AssertionError("exposure tests never run a tool")


# Access rules of the kinds tool authors write, each with a witness: arguments
# the rule accepts for a given context ("some valid argument set per its rule").
Witness = Callable[[ServerContext], dict[str, Any]]


def _any_args(ctx: ServerContext) -> dict[str, Any]:
    return {"tenant": "elsewhere", "owner": "nobody", "amount_cents": 1}


def _own_tenant(ctx: ServerContext) -> dict[str, Any]:
    return {"tenant": ctx.tenant, "owner": "nobody", "amount_cents": 1}


def _own_account(ctx: ServerContext) -> dict[str, Any]:
    return {"tenant": ctx.tenant, "owner": ctx.principal, "amount_cents": 1}


def _small_amount(ctx: ServerContext) -> dict[str, Any]:
    return {"tenant": "elsewhere", "owner": "nobody", "amount_cents": 500}


ACCESS: dict[str, tuple[Access, Witness]] = {
    "public_read": (Access.public_tool(), _any_args),
    "public_in_tenant": (
        Access(roles=None, public=True, rule=lambda a, c: a.tenant == c.tenant),
        _own_tenant,
    ),
    "support_read": (Access.for_roles("support"), _any_args),
    "support_or_admin_in_tenant": (
        Access.for_roles("support", "admin", rule=lambda a, c: a.tenant == c.tenant),
        _own_tenant,
    ),
    "billing_own_account": (
        Access.for_roles(
            "billing", rule=lambda a, c: a.tenant == c.tenant and a.owner == c.principal
        ),
        _own_account,
    ),
    # The rule depends on the arguments and the roles together.
    "admin_or_small_refund": (
        Access.for_roles(
            "admin", "billing", rule=lambda a, c: "admin" in c.roles or a.amount_cents <= 1000
        ),
        _small_amount,
    ),
    "admin.wipe/tenant": (Access.for_roles("admin"), _own_tenant),
}
WRITES = {"billing_own_account", "admin_or_small_refund", "admin.wipe/tenant"}


def make_registry() -> Registry:
    tools = []
    for name, (access, _witness) in ACCESS.items():
        write = name in WRITES
        tools.append(
            Tool(
                name=name, description=f"{name} tool", input_model=AccountArgs, output_model=Out,
                run=_unused, access=access, approval=Approval.never(), untrusted_output=False,
                mode=Mode.WRITE if write else Mode.READ,
                **({"effect": [Effect.IDEMPOTENT]} if write else {}),
            )
        )
    return Registry(tools)


REGISTRY = make_registry()

contexts = st.builds(
    ServerContext,
    principal=st.sampled_from(["alice", "bob", "mallory", "svc-1"]),
    tenant=st.sampled_from(["acme", "globex"]),
    roles=st.frozensets(st.sampled_from(ROLES + ("auditor",))),
    request_id=st.just("req-1"),
)
arguments = st.fixed_dictionaries(
    {
        "tenant": st.sampled_from(["acme", "globex", "elsewhere"]),
        "owner": st.sampled_from(["alice", "bob", "nobody"]),
        "amount_cents": st.integers(min_value=0, max_value=5000),
    }
)


def _exported_names(surface_name: str, context: ServerContext) -> list[str]:
    surface = SURFACES[surface_name]
    tools = surface.export_tools(REGISTRY, context)
    if surface_name == "openai-chat":
        wire = [tool["function"]["name"] for tool in tools]
    elif surface_name == "gemini":
        wire = [decl["name"] for tool in tools for decl in tool["functionDeclarations"]]
    else:
        wire = [tool["name"] for tool in tools]
    return [decode_tool_name(name, surface.name_rule, REGISTRY.names()) for name in wire]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(context=contexts, other_arguments=arguments)
def test_export__every_surface__exactly_the_tools_admission_admits(
    context: ServerContext, other_arguments: dict[str, Any]
) -> None:
    # Given a random server context
    for surface_name in SURFACES:
        # When a surface exports the registry for it
        exported = _exported_names(surface_name, context)
        # Then the export is in tool-name order, every surface the same set
        assert exported == sorted(exported)
        assert exported == _exported_names("openai-chat", context)
        for name, (_access, witness) in ACCESS.items():
            call = ProposedCall(call_id="c1", tool_name=name, arguments=witness(context))
            outcome = admit(call, REGISTRY, context)
            if name in exported:
                # an exported tool is admitted for arguments its rule accepts
                assert isinstance(outcome, Admitted), (surface_name, name, outcome)
            else:
                # a tool not exported is refused at the allowlist, whatever the arguments
                for args in (witness(context), other_arguments):
                    refused = admit(call.model_copy(update={"arguments": args}), REGISTRY, context)
                    assert isinstance(refused, Rejected), (surface_name, name)
                    assert refused.gate == "allowlist"
                    assert refused.result.error.code is ErrorCode.TOOL_NOT_ALLOWED


def test_export__no_roles__only_public_tools() -> None:
    nobody = ServerContext(principal="eve", tenant="acme", request_id="r")
    assert _exported_names("anthropic", nobody) == ["public_in_tenant", "public_read"]


def test_export__admin__every_tool_it_may_call_and_no_other() -> None:
    admin = ServerContext(principal="root", tenant="acme", roles=frozenset({"admin"}), request_id="r")
    exported = _exported_names("openai-responses", admin)
    assert "admin.wipe/tenant" in exported and "billing_own_account" not in exported


def test_gate_authorization__tool_not_exposed__denied_even_when_the_rule_allows() -> None:
    # Given a tool whose rule would accept the call, and a context outside its roles
    tool = REGISTRY.get("support_or_admin_in_tenant")
    assert tool is not None
    outsider = ServerContext(principal="eve", tenant="acme", request_id="r")
    args = AccountArgs(tenant="acme", owner="eve", amount_cents=1)
    assert tool.access.authorizes(args, outsider) and not exposed_to(tool, outsider)
    call = ProposedCall(call_id="c1", tool_name=tool.name, arguments={})
    # When the authorization gate runs on its own / Then it refuses
    try:
        gate_authorization(call, tool, args, outsider)
    except Rejected as rejected:
        assert rejected.result.error.code is ErrorCode.PERMISSION_DENIED
    else:
        raise AssertionError("authorization granted a tool the context is not exposed to")


# ---------------------------------------------------------------- request options

BILLING = ServerContext(principal="bob", tenant="acme", roles=frozenset({"billing"}), request_id="r")
SUPPORT = ServerContext(principal="sue", tenant="acme", roles=frozenset({"support"}), request_id="r")


def test_request_options__export_holds_a_write__one_call_at_a_time() -> None:
    chat = SURFACES["openai-chat"].request_options(REGISTRY, BILLING)
    responses = SURFACES["openai-responses"].request_options(REGISTRY, BILLING)
    anthropic = SURFACES["anthropic"].request_options(REGISTRY, BILLING)

    assert chat == responses == {"parallel_tool_calls": False}
    assert set(chat) <= set(CompletionCreateParamsBase.__annotations__)
    assert set(responses) <= set(ResponseCreateParamsBase.__annotations__)
    assert anthropic == {"tool_choice": {"type": "auto", "disable_parallel_tool_use": True}}
    TypeAdapter(ToolChoiceParam).validate_python(anthropic["tool_choice"])
    assert SURFACES["gemini"].request_options(REGISTRY, BILLING) == {}
    assert SURFACES["gemini-interactions"].request_options(REGISTRY, BILLING) == {}


def test_request_options__only_reads_exported__nothing_set() -> None:
    for surface in SURFACES.values():
        assert surface.request_options(REGISTRY, SUPPORT) == {}
