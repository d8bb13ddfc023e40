"""The errors rawpage raises on purpose. Each message says what was wrong and what to change."""

from rawpage.memory import OutOfMemoryError


class ModelLoadError(ValueError):
    """The model could not be loaded: a missing, truncated or corrupt file."""


class UnsupportedModelError(ModelLoadError):
    """The checkpoint is readable but asks for something rawpage does not implement."""


class InvalidRequestError(ValueError):
    """A request the engine refuses before it runs; `param` names the field at fault."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


class CudaUnusableError(RuntimeError):
    """A GPU is visible (nvidia-smi, the driver, torch), but CuPy cannot import or use it."""


class WorkerDiedError(RuntimeError):
    """A tensor-parallel worker process is gone: no later step can run, so the engine stops."""


# What a user's settings cause at startup (a missing model, a flag the model or machine cannot
# honour, a pool too small): reported as one line without a traceback, exit status 2.
CONFIG_ERRORS: tuple[type[Exception], ...] = (ValueError, OutOfMemoryError, CudaUnusableError)
