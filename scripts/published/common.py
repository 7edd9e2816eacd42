"""The conformance flow shared by both published SDK versions.

Run by scripts/test-published.sh with the python of a virtual environment that has
`chainlesschain-agent-sdk` installed from PyPI (0.2.4 or 0.2.9). Nothing of that package is
copied here: it is imported, and its own validators (`validate_protocol_message`,
`validate_protocol_definition`) judge every message in both directions.

A client is anything that implements `Adapter` (flow_029.py wraps the package's own
`AppServerClient`; flow_024.py brings a minimal client of ours, since 0.2.4 has none). Every check
runs against fresh server processes and prints `ok NAME` or `FAIL NAME: reason`; the last line is
`published-<version>: N passed, N failed`.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import chainlesschain_agent_sdk as sdk
from chainlesschain_agent_sdk import generated_app_protocol as gap

SDK_VERSION: str = str(getattr(sdk, "__version__", "unknown"))

# Every check is bounded: a check that runs longer fails (its server processes are then killed).
CHECK_TIMEOUT = 30.0
# One request, one awaited notification.
REQUEST_TIMEOUT = 10.0
WAIT_TIMEOUT = 10.0
# Closing a client: EOF, then the server drains; a process still there is killed.
CLOSE_TIMEOUT = 8.0

# CC_PUBLISHED_TRACE=1 prints every message checked, both directions, on stderr.
TRACE = os.environ.get("CC_PUBLISHED_TRACE") == "1"

Json = Any
JsonMap = Mapping[str, Any]
Decide = Callable[[JsonMap], JsonMap]

# docs/wire.md: how a terminal turn's evidence is named, and each item content's published kind.
TERMINAL_EVIDENCE = {"completed": "succeeded", "failed": "failed", "interrupted": "cancelled"}
KIND_OF_CONTENT = {
    "userMessage": "user_message",
    "agentMessage": "assistant_message",
    "reasoning": "reasoning",
    "toolCall": "tool",
    "commandExecution": "tool",
    "fileChange": "tool",
    "plan": "plan",
    "error": "error",
}
NO_HANDLER_REASON = "No App Server request handler is configured"

# The tool every approval check asks for; wire.md: write_file is a workspace write, risk medium.
TOOL_CALL: Dict[str, Any] = {
    "tool": "write_file",
    "arguments": {"path": "notes/published.txt", "text": "hello from the published client"},
}
TOOL_RISK = "medium"


def tool_script(calls: int = 1) -> Dict[str, Any]:
    steps: List[Dict[str, Any]] = [
        {"type": "reasoning", "text": "Writing the note needs an approval."}
    ]
    steps += [{"type": "tool", "tool": TOOL_CALL["tool"], "arguments": TOOL_CALL["arguments"]}] * calls
    steps.append({"type": "message", "text": "Done with the note.", "chunks": 2})
    return {"steps": steps}


ECHO_SCRIPT: Dict[str, Any] = {"steps": [{"type": "echo"}]}
# Long enough to be interrupted; every check that uses it interrupts it.
SLEEP_SCRIPT: Dict[str, Any] = {
    "steps": [{"type": "sleep", "ms": 25000}, {"type": "message", "text": "woke up"}]
}


# --------------------------------------------------------------------------------------------
# Errors the flow distinguishes.


class RpcError(Exception):
    """A JSON-RPC error answer from the server."""

    def __init__(self, code: Any, message: str, data: Any = None) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.data = data


class ClientBroken(Exception):
    """The client cannot go on: the server exited, a message failed validation, a timeout."""


class CheckFailed(Exception):
    """An expectation of the flow did not hold."""


def short(value: Any, limit: int = 300) -> str:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def expect(condition: bool, reason: str) -> None:
    if not condition:
        raise CheckFailed(reason)


# --------------------------------------------------------------------------------------------
# Validation: the published validators, plus what docs/wire.md promises beside them.


def _errors(errors: Sequence[str], limit: int = 5) -> str:
    shown = "; ".join(errors[:limit])
    return shown + (f" (+{len(errors) - limit} more)" if len(errors) > limit else "")


def definition_problems(name: str, value: Any, where: str) -> List[str]:
    valid, errors = gap.validate_protocol_definition(name, value)
    return [] if valid else [f"{where} is not a published {name}: {_errors(errors)}"]


def message_problems(message: Any, sender: str = "server") -> List[str]:
    valid, errors = gap.validate_protocol_message(message)
    if valid:
        return []
    # The root oneOf only says "must match oneOf"; the branch the message's shape selects says why.
    detail = ""
    if isinstance(message, Mapping):
        if "method" in message:
            if "id" in message:
                branch = "ServerRequest" if sender == "server" else "ClientRequest"
            else:
                branch = "ServerNotification"
        else:
            branch = "ClientResponse"
        _valid, branch_errors = gap.validate_protocol_definition(branch, message)
        if branch_errors:
            detail = f" (as a {branch}: {_errors(branch_errors)})"
    return [f"validate_protocol_message: {_errors(errors)}{detail}"]


def turn_problems(turn: Any, where: str) -> List[str]:
    problems = definition_problems("Turn", turn, where)
    if not isinstance(turn, Mapping):
        return problems
    evidence = turn.get("terminalEvidence")
    if evidence is not None:
        problems += definition_problems("TerminalEvidence", evidence, f"{where}.terminalEvidence")
    status = turn.get("status")
    if status in TERMINAL_EVIDENCE:
        if not isinstance(evidence, Mapping):
            problems.append(f"wire.md: {where} is {status} but its terminalEvidence is {short(evidence)}")
        elif evidence.get("status") != TERMINAL_EVIDENCE[status]:
            problems.append(
                f"wire.md: {where} is {status} but terminalEvidence.status is "
                f"{short(evidence.get('status'))}, not {TERMINAL_EVIDENCE[status]}"
            )
    elif evidence is not None:
        problems.append(f"wire.md: {where} is {short(status)} (not terminal) but has terminalEvidence")
    return problems


def item_problems(item: Any, where: str, phase: str) -> List[str]:
    problems = definition_problems("Item", item, where)
    if not isinstance(item, Mapping):
        return problems
    status = item.get("status")
    if phase == "started" and status != "started":
        problems.append(f"wire.md: {where}.status on item/started is {short(status)}, not started")
    if phase == "completed" and status not in ("completed", "failed", "cancelled"):
        problems.append(f"wire.md: {where}.status on item/completed is {short(status)}")
    content = item.get("content")
    ctype = content.get("type") if isinstance(content, Mapping) else None
    expected = KIND_OF_CONTENT.get(ctype, "artifact") if isinstance(ctype, str) else "artifact"
    if item.get("kind") != expected:
        problems.append(
            f"wire.md: {where}.kind is {short(item.get('kind'))} for content type {short(ctype)}, "
            f"not {expected}"
        )
    policy = item.get("dataPolicy")
    if not isinstance(policy, Mapping):
        problems.append(f"wire.md: {where} has no dataPolicy")
    else:
        trust = "authenticated_user" if expected == "user_message" else "untrusted_content"
        if policy.get("trust") != trust:
            problems.append(f"wire.md: {where}.dataPolicy.trust is {short(policy.get('trust'))}, not {trust}")
    return problems


def approval_request_problems(request: Any, where: str) -> List[str]:
    problems = definition_problems("ApprovalRequest", request, where)
    if not isinstance(request, Mapping):
        return problems
    binding = request.get("binding")
    nonce = binding.get("nonce") if isinstance(binding, Mapping) else None
    if isinstance(nonce, str):
        if re.fullmatch(r"[0-9a-f]{32}", nonce) is None:
            problems.append(f"wire.md: {where}.binding.nonce {short(nonce)} is not 32 lowercase hex digits")
        if request.get("id") != f"approval-{nonce}":
            problems.append(f"wire.md: {where}.id {short(request.get('id'))} is not 'approval-' + nonce")
    return problems


def notification_problems(message: JsonMap) -> List[str]:
    method = message.get("method")
    params = message.get("params")
    where = f"{method} params"
    if not isinstance(params, Mapping):
        return [f"{where} is not an object"]
    problems: List[str] = []
    if method != "graph/event":
        seq = params.get("eventSeq")
        if not isinstance(params.get("threadId"), str):
            problems.append(f"wire.md: {where} carry no threadId")
        if not isinstance(seq, int) or isinstance(seq, bool) or seq < 1:
            problems.append(f"wire.md: {where} carry no eventSeq (got {short(seq)})")
    if method == "thread/updated":
        thread = params.get("thread")
        problems += definition_problems("Thread", thread, f"{where}.thread")
        seq = params.get("eventSeq")
        revision = thread.get("revision") if isinstance(thread, Mapping) else None
        if isinstance(seq, int) and isinstance(revision, int) and revision < seq:
            problems.append(f"wire.md: {where}.thread.revision {revision} is below the event's seq {seq}")
    elif method in ("turn/started", "turn/completed"):
        turn = params.get("turn")
        problems += turn_problems(turn, f"{where}.turn")
        seq = params.get("eventSeq")
        revision = turn.get("revision") if isinstance(turn, Mapping) else None
        # wire.md: revision counts the turn's recorded state changes; the terminal one is one.
        if method == "turn/completed" and isinstance(revision, int) and revision < 1:
            problems.append(f"wire.md: {where}.turn.revision is {revision}, but the turn's end is a recorded change")
        if method == "turn/completed" and "error" not in params:
            problems.append(f"wire.md: {where} carry no error member beside turn")
    elif method in ("item/started", "item/completed"):
        problems += item_problems(params.get("item"), f"{where}.item", method.split("/")[1])
    elif method == "approval/requested":
        # wire.md: the same binding and operation the approval/decide request then carries.
        problems += definition_problems("ApprovalBinding", params.get("binding"), f"{where}.binding")
        for member in ("turnId", "itemId", "operation"):
            if member not in params:
                problems.append(f"wire.md: {where} have no {member}")
    return problems


def result_problems(method: str, result: Any) -> List[str]:
    where = f"{method} result"
    if not isinstance(result, Mapping):
        return [] if method == "initialize" else [f"{where} is not an object: {short(result)}"]
    problems: List[str] = []
    if method in ("thread/start", "thread/read", "thread/resume", "thread/fork", "thread/archive"):
        problems += definition_problems("Thread", result.get("thread"), f"{where}.thread")
    if method in ("thread/read", "thread/resume") and "forkedFrom" not in result:
        problems.append(f"wire.md: {where} has no forkedFrom beside thread")
    if method == "thread/resume":
        active = result.get("activeTurn")
        if active is not None:
            problems += turn_problems(active, f"{where}.activeTurn")
    if method == "thread/fork":
        origin = result.get("forkedFrom")
        if not isinstance(origin, Mapping) or not {"threadId", "eventSeq", "eventHash"} <= set(origin):
            problems.append(f"wire.md: {where}.forkedFrom is {short(origin)}, not {{threadId, eventSeq, eventHash}}")
    if method == "thread/list":
        threads = result.get("threads")
        if not isinstance(threads, list):
            problems.append(f"{where}.threads is not an array")
        else:
            for index, thread in enumerate(threads):
                problems += definition_problems("Thread", thread, f"{where}.threads[{index}]")
    if method in ("turn/start", "turn/interrupt"):
        turn = result.get("turn")
        problems += turn_problems(turn, f"{where}.turn")
        revision = turn.get("revision") if isinstance(turn, Mapping) else None
        if isinstance(revision, int) and revision < 0:
            problems.append(f"wire.md: {where}.turn.revision is {revision}, below zero")
    return problems


# --------------------------------------------------------------------------------------------
# Clients.


class Adapter:
    """What the flow needs from a client. Subclasses: flow_029.Client029, flow_024.OwnClient.

    `raw` clients report every line they read and write (`Hooks.received`/`Hooks.sent`);
    the published 0.2.9 client does not, so the session validates what it can see of it:
    the envelopes it is asked to send, the results and errors it returns, and the requests and
    notifications it hands to the callbacks.
    """

    raw: bool = False
    id_example: Any = "1"

    async def start(self) -> Any:
        raise NotImplementedError

    def initialize_envelope(self) -> Optional[Dict[str, Any]]:
        """The initialize request the client sends (for clients that are not `raw`)."""
        return None

    async def request(self, method: str, params: JsonMap, expect_valid: bool = True) -> Any:
        raise NotImplementedError

    def broken(self) -> Optional[str]:
        """Why the client can no longer read (None while it can)."""
        return None

    def stderr_tail(self) -> str:
        return ""

    async def close(self) -> None:
        raise NotImplementedError


@dataclass
class Hooks:
    """The callbacks a session gives its client."""

    on_server_request: Optional[Callable[[JsonMap], JsonMap]]
    on_notification: Callable[[JsonMap], None]
    received: Callable[[JsonMap], None]
    sent: Callable[[JsonMap, bool], None]
    problem: Callable[[str], None]


AdapterFactory = Callable[[str, str, Hooks], Adapter]


@dataclass
class Totals:
    """Over the whole run: messages checked, and the problems found, by kind."""

    received: int = 0
    # validate_protocol_message / validate_protocol_definition refused what the server sent
    received_bad: List[str] = field(default_factory=list)
    # the published schema accepted it, but it breaks a promise docs/wire.md makes
    wire_bad: List[str] = field(default_factory=list)
    sent: int = 0
    sent_bad: List[str] = field(default_factory=list)


def _shape(text: str) -> str:
    """A problem without its ids and numbers, to group problems of one kind."""
    text = re.sub(r"^\[[^\]]*\] ", "", text)
    text = re.sub(r"\b(th|tu)-[0-9a-f]+(-i\d+)?\b", "ID", text)
    return re.sub(r"\d+", "N", text)


def summarize(problems: Sequence[str], shown: int = 2) -> str:
    """The first problem of each kind (at most `shown` kinds), and how many there were."""
    kinds: Dict[str, List[str]] = {}
    for problem in problems:
        kinds.setdefault(_shape(problem), []).append(problem)
    parts = [f"{group[0]}" + (f" (x{len(group)})" if len(group) > 1 else "") for group in list(kinds.values())[:shown]]
    rest = len(kinds) - shown
    return "; ".join(parts) + (f"; +{rest} more kind(s) of problem" if rest > 0 else "")


class Session:
    """One client process: everything it sent and received, and every problem found in it."""

    def __init__(self, ctx: "Context", state_dir: str, decide: Optional[Decide], label: str) -> None:
        self.ctx = ctx
        self.label = label
        self.decide = decide
        self.state_dir = state_dir
        self.notifications: List[JsonMap] = []
        self.server_requests: List[JsonMap] = []
        self.decisions: List[JsonMap] = []
        self.problems: List[str] = []
        hooks = Hooks(
            on_server_request=self._on_server_request if decide is not None else None,
            on_notification=self._on_notification,
            received=self._received_raw,
            sent=self._sent_raw,
            problem=self._problem,
        )
        self.adapter = ctx.make_adapter(ctx.bin, state_dir, hooks)
        self.last_method = "(nothing yet)"
        self.init_result: Any = None
        self.broken_noted = False
        self._request_count = 0

    # -- bookkeeping --------------------------------------------------------------------------

    def _problem(self, text: str) -> None:
        self.problems.append(f"[{self.label}] {text}")

    def _check_received(self, message: JsonMap, extra: List[str]) -> None:
        problems = message_problems(message) + extra
        if TRACE:
            print(f"  [{self.label}] <- {short(message, 2000)}", file=sys.stderr, flush=True)
        self.ctx.totals.received += 1
        what = message.get("method") or f"response to {message.get('id')!r}"
        schema = [p for p in problems if not p.startswith("wire.md:")]
        wire = [p for p in problems if p.startswith("wire.md:")]
        if schema:
            self.ctx.totals.received_bad.append(f"[{self.label}] {what}: {schema[0]}")
        self._wire(what, wire)
        for problem in schema:
            self._problem(f"received {what}: {problem}")

    def _wire(self, what: str, problems: Sequence[str]) -> None:
        """docs/wire.md promises the published schema does not check: reported together, by the
        summary check, so that each flow check says what the published client sees."""
        for problem in problems:
            self.ctx.totals.wire_bad.append(f"[{self.label}] {what}: {problem}")

    def _check_sent(self, message: JsonMap, expect_valid: bool) -> None:
        problems = message_problems(message, sender="client")
        if TRACE:
            print(f"  [{self.label}] -> {short(message, 2000)}", file=sys.stderr, flush=True)
        if not expect_valid:
            return
        self.ctx.totals.sent += 1
        if problems:
            self.ctx.totals.sent_bad.append(f"[{self.label}] {message.get('method') or 'response'}: {problems[0]}")
            for problem in problems:
                self._problem(f"sent {message.get('method') or 'response'}: {problem}")

    def _check_decision(self, decision: Any, where: str) -> None:
        for problem in definition_problems("ApprovalDecision", decision, where):
            self.ctx.totals.sent_bad.append(f"[{self.label}] {problem}")
            self._problem(f"sent {problem}")

    def _received_raw(self, message: JsonMap) -> None:
        """Every line a raw client read, before it dispatches it."""
        extra: List[str] = []
        if "method" in message and "id" in message:
            if message.get("method") == "approval/decide":
                extra = approval_request_problems(message.get("params"), "approval/decide params")
        elif "method" in message:
            extra = notification_problems(message)
        self._check_received(message, extra)

    def _sent_raw(self, message: JsonMap, expect_valid: bool) -> None:
        """Every line a raw client wrote."""
        self._check_sent(message, expect_valid)
        if "result" in message and "method" not in message:
            self._check_decision(message.get("result"), "approval/decide answer")

    def _on_server_request(self, message: JsonMap) -> JsonMap:
        self.server_requests.append(message)
        self.last_method = str(message.get("method"))
        if not self.adapter.raw:
            extra: List[str] = []
            if message.get("method") == "approval/decide":
                extra = approval_request_problems(message.get("params"), "approval/decide params")
            self._check_received(message, extra)
        assert self.decide is not None
        decision = dict(self.decide(message))
        self.decisions.append(decision)
        if not self.adapter.raw:
            self._check_sent({"jsonrpc": "2.0", "id": message.get("id"), "result": decision}, True)
            self._check_decision(decision, "approval/decide answer")
        return decision

    def _on_notification(self, message: JsonMap) -> None:
        self.notifications.append(message)
        self.last_method = str(message.get("method"))
        if not self.adapter.raw:
            self._check_received(message, notification_problems(message))

    # -- requests -----------------------------------------------------------------------------

    async def start(self) -> Any:
        if self.decide is None and not self.adapter.raw:
            # The published client answers by itself; this is the answer it writes.
            default = {"kind": "decline", "reason": NO_HANDLER_REASON}
            self._check_sent({"jsonrpc": "2.0", "id": 1, "result": default}, True)
            self._check_decision(default, "the default approval/decide answer")
        envelope = self.adapter.initialize_envelope()
        self._request_count = 1
        if envelope is not None:
            self._check_sent(envelope, True)
        try:
            result = await self.adapter.start()
        except RpcError as error:
            self._response_seen("initialize", None, error)
            raise
        except ClientBroken as error:
            self._note_broken(str(error))
            raise ClientBroken(f"{error}{self._stderr_note()}") from None
        self._response_seen("initialize", result, None)
        self.init_result = result
        return result

    def _id(self) -> Any:
        """The id a non-raw client gives its current request (it numbers them from 1)."""
        example = self.adapter.id_example
        return str(self._request_count) if isinstance(example, str) else self._request_count

    def _note_broken(self, reason: str) -> None:
        """A client that stopped over an invalid message: count that message as received and bad."""
        if self.broken_noted or not ("Invalid App Server protocol message" in reason or "stopped reading" in reason):
            return
        self.broken_noted = True
        self.ctx.totals.received += 1
        self.ctx.totals.received_bad.append(f"[{self.label}, after {self.last_method}] {reason}")

    def _stderr_note(self) -> str:
        tail = self.adapter.stderr_tail().strip()
        return f" (server stderr: {short(tail[-400:], 400)})" if tail else ""

    def _response_seen(self, method: str, result: Any, error: Optional[RpcError]) -> None:
        if not self.adapter.raw:
            if error is None:
                envelope: Dict[str, Any] = {"jsonrpc": "2.0", "id": self._id(), "result": result}
            else:
                body: Dict[str, Any] = {"code": error.code, "message": error.message}
                if error.data is not None:
                    body["data"] = error.data
                envelope = {"jsonrpc": "2.0", "id": self._id(), "error": body}
            self._check_received(envelope, [])
        if error is None:
            problems = result_problems(method, result)
            for problem in problems:
                if not problem.startswith("wire.md:"):
                    self._problem(f"received {problem}")
                    self.ctx.totals.received_bad.append(f"[{self.label}] {problem}")
            self._wire(f"{method} result", [p for p in problems if p.startswith("wire.md:")])

    async def request(self, method: str, params: JsonMap, expect_valid: bool = True) -> Any:
        if not self.adapter.raw:
            self._request_count += 1
            envelope = {"jsonrpc": "2.0", "id": self._id(), "method": method, "params": dict(params)}
            self._check_sent(envelope, expect_valid)
        try:
            result = await asyncio.wait_for(
                self.adapter.request(method, params, expect_valid), REQUEST_TIMEOUT + 2
            )
        except RpcError as error:
            self._response_seen(method, None, error)
            raise
        except asyncio.TimeoutError:
            raise ClientBroken(f"{method}: no answer within {REQUEST_TIMEOUT + 2:.0f} s{self._stderr_note()}") from None
        except ClientBroken as error:
            self._note_broken(str(error))
            raise ClientBroken(f"{method}: {error}{self._stderr_note()}") from None
        self._response_seen(method, result, None)
        return result

    async def expect_error(self, method: str, params: JsonMap, code: int, expect_valid: bool = True) -> RpcError:
        try:
            result = await self.request(method, params, expect_valid)
        except RpcError as error:
            expect(error.code == code, f"{method} answered error {error.code} ({short(error.message, 120)}), not {code}")
            return error
        raise CheckFailed(f"{method} succeeded ({short(result, 160)}); expected error {code}")

    # -- waiting ------------------------------------------------------------------------------

    async def wait_for(self, what: str, probe: Callable[[], Any], timeout: float = WAIT_TIMEOUT) -> Any:
        deadline = time.monotonic() + timeout
        while True:
            value = probe()
            if value:
                return value
            broken = self.adapter.broken()
            if broken:
                self._note_broken(broken)
                raise ClientBroken(
                    f"while waiting for {what}: {broken} (last message the client passed on: "
                    f"{self.last_method}){self._stderr_note()}"
                )
            if time.monotonic() > deadline:
                raise CheckFailed(f"no {what} within {timeout:.0f} s (last message: {self.last_method})")
            await asyncio.sleep(0.03)

    def notes(self, method: str, **match: Any) -> List[JsonMap]:
        found = []
        for message in self.notifications:
            if message.get("method") != method:
                continue
            params = message.get("params")
            if not isinstance(params, Mapping):
                continue
            if all(_lookup(params, key) == value for key, value in match.items()):
                found.append(params)
        return found

    async def turn_completed(self, turn_id: str, timeout: float = WAIT_TIMEOUT) -> JsonMap:
        found = await self.wait_for(
            f"turn/completed for {turn_id}",
            lambda: self.notes("turn/completed", turn__id=turn_id),
            timeout,
        )
        first: JsonMap = found[0]
        return first

    async def approval(self, count: int = 1) -> JsonMap:
        found = await self.wait_for(
            "an approval/decide request",
            lambda: [r for r in self.server_requests if r.get("method") == "approval/decide"][count - 1:],
        )
        request: JsonMap = found[0]
        return request

    # -- shortcuts ----------------------------------------------------------------------------

    async def start_thread(self, script: Optional[JsonMap] = None, **extra: Any) -> JsonMap:
        params: Dict[str, Any] = {"title": f"published {SDK_VERSION} {self.label}", "metadata": {"harness": "published"}}
        if script is not None:
            params["agentOptions"] = {"script": script}
        params.update(extra)
        result = await self.request("thread/start", params)
        thread = _field(result, "thread", "thread/start result")
        expect(isinstance(thread.get("id"), str), f"thread/start result.thread has no id: {short(thread)}")
        return thread

    async def start_turn(self, thread_id: str, text: str = "please write the note") -> JsonMap:
        result = await self.request("turn/start", {"threadId": thread_id, "input": [{"type": "text", "text": text}]})
        turn = _field(result, "turn", "turn/start result")
        expect(isinstance(turn.get("id"), str), f"turn/start result.turn has no id: {short(turn)}")
        return turn

    async def close(self) -> None:
        try:
            await asyncio.wait_for(self.adapter.close(), CLOSE_TIMEOUT + 2)
        except Exception as error:  # closing must never hide the check's own verdict
            self._problem(f"close: {type(error).__name__}: {error}")


def _lookup(params: JsonMap, key: str) -> Any:
    value: Any = params
    for part in key.split("__"):
        if not isinstance(value, Mapping):
            return None
        value = value.get(part)
    return value


def _field(result: Any, name: str, where: str) -> JsonMap:
    value = result.get(name) if isinstance(result, Mapping) else None
    expect(isinstance(value, Mapping), f"{where} has no object {name}: {short(result)}")
    assert isinstance(value, Mapping)
    return value


# --------------------------------------------------------------------------------------------
# The run.


class Context:
    def __init__(self, bin_path: str, make_adapter: AdapterFactory, run_dir: str) -> None:
        self.bin = bin_path
        self.make_adapter = make_adapter
        self.run_dir = run_dir
        self.totals = Totals()
        self.sessions: List[Session] = []
        self.passed = 0
        self.failed = 0
        self._dirs = 0

    def state_dir(self, name: str) -> str:
        self._dirs += 1
        path = os.path.join(self.run_dir, f"{self._dirs:02d}-{re.sub(r'[^A-Za-z0-9]+', '-', name)}")
        os.makedirs(path, mode=0o700, exist_ok=True)
        os.chmod(path, 0o700)
        return path

    async def session(self, label: str, decide: Optional[Decide] = None, state_dir: Optional[str] = None) -> Session:
        session = Session(self, state_dir or self.state_dir(label), decide, label)
        self.sessions.append(session)
        await session.start()
        return session

    def report(self, name: str, problem: Optional[str]) -> None:
        label = f"{SDK_VERSION} {name}"
        if problem is None:
            self.passed += 1
            print(f"ok {label}", flush=True)
        else:
            self.failed += 1
            print(f"FAIL {label}: {problem}", flush=True)

    async def run(self, name: str, body: Callable[["Context"], Awaitable[None]]) -> None:
        self.sessions = []
        problem: Optional[str] = None
        try:
            await asyncio.wait_for(body(self), CHECK_TIMEOUT)
        except CheckFailed as error:
            problem = str(error)
        except ClientBroken as error:
            problem = f"client broken: {error}"
        except RpcError as error:
            problem = f"unexpected error answer {error.code}: {short(error.message, 200)}"
        except asyncio.TimeoutError:
            problem = f"timed out after {CHECK_TIMEOUT:.0f} s"
        except Exception as error:
            problem = f"{type(error).__name__}: {error} [{_where(error)}]"
        for session in self.sessions:
            await session.close()
        seen = [p for s in self.sessions for p in s.problems]
        if seen:
            validation = summarize(seen)
            problem = validation if problem is None else f"{problem}; also {validation}"
        self.report(name, problem)


def _where(error: BaseException) -> str:
    frames = traceback.extract_tb(error.__traceback__)
    return f"{os.path.basename(frames[-1].filename)}:{frames[-1].lineno}" if frames else "?"


def accept(decision: JsonMap) -> Decide:
    return lambda _request: decision


# --------------------------------------------------------------------------------------------
# The checks.


async def check_initialize(ctx: Context) -> None:
    session = await ctx.session("initialize", accept({"kind": "acceptOnce"}))
    result = session.init_result
    expect(isinstance(result, Mapping), f"initialize result is not an object: {short(result)}")
    expect(result.get("protocolVersion") == 1, f"initialize result.protocolVersion is {short(result.get('protocolVersion'))}, not 1")
    features = result.get("features")
    expect(isinstance(features, list), f"initialize result.features is {short(features)}")
    asked = set(gap.CC_AGENT_PROTOCOL_FEATURES)
    extra = [f for f in features if f not in asked]
    expect(not extra, f"negotiated features the client did not ask for: {extra}")
    for needed in ("thread_turn_item", "structured_approval"):
        expect(needed in features, f"feature {needed} not negotiated (got {features})")


async def check_thread_start(ctx: Context) -> None:
    session = await ctx.session("thread-start", accept({"kind": "acceptOnce"}))
    thread = await session.start_thread(ECHO_SCRIPT)
    expect(thread.get("status") == "idle", f"a new thread is {short(thread.get('status'))}, not idle")
    expect(thread.get("parentThreadId") is None, f"a new thread has parentThreadId {short(thread.get('parentThreadId'))}")


async def check_turn_start(ctx: Context) -> None:
    session = await ctx.session("turn-start", accept({"kind": "acceptOnce"}))
    thread = await session.start_thread(ECHO_SCRIPT)
    turn = await session.start_turn(thread["id"], "hello")
    expect(turn.get("status") in ("queued", "running"), f"turn/start answered a {short(turn.get('status'))} turn")
    expect(turn.get("threadId") == thread["id"], f"turn.threadId {short(turn.get('threadId'))} is not the thread")
    done = await session.turn_completed(turn["id"])
    final = done.get("turn", {})
    expect(final.get("status") == "completed", f"the echo turn ended {short(final.get('status'))}")
    evidence = final.get("terminalEvidence") or {}
    expect(evidence.get("outputDigest") is not None, "wire.md: a turn with an assistant message has outputDigest null")
    expect(bool(session.notes("item/completed")), "no item/completed for the echo turn")
    # wire.md: eventDigest is 'sha256:' + the chain hash of the turn's terminal rollout event.
    seq = done.get("eventSeq")
    read = await session.request("thread/read", {"threadId": thread["id"]})
    events = read.get("events") if isinstance(read, Mapping) else None
    expect(isinstance(events, list), f"thread/read has no events array: {short(read)}")
    assert isinstance(events, list)
    terminal = [e for e in events if isinstance(e, Mapping) and e.get("seq") == seq]
    expect(bool(terminal), f"thread/read has no event with the turn/completed seq {seq}")
    expect(evidence.get("eventDigest") == f"sha256:{terminal[0].get('hash')}",
           f"wire.md: eventDigest {short(evidence.get('eventDigest'))} is not 'sha256:' + the hash of event {seq}")


async def _approval_turn(ctx: Context, label: str, decision: Optional[JsonMap], calls: int = 1) -> Tuple[Session, JsonMap, JsonMap]:
    session = await ctx.session(label, accept(decision) if decision is not None else None)
    thread = await session.start_thread(tool_script(calls))
    turn = await session.start_turn(thread["id"])
    return session, thread, turn


def _tool_results(session: Session, turn_id: str) -> List[JsonMap]:
    return [p.get("result") or {} for p in session.notes("tool/result", turnId=turn_id)]


def _denial_reasons(session: Session, turn_id: str) -> List[str]:
    reasons = [str(r.get("reason")) for r in _tool_results(session, turn_id) if r.get("status") == "denied"]
    for params in session.notes("approval/resolved", turnId=turn_id):
        decision = params.get("decision")
        if isinstance(decision, Mapping) and isinstance(decision.get("reason"), str):
            reasons.append(decision["reason"])
    return reasons


async def check_approval_request(ctx: Context) -> None:
    session, thread, turn = await _approval_turn(ctx, "approval-request", {"kind": "acceptOnce"})
    request = await session.approval()
    params = request.get("params")
    expect(isinstance(params, Mapping), f"approval/decide params are {short(params)}")
    assert isinstance(params, Mapping)
    binding = params.get("binding") or {}
    expect(binding.get("threadId") == thread["id"], f"binding.threadId {short(binding.get('threadId'))} is not the thread")
    expect(binding.get("turnId") == turn["id"], f"binding.turnId {short(binding.get('turnId'))} is not the turn")
    operation = params.get("operation")
    expect(operation == TOOL_CALL, f"operation is {short(operation)}, not the scripted call")
    expect(params.get("risk") == TOOL_RISK, f"wire.md: risk of write_file is {short(params.get('risk'))}, not {TOOL_RISK}")
    await session.turn_completed(turn["id"])


async def check_accept_once(ctx: Context) -> None:
    session, _thread, turn = await _approval_turn(ctx, "accept-once", {"kind": "acceptOnce"})
    await session.approval()
    done = await session.turn_completed(turn["id"])
    results = _tool_results(session, turn["id"])
    expect(any(r.get("status") == "ok" for r in results), f"no ok tool/result after acceptOnce (got {short(results)})")
    status = done.get("turn", {}).get("status")
    expect(status == "completed", f"the turn ended {short(status)} (error {short(done.get('error'))})")


async def check_decline(ctx: Context) -> None:
    session, _thread, turn = await _approval_turn(ctx, "decline", {"kind": "decline", "reason": "no"})
    await session.approval()
    done = await session.turn_completed(turn["id"])
    results = _tool_results(session, turn["id"])
    expect(not any(r.get("status") == "ok" for r in results), "the tool ran although the decision was decline")
    expect(any(r.get("status") == "denied" for r in results), f"no denied tool/result (got {short(results)})")
    reasons = _denial_reasons(session, turn["id"])
    expect(any(r == "no" or re.search(r"(^|[\s:\"'(])no($|[\s.\"')])", r) for r in reasons),
           f"the reason 'no' is nowhere in tool/result or approval/resolved (reasons: {short(reasons)})")
    status = done.get("turn", {}).get("status")
    expect(status == "completed", f"after a decline the turn ended {short(status)}, not completed")


async def check_cancel(ctx: Context) -> None:
    session, _thread, turn = await _approval_turn(ctx, "cancel", {"kind": "cancel"})
    await session.approval()
    done = await session.turn_completed(turn["id"])
    results = _tool_results(session, turn["id"])
    expect(not any(r.get("status") == "ok" for r in results), "the tool ran although the decision was cancel")
    status = done.get("turn", {}).get("status")
    expect(status == "interrupted", f"after cancel the turn ended {short(status)}, not interrupted")


async def check_no_handler(ctx: Context) -> None:
    session, _thread, turn = await _approval_turn(ctx, "no-handler", None)
    done = await session.turn_completed(turn["id"])
    results = _tool_results(session, turn["id"])
    expect(not any(r.get("status") == "ok" for r in results), "the tool ran without a handler")
    expect(any(r.get("status") == "denied" for r in results), f"no denied tool/result (got {short(results)})")
    reasons = _denial_reasons(session, turn["id"])
    expect(any(NO_HANDLER_REASON in r for r in reasons),
           f"the client's default reason is nowhere in tool/result or approval/resolved (reasons: {short(reasons)})")
    status = done.get("turn", {}).get("status")
    expect(status == "completed", f"after the default decline the turn ended {short(status)}, not completed")


async def check_accept_for_turn(ctx: Context) -> None:
    session, _thread, turn = await _approval_turn(ctx, "accept-for-turn", {"kind": "acceptForTurn", "permissions": []}, calls=2)
    await session.approval()
    done = await session.turn_completed(turn["id"])
    status = done.get("turn", {}).get("status")
    expect(status == "completed", f"the turn ended {short(status)} (error {short(done.get('error'))})")
    ok = [r for r in _tool_results(session, turn["id"]) if r.get("status") == "ok"]
    expect(len(ok) == 2, f"{len(ok)} of 2 identical calls ran after acceptForTurn")
    asked = [r for r in session.server_requests if r.get("method") == "approval/decide"]
    expect(len(asked) == 1, f"acceptForTurn: the identical second call asked again ({len(asked)} approval/decide requests)")


async def check_accept_for_session(ctx: Context) -> None:
    session, thread, turn = await _approval_turn(ctx, "accept-for-session", {"kind": "acceptForSession", "permissions": []})
    await session.approval()
    first = await session.turn_completed(turn["id"])
    expect(first.get("turn", {}).get("status") == "completed", f"the first turn ended {short(first.get('turn', {}).get('status'))}")
    second = await session.start_turn(thread["id"], "write it again")
    done = await session.turn_completed(second["id"])
    expect(done.get("turn", {}).get("status") == "completed", f"the second turn ended {short(done.get('turn', {}).get('status'))}")
    for t in (turn, second):
        expect(any(r.get("status") == "ok" for r in _tool_results(session, t["id"])), f"the tool did not run in turn {t['id']}")
    asked = [r for r in session.server_requests if r.get("method") == "approval/decide"]
    expect(len(asked) == 1, f"acceptForSession: the second turn asked again ({len(asked)} approval/decide requests)")


async def _running_sleep_turn(session: Session) -> Tuple[JsonMap, JsonMap]:
    thread = await session.start_thread(SLEEP_SCRIPT)
    turn = await session.start_turn(thread["id"], "sleep")
    await session.wait_for("turn/started", lambda: session.notes("turn/started", turn__id=turn["id"]))
    return thread, turn


async def check_turn_interrupt(ctx: Context) -> None:
    session = await ctx.session("turn-interrupt", accept({"kind": "acceptOnce"}))
    thread, turn = await _running_sleep_turn(session)
    result = await session.request("turn/interrupt", {"threadId": thread["id"], "turnId": turn["id"]})
    answered = _field(result, "turn", "turn/interrupt result")
    expect(answered.get("id") == turn["id"], f"turn/interrupt answered turn {short(answered.get('id'))}")
    expect(answered.get("status") == "interrupted", f"turn/interrupt answered a {short(answered.get('status'))} turn")
    done = await session.turn_completed(turn["id"])
    expect(done.get("turn", {}).get("status") == "interrupted", f"turn/completed says {short(done.get('turn', {}).get('status'))}")


async def check_thread_resume(ctx: Context) -> None:
    state = ctx.state_dir("resume")
    first = await ctx.session("resume-writer", accept({"kind": "acceptOnce"}), state)
    thread = await first.start_thread(ECHO_SCRIPT)
    turn = await first.start_turn(thread["id"], "remember me")
    done = await first.turn_completed(turn["id"])
    last_seq = max((p["eventSeq"] for p in first.notes("turn/completed") if isinstance(p.get("eventSeq"), int)), default=0)
    await first.close()
    second = await ctx.session("resume-reader", accept({"kind": "acceptOnce"}), state)
    result = await second.request("thread/resume", {"threadId": thread["id"]})
    resumed = _field(result, "thread", "thread/resume result")
    expect(resumed.get("id") == thread["id"], f"thread/resume answered thread {short(resumed.get('id'))}")
    expect(resumed.get("status") == "idle", f"the resumed thread is {short(resumed.get('status'))}, not idle")
    revision = resumed.get("revision")
    expect(isinstance(revision, int) and isinstance(last_seq, int) and revision >= last_seq,
           f"wire.md: resumed revision {short(revision)} is below the last event seq {last_seq} seen before")
    expect(result.get("activeTurn") is None, f"activeTurn is {short(result.get('activeTurn'))} after a completed turn")
    expect(done.get("turn", {}).get("status") == "completed", "the first process's turn did not complete")
    again = await second.start_turn(thread["id"], "and again")
    final = await second.turn_completed(again["id"])
    expect(final.get("turn", {}).get("status") == "completed", "a turn on the resumed thread did not complete")


async def check_thread_fork(ctx: Context) -> None:
    session = await ctx.session("thread-fork", accept({"kind": "acceptOnce"}))
    thread = await session.start_thread(ECHO_SCRIPT)
    turn = await session.start_turn(thread["id"], "fork me")
    await session.turn_completed(turn["id"])
    result = await session.request("thread/fork", {"threadId": thread["id"]})
    fork = _field(result, "thread", "thread/fork result")
    expect(fork.get("id") != thread["id"], "the fork has the source's id")
    expect(fork.get("parentThreadId") == thread["id"], f"fork.parentThreadId is {short(fork.get('parentThreadId'))}, not the source")
    origin = result.get("forkedFrom")
    expect(isinstance(origin, Mapping) and origin.get("threadId") == thread["id"], f"wire.md: forkedFrom is {short(origin)}")


async def check_thread_list(ctx: Context) -> None:
    session = await ctx.session("thread-list", accept({"kind": "acceptOnce"}))
    ids = {(await session.start_thread(ECHO_SCRIPT))["id"] for _ in range(2)}
    result = await session.request("thread/list", {})
    threads = result.get("threads") if isinstance(result, Mapping) else None
    expect(isinstance(threads, list), f"thread/list result has no threads array: {short(result)}")
    assert isinstance(threads, list)
    listed = {t.get("id") for t in threads if isinstance(t, Mapping)}
    expect(ids <= listed, f"thread/list misses {sorted(ids - listed)}")


async def check_thread_archive(ctx: Context) -> None:
    session = await ctx.session("thread-archive", accept({"kind": "acceptOnce"}))
    thread = await session.start_thread(ECHO_SCRIPT)
    result = await session.request("thread/archive", {"threadId": thread["id"]})
    archived = _field(result, "thread", "thread/archive result")
    expect(archived.get("status") == "archived", f"thread/archive answered a {short(archived.get('status'))} thread")
    try:
        answer = await session.request("turn/start", {"threadId": thread["id"], "input": [{"type": "text", "text": "hi"}]})
    except RpcError as error:
        expect(isinstance(error.code, int), f"the refusal has code {short(error.code)}")
        return
    raise CheckFailed(f"turn/start on an archived thread succeeded: {short(answer)}")


async def check_error_unknown_thread(ctx: Context) -> None:
    session = await ctx.session("error-unknown-thread", accept({"kind": "acceptOnce"}))
    await session.expect_error("turn/start", {"threadId": "no-such-thread", "input": [{"type": "text", "text": "hi"}]}, -32004)
    await session.expect_error("thread/resume", {"threadId": "no-such-thread"}, -32004)


async def check_error_unknown_method(ctx: Context) -> None:
    session = await ctx.session("error-unknown-method", accept({"kind": "acceptOnce"}))
    # Deliberately outside the published method list, so the published validator refuses it too.
    await session.expect_error("thread/frobnicate", {}, -32601, expect_valid=False)


async def check_error_bad_params(ctx: Context) -> None:
    session = await ctx.session("error-bad-params", accept({"kind": "acceptOnce"}))
    thread = await session.start_thread(ECHO_SCRIPT)
    # Published-valid (params is any object) but not a turn/start.
    await session.expect_error("turn/start", {"threadId": thread["id"], "input": "not an array"}, -32602)


async def check_error_file_unsafe_id(ctx: Context) -> None:
    session = await ctx.session("error-file-unsafe-id", accept({"kind": "acceptOnce"}))
    # A published Identifier (':' and '/' are allowed there), refused by wire.md's file-name rule.
    error = await session.expect_error("thread/start", {"threadId": "team/alpha:1"}, -32602)
    expect(bool(error.message), "wire.md: the -32602 for a file-unsafe id says nothing about why")


async def check_error_second_turn(ctx: Context) -> None:
    session = await ctx.session("error-second-turn", accept({"kind": "acceptOnce"}))
    thread, turn = await _running_sleep_turn(session)
    await session.expect_error("turn/start", {"threadId": thread["id"], "input": [{"type": "text", "text": "again"}]}, -32009)
    await session.request("turn/interrupt", {"threadId": thread["id"], "turnId": turn["id"]})


# --- the agent subcommand, through the package's AgentSession ------------------------------------


# Events the package's parse_event decodes into a typed class (a malformed one comes back Unknown).
PARSED_EVENT_TYPES = {"system", "stream_event", "tool_use", "tool_result", "approval_request", "approval_resolved", "result"}


async def check_agent_session(ctx: Context) -> None:
    from chainlesschain_agent_sdk import AgentSession, AgentSessionOptions, UnknownAgentEvent
    from chainlesschain_agent_sdk.generated_app_protocol import (
        validate_approval_decision,
        validate_canonical_agent_stream_event,
    )

    probe = await asyncio.create_subprocess_exec(
        ctx.bin, "agent", "--help",
        stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )
    try:
        out, err = await asyncio.wait_for(probe.communicate(), 5)
    except asyncio.TimeoutError:
        probe.kill()
        await probe.wait()
        raise CheckFailed("`agent --help` did not finish within 5 s")
    if probe.returncode != 0:
        raise CheckFailed(f"no `agent` subcommand (`agent --help` exited {probe.returncode}: "
                          f"{short(err.decode(errors='replace').strip(), 200)})")
    help_text = out.decode(errors="replace")
    if "--script" not in help_text:
        raise CheckFailed("`agent --help` lists no --script option, so no scripted turn can be given")
    script_path = os.path.join(ctx.run_dir, "agent-script.json")
    with open(script_path, "w", encoding="utf-8") as handle:
        json.dump(tool_script(), handle)
    extra = ["--script", script_path]
    if "--state-dir" in help_text:
        extra += ["--state-dir", ctx.state_dir("agent")]

    problems: List[str] = []
    events: List[Any] = []
    decisions: List[JsonMap] = []

    def on_event(event: Any) -> None:
        raw = event.to_dict() if hasattr(event, "to_dict") else dict(getattr(event, "raw", {}))
        events.append(raw)
        if isinstance(event, UnknownAgentEvent) and raw.get("type") in PARSED_EVENT_TYPES:
            problems.append(f"the package could not parse a {raw.get('type')} event: {short(raw, 200)}")
        valid, errors = validate_canonical_agent_stream_event(raw)
        if not valid:
            problems.append(f"event {short(raw.get('type'), 40)}: {_errors(errors, 3)}")

    def on_approval(_event: Any) -> JsonMap:
        decision = {"kind": "acceptOnce"}
        valid, errors = validate_approval_decision(decision)
        if not valid:
            problems.append(f"sent decision: {_errors(errors, 3)}")
        decisions.append(decision)
        return decision

    options = AgentSessionOptions(cli_path=ctx.bin, cwd=ctx.run_dir, extra_args=tuple(extra))
    session = AgentSession(options, on_event=on_event, on_approval=on_approval)
    await session.start()
    try:
        await session.send("please write the note")
        try:
            result = await asyncio.wait_for(session.next_result(), 20)
        except asyncio.TimeoutError:
            raise CheckFailed(f"no result event within 20 s (events: {short([e.get('type') for e in events], 200)})")
        except Exception as error:  # SessionExitedError and friends
            raise CheckFailed(f"{type(error).__name__}: {short(str(error), 300)}")
        types = [e.get("type") for e in events]
        expect("approval_request" in types, f"no approval_request event (events: {short(types, 200)})")
        expect(bool(decisions), "the approval callback was never called")
        tool_results = [e for e in events if e.get("type") == "tool_result" and e.get("tool") == TOOL_CALL["tool"]]
        expect(any(e.get("is_error") is False for e in tool_results),
               f"no successful {TOOL_CALL['tool']} tool_result (got {short(tool_results, 200)})")
        expect(not getattr(result, "is_error", True), f"the result is an error: {short(getattr(result, 'raw', result), 200)}")
        expect(not problems, "; ".join(problems[:3]))
    finally:
        try:
            await asyncio.wait_for(session.close(timeout=5), 8)
        except Exception:
            await session.kill()


CHECKS: List[Tuple[str, Callable[[Context], Awaitable[None]]]] = [
    ("initialize", check_initialize),
    ("thread/start", check_thread_start),
    ("turn/start", check_turn_start),
    ("approval/decide request", check_approval_request),
    ("acceptOnce runs the tool", check_accept_once),
    ("decline denies the tool", check_decline),
    ("cancel interrupts the turn", check_cancel),
    ("no handler: default decline", check_no_handler),
    ("acceptForTurn", check_accept_for_turn),
    ("acceptForSession", check_accept_for_session),
    ("turn/interrupt", check_turn_interrupt),
    ("thread/resume from a second process", check_thread_resume),
    ("thread/fork", check_thread_fork),
    ("thread/list", check_thread_list),
    ("thread/archive", check_thread_archive),
    ("error: unknown thread -32004", check_error_unknown_thread),
    ("error: unknown method -32601", check_error_unknown_method),
    ("error: bad params -32602", check_error_bad_params),
    ("error: file-unsafe thread id -32602", check_error_file_unsafe_id),
    ("error: second turn -32009", check_error_second_turn),
    ("AgentSession: scripted turn with an approval", check_agent_session),
]


async def run_all(bin_path: str, make_adapter: AdapterFactory) -> int:
    with tempfile.TemporaryDirectory(prefix=f"cc-published-{SDK_VERSION}-") as run_dir:
        os.chmod(run_dir, 0o700)
        ctx = Context(bin_path, make_adapter, run_dir)
        only = os.environ.get("CC_PUBLISHED_ONLY")
        for name, body in CHECKS:
            if only and only not in name:
                continue
            await ctx.run(name, body)
        totals = ctx.totals
        for name, count, bad in (
            ("every received message validates (published schema)", totals.received, totals.received_bad),
            ("every received message keeps docs/wire.md's promises", totals.received, totals.wire_bad),
            ("every sent message validates (published schema)", totals.sent, totals.sent_bad),
        ):
            ctx.report(f"{name}, {count} checked", None if not bad else f"{len(bad)} bad: {summarize(bad, 6)}")
        print(f"published-{SDK_VERSION}: {ctx.passed} passed, {ctx.failed} failed", flush=True)
        return 0 if ctx.failed == 0 else 1


def main(make_adapter: AdapterFactory, expected_version: str) -> None:
    if SDK_VERSION != expected_version:
        print(f"FAIL {expected_version} setup: installed chainlesschain-agent-sdk is {SDK_VERSION}")
        print(f"published-{expected_version}: 0 passed, 1 failed")
        sys.exit(1)
    if len(sys.argv) != 2:
        print(f"usage: {sys.argv[0]} BIN", file=sys.stderr)
        sys.exit(2)
    sys.exit(asyncio.run(run_all(sys.argv[1], make_adapter)))
