"""The tuples an online session holds out of training, in blocks, for its hold-out gate."""
from __future__ import annotations

import collections
from typing import Optional

import torch

from tensegrity_engine.identification.streaming import HISTORY_SECONDS, TupleBatch


# Held-out blocks needed before anything is published: on one or two blocks a wrong model
# beats the truth by chance (measured: the sim2sim's twin, whose config is its truth, had a
# model with K -41 % published on its first block of 10 tuples and kept as the incumbent).
MIN_GATE_BLOCKS = 3
# held-out blocks kept unless told a number of tuples: 20 s of poses, 200 tuples at 10 Hz
# (a count of 200 is 2 blocks at 100 Hz: the gate never judged)
HOLDOUT_KEPT_BLOCKS = 20


def kept_tuples(max_holdout: Optional[int], block: int, every: int, period: float) -> int:
    """Held-out tuples the gate keeps: ``max_holdout``, or `HOLDOUT_KEPT_BLOCKS` blocks of
    ``block`` tuples when None. A count that cannot hold `MIN_GATE_BLOCKS` blocks while a
    gate runs (``every`` >= 2) is a ValueError: the gate could never judge."""
    kept = int(max_holdout) if max_holdout is not None else HOLDOUT_KEPT_BLOCKS * int(block)
    if int(every) >= 2 and kept < MIN_GATE_BLOCKS * int(block):
        raise ValueError(f"max_holdout {kept} keeps fewer than the {MIN_GATE_BLOCKS} held-out blocks of {block} "
                         f"tuples (1 s at T = {period:g} s) the gate needs: it could never judge, nothing would be "
                         f"published; keep at least {MIN_GATE_BLOCKS * int(block)}")
    return kept


class HeldOutBlocks:
    """Every ``every``-th block of ``block`` tuples, kept aside as they arrive (``split``);
    the gate scores the newest ``max_tuples`` of them (``chunks``). The older ones stay
    ``retired``: their commands still carry the actuator state across their gaps in the
    training window (only their poses were held out) until the window no longer reaches them."""

    def __init__(self, every: int, block: int, max_tuples: int):
        self.every, self.block, self.max_tuples = int(every), int(block), int(max_tuples)
        self.chunks: collections.deque = collections.deque()   # TupleBatch chunks never trained on
        self.retired: collections.deque = collections.deque()  # chunks the gate dropped (not checkpointed)
        self.length = 0                      # tuples in ``chunks``
        self.total = 0                       # held-out tuples ever
        self.seen = 0                        # tuples received (picks the held-out ones)

    def split(self, new: TupleBatch) -> Optional[TupleBatch]:
        """Keep the held-out part of ``new``; returns the rest (None if none). In blocks: the
        training tuples between them stay chains long enough for the multiple-shooting
        windows of pose-only identification."""
        if self.every < 2:
            return new
        held = (torch.arange(len(new)) + self.seen) // self.block % self.every == self.every - 1
        self.seen += len(new)
        if bool(held.any()):
            self.chunks.append(new.slice(held))
            self.length += int(held.sum())
            self.total += int(held.sum())
            while self.length > self.max_tuples and len(self.chunks) > 1:
                self.retired.append(self.chunks.popleft())
                self.length -= len(self.retired[-1])
        return new.slice(~held) if not bool(held.all()) else None

    def prune(self, window_start_ns: int, window_tuples: int) -> None:
        """Drop retired chunks older than the window (by more than the history a record walks
        back); at most a window's worth is kept."""
        oldest = window_start_ns - int(HISTORY_SECONDS * 1e9)
        while self.retired and (int(self.retired[0].t0.max()) < oldest
                                or sum(len(b) for b in self.retired) > window_tuples):
            self.retired.popleft()

    def batch(self) -> TupleBatch:
        return TupleBatch.cat(list(self.chunks))

    def context(self) -> list:
        """Every held-out chunk still known, oldest first: the commands of the window's gaps."""
        return list(self.retired) + list(self.chunks)

    def restore(self, held: Optional[TupleBatch], seen: int, total: Optional[int]) -> None:
        self.chunks = collections.deque([held] if held is not None and len(held) else [])
        self.retired.clear()
        self.length = 0 if held is None else len(held)
        self.seen = int(seen)
        self.total = self.length if total is None else int(total)
