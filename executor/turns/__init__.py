"""Durable turns: the model as a pure function, the loop owned by the server.

Pure parts (no database, no broker): `values` (requests, responses, usage,
steps, options), `contract` (the JSON contract and native responses),
`native` (final text of a provider response), `prompt` (assembly), `loop` (the
decision of what to do next), `audit` (the audit hook's verdict), `drivers`
(the driver protocol and the scripted driver) and `sdk` (OpenAI, Anthropic and
Gemini drivers on their official SDKs, imported lazily). `service` is the API
an application calls (`start_turn`, `get_turn`), on the store; the loop itself
runs in a worker (`executor.worker.turns`).
"""
