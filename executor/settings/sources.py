"""Where a setting's value comes from: the environment, over a settings file, over the default.

The settings file is TOML, named by `toolfence --config PATH` or TOOLFENCE_CONFIG:
a flat table whose keys are the variables' names without `TOOLFENCE_`, in lower
case (`lease_seconds = 10`, `database_url = "postgresql+psycopg://…"`). A value is
written out as the environment would hold it (a list comma-joined, a table as
JSON) and parsed by the same rule, so both sources are checked alike.
"""

from __future__ import annotations

import json
import os
import tomllib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from executor.settings.variables import BY_KEY, DECLARED, VARIABLES, SettingsError, Variable

DEFAULT = "default"
ENV = "env"
FILE = "file"
ARGUMENT = "--config"  # TOOLFENCE_CONFIG's only: the file named on the command line

CONFIG_VARIABLE = "TOOLFENCE_CONFIG"


@dataclass(frozen=True)
class Value:
    variable: Variable
    value: Any
    source: str  # DEFAULT, ENV or FILE (ARGUMENT for TOOLFENCE_CONFIG)

    @property
    def shown(self) -> str:
        return self.variable.shown(self.value)


class Loaded(Mapping[str, Value]):
    """Every declared variable's value and where it came from, and the settings file read."""

    def __init__(self, entries: Mapping[str, Value], config_file: str | None) -> None:
        self._entries = dict(entries)
        self.config_file = config_file

    def __getitem__(self, name: str) -> Value:
        return self._entries[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)


class _Choice:
    """The settings file `toolfence --config` chose for this process (None: TOOLFENCE_CONFIG's)."""

    path: str | None = None


CHOICE = _Choice()


def use_config_file(path: str | None) -> None:
    """Read settings from `path` (in this process) instead of TOOLFENCE_CONFIG's file."""
    CHOICE.path = path


def load(environ: Mapping[str, str] | None = None, *, config_file: str | None = None) -> Loaded:
    """Every declared variable: from `environ` (default: the process's), over the
    settings file, over its default. A bad value raises SettingsError naming it."""
    environ = os.environ if environ is None else environ
    path = config_file or CHOICE.path or environ.get(CONFIG_VARIABLE) or None
    from_file = _read_file(path) if path else {}
    values: dict[str, Value] = {}
    parsed: dict[str, Any] = {}
    for variable in DECLARED:
        value = _value(variable, environ, from_file, parsed)
        if variable.name == CONFIG_VARIABLE and path:
            value = Value(variable, path, ENV if environ.get(CONFIG_VARIABLE) == path else ARGUMENT)
        values[variable.name] = value
        parsed[variable.name] = value.value
    return Loaded(values, path)


def read(name: str, environ: Mapping[str, str] | None = None) -> Any:
    """One declared variable's value, read now (for the few settings a component reads
    when it starts: the engine's ping threshold, `toolfence serve`'s, the exporter's)."""
    variable = VARIABLES[name]
    environ = os.environ if environ is None else environ
    path = CHOICE.path or environ.get(CONFIG_VARIABLE) or None
    from_file = _read_file(path) if path and variable.in_file else {}
    earlier: dict[str, Any] = {}
    if callable(variable.default):
        # A default computed from others (the database under TOOLFENCE_HOME): read them too.
        earlier = {n: v.value for n, v in load(environ).items()}
    return _value(variable, environ, from_file, earlier).value


def _value(
    variable: Variable, environ: Mapping[str, str], from_file: Mapping[str, str], earlier: Mapping[str, Any]
) -> Value:
    raw = environ.get(variable.name)
    if raw is not None and (raw != "" or not variable.blank_is_default):
        return Value(variable, variable.parse(raw), ENV)
    if variable.in_file and variable.name in from_file:
        return Value(variable, variable.parse(from_file[variable.name]), FILE)
    return Value(variable, variable.default_for(earlier), DEFAULT)


def _read_file(path: str) -> dict[str, str]:
    """The settings file's values, by variable name, as text."""
    try:
        with Path(path).open("rb") as handle:
            document = tomllib.load(handle)
    except OSError as exc:
        raise SettingsError(f"{CONFIG_VARIABLE}={path!r}: cannot read it: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise SettingsError(f"{CONFIG_VARIABLE}={path!r} is not TOML: {exc}") from None
    values: dict[str, str] = {}
    for key, value in document.items():
        variable = BY_KEY.get(key.lower())
        if variable is None:
            raise SettingsError(f"{CONFIG_VARIABLE}={path!r}: unknown setting {key!r}")
        values[variable.name] = _as_text(value)
    return values


def _as_text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return ",".join(str(item) for item in value)
    if isinstance(value, dict):
        return json.dumps(value)
    return str(value)
