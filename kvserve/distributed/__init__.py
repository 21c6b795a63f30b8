"""Tensor parallelism across the devices of one host (torch.distributed: NCCL on CUDA, gloo on CPU).

The torch-level pieces: the rank's group and its collectives, the partitions, the parallel layers,
`shard_model` and the KV head gather/scatter. The model loader uses them; the engine drives the ranks
over them (`engine/tensor_parallel/`), so nothing here imports the engine.
"""
