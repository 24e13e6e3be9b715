"""`toolfence serve` as a fuzz target: the ASGI app in process (starlette's
TestClient) over a real PostgreSQL store with the reference ledger's tools, a
hosted-tool policy and a scripted turn driver, keys of every scope, and an
approval waiting (so approve, deny and the console's forms reach a real one).

`HttpRig.api(request)` sends one request built by `shapes.http_request` and
checks the answer; `HttpRig.console(request)` one built by
`shapes.console_request`. The contract, for any method, path, query, header and
body:

- never a 5xx;
- every 4xx of the API is `application/problem+json`, a `Problem` whose `status`
  is the answer's and whose `code` is a documented `ErrorCode`;
- no error answer, no console page and no redirect shows the canary the input
  held (`shapes.CANARY_MARK`), in its body or its headers;
- a body sent with a content type other than JSON is never accepted.

The suite's Hypothesis tests (tests/fuzz/test_fuzz_http.py) and the atheris
harness (bench/fuzz/harness.py) use the same rig.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from starlette.testclient import TestClient

from executor.core.types import ErrorCode
from executor.http.keys import KeyScope, create_key
from executor.http.problems import Problem
from executor.http.server import HttpSettings, create_app
from executor.settings import Settings
from executor.store.api_keys import revoke_api_key
from executor.store.engine import make_engine
from ledger import service as ledger_service
from ledger import tools as ledger_tools
from ledger.service import Ledger
from tests.fuzz.shapes import CANARY_MARK, HttpRequest
from tests.fuzz.targets import HOSTED_POLICY, ContractBroken

CODES = frozenset(code.value for code in ErrorCode)
ID_FIELDS = ("request_id", "turn_id", "approval_id", "operation_id")
KEEP_IDS = 16


class HttpRig:
    """The app, its database and keys; `close()` restores the ledger default."""

    def __init__(self, database_url: str, workdir: Path) -> None:
        self.ledger = Ledger(database_url)
        self._previous_ledger = ledger_service._default
        ledger_service._default = self.ledger
        self.ledger.create_schema()
        for account, tenant, cents in (
            ("acme-1", "acme", 1_000_000),
            ("acme-2", "acme", 0),
            ("globex-1", "globex", 500),
        ):
            self.ledger.open_account(account, tenant, cents)
        script = workdir / "turn-script.jsonl"
        script.write_text(json.dumps({"final": "done"}) + "\n", encoding="utf-8")
        settings = Settings(
            database_url=database_url,
            broker_url=f"filesystem://{workdir / 'broker'}",
            turn_driver=f"scripted:{script}",
        )
        self.engine = make_engine(database_url)
        http = HttpSettings(session_secret=b"s" * 32, rate_limit="100000000/minute", max_body_bytes=64 * 1024)
        app = create_app(
            settings, ledger_tools.registry, http=http, hosted_policy=HOSTED_POLICY, engine=self.engine
        )
        # An exception no handler answered is raised here (the server would answer 500).
        self.client = TestClient(app, raise_server_exceptions=True, follow_redirects=False)
        self.keys = self._make_keys()
        self.ids: dict[str, list[str]] = {name: [] for name in ID_FIELDS}
        self.session = ""
        self.csrf = "0" * 40
        self._seed()
        self.sign_in()
        self.server_errors = 0

    def _make_keys(self) -> dict[str, str]:
        every = tuple(KeyScope)
        made: dict[str, str] = {}
        with self.engine.begin() as conn:
            for name, tenant, scopes in (
                ("full", "acme", every),
                ("produce", "acme", (KeyScope.PRODUCE,)),
                ("read", "acme", (KeyScope.READ,)),
                ("approve", "acme", (KeyScope.APPROVE,)),
                ("operate", "acme", (KeyScope.OPERATE,)),
                ("globex", "globex", every),
                ("revoked", "acme", every),
            ):
                made[name] = create_key(
                    conn,
                    tenant=tenant,
                    principal=f"fuzz-{name}",
                    roles=("member", "support-lead"),
                    scopes=scopes,
                )
            revoke_api_key(conn, made["revoked"].split("_")[1])
        return made

    def _seed(self) -> None:
        """A ledger transfer waiting for approval and a hosted approval request."""
        auth = {"Authorization": f"Bearer {self.keys['full']}"}
        transfer = {
            "call_id": "seed-1",
            "tool_name": "ledger.transfer",
            "arguments": json.dumps(
                {"source_account": "acme-1", "target_account": "acme-2", "amount_cents": 800_000}
            ),
        }
        hosted = {
            "provider": "openai-responses",
            "response": {
                "status": "completed",
                "output": [
                    {
                        "type": "mcp_approval_request",
                        "id": "mcpr_seed",
                        "server_label": "crm",
                        "name": "update_customer",
                        "arguments": '{"customer_id": "c-42"}',
                    }
                ],
            },
        }
        for body in ({"calls": [transfer]}, hosted):
            answer = self.client.post("/v1/requests", json=body, headers=auth)
            assert answer.status_code == 202, answer.text
            self._remember(answer.json())
        listed = self.client.get("/v1/approvals", headers=auth)
        assert listed.status_code == 200, listed.text
        self._remember(listed.json())

    def sign_in(self) -> None:
        """A console session of the full key, and the CSRF token of its pages."""
        self.client.cookies.clear()
        form = self.client.get("/console/login")
        login_csrf = re.search(r'name="csrf" value="([^"]+)"', form.text)
        assert login_csrf, "the sign-in form carries a CSRF token"
        answer = self.client.post(
            "/console/login", data={"key": self.keys["full"], "csrf": login_csrf.group(1)}
        )
        assert answer.status_code == 303, answer.text
        self.session = answer.cookies.get("toolfence_session") or ""
        self.client.cookies.clear()
        page = self.client.get("/console/approvals", headers={"Cookie": f"toolfence_session={self.session}"})
        found = re.search(r'name="csrf" value="([^"]+)"', page.text)
        assert found, "the approvals page carries a CSRF token"
        self.csrf = found.group(1)

    def close(self) -> None:
        self.client.close()
        self.engine.dispose()
        self.ledger.engine.dispose()
        ledger_service._default = self._previous_ledger

    # ------------------------------------------------------------ sending and checking

    def _send(self, request: HttpRequest, cookie: str | None) -> Any:
        self.client.cookies.clear()
        headers = dict(request.headers)
        if cookie is not None:
            headers["Cookie"] = f"toolfence_session={cookie}"
        built = self.client.build_request(request.method, request.path, content=request.body or None)
        for name, value in headers.items():
            built.headers[name] = value
        if "Content-Length" not in headers and not request.body:
            built.headers.pop("Content-Length", None)
        try:
            return self.client.send(built)
        except Exception as exc:
            self.server_errors += 1
            raise ContractBroken(
                f"{request.method} {request.route} answered 500: {type(exc).__name__} escaped the app"
            ) from exc

    def _no_server_error(self, request: HttpRequest, answer: Any) -> None:
        if answer.status_code >= 500:
            self.server_errors += 1
            said = ""
            if answer.headers.get("content-type", "").startswith("application/problem+json"):
                problem = answer.json()
                said = f" ({problem.get('code')}: {str(problem.get('detail'))[:100]})"
            raise ContractBroken(f"{request.method} {request.route} answered {answer.status_code}{said}")

    def _no_canary(self, request: HttpRequest, where: str, text: str) -> None:
        if CANARY_MARK in text:
            held = [
                part
                for part, value in (
                    ("path", request.path.split("?")[0]),
                    ("query", request.path.partition("?")[2]),
                    ("headers", repr(request.headers)),
                    ("body", request.body.decode("latin-1")),
                )
                if CANARY_MARK in value
            ]
            raise ContractBroken(
                f"{request.method} {request.route}: the {where} echoes the canary of its {'+'.join(held)}"
            )

    def _problem(self, request: HttpRequest, answer: Any) -> None:
        kind = answer.headers.get("content-type", "")
        if request.method == "HEAD":
            return
        if not kind.startswith("application/problem+json"):
            raise ContractBroken(
                f"{request.method} {request.route}: {answer.status_code} is {kind!r}, not problem+json"
            )
        try:
            problem = Problem.model_validate_json(answer.content)
        except ValueError as exc:
            raise ContractBroken(
                f"{request.method} {request.route}: not a Problem ({exc.errors()[0]['type']})"
            ) from None
        if problem.code not in CODES or problem.type != f"urn:toolfence:problem:{problem.code}":
            raise ContractBroken(f"{request.method} {request.route}: undocumented code {problem.code!r}")
        if problem.status != answer.status_code:
            raise ContractBroken(
                f"{request.method} {request.route}: problem status {problem.status} "
                f"on a {answer.status_code} answer"
            )

    def _json_only(self, request: HttpRequest, status: int) -> None:
        """A POST's body sent as anything but JSON is refused (415), never accepted (2xx)
        (a body sent with no type, or an empty one, is left to the server)."""
        if request.method != "POST" or not 200 <= status < 300:
            return
        sent = request.headers.get("Content-Type")
        media = (sent or "").split(";")[0].strip().lower()
        if request.body and media and not re.fullmatch(r"application/([\w.+-]+\+)?json", media):
            raise ContractBroken(f"{request.method} {request.route} answered {status} to a {media} body")

    def _remember(self, value: Any) -> None:
        stack = [value]
        while stack:
            node = stack.pop()
            if isinstance(node, dict):
                for name in ID_FIELDS:
                    found = node.get(name)
                    if isinstance(found, str) and found not in self.ids[name]:
                        self.ids[name] = [*self.ids[name], found][-KEEP_IDS:]
                stack.extend(v for v in node.values() if isinstance(v, dict | list))
            elif isinstance(node, list):
                stack.extend(v for v in node if isinstance(v, dict | list))

    def api(self, request: HttpRequest) -> None:
        answer = self._send(request, None)
        self._no_server_error(request, answer)
        headers = "\n".join(f"{k}: {v}" for k, v in answer.headers.items())
        if answer.status_code >= 400:
            self._problem(request, answer)
            self._no_canary(request, "error answer", answer.text)
            self._no_canary(request, "error answer's headers", headers)
        else:
            self._json_only(request, answer.status_code)
        if (
            answer.status_code < 400
            and answer.headers.get("content-type", "").startswith("application/json")
            and answer.content
            and not request.route.endswith("/openapi.json")
        ):
            self._remember(answer.json())

    def console(self, request: HttpRequest, cookie: str) -> None:
        """`cookie`: `session` (the rig's), `tampered` (its MAC changed), or the value sent."""
        value = {"session": self.session, "tampered": self.session[:-1] + "0"}.get(cookie, cookie)
        answer = self._send(request, value or None)
        self._no_server_error(request, answer)
        kind = answer.headers.get("content-type", "")
        if "text/html" in kind:
            self._no_canary(request, "page", answer.text)
        if answer.status_code >= 400 and kind.startswith("application/problem+json"):
            self._problem(request, answer)
            self._no_canary(request, "error answer", answer.text)
        self._no_canary(request, "redirect", answer.headers.get("location", ""))
        if request.route == "/console/logout":
            self.sign_in()


def every_route(rig: HttpRig) -> set[tuple[str, str]]:
    """(method, path template) of every route the OpenAPI document declares, and the
    document's own."""
    document = rig.client.get("/openapi.json").json()
    declared = {
        (method.upper(), path) for path, operations in document["paths"].items() for method in operations
    }
    return declared | {("GET", "/openapi.json")}
