"""`toolfence serve`: the HTTP API for producers in any language, and the console.

- `keys`: API keys (identity and scopes from the credential, argon2id hashes);
- `body`: the request size cap and the strict JSON reader;
- `problems`: RFC 9457 problem+json with the stable ErrorCodes;
- `models`: request and response bodies (the OpenAPI document);
- `service`: what each endpoint and console page does, tenant-scoped;
- `api`: the `/v1` routes, authentication and per-key rate limits;
- `console`: the server-rendered operator console under `/console`;
- `observe`: the response counters (toolfence_http_*);
- `server`: the app factory and the uvicorn runner that drains on SIGTERM.
"""

from __future__ import annotations
