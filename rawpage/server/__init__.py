"""The OpenAI-compatible HTTP server (Starlette + uvicorn) around one engine."""
