"""The router's approximate tree of what it routed: which replica was sent which prompt blocks
(`prefix_blocks`), and where prompts branch, so that the part every session shares (a coding agent's
long system prompt and tools) never counts as a reason to pick a replica."""

from __future__ import annotations

import itertools
from collections import OrderedDict
from collections.abc import Sequence

# A block with two known continuations is a branch point; more need not be remembered.
_MAX_CHILDREN = 2


class PrefixIndex:
    """Bounded (LRU) per replica and in its branch table; pure and single-threaded."""

    def __init__(self, max_blocks_per_replica: int = 200_000, max_branch_entries: int = 200_000):
        self.max_blocks_per_replica = max_blocks_per_replica
        self.max_branch_entries = max_branch_entries
        self._held: dict[str, OrderedDict[int, None]] = {}
        self._children: OrderedDict[int, tuple[int, ...]] = OrderedDict()

    def insert(self, replica_id: str, hashes: Sequence[int]) -> None:
        """`replica_id` was sent a prompt of these chain hashes."""
        held = self._held.setdefault(replica_id, OrderedDict())
        for h in hashes:
            held[h] = None
            held.move_to_end(h)
        while len(held) > self.max_blocks_per_replica:
            held.popitem(last=False)
        for parent, child in itertools.pairwise(hashes):
            children = self._children.get(parent, ())
            if child not in children and len(children) < _MAX_CHILDREN:
                children = (*children, child)
            self._children[parent] = children
            self._children.move_to_end(parent)
        while len(self._children) > self.max_branch_entries:
            self._children.popitem(last=False)

    def remove_replica(self, replica_id: str) -> None:
        self._held.pop(replica_id, None)

    def shared_length(self, hashes: Sequence[int]) -> int:
        """How many leading blocks of this prompt other prompts share: up to and including the last
        block after which some routed prompt went on differently than this one does."""
        shared = 0
        for i in range(len(hashes) - 1):
            children = self._children.get(hashes[i], ())
            if any(child != hashes[i + 1] for child in children):
                shared = i + 1
        return shared

    def matched_length(self, replica_id: str, hashes: Sequence[int]) -> int:
        """Leading blocks of this prompt that `replica_id` was sent."""
        held = self._held.get(replica_id)
        if not held:
            return 0
        n = 0
        while n < len(hashes) and hashes[n] in held:
            n += 1
        return n
