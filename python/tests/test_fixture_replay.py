"""Fixture replay for the generated Python binding.

Every file under schema/fixtures/ gets the verdict of its folder from jsonschema's
Draft202012Validator over the canonical schema (message files against the whole schema, definition
files against {"$ref": "#/$defs/<Name>"}), and every valid one decodes with the generated types and
encodes back to the same JSON. Then unit tests of the edge semantics.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from jsonschema import Draft202012Validator, ValidationError, validators

import cc_agent_protocol as p

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "schema" / "fixtures"
SCHEMA: dict[str, Any] = json.loads((ROOT / "schema" / "cc-agent-protocol.schema.json").read_text("utf-8"))


def _ecma_pattern(validator: Any, pattern: str, instance: Any, schema: Any) -> Iterator[ValidationError]:
    """`pattern` as JSON Schema defines it (ECMA-262): `$` is the end of the input.

    Python's `re` lets `$` match before a trailing newline, so stock jsonschema accepts
    "abc\\n" for `^[a-z]+$`; the wire does not (`envelope-thread-id-trailing-newline.json`).
    """
    if validator.is_type(instance, "string") and not re.search(_anchor_end(pattern), instance):
        yield ValidationError(f"{instance!r} does not match {pattern!r}")


def _anchor_end(pattern: str) -> str:
    out: list[str] = []
    escaped = in_class = False
    for c in pattern:
        if escaped:
            escaped = False
        elif c == "\\":
            escaped = True
        elif c == "[":
            in_class = True
        elif c == "]":
            in_class = False
        elif c == "$" and not in_class:
            out.append(r"\Z")
            continue
        out.append(c)
    return "".join(out)


def _nesting(value: Any) -> int:
    """Levels of arrays and objects, the value itself being the first (a scalar is 0)."""
    if isinstance(value, dict):
        return 1 + max((_nesting(v) for v in value.values()), default=0)
    if isinstance(value, list):
        return 1 + max((_nesting(v) for v in value), default=0)
    return 0


def _max_depth(validator: Any, limit: int, instance: Any, schema: Any) -> Iterator[ValidationError]:
    """Our `x-max-depth` keyword (on ClientRequest): arrays and objects nest at most `limit`
    levels, the instance itself counting as the first."""
    if _nesting(instance) > limit:
        yield ValidationError(f"nested more than {limit} levels deep")


Validator = validators.extend(  # type: ignore[no-untyped-call]
    Draft202012Validator, {"pattern": _ecma_pattern, "x-max-depth": _max_depth}
)
Draft202012Validator.check_schema(SCHEMA)
MESSAGE_VALIDATOR = Validator(SCHEMA)


def definition_validator(name: str) -> Any:
    return Validator({"$schema": SCHEMA["$schema"], "$id": SCHEMA["$id"], "$defs": SCHEMA["$defs"], "$ref": "#/$defs/" + name})


class ParseRefused(ValueError):
    pass


def _reject_constant(name: str) -> Any:
    raise ParseRefused("not JSON: " + name)


def parse_wire(text: str) -> Any:
    """json.loads plus the wire parser's rules: no NaN/Infinity, at most 127 nested containers,
    no lone UTF-16 surrogate."""
    try:
        value = json.loads(text, parse_constant=_reject_constant)
    except json.JSONDecodeError as e:
        raise ParseRefused(str(e)) from e

    def check(v: Any, depth: int) -> None:
        if isinstance(v, str):
            if any(0xD800 <= ord(c) <= 0xDFFF for c in v):
                raise ParseRefused("lone surrogate")
            return
        if isinstance(v, (list, dict)):
            if depth + 1 > 127:
                raise ParseRefused("nesting deeper than 127 levels")
            for k in v if isinstance(v, dict) else ():
                check(k, depth)
            for x in v.values() if isinstance(v, dict) else v:
                check(x, depth + 1)

    check(value, 0)
    return value


def json_equal(a: Any, b: Any) -> bool:
    """JSON equality: 3 == 3.0, but true != 1 and member order does not matter."""
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return a == b
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(json_equal(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(json_equal(a[k], b[k]) for k in a)
    return type(a) is type(b) and a == b


def fixture_files() -> list[Any]:
    out: list[Any] = []
    for sub, valid, definition in (
        ("valid", True, False),
        ("valid/definitions", True, True),
        ("invalid", False, False),
        ("invalid/definitions", False, True),
    ):
        for f in sorted((FIXTURES / sub).glob("*.json")):
            out.append(pytest.param(f, valid, definition, id=f"{sub}/{f.name}"))
    return out


@pytest.mark.parametrize(("file", "expect_valid", "definition"), fixture_files())
def test_fixture(file: Path, expect_valid: bool, definition: bool) -> None:
    try:
        raw = parse_wire(file.read_text("utf-8"))
    except (ParseRefused, UnicodeDecodeError) as e:
        assert not expect_valid and file.name.startswith("parse-"), f"does not parse: {e}"
        return
    assert not file.name.startswith("parse-"), "a parse- fixture parsed"
    validator: Any = MESSAGE_VALIDATOR
    instance = raw
    name = ""
    if definition:
        if not (isinstance(raw, dict) and sorted(raw) == ["definition", "value"] and isinstance(raw["definition"], str)):
            assert not expect_valid, "not a {definition, value} wrapper"
            return
        name = raw["definition"]
        instance = raw["value"]
        if name not in SCHEMA["$defs"]:
            assert not expect_valid, f"unknown definition {name}"
            return
        validator = definition_validator(name)
    errors = [e.message for e in validator.iter_errors(instance)]
    if not expect_valid:
        assert errors, "jsonschema accepted an invalid fixture"
        return
    assert not errors, f"jsonschema refused a valid fixture: {errors[:3]}"
    back = p.roundtrip_definition(name, instance) if definition else p.encode_message(p.decode_message(instance))
    assert json_equal(back, instance), f"round trip changed the JSON:\n{json.dumps(back)}\n!=\n{json.dumps(instance)}"


# ---- Edge semantics ---------------------------------------------------------------------------


def test_absent_null_and_present() -> None:
    # An absent optional member reads as None (no marker), and None is not sent.
    missing = p.decode_ThreadListParams({})
    assert missing.cursor is None
    assert p.encode_ThreadListParams(missing) == {}
    # An explicit null of an optional-nullable member also reads as None, and a decoded one is
    # written back as null (a round trip keeps the JSON).
    null = p.decode_ThreadListParams({"cursor": None})
    assert null.cursor is None and null == missing
    assert p.encode_ThreadListParams(null) == {"cursor": None}
    present = p.decode_ThreadListParams({"cursor": "c1"})
    assert present.cursor == "c1"
    assert p.encode_ThreadListParams(present) == {"cursor": "c1"}
    # Built by hand: leaving a member out, or passing None, does not send it.
    assert p.encode_FileChange(p.FileChange(path="a", kind="add")) == {"path": "a", "kind": "add"}
    assert p.encode_FileChange(p.FileChange(path="a", kind="add", diff=None)) == {"path": "a", "kind": "add"}
    # An unknown notification keeps its method.
    unknown = p.decode_ServerNotification({"jsonrpc": "2.0", "method": "x/new", "params": {}})
    assert isinstance(unknown, p.UnknownCase) and unknown.method == "x/new"


def test_required_nullable_refuses_missing() -> None:
    turn: p.Json = {
        "id": "t1",
        "threadId": "th1",
        "status": "running",
        "createdAt": "2026-01-01T00:00:00.000Z",
        "completedAt": None,
        "revision": 3,
        "terminalEvidence": None,
    }
    assert json_equal(p.roundtrip_definition("Turn", turn), turn)
    assert isinstance(turn, dict)
    without = {k: v for k, v in turn.items() if k != "completedAt"}
    with pytest.raises(p.DecodeError):
        p.decode_Turn(without)
    # The published Turn is closed: the error travels beside it, never inside.
    with pytest.raises(p.DecodeError):
        p.decode_Turn({**turn, "error": None})


def test_unknown_item_content_type_is_kept_raw() -> None:
    raw: p.Json = {"type": "hologram", "id": "i1", "frames": [1, 2, 3]}
    content = p.decode_ItemContent(raw)
    assert isinstance(content, p.UnknownCase)
    assert content.raw == raw
    assert p.encode_ItemContent(content) == raw
    known = p.decode_ItemContent({"type": "agentMessage", "id": "i2", "text": "hi"})
    assert isinstance(known, p.AgentMessageItem) and known.text == "hi" and known.type_ == "agentMessage"


def test_item_is_the_published_envelope_around_its_content() -> None:
    raw: p.Json = {
        "id": "i2",
        "threadId": "th1",
        "turnId": "t1",
        "parentId": None,
        "kind": "assistant_message",
        "status": "completed",
        "content": {"type": "agentMessage", "id": "i2", "text": "hi"},
        "dataPolicy": {"origin": "kernel", "trust": "untrusted_content", "sensitivity": "internal",
                       "allowedSinks": ["host", "rollout"]},
        "createdAt": "2026-01-01T00:00:00.000Z",
        "completedAt": "2026-01-01T00:00:01.000Z",
    }
    item = p.decode_Item(raw)
    assert item.kind == "assistant_message" and item.status == "completed"
    assert isinstance(item.content, p.AgentMessageItem) and item.content.text == "hi"
    assert p.encode_Item(item) == raw
    # An unknown content type inside the envelope is kept too.
    assert isinstance(raw, dict)
    odd = p.decode_Item({**raw, "kind": "artifact", "content": {"type": "hologram", "id": "i2"}})
    assert isinstance(odd.content, p.UnknownCase)
    # The envelope itself is closed, and its kind is strict.
    with pytest.raises(p.DecodeError):
        p.decode_Item({**raw, "text": "hi"})
    with pytest.raises(p.DecodeError):
        p.decode_Item({**raw, "kind": "hologram"})


def test_unknown_display_enum_value_is_kept() -> None:
    change = p.decode_FileChange({"path": "a.txt", "kind": "rename"})
    assert change.kind == p.UnknownValue(raw="rename")
    assert p.encode_FileChange(change) == {"path": "a.txt", "kind": "rename"}


def test_unknown_approval_decision_is_refused() -> None:
    with pytest.raises(p.DecodeError):
        p.decode_ApprovalDecision({"kind": "acceptAlways"})
    with pytest.raises(p.DecodeError):
        p.decode_ApprovalDecision({})
    # The old answer shape (nonce echoed, decision tagged `decision`) is refused.
    with pytest.raises(p.DecodeError):
        p.decode_ApprovalDecision({"nonce": "0" * 32, "decision": {"decision": "acceptOnce"}})
    with pytest.raises(p.DecodeError):
        p.decode_ApprovalDecision({"decision": "acceptOnce"})
    decline = p.decode_ApprovalDecision({"kind": "decline", "reason": "no"})
    assert isinstance(decline, p.Decline) and decline.reason == "no"
    assert p.encode_ApprovalDecision(p.AcceptOnce()) == {"kind": "acceptOnce"}


def test_strict_struct_refuses_unknown_member() -> None:
    with pytest.raises(p.DecodeError):
        p.decode_ApprovalDecision({"kind": "acceptOnce", "class": "x"})


def test_keyword_names_survive() -> None:
    wire: p.Json = {
        "metadata": {k: i for i, k in enumerate(["class", "in", "is", "self", "type", "default", "object", "from", "lambda"])}
    }
    params = p.decode_ThreadStartParams(wire)
    assert p.encode_ThreadStartParams(params) == wire
    # `type` is a field: the identifier is `type_`, the wire name stays `type`.
    text = p.TextInput(text="hello")
    assert text.type_ == "text"
    assert p.encode_UserInput(text) == {"type": "text", "text": "hello"}
    assert p.decode_UserInput({"type": "text", "text": "hello"}) == text


def test_unknown_members_of_open_structs_survive() -> None:
    raw: p.Json = {"name": "cli", "version": "1", "class": "beta", "nested": {"in": [1]}}
    info = p.decode_ClientInfo(raw)
    assert info.extra == {"class": "beta", "nested": {"in": [1]}}
    assert p.encode_ClientInfo(info) == raw


def test_envelope_dispatch() -> None:
    assert isinstance(p.decode_message({"jsonrpc": "2.0", "id": 1, "method": "thread/list"}), p.ThreadListRequest)
    decide = parse_wire((FIXTURES / "valid" / "approval-decide-request-minimal.json").read_text("utf-8"))
    assert isinstance(p.decode_message(decide), p.ApprovalDecideRequest)
    assert isinstance(p.decode_message({"jsonrpc": "2.0", "method": "future/thing", "params": {}}), p.UnknownCase)
    assert isinstance(p.decode_message({"jsonrpc": "2.0", "id": 1, "result": {}}), p.ClientResponse)
    with pytest.raises(p.DecodeError):
        p.decode_message({"jsonrpc": "2.0", "id": 1, "method": "future/thing"})


def test_graph_notifications_are_one_method_tagged_by_type() -> None:
    run = parse_wire((FIXTURES / "valid" / "graph-node-updated-notification.json").read_text("utf-8"))
    note = p.decode_message(run)
    assert isinstance(note, p.GraphEventNotification) and isinstance(note.params, p.GraphNodeUpdatedParams)
    assert p.encode_message(note) == run
    # A future type of graph event is kept raw, like any display union.
    assert isinstance(run, dict)
    later = p.decode_message({**run, "params": {"type": "futureThing", "runId": "r1"}})
    assert isinstance(later, p.GraphEventNotification) and isinstance(later.params, p.UnknownCase)
    # The old method names are no longer known ones.
    old = p.decode_message({"jsonrpc": "2.0", "method": "graph/run/updated", "params": {}})
    assert isinstance(old, p.UnknownCase)


def test_thread_is_the_closed_published_thread() -> None:
    thread: p.Json = {"id": "th1", "status": "archived", "title": None, "parentThreadId": None,
                      "createdAt": "2026-01-01T00:00:00.000Z", "updatedAt": "2026-01-01T00:00:00.000Z",
                      "revision": 7, "metadata": {}}
    decoded = p.decode_Thread(thread)
    assert decoded.status == "archived" and decoded.revision == 7
    assert p.encode_Thread(decoded) == thread
    assert isinstance(thread, dict)
    for extra in ({"archived": True}, {"lastEventSeq": 7}, {"forkedFrom": None}):
        with pytest.raises(p.DecodeError):
            p.decode_Thread({**thread, **extra})


def test_integral_float_id_is_an_integer() -> None:
    request = p.decode_message({"jsonrpc": "2.0", "id": 3.0, "method": "thread/list"})
    assert isinstance(request, p.ThreadListRequest) and request.id == 3 and isinstance(request.id, int)


def test_string_ids_decode_and_encode_as_written() -> None:
    request = p.decode_message({"jsonrpc": "2.0", "id": "req-1", "method": "thread/list"})
    assert isinstance(request, p.ThreadListRequest) and request.id == "req-1"
    assert p.encode_message(request) == {"jsonrpc": "2.0", "id": "req-1", "method": "thread/list"}
    with pytest.raises(p.DecodeError):
        p.decode_message({"jsonrpc": "2.0", "id": 1.5, "method": "thread/list"})


def test_generated_module_carries_the_digest() -> None:
    assert re.fullmatch(r"sha256:[0-9a-f]{64}", p.SCHEMA_DIGEST)
    assert p.SCHEMA_ID == SCHEMA["$id"]
    assert list(p.DEFINITION_NAMES) == list(SCHEMA["$defs"])


def test_decoded_values_are_the_dataclasses_a_constructor_builds() -> None:
    # The decoders build frozen dataclasses without their __init__ (the hot path); the result must
    # be indistinguishable from one built by the constructor: equal, same repr, frozen,
    # fixed members present, `replace` working.
    import dataclasses

    raw: p.JsonObject = {"jsonrpc": "2.0", "method": "item/delta", "params": {"threadId": "t1", "eventSeq": 7,
           "turnId": "u1", "itemId": "i1", "delta": {"type": "text", "text": "x"}, "later": 1}}
    decoded = p.decode_ServerNotification(raw)
    built = p.ItemDeltaNotification(params=p.ItemDeltaParams(
        thread_id="t1", event_seq=7, turn_id="u1", item_id="i1",
        delta=p.TextDelta(text="x"), extra={"later": 1}))
    assert decoded == built and repr(decoded) == repr(built)
    assert isinstance(decoded, p.ItemDeltaNotification)
    assert decoded.method == "item/delta" and decoded.jsonrpc == "2.0"
    assert isinstance(decoded.params.delta, p.TextDelta) and decoded.params.delta.type_ == "text"
    assert vars(decoded.params.delta)["type_"] == "text"
    with pytest.raises(dataclasses.FrozenInstanceError):
        decoded.params.thread_id = "other"  # type: ignore[misc]
    assert dataclasses.replace(decoded.params, event_seq=8).event_seq == 8
    assert p.encode_ServerNotification(decoded) == raw
    # Tags compared inline still refuse a non-string and a wrong value with the same messages.
    for bad in (1, "image", None):
        with pytest.raises(p.DecodeError, match="expected 'text'"):
            p.decode_TextDelta({"type": bad, "text": "x"})
