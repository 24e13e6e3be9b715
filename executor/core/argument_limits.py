"""The default bounds on a call's arguments (admission's `Limits`), in a module that
imports nothing: the settings declare TOOLFENCE_MAX_ARGUMENT_BYTES and _DEPTH from
them, and the CLI's parsers read those declarations without loading admission
(pydantic, the tools) (executor/cli/args.py)."""

DEFAULT_MAX_ARGUMENT_BYTES = 64 * 1024
DEFAULT_MAX_ARGUMENT_DEPTH = 32
