"""Params of the typed client methods, built with the generated classes so wire names and shapes
come from the schema, never from a second hand-written copy. Shared by the async and the blocking
client; `None` means "not sent"."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

from . import protocol as p
from .protocol import JsonObject

T = TypeVar("T")


def opt(value: T | None) -> T | None:
    """An optional param: None is not sent (the generated encoders skip None members)."""
    return value


def thread_start(title: str | None, thread_id: str | None, metadata: JsonObject | None,
                 agent_options: p.AgentOptions | None, idempotency_key: str | None,
                 traceparent: str | None = None) -> p.Json:
    return p.encode_ThreadStartParams(p.ThreadStartParams(
        thread_id=opt(thread_id), title=opt(title), metadata=opt(metadata), agent_options=opt(agent_options),
        idempotency_key=opt(idempotency_key), traceparent=opt(traceparent)))


def thread_read(thread_id: str, after_event_seq: int | None, limit: int | None) -> p.Json:
    return p.encode_ThreadReadParams(p.ThreadReadParams(
        thread_id=thread_id, after_event_seq=opt(after_event_seq), limit=opt(limit)))


def thread_resume(thread_id: str, after_event_seq: int | None, limit: int | None) -> p.Json:
    return p.encode_ThreadResumeParams(p.ThreadResumeParams(
        thread_id=thread_id, after_event_seq=opt(after_event_seq), limit=opt(limit)))


def thread_fork(thread_id: str, new_thread_id: str | None, at_event_seq: int | None, title: str | None,
                idempotency_key: str | None) -> p.Json:
    return p.encode_ThreadForkParams(p.ThreadForkParams(
        thread_id=thread_id, new_thread_id=opt(new_thread_id), at_event_seq=opt(at_event_seq), title=opt(title),
        idempotency_key=opt(idempotency_key)))


def thread_list(include_archived: bool | None, cursor: str | None, limit: int | None) -> p.Json:
    return p.encode_ThreadListParams(p.ThreadListParams(
        include_archived=opt(include_archived), cursor=opt(cursor), limit=opt(limit)))


def thread_archive(thread_id: str) -> p.Json:
    return p.encode_ThreadArchiveParams(p.ThreadArchiveParams(thread_id=thread_id))


def thread_compact(thread_id: str, summary: str | None) -> p.Json:
    return p.encode_ThreadCompactParams(p.ThreadCompactParams(thread_id=thread_id, summary=opt(summary)))


def turn_start(thread_id: str, input: str | Sequence[p.UserInput], idempotency_key: str | None,
               traceparent: str | None = None) -> p.Json:
    inputs: list[p.UserInput] = [p.TextInput(text=input)] if isinstance(input, str) else list(input)
    return p.encode_TurnStartParams(p.TurnStartParams(
        thread_id=thread_id, input=inputs, idempotency_key=opt(idempotency_key), traceparent=opt(traceparent)))


def turn_interrupt(thread_id: str, turn_id: str) -> p.Json:
    return p.encode_TurnInterruptParams(p.TurnInterruptParams(thread_id=thread_id, turn_id=turn_id))


def definition(value: p.GraphDefinition | JsonObject) -> p.GraphDefinition:
    """A graph definition given as the generated class or as its JSON (decoded, so a malformed one
    fails here with the path of what is wrong)."""
    return value if isinstance(value, p.GraphDefinition) else p.decode_GraphDefinition(value)


def graph_validate(value: p.GraphDefinition | JsonObject, grant: p.GraphRunGrant | None) -> p.Json:
    return p.encode_GraphValidateParams(p.GraphValidateParams(definition=definition(value), grant=opt(grant)))


def graph_run_start(value: p.GraphDefinition | JsonObject, run_id: str | None, inputs: JsonObject | None,
                    grant: p.GraphRunGrant | None, options: p.GraphRunOptions | None,
                    idempotency_key: str | None) -> p.Json:
    return p.encode_GraphRunStartParams(p.GraphRunStartParams(
        definition=definition(value), run_id=opt(run_id), inputs=opt(inputs), grant=opt(grant),
        options=opt(options), idempotency_key=opt(idempotency_key)))


def graph_run_read(run_id: str, include_content: bool | None, after_event_seq: int | None,
                   limit: int | None) -> p.Json:
    return p.encode_GraphRunReadParams(p.GraphRunReadParams(
        run_id=run_id, include_content=opt(include_content), after_event_seq=opt(after_event_seq),
        limit=opt(limit)))


def graph_run_cancel(run_id: str, reason: str | None) -> p.Json:
    return p.encode_GraphRunCancelParams(p.GraphRunCancelParams(run_id=run_id, reason=opt(reason)))
