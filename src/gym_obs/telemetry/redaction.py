"""Redaction at the source: URLs, headers and free text are cleaned before they reach a span, log or record.

Everything here is total (never raises) and linear in the input length: the regular expressions start with
a literal or a bounded class and every unbounded repeat is the last thing a match does, so a hostile input
cannot make them backtrack quadratically.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Final

from gym_obs.telemetry import names

__all__ = [
    "REDACTED",
    "REDACTED_USERINFO",
    "SENSITIVE_HEADERS",
    "URL_PLACEHOLDER",
    "escape_controls",
    "is_plain_word",
    "is_secret_key",
    "redact_url",
    "scrub_headers",
    "scrub_text",
    "scrub_word",
]

REDACTED: Final = "[REDACTED]"
"""What a removed secret value is replaced with."""

REDACTED_USERINFO: Final = "REDACTED:REDACTED"
"""What the ``user:password`` part of a URL is replaced with."""

URL_PLACEHOLDER: Final = "<unparseable-url>"
"""Returned by :func:`redact_url` for a value that is not a URL (never the input itself)."""

_TEXT_PLACEHOLDER: Final = "<unscrubbable-text>"

SENSITIVE_HEADERS: Final[frozenset[str]] = frozenset(
    {
        "authorization",
        "proxy-authorization",
        "cookie",
        "set-cookie",
        "x-api-key",
        "api-key",
        "x-auth-token",
        "x-access-token",
        "x-amz-security-token",
        "x-goog-api-key",
        "x-csrf-token",
        "x-xsrf-token",
        "openai-api-key",
        names.SESSION_HEADER.lower(),  # a signed session token: whoever holds it is that session
    }
)
"""Header names (lowercase) whose values are never recorded."""

# A key naming a secret: its value is never served by the head server, echoed in a config error or kept in
# a failure's details. One rule for config keys and details keys alike.
_SECRET_KEY: Final = re.compile(
    r"api[_-]?key|apikey|secret|token|passw|passphrase|pwd|auth|credential|cookie|signature|private[_-]?key",
    re.IGNORECASE,
)


def is_secret_key(key: object) -> bool:
    """Whether a key names a secret (``session_secret``, ``api_key``, ``OPENAI_API_KEY``, …)."""
    return isinstance(key, str) and _SECRET_KEY.search(key) is not None

# --- URLs ------------------------------------------------------------------------------------------------

_SCHEME_CHARS: Final = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789+.-")
_SCHEME_RE: Final = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]{0,31}")
# host[:port] after userinfo was removed: a registered name (unicode allowed) or an IP literal in brackets.
_HOSTPORT_RE: Final = re.compile(
    r"(?:\[[0-9A-Za-z:.%_\-]{1,100}\]|[^\s/?#@\[\]:\\<>\"'{}|^`\x00-\x1f\x7f]*)(?::[0-9]{0,5})?"
)
_CONTROL_RE: Final = re.compile(r"[\x00-\x1f\x7f]")


def redact_url(url: str) -> str:
    """Return ``url`` without query, fragment and credentials; scheme, host, port and path are kept as is.

    Accepts absolute URLs (``scheme://authority/path``), scheme-relative ``//authority/path`` and absolute
    paths (``/path``), as ``str``, UTF-8 ``bytes`` or any object whose ``str()`` is a URL (``yarl.URL``).
    Anything else, including values with control characters (log injection), yields
    :data:`URL_PLACEHOLDER`: the input itself is never echoed back when it cannot be parsed.
    """
    try:
        if isinstance(url, str):
            text = url
        elif isinstance(url, bytes | bytearray | memoryview):
            text = bytes(url).decode("utf-8")  # undecodable bytes are not a URL: placeholder below
        else:
            text = str(url)  # yarl.URL, httpx.URL, pathlib-like objects
        return _redact_url(text.strip())
    except Exception:
        return URL_PLACEHOLDER


def _redact_url(url: str) -> str:
    if url.startswith("/") and not url.startswith("//"):
        path = _cut_query(url, 0)
        return URL_PLACEHOLDER if _CONTROL_RE.search(path) else path
    if url.startswith("//"):
        scheme, rest_start = "", 2
    else:
        m = _SCHEME_RE.match(url)
        if m is None or not url.startswith("://", m.end()):
            return URL_PLACEHOLDER
        scheme, rest_start = url[: m.end()], m.end() + 3
    auth_end = len(url)
    for delimiter in "/?#":
        idx = url.find(delimiter, rest_start)
        if idx != -1 and idx < auth_end:
            auth_end = idx
    authority = url[rest_start:auth_end]
    if "\\" in authority:  # browsers read a backslash as "/": which host is meant is ambiguous
        return URL_PLACEHOLDER
    at = authority.rfind("@")
    hostport = authority[at + 1 :] if at != -1 else authority
    hp = _HOSTPORT_RE.fullmatch(hostport)
    if hp is None or (not hostport and scheme.lower() != "file"):
        return URL_PLACEHOLDER
    path = _cut_query(url, auth_end)
    if _CONTROL_RE.search(path):
        return URL_PLACEHOLDER
    userinfo = REDACTED_USERINFO + "@" if at != -1 else ""
    prefix = scheme + "://" if scheme else "//"
    return prefix + userinfo + hostport + path


def _cut_query(url: str, start: int) -> str:
    end = len(url)
    for delimiter in "?#":
        idx = url.find(delimiter, start)
        if idx != -1 and idx < end:
            end = idx
    return url[start:end]


# --- free text -------------------------------------------------------------------------------------------

_URL_TOKEN_END: Final = re.compile(r"[^\s\"'<>`\\]*")

_SEP: Final = r"(?:\\?[\"'])?[ \t]{0,8}[:=][ \t]{0,8}"
_QUOTED_VALUE: Final = r"(?P<q>\\?\")[^\"\\\r\n]*|(?P<sq>\\?')[^'\\\r\n]*"
# Header-like keys whose value is the rest of the line (``Authorization: Bearer x``, cookies).
_LINE_RE: Final = (
    rf"(?P<head>(?:proxy-authorization|authorization|cookie){_SEP})(?:{_QUOTED_VALUE}|[^\r\n\"'\\}}]+)"
)
# key=value, key: value, "key": "value" (also inside escaped JSON).
_KV_RE: Final = (
    r"(?P<head>(?:api[_-]?key|apikey|access[_-]?key|secret[_-]?key|private[_-]?key|client[_-]?secret|secret"
    rf"|token|password|passwd|passphrase|pwd|auth|credentials?|signature){_SEP})"
    rf"(?:{_QUOTED_VALUE}|(?:(?:bearer|basic)[ \t]+)?[^\s\"'\\,;&)}}\]<>]+)"
)
_BEARER_RE: Final = r"(?P<head>bearer[ \t]+)[a-z0-9._~+/=\-]+"


class _CaselessPass:
    """One scrubbing pass over text matched case-insensitively.

    ``re.IGNORECASE`` with many alternatives costs ~200 ns per character in CPython; matching a lowercased
    copy with a case-sensitive pattern lets the engine skip ahead on the first literal, ~10x faster. Spans
    are then applied to the original text, which works because ``str.lower`` kept the length (checked).
    """

    __slots__ = ("_caseless", "_lower", "_triggers")

    def __init__(self, pattern: str, triggers: tuple[str, ...]) -> None:
        self._lower = re.compile(pattern)
        self._caseless = re.compile(pattern, re.IGNORECASE)
        self._triggers = triggers

    def __call__(self, text: str) -> str:
        low = text.lower()
        if not any(t in low for t in self._triggers):
            return text
        matches = self._lower.finditer(low) if len(low) == len(text) else self._caseless.finditer(text)
        pieces: list[str] = []
        pos = 0
        for m in matches:
            head_end = m.end("head")
            for quote in ("q", "sq"):
                if quote in m.re.groupindex and m.start(quote) != -1:
                    head_end = m.end(quote)
            if text.startswith(REDACTED, head_end):
                continue  # already scrubbed: scrubbing twice must change nothing
            pieces.append(text[pos : m.start()])
            pieces.append(text[m.start() : head_end] + REDACTED)
            pos = m.end()
        if not pieces:
            return text
        pieces.append(text[pos:])
        return "".join(pieces)


_CASELESS_PASSES: Final = (
    _CaselessPass(_LINE_RE, ("authorization", "cookie")),
    _CaselessPass(_KV_RE, ("key", "secret", "token", "pass", "pwd", "auth", "credential", "signature")),
    _CaselessPass(_BEARER_RE, ("bearer",)),
)

# Provider keys with a recognisable prefix (OpenAI, Stripe, GitHub, Slack, Hugging Face, GitLab) and AWS
# access key ids. Case-sensitive; a key glued to a preceding letter or digit is not a key (``task-…``).
_KEY_PREFIXES: Final = (
    "sk-", "sk_live_", "sk_test_", "rk_live_", "ghp_", "gho_", "ghs_", "ghu_", "github_pat_", "xox[abpr]-",
    "hf_", "glpat-",
)  # fmt: skip
_PREFIXED_KEY_RE: Final = re.compile(r"(?P<prefix>" + "|".join(_KEY_PREFIXES) + r")[A-Za-z0-9_\-]{16,}")
# Every key prefix holds one of these, so a word holding none holds no key (scrub_word skips the search).
_KEY_PREFIX_MARKS: Final = ("k", "g", "x", "hf_")
if not all(any(mark in prefix for mark in _KEY_PREFIX_MARKS) for prefix in _KEY_PREFIXES):  # pragma: no cover
    raise AssertionError("a provider-key prefix without a mark: extend _KEY_PREFIX_MARKS and scrub_word")
_AWS_KEY_RE: Final = re.compile(r"(?:AKIA|ASIA|AGPA|AIDA|AROA|ANPA|ANVA|AIPA)[A-Z0-9]{16}")
_JWT_RE: Final = re.compile(r"eyJ[A-Za-z0-9_\-]{10,}(?:\.[A-Za-z0-9_\-]*){0,2}")
# The query string of a relative URL inside text (absolute URLs go through redact_url).
_QUERY_RE: Final = re.compile(r"\?[A-Za-z0-9_.\-\[\]%]{1,64}=[^\s\"'<>`\\]*")


def _replace_prefixed_key(m: re.Match[str]) -> str:
    start = m.start()
    if start > 0 and m.string[start - 1].isalnum():
        return m.group(0)
    return m.group("prefix") + REDACTED


def scrub_text(text: str) -> str:
    """Remove common secrets from free text: credentials in URLs, URL query strings, bearer tokens and
    ``Authorization``/``Cookie`` values, ``api_key=``/``token:``/``"password": "…"`` pairs, provider API
    keys (``sk-…``, ``ghp_…``, …), AWS access key ids and JWTs. Over-redaction is preferred to a leak.

    Linear time; never raises (an input that cannot be processed yields a fixed placeholder).
    """
    try:
        if not isinstance(text, str):
            text = str(text)
        text = _scrub_urls(text)
        for caseless_pass in _CASELESS_PASSES:
            text = caseless_pass(text)
        text = _PREFIXED_KEY_RE.sub(_replace_prefixed_key, text)
        text = _AWS_KEY_RE.sub(REDACTED, text)
        if "eyJ" in text:
            text = _JWT_RE.sub(REDACTED, text)
        if "?" in text:
            text = _QUERY_RE.sub("?" + REDACTED, text)
        return text
    except Exception:
        return _TEXT_PLACEHOLDER


# One word of the characters ids are made of (``[A-Za-z0-9_-]``): no URL, query, separator or space can occur
# in it, so of scrub_text's patterns only the prefixed keys, AWS key ids and JWTs can match inside one, and
# each needs a byte of _WORD_MARKS (a key prefix's mark, ``A`` of an AWS key id, ``J`` of ``eyJ``).
_WORD_MARKS: Final = b"kgx_AJ"
if not all(mark.encode()[-1:] in _WORD_MARKS for mark in _KEY_PREFIX_MARKS):  # pragma: no cover
    raise AssertionError("a key-prefix mark is_plain_word does not class as a mark: extend _WORD_MARKS")
_WORD_BYTES: Final = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-"
# Each byte as its class, in one C call: ``a`` a word byte no such pattern needs, ``B`` any other byte (a
# mark, or no word byte at all); a plain word's classes are then ``islower()``.
_PLAIN_CLASSES: Final = bytes(
    ord("a") if byte in _WORD_BYTES and byte not in _WORD_MARKS else ord("B") for byte in range(256)
)


def is_plain_word(text: str) -> bool:
    """Whether ``text`` is a word of ``[A-Za-z0-9_-]`` without a byte a secret pattern inside a word needs
    (a hex id: ``chatcmpl-<hex>``): printable, and :func:`scrub_text` leaves it as it is. Two C calls and a
    table lookup per byte, for ids that are unique per call (no cache helps)."""
    return text.isascii() and text.encode().translate(_PLAIN_CLASSES).islower()


def scrub_word(text: str) -> str:
    """:func:`scrub_text`, the same result, for an id-like word (``chatcmpl-9x…``, ``resp_68…``): only the
    patterns that fit inside a word of ``[A-Za-z0-9_-]`` are searched, and only when a letter they start
    with is there (a plain word, :func:`is_plain_word`, runs none); any other text goes through
    :func:`scrub_text`. For values that are unique per call, where no cache helps."""
    if is_plain_word(text):
        return text
    if (
        text.isascii()  # O(1) for a str; then its UTF-8 bytes are its characters, and the word test is
        # bytes.isalnum's table (a regex fullmatch costs ~5x more per character)
        and ((rest := text.encode().replace(b"-", b"").replace(b"_", b"")).isalnum() or not rest)
        and (  # the _KEY_PREFIX_MARKS, inline
            ("k" not in text and "g" not in text and "x" not in text and "hf_" not in text)
            or _PREFIXED_KEY_RE.search(text) is None
        )
        and ("A" not in text or _AWS_KEY_RE.search(text) is None)
        and "eyJ" not in text
    ):
        return text
    return scrub_text(text)


def _scrub_urls(text: str) -> str:
    """Run every ``scheme://…`` token in ``text`` through :func:`redact_url`."""
    i = text.find("://")
    if i == -1:
        return text
    out: list[str] = []
    pos = 0
    while i != -1:
        start = i
        while start > pos and i - start < 32 and text[start - 1] in _SCHEME_CHARS:
            start -= 1
        while start < i and not text[start].isalpha():
            start += 1
        end_match = _URL_TOKEN_END.match(text, i + 3)
        end = end_match.end() if end_match is not None else i + 3
        if start < i:
            out.append(text[pos:start])
            out.append(redact_url(text[start:end]))
            pos = end
        i = text.find("://", max(end, i + 3))
    out.append(text[pos:])
    return "".join(out)


_CONTROL_PICTURES: Final = {
    **{code: chr(0x2400 + code) for code in range(0x20) if chr(code) not in "\n\t"},
    0x7F: "\u2421",
    **dict.fromkeys(range(0x80, 0xA0), "\ufffd"),  # C1 controls: 0x9b is a one-byte terminal CSI
}
_ANY_CONTROL_RE: Final = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def escape_controls(text: str) -> str:
    """``text`` with control characters (ESC and the rest, newline and tab excepted) shown as Unicode
    control pictures: a log line printed to a terminal can then never move the cursor or clear the screen."""
    return text.translate(_CONTROL_PICTURES) if _ANY_CONTROL_RE.search(text) else text


def scrub_headers(headers: Mapping[str, str]) -> dict[str, str]:
    """Copy ``headers`` for recording: sensitive values become ``[REDACTED]``, others are scrubbed."""
    result: dict[str, str] = {}
    try:
        for name, value in headers.items():
            key = str(name)
            result[key] = REDACTED if key.lower() in SENSITIVE_HEADERS else scrub_text(str(value))
    except Exception:
        pass
    return result
