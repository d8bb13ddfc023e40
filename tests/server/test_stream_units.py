"""Stream plumbing without a server: errors after the 200, and slow readers."""

import asyncio
import json

from rawpage.outputs import CompletionOutput, RequestOutput
from rawpage.server.async_engine import RequestFailedError, _Stream
from rawpage.server.streaming import guard_stream, sse


def output(step: int, finished: bool = False) -> RequestOutput:
    """Step `step` of a request that generates token `step` (text 't<step>') each step."""
    toks = list(range(step + 1))
    o = CompletionOutput(
        0,
        "".join(f"t{i}" for i in toks),
        toks,
        None,
        None,
        "length" if finished else None,
        delta_text=f"t{step}",
        delta_token_ids=[step],
    )
    return RequestOutput("r", "p", [1], None, [o], finished)


def test_a_stream_that_fails_midway_ends_with_an_error_event_and_done():
    async def events():
        yield sse({"choices": [{"text": "partial"}]})
        raise RequestFailedError("the engine failed this request: IndexError: boom")

    async def collect():
        return [e async for e in guard_stream(events())]

    got = asyncio.run(collect())
    assert got[0].startswith("data: {") and got[-1] == "data: [DONE]\n\n"
    err = json.loads(got[1][6:])["error"]
    assert err["type"] == "internal_server_error" and "IndexError: boom" in err["message"]
    assert set(err) == {"message", "type", "param", "code"}


def test_unread_outputs_merge_into_one_with_joined_deltas():
    async def main():
        s = _Stream(asyncio.get_running_loop(), max_unread=100)
        for step in range(50):  # the engine runs ahead of a reader that reads nothing
            assert s.put(output(step, finished=step == 49))
        assert not isinstance(s._pending, list)  # one pending output, not fifty
        got = await s.get()
        o = got.outputs[0]
        assert got.finished and o.token_ids == list(range(50))
        assert o.delta_token_ids == list(range(50)) and o.delta_text == "".join(f"t{i}" for i in range(50))

    asyncio.run(main())


def test_a_reader_too_far_behind_is_reported():
    async def main():
        s = _Stream(asyncio.get_running_loop(), max_unread=10)
        ok = [s.put(output(step)) for step in range(12)]
        assert ok[:10] == [True] * 10 and ok[10:] == [False, False]

    asyncio.run(main())


def _counted_stream_sent_to(spec_version: str, fail_after: int) -> tuple[int, int]:
    """GET /load's count while a stream is being sent, and after its client went away after
    `fail_after` events; the ASGI server speaks `spec_version` (2.4: a send to a closed
    connection raises OSError, and Starlette skips a response's background task)."""
    from starlette.requests import ClientDisconnect

    from rawpage.server.streaming import sse_response
    from rawpage.server.vllm_routes import ServerLoad

    load = ServerLoad(enabled=True)

    async def events():
        while True:  # a stream that the client, not the engine, ends
            yield sse({"choices": []})
            await asyncio.sleep(0)

    async def handler(request, state):
        return sse_response(events(), "r")

    async def run() -> tuple[int, int]:
        sent, during = [], []

        async def send(message):
            if len(sent) > fail_after:
                raise OSError("connection closed")
            sent.append(message)
            during.append(load.count)

        async def receive():
            await asyncio.Event().wait()  # the client never says it left: only a send shows it

        response = await load.aware(handler)(None, None)
        scope = {"type": "http", "asgi": {"spec_version": spec_version}}
        try:
            await response(scope, receive, send)
        except (ClientDisconnect, OSError):
            pass
        await asyncio.sleep(0)
        return max(during), load.count

    return asyncio.run(run())


def test_a_stream_counts_for_get_load_until_it_ends_however_it_ends():
    for spec_version in ("2.3", "2.4"):
        assert _counted_stream_sent_to(spec_version, fail_after=3) == (1, 0), spec_version
