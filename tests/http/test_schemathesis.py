"""schemathesis over a live `toolfence serve`: every operation of the checked-in
OpenAPI document, generated requests, every check schemathesis has (no 5xx,
responses as documented, schema-valid data accepted, invalid data refused, 405s
with `Allow`, auth not ignored, …).

The document is docs/openapi.json (test_openapi.py keeps it equal to what the
server serves). The server runs in this process on a private port and database,
with the reference ledger's tools; requests carry a key of every scope, so
generation reaches the handlers rather than stopping at 401. Examples per
operation are bounded (50, derandomised) so the whole run takes under a minute
on two cores; 200 random examples per operation pass as well (decision 0201).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import CHECKS as REGISTERED_CHECKS
from schemathesis.checks import (
    CheckContext,
    CheckFunction,
    load_all_checks,
    positive_data_acceptance,
)
from schemathesis.core.transport import Response
from schemathesis.openapi.checks import RejectedPositiveData
from servekit import free_port, start_in_thread

from executor.http.keys import KeyScope, create_key
from executor.http.server import HttpSettings, create_app
from executor.settings import Settings
from executor.store.engine import make_engine
from ledger import service as ledger_service
from ledger import tools as ledger_tools
from ledger.service import Ledger
from tests.conftest import _admin, _pg_url

DOCUMENT = Path(__file__).resolve().parents[2] / "docs" / "openapi.json"
# A body over the server's size cap is refused 413 (documented on every route):
# generated invalid data may be that large, and 413 is its rejection.
CONFIG = schemathesis.config.SchemathesisConfig.from_dict({
    "checks": {"negative_data_rejection": {
        "expected-statuses": [400, 401, 403, 404, 405, 406, 409, 413, 415, 422, 428, 429],
    }},
})
schema = schemathesis.openapi.from_dict(json.loads(DOCUMENT.read_text()), config=CONFIG)

# Every check schemathesis has (not only the response checks): positive data is
# accepted, negative data refused, 405s name their Allow, auth is not ignored, …
load_all_checks()
# What the document cannot put in a schema, it says in words: a provider's response
# is read by its adapter (an envelope the adapter cannot read is 400 with
# errors[].path "/response"), a batch names each call id once (400
# duplicate_call_id), strings nested in free-form objects (`arguments`,
# `response`) hold no NUL (400 invalid_text), and an id is printable text (400
# not_printable: JSON Schema engines differ on Unicode classes, and schemathesis
# reads `\p{C}` as ASCII controls only). Schema-valid data refused for exactly those
# stated reasons is accepted by the positive-data check; anything else is not.
STATED_REFUSALS = {
    ("/response", "malformed_envelope"), ("", "invalid_text"), ("/calls", "duplicate_call_id"),
}
STATED_CODES = {"not_printable"}


def positive_data_accepted_or_refused_as_stated(
    ctx: CheckContext, response: Response, case: schemathesis.Case[Any]
) -> bool | None:
    try:
        positive_data_acceptance(ctx, response, case)
        return None
    except RejectedPositiveData:
        if response.status_code == 400:
            errors = response.json().get("errors", [])
            if errors and all(
                (e["path"], e["code"]) in STATED_REFUSALS or e["path"] == "/response"
                or e["code"] in STATED_CODES
                for e in errors
            ):
                return None
        raise


CHECKS = cast(list[CheckFunction], [
    positive_data_accepted_or_refused_as_stated if check is positive_data_acceptance else check
    for check in REGISTERED_CHECKS.get_all()
])


@pytest.fixture(scope="module")
def live(pg_template: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """(base URL, key) of a server over its own database, for the whole module, with a
    turn driver set (no worker runs the turns: POST /v1/turns answers 202 or 409)."""
    script = tmp_path_factory.mktemp("turns") / "turn.jsonl"
    script.write_text(json.dumps({"final": "done"}) + "\n", encoding="utf-8")
    name = f"toolfence_test_{uuid.uuid4().hex[:12]}"
    with _admin() as admin:
        admin.execute(f'CREATE DATABASE "{name}" TEMPLATE "{pg_template}"')
    url = _pg_url(name)
    book = Ledger(url)
    previous, ledger_service._default = ledger_service._default, book
    book.create_schema()
    book.open_account("acme-1", "acme", 1_000_000)
    book.open_account("acme-2", "acme", 0)
    engine = make_engine(url)
    with engine.begin() as conn:
        key = create_key(
            conn, tenant="acme", principal="fuzz", roles=("member", "approver"), scopes=list(KeyScope)
        )
    app = create_app(
        Settings(database_url=url, broker_url="memory://", turn_driver=f"scripted:{script}"),
        ledger_tools.registry,
        engine=engine,
        http=HttpSettings(session_secret=b"s" * 32, rate_limit="100000/minute", max_body_bytes=256 * 1024),
    )
    port = free_port()
    server, thread = start_in_thread(app, port)
    yield f"http://127.0.0.1:{port}", key
    server.should_exit = True
    thread.join(timeout=10)
    engine.dispose()
    book.engine.dispose()
    ledger_service._default = previous
    with _admin() as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@schema.parametrize()
@settings(
    max_examples=50,
    deadline=None,
    derandomize=True,
    suppress_health_check=[
        HealthCheck.function_scoped_fixture,
        HealthCheck.too_slow,
        HealthCheck.filter_too_much,
    ],
)
def test_api__generated_requests__no_5xx_and_every_response_as_documented(
    case: schemathesis.Case[Any], live: tuple[str, str]
) -> None:
    # Given the live server and a key of every scope; when schemathesis sends a generated request
    base_url, key = live
    # Then it is answered without a server error, with a documented status, media type,
    # headers and body
    case.call_and_validate(
        base_url=base_url,
        headers={"Authorization": f"Bearer {key}"},
        checks=CHECKS,
        timeout=40,
    )
