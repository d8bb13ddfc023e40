"""Chat templates are untrusted code: never a path, bounded in time and size."""

import time

import pytest

from rawpage.text.chat_template import ChatTemplate, ChatTemplateError

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


# One expression is one C call that the clock between lines cannot stop (issue 29, item 5):
# each of these froze the server or allocated gigabytes before the output's size was checked.
# They are refused from their inputs, before they run, and quickly.
ONE_EXPRESSION_BOMBS = [
    "{{ (((10**64)**64)**64)**64 > 1 }}",
    "{{ 2**4096 * 2**4096 > 1 }}",
    "{{ '%0400000000d' % 1 }}",
    "{{ '%.400000000f' % 1.0 }}",
    "{{ '%*d' % (400000000, 1) }}",
    "{{ '%0400000000d'|format(1) }}",
    "{{ '{:0400000000d}'.format(1) }}",
    "{{ '{:{w}}'.format(1, w=400000000) }}",
    "{{ 'x'|center(400000000) }}",
    "{{ 'x'.center(400000000) }}",
    "{{ 'x'.ljust(400000000) }}",
    "{{ 'x'.rjust(400000000) }}",
    "{{ 'x'.zfill(400000000) }}",
    "{{ 'a\nb'|indent(400000000) }}",
    "{{ 'a b'|wordwrap(400000000) }}",
    "{{ ['a']|map('center', 400000000)|join }}",
    "{{ ('a' * 1000000).replace('a', 'aaaaaaaa') }}",
    "{{ (['a' * 1000000] * 8)|join }}",
    "{{ ('a' * 1000000).join(['b'] * 1000000) }}",
    "{{ [1]|batch(400000000, 0)|list }}",
    "{{ messages|tojson(indent=100000) }}",
    "{% set ns = namespace(s='a' * 1000000) %}{% for i in range(12) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}",
    "{% set ns = namespace(s='a' * 1000000) %}{% for i in range(12) %}{% set ns.s = ns.s + ns.s %}{% endfor %}",
]


@pytest.mark.parametrize("source", ONE_EXPRESSION_BOMBS)
def test_one_expression_cannot_outgrow_the_budget(source):
    t0 = time.monotonic()
    with pytest.raises(ChatTemplateError, match="limit is"):
        ChatTemplate(source).render(MSGS)
    assert time.monotonic() - t0 < 1.0


def test_the_bounded_operations_still_work_at_ordinary_sizes():
    source = (
        "{{ 3 ** 5 }} {{ '%05d' % 7 }} {{ '{:>4}'.format('a') }} {{ 'x'|center(5) }} {{ 'x\ny'|indent(2) }} "
        "{{ ['a', 'b']|join('-') }} {{ [{'n': 1}, {'n': 2}]|join(',', attribute='n') }} {{ 'a' ~ 'b' }} "
        "{{ 'abc'|replace('b', 'B') }} {{ 'ab'.replace('a', 'z') }} {{ '%s=%d'|format('k', 2) }} {{ [1, 2] + [3] }}"
    )
    want = "243 00007    a   x   x\n  y a-b 1,2 ab aBc zb k=2 [1, 2, 3]"
    assert ChatTemplate(source).render(MSGS) == want
