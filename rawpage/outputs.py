"""What the engine hands back, shaped like vLLM's RequestOutput / CompletionOutput.

Fields are cumulative (the whole text so far), as in vLLM; the `delta_*` fields
hold only what this step added, for streaming.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from rawpage.sequence import Logprob, RequestMetrics


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    cumulative_logprob: float | None
    logprobs: list[dict[int, Logprob]] | None
    finish_reason: str | None = None  # "stop" | "length" | "abort"
    stop_reason: int | str | None = None  # the stop string or stop token id that ended it
    delta_text: str = ""
    delta_token_ids: list[int] = field(default_factory=list)
    delta_logprobs: list[dict[int, Logprob]] | None = None
    # Why the grammar reached its error state (it allowed no token), if it did: the output
    # was cut short there, so finish_reason is "length", never a valid-looking "stop".
    grammar_error: str | None = None
    # Tokens of the think block, its tags included, where the request had it tracked
    # (SamplingParams.reasoning_tags or thinking_token_budget); None otherwise.
    reasoning_tokens: int | None = None

    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    prompt_logprobs: list[dict[int, Logprob] | None] | None
    outputs: list[CompletionOutput]
    finished: bool
    metrics: RequestMetrics | None = None
    num_cached_tokens: int = 0  # prompt tokens served from the prefix cache
    error: str | None = None  # set when the engine failed this request (its outputs end with "abort")


@dataclass
class EmbeddingOutput:
    """vLLM's EmbeddingOutput: one input's pooled vector."""

    embedding: list[float]  # (dim,), or (dimensions,) when truncated

    @property
    def hidden_size(self) -> int:
        return len(self.embedding)


@dataclass
class EmbeddingRequestOutput:
    """What a pooling engine (--runner pooling) hands back for one input, as vLLM's
    EmbeddingRequestOutput: the vector arrives once, with finished=True."""

    request_id: str
    outputs: EmbeddingOutput
    prompt_token_ids: list[int]
    finished: bool
    metrics: RequestMetrics | None = None
    error: str | None = None  # set when the engine failed this request (outputs.embedding is empty)
