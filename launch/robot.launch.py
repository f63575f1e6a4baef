"""A real robot: identifier + MPPI controller (+ recorder, RViz on request) against the
topics of the robot's own driver (docs/driver_contract.md says what it must publish).

    ros2 launch tensegrity_ros robot.launch.py robot:=/path/my_robot.yaml
    ros2 launch tensegrity_ros robot.launch.py controller:=false device:=cuda    # GPU machine
    ros2 launch tensegrity_ros robot.launch.py identifier:=false                  # robot's computer
    ros2 launch tensegrity_ros robot.launch.py poses_topic:=/mocap/rods record:=true

config/robot.yaml has the same layout as config/sim2sim.yaml (one section per node) with
the nodes on the robot's clock (use_sim_time: false). Without a ROS 2 launch install the
same nodes run as `identifier --ros-args --params-file config/robot.yaml -p robot:=...`.
"""
import os

from ament_index_python.packages import get_package_share_directory
from launch import LaunchDescription
from launch.actions import DeclareLaunchArgument
from launch.conditions import IfCondition
from launch.substitutions import LaunchConfiguration
from launch_ros.actions import Node

# the product topics (tensegrity_ros.common), remappable to the driver's names
TOPICS = {"poses_topic": "/tensegrity/rod_poses", "imu_topic": "/tensegrity/imu",
          "cable_states_topic": "/tensegrity/cable_states", "command_topic": "/tensegrity/cable_command",
          "goal_topic": "/tensegrity/goal",
          "parameters_topic": "/tensegrity/identified_parameters"}


def generate_launch_description():
    share = get_package_share_directory("tensegrity_ros")
    arg = LaunchConfiguration
    remappings = [(default, arg(name)) for name, default in TOPICS.items()]
    per_node = {"robot": arg("robot"), "device": arg("device")}
    return LaunchDescription([
        DeclareLaunchArgument("robot", default_value="superball",
                              description="robot YAML: a shipped name (config/) or a path"),
        DeclareLaunchArgument("params_file", default_value=os.path.join(share, "config", "robot.yaml"),
                              description="ROS parameter file of the nodes (config/robot.yaml layout)"),
        DeclareLaunchArgument("device", default_value="auto", description="torch device: auto|cpu|cuda"),
        DeclareLaunchArgument("checkpoint_dir", default_value="",
                              description="identifier checkpoints ('' = none)"),
        DeclareLaunchArgument("identifier", default_value="true", description="start the identifier"),
        DeclareLaunchArgument("controller", default_value="true", description="start the MPPI controller"),
        DeclareLaunchArgument("record", default_value="false", description="record the topics to MCAP"),
        DeclareLaunchArgument("bag", default_value="tensegrity.mcap", description="the recorder's output"),
        DeclareLaunchArgument("rviz", default_value="false", description="start RViz2 with rviz/tensegrity.rviz"),
        *[DeclareLaunchArgument(name, default_value=default, description=f"remap {default}")
          for name, default in TOPICS.items()],
        Node(package="tensegrity_ros", executable="identifier", name="identifier", output="screen",
             condition=IfCondition(arg("identifier")), remappings=remappings,
             parameters=[arg("params_file"), dict(per_node, checkpoint_dir=arg("checkpoint_dir"))]),
        Node(package="tensegrity_ros", executable="mppi_controller", name="mppi_controller", output="screen",
             condition=IfCondition(arg("controller")), remappings=remappings,
             parameters=[arg("params_file"), per_node]),
        Node(package="tensegrity_ros", executable="recorder", name="recorder", output="screen",
             condition=IfCondition(arg("record")), remappings=remappings,
             parameters=[arg("params_file"), {"output": arg("bag")}]),
        Node(package="rviz2", executable="rviz2", name="rviz2", output="screen",
             condition=IfCondition(arg("rviz")),
             arguments=["-d", os.path.join(share, "rviz", "tensegrity.rviz")]),
    ])
