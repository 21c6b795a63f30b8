"""kvserve: an LLM inference server for agent workloads with a disk-persistent KV cache."""

__version__ = "0.1.0"
