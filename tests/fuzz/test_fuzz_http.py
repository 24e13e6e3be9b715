"""`toolfence serve` end to end, in process over PostgreSQL: every route with
fuzzed methods, paths, queries, headers (authorization, content-type,
content-length that disagrees with the body, Idempotency-Key) and bodies, and the
console's forms with fuzzed fields, sessions and CSRF tokens. No answer is a 5xx,
every API error is problem+json with a documented code, and no error, page or
redirect shows the input's canary (tests/fuzz/http_targets.py).

Each example is a request through the whole app and its database:
`TOOLFENCE_FUZZ_EXAMPLES // 10` examples per test (200 by default)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.fuzz.http_targets import HttpRig, every_route
from tests.fuzz.shapes import ROUTES, HttpRequest, console_request, http_request
from tests.fuzz.strategies import SLOW_FUZZ, DataPicker

FORM = {"Content-Type": "application/x-www-form-urlencoded"}


@pytest.fixture
def rig(pg_url: str, tmp_path: Path) -> Iterator[HttpRig]:
    made = HttpRig(pg_url, tmp_path)
    yield made
    made.close()


def test_fuzz_targets__every_api_route__fuzzed(rig: HttpRig) -> None:
    # Every route of the API's OpenAPI document is one the request builder picks
    # (the console's forms have their own builder): a new route cannot go unfuzzed.
    assert every_route(rig) == set(ROUTES)


def test_fuzz_api__any_request__no_5xx_problem_json_no_echo(rig: HttpRig) -> None:
    @SLOW_FUZZ
    @given(data=st.data())
    def run(data: st.DataObject) -> None:
        rig.api(http_request(DataPicker(data), rig.keys, rig.ids))

    run()


def test_fuzz_console__any_form__no_5xx_no_echo(rig: HttpRig) -> None:
    @SLOW_FUZZ
    @given(data=st.data())
    def run(data: st.DataObject) -> None:
        request, cookie = console_request(DataPicker(data), rig.keys, rig.ids, rig.csrf)
        rig.console(request, cookie)

    run()


# Failures the fuzzers found that issue #27 did not list, each pinned as found: a
# method, a path (`{csrf}` and `{operation_id}` filled from the rig: its session's
# token, the seeded transfer's operation), a form body and the session cookie sent.
APPROVE = "/console/approvals/{approval_id}/{verb}"
RESOLVE = "/console/operations/{operation_id}/resolve"
FOUND = [
    pytest.param("GET", "/console/approvals", "", "é.é", "/console/approvals", id="session_mac_non_ascii"),
    pytest.param(
        "POST", "/console/logout", "csrf=%C2%80", "session", "/console/logout", id="logout_csrf_non_ascii"
    ),
    pytest.param(
        "POST",
        "/console/approvals/apr_x/approve",
        "csrf=%C3%A9&reason=",
        "session",
        APPROVE,
        id="decide_csrf_non_ascii",
    ),
    pytest.param(
        "POST",
        "/console/operations/op_x/resolve",
        "csrf=%F4%80%80%80&outcome=failed",
        "session",
        RESOLVE,
        id="resolve_csrf_non_ascii",
    ),
    pytest.param(
        "POST",
        "/console/approvals/%00/approve",
        "csrf={csrf}&reason=ok",
        "session",
        APPROVE,
        id="decide_approval_id_nul",
    ),
    pytest.param(
        "POST",
        "/console/operations/{operation_id}/resolve",
        "csrf={csrf}&outcome=succeeded&reference=%00",
        "session",
        RESOLVE,
        id="resolve_reference_nul",
    ),
    pytest.param(
        "POST",
        "/console/operations/%00/resolve",
        "csrf={csrf}&outcome=succeeded&reference=r",
        "session",
        RESOLVE,
        id="resolve_operation_id_nul",
    ),
]


@pytest.mark.parametrize(("method", "path", "form", "cookie", "route"), FOUND)
def test_console__found_input__no_5xx_no_echo(
    rig: HttpRig, method: str, path: str, form: str, cookie: str, route: str
) -> None:
    operation = rig.ids["operation_id"][0]
    path = path.replace("{operation_id}", operation)
    body = form.replace("{csrf}", rig.csrf).encode()
    rig.console(HttpRequest(method, path, FORM if body else {}, body, route), cookie)
