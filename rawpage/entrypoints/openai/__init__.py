"""vLLM's OpenAI-compatible server entry point (api_server.py)."""
