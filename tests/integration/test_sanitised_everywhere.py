"""Whatever a person or a model reads of a turn or a key goes through the one
sanitiser: a secret-shaped principal (`sk-…`), a secret or a terminal escape in a
turn's final answer, as stored, as `get_turn` returns it, and as the real CLI
prints it (`turn show`, `keys list`), on SQLite and PostgreSQL."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from sqlalchemy import Engine, select
from turnkit import drive, write_script

from executor.core.sanitize import REDACTED
from executor.core.types import ServerContext
from executor.settings import Settings
from executor.store.schema import turn_steps, turns
from executor.turns.service import get_turn, start_turn
from ledger.tools import registry

ROOT = Path(__file__).resolve().parents[2]
SECRET = "Ab12Cd34Ef56Gh78Ij90Kl12"
PRINCIPAL = f"sk-{SECRET}"  # a valid identifier, shaped like an OpenAI key
ANSWER = f"Your key is sk-proj-{SECRET}\x1b]0;owned\x07 and the db password=hunter2hunter2.\nBye."


def _toolfence(database_url: str, tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOOLFENCE_")}
    env.update(
        TOOLFENCE_HOME=str(tmp_path / "home"), TOOLFENCE_DATABASE_URL=database_url,
        TOOLFENCE_TOOLS="ledger.tools:registry",
        PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p),
    )
    return subprocess.run(
        [sys.executable, "-m", "executor.cli.main", *args], env=env, capture_output=True, text=True,
        timeout=120, cwd=tmp_path,
    )


def test_turn__secret_in_answer_and_principal__stored_and_shown_redacted(
    engine: Engine, settings: Settings, db_url: str, tmp_path: Path
) -> None:
    # Given a turn of a principal shaped like a key, whose model answers with a secret
    # and a terminal escape
    context = ServerContext(principal=PRINCIPAL, tenant="acme", roles=frozenset({"member"}), request_id="t")
    script = write_script(tmp_path / "turn.jsonl", [{"final": ANSWER}])
    with engine.begin() as conn:
        turn_id = start_turn(conn, context, "conv-1", "what is my key?", driver=f"scripted:{script}").turn_id
    # When it runs to its end
    assert drive(engine, settings, registry, turn_id) == "succeeded"
    # Then what is stored is already sanitised: every reader gets the same safe text
    with engine.connect() as conn:
        stored_final = conn.execute(select(turns.c.final_output).where(turns.c.turn_id == turn_id)).scalar()
        step_final = conn.execute(
            select(turn_steps.c.final_output).where(turn_steps.c.turn_id == turn_id)
        ).scalar()
    for text in (stored_final, step_final):
        assert SECRET not in text and "hunter2" not in text and "\x1b" not in text and "\x07" not in text
        assert REDACTED in text and text.endswith("\nBye.")
    # And get_turn (the API's and the console's source too) shows the principal redacted
    view = get_turn(engine, "acme", turn_id)
    assert view is not None
    assert view["principal"] == REDACTED
    assert SECRET not in json.dumps(view) and "hunter2" not in json.dumps(view)
    # And so does the real CLI, as JSON and as text
    for args in (["--json"], []):
        shown = _toolfence(db_url, tmp_path, "turn", "show", turn_id, "--tenant", "acme", *args)
        assert shown.returncode == 0, shown.stderr
        assert SECRET not in shown.stdout and "hunter2" not in shown.stdout and "\x1b" not in shown.stdout
        assert REDACTED in shown.stdout


def test_keys_list__secret_shaped_principal_and_label__shown_redacted(db_url: str, tmp_path: Path) -> None:
    # Given a key whose principal and label are shaped like secrets
    created = _toolfence(
        db_url, tmp_path, "keys", "create", "--tenant", "acme", "--principal", PRINCIPAL,
        "--scope", "read", "--label", f"token={SECRET}",
    )
    assert created.returncode == 0, created.stderr
    # When an operator lists the keys
    listed = _toolfence(db_url, tmp_path, "keys", "list", "--tenant", "acme")
    # Then neither is shown raw
    assert listed.returncode == 0, listed.stderr
    [key] = json.loads(listed.stdout)
    assert key["principal"] == REDACTED and key["label"] == f"token={REDACTED}"
    assert SECRET not in listed.stdout
