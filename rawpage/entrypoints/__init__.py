"""vLLM's module entry points, under the names vLLM gives them (python -m vllm.entrypoints...)."""
