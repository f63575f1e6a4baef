"""The tuples an online session holds out of training, in blocks, for its hold-out gate."""
from __future__ import annotations

import collections
from typing import Optional

import numpy as np
import torch

from tensegrity_engine.identification.acceptance import HELDOUT_FIT
from tensegrity_engine.identification.solvers.windows import window_fits
from tensegrity_engine.identification.streaming import HISTORY_SECONDS, PREV_INTERVALS, TupleBatch, stamp_intervals


# Held-out blocks needed before anything is published: on one or two blocks a wrong model
# beats the truth by chance (measured: the sim2sim's twin, whose config is its truth, had a
# model with K -41 % published on its first block of 10 tuples and kept as the incumbent).
MIN_GATE_BLOCKS = 3
# held-out blocks kept unless told a number of tuples: 20 s of poses, 200 tuples at 10 Hz
# (a count of 200 is 2 blocks at 100 Hz: the gate never judged)
HOLDOUT_KEPT_BLOCKS = 20
# A held-out block goes on past its ``block`` tuples until it holds a chain the gate can
# score (`acceptance.heldout_scores`: ``block`` intervals from a tuple to a tuple, two tuples
# among its first `HELDOUT_FIT`), up to this many times ``block``. Ten tuples around a lost
# pose span twelve intervals, and often hold no such chain: with 8.9 % of the frames lost
# (random/0), 30 held-out tuples held 2 chains, 60 held 5, and the gate's first verdict came
# at 28 s instead of 15.
BLOCK_STRETCH = 2


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
    """A block of at least ``block`` tuples after every ``every - 1`` blocks of training tuples,
    kept aside as they arrive (``split``); a block ends once it holds a chain the gate can
    score (`BLOCK_STRETCH`). The gate scores the newest ``max_tuples`` of them (``chunks``).
    The older ones stay ``retired``: their commands still carry the actuator state across
    their gaps in the training window (only their poses were held out) until the window no
    longer reaches them."""

    def __init__(self, every: int, block: int, max_tuples: int):
        self.every, self.block, self.max_tuples = int(every), int(block), int(max_tuples)
        self.chunks: collections.deque = collections.deque()   # TupleBatch chunks never trained on
        self.retired: collections.deque = collections.deque()  # chunks the gate dropped (not checkpointed)
        self.length = 0                      # tuples in ``chunks``
        self.total = 0                       # held-out tuples ever
        self.seen = 0                        # tuples received
        self.until_held = (self.every - 1) * self.block   # training tuples before the next block
        self.open_block: list = []           # (record, t0 ns) of the block being held out
        self.blocks = 0                      # blocks completed ever
        # ... of them holding a chain the gate can score: what it waits for (counted in tuples,
        # four-bar random/0 had a challenger started on 33 held-out tuples, 2 scorable blocks
        # and an open one; each of its looks was "no_heldout_yet", and so was its end: refused)
        self.scorable = 0

    def split(self, new: TupleBatch) -> Optional[TupleBatch]:
        """Keep the held-out part of ``new``; returns the rest (None if none). In blocks: the
        training tuples between them stay chains long enough for the multiple-shooting
        windows of pose-only identification."""
        if self.every < 2:
            return new
        held = torch.zeros(len(new), dtype=torch.bool)
        period_ns = new.commands.shape[1] * new.engine_dt * 1e9
        records, stamps = new.record.tolist(), new.t0.tolist()
        for i in range(len(new)):
            if self.until_held > 0:
                self.until_held -= 1
                continue
            held[i] = True
            self.open_block.append((int(records[i]), int(stamps[i])))
            ends, holds_chain = self._block_ends(period_ns)
            if ends:
                self.blocks += 1
                self.scorable += holds_chain
                self.open_block = []
                self.until_held = (self.every - 1) * self.block
        self.seen += len(new)
        if bool(held.any()):
            self.chunks.append(new.slice(held))
            self.length += int(held.sum())
            self.total += int(held.sum())
            while self.length > self.max_tuples and len(self.chunks) > 1:
                self.retired.append(self.chunks.popleft())
                self.length -= len(self.retired[-1])
        return new.slice(~held) if not bool(held.all()) else None

    def _block_ends(self, period_ns: float) -> tuple[bool, bool]:
        """(the open block ends, it holds a chain the gate can score): it ends with ``block``
        tuples holding a chain (on its newest record), or with `BLOCK_STRETCH` times as many."""
        n = len(self.open_block)
        if n < self.block:
            return False, False
        holds_chain = self._holds_chain(period_ns)
        return holds_chain or n >= BLOCK_STRETCH * self.block, holds_chain

    def _holds_chain(self, period_ns: float) -> bool:
        record = self.open_block[-1][0]
        position = stamp_intervals([t for r, t in self.open_block if r == record], period_ns)
        # a command run breaks where more intervals than a tuple's ``prev_commands`` cover have
        # no tuple (two frames lost close together: `streaming.to_tuple_set`)
        runs = np.split(position, np.flatnonzero(np.diff(position) > PREV_INTERVALS + 1) + 1)
        return any(window_fits(present, start, self.block, HELDOUT_FIT)
                   for present in map(set, (run.tolist() for run in runs)) for start in present)

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

    def phase(self) -> dict:
        """Where the split is (a checkpoint's: `restore`)."""
        return {"until_held": self.until_held, "open_block": [list(x) for x in self.open_block],
                "blocks": self.blocks, "scorable": self.scorable}

    def restore(self, held: Optional[TupleBatch], seen: int, total: Optional[int],
                phase: Optional[dict] = None) -> None:
        """The held-out chunks of a checkpoint; ``phase`` (`phase`'s), else the split's place
        from ``seen`` as blocks of ``block`` tuples (an open block then starts anew)."""
        self.chunks = collections.deque([held] if held is not None and len(held) else [])
        self.retired.clear()
        self.length = 0 if held is None else len(held)
        self.seen = int(seen)
        self.total = self.length if total is None else int(total)
        if phase is not None:
            self.until_held = max(0, int(phase["until_held"]))
            self.open_block = [(int(r), int(t)) for r, t in phase["open_block"]]
            self.blocks = max(0, int(phase["blocks"]))
            self.scorable = min(self.blocks, max(0, int(phase.get("scorable", self.blocks))))
        else:
            at = self.seen % max(self.every * self.block, 1)
            self.until_held = max(0, (self.every - 1) * self.block - at)
            self.open_block = []
            self.blocks = self.scorable = self.total // max(self.block, 1)
