"""Tensor parallelism across the devices of one host (torch.distributed: NCCL on CUDA, gloo on CPU).

Torch-level pieces (`group`, `partition`, `layers`, `sharding`, `kv_shards`) are used by the model
loader and never import the engine; `plan`, `driver`, `worker` and `launch` run one engine
process per rank, driven by rank 0's scheduler.
"""
