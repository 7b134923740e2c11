"""What an own-process vLLM engine's workers can do besides vLLM's own methods (``worker_extension_cls``).

An engine in a process of its own (``EngineSettings(own_process=True)``) hands a call to its worker
process through a second hop (shared-memory broadcast, pickled); tensors that arrive zero-copy from
the first hop cannot be pickled again. So the weights travel as a safetensors file whose path is the
call's only argument, and the worker feeds them to the same ``reload_weights`` the in-process engine
uses.
"""

from __future__ import annotations

__all__ = ["FileWeightSync"]


class FileWeightSync:
    """Mixed into vLLM's worker class: ``self`` is the worker."""

    def reload_weights_from_file(self, path: str) -> None:
        from safetensors.torch import load_file

        self.reload_weights(weights_iterator=list(load_file(path).items()))
