"""`rawpage bench`: the benchmark clients, as vLLM's `vllm bench` has them.

serve.py       load-test a running server (`rawpage bench serve`), over http.py, the client
throughput.py  offline throughput of the engine, or of a peer (`rawpage bench throughput`)
datasets.py    the workloads; metrics.py, vLLM's definitions; tokens.py, counting tokens
"""
