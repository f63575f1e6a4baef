"""/diagnostics publishing and throttled, counted warnings shared by the nodes."""
from __future__ import annotations

import collections
import threading
import time
from typing import Callable, Mapping

from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus, KeyValue


class Diagnostics:
    """Counters + a periodic DiagnosticArray on /diagnostics (wall-clock timer, so it also
    reports while sim time is stalled). ``reject(reason, detail)`` counts and warns at most
    once per ``throttle_s`` per reason.

    Every subscribed message is accounted for: a callback calls ``received(topic)`` first
    and ends in exactly one ``accept(topic)`` or ``reject(reason, topic=topic)``, so
    ``in_<topic> == <topic>_accepted + <topic>_rejected`` holds whatever arrives (the fuzz
    harness checks it, and that ``in_<topic>`` equals what was sent)."""

    def __init__(self, node, *, throttle_s: float = 5.0, extra: Callable[[], Mapping] | None = None):
        from rclpy.clock import Clock, ClockType

        from .params import declare

        period_s = declare(node, "diagnostics_period", 1.0, "seconds (wall) between /diagnostics messages",
                           range=(0.01, 3600.0))

        self.node = node
        self.counters: collections.Counter = collections.Counter()
        self.throttle_s = float(throttle_s)
        self._last_warn: dict = {}
        self._lock = threading.Lock()
        self.extra = extra
        self.level = DiagnosticStatus.OK
        self.message = "ok"
        self.pub = node.create_publisher(DiagnosticArray, "/diagnostics", 10)
        self._wall = Clock(clock_type=ClockType.STEADY_TIME)
        self.timer = node.create_timer(period_s, self.publish, clock=self._wall)

    def count(self, key: str, n: int = 1) -> None:
        with self._lock:
            self.counters[key] += n

    def received(self, topic: str) -> None:
        self.count(f"in_{topic}")

    def accept(self, topic: str) -> None:
        self.count(f"{topic}_accepted")

    def reject(self, reason: str, detail: str = "", *, topic: str | None = None) -> None:
        """Count a rejected message (under its reason, and its topic's total) and warn
        (throttled per reason)."""
        with self._lock:
            self.counters[f"rejected_{reason}"] += 1
            if topic is not None:
                self.counters[f"{topic}_rejected"] += 1
            n = self.counters[f"rejected_{reason}"]
            now = time.monotonic()
            if now - self._last_warn.get(reason, -1e18) < self.throttle_s:
                return
            self._last_warn[reason] = now
        self.node.get_logger().warning(f"rejected ({reason}, {n} so far){': ' + detail if detail else ''}")

    def warn_throttled(self, key: str, text: str) -> None:
        now = time.monotonic()
        with self._lock:
            if now - self._last_warn.get(key, -1e18) < self.throttle_s:
                return
            self._last_warn[key] = now
        self.node.get_logger().warning(text)

    def set_status(self, level, message: str) -> None:
        self.level, self.message = level, message

    def snapshot(self) -> dict:
        with self._lock:
            values = dict(self.counters)
        if self.extra is not None:
            try:
                values.update(self.extra())
            except Exception as exc:  # noqa: BLE001 - diagnostics never crash the node
                values["extra_error"] = repr(exc)
        return values

    def publish(self) -> None:
        st = DiagnosticStatus()
        st.name = f"{self.node.get_name()}"
        st.hardware_id = "tensegrity"
        values = self.snapshot()
        rejected = sum(v for k, v in values.items() if k.startswith("rejected_") and isinstance(v, (int, float)))
        st.level = self.level
        st.message = self.message if not rejected else f"{self.message}; {int(rejected)} messages rejected"
        st.values = [KeyValue(key=str(k), value=str(v)) for k, v in sorted(values.items())]
        arr = DiagnosticArray()
        arr.header.stamp = self.node.get_clock().now().to_msg()
        arr.status = [st]
        try:
            self.pub.publish(arr)
        except Exception:  # noqa: BLE001 - context shutting down
            pass
