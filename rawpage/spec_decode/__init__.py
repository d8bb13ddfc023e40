"""Speculative decoding: cheap proposers draft k tokens, the target model scores them all
in one forward pass (as extra query tokens), and acceptance keeps the target's output.

    config.py     SpeculativeConfig, vLLM's `speculative_config` dict
    ngram.py      prompt lookup: drafts copied from an earlier occurrence of the last n tokens
    draft_model.py  a small model of the same vocabulary, with its own paged KV cache
    rejection.py  greedy longest-prefix acceptance and rejection sampling (exact target distribution)
    decoder.py    SpecDecoder: the engine's hooks (propose before scheduling, verify after the forward pass)
    build.py      the hooks from the engine's speculative_config (None when off)
"""
