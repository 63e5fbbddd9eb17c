"""redact_url, scrub_text, header scrubbing: exact behaviour, hostile input, planted secrets, linear time."""

from __future__ import annotations

import random
import string
import time
from urllib.parse import quote

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from gym_obs.telemetry import names
from gym_obs.telemetry.redaction import (
    REDACTED,
    REDACTED_USERINFO,
    SENSITIVE_HEADERS,
    URL_PLACEHOLDER,
    is_plain_word,
    redact_url,
    scrub_headers,
    scrub_text,
    scrub_word,
)

# --- redact_url ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("http://u:p@h:80/a/b?x=1#f", f"http://{REDACTED_USERINFO}@h:80/a/b"),
        ("https://user@example.com/path", f"https://{REDACTED_USERINFO}@example.com/path"),
        ("https://[::1]:8080/x?y", "https://[::1]:8080/x"),
        ("HTTP://Example.COM:8080/Case/Kept", "HTTP://Example.COM:8080/Case/Kept"),
        ("http://h/a%20b;p?q#f", "http://h/a%20b;p"),
        ("http://h?only=query", "http://h"),
        ("http://h#frag", "http://h"),
        ("//h/p?q", "//h/p"),
        ("/p/q?x=1", "/p/q"),
        ("  http://h/p  ", "http://h/p"),
        ("file:///etc/hosts?x", "file:///etc/hosts"),
        ("http://müller.de/ä?x", "http://müller.de/ä"),
        ("http://h/users/@me", "http://h/users/@me"),
    ],
)
def test_redact_url_keeps_scheme_host_port_path(url: str, expected: str) -> None:
    assert redact_url(url) == expected


@pytest.mark.parametrize(
    "value",
    [
        "",
        "hello world",
        "mailto:someone@example.com",
        "http://",
        "http://h/a\nInjected: header",
        "http://u:pa/ss@h/",  # a slash in an unencoded password: not a URL we can trust
        "http://h:notaport/",
        "sk-abcdefghijklmnopqrstuvwxyz",
        "http://[::1/",
    ],
)
def test_redact_url_never_echoes_a_value_that_is_not_a_url(value: str) -> None:
    assert redact_url(value) == URL_PLACEHOLDER


def test_redact_url_accepts_non_str_objects() -> None:
    class Url:
        def __str__(self) -> str:
            return "http://u:p@h/x?k=v"

    assert redact_url(Url()) == f"http://{REDACTED_USERINFO}@h/x"  # type: ignore[arg-type]


@given(st.text())
def test_redact_url_never_raises_and_never_keeps_query_or_fragment(value: str) -> None:
    result = redact_url(value)
    assert isinstance(result, str)
    assert "?" not in result
    assert "#" not in result
    assert result == URL_PLACEHOLDER or result.startswith(("/", value.strip()[:1]))


_SECRET = st.text(alphabet=string.ascii_letters + string.digits, min_size=8, max_size=30)
_HOST = st.from_regex(r"[a-z][a-z0-9-]{0,20}(\.[a-z]{2,6}){0,2}", fullmatch=True)
_PATH = st.lists(st.from_regex(r"[A-Za-z0-9._~-]{1,12}", fullmatch=True), max_size=4).map(
    lambda segments: "".join("/" + s for s in segments)
)


@given(
    scheme=st.sampled_from(["http", "https", "ws"]),
    host=_HOST,
    port=st.one_of(st.none(), st.integers(1, 65535)),
    path=_PATH,
    user=_SECRET,
    password=_SECRET,
    query_secret=_SECRET,
    fragment_secret=_SECRET,
)
def test_planted_url_secrets_never_survive(
    scheme: str,
    host: str,
    port: int | None,
    path: str,
    user: str,
    password: str,
    query_secret: str,
    fragment_secret: str,
) -> None:
    authority = host + (f":{port}" if port is not None else "")
    url = (
        f"{scheme}://{quote(user)}:{quote(password)}@{authority}{path}?token={query_secret}#{fragment_secret}"
    )
    result = redact_url(url)
    assert result == f"{scheme}://{REDACTED_USERINFO}@{authority}{path}"
    kept = result.replace(REDACTED_USERINFO, "")
    for secret in (user, password, query_secret, fragment_secret):
        if secret not in f"{scheme}://{authority}{path}":
            assert secret not in kept


# --- scrub_text ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Authorization: Bearer abc.def", f"Authorization: {REDACTED}"),
        ("proxy-authorization: Basic dXNlcjpwYXNz", f"proxy-authorization: {REDACTED}"),
        ("{'Authorization': 'Basic dXNlcg==', 'x': 1}", f"{{'Authorization': '{REDACTED}', 'x': 1}}"),
        ("Cookie: a=b; c=d\nnext line", f"Cookie: {REDACTED}\nnext line"),
        ("api_key=abc123 next", f"api_key={REDACTED} next"),
        ("X-Api-Key: abc123", f"X-Api-Key: {REDACTED}"),
        ('{"api_key": "my secret key", "b": 2}', f'{{"api_key": "{REDACTED}", "b": 2}}'),
        ('\\"password\\": \\"hunter2\\"', f'\\"password\\": \\"{REDACTED}\\"'),
        ("token: Bearer xyz", f"token: {REDACTED}"),
        ("client_secret = s3cr3t&x=1", f"client_secret = {REDACTED}&x=1"),
        ("PASSWORD=Xyz", f"PASSWORD={REDACTED}"),
        ("sent with bearer eyJabc.def", f"sent with bearer {REDACTED}"),
        ("key sk-abcdefghijklmnopqrstuvwx end", f"key sk-{REDACTED} end"),
        ("sk-proj-abcdefghijklmnopqrstuvwx", f"sk-{REDACTED}"),
        ("gh ghp_abcdefghijklmnopqrstuvwxyz0123", f"gh ghp_{REDACTED}"),
        ("aws AKIAABCDEFGHIJKLMNOP key", f"aws {REDACTED} key"),
        ("jwt eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIn0.sig ok", f"jwt {REDACTED} ok"),
        (
            "go to https://user:pw@host.com/path?token=x#frag now",
            f"go to https://{REDACTED_USERINFO}@host.com/path now",
        ),
        ("GET /x?token=abc&b=2 HTTP/1.1", f"GET /x?{REDACTED} HTTP/1.1"),
    ],
)
def test_scrub_text_removes_secrets(text: str, expected: str) -> None:
    assert scrub_text(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        "max_tokens: 100",
        "the quick brown fox",
        "task-abcdefghijklmnopqrstuvwxyz is a task id",
        "ValueError: invalid literal for int() with base 10: 'x'",
        "What? Yes.",
    ],
)
def test_scrub_text_leaves_ordinary_text_alone(text: str) -> None:
    assert scrub_text(text) == text


@given(st.text())
def test_scrub_text_never_raises(text: str) -> None:
    assert isinstance(scrub_text(text), str)


_SEPARATORS = st.sampled_from([" ", "\n", ", ", "\t", " | "])
_FILLER = st.text(alphabet=string.ascii_letters + string.digits + " .,:;-_()[]{}\n", max_size=60)
_TOKEN_CHARS = string.ascii_letters + string.digits


@st.composite
def _planted(draw: st.DrawFn) -> tuple[str, str]:
    """(text with a secret in a recognisable form, the secret value)."""
    form = draw(st.sampled_from(["kv", "json", "bearer", "auth", "openai", "aws", "url_user", "url_query"]))
    value = draw(st.text(alphabet=_TOKEN_CHARS, min_size=16, max_size=40))
    if form == "kv":
        key = draw(st.sampled_from(["api_key", "token", "password", "secret", "access_token", "API-KEY"]))
        planted = f"{key}={value}"
    elif form == "json":
        key = draw(st.sampled_from(["api_key", "password", "client_secret", "apiKey"]))
        planted = f'{{"{key}": "{value}"}}'
    elif form == "bearer":
        planted = f"Bearer {value}"
    elif form == "auth":
        planted = f"Authorization: Basic {value}"
    elif form == "openai":
        planted = f"sk-{value}"
    elif form == "aws":
        value = "AKIA" + draw(
            st.text(alphabet=string.ascii_uppercase + string.digits, min_size=16, max_size=16)
        )
        planted = value
    elif form == "url_user":
        planted = f"https://admin:{value}@db.internal:5432/app"
    else:
        planted = f"https://api.example.com/v1?key={value}&x=1"
    return planted, value


@settings(suppress_health_check=[HealthCheck.too_slow])
@given(before=_FILLER, sep1=_SEPARATORS, planted=_planted(), sep2=_SEPARATORS, after=_FILLER)
def test_planted_secrets_never_survive_scrub_text(
    before: str, sep1: str, planted: tuple[str, str], sep2: str, after: str
) -> None:
    text, secret = planted
    assume(secret not in before + after)
    assert secret not in scrub_text(before + sep1 + text + sep2 + after)



@settings(suppress_health_check=[HealthCheck.too_slow])
@given(before=_FILLER, sep1=_SEPARATORS, planted=_planted(), sep2=_SEPARATORS, after=_FILLER)
def test_scrub_text_is_idempotent(
    before: str, sep1: str, planted: tuple[str, str], sep2: str, after: str
) -> None:
    """Layers scrub again what an inner layer already scrubbed; the second pass must change nothing."""
    once = scrub_text(before + sep1 + planted[0] + sep2 + after)
    assert scrub_text(once) == once

_ADVERSARIAL = [
    "a" * 1_000_000,
    "token=" * 200_000,
    "sk-" * 300_000,
    "http://" * 150_000,
    "://" * 300_000,
    "?a=" * 300_000,
    "eyJ" * 300_000,
    "bearer " * 150_000,
    '"password":"' * 80_000,
    "Authorization: " * 60_000,
    "token" + " " * 1_000_000,
    "AKIA" * 250_000,
    "a://" + "a" * 1_000_000,
    ("x" * 31 + "://") * 30_000,
    "sk-aaaaaaaaaaaaaaa " * 50_000,
    "?" + "a" * 63 + "?" * 1_000_000,
    "İ" + "token " * 150_000,
]


@pytest.mark.parametrize("text", _ADVERSARIAL, ids=lambda t: repr(t[:12]))
def test_scrub_text_and_redact_url_are_linear_on_adversarial_input(text: str) -> None:
    started = time.perf_counter()
    scrub_text(text)
    redact_url(text)
    # ~1 MB each; quadratic behaviour would take minutes. Generous bound for slow CI machines.
    assert time.perf_counter() - started < 3.0


# --- headers ---------------------------------------------------------------------------------------------


def test_sensitive_headers_are_lowercase_and_cover_the_usual_suspects() -> None:
    assert all(h == h.lower() for h in SENSITIVE_HEADERS)
    for name in ("authorization", "proxy-authorization", "cookie", "set-cookie", "x-api-key"):
        assert name in SENSITIVE_HEADERS


def test_scrub_headers_redacts_sensitive_values_and_scrubs_the_rest() -> None:
    headers = {
        "Authorization": "Bearer abc",
        "Cookie": "session=xyz",
        "X-Api-Key": "k",
        "Content-Type": "application/json",
        "Referer": "https://u:p@site/x?token=1",
    }
    assert scrub_headers(headers) == {
        "Authorization": REDACTED,
        "Cookie": REDACTED,
        "X-Api-Key": REDACTED,
        "Content-Type": "application/json",
        "Referer": f"https://{REDACTED_USERINFO}@site/x",
    }


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("http://[fe80::1%25eth0]:8080/p?q", "http://[fe80::1%25eth0]:8080/p"),
        ("http://user:p@ss@host:1/p", f"http://{REDACTED_USERINFO}@host:1/p"),  # '@' inside the password
        ("http://user:p%40ss@host/p%2Fq%20r?x", f"http://{REDACTED_USERINFO}@host/p%2Fq%20r"),
        ("http://h/a;jsessionid=1/b;v=2?q", "http://h/a;jsessionid=1/b;v=2"),  # path params are path
        ("http://h", "http://h"),
        ("http://h:9/", "http://h:9/"),
        ("http://:secret@h/", f"http://{REDACTED_USERINFO}@h/"),
        ("https://h/p/?", "https://h/p/"),
        ("https://h/p#", "https://h/p"),
        ("ws://h:1/socket?token=x", "ws://h:1/socket"),
    ],
)
def test_redact_url_odd_but_valid_urls(url: str, expected: str) -> None:
    assert redact_url(url) == expected


def test_redact_url_accepts_bytes_and_url_objects() -> None:
    from yarl import URL

    assert redact_url(b"http://u:p@h/x?k=v") == f"http://{REDACTED_USERINFO}@h/x"  # type: ignore[arg-type]
    assert redact_url(bytearray(b"http://h/x#f")) == "http://h/x"  # type: ignore[arg-type]
    assert redact_url(memoryview(b"/p?x")) == "/p"  # type: ignore[arg-type]
    assert redact_url(URL("http://u:p@h:1/x?k=v#f")) == f"http://{REDACTED_USERINFO}@h:1/x"  # type: ignore[arg-type]
    for value in (b"\xff\xfe", None, 42, 1.5, object(), b"", [b"http://u:p@h/"]):
        assert redact_url(value) == URL_PLACEHOLDER  # type: ignore[arg-type]


def test_a_backslash_in_the_authority_is_not_trusted() -> None:
    # Browsers read "\\" as "/", so the host is "h" and "@evil" is path; parsers disagree: do not guess.
    assert redact_url("http://h\\@evil.example/x") == URL_PLACEHOLDER
    assert "hunter2" not in scrub_text("see http://u:hunter2\\@evil.example/x")


@given(st.binary(max_size=200))
def test_redact_url_never_raises_on_bytes(value: bytes) -> None:
    result = redact_url(value)  # type: ignore[arg-type]
    assert isinstance(result, str) and "?" not in result and "#" not in result


def test_the_session_token_header_is_never_recorded() -> None:
    assert names.SESSION_HEADER.lower() in SENSITIVE_HEADERS
    assert scrub_headers({names.SESSION_HEADER: "tok.sig"}) == {names.SESSION_HEADER: REDACTED}


def test_scrub_word_is_scrub_text_for_every_word_and_passes_the_rest_on() -> None:
    rng = random.Random(7)
    alphabet = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-"
    planted = (
        "sk-", "sk_live_", "ghp_", "github_pat_", "xoxb-", "hf_", "glpat-", "AKIA", "eyJ", "task-",
        "api_key=", "token:", "Bearer ", "https://u:p@h/x?q=1", "?a=b", " ",
    )  # fmt: skip
    words = [
        "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 40)))
        + rng.choice(planted)
        + "".join(rng.choice(alphabet.upper()) for _ in range(rng.randint(0, 30)))
        for _ in range(20_000)
    ]
    words += ["chatcmpl-9xAbC", "resp_" + "a" * 32, "msg_01XYZ", "sk-" + "A" * 20, "AKIA" + "B" * 16, ""]
    # hex ids (no letter any key prefix starts with: the searches are skipped) with every prefix planted
    prefixes = (
        "sk-", "sk_live_", "sk_test_", "rk_live_", "ghp_", "gho_", "ghs_", "ghu_", "github_pat_",
        "xox[abpr]-", "hf_", "glpat-",
    )  # fmt: skip
    hex_digits = "0123456789abcdef-_"
    for prefix in prefixes:
        for variant in {prefix.replace("[abpr]", c) for c in "abpr"}:
            for key in ("A" * 20, "0" * 16, "0" * 15, "B1" * 10):
                head = "".join(rng.choice(hex_digits) for _ in range(rng.randint(0, 12)))
                words += [head + variant + key, variant + key, head + variant + key + "." + head]
    words += [f"chatcmpl-{n:032x}" for n in range(64)] + [f"resp_{n:048x}" for n in range(64)]
    words += ["ASIA" + "C" * 16, "ab" + "AIPA" + "D" * 16, "eyJ" + "a" * 12, "caf\u00e9-1", "a\x00b", "a\tb"]
    for word in words:
        assert scrub_word(word) == scrub_text(word), word
    assert scrub_word("sk-" + "A" * 20) != "sk-" + "A" * 20  # a key in an id is still removed


def test_a_plain_word_is_printable_and_its_own_scrub() -> None:
    rng = random.Random(11)
    alphabet = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-.:/ \x01\u00e9"
    words = ["".join(rng.choice(alphabet) for _ in range(rng.randint(0, 24))) for _ in range(20_000)]
    words += [f"chatcmpl-{n:032x}" for n in range(64)] + ["", "hf_" + "a" * 20, "eyJ" + "a" * 12]
    plain = [word for word in words if is_plain_word(word)]
    assert len(plain) > 500  # the test reaches the plain case often
    for word in plain:
        assert word and word.isprintable() and scrub_text(word) == word, word
    assert all(is_plain_word(f"chatcmpl-{n:032x}") for n in range(64))  # what vLLM's ids look like
    for word in ("", "resp_68ab", "chatcmpl-9xAbC", "sk-" + "A" * 20, "eyJ" + "a" * 12, "caf\u00e9", "a b"):
        assert not is_plain_word(word), word  # a mark (k g x _ A J), no word, or empty: the full scrub
