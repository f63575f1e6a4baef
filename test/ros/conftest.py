"""The `ros` fixture (ros_harness.Ros) for every ROS test module; without the ROS 2 wheels
the modules skip themselves and nothing is defined here."""
try:
    from ros_harness import _clean_shm, ros  # noqa: F401 - fixtures
except ImportError:  # pragma: no cover - rclpy / the interfaces not installed
    pass
