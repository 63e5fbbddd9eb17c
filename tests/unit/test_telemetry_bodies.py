"""bounded_excerpt: the stated bound, head + longer tail, UTF-8 safety, escaping, scrubbing, 10 MB bodies."""

from __future__ import annotations

import re
import string
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gym_obs.telemetry.bodies import (
    MAX_MARKER_CHARS,
    UPSTREAM_ERROR_LOG_BODY_CHARS,
    bounded_excerpt,
    elision_marker,
)
from gym_obs.telemetry.redaction import REDACTED

_MARKER_RE = re.compile(r"…\[(\d+) (chars|bytes) elided\]…")


def _traceback(frames: int, last_line: str) -> str:
    body = "".join(
        f'  File "/srv/app/module_{i}.py", line {i}, in handler_{i}\n    call_{i}()\n' for i in range(frames)
    )
    return "Traceback (most recent call last):\n" + body + last_line + "\n"


def test_default_limit_is_2000() -> None:
    assert UPSTREAM_ERROR_LOG_BODY_CHARS == 2000


def test_small_bodies_are_returned_whole() -> None:
    assert bounded_excerpt("short body") == "short body"
    assert bounded_excerpt(b'{"error": "bad"}') == '{"error": "bad"}'
    assert bounded_excerpt(None) == ""
    assert bounded_excerpt(b"") == ""


def test_marker_is_bounded() -> None:
    assert len(elision_marker(2**64, "bytes")) <= MAX_MARKER_CHARS


def test_long_body_keeps_head_and_a_longer_tail_with_one_marker() -> None:
    text = "H" * 5000 + "T" * 5000
    excerpt = bounded_excerpt(text, 300)
    (marker,) = _MARKER_RE.findall(excerpt)
    head, tail = _MARKER_RE.split(excerpt)[0], _MARKER_RE.split(excerpt)[-1]
    assert head == "H" * 100
    assert tail == "T" * 200
    assert int(marker[0]) == 10_000 - 300
    assert marker[1] == "chars"


def test_last_line_of_a_long_traceback_survives() -> None:
    last = "ValueError: invalid model name 'gpt-x'"
    excerpt = bounded_excerpt(_traceback(5000, last))
    assert excerpt.rstrip("\n").endswith(last)
    assert excerpt.startswith("Traceback (most recent call last):")
    assert len(excerpt) <= 2000 + MAX_MARKER_CHARS


def test_cuts_prefer_line_boundaries() -> None:
    excerpt = bounded_excerpt(_traceback(500, "KeyError: 'x'"), 600)
    tail = _MARKER_RE.split(excerpt)[-1]
    assert tail.startswith("  File ") or tail.startswith("    call_")


def test_invalid_utf8_is_replaced_not_raised() -> None:
    assert bounded_excerpt(b"ok \xff\xfe bad") == "ok \ufffd\ufffd bad"


def test_multibyte_characters_are_never_split() -> None:
    body = "你好" * 20_000  # 120 000 bytes: windowed path
    excerpt = bounded_excerpt(body.encode(), 100)
    assert "\ufffd" not in excerpt
    assert set(_MARKER_RE.sub("", excerpt)) <= {"你", "好"}


def test_control_characters_are_escaped_one_for_one() -> None:
    excerpt = bounded_excerpt("a\x00b\x1b[31mred\x7f\r\nnext\tcol\u202eevil\ud800")
    assert excerpt == "a␀b␛[31mred␡␍\nnext\tcol\ufffdevil\ufffd"


def test_secrets_are_scrubbed_in_head_and_tail() -> None:
    body = "api_key=HEADSECRET123 " + "x " * 10_000 + "\nAuthorization: Bearer TAILSECRET456\n"
    excerpt = bounded_excerpt(body)
    assert "HEADSECRET123" not in excerpt
    assert "TAILSECRET456" not in excerpt
    assert excerpt.count(REDACTED) == 2


def test_ten_megabyte_body_is_fast_and_reports_bytes() -> None:
    body = (b"x" * 99 + b"\n") * 100_000 + b"RuntimeError: last line\n"
    started = time.perf_counter()
    excerpt = bounded_excerpt(body)
    elapsed = time.perf_counter() - started
    assert elapsed < 0.05  # only the two windows are decoded and scrubbed
    assert excerpt.rstrip().endswith("RuntimeError: last line")
    ((count, unit),) = _MARKER_RE.findall(excerpt)
    assert unit == "bytes"
    assert int(count) + len(_MARKER_RE.sub("", excerpt).encode()) == len(body)


def test_ten_megabyte_str_reports_chars() -> None:
    body = "y" * 10_000_000
    excerpt = bounded_excerpt(body, 90)
    ((count, unit),) = _MARKER_RE.findall(excerpt)
    assert (int(count), unit) == (10_000_000 - 90, "chars")


@pytest.mark.parametrize("limit", [0, -5])
def test_non_positive_limit_yields_only_the_marker(limit: int) -> None:
    assert _MARKER_RE.fullmatch(bounded_excerpt("abc", limit))


def test_bytearray_and_memoryview_are_accepted() -> None:
    assert bounded_excerpt(bytearray(b"abc")) == "abc"
    assert bounded_excerpt(memoryview(b"abc")) == "abc"


_BODIES = st.one_of(
    st.text(),
    st.binary(),
    st.text(alphabet=string.printable + "你好\x00\x1b\u202e", min_size=3000, max_size=20_000),
    st.binary(min_size=3000, max_size=20_000),
)


@given(content=_BODIES, limit=st.integers(min_value=-10, max_value=5000))
def test_excerpt_never_exceeds_the_stated_bound(content: str | bytes, limit: int) -> None:
    excerpt = bounded_excerpt(content, limit)
    assert len(excerpt) <= max(limit, 0) + MAX_MARKER_CHARS
    assert len(_MARKER_RE.findall(excerpt)) <= 1 or len(_MARKER_RE.findall(str(content))) > 0
    assert not any(ord(c) < 0x20 and c not in "\n\t" for c in excerpt)


@given(
    frames=st.integers(min_value=50, max_value=3000),
    message=st.text(alphabet=string.ascii_letters + string.digits + " :'_.", min_size=1, max_size=200),
    as_bytes=st.booleans(),
)
def test_last_traceback_line_survives_for_any_length(frames: int, message: str, as_bytes: bool) -> None:
    last = f"RuntimeError: {message.strip() or 'x'}"
    body = _traceback(frames, last)
    excerpt = bounded_excerpt(body.encode() if as_bytes else body)
    assert excerpt.rstrip("\n").endswith(last.rstrip())


@given(
    secret=st.text(alphabet=string.ascii_letters + string.digits, min_size=16, max_size=32),
    filler=st.integers(min_value=0, max_value=30_000),
    where=st.sampled_from(["head", "tail"]),
)
def test_planted_secret_never_survives_an_excerpt(secret: str, filler: int, where: str) -> None:
    planted = f"\nAuthorization: Bearer {secret}\n"
    noise = "lorem ipsum\n" * (filler // 12)
    body = planted + noise if where == "head" else noise + planted
    assert secret not in bounded_excerpt(body)


@given(
    shift=st.integers(min_value=-80, max_value=80),
    form=st.sampled_from(["sk", "kv", "bearer"]),
    where=st.sampled_from(["head", "tail"]),
    as_bytes=st.booleans(),
)
def test_a_secret_split_by_the_cut_of_a_large_body_never_survives(
    shift: int, form: str, where: str, as_bytes: bool
) -> None:
    """No line break or space near the cut: the cut falls inside the secret; no part of it may survive."""
    value = "A1b2C3d4E5f6G7h8J9k0L1m2"
    planted = {"sk": f",sk-{value},", "kv": f",api_key={value},", "bearer": f",Bearer {value},"}[form]
    limit = 2000
    filler = "x" * 20_000  # forces the windowed path, and offers no break to align the cut on
    if where == "head":
        body = "y" * (limit // 3 + shift) + planted + filler
    else:
        body = filler + planted + "y" * (limit - limit // 3 + shift)
    excerpt = bounded_excerpt(body.encode() if as_bytes else body, limit)
    assert len(excerpt) <= limit + MAX_MARKER_CHARS
    for start in range(0, len(value) - 5):
        assert value[start : start + 6] not in excerpt


@pytest.mark.parametrize("as_bytes", [False, True])
def test_exactly_limit_is_whole_and_one_more_is_elided(as_bytes: bool) -> None:
    for limit in (1, 2, 3, 10, 2000):
        whole = "é" * limit
        content = whole.encode() if as_bytes else whole
        assert bounded_excerpt(content, limit) == whole
        longer = "é" * (limit + 1)
        excerpt = bounded_excerpt(longer.encode() if as_bytes else longer, limit)
        ((count, _),) = _MARKER_RE.findall(excerpt)
        assert int(count) == 1
        assert len(excerpt) - len(_MARKER_RE.search(excerpt).group(0)) == limit  # type: ignore[union-attr]
