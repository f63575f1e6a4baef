"""Shared node plumbing: QoS profiles, topic names, running a node from main()."""
from __future__ import annotations

import contextlib
import os
import sys
import threading

TOPIC_POSES = "/tensegrity/rod_poses"
TOPIC_IMU = "/tensegrity/imu"
TOPIC_COMMAND = "/tensegrity/cable_command"
TOPIC_APPLIED = "/tensegrity/applied_command"      # optional driver echo: stamp = when it took effect
# optional sensor_msgs/JointState per pose: a cable's rest length (position, m, its winch's
# encoder) and tension (effort, N, its load cell), named as the robot YAML's cables
TOPIC_CABLE_STATES = "/tensegrity/cable_states"
# words in a parameter message's ``stage`` that tell the controller identification is done
DONE_WORDS = ("converged", "done", "final")
TOPIC_PARAMS = "/tensegrity/identified_parameters"
TOPIC_GOAL = "/tensegrity/goal"
TOPIC_MARKERS = "/tensegrity/markers"


class ConfigurationError(ValueError):
    """A node's parameters or config files are wrong: reported as one line, exit code 2."""


def latched_qos():
    from rclpy.qos import DurabilityPolicy, HistoryPolicy, QoSProfile, ReliabilityPolicy

    return QoSProfile(history=HistoryPolicy.KEEP_LAST, depth=1,
                      reliability=ReliabilityPolicy.RELIABLE,
                      durability=DurabilityPolicy.TRANSIENT_LOCAL)


def stream_qos(depth: int = 50):
    from rclpy.qos import HistoryPolicy, QoSProfile, ReliabilityPolicy

    return QoSProfile(history=HistoryPolicy.KEEP_LAST, depth=depth,
                      reliability=ReliabilityPolicy.RELIABLE)


def goal_qos():
    """The goal is a setting: latched so a late controller gets it."""
    return latched_qos()


def resolve_device(name: str) -> str:
    import torch

    name = str(name).lower()
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda" and not torch.cuda.is_available():
        raise ConfigurationError("device=cuda requested but torch.cuda.is_available() is False")
    if name not in ("cpu", "cuda") and not name.startswith("cuda:"):
        raise ConfigurationError(f"device must be auto|cpu|cuda, got {name!r}")
    return name


def lower_thread_priority(niceness: int) -> str:
    """Raise the calling thread's niceness by ``niceness`` (at most to 19; on Linux a
    thread's own), so that a background computation gives way to the node's callbacks and to
    the processes that share the CPU (the controller, the robot's driver). Unprivileged:
    only lowering is allowed. Returns '' or why it could not."""
    if niceness <= 0:
        return ""
    if not sys.platform.startswith("linux") or not hasattr(os, "setpriority"):
        return f"per-thread priorities need Linux, not {sys.platform}"
    tid = threading.get_native_id()
    try:
        os.setpriority(os.PRIO_PROCESS, tid, min(19, os.getpriority(os.PRIO_PROCESS, tid) + int(niceness)))
    except OSError as exc:
        return f"setpriority: {exc}"
    return ""


class Spinner:
    """One SingleThreadedExecutor for one node, spun in its own thread."""

    def __init__(self, node, context=None):
        from rclpy.executors import SingleThreadedExecutor

        self.executor = SingleThreadedExecutor(context=context)
        self.executor.add_node(node)
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name=f"spin-{node.get_name()}", daemon=True)
        self.thread.start()

    def _run(self):
        while not self._stop.is_set():
            try:
                self.executor.spin_once(timeout_sec=0.05)
            except Exception as exc:  # noqa: BLE001 - shutting down
                if self._stop.is_set():
                    break
                import rclpy

                if not rclpy.ok(context=self.executor.context):
                    break
                raise exc

    def stop(self):
        self._stop.set()
        self.thread.join(timeout=5.0)
        try:
            self.executor.shutdown(timeout_sec=1.0)
        except Exception:  # noqa: BLE001
            pass


EXIT_USAGE = 2     # a bad parameter or config: one line on stderr, as argparse does


class ShutdownRequest:
    """SIGINT / SIGTERM as a flag, never as an exception: a node stops at its next spin,
    however many signals arrive and whenever they arrive (start-up included; `ros2 launch`
    without a terminal sends SIGINT twice). Installed before the heavy imports."""

    event = threading.Event()
    signals = 0
    installed = False

    @classmethod
    def install(cls) -> None:
        import signal

        if cls.installed or threading.current_thread() is not threading.main_thread():
            return

        def handler(signum, frame):
            cls.signals += 1
            cls.event.set()

        signal.signal(signal.SIGINT, handler)
        signal.signal(signal.SIGTERM, handler)
        cls.installed = True

    @classmethod
    def ignore_further(cls) -> None:
        """Shutting down: later signals are ignored. Python's finalisation restores the
        default handlers, so a second Ctrl-C during it would otherwise kill the process
        (exit -2) halfway through its cleanup."""
        import signal

        if cls.installed and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            signal.signal(signal.SIGTERM, signal.SIG_IGN)


def run_node(node_cls, args=None) -> int:
    """main() body: init, spin the node on its own SingleThreadedExecutor until SIGINT /
    SIGTERM, shut down cleanly (so DDS shared memory is released). Exit 0 on a signal at
    any moment, 2 with one line on stderr for a bad parameter (`ConfigurationError`).
    ``node_cls`` may be a callable returning the class, so that the heavy imports happen
    after the signal handlers are in place."""
    ShutdownRequest.install()
    node = context = executor = None
    try:
        import rclpy
        from rclpy.executors import SingleThreadedExecutor
        from rclpy.signals import SignalHandlerOptions

        os.environ.setdefault("ROS_AUTOMATIC_DISCOVERY_RANGE", "LOCALHOST")
        context = rclpy.Context()
        try:
            rclpy.init(args=args if args is not None else sys.argv, context=context,
                       signal_handler_options=SignalHandlerOptions.NO)
        except Exception as exc:  # noqa: BLE001 - malformed --ros-args
            raise ConfigurationError(f"bad ROS arguments: {exc}") from None
        if ShutdownRequest.event.is_set():
            return 0
        if not isinstance(node_cls, type):
            node_cls = node_cls()
        node = node_cls(context=context)
        executor = SingleThreadedExecutor(context=context)
        executor.add_node(node)
        while not ShutdownRequest.event.is_set() and context.ok():
            executor.spin_once(timeout_sec=0.1)
        return 0
    except ConfigurationError as exc:
        sys.stderr.write(f"{_program()}: {exc}\n")
        return EXIT_USAGE
    except KeyboardInterrupt:       # only before the handlers were installed
        return 0
    except Exception:
        if ShutdownRequest.event.is_set() or (context is not None and not context.ok()):
            return 0                # a signal invalidated the context mid-construction
        raise
    finally:
        ShutdownRequest.ignore_further()
        if node is not None:
            try:
                node.close()
            except Exception:  # noqa: BLE001
                pass
        if executor is not None:
            try:
                executor.shutdown(timeout_sec=1.0)
            except Exception:  # noqa: BLE001
                pass
        if node is not None:
            try:
                node.destroy_node()
            except Exception:  # noqa: BLE001
                pass
        if context is not None:
            import rclpy

            rclpy.try_shutdown(context=context)


@contextlib.contextmanager
def standalone_node(name: str, domain_id=None):
    """A node on a context of its own for a tool or a bench (rclpy's signal handlers off:
    `ShutdownRequest` keeps SIGINT), destroyed and shut down on leaving."""
    import rclpy
    from rclpy.signals import SignalHandlerOptions

    context = rclpy.Context()
    rclpy.init(context=context, domain_id=domain_id, signal_handler_options=SignalHandlerOptions.NO)
    node = rclpy.create_node(name, context=context)
    try:
        yield node
    finally:
        node.destroy_node()
        rclpy.try_shutdown(context=context)


def _program() -> str:
    return os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else "node"


# Fast DDS puts domain d's ports at 7400 + 250 d + ...: above 101 they reach Linux's
# ephemeral range (32768+), where any outgoing connection may already hold them.
SAFE_DOMAIN_IDS = range(1, 102)
_held_domains: dict = {}


def reserve_domain_id() -> int:
    """A ROS_DOMAIN_ID in 1..101 that no other process on this machine reserved: an
    exclusive lock on one file per id, held until `release_domain_id` or the process
    exits (the kernel drops the lock of a killed process). Parallel test runs and
    sim2sims cannot collide, as random ids did."""
    import fcntl
    import random
    import tempfile

    folder = os.path.join(tempfile.gettempdir(), "tensegrity_ros_domains")
    os.makedirs(folder, exist_ok=True)
    ids = list(SAFE_DOMAIN_IDS)
    random.SystemRandom().shuffle(ids)        # spread processes that start together
    for domain in ids:
        if domain in _held_domains:
            continue
        fd = os.open(os.path.join(folder, f"{domain}.lock"), os.O_CREAT | os.O_RDWR, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            continue
        _held_domains[domain] = fd
        return domain
    raise RuntimeError(f"every ROS domain id in {SAFE_DOMAIN_IDS.start}..{SAFE_DOMAIN_IDS.stop - 1} "
                       f"is reserved by another process (locks in {folder})")


def release_domain_id(domain: int) -> None:
    fd = _held_domains.pop(domain, None)
    if fd is not None:
        os.close(fd)
