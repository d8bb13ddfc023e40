"""Tensor parallelism across processes: the driver's workers (executor.py, worker.py) and
the collectives between them (communicator.py). What a rank holds is models/sharding.py."""
