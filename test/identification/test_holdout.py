"""The held-out blocks of an online session: each one a chain the gate can score."""
import torch

from tensegrity_engine.identification.acceptance import HELDOUT_FIT
from tensegrity_engine.identification.holdout import BLOCK_STRETCH, HeldOutBlocks
from tensegrity_engine.identification.solvers.windows import window_fits
from tensegrity_engine.identification.streaming import TupleBatch

T_NS = 100_000_000       # 10 Hz tuples
BLOCK = 10


def _tuples(intervals, record=0):
    """Tuples starting at these intervals (a lost pose: two intervals without one); their
    contents do not matter to the split."""
    n = len(intervals)
    x = torch.zeros(n, 2, 13)
    u = torch.zeros(n, 100, 3)
    return TupleBatch(x0=x, commands=u, x1=x.clone(), prev_commands=u.clone(),
                      vel_known0=torch.ones(n, dtype=torch.bool), vel_known1=torch.ones(n, dtype=torch.bool),
                      omega_measured0=torch.zeros(n, 2, dtype=torch.bool),
                      t0=torch.as_tensor(intervals, dtype=torch.long) * T_NS,
                      segment=torch.zeros(n, dtype=torch.long), engine_dt=0.001,
                      record=torch.full((n,), record, dtype=torch.long))


def _held_blocks(blocks: HeldOutBlocks) -> list:
    """The held-out intervals, cut where training tuples (more than lost poses) part them."""
    held = (blocks.batch().t0 // T_NS).tolist()
    out = [[held[0]]]
    for k in held[1:]:
        (out[-1].append if k - out[-1][-1] <= BLOCK else lambda v: out.append([v]))(k)
    return out


def _scoreable(intervals) -> bool:
    present = set(intervals)
    return any(window_fits(present, start, BLOCK, HELDOUT_FIT) for start in present)


def test_a_held_out_block_around_a_lost_pose_goes_on_until_the_gate_can_score_it():
    """Pose 22 lost (tuples 21 and 22 missing) just after the first block's start: its ten
    tuples (20, 23-31) hold no chain of ten intervals with two tuples among the first three,
    so the block holds one more (32) and the gate scores 23-32. Blocks without a loss stay
    ten tuples, every two blocks of training tuples apart."""
    blocks = HeldOutBlocks(every=3, block=BLOCK, max_tuples=1000)
    stream = [k for k in range(100) if k not in (21, 22)]
    rest = blocks.split(_tuples(stream[:50]))
    rest2 = blocks.split(_tuples(stream[50:]))                 # a split goes on across calls
    held = _held_blocks(blocks)
    assert held[0] == [20] + list(range(23, 33))
    assert not _scoreable(held[0][:BLOCK]) and _scoreable(held[0])
    assert held[1] == list(range(53, 63)) and held[2] == list(range(83, 93))
    assert len(rest) + len(rest2) + blocks.length == len(stream) == blocks.seen
    assert blocks.total == 31 and blocks.blocks == blocks.scorable == 3


def test_two_frames_lost_close_together_break_the_blocks_run():
    """Poses 24 and 25 lost: tuples 23-25 missing, more intervals than a tuple's
    ``prev_commands`` bridge, so the command run breaks there and 20-22 + 26-32 hold no chain
    across it; the block goes on to 26-35."""
    blocks = HeldOutBlocks(every=3, block=BLOCK, max_tuples=1000)
    blocks.split(_tuples([k for k in range(60) if k not in (23, 24, 25)]))
    assert _held_blocks(blocks)[0] == [20, 21, 22] + list(range(26, 36))


def test_a_block_that_holds_no_chain_ends_at_its_stretch():
    """Every third pose lost: no ten intervals with a tuple at the end and two among the first
    three; the block ends at `BLOCK_STRETCH` blocks of tuples, not never, and is not counted
    among the blocks the gate can score."""
    blocks = HeldOutBlocks(every=2, block=BLOCK, max_tuples=1000)
    stream = [k for k in range(200) if k % 3 == 0]
    blocks.split(_tuples(stream))
    held = blocks.batch().t0 // T_NS
    assert blocks.total == BLOCK_STRETCH * BLOCK + BLOCK_STRETCH * BLOCK   # two full stretched blocks
    assert held[BLOCK_STRETCH * BLOCK - 1] < held[BLOCK_STRETCH * BLOCK] - 3 * BLOCK   # training between
    assert blocks.blocks == 2 and blocks.scorable == 0


def test_an_open_block_survives_a_checkpoint():
    blocks = HeldOutBlocks(every=3, block=BLOCK, max_tuples=1000)
    stream = [k for k in range(60) if k not in (21, 22)]
    blocks.split(_tuples(stream[:25]))                 # the block open at 20, 23, 24, 25, 26
    phase = blocks.phase()
    again = HeldOutBlocks(every=3, block=BLOCK, max_tuples=1000)
    again.restore(blocks.batch(), blocks.seen, blocks.total, phase)
    for b in (blocks, again):
        b.split(_tuples(stream[25:]))
    assert _held_blocks(again) == _held_blocks(blocks) and again.total == blocks.total == 11 + 7      # the next block open: 53-59
    assert again.blocks == blocks.blocks == again.scorable == blocks.scorable == 1
    # a checkpoint without the phase (older): the split's place from the tuples seen
    old = HeldOutBlocks(every=3, block=BLOCK, max_tuples=1000)
    old.restore(None, 10, 0)
    assert old.until_held == 10 and old.open_block == [] and old.blocks == old.scorable == 0
