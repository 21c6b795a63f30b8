"""PendingTokens: the sampled ids of a launched greedy step, read by the host only when needed."""

from __future__ import annotations

import torch


class PendingTokens:
    """A greedy step's argmax: on the device at once (the next step can read it there), on the host
    once `wait()` returns. On CUDA the ids go to pinned memory by an async copy followed by an event,
    so waiting blocks on this step only, not on steps queued after it."""

    def __init__(self, device_ids: torch.Tensor, host_ids: torch.Tensor, event: torch.cuda.Event | None):
        self.device_ids = device_ids  # [num_seqs] int64, valid until the step after next runs
        self._host_ids = host_ids
        self._event = event

    def wait(self) -> list[int]:
        if self._event is not None:
            self._event.synchronize()
        return self._host_ids.tolist()


class PendingTokensBuffers:
    """Two pinned id buffers and events used in turn: at most two greedy steps are ever in flight
    (the one being read and the one launched before reading it)."""

    def __init__(self, max_num_seqs: int, device: torch.device) -> None:
        self.device = device
        self._turn = 0
        if device.type == "cuda":
            self._host = [torch.zeros(max_num_seqs, dtype=torch.int64, pin_memory=True) for _ in range(2)]
            self._events = [torch.cuda.Event() for _ in range(2)]

    def stage(self, device_ids: torch.Tensor) -> PendingTokens:
        """Queue the copy of `device_ids` ([n] int64) to the host and return its handle."""
        if self.device.type != "cuda":
            return PendingTokens(device_ids, device_ids, None)
        turn = self._turn
        self._turn ^= 1
        host = self._host[turn][: device_ids.shape[0]]
        host.copy_(device_ids, non_blocking=True)
        event = self._events[turn]
        event.record()
        return PendingTokens(device_ids, host, event)
