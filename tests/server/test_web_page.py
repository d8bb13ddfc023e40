"""The built-in web page in a real browser: headless Chromium (Debian's `chromium` package,
which .ci/run installs) driven by Playwright, against `rawpage serve` on the default model.

Every test fails on any console error or uncaught exception in the page. The burst test
takes a screenshot; with RAWPAGE_SAVE_SCREENSHOT=1 it is the README's, docs/img/web-page.png
(otherwise it goes to a temporary folder, and a test run leaves the checkout as it was)."""

from __future__ import annotations

import json
import os
import shutil
import threading
from pathlib import Path

import httpx
import pytest

from tests.server.harness import ServerProcess

pytestmark = pytest.mark.timeout(900)  # a busy 2-core CI machine runs the model slowly
KEY = "web-test-key"
IMG = Path(__file__).resolve().parents[2] / "docs" / "img"
SYSTEM = (
    "You are a helpful assistant who answers in one short sentence. Never use lists. "
    "Always answer in English. Keep answers friendly, plain and to the point."
)
SWAPPED_COLOUR = "rgb(187, 85, 136)"  # style.css: .cell[data-state="swapped"]
BLOCK_STATES = (
    "Array.from(document.querySelectorAll('[data-testid=block-grid] [data-testid=block]'), c => c.dataset.state)"
)
# The tallest run of decode-orange (#f08c2e) pixels in any column of the token-budget chart.
TALLEST_DECODE_BAR = """() => {
    const c = document.getElementById('steps');
    const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
    let tallest = 0;
    for (let x = 0; x < c.width; x++) {
        let n = 0;
        for (let y = 0; y < c.height; y++) {
            const i = 4 * (y * c.width + x);
            if (d[i] === 240 && d[i + 1] === 140 && d[i + 2] === 46) n++;
        }
        tallest = Math.max(tallest, n);
    }
    return tallest;
}"""

# Dispatches a paste of one file (name, type, base64 bytes) into the message box, as a
# clipboard holding a copied image delivers it.
PASTE = """([name, type, b64]) => {
    const bytes = Uint8Array.from(atob(b64), (c) => c.charCodeAt(0));
    const data = new DataTransfer();
    data.items.add(new File([bytes], name, { type }));
    const event = new ClipboardEvent('paste', { clipboardData: data, bubbles: true, cancelable: true });
    document.getElementById('prompt').dispatchEvent(event);
}"""


def chromium_path() -> str:
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:
        pytest.skip("the browser tests need Debian's chromium package (apt-get install chromium; .ci/run does it)")
    return path


@pytest.fixture(scope="module")
def web_server():
    # The admin's key: the page sees every block as it is (another key gets a tenant's view,
    # test_a_tenants_view_draws).
    s = ServerProcess(
        "--kv-cache-memory", "160MiB", "--max-model-len", "2048", "--max-num-seqs", "16", "--admin-api-key", KEY
    )
    yield s
    assert s.stop() == 0, s.output()


@pytest.fixture(scope="module")
def browser():
    path = chromium_path()
    sync_api = pytest.importorskip("playwright.sync_api", reason="pip install -e '.[dev]' brings playwright")
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=path, args=["--no-sandbox"])
        yield b
        b.close()


class Page:
    """A fresh browser context on the page, past the API-key prompt, recording console errors."""

    def __init__(self, browser, server: ServerProcess, route: tuple[str, str] | None = None) -> None:
        # Playwright's wait_for_function evaluates strings in the page, which the page's CSP
        # forbids. Bypassing it here also shows the renderer is safe without that policy.
        self.context = browser.new_context(viewport={"width": 1400, "height": 1000}, bypass_csp=True)
        self.page = self.context.new_page()
        self.page.set_default_timeout(300_000)
        self.errors: list[str] = []
        self.page.on("console", lambda m: self.errors.append(m.text) if m.type == "error" else None)
        self.page.on("pageerror", lambda e: self.errors.append(f"uncaught: {e}"))
        if route is not None:  # (URL pattern, event-stream body) served by the browser itself
            pattern, body = route
            self.page.route(
                pattern, lambda r: r.fulfill(status=200, headers={"Content-Type": "text/event-stream"}, body=body)
            )
        self.page.goto(server.url + "/")
        self.page.get_by_test_id("api-key").fill(KEY)
        self.page.get_by_test_id("api-key").press("Enter")
        self.page.wait_for_function("document.querySelectorAll('[data-testid=block]').length > 0")

    def send(self, text: str, max_tokens: int = 24) -> None:
        self.page.fill("#temperature", "0")
        self.page.fill("#max-tokens", str(max_tokens))
        self.page.get_by_test_id("prompt").fill(text)
        self.page.get_by_test_id("send").click()

    def wait_reply_done(self) -> str:
        self.page.wait_for_selector("[data-testid=reply]:not(.streaming)", state="attached")
        return self.page.get_by_test_id("reply").last.inner_text()

    def states(self) -> list[str]:
        return self.page.evaluate(BLOCK_STATES)

    def close(self) -> None:
        self.context.close()
        assert self.errors == [], f"console errors on the page: {self.errors}"


@pytest.fixture
def page(browser, web_server):
    p = Page(browser, web_server)
    yield p
    p.close()


def test_chat_streams_a_reply(page):
    # Record every text the reply shows while it streams: more than one means it streamed.
    page.page.evaluate("""() => {
        window.seen = new Set();
        new MutationObserver(() => {
            const r = document.querySelectorAll('[data-testid=reply]');
            if (r.length) window.seen.add(r[r.length - 1].textContent);
        }).observe(document.getElementById('messages'), {subtree: true, childList: true, characterData: true});
    }""")
    # (a reply of tens of tokens: the page draws the engine's snapshots, at most one per
    # 0.1 s, and a one-line answer decodes in about that now)
    page.send("Write a haiku about the sea.", max_tokens=48)
    reply = page.wait_reply_done()
    assert reply.strip()
    assert page.page.evaluate("window.seen.size") >= 3, "the reply appeared at once, not streamed"
    assert "time to first token" in page.page.get_by_test_id("chat-stats").inner_text()
    # One stream decodes 1 token a step, 1/2048 of the budget: its bars must still be seen.
    assert page.page.evaluate(TALLEST_DECODE_BAR) >= 6, "the token-budget chart is blank at one stream"
    page.page.reload()  # the conversation is kept in the browser (and the key for this tab)
    page.page.wait_for_selector("[data-testid=reply]")
    assert page.page.get_by_test_id("reply").last.inner_text() == reply
    page.send("Tell me a long story about a dragon.", max_tokens=400)  # Stop ends it early
    page.page.wait_for_function("document.querySelector('[data-testid=reply].streaming')?.textContent.length > 0")
    page.page.get_by_test_id("stop").click()
    stopped = page.wait_reply_done()
    assert stopped.strip() and page.page.get_by_test_id("send").is_enabled()


def test_send_during_start_up_sends_the_message_without_a_reload(browser, web_server):
    """Issue 42: Send pressed while the page's start-up fetches are still out (the key prompt
    up, /v1/models held back here) sends the message once they finish. Before, the form
    submitted natively: the page reloaded and the text was gone."""
    context = browser.new_context(bypass_csp=True)
    page = context.new_page()
    page.set_default_timeout(300_000)
    errors, documents, held = [], [], []
    page.on("pageerror", lambda e: errors.append(f"uncaught: {e}"))
    page.on("request", lambda r: documents.append(r.url) if r.resource_type == "document" else None)
    page.route("**/v1/models", lambda route: held.append(route))
    try:
        page.goto(web_server.url + "/")
        page.evaluate("window.firstLoad = true")  # a reload would drop it
        page.fill("#temperature", "0")
        page.fill("#max-tokens", "24")
        page.get_by_test_id("prompt").fill("What is the capital of Japan?")
        page.get_by_test_id("send").click()
        page.get_by_test_id("api-key").fill(KEY)
        page.get_by_test_id("api-key").press("Enter")
        while not held:  # the page now asks for the model: hold the answer back a moment
            page.wait_for_timeout(50)
        assert page.locator(".message.user").inner_text() == "What is the capital of Japan?"
        assert page.get_by_test_id("model").inner_text() == ""  # start-up is not over
        held[0].continue_()
        page.wait_for_selector("[data-testid=reply]:not(.streaming)", state="attached")
        assert "Tokyo" in page.get_by_test_id("reply").last.inner_text()
        assert page.evaluate("window.firstLoad") is True and documents == [web_server.url + "/"]
    finally:
        context.close()
    assert errors == []


def test_a_text_model_takes_no_images(page):
    """Issue 45, item 5: the Image button is hidden, and a pasted image is refused with a
    note naming the model, not put in the message (tests/server/test_web_images.py: a model
    that takes them)."""
    assert page.page.get_by_test_id("send").is_enabled()
    assert not page.page.get_by_test_id("attach").is_visible()
    page.page.evaluate(PASTE, ["shot.png", "image/png", "iVBORw0KGgo="])
    page.page.wait_for_function("document.getElementById('image-note').textContent !== ''")
    assert "does not take images" in page.page.get_by_test_id("image-note").inner_text()
    assert page.page.locator("[data-testid=attachments] img").count() == 0


def test_model_output_is_shown_as_text(page):
    """Whatever the model writes, the page renders text: the reply is served here by the
    browser's network layer, so it holds exactly the markup an attacker would want run."""
    evil = (
        'Look: <script>window.pwned = 1</script> and <img src="x" onerror="window.pwned = 2">\n\n'
        '**bold** and `<b>code</b>`\n\n```html\n<iframe src="javascript:window.pwned=3"></iframe>\n```\n'
    )
    chunks = [evil[i : i + 7] for i in range(0, len(evil), 7)]
    body = "".join(f"data: {json.dumps({'choices': [{'index': 0, 'delta': {'content': c}}]})}\n\n" for c in chunks)
    page.page.route(
        "**/v1/chat/completions",
        lambda route: route.fulfill(
            status=200, headers={"Content-Type": "text/event-stream"}, body=body + "data: [DONE]\n\n"
        ),
    )
    page.send("anything")
    text = page.wait_reply_done()
    assert "<script>window.pwned = 1</script>" in text and 'onerror="window.pwned = 2"' in text
    reply = page.page.get_by_test_id("reply").last
    assert reply.locator("script, img, iframe, b").count() == 0
    assert reply.locator("strong").inner_text() == "bold" and reply.locator("pre").count() == 1
    assert page.page.evaluate("window.pwned") is None


# Each block's computed [background colour, background image, box shadow] in a grid.
CELL_LOOKS = """(grid) => Array.from(document.querySelectorAll(`[data-testid=${grid}] [data-testid=block]`), (c) => {
    const s = getComputedStyle(c);
    return [s.backgroundColor, s.backgroundImage, s.boxShadow];
})"""


def test_grid_draws_every_block_state(browser, web_server):
    """A made-up snapshot with every state, the swap pool and the queues, as the page draws
    it: blocks held in the prefix cache (free, cached) striped, unlike free ones; swapped
    blocks in the swap colour, ringed in their sequence's colour, unlike its blocks in use."""
    seq = {"request": "r", "tokens": 40, "prompt": 30, "computed": 39, "blocks": 3}
    snap = {
        "v": 1,
        "id": 1,
        "time": 0,
        "cost_ms": 0.1,
        "steps": [[1, [30], 0], [2, [], 1]],
        "pool": {
            "num_blocks": 8,
            "block_size": 16,
            "num_cpu_blocks": 4,
            "max_num_batched_tokens": 64,
            "max_num_seqs": 4,
        },
        "state": [0, 2, 1, 2, 2, 2, 3, 2],
        "owner": [-1, 2, 1, 4, -1, 2],
        "refs": [0, 2, 1, 2, 3, 2, 0, 2],
        "cpu_owner": [5, 2, -1, 2],
        "counts": {"running": 1, "waiting": 0, "swapped": 1},
        "queues": {
            "running": [{**seq, "id": 1, "state": "decode"}],
            "waiting": [],
            "swapped": [{**seq, "id": 5, "state": "swapped"}],
        },
        "totals": dict.fromkeys(
            [
                "steps",
                "prompt_tokens",
                "generation_tokens",
                "requests_finished",
                "preemptions",
                "swap_outs",
                "swap_ins",
                "cow_copies",
                "evictions",
                "prefix_queries",
                "prefix_hits",
            ],
            0,
        ),
    }
    p = Page(browser, web_server, route=("**/v1/engine/events", f"event: snapshot\ndata: {json.dumps(snap)}\n\n"))
    try:
        assert p.states() == ["free", "free", "used", "used", "shared", "shared", "cached", "cached"]
        cpu = p.page.evaluate(
            "Array.from(document.querySelectorAll('[data-testid=cpu-block-grid] [data-testid=block]'), c => c.dataset.state)"
        )
        assert cpu == ["swapped", "swapped", "free", "free"]
        shared = p.page.locator("[data-testid=block-grid] [data-state=shared]")
        assert (
            shared.first.inner_text() == "3"
            and shared.first.get_attribute("title") == "block 4: shared, sequence 1, 3 references"
        )
        assert p.page.get_by_test_id("queue-running").locator("li").count() == 1
        assert p.page.evaluate(TALLEST_DECODE_BAR) >= 6  # the one decode of a 64-token budget
        assert p.page.get_by_test_id("queue-swapped").locator("li").inner_text().startswith("#5 swapped")
        gpu, cpu = p.page.evaluate(CELL_LOOKS, "block-grid"), p.page.evaluate(CELL_LOOKS, "cpu-block-grid")
        free, used, cached = gpu[0], gpu[2], gpu[6]
        assert "repeating-linear-gradient" in cached[1] and free[1] == "none" and used[1] == "none"
        swatch = "(id) => getComputedStyle(document.querySelector(`li[data-seq='${id}'] .swatch`)).backgroundColor"
        seq1, seq5 = p.page.evaluate(swatch, 1), p.page.evaluate(swatch, 5)
        assert used[0] == seq1 and used[2] == "none"  # in use: its sequence's colour
        assert cpu[0][0] == SWAPPED_COLOUR != seq5 and seq5 in cpu[0][2]  # swapped: ringed in sequence 5's
        assert cpu[2][0] == free[0] and cpu[2][2] == "none"
    finally:
        p.close()


def test_a_tenants_view_draws(browser, web_server):
    """What a key that is not the admin's gets (docs/engine-events.md): no `refs`, never
    "shared", other keys' blocks as owner -2, and of the totals only `steps`."""
    snap = {
        "v": 1,
        "id": 1,
        "time": 0,
        "cost_ms": 0.1,
        "steps": [[1, [], 1]],
        "pool": {
            "num_blocks": 6,
            "block_size": 16,
            "num_cpu_blocks": 0,
            "max_num_batched_tokens": 64,
            "max_num_seqs": 4,
        },
        "state": [1, 4, 0, 2],
        "owner": [3, 2, -2, 2, -1, 2],
        "cpu_owner": [],
        "counts": {"running": 1, "waiting": 0, "swapped": 0},
        "queues": {
            "running": [
                {"id": 3, "request": "r", "state": "decode", "tokens": 20, "prompt": 10, "computed": 19, "blocks": 2}
            ],
            "waiting": [],
            "swapped": [],
        },
        "totals": {"steps": 1},
    }
    p = Page(browser, web_server, route=("**/v1/engine/events", f"event: snapshot\ndata: {json.dumps(snap)}\n\n"))
    try:
        assert p.states() == ["used"] * 4 + ["free"] * 2
        stats = p.page.get_by_test_id("pool-stats").inner_text()
        assert "in use 4" in stats and "undefined" not in stats and "cannot draw" not in p.page.inner_text("body")
    finally:
        p.close()


def test_engine_view_follows_a_burst(page, web_server, tmp_path):
    """8 requests at once (two with n=2, all sharing a system prompt): the grid shows blocks
    in use, shared and cached, the running queue fills, and the pool drains to empty."""
    page.send("What is a KV cache? Answer in one sentence.", max_tokens=32)  # for the screenshot
    page.wait_reply_done()
    page.page.evaluate(f"""() => {{
        window.seenStates = new Set(); window.maxRunning = 0;
        setInterval(() => {{
            for (const s of {BLOCK_STATES}) window.seenStates.add(s);
            const running = document.querySelectorAll('[data-testid=queue-running] li[data-seq]').length;
            window.maxRunning = Math.max(window.maxRunning, running);
        }}, 50);
    }}""")
    headers = {"Authorization": f"Bearer {KEY}"}
    questions = [
        "Name a colour.",
        "Name a fruit.",
        "Name a city.",
        "Name a river.",
        "Name an animal.",
        "Name a planet.",
        "Name a metal.",
        "Name a tree.",
    ]

    def ask(i: int, question: str) -> None:
        body = {
            "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}],
            "max_tokens": 24,
            "temperature": 0.8,
            "seed": i,
            "n": 2 if i < 2 else 1,
        }
        r = httpx.post(web_server.url + "/v1/chat/completions", json=body, headers=headers, timeout=600)
        r.raise_for_status()

    ask(99, "Hello.")  # the system prompt's blocks are now in the prefix cache
    threads = [threading.Thread(target=ask, args=(i, q)) for i, q in enumerate(questions)]
    for t in threads:
        t.start()
    page.page.wait_for_function("document.querySelectorAll('[data-testid=queue-running] li[data-seq]').length >= 6")
    page.page.wait_for_function("window.seenStates.has('shared')")
    img = IMG if os.environ.get("RAWPAGE_SAVE_SCREENSHOT") == "1" else tmp_path
    img.mkdir(parents=True, exist_ok=True)
    page.page.screenshot(path=str(img / "web-page.png"))
    assert (img / "web-page.png").stat().st_size > 0
    for t in threads:
        t.join()
    page.page.wait_for_function(f"{BLOCK_STATES}.every(s => s === 'free' || s === 'cached')")
    seen = set(page.page.evaluate("Array.from(window.seenStates)"))
    assert {"used", "shared", "cached"} <= seen, seen
    assert page.page.evaluate("window.maxRunning") >= 6
    assert "cached" in page.states()
    assert page.page.get_by_test_id("queue-running").locator("li").count() == 0
    assert page.page.get_by_test_id("queue-waiting").locator("li").count() == 0


def test_event_stream_sends_a_snapshot_at_once(web_server):
    """No browser needed: a client with the key gets the current state first, even when idle."""
    assert httpx.get(web_server.url + "/v1/engine/events").status_code == 401
    headers = {"Authorization": f"Bearer {KEY}"}
    with httpx.stream("GET", web_server.url + "/v1/engine/events", headers=headers, timeout=60) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        lines = r.iter_lines()
        assert next(lines) == "event: snapshot"
        snap = json.loads(next(lines).removeprefix("data: "))
    assert snap["v"] == 1 and snap["pool"]["block_size"] == 16
    assert sum(snap["state"][1::2]) == snap["pool"]["num_blocks"]


def test_a_pool_of_262144_blocks_draws(browser, web_server):
    """A tiny model's default 2 GiB pool: one replaceChildren(...cells) call would overflow
    Chromium's argument limit (and the error used to read as "the server went away")."""
    n = 262_144
    snap = {
        "v": 1,
        "id": 1,
        "time": 0,
        "cost_ms": 0.1,
        "steps": [[1, [], 1]],
        "pool": {
            "num_blocks": n,
            "block_size": 16,
            "num_cpu_blocks": 0,
            "max_num_batched_tokens": 64,
            "max_num_seqs": 4,
        },
        "state": [1, 3, 0, n - 3],
        "owner": [7, 3, -1, n - 3],
        "refs": [1, 3, 0, n - 3],
        "cpu_owner": [],
        "counts": {"running": 0, "waiting": 0, "swapped": 0},
        "queues": {"running": [], "waiting": [], "swapped": []},
        "totals": dict.fromkeys(
            ["generation_tokens", "prefix_queries", "prefix_hits", "cow_copies", "evictions", "preemptions"], 0
        )
        | {"swap_outs": 0, "swap_ins": 0},
    }
    p = Page(browser, web_server, route=("**/v1/engine/events", f"event: snapshot\ndata: {json.dumps(snap)}\n\n"))
    try:
        count = "document.querySelectorAll('[data-testid=block-grid] [data-testid=block]').length"
        assert p.page.evaluate(count) == n
        assert "cannot draw" not in p.page.get_by_test_id("pool-info").inner_text()
        assert p.page.locator("[data-testid=block-grid] [data-state=used]").count() == 3
    finally:
        p.close()
