"""ament_python package layout (as `ros2 pkg create --build-type ament_python` makes it).

The ROS-free core lives in engine/tensegrity_engine/ and is installed as `tensegrity_engine`,
a name that cannot shadow anything else; the ROS nodes live in tensegrity_ros/.
"""
from glob import glob

from setuptools import find_packages, setup

package_name = "tensegrity_ros"

setup(
    name=package_name,
    version="0.1.0",
    packages=[package_name] + find_packages("engine", include=["tensegrity_engine", "tensegrity_engine.*"]),
    # Only the engine needs a mapping: an identity entry for tensegrity_ros breaks
    # `colcon build --symlink-install` (setuptools rejects a key that is also a value).
    package_dir={"tensegrity_engine": "engine/tensegrity_engine"},
    # the native kernel's C source, compiled on first use (tensegrity_engine/native)
    package_data={"tensegrity_engine.physics.native": ["*.c"]},
    data_files=[
        ("share/ament_index/resource_index/packages", ["resource/" + package_name]),
        ("share/" + package_name, ["package.xml"]),
        ("share/" + package_name + "/launch", glob("launch/*.py")),
        ("share/" + package_name + "/config", glob("config/*.yaml")),
        ("share/" + package_name + "/rviz", glob("rviz/*.rviz")),
    ],
    install_requires=["setuptools", "numpy", "pyyaml"],
    zip_safe=True,
    maintainer="tensegrity_ros maintainers",
    maintainer_email="maintainers@tensegrity-ros.invalid",
    description="Recurrent differentiable tensegrity engine, identification and MPPI over ROS 2",
    license="Apache-2.0",
    entry_points={
        "console_scripts": [
            # ROS-free tools (engine/)
            "tensegrity-demo = tensegrity_engine.cli.demo:main",
            "tensegrity-identify = tensegrity_engine.cli.identify:main",
            "tensegrity-control = tensegrity_engine.cli.control:main",
            "tensegrity-track = tensegrity_engine.cli.track:main",
            # ROS 2 nodes and the launch-free runner (tensegrity_ros/)
            # (through entry.py: signal handlers before the heavy imports)
            "mujoco_bridge = tensegrity_ros.entry:mujoco_bridge",
            "identifier = tensegrity_ros.entry:identifier",
            "mppi_controller = tensegrity_ros.entry:mppi_controller",
            "camera_tracker = tensegrity_ros.entry:camera_tracker",
            "recorder = tensegrity_ros.entry:recorder",
            "example_driver = tensegrity_ros.entry:example_driver",
            "tensegrity-sim2sim = tensegrity_ros.sim2sim:main",
            "tensegrity-fuzz = tensegrity_ros.fuzz:main",
            "tensegrity-soak = tensegrity_ros.soak:main",
            "tensegrity-check-driver = tensegrity_ros.check_driver:main",
            "tensegrity-play-bag = tensegrity_ros.bag_player:main",
            "tensegrity-identify-bag = tensegrity_ros.bag_identify:main",
            "tensegrity-track-bag = tensegrity_ros.bag_track:main",
        ],
    },
)
