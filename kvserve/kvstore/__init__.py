"""Disk tier of the KV cache: checkpoints (exact token prefixes with their KV) stored as
manifests over content-addressed chunks, so a prefix shared by many conversations is stored
once; a derived SQLite index; a scored eviction policy and save-trigger policy (both pure);
and a background writer. Never imports the engine: the engine hands it tensors and hashes.

This package init imports nothing: import the submodule that holds a name (`checkpoint` for the
records, `checkpoint_store`, `writer`, `cache_dir`, ...), so a light user such as the CLI's flag
definitions does not pull in the whole store. Only the modules that handle KV tensors import torch,
and only when they do (so `kvserve kv ls`, `show`, `prune` and `rm` run without it).
"""
