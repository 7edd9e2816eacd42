"""Open an in-process server, start a thread, stream a turn, answer its approval."""
import asyncio, sys, tempfile
import cc_app_server as cc
from cc_app_server.protocol import ApprovalRequest, ItemDeltaNotification, TextDelta, TurnCompletedNotification
SCRIPT = {"steps": [{"type": "tool", "tool": "fs.write", "arguments": {"path": "hello.txt", "text": "hi"}},
                    {"type": "message", "text": "The write was approved (the scripted executor only echoes it).", "chunks": 3}]}  # the built-in scripted kernel

def approve(request: ApprovalRequest) -> cc.Decision:
    print(f"approve {request.operation.tool} {request.operation.arguments} (risk {request.risk})? yes")
    return "acceptOnce"

async def main(state_dir: str) -> None:
    async with cc.AppServer.open(state_dir, script=SCRIPT) as server, server.client(approvals=approve) as client:
        thread = (await client.thread_start(title="quickstart")).thread
        await client.turn_start(thread.id, "write hello.txt")
        async for note in client.notifications(timeout=30):
            match note:
                case ItemDeltaNotification(params=params) if isinstance(params.delta, TextDelta):
                    print(params.delta.text, end="", flush=True)
                case TurnCompletedNotification(params=params):
                    print(f"\nturn {params.turn.status}")
                    break

asyncio.run(main(sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp()))
