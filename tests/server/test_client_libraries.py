"""Client libraries built for OpenAI and vLLM, against a server started with no tool flags
(issue 31): LangChain's bind_tools and with_structured_output, litellm with
tool_choice="required", the OpenAI Agents SDK with a function tool on its Chat Completions
model and on its Responses model. Each test skips when its package is missing (they are pinned in the dev extra)."""

import asyncio

import pytest
from pydantic import BaseModel

MODEL = "SmolLM2-135M-Instruct"


class Place(BaseModel):
    city: str


class Visit(BaseModel):
    """Visit a place."""

    where: Place  # a nested model: the tool's schema has local $defs


def test_langchain_bind_tools_and_structured_output(plain_server):
    lc = pytest.importorskip("langchain_openai")
    llm = lc.ChatOpenAI(model=MODEL, base_url=plain_server.url + "/v1", api_key="x", max_tokens=40, temperature=0)
    reply = llm.bind_tools([Visit]).invoke("Visit Paris.")  # tool_choice "auto", by default
    assert reply.content is not None
    forced = llm.bind_tools([Visit], tool_choice="required").invoke("Visit Paris.")
    assert forced.tool_calls and forced.tool_calls[0]["name"] == "Visit"
    place = llm.with_structured_output(Place).invoke("What is the capital of Japan?")
    assert isinstance(place, Place)


def test_litellm_tool_choice_required(plain_server):
    litellm = pytest.importorskip("litellm")
    tool = {"type": "function", "function": {"name": "visit", "parameters": Visit.model_json_schema()}}
    r = litellm.completion(
        model=f"openai/{MODEL}",
        api_base=plain_server.url + "/v1",
        api_key="x",
        messages=[{"role": "user", "content": "Visit Paris."}],
        tools=[tool],
        tool_choice="required",
        max_tokens=40,
        temperature=0,
    )
    assert r.choices[0].message.tool_calls[0].function.name == "visit"


def _weather_agent(model_class: str, url: str, tool_choice: str | None = None):
    """One agent with one function tool on the Agents SDK's `model_class`, run once."""
    agents = pytest.importorskip("agents")
    import openai

    agents.set_tracing_disabled(True)
    calls = []

    @agents.function_tool
    def weather(city: str) -> str:
        """The weather in a city."""
        calls.append(city)
        return f"Sunny in {city}"

    client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="x")
    model = getattr(agents, model_class)(model=MODEL, openai_client=client)
    agent = agents.Agent(
        name="a",
        instructions="Answer briefly.",
        tools=[weather],
        model=model,
        model_settings=agents.ModelSettings(max_tokens=40, temperature=0, tool_choice=tool_choice),
        tool_use_behavior="stop_on_first_tool",
    )
    result = asyncio.run(agents.Runner.run(agent, "What is the weather in Paris?", max_turns=2))
    return result, calls


def test_openai_agents_function_tool_on_chat_completions(plain_server):
    result, _ = _weather_agent("OpenAIChatCompletionsModel", plain_server.url)
    assert isinstance(result.final_output, str)


def test_openai_agents_function_tool_on_responses(plain_server):
    """The same agent on the Responses API model (issue 33): /v1/responses with a flat function
    tool; tool_choice "required", so that the 135M model surely calls it."""
    result, calls = _weather_agent("OpenAIResponsesModel", plain_server.url, "required")
    assert result.final_output == f"Sunny in {calls[0]}"
