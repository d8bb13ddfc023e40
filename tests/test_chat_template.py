"""Chat templates are untrusted code: never a path, bounded in time and size."""

import time

import pytest

from rawpage.chat_template import ChatTemplate, ChatTemplateError

MSGS = [{"role": "user", "content": "hi"}]


def test_a_template_string_is_never_read_as_a_path(tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("TOP SECRET")
    assert ChatTemplate(str(secret)).render(MSGS) == str(secret)


def test_the_operators_flag_may_name_a_file(tmp_path):
    f = tmp_path / "t.jinja"
    f.write_text("{% for m in messages %}[{{ m.content }}]{% endfor %}")
    assert ChatTemplate.from_arg(str(f)).render(MSGS) == "[hi]"
    assert ChatTemplate.from_arg("{{ messages[0].role }}").render(MSGS) == "user"
    with pytest.raises(ChatTemplateError, match="neither a file"):
        ChatTemplate.from_arg(str(tmp_path / "missing.jinja"))


def test_a_loop_that_prints_nothing_still_hits_the_deadline():
    t = ChatTemplate("{% for i in range(15000) %}{% for j in range(15000) %}{% endfor %}{% endfor %}", timeout=0.3)
    t0 = time.monotonic()
    with pytest.raises(ChatTemplateError, match="took longer than 0.3 s"):
        t.render(MSGS)
    assert time.monotonic() - t0 < 5


@pytest.mark.parametrize(
    "source",
    [
        '{{ "a" * 10000000 }}',
        "{{ messages * 10000000 }}",
        "{{ 10 ** 100000 }}",
        "{% for i in range(100) %}{{ 'x' * 100000 }}{% endfor %}",
        "{{ lipsum(100000) }}",
    ],
)
def test_size_bombs_are_refused(source):
    with pytest.raises(ChatTemplateError):
        ChatTemplate(source, max_chars=1 << 20).render(MSGS)


def test_normal_templates_render_and_restore_the_tracer():
    import sys

    before = sys.gettrace()
    t = ChatTemplate("{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}{{ 2 ** 10 }}{{ 'ab' * 2 }}")
    assert t.render(MSGS) == "<user>hi1024abab"
    assert sys.gettrace() is before
