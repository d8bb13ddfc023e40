"""How much a reasoning model may think, as each API asks it, in one shape: ReasoningControls.

    chat            reasoning_effort; vLLM's thinking_token_budget
    Responses       reasoning.effort; reasoning.max_tokens
    Messages        thinking {type: enabled, budget_tokens} | disabled | adaptive; output_config.effort
    server          --reasoning-budget N (llama-server's: -1 unlimited, 0 no thinking)

An effort goes to the chat template as `reasoning_effort` (as vLLM passes it). A template
that reads it steers the model itself; for one that does not, the effort becomes a token
budget (EFFORT_BUDGETS). A budget is enforced in the engine: once the think block has
used it, the end tag is forced and the answer follows (rawpage/thinking_budget.py). A
budget of 0 also tells the template `enable_thinking: false` (Qwen3's switch), so a
template that can skip the block does; a model that opens one anyway has it closed at once.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from rawpage.sampling_params import SamplingParams
from rawpage.server.protocol import APIError, Body
from rawpage.server.state import RenderOptions, ServerState

# An effort with no switch in the template, as a thinking budget in tokens (None: unlimited).
# low/medium/high follow the budgets LiteLLM maps OpenAI efforts to for Anthropic models.
EFFORT_BUDGETS: dict[str, int | None] = {
    "none": 0,
    "minimal": 256,
    "low": 1024,
    "medium": 2048,
    "high": 4096,
    "xhigh": 8192,
    "max": None,
}


@dataclass(frozen=True)
class ReasoningControls:
    effort: str | None = None  # one of EFFORT_BUDGETS
    budget: int | None = None  # tokens, given outright (None: not given; -1: unlimited)
    omitted: bool = False  # Anthropic's thinking.display "omitted": the text travels only in the signature

    def resolve(
        self, state: ServerState, render: RenderOptions, params: SamplingParams
    ) -> tuple[RenderOptions, SamplingParams]:
        """The render options (template switches) and sampling params (budget, tags) they make."""
        budget = self._budget(state, render)
        kwargs = dict(render.chat_template_kwargs)
        if self.effort is not None:
            kwargs.setdefault("reasoning_effort", self.effort)
        if budget == 0:
            kwargs.setdefault("enable_thinking", False)
        parser = state.config.reasoning_parser
        tags = ("<think>", "</think>") if parser or budget is not None else None  # both parsers' tags
        params = dataclasses.replace(params, thinking_token_budget=budget, reasoning_tags=tags)
        return dataclasses.replace(render, chat_template_kwargs=kwargs), params

    def _budget(self, state: ServerState, render: RenderOptions) -> int | None:
        if self.budget is not None:
            return None if self.budget < 0 else self.budget  # -1: unlimited, whatever the server's default
        if self.effort is not None and not _template_reads_effort(state, render):
            return EFFORT_BUDGETS[self.effort]
        if self.effort is not None:
            return None  # the template steers the effort itself
        default = state.config.reasoning_budget
        return None if default < 0 else default


def _template_reads_effort(state: ServerState, render: RenderOptions) -> bool:
    source = render.chat_template
    if source is None:
        template = state.info.template
        source = template.source if template is not None else ""
    return "reasoning_effort" in source


def effort(value: Any, param: str) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or value not in EFFORT_BUDGETS:
        raise APIError(f"'{param}' must be one of {', '.join(EFFORT_BUDGETS)}; got {str(value)[:32]!r}", param=param)
    return value


def chat_controls(body: Body) -> ReasoningControls:
    """Chat's reasoning_effort (OpenAI's) and thinking_token_budget (vLLM's)."""
    budget = body.int("thinking_token_budget", None, -1)
    return ReasoningControls(effort(body.value("reasoning_effort"), "reasoning_effort"), budget)


def responses_controls(body: Body) -> tuple[ReasoningControls, dict[str, Any]]:
    """Responses' `reasoning` object, and how the response object echoes it. There is no
    summarizer here: `summary` is accepted and echoed, and the reasoning item carries the
    whole reasoning (content), with an empty summary list."""
    r = body.obj("reasoning")
    chosen = effort(r.value("effort"), "reasoning.effort")
    budget = r.int("max_tokens", None, 0)
    summary = r.str("summary") or r.str("generate_summary")
    if summary not in (None, "auto", "concise", "detailed"):
        raise APIError("'reasoning.summary' must be auto, concise or detailed", param="reasoning.summary")
    r.reject_unread()
    return ReasoningControls(chosen, budget), {"effort": chosen, "summary": summary}


def anthropic_controls(body: Body, output_effort: str | None) -> ReasoningControls:
    """Anthropic's `thinking`: enabled with budget_tokens, disabled (no thinking), or adaptive
    (the model decides: no budget), with its `display` ("summarized": the thinking as it is,
    there is no summarizer; "omitted": empty, the signature keeps it); and output_config.effort,
    read by the caller."""
    thinking = body.obj("thinking")
    kind = thinking.str("type")
    budget = None
    if kind == "enabled":
        budget = thinking.int("budget_tokens", None, 1)
        if budget is None:
            raise APIError("thinking.budget_tokens: Field required", param="thinking.budget_tokens")
    elif kind == "disabled":
        budget = 0
    elif kind not in (None, "adaptive"):
        raise APIError("'thinking.type' must be enabled, disabled or adaptive", param="thinking.type")
    display = thinking.str("display", "summarized")
    if display not in ("summarized", "omitted"):
        raise APIError("'thinking.display' must be summarized or omitted", param="thinking.display")
    thinking.reject_unread()
    return ReasoningControls(effort(output_effort, "output_config.effort"), budget, display == "omitted")
