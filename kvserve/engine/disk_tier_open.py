"""Opening the disk KV tier an engine config names: its store identity from the loaded model, the
replicas' shared tier below it, and the fall-back to no tier (with a warning) when either cannot
be used. Apart from `DiskTier` itself, so that the tier's per-step work reads on its own."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from functools import partial

from kvserve.config import EngineConfig, KVStoreConfig
from kvserve.engine.disk_tier import DiskTier
from kvserve.engine.kv_tier import KVTier, NullKVTier
from kvserve.kvstore.checkpoint import StoreIdentity
from kvserve.kvstore.shared.open_store import open_object_store
from kvserve.kvstore.shared.tier import SharedTier
from kvserve.models.loaded import LoadedModel, TokenizerInfo

logger = logging.getLogger(__name__)


def open_kv_tier(config: EngineConfig, loaded: LoadedModel, cache_key: str) -> KVTier:
    """The disk tier `config.kv_store` names (unbound: EngineCore binds it), or NullKVTier without
    one or when its directory is unusable (the engine then serves without it)."""
    store_config = config.kv_store
    if store_config is None:
        return NullKVTier()
    num_layers, _, head_dim = loaded.model.kv_cache_spec()
    identity = StoreIdentity(
        cache_key,  # the chunk keys are the engine's block chain hashes, whose extra key is cache_key
        config.cache.kv_dtype,  # the pool's bytes, stored as they are
        num_layers,
        loaded.arch.num_key_value_heads,  # all of them: TPDriver reassembles the ranks'
        head_dim,
        config.cache.block_size,
    )
    shared = None if store_config.shared is None else open_shared_tier(store_config, identity)
    try:
        return DiskTier(store_config, identity, partial(text_of, loaded.tokenizer), shared)
    except (OSError, ValueError, AssertionError) as error:  # unusable dir: serve without the tier
        logger.warning("disk KV cache disabled: cannot use %s: %s", store_config.directory, error)
        if shared is not None:  # it sits below the disk tier: without one it is not used
            shared.close()
        return NullKVTier()


def open_shared_tier(config: KVStoreConfig, identity: StoreIdentity) -> SharedTier | None:
    """The replicas' shared tier, or None (with a warning naming why) when it cannot be reached:
    the server then serves with its own disk tier, as it does when that one is unusable."""
    shared = config.shared
    assert shared is not None
    try:
        store = open_object_store(shared.location, shared.endpoint_url)
        tier = SharedTier(
            store,
            identity,
            chunk_tokens=config.chunk_tokens,
            refresh_s=shared.refresh_s,
            miss_refresh_s=shared.miss_refresh_s,
        )
    except (OSError, ValueError) as error:
        logger.warning("shared KV tier disabled: cannot use %s: %s", shared.location, error)
        return None
    where = store.url + (f" (endpoint {shared.endpoint_url})" if shared.endpoint_url else "")
    logger.info("shared KV tier %s: %d checkpoints of this model", where, len(tier.index))
    return tier


def text_of(tokenizer: TokenizerInfo, token_ids: Sequence[int]) -> str:
    """The rendered text of stored tokens (a checkpoint's text key)."""
    if tokenizer.tokenizer is None:  # token-id-only engines (tests)
        return "".join(f"<{t}>" for t in token_ids)
    return tokenizer.tokenizer.decode(list(token_ids), skip_special_tokens=False)
