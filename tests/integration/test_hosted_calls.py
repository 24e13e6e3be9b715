"""Hosted calls are never silent, on SQLite and PostgreSQL: every provider-run call
the producer is given is recorded in the enqueue's transaction (never its arguments
or output), counted, and one outside the hosted-tool policy is a `failed_terminal`
`hosted_call_not_allowed` call of the request, after its proposals.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from notekit import REGISTRY
from prometheus_client import REGISTRY as METRICS
from sqlalchemy import Engine, select

from executor.core import invariants
from executor.core.admission import Gate
from executor.core.budgets import BudgetLimits, Budgets
from executor.core.types import ErrorCode, FailedTerminal, Pending, ProposedCall, ServerContext
from executor.providers.hosted import NO_HOSTED_TOOLS, HostedCall, HostedPolicy, HostedServer
from executor.store.schema import calls as calls_table
from executor.store.schema import hosted_calls
from outbox.producer import EnqueueHandle, HostedCalls, enqueue
from outbox.results import results

SECRET_ARGUMENTS = '{"scope": "every customer", "token": "sk-hosted-arguments"}'
SECRET_DIGEST = "d" * 64


POLICY = HostedPolicy(
    servers=(
        HostedServer(
            label="crm", url="https://crm.example/mcp",
            allowed_tools=frozenset({"lookup_customer"}), approval_required=frozenset(),
        ),
    ),
    builtin_tools=frozenset(),
)


def ctx(request_id: str) -> ServerContext:
    return ServerContext(principal="alice", tenant="acme", roles=frozenset({"member"}), request_id=request_id)


def note(call_id: str) -> ProposedCall:
    return ProposedCall(call_id=call_id, tool_name="notes.read", arguments='{"text": "hi"}')


def mcp_call(tool_name: str, item_id: str | None = None, *, is_result: bool = False) -> HostedCall:
    return HostedCall(
        surface="openai-responses", kind="mcp_call", server_label="crm", tool_name=tool_name,
        arguments=SECRET_ARGUMENTS, item_id=item_id if item_id is not None else f"mcp_{tool_name}",
        status="completed", output_digest=SECRET_DIGEST, is_result=is_result,
    )


def run(
    engine: Engine, calls: Sequence[ProposedCall], request_id: str, hosted: Sequence[HostedCall],
    policy: HostedPolicy = POLICY, **kwargs: Any,
) -> EnqueueHandle:
    with engine.begin() as conn:
        return enqueue(conn, calls, ctx(request_id), REGISTRY, hosted=HostedCalls(hosted, policy), **kwargs)


def hosted_rows(engine: Engine, request_id: str) -> list[Any]:
    with engine.connect() as conn:
        return list(conn.execute(
            select(hosted_calls).where(hosted_calls.c.request_id == request_id)
            .order_by(hosted_calls.c.hosted_call_row_id)
        ).all())


def counted(outcome: str, kind: str = "mcp_call") -> float:
    value = METRICS.get_sample_value(
        "toolfence_hosted_calls_total", {"surface": "openai-responses", "kind": kind, "outcome": outcome}
    )
    return value or 0.0


def test_hosted_call_not_allowed__failed_terminal_result_after_the_proposals__recorded_and_counted(
    engine: Engine,
) -> None:
    # Given a response that proposed one read and whose provider ran delete_all itself
    before = counted("not_allowed")
    # When enqueued with the policy the request declared
    handle = run(engine, [note("c1")], "req-del", [mcp_call("delete_all")])
    # Then the request answers both: the proposal, then the hosted call under its item id
    statuses = results(engine, "acme", "req-del")
    assert [s.call_id for s in statuses] == ["c1", "mcp_delete_all"]
    assert isinstance(statuses[0], Pending)
    reported = statuses[1]
    assert isinstance(reported, FailedTerminal)
    assert reported.error.code is ErrorCode.HOSTED_CALL_NOT_ALLOWED
    assert reported.tool_name == "hosted.mcp_call"
    assert reported.operation_id is None
    shown = reported.model_dump_json()
    assert "delete_all" not in shown.replace("mcp_delete_all", "") and "crm" not in shown
    assert [c.call_id for c in handle.calls] == ["c1", "mcp_delete_all"]
    assert handle.calls[1].status == reported
    # ... recorded once, with what ran but never its arguments or output text
    [row] = hosted_rows(engine, "req-del")
    assert (row.kind, row.server_label, row.tool_name, row.item_id, row.allowed, row.code, row.call_id) == (
        "mcp_call", "crm", "delete_all", "mcp_delete_all", False, "hosted_call_not_allowed", "mcp_delete_all",
    )
    assert row.output_digest == SECRET_DIGEST and row.recorded_at > 0
    assert "sk-hosted-arguments" not in repr(tuple(row))
    with engine.connect() as conn:
        gate = conn.execute(
            select(calls_table.c.gate).where(calls_table.c.call_id == "mcp_delete_all")
        ).scalar_one()
    assert gate == Gate.HOSTED.value
    # ... counted
    assert counted("not_allowed") == before + 1
    # ... and I6 holds over what the caller was answered and what results() reads
    proposals = [invariants.Proposal("req-del", c.call_id, c.tool_name) for c in handle.calls]
    read = [
        invariants.ResultRecord("req-del", s.call_id, s.tool_name, s.status, getattr(s, "state", None))
        for s in statuses
    ]
    assert invariants.i6_one_result_per_call(proposals, read, quiet=False) == []


def test_hosted_call_allowed__recorded_as_allowed__adds_no_result(engine: Engine) -> None:
    before = counted("allowed")
    handle = run(engine, [note("c1")], "req-ok", [mcp_call("lookup_customer")])

    assert [s.call_id for s in results(engine, "acme", "req-ok")] == ["c1"]
    assert [c.call_id for c in handle.calls] == ["c1"]
    [row] = hosted_rows(engine, "req-ok")
    assert (row.tool_name, row.allowed, row.code, row.call_id) == ("lookup_customer", True, None, None)
    assert counted("allowed") == before + 1


def test_hosted_result_item__recorded_unchecked_and_uncounted(engine: Engine) -> None:
    before = (counted("allowed"), counted("not_allowed"))
    run(engine, [], "req-result", [mcp_call("delete_all", "mcp_x", is_result=True)], policy=NO_HOSTED_TOOLS)

    assert results(engine, "acme", "req-result") == []
    [row] = hosted_rows(engine, "req-result")
    assert (row.hosted_call_id, row.allowed, row.call_id) == ("mcp_x/result", None, None)
    assert (counted("allowed"), counted("not_allowed")) == before


def test_hosted_item_id_colliding_with_a_proposal__prefixed__the_proposal_untouched(engine: Engine) -> None:
    # Given a proposal whose call id is also the id of a provider-run item
    handle = run(engine, [note("mcp_delete_all")], "req-clash", [mcp_call("delete_all")])

    statuses = results(engine, "acme", "req-clash")
    assert [(s.call_id, s.tool_name, s.status) for s in statuses] == [
        ("mcp_delete_all", "notes.read", "pending"),
        ("hosted:mcp_delete_all", "hosted.mcp_call", "failed_terminal"),
    ]
    assert [c.call_id for c in handle.calls] == ["mcp_delete_all", "hosted:mcp_delete_all"]
    [row] = hosted_rows(engine, "req-clash")
    assert (row.hosted_call_id, row.call_id) == ("mcp_delete_all", "hosted:mcp_delete_all")


def test_two_items_with_one_id_and_items_without_one__each_recorded_and_reported(engine: Engine) -> None:
    hosted = [mcp_call("delete_all", "mcp_1"), mcp_call("drop_db", "mcp_1"), mcp_call("wipe", "")]
    run(engine, [], "req-ids", hosted, policy=NO_HOSTED_TOOLS)

    assert [s.call_id for s in results(engine, "acme", "req-ids")] == [
        "mcp_1", "mcp_1#2", "openai-responses:mcp_call:2",
    ]
    assert [r.tool_name for r in hosted_rows(engine, "req-ids")] == ["delete_all", "drop_db", "wipe"]


def test_same_response_enqueued_again__same_answers__nothing_recorded_or_counted_twice(
    engine: Engine,
) -> None:
    first = run(engine, [note("c1")], "req-again", [mcp_call("delete_all"), mcp_call("lookup_customer")])
    before = (counted("allowed"), counted("not_allowed"))

    again = run(engine, [note("c1")], "req-again", [mcp_call("delete_all"), mcp_call("lookup_customer")])

    assert [(c.call_id, c.status.status) for c in again.calls] == [
        (c.call_id, c.status.status) for c in first.calls
    ]
    assert len(hosted_rows(engine, "req-again")) == 2
    assert len(results(engine, "acme", "req-again")) == 2
    assert (counted("allowed"), counted("not_allowed")) == before


def test_later_proposal_reusing_a_reported_hosted_call_id__idempotency_conflict__report_stands(
    engine: Engine,
) -> None:
    run(engine, [], "req-later", [mcp_call("delete_all")])

    handle = run(engine, [note("mcp_delete_all")], "req-later", [])

    [conflict] = handle.calls
    assert isinstance(conflict.status, FailedTerminal)
    assert conflict.status.error.code is ErrorCode.IDEMPOTENCY_CONFLICT
    [reported] = results(engine, "acme", "req-later")
    assert isinstance(reported, FailedTerminal)
    assert reported.error.code is ErrorCode.HOSTED_CALL_NOT_ALLOWED


def test_reported_hosted_calls__do_not_use_the_request_call_budget(engine: Engine) -> None:
    # Given a request allowed one call, whose first response only reported hosted calls
    one_call = BudgetLimits(max_calls=1, max_writes=1, max_calls_per_tool=1, max_repeated_failures=1)
    budgets = Budgets(request=one_call, conversation=Budgets().conversation)
    run(engine, [], "req-budget", [mcp_call("delete_all"), mcp_call("drop_db")], budgets=budgets)

    # When the model then proposes its one call
    handle = run(engine, [note("c1")], "req-budget", [], budgets=budgets)

    # Then it is admitted: hosted calls are not calls toolfence was asked to run
    [admitted] = handle.calls
    assert isinstance(admitted.status, Pending)


def test_hosted_call__hostile_item_id_and_names__recorded_under_a_digest_producer_rows_survive(
    engine: Engine,
) -> None:
    # Given a provider item whose id and names hold a NUL and a lone surrogate
    hostile = HostedCall(
        surface="openai-responses", kind="mcp_call", server_label="crm\x00\ud800",
        tool_name="delete\x00all\udfff", arguments=SECRET_ARGUMENTS, item_id="mcp_\x00\ud800",
        status="completed\x00", output_digest=SECRET_DIGEST, is_result=False,
    )
    # When it is enqueued with a proposal, in the producer's own transaction
    handle = run(engine, [note("c1")], "req-hostile", [hostile])
    # Then nothing raised: the proposal is admitted and the hosted call answered under
    # a digest key, its names stored without the characters the database refuses
    assert [c.call_id for c in handle.calls][0] == "c1"
    [reported] = [s for s in results(engine, "acme", "req-hostile") if s.call_id != "c1"]
    assert reported.call_id.startswith("h_") and reported.status == "failed_terminal"
    [row] = hosted_rows(engine, "req-hostile")
    assert "\x00" not in (row.server_label + row.tool_name + row.status)


def _series() -> set[tuple[tuple[str, str], ...]]:
    return {
        tuple(sorted(sample.labels.items()))
        for family in METRICS.collect() if family.name == "toolfence_hosted_calls"
        for sample in family.samples if sample.name.endswith("_total")
    }


def test_unknown_and_new_provider_items__reported_recorded_and_labels_stay_bounded(
    engine: Engine,
) -> None:
    # Given a Responses envelope whose provider ran an image generation, a server-side
    # tool search, and 302 item types no adapter knows (one 50,100 characters long)
    from executor.providers import SURFACES

    unknown = [{"type": f"kind_{index}_call", "id": f"u_{index}"} for index in range(299)]
    unknown.append({"type": "x_call" * 8_350, "id": "u_long"})
    # Types no column can hold or no terminal can print: recorded by digest
    unknown.append({"type": "nul\u0000_call", "id": "u_nul"})
    unknown.append({"type": "\ud800_call", "id": "u_surrogate"})
    envelope = {"status": "completed", "output": [
        {"type": "image_generation_call", "id": "ig_1", "status": "completed", "result": "aGk="},
        {"type": "tool_search_call", "id": "ts_1", "execution": "server", "arguments": {"q": "x"}},
        *unknown,
    ]}
    before = _series()
    # When its hosted calls are read and enqueued under a policy that allows none of them
    hosted = SURFACES["openai-responses"].read_hosted_calls(envelope)
    run(engine, [note("c1")], "req-unknown-items", hosted, NO_HOSTED_TOOLS)
    # Then every item is reported as a call of the request, none skipped
    statuses = results(engine, "acme", "req-unknown-items")
    reported = [s for s in statuses if isinstance(s, FailedTerminal)]
    assert len(reported) == 304
    assert all(s.error.code is ErrorCode.HOSTED_CALL_NOT_ALLOWED for s in reported)
    details = [s.error.details[0].code for s in reported]
    assert details.count("unknown_item") == 302
    rows = hosted_rows(engine, "req-unknown-items")
    assert len(rows) == 304 and all(row.allowed is False for row in rows)
    assert max(len(row.kind) for row in rows) <= 80
    assert all(row.kind.isprintable() for row in rows)
    # And the counter grew by at most three series: the two built-in kinds and `other`
    # (before decision 0195, 302: one per provider-written type)
    new = _series() - before
    assert len(new) <= 3
    assert {dict(series)["kind"] for series in new} <= {"image_generation_call", "tool_search_call", "other"}
