"""tensegrity-play-bag: play a recorded MCAP bag (the recorder's, or any rosbag2 MCAP with
these topics) into the running nodes, as the robot's driver sent it: identification from a
recording, over the same topics and code path as live.

    tensegrity-play-bag run.mcap [--rate 2] [--start 5] [--end 65] [--topics /tensegrity/rod_poses ...]
                       [--clock] [--wait-subscribers 1]

Messages go out byte for byte as recorded (CDR), so header stamps are the recorded ones;
they are paced by the recorded receive times (log_time) divided by ``--rate``. With
``--clock`` it also publishes /clock at the recorded time, for nodes on use_sim_time.
Offline, the same bag becomes a trajectory file: ``recorder --to-npz run.mcap run.npz``.
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path
from typing import Optional

from .common import ShutdownRequest
from .recorder import LATCHED_TOPICS as LATCHED

NS = 1_000_000_000


@dataclasses.dataclass(frozen=True)
class BagMessage:
    offset_ns: int       # log time after the window's start
    log_time_ns: int
    topic: str
    datatype: str        # "pkg/msg/Type"
    data: bytes          # CDR, as recorded


def read_bag(path, topics: Optional[list] = None, start: float = 0.0, end: Optional[float] = None
             ) -> list[BagMessage]:
    """The bag's messages on ``topics`` (all when None) whose log time lies in [start, end]
    seconds after the bag's first message, in log-time order. Only ros2msg/CDR channels."""
    from mcap.reader import make_reader

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such bag")
    out = []
    with open(path, "rb") as fh:
        reader = make_reader(fh)
        first = None
        for schema, channel, message in reader.iter_messages(topics=topics, log_time_order=True):
            if first is None:
                first = message.log_time
            offset = message.log_time - first
            if offset < start * NS or (end is not None and offset > end * NS):
                continue
            if channel.message_encoding != "cdr" or schema is None or schema.encoding != "ros2msg":
                continue
            out.append(BagMessage(offset, message.log_time, channel.topic, schema.name, bytes(message.data)))
    if out:
        t0 = out[0].offset_ns
        out = [dataclasses.replace(m, offset_ns=m.offset_ns - t0) for m in out]
    return out


def _message_type(datatype: str):
    import importlib

    pkg, kind, name = datatype.split("/")
    return getattr(importlib.import_module(f"{pkg}.{kind}"), name)


def play(messages: list[BagMessage], *, rate: float = 1.0, clock: bool = False, wait_subscribers: int = 0,
         domain_id: Optional[int] = None, wait_timeout: float = 30.0, log=print) -> dict:
    """Publish ``messages`` paced by their offsets / ``rate`` (0 = as fast as possible);
    per-topic counts. Waits (at most ``wait_timeout`` s) until every topic has
    ``wait_subscribers`` subscribers first."""
    from .common import latched_qos, standalone_node, stream_qos

    counts: dict = {}
    with standalone_node("bag_player", domain_id) as node:
        pubs = {}
        for m in messages:
            if m.topic not in pubs:
                qos = latched_qos() if m.topic in LATCHED else stream_qos(1000)
                pubs[m.topic] = node.create_publisher(_message_type(m.datatype), m.topic, qos)
        clock_pub = None
        if clock:
            from rosgraph_msgs.msg import Clock

            clock_pub = node.create_publisher(Clock, "/clock", 10)
        deadline = time.monotonic() + wait_timeout
        while wait_subscribers and time.monotonic() < deadline and not ShutdownRequest.event.is_set() and \
                any(p.get_subscription_count() < wait_subscribers for p in pubs.values()):
            time.sleep(0.05)
        start = time.monotonic()
        for m in messages:
            if ShutdownRequest.event.is_set():
                break
            if rate > 0:
                delay = start + m.offset_ns / NS / rate - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
            if clock_pub is not None:
                from rosgraph_msgs.msg import Clock

                c = Clock()
                c.clock.sec, c.clock.nanosec = divmod(m.log_time_ns, NS)
                clock_pub.publish(c)
            pubs[m.topic].publish(m.data)
            counts[m.topic] = counts.get(m.topic, 0) + 1
        log(f"played {sum(counts.values())} messages in {time.monotonic() - start:.1f} s: "
            + ", ".join(f"{t} {n}" for t, n in sorted(counts.items())))
        return counts


def main(argv=None) -> int:
    ShutdownRequest.install()
    ap = argparse.ArgumentParser(prog="tensegrity-play-bag", description=__doc__.split("\n\n")[0])
    ap.add_argument("bag")
    ap.add_argument("--rate", type=float, default=1.0, help="speed factor (0 = as fast as possible)")
    ap.add_argument("--start", type=float, default=0.0, help="s after the bag's first message")
    ap.add_argument("--end", type=float, default=None, help="s after the bag's first message")
    ap.add_argument("--topics", nargs="+", default=None, help="topics to play (default: all)")
    ap.add_argument("--clock", action="store_true", help="publish /clock at the recorded times")
    ap.add_argument("--wait-subscribers", type=int, default=0,
                    help="wait until every topic has this many subscribers (at most 30 s)")
    args = ap.parse_args(argv)
    if args.rate < 0 or args.start < 0 or (args.end is not None and args.end <= args.start):
        ap.error("--rate and --start must be >= 0 and --end after --start")
    try:
        messages = read_bag(args.bag, args.topics, args.start, args.end)
    except Exception as exc:  # noqa: BLE001 - a missing or unreadable file: one line
        print(f"tensegrity-play-bag: {args.bag}: {exc}", file=sys.stderr)
        return 2
    if not messages:
        print(f"tensegrity-play-bag: {args.bag}: no messages in the window", file=sys.stderr)
        return 2
    play(messages, rate=args.rate, clock=args.clock, wait_subscribers=args.wait_subscribers)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
