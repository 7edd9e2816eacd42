"""Python-implemented agent kernels and tool executors.

The engine calls them on its own threads. Whatever they raise becomes a failed turn (kernel) or a
failed tool result (tool), carrying the exception's message — never a crash of the engine, never a
silent stop — and is also logged on logger `cc_app_server` with its traceback.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Union

from . import protocol as p
from ._errors import TurnCancelled
from ._logging import log
from ._native import ffi
from .protocol import Json, JsonObject

# The engine's bound for a failure message shown to the user (ShortText).
_MAX_REASON = 1024


def _reason(e: BaseException) -> str:
    text = str(e) or type(e).__name__
    return text[:_MAX_REASON]


@dataclass(frozen=True)
class TurnInput:
    """What the user sent for this turn: every text input joined with newlines, and the inputs."""

    text: str
    inputs: list[p.UserInput]


def _dump(value: Json) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


class TurnContext:
    """The engine's context for one running turn; usable only while `Kernel.run_turn` runs (after
    that every call raises `TurnCancelled`). Emit items, stream deltas, ask for tools (through
    the approval gate) and check for cancellation here."""

    def __init__(self, native: Any) -> None:
        self._native = native
        self.thread_id: str = native.thread_id()
        self.turn_id: str = native.turn_id()

    def _call(self, f: Callable[..., Any], *args: Any) -> Any:
        try:
            return f(*args)
        except ffi.KernelError.Cancelled:
            raise TurnCancelled("the turn was cancelled") from None
        except ffi.KernelError.Expired:
            raise TurnCancelled("this TurnContext belongs to a turn whose run_turn has returned") from None
        except ffi.KernelError.Invalid as e:
            raise ValueError(e.reason) from None
        except ffi.KernelError.Failed as e:
            raise RuntimeError(e.reason) from None

    @property
    def agent_options(self) -> Json:
        """The thread's `agentOptions` from thread/start (`None` when none were given)."""
        value: Json = json.loads(self._call(self._native.agent_options_json))
        return value

    def new_item_id(self) -> str:
        """A fresh item id, unique within the thread."""
        item_id: str = self._call(self._native.new_item_id)
        return item_id

    def item_started(self, item: p.ItemContent) -> None:
        """Records and announces `item/started`. `item` is the item's body (`AgentMessageItem`,
        `ToolCallItem`, ...): the engine wraps it in the published `Item` envelope (kind, status,
        data policy, times) that clients receive as `item/started` params `item`, with the body as
        its `content`. Raises `ValueError` for a body the schema refuses."""
        self._call(self._native.item_started, _dump(p.encode_ItemContent(item)))

    def item_delta(self, item_id: str, delta: p.ItemDelta) -> None:
        """Records and announces `item/delta`."""
        self._call(self._native.item_delta, item_id, _dump(p.encode_ItemDelta(delta)))

    def item_completed(self, item: p.ItemContent) -> None:
        """Records and announces `item/completed`: the item's final body (see `item_started`)."""
        self._call(self._native.item_completed, _dump(p.encode_ItemContent(item)))

    def say(self, text: str, *, chunks: list[str] | None = None) -> str:
        """Streams an agent message: `item/started`, one `item/delta` per chunk (default: the whole
        text at once), `item/completed`. Returns the item id."""
        item_id = self.new_item_id()
        self.item_started(p.AgentMessageItem(id=item_id, text=""))
        for chunk in chunks if chunks is not None else [text]:
            self.item_delta(item_id, p.TextDelta(text=chunk))
        self.item_completed(p.AgentMessageItem(id=item_id, text=text))
        return item_id

    def request_tool(self, item_id: str, tool: str, arguments: Json) -> p.ToolResult:
        """Asks for a tool through the approval gate and blocks until it ran (or was refused):
        `ToolResultOk`, `ToolResultError` or `ToolResultDenied` when the gate failed closed. Raises
        `TurnCancelled` when the user cancelled at the approval or the turn was interrupted."""
        raw = self._call(self._native.request_tool, item_id, tool, _dump(arguments))
        return p.decode_ToolResult(json.loads(raw))

    @property
    def cancelled(self) -> bool:
        """True once the turn has been asked to stop; check it often."""
        value: bool = self._native.is_cancelled()
        return value

    def sleep(self, seconds: float) -> bool:
        """Sleeps up to `seconds`, waking early on cancellation; True when cancelled."""
        value: bool = self._native.sleep_cancellable(max(0, int(seconds * 1000)))
        return value


class Kernel(ABC):
    """Runs turns. Subclass and implement `run_turn`; it is called on an engine thread, possibly
    concurrently for different threads. Return when the turn is done; raise to fail it."""

    @abstractmethod
    def run_turn(self, ctx: TurnContext, input: TurnInput) -> None: ...


class ToolExecutor(ABC):
    """Runs approved tool calls (only ever after the approval gate). Return the output as JSON;
    raise to make it a failed tool result carrying the message (the turn goes on)."""

    @abstractmethod
    def execute(self, thread_id: str, tool: str, arguments: Json) -> Json: ...


KernelLike = Union[Kernel, Callable[[TurnContext, TurnInput], None]]
ToolsLike = Union[ToolExecutor, Mapping[str, Callable[[JsonObject], Json]]]


class _ToolTable(ToolExecutor):
    """`tools={"name": fn}`: each function gets the arguments object."""

    def __init__(self, table: Mapping[str, Callable[[JsonObject], Json]]) -> None:
        self._table = dict(table)

    def execute(self, thread_id: str, tool: str, arguments: Json) -> Json:
        fn = self._table.get(tool)
        if fn is None:
            raise LookupError(f"unknown tool {tool!r}; this host has {sorted(self._table)}")
        return fn(arguments if isinstance(arguments, dict) else {})


class NativeKernel(ffi.AgentKernel):  # type: ignore[misc]
    def __init__(self, kernel: KernelLike) -> None:
        self._run = kernel.run_turn if isinstance(kernel, Kernel) else kernel

    def run_turn(self, ctx: Any, input: Any) -> None:
        inputs = [p.decode_UserInput(raw, f"$[{n}]") for n, raw in enumerate(json.loads(input.json))]
        context = TurnContext(ctx)
        try:
            self._run(context, TurnInput(text=input.text, inputs=inputs))
        except TurnCancelled:
            raise ffi.KernelError.Cancelled() from None
        except Exception as e:
            log.error("kernel failed turn %s of thread %s: %s", context.turn_id, context.thread_id, e,
                      exc_info=True)
            raise ffi.KernelError.Failed(reason=f"{type(e).__name__}: {_reason(e)}"[:_MAX_REASON]) from None


class NativeTools(ffi.ToolExecutor):  # type: ignore[misc]
    def __init__(self, tools: ToolsLike) -> None:
        self._tools = tools if isinstance(tools, ToolExecutor) else _ToolTable(tools)

    def execute(self, thread_id: str, tool: str, arguments_json: str) -> str:
        try:
            return _dump(self._tools.execute(thread_id, tool, json.loads(arguments_json)))
        except Exception as e:
            log.warning("tool %s failed in thread %s: %s", tool, thread_id, e, exc_info=True)
            raise ffi.HandlerError.Failed(reason=_reason(e)) from None
