"""Issue 44: a request's outputs (text, ids, logprobs) are estimated at admission and refused
beyond --max-request-output-memory, whose default is sized to the machine."""

import pytest

from rawpage.engine_args import EngineArgs, machine_memory
from rawpage.errors import InvalidRequestError
from rawpage.request_checks import (
    LOGPROB_BYTES_PER_ENTRY,
    LOGPROB_BYTES_PER_TOKEN,
    OUTPUT_BYTES_PER_TOKEN,
    check_request,
    output_memory,
)
from rawpage.sampling_params import SamplingParams

V, MAX_LEN = 1000, 4096


def test_the_estimate_counts_choices_tokens_and_logprob_entries():
    assert output_memory(SamplingParams(n=2, max_tokens=10), 5, MAX_LEN) == 20 * OUTPUT_BYTES_PER_TOKEN
    lp = SamplingParams(n=2, max_tokens=10, logprobs=20)
    per_token = OUTPUT_BYTES_PER_TOKEN + LOGPROB_BYTES_PER_TOKEN
    assert output_memory(lp, 5, MAX_LEN) == 20 * per_token + 20 * 21 * LOGPROB_BYTES_PER_ENTRY
    prompt = SamplingParams(max_tokens=1, prompt_logprobs=3)
    prompt_cost = 100 * (LOGPROB_BYTES_PER_TOKEN + 4 * LOGPROB_BYTES_PER_ENTRY)
    assert output_memory(prompt, 100, MAX_LEN) == OUTPUT_BYTES_PER_TOKEN + prompt_cost
    unbounded = SamplingParams(max_tokens=None)  # up to the context limit
    assert output_memory(unbounded, 96, MAX_LEN) == 4000 * OUTPUT_BYTES_PER_TOKEN


def test_a_request_over_the_bound_is_refused_naming_it():
    args = EngineArgs(max_request_output_memory="64MiB")
    assert args.max_request_output_memory == 64 << 20
    check_request([1, 2], SamplingParams(n=8, max_tokens=200, logprobs=20), MAX_LEN, V, args)
    with pytest.raises(InvalidRequestError, match="--max-request-output-memory 64.0 MiB") as e:
        check_request([1, 2], SamplingParams(n=128, max_tokens=4000, logprobs=20), MAX_LEN, V, args)
    assert e.value.param == "logprobs" and "n 128, max_tokens 4000, logprobs 20" in str(e.value)
    with pytest.raises(InvalidRequestError, match="lower n, max_tokens or logprobs") as e:
        check_request(
            [1, 2], SamplingParams(n=128, max_tokens=4000), MAX_LEN, V, EngineArgs(max_request_output_memory=1 << 20)
        )
    assert e.value.param == "max_tokens"


def test_the_default_is_an_eighth_of_the_machines_memory():
    assert EngineArgs().max_request_output_memory == machine_memory() // 8 > 0
