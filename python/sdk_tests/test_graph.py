"""Graph runs from Python against the installed wheel: a definition is compiled (and refused with
a rule code and a JSON pointer when it is wrong), then run durably — a tool node that passes the
approval handler, an agent node on the engine's kernel — and read back; a cancel fences it."""

from __future__ import annotations

import asyncio
from typing import Any

import cc_app_server as cc
from cc_app_server import protocol as p


def definition(tool: str = "echo") -> dict[str, Any]:
    return {
        "graphVersion": 1, "id": "py-graph",
        "outputs": [{"name": "said", "type": "text"}],
        "nodes": [
            {"kind": "tool", "id": "fetch", "tool": tool, "arguments": {"what": "news"},
             "outputs": [{"name": "result", "type": "json"}]},
            {"kind": "agent", "id": "tell", "inputs": [{"name": "facts", "type": "json"}],
             "outputs": [{"name": "text", "type": "text"}]},
        ],
        "edges": [
            {"from": {"node": "fetch", "port": "result"}, "to": {"node": "tell", "port": "facts"}},
            {"from": {"node": "tell", "port": "text"}, "to": {"port": "said"}},
        ],
    }


GRANT = p.GraphRunGrant(capabilities=["agent", "tool:echo"])
ENDED = ("succeeded", "failed", "cancelled")


def run_update(note: p.ServerNotification) -> p.GraphRunUpdatedParams | None:
    """The run's state when `note` is a `graph/event` of type runUpdated."""
    if isinstance(note, p.GraphEventNotification) and isinstance(note.params, p.GraphRunUpdatedParams):
        return note.params
    return None


def test_validate_run_and_read_a_graph(server: cc.AppServer) -> None:
    seen: list[str] = []

    def approve(request: p.ApprovalRequest) -> cc.Decision:
        seen.append(request.operation.tool)
        return "acceptOnce"

    async def main() -> None:
        async with server.client(approvals=approve) as client:
            ungranted = await client.graph_validate(definition())
            assert not ungranted.valid and ungranted.errors[0].code == "capabilityNotGranted", ungranted
            ok = await client.graph_validate(definition(), grant=GRANT)
            assert ok.valid and ok.node_count == 2 and ok.errors == [] and ok.plan_digest
            bad = definition()
            bad["edges"][0]["to"]["node"] = "nowhere"
            refused = await client.graph_validate(bad, grant=GRANT)
            assert not refused.valid and refused.errors
            assert refused.errors[0].pointer.startswith("/edges/0"), refused.errors[0]

            started = await client.graph_run_start(definition(), run_id="py-run", grant=GRANT)
            assert started.run.run_id == "py-run"
            nodes: set[str] = set()
            async for note in client.notifications(timeout=30):
                if isinstance(note, p.GraphEventNotification) and isinstance(note.params, p.GraphNodeUpdatedParams):
                    assert note.params.type_ == "nodeUpdated" and note.params.run_id == "py-run"
                    nodes.add(note.params.node.node_id)
                update = run_update(note)
                if update is not None and update.run.status in ENDED:
                    assert update.type_ == "runUpdated" and update.run.status == "succeeded", note
                    break
            assert nodes == {"fetch", "tell"}, nodes
            read = await client.graph_run_read("py-run", include_content=True)
            assert {n.node_id: n.status for n in read.nodes} == {"fetch": "succeeded", "tell": "succeeded"}
            outputs = read.run.outputs
            assert isinstance(outputs, dict) and "said" in outputs, outputs
            hidden = await client.graph_run_read("py-run")
            assert hidden.run.outputs is None

    asyncio.run(main())
    assert seen == ["echo"], "the tool node asked the approval handler once"
    assert server.stats().tools_executed == 1


def test_a_declined_tool_node_fails_the_run_and_runs_nothing(server: cc.AppServer) -> None:
    with server.blocking_client(approvals=lambda request: "decline") as client:
        client.graph_run_start(definition(), run_id="declined", grant=GRANT)
        for note in client.notifications(timeout=30):
            update = run_update(note)
            if update is not None and update.run.status in ENDED:
                assert update.run.status == "failed", note
                break
        cancelled = client.graph_run_cancel("declined", reason="done with it")
        assert cancelled.run.run_id == "declined" and cancelled.fenced == [] and cancelled.run.status == "failed"
    assert server.stats().tools_executed == 0
