"""The shared KV tier: checkpoints that several kvserve replicas (on several hosts) write and read.

Objects only, never a shared database: content-addressed chunks and checkpoint manifests in the
local disk tier's own formats, each written once and atomically (`object_store.py`: temp + link on
a shared directory, one conditional PUT on S3), so concurrent writers can only race to write the
same bytes. Each replica keeps its own index of them in memory (`index.py`), refreshed from the
listing; `tier.py` publishes what the local tier stores and reads what it lacks; `sweep.py` is the
one place that deletes (with a grace period), run by `kvserve kv prune` against the shared tier.

Like the rest of kvstore it never imports the engine.
"""
