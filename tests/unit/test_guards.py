"""seekrl.servers.guards without a server: JSON depth / surrogate checks, bearer auth, body
limits, counters, cancel-on-disconnect, and the old module paths that re-export it all."""

from __future__ import annotations

import asyncio
import json
import time

import pytest

from seekrl.api.guards import (
    ClientGone,
    Guard,
    HTTPError,
    bearer_token,
    cancel_on_disconnect,
    check_json,
    check_token,
    one_line,
    parse_json,
    token_matches,
    validation_message,
)


class FakeRequest:
    """What Guard reads of a Starlette request: headers, the body stream, is_disconnected."""

    def __init__(self, body: bytes | list[bytes] = b"", headers: dict | None = None, gone_after_s: float | None = None):
        self.headers = {k.lower(): v for k, v in (headers or {}).items()}
        self.chunks = [body] if isinstance(body, bytes) else body
        self.gone_at = None if gone_after_s is None else time.monotonic() + gone_after_s
        self.method, self.url = "POST", type("U", (), {"path": "/x"})()

    async def stream(self):
        for c in self.chunks:
            yield c

    async def is_disconnected(self) -> bool:
        return self.gone_at is not None and time.monotonic() >= self.gone_at


def _status(fn, *args) -> HTTPError:
    with pytest.raises(HTTPError) as e:
        fn(*args)
    return e.value


# ---- JSON ---------------------------------------------------------------------------------------
def test_100k_nested_lists_are_a_fast_400_not_a_recursion_error():
    for body in (b"[" * 100_000 + b"]" * 100_000, b'{"a": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"):
        t0 = time.monotonic()
        err = _status(parse_json, body, 32)
        assert err.status == 400 and err.message == "JSON nested deeper than 32 levels"
        assert time.monotonic() - t0 < 1.0


def test_depth_is_checked_after_parsing_without_recursion():
    assert parse_json(b"[" * 32 + b"]" * 32, 32) == json.loads(b"[" * 32 + b"]" * 32)
    assert _status(parse_json, b"[" * 33 + b"]" * 33, 32).status == 400
    assert _status(parse_json, json.dumps({"a": {"b": [[1]]}}).encode(), 3).message == "JSON nested deeper than 3 levels"
    # a Python structure far deeper than the recursion limit: the iterative walk copes
    deep: list = []
    node = deep
    for _ in range(50_000):
        node.append([])
        node = node[0]
    assert _status(check_json, deep, 32).status == 400
    check_json({"a": ["x", 1, None, {"b": 2.5}]}, 3)  # within the limit: no error


def test_lone_surrogates_are_named():
    err = _status(parse_json, b'{"queries": ["fine", "bad \\ud800"]}', 32)
    assert err.status == 400 and "lone surrogate \\ud800" in err.message and err.param == "queries.1"
    assert "\\udc00" in _status(parse_json, b'{"\\udc00": 1}', 32).message  # in a key too
    assert "lone surrogate" in _status(parse_json, b'"\\udfff"', 32).message  # the top-level value
    assert parse_json(b'{"emoji": "\\ud83d\\ude00"}', 32) == {"emoji": "\U0001f600"}  # a proper pair is fine


def test_not_json_not_utf8_and_nan_are_400s():
    assert "not valid JSON" in _status(parse_json, b"{not json", 32).message
    assert "not valid UTF-8" in _status(parse_json, b'{"a": "\xff"}', 32).message
    assert "NaN is not a JSON number" in _status(parse_json, b'{"t": NaN}', 32).message
    assert "Infinity" in _status(parse_json, b"[-Infinity]", 32).message


def test_one_line_and_messages():
    assert one_line("a\n  b\r\n\tc") == "a b c"
    assert one_line("x" * 500, limit=10) == "x" * 7 + "..."
    assert "\n" not in HTTPError(400, "first\nsecond").message

    from pydantic import BaseModel, ValidationError

    class M(BaseModel):
        queries: list[str]

    with pytest.raises(ValidationError) as e:
        M.model_validate({"queries": ["a", 7]})
    assert validation_message(e.value) == "invalid request: queries.1: Input should be a valid string"


# ---- auth ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("header", ["Bearer T0k", "bearer T0k", "BEARER T0k", "bEaReR   T0k  "])
def test_bearer_scheme_is_case_insensitive(header):
    assert bearer_token(header) == "T0k"
    check_token({"authorization": header}, "T0k")
    Guard(token="T0k").check_auth(FakeRequest(headers={"Authorization": header}))


@pytest.mark.parametrize(
    "headers, message",
    [
        ({}, "missing bearer token"),
        ({"Authorization": "Bearer wrong"}, "invalid bearer token"),
        ({"Authorization": "Bearer T0k0"}, "invalid bearer token"),
        ({"Authorization": "Basic T0k"}, "must be 'Bearer <token>'"),
        ({"Authorization": "Bearer"}, "must be 'Bearer <token>'"),
    ],
)
def test_wrong_or_missing_token_is_a_401(headers, message):
    err = _status(Guard(token="T0k").check_auth, FakeRequest(headers=headers))
    assert err.status == 401 and message in err.message
    Guard(token=None).check_auth(FakeRequest(headers=headers))  # no token set: all pass


def test_token_matches():
    assert token_matches(" abc ", "abc") and not token_matches("abd", "abc") and not token_matches("", "abc")


# ---- the body -----------------------------------------------------------------------------------
def test_json_body_auth_first_then_size_then_json():
    guard = Guard(token="t", max_body_bytes=10)
    ok = {"Authorization": "Bearer t"}
    with pytest.raises(HTTPError) as e:  # no token: 401 before the (huge) body is read
        asyncio.run(guard.json_body(FakeRequest(b"x" * 100)))
    assert e.value.status == 401
    with pytest.raises(HTTPError) as e:  # declared length over the limit
        asyncio.run(guard.json_body(FakeRequest(b"[]", headers={**ok, "Content-Length": "11"})))
    assert e.value.status == 413 and "11 bytes" in e.value.message
    with pytest.raises(HTTPError) as e:  # no declared length: counted as it streams
        asyncio.run(guard.json_body(FakeRequest([b"[1,", b"2,3,4,", b"5,6]"], headers=ok)))
    assert e.value.status == 413
    assert asyncio.run(guard.json_body(FakeRequest([b"[1,", b"2]"], headers=ok))) == [1, 2]


def test_validated_body_and_counters():
    from pydantic import BaseModel

    class Q(BaseModel):
        queries: list[str]

    guard = Guard()
    assert asyncio.run(guard.validated_body(FakeRequest(b'{"queries": ["a"]}'), Q)).queries == ["a"]
    with pytest.raises(HTTPError) as e:
        asyncio.run(guard.validated_body(FakeRequest(b"[1]"), Q, status=422, shape=" {...}"))
    assert e.value.status == 422 and e.value.message == "invalid request: body must be a JSON object {...}"
    for status in (200, 400, 401, 413, 500, 503):
        guard.count(status)
    assert guard.stats == {"requests": 6, "rejected": 3, "errors": 2, "cancelled": 0}
    assert guard.limits() == {"auth": False, "max_body_bytes": 1_000_000, "max_depth": 32}
    with pytest.raises(ValueError):
        Guard(max_depth=0)


def test_answer_maps_errors_and_counts():
    guard = Guard()
    sent = []

    def render(err):
        sent.append((err.status, err.message))
        return err.status

    async def refuse(request):
        raise HTTPError(413, "too big")

    async def crash(request):
        raise RuntimeError("secret detail\nTraceback ...")

    async def leave(request):
        raise ClientGone()

    async def fine(request):
        return "ok"

    for handler in (refuse, crash, leave, fine):
        asyncio.run(guard.answer(FakeRequest(), handler, render))
    assert sent == [(413, "too big"), (500, "internal server error: RuntimeError"), (499, "client closed the request")]
    assert guard.stats == {"requests": 4, "rejected": 1, "errors": 1, "cancelled": 1}


# ---- disconnects --------------------------------------------------------------------------------
def test_cancel_on_disconnect_cancels_the_work():
    cancelled = []

    async def slow():
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.append(True)
            raise

    async def main():
        t0 = time.monotonic()
        with pytest.raises(ClientGone):
            await cancel_on_disconnect(FakeRequest(gone_after_s=0.1), slow(), poll_s=0.01)
        return time.monotonic() - t0

    assert asyncio.run(main()) < 2 and cancelled == [True]


def test_cancel_on_disconnect_returns_the_result_and_its_errors():
    async def value():
        await asyncio.sleep(0.02)
        return 42

    async def boom():
        raise ValueError("bad prompt")

    assert asyncio.run(cancel_on_disconnect(FakeRequest(), value(), poll_s=0.005)) == 42
    with pytest.raises(ValueError, match="bad prompt"):
        asyncio.run(cancel_on_disconnect(FakeRequest(), boom()))
