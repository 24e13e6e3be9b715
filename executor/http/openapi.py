"""The OpenAPI document of `toolfence serve`, as checked in at docs/openapi.json.

    python -m executor.http.openapi > docs/openapi.json

A unit test fails when the served document and the checked-in one differ.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from executor.core.tools import Registry
from executor.http.server import HttpSettings, create_app
from executor.settings import Settings
from executor.store.engine import make_engine


def document() -> dict[str, Any]:
    """The document the server serves at /openapi.json (no database is touched)."""
    settings = Settings(database_url="sqlite://", broker_url="memory://")
    engine = make_engine(settings.database_url)
    try:
        app = create_app(settings, Registry([]), http=HttpSettings(session_secret=b"\0" * 32), engine=engine)
        return app.openapi()
    finally:
        engine.dispose()


def render() -> str:
    return json.dumps(document(), indent=2, sort_keys=True) + "\n"


if __name__ == "__main__":
    sys.stdout.write(render())
