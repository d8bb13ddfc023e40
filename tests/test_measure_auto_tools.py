"""Issue 42 item 'tools under auto': the measurement README quotes (tools/measure_auto_tools.py)
asks what it says it asks, and the APIGen-format template it compares renders SmolLM2's format."""

import os

from rawpage.text.chat_template import ChatTemplate
from tools.measure_auto_tools import PROMPTS, TOOLS

APIGEN = os.path.join(os.path.dirname(__file__), "..", "tools", "templates", "smollm2_apigen_tools.jinja")


def test_twenty_prompts_each_answered_by_an_offered_tool():
    names = {t["function"]["name"] for t in TOOLS}
    assert len(PROMPTS) == 20 and {want for _, want in PROMPTS} == names


def test_the_apigen_template_renders_tools_calls_and_results():
    t = ChatTemplate.from_arg(APIGEN)
    call = {"type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    messages = [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "content": "sunny"},
    ]
    text = t.render(messages, tools=TOOLS[:1])
    assert '<tools>[{"name": "get_weather"' in text.replace("\\n", "")
    assert '<tool_call>[{"name": "get_weather", "arguments": {"city": "Paris"}}]</tool_call><|im_end|>' in text
    assert "<|im_start|>user\n<tool_response>\nsunny\n</tool_response><|im_end|>\n<|im_start|>assistant\n" in text
    plain = t.render([{"role": "user", "content": "hi"}])
    assert plain.startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")
