"""The X-NG-Failure-Report codec: round trip, the truncation rule, bounded decoding of hostile values."""

from __future__ import annotations

import base64
import itertools
import time
import tracemalloc
import zlib
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gym_obs.failures import (
    FAILURE_REPORT_HEADER,
    FailureReport,
    InvalidFailureReport,
    NgFailureEvent,
    decode_failure_report,
    encode_failure_report,
    failure_report_for,
    rebuild_failure,
)
from gym_obs.failures._base import new_event_id
from gym_obs.failures._codec import MAX_MAX_BYTES
from gym_obs.failures._shrink import final_chain
from gym_obs.failures.transport import (
    MAX_DECOMPRESSED_BYTES,
    MAX_ENCODED_CHARS,
    VERSION_PREFIX,
    observe_failure,
    request_failure_log,
)
from gym_obs.telemetry import names
from gym_obs.telemetry._state import STATE
from gym_obs.telemetry.propagation import rollout_context


def _pack(payload: bytes) -> str:
    return VERSION_PREFIX + base64.urlsafe_b64encode(zlib.compress(payload)).rstrip(b"=").decode()


def _noise(chars: int) -> str:
    """Text that does not compress (so sizes are predictable)."""
    return "".join(new_event_id()[3:] for _ in range(chars // 24 + 1))[:chars]


def _long_report(length: int, reason_chars: int = 300) -> tuple[FailureReport, NgFailureEvent, str]:
    """A chain of ``length`` gym events over a foreign root; reasons are random-ish so they don't compress."""
    cause: BaseException = OSError("disk full: the root cause")
    for i in range(length):
        event = NgFailureEvent("internal_error", f"{i}:" + _noise(reason_chars), boundary="agent")
        event.__cause__ = cause
        cause = event
    assert isinstance(cause, NgFailureEvent)
    report = failure_report_for(cause)
    root_id = final_chain(report.events, report.failure_id)[-1]
    return report, cause, root_id


def test_header_name_comes_from_names() -> None:
    assert FAILURE_REPORT_HEADER == names.FAILURE_REPORT_HEADER == "X-NG-Failure-Report"


def test_round_trip() -> None:
    report, final, _ = _long_report(3, reason_chars=20)
    value = encode_failure_report(report)
    assert value.startswith("v1.") and value.isascii() and len(value) <= 4096
    decoded = decode_failure_report(value)
    assert decoded == report
    assert decode_failure_report(value.encode()) == report
    rebuilt = rebuild_failure(decoded)
    assert rebuilt is not None and rebuilt.event_id == final.event_id


def test_truncation_keeps_final_and_root_and_marks_the_gap() -> None:
    report, final, root_id = _long_report(30)
    full = encode_failure_report(report, max_bytes=8000)
    assert len(full) > 4096
    value = encode_failure_report(report)
    assert len(value) <= 4096
    decoded = decode_failure_report(value)
    assert decoded.truncated
    chain = final_chain(decoded.events, decoded.failure_id)
    assert chain[0] == final.event_id and chain[-1] == root_id
    assert decoded.dropped == 31 - len(decoded.events)
    assert sum(r.get("skipped", 0) for r in decoded.events.values()) == decoded.dropped
    # Middle first: the events next to the final failure and next to the root survive.
    assert report.events[final.event_id]["cause_id"] in decoded.events
    kept_before_root = [eid for eid in chain if decoded.events[eid]["cause_id"] == root_id]
    assert kept_before_root and report.events[kept_before_root[0]]["cause_id"] == root_id


def test_secondary_events_are_dropped_before_the_final_chain() -> None:
    report, _, _ = _long_report(3, reason_chars=20)
    events = dict(report.events)
    for _ in range(40):  # recovered failures observed by the same request
        extra = NgFailureEvent("transport_timeout", _noise(270), boundary="model").to_record()
        events[extra["event_id"]] = extra
    big = FailureReport(failure_id=report.failure_id, events=events)
    decoded = decode_failure_report(encode_failure_report(big, max_bytes=2048))
    assert set(report.events) <= set(decoded.events)  # the whole final chain survived
    assert decoded.truncated and len(decoded.events) < len(events)


def test_when_only_final_and_root_remain_fields_shrink() -> None:
    cause = OSError("r" * 900)
    final = NgFailureEvent(
        "internal_error", _noise(999), boundary="agent", details={f"k{i}": new_event_id() for i in range(40)}
    )
    final.__cause__ = cause
    value = encode_failure_report(failure_report_for(final), max_bytes=512)
    assert 0 < len(value) <= 512
    decoded = decode_failure_report(value)
    assert decoded.failure_id == final.event_id and decoded.truncated


def test_max_bytes_bounds() -> None:
    report, final, _ = _long_report(40, reason_chars=900)
    # Above aiohttp's header field limit the value is still capped below it.
    assert len(encode_failure_report(report, max_bytes=100_000)) <= MAX_MAX_BYTES
    # Too small for anything: no header rather than an error or an oversized value.
    for tiny in (-1, 0, 1, 3, 4, 50, 100):
        value = encode_failure_report(report, max_bytes=tiny)
        assert len(value) <= max(tiny, 0)
    assert decode_failure_report(encode_failure_report(FailureReport())) == FailureReport()
    capped = encode_failure_report(report, max_bytes=100_000)
    assert decode_failure_report(capped).failure_id == final.event_id


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(length=st.integers(1, 40), reason=st.integers(0, 900), max_bytes=st.integers(-10, 20_000))
def test_any_max_bytes_is_respected_and_never_raises(length: int, reason: int, max_bytes: int) -> None:
    report, final, _ = _long_report(length, reason_chars=reason)
    value = encode_failure_report(report, max_bytes=max_bytes)
    assert len(value) <= min(max(max_bytes, 0), MAX_MAX_BYTES)
    assert value.isascii()
    if value:
        assert decode_failure_report(value).failure_id == final.event_id


_LABEL = st.text(
    alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=1, max_size=128
)


@st.composite
def _rich_reports(draw: st.DrawFn) -> tuple[FailureReport, str, str]:
    """A final failure over a mixed chain (gym, foreign, groups), plus recovered failures in the log,
    with non-ASCII reasons, details and the longest context labels."""
    nodes: list[BaseException] = []
    for i in range(draw(st.integers(1, 50))):
        reason = draw(st.text(max_size=1200))
        shape = draw(st.sampled_from(["gym", "foreign", "group"]))
        if shape == "gym":
            values = st.dictionaries(st.text(max_size=8), st.text(max_size=300), max_size=8)
            details = draw(st.none() | values)
            nodes.append(NgFailureEvent("verifier_error", reason, boundary="agent", details=details))
        elif shape == "foreign":
            nodes.append(type("E" * draw(st.integers(1, 190)), (Exception,), {})(reason))
        else:
            nodes.append(ExceptionGroup(reason or "g", [KeyError(i), ValueError(reason)]))
    for upper, lower in itertools.pairwise(nodes):
        upper.__cause__ = lower
    saved, STATE.server_name = STATE.server_name, draw(_LABEL)
    try:
        with rollout_context(draw(_LABEL)):
            reason = draw(st.text(max_size=1200))
            final = NgFailureEvent("internal_error", reason, boundary="agent", stage="cleanup")
            recovered = [
                NgFailureEvent("transport_timeout", draw(st.text(max_size=900)), boundary="model")
                for _ in range(draw(st.integers(0, 20)))
            ]
    finally:
        STATE.server_name = saved
    final.__cause__ = nodes[0]
    with request_failure_log() as log:
        for event in recovered:
            observe_failure(event)
        report = log.report(final=final)
    assert report is not None
    return report, final.event_id, final_chain(report.events, report.failure_id)[-1]


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(case=_rich_reports(), max_bytes=st.sampled_from([2048, 4096, 8000]))
def test_any_report_fits_and_keeps_final_and_root(
    case: tuple[FailureReport, str, str], max_bytes: int
) -> None:
    report, final_id, root_id = case
    value = encode_failure_report(report, max_bytes=max_bytes)
    assert 0 < len(value) <= max_bytes and value.isascii()
    decoded = decode_failure_report(value)
    assert decoded.failure_id == final_id
    chain = final_chain(decoded.events, final_id)
    assert chain[-1] == root_id
    if decoded.events.keys() != report.events.keys():
        assert decoded.truncated and decoded.dropped >= len(report.events) - len(decoded.events)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(length=st.integers(1, 40), reason=st.integers(0, 900), max_bytes=st.integers(512, 8000))
def test_encoded_value_never_exceeds_max_bytes(length: int, reason: int, max_bytes: int) -> None:
    report, final, _ = _long_report(length, reason_chars=reason)
    value = encode_failure_report(report, max_bytes=max_bytes)
    assert len(value) <= max_bytes
    if value:
        decoded = decode_failure_report(value)
        assert decoded.failure_id == final.event_id


# --- hostile input ---------------------------------------------------------------------------------------


def _payload(events: Any, failure_id: Any = None, **extra: Any) -> bytes:
    return orjson.dumps({"failure_id": failure_id, "events": events, **extra})


def _record(**changes: Any) -> dict[str, Any]:
    record = NgFailureEvent("internal_error", boundary="agent").to_record()
    record.update(changes)
    return record


def _hostile_values() -> list[Any]:
    a, b = new_event_id(), new_event_id()
    chain = {f"fe_{i:024x}": _record(event_id=f"fe_{i:024x}", cause_id=f"fe_{i + 1:024x}") for i in range(60)}
    return [
        None,
        42,
        "",
        "v1.",
        "v2." + _pack(b"{}")[3:],
        "v1.!!!!",
        "v1.AAAA",
        "v1.é",
        "v1." + "A" * (MAX_ENCODED_CHARS + 10),
        b"\xff\xfe",
        _pack(b"not json"),
        _pack(b"[]"),
        _pack(b"[" * 5000),
        _pack(_payload({a: _record(event_id=a)}, failure_id=b)),
        _pack(_payload({a: _record(event_id=a, cause_id=b)})),
        _pack(_payload({a: _record(event_id=a, cause_id=b), b: _record(event_id=b, cause_id=a)})),
        _pack(_payload(chain)),
        _pack(_payload({"fe_bad": _record()})),
        _pack(_payload({a: _record(event_id=a)}, truncated="yes")),
        _pack(_payload({a: _record(event_id=a)}, dropped=-1)),
        _pack(_payload({a: _record(event_id=a, boundary="x")})),
        _pack(_payload({a: _record(event_id=a)}, failure_id=7)),
        _pack(_payload({a: _record(event_id=a, failure_kind=None)}, failure_id=a)),
        _pack(b"{}") + "garbage",
        _pack(  # duplicate keys: the last one wins, and it is malformed
            b'{"failure_id": null, "events": {"' + a.encode() + b'": ' + orjson.dumps(_record(event_id=a))
            + b', "' + a.encode() + b'": {"event_id": "' + b.encode() + b'"}}}'
        ),
        _pack(b" " * (MAX_DECOMPRESSED_BYTES + 1)),
        VERSION_PREFIX + base64.urlsafe_b64encode(zlib.compress(b"{}")[:-3]).decode(),
    ]


@pytest.mark.parametrize("value", _hostile_values())
def test_decode_rejects_hostile_values(value: Any) -> None:
    with pytest.raises(InvalidFailureReport):
        decode_failure_report(value)


def test_zip_bomb_is_bounded_in_time_and_memory() -> None:
    bomb = zlib.compress(b"\x00" * (512 * 1024 * 1024), 9)  # 512 MiB of zeros, ~500 KiB compressed
    value = VERSION_PREFIX + base64.urlsafe_b64encode(bomb[:40_000]).rstrip(b"=").decode()
    assert len(value) <= MAX_ENCODED_CHARS
    tracemalloc.start()
    started = time.perf_counter()
    try:
        with pytest.raises(InvalidFailureReport):
            decode_failure_report(value)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert time.perf_counter() - started < 1.0
    assert peak < 4 * 1024 * 1024


def test_unknown_kinds_survive_decoding() -> None:
    a = new_event_id()
    decoded = decode_failure_report(
        _pack(_payload({a: _record(event_id=a, failure_kind="from_the_future")}, failure_id=a))
    )
    rebuilt = rebuild_failure(decoded)
    assert rebuilt is not None and rebuilt.failure_kind == "from_the_future"


_json = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**63 - 1)
    | st.floats(allow_nan=False)
    | st.text(max_size=40),
    lambda children: (
        st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=12), children, max_size=5)
    ),
    max_leaves=30,
)


_FIXED_IDS = [f"fe_{i:024x}" for i in range(6)]
_OUTSIDE_ID = "fe_" + "f" * 24


@st.composite
def _mutated_reports(draw: st.DrawFn) -> bytes:
    ids = draw(st.lists(st.sampled_from([*_FIXED_IDS, "fe_x", "", "FE_1"]), min_size=0, max_size=8))
    events: dict[str, Any] = {}
    for eid in ids:
        record = _record(event_id=eid)
        record["cause_id"] = draw(st.sampled_from([None, *ids, _OUTSIDE_ID, 5]))
        field = draw(st.sampled_from(sorted(record)))
        if draw(st.booleans()):
            record[field] = draw(_json)
        events[draw(st.sampled_from([eid, eid, "fe_" + "0" * 24]))] = record
    failure_id = draw(st.sampled_from([None, *ids, _OUTSIDE_ID]))
    return _payload(events, failure_id=failure_id)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_decode_fuzz_raises_only_invalid_failure_report(data: st.DataObject) -> None:
    kind = data.draw(st.sampled_from(["text", "bytes", "packed_json", "report", "huge"]))
    value: Any
    if kind == "text":
        value = data.draw(st.text(max_size=300))
    elif kind == "bytes":
        value = data.draw(st.binary(max_size=300))
    elif kind == "packed_json":
        value = _pack(orjson.dumps(data.draw(_json)))
    elif kind == "report":
        value = _pack(data.draw(_mutated_reports()))
    else:
        value = "v1." + data.draw(st.sampled_from(["A", "é", "_"])) * 1_000_000
    started = time.perf_counter()
    try:
        report = decode_failure_report(value)
    except InvalidFailureReport:
        pass
    else:
        assert FailureReport.from_payload(report.to_payload()) == report
        rebuild_failure(report)
    assert time.perf_counter() - started < 1.0
