"""Pooling models (`--runner pooling`): the pooler and the engine that serves embeddings."""
