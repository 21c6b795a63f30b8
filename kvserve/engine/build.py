"""The engine a command runs, built from its config (its one rank, or all of them at tensor
parallelism).

NOTE: a bad config or model exits with a one-line message rather than raising: every caller is a
command's edge, and the engine process relays the message (`engine_process.py`). Torch, the loader
and the engine are imported when it runs, so the CLI's parser can import this module and
`kvserve --help` stays fast.
"""

from __future__ import annotations

import functools
import sys
from typing import TYPE_CHECKING

from kvserve.config import EngineConfig, resolve

if TYPE_CHECKING:
    from kvserve.engine.core import EngineCore


def build_engine(config: EngineConfig, progress: bool = True) -> EngineCore:
    """Load the model and build the engine; a bad model path exits with a one-line error."""
    import torch

    from kvserve.engine.core import EngineCore
    from kvserve.models.loader import ContextError, ModelLoadError, load_model

    try:
        config = resolve(config)
    except ValueError as error:  # inconsistent flags
        sys.exit(f"kvserve: {error}")
    torch.manual_seed(config.seed)
    try:
        if config.tensor_parallel_size > 1:
            from kvserve.engine.tensor_parallel.launch import (
                TPLaunchError,
                load_checkpoint_shard,
                start_tp_engine,
            )

            try:
                return start_tp_engine(config, functools.partial(load_checkpoint_shard, progress=progress))
            except TPLaunchError as error:
                sys.exit(f"kvserve: {error}")
        loaded = load_model(
            config.model,
            config.torch_dtype,
            config.device,
            progress=progress,
            context=config.context_request,
            mmproj=config.mmproj,
        )
    except (ModelLoadError, ContextError) as error:
        sys.exit(f"kvserve: {error}")
    return EngineCore(config, loaded)
