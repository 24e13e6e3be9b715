"""`canonical_json`'s stdlib path writes exactly RFC 8785's bytes (decision 0234).

For every JSON value, generated across the cases where the two encoders could
part (control characters, escapes, non-ASCII, U+E000..U+FFFF against characters
above U+FFFF in keys, surrogates, integers at ±2**53, floats, nesting), the bytes
are those of the `rfc8785` library, and what it refuses is still refused.
"""

from __future__ import annotations

from typing import Any

import pytest
import rfc8785
from hypothesis import given, settings
from hypothesis import strategies as st

from executor.core.canonical import NotCanonicalizable, _plain, canonical_json

TEXT = st.text(
    alphabet=st.one_of(
        st.characters(max_codepoint=0x7F),
        st.characters(min_codepoint=0x80, max_codepoint=0x2FFF),
        st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF),  # lone surrogates
        st.characters(min_codepoint=0xE000, max_codepoint=0xFFFF),
        st.characters(min_codepoint=0x10000, max_codepoint=0x10FFFF),
    ),
    max_size=12,
)
SCALARS = st.one_of(
    st.none(), st.booleans(), TEXT,
    st.integers(min_value=-(2**53) - 2, max_value=2**53 + 2),
    st.integers(min_value=-1000, max_value=1000),
    st.floats(allow_nan=False, allow_infinity=False),
)
VALUES = st.recursive(
    SCALARS, lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(TEXT, inner, max_size=4)),
    max_leaves=20,
)


def _reference(value: Any) -> bytes | None:
    try:
        return rfc8785.dumps(value)
    except (rfc8785.CanonicalizationError, TypeError, ValueError, RecursionError):
        return None


@settings(max_examples=600, deadline=None)
@given(VALUES)
def test_canonical_json__any_json_value__the_bytes_rfc8785_writes_or_its_refusal(value: Any) -> None:
    expected = _reference(value)
    if expected is None:
        with pytest.raises(NotCanonicalizable):
            canonical_json(value)
    else:
        assert canonical_json(value) == expected


@pytest.mark.parametrize("value", [
    {"\ue000": 1, "\U0001f600": 2},  # code points and UTF-16 order the two keys differently
    "\ud800",  # a lone surrogate: RFC 8785 escapes it
    2**53, 1.0, ("a",), {1: "a"},
])
def test_plain__values_the_stdlib_would_write_otherwise__go_to_rfc8785(value: Any) -> None:
    assert not _plain(value, 0)


def test_plain__the_common_arguments__take_the_fast_path() -> None:
    value = {"n": 1, "note": "café\n", "tags": ["a", "b"], "flag": True, "none": None}
    assert _plain(value, 0)
    assert canonical_json(value) == rfc8785.dumps(value)
