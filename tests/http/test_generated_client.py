"""A client generated from docs/openapi.json by openapi-python-client, used as its
users would: submit a read and a transfer that needs approval, approve it as
another key, and read both results, against a real server (uvicorn on a private
port, PostgreSQL), the relay and the operation runner executing in between.

What a generated client is named after is the document's: operation ids
(`submit_request`, `approve`), tags (`api.requests`, `api.approvals`) and
component names (`CallArguments`, `ProviderName`), never
`post_requests_v1_requests_post` or `NeutralCallArgumentsType1`.
"""

from __future__ import annotations

import importlib
import subprocess
import sys
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from servekit import Served

from executor.http.keys import KeyScope
from executor.settings import Settings
from executor.worker.runner import OperationRunner
from ledger import tools as ledger_tools
from outbox.relay import Relay

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = "toolfence_api_client"


@pytest.fixture(scope="module")
def generated(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The client package, generated once for the module from the checked-in document."""
    where = tmp_path_factory.mktemp("generated")
    tool = Path(sys.executable).parent / "openapi-python-client"
    run = subprocess.run(
        [str(tool), "generate", "--path", str(ROOT / "docs" / "openapi.json"), "--meta", "none",
         "--output-path", str(where / PACKAGE)],
        capture_output=True, text=True, timeout=300, cwd=where,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    sys.path.insert(0, str(where))
    try:
        yield where / PACKAGE
    finally:
        sys.path.remove(str(where))
        for name in [n for n in sys.modules if n == PACKAGE or n.startswith(f"{PACKAGE}.")]:
            del sys.modules[name]


def module(name: str) -> ModuleType:
    return importlib.import_module(f"{PACKAGE}.{name}")


def test_generated_client__names__come_from_operation_ids_tags_and_components(generated: Path) -> None:
    operations = {p.relative_to(generated / "api").as_posix() for p in (generated / "api").rglob("*.py")
                  if p.name != "__init__.py"}
    assert {"requests/submit_request.py", "requests/get_request.py", "approvals/approve.py",
            "approvals/deny.py", "approvals/list_approvals.py", "operations/resolve_operation.py",
            "operations/get_operation.py", "operations/list_pending.py", "turns/start_turn.py",
            "turns/get_turn.py"} <= operations
    assert not [name for name in operations if "_v1_" in name]
    models = {p.stem for p in (generated / "models").glob("*.py")}
    assert {"call_arguments", "provider_name", "neutral_call", "impact", "turn_error"} <= models
    # No model is named after the position of an inline schema (NeutralCallArgumentsType1)
    assert [name for name in models if "_type_" in name] == []


def execute(served: Served) -> None:
    """What the relay and a worker do, in this process, until nothing is left."""
    settings: Settings = served.settings
    published: list[str] = []
    relay = Relay(settings, served.engine, published.append)
    runner = OperationRunner(settings, ledger_tools.registry, served.engine)
    handled = 0
    while relay.run_once():
        for operation_id in published[handled:]:
            runner.handle(operation_id)
        handled = len(published)


def test_generated_client__submit_approve_and_read__both_calls_succeed(
    generated: Path, served_with: Callable[..., Served],
) -> None:
    served = served_with()
    client_module = module("client")
    models = module("models")
    submit_request, get_request = module("api.requests.submit_request"), module("api.requests.get_request")
    list_approvals, approve = module("api.approvals.list_approvals"), module("api.approvals.approve")
    producer = client_module.AuthenticatedClient(
        base_url=served.url, token=served.key("acme", "billing-bot", KeyScope.PRODUCE)
    )
    approver = client_module.AuthenticatedClient(
        base_url=served.url, token=served.key("acme", "carol", KeyScope.APPROVE, roles=("approver",))
    )
    # Given a read and a 6,000.00 transfer (at or over 500.00: it waits for an approver)
    transfer = {"source_account": "acme-1", "target_account": "acme-2", "amount_cents": 600_000}
    batch = models.NeutralBatch(calls=[
        models.NeutralCall(call_id="c1", tool_name="ledger.get_balance",
                           arguments=models.CallArguments.from_dict({"account_id": "acme-1"})),
        models.NeutralCall(call_id="c2", tool_name="ledger.transfer",
                           arguments=models.CallArguments.from_dict(transfer)),
    ])
    # When the producer submits it through the generated client
    answer: Any = submit_request.sync(client=producer, body=batch, idempotency_key="order-17")
    assert isinstance(answer, models.RequestAnswer), answer
    # Then the approver lists the transfer (its times parsed as datetimes) and approves it
    listed: Any = list_approvals.sync(client=approver)
    [card] = [a for a in listed.approvals if a.call_id == "c2"]
    assert isinstance(card.requested_at, datetime) and card.requested_at.utcoffset() is not None
    reason = models.DecisionBody(reason="invoice 17")
    decided: Any = approve.sync(card.approval_id, client=approver, body=reason)
    assert isinstance(decided, models.DecisionOut) and decided.decision.value == "approved", decided
    # And once the relay and a worker ran them, both results read through the client succeeded
    execute(served)
    read: Any = get_request.sync(answer.request_id, client=producer, wait=5.0)
    assert read.settled is True
    assert [(c.call_id, c.status.value if hasattr(c.status, "value") else c.status) for c in read.calls] == [
        ("c1", "succeeded"), ("c2", "succeeded"),
    ]
    # And the read's freshness time is parsed as a datetime (ISO 8601 UTC in the JSON)
    assert isinstance(read.calls[0].observed_at, datetime)
    # And in a provider's shape, named by the generated ProviderName enum
    shaped: Any = get_request.sync(answer.request_id, client=producer, provider=models.ProviderName.ANTHROPIC)
    assert shaped.provider == models.ProviderName.ANTHROPIC and len(shaped.results) == 1
