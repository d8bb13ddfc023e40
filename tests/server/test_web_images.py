"""Images in the web page's chat (issue 45, item 5), in headless Chromium (Debian's
`chromium`, driven by Playwright, as in test_web_page.py) against `rawpage serve` of the
tiny Gemma 3 vision-language model (tests/tiny_vlm.py): a file that is not an image is
refused with the reason, an image is picked and others pasted (one taken out again),
two images over --limit-mm-per-prompt get the server's 400, one goes out with its
thumbnail, a reply comes, and the KV view draws the image's blocks in the image colour
while the sequence holds them."""

from __future__ import annotations

import base64
import io

import pytest

from tests.server.harness import ServerProcess
from tests.server.test_web_page import KEY, PASTE, Page, browser  # noqa: F401 (browser: a fixture)
from tests.tiny_vlm import seeded_image, write_vlm

pytest.importorskip("PIL")
pytestmark = pytest.mark.timeout(300)
IMAGE_COLOUR = "rgb(38, 50, 56)"  # style.css: .cell[data-image="1"]


def png(seed: int) -> bytes:
    buf = io.BytesIO()
    seeded_image(seed, 48, 40).save(buf, "PNG")
    return buf.getvalue()


@pytest.fixture(scope="module")
def vlm_server(tmp_path_factory):
    folder = write_vlm(str(tmp_path_factory.mktemp("vlm") / "gemma3-vlm"))
    s = ServerProcess(
        "--model", folder, "--block-size", "8", "--admin-api-key", KEY, "--limit-mm-per-prompt", '{"image": 1}'
    )
    yield s
    assert s.stop() == 0, s.output()


def test_an_image_goes_out_and_its_blocks_are_drawn_in_their_colour(browser, vlm_server):  # noqa: F811
    p = Page(browser, vlm_server)
    page = p.page
    try:
        # Every cell the view ever marks as holding image tokens, with its colour: the
        # sequence holds its blocks only while it runs.
        page.evaluate("""() => {
            window.imageCells = [];
            new MutationObserver(() => {
                for (const c of document.querySelectorAll('[data-testid=block-grid] [data-image="1"]'))
                    window.imageCells.push(getComputedStyle(c).backgroundColor);
            }).observe(document.getElementById('block-grid'), { subtree: true, attributes: true });
        }""")
        page.get_by_test_id("attach").wait_for(state="visible")  # /v1/models says vision: true
        page.evaluate(PASTE, ["notes.txt", "text/plain", base64.b64encode(b"hello").decode()])
        assert "the server takes PNG, JPEG, WebP, GIF" in page.get_by_test_id("image-note").inner_text()
        page.get_by_test_id("image-file").set_input_files(
            files=[{"name": "blobs.png", "mimeType": "image/png", "buffer": png(3)}]
        )
        page.evaluate(PASTE, ["image.png", "image/png", base64.b64encode(png(4)).decode()])
        thumbs = page.locator("[data-testid=attachments] [data-testid=thumbnail]")
        thumbs.nth(1).wait_for()
        assert page.get_by_test_id("image-note").inner_text() == ""
        thumbs.nth(1).click()  # taken out again
        page.wait_for_function("document.querySelectorAll('[data-testid=attachments] img').length === 1")
        page.evaluate(PASTE, ["image.png", "image/png", base64.b64encode(png(4)).decode()])
        thumbs.nth(1).wait_for()
        # two images, over --limit-mm-per-prompt: the server's 400 is shown, and the
        # conversation goes on without that message
        p.send("Compare these two.")
        assert "at most 1 are allowed" in p.wait_reply_done()
        assert page.evaluate("JSON.parse(localStorage.getItem('rawpage.conversation'))") == []
        p.errors.remove("Failed to load resource: the server responded with a status of 400 (Bad Request)")
        page.get_by_test_id("image-file").set_input_files(
            files=[{"name": "blobs.png", "mimeType": "image/png", "buffer": png(3)}]
        )
        thumbs.first.wait_for()
        p.send("What is in this picture?", max_tokens=200)
        page.wait_for_function("document.querySelectorAll('[data-testid=reply]:not(.streaming)').length === 2")
        assert p.wait_reply_done().strip()
        sent = page.locator(".message.user").last.locator("[data-testid=thumbnail]")
        assert sent.count() == 1 and sent.get_attribute("src").startswith("data:image/png;base64,")
        assert page.locator("[data-testid=attachments] img").count() == 0
        colours = page.evaluate("window.imageCells")
        assert colours and set(colours) == {IMAGE_COLOUR}, colours
    finally:
        p.close()
