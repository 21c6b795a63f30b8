"""KVTier: a KV store below the RAM prefix cache, as the engine's step loop sees it.

Shaped after vLLM's KV connector (its scheduler side): before admission the engine asks the tier
how much of a waiting prompt it holds beyond the RAM hit (`lookup`) and has it fill pool blocks
with that KV (`load`), so the scheduler's ordinary prefix lookup finds it; after each step the
tier saves what its policy wants (`save`, `save_evicted`) and forgets requests that ended
(`request_finished`). A tier names KV only by block chain hash and token ids, never by where it
keeps it: the disk tier (disk_tier.py) uses a local directory, a shared tier may use a network
or object store.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    import torch

    from kvserve.config import EngineConfig
    from kvserve.engine.kv_cache.manager import KVCacheManager
    from kvserve.engine.outputs import EngineOutput, SchedulerOutput
    from kvserve.engine.request import Request
    from kvserve.models.loaded import LoadedModel


class BlockCopier(Protocol):
    """Copies pool blocks' KV to and from host tensors (ModelRunner; TPDriver across the ranks)."""

    def copy_blocks_out(self, block_ids: list[int]) -> list[torch.Tensor]: ...

    def copy_blocks_in(self, block_ids: list[int], kv: list[torch.Tensor]) -> None: ...


class KVTier(Protocol):
    """The engine's tier below RAM. EngineCore calls it on its own thread only."""

    # False where lookup() always answers 0 (NullKVTier): the step then skips its per-request
    # lookup loop, the one tier call whose cost grows with the waiting queue.
    can_load: bool

    def bind(self, kv: KVCacheManager, blocks: BlockCopier) -> None:
        """Attach to the engine's KV cache and the runner that copies KV in and out of its blocks;
        called once by EngineCore, before the first step. A tier that must hear of freed requests
        or evicted blocks registers with `kv.listen` here, and may fill free pool blocks with KV it
        expects to be asked for."""
        ...

    def lookup(self, request: Request) -> int:
        """How many tokens of the request's prompt, beyond its RAM prefix hit, this tier can supply
        (0: none). Asked before schedule() for the requests at the head of the waiting queue,
        every step they wait; a tier answers each request once and 0 afterwards."""
        ...

    def load(self, request: Request) -> int:
        """Fill free pool blocks with the KV lookup() just found and register them as cached, so
        the scheduler's prefix lookup finds it. Returns the tokens loaded; 0 when the pool or the
        tier cannot supply them (the request prefills instead)."""
        ...

    def save_evicted(self) -> None:
        """Save what the pool evicted since the last call while its blocks still hold it: called
        after schedule() and before the forward writes into the blocks schedule() handed out."""
        ...

    def save(self, scheduler_output: SchedulerOutput, outputs: list[EngineOutput]) -> list[EngineOutput]:
        """After a step's update: the saves its progress calls for (KV copied out now, written off
        the engine thread). Returns `outputs`, each with how many tokens of its request's KV the
        tier has written so far (usage's cache writes)."""
        ...

    def request_finished(self, request_ids: Sequence[str]) -> None:
        """These requests ended (finished or aborted; their blocks are freed): forget them."""
        ...

    def shutdown(self, running: Sequence[Request]) -> None:
        """Clean exit: save what is worth keeping (the running requests, released sequences still
        in RAM) and wait for the writes. Idempotent."""
        ...


# Opens an engine's tier from its resolved config, its model and its cache key (a tier's KV is
# named by block chain hashes, which include that key); EngineCore binds what it returns.
OpenKVTier = Callable[["EngineConfig", "LoadedModel", str], KVTier]


class NullKVTier:
    """No tier below RAM: a prompt's tokens not in the prefix cache are prefilled, nothing is saved.
    It registers no block callbacks, so the KV cache's free and evict paths skip them entirely."""

    can_load = False

    def bind(self, kv: KVCacheManager, blocks: BlockCopier) -> None:
        pass

    def lookup(self, request: Request) -> int:
        return 0

    def load(self, request: Request) -> int:
        return 0

    def save_evicted(self) -> None:
        pass

    def save(self, scheduler_output: SchedulerOutput, outputs: list[EngineOutput]) -> list[EngineOutput]:
        return outputs

    def request_finished(self, request_ids: Sequence[str]) -> None:
        pass

    def shutdown(self, running: Sequence[Request]) -> None:
        pass
