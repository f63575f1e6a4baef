"""sim2sim: MuJoCo bridge (the robot) + identifier + MPPI controller, config/sim2sim.yaml.

    ros2 launch tensegrity_ros sim2sim.launch.py [params_file:=/path/to.yaml] [device:=cpu]
                                                 [robot:=/path/to/robot.yaml]
                                                 [pose_source:=camera [cameras:=2]]

With ``pose_source:=camera`` the bridge renders a depth camera instead of publishing poses
and ``camera_tracker`` publishes them. Where the bridge plays another robot than the config's
twin (``robot_truth``) and the file's ``sim2sim.weigh_rods`` is on, the nodes that model the
robot get its YAML with the rods weighed and measured, as its builder's would be
(`tensegrity_ros.sim2sim.launch_robot`). ``robot:=`` replaces the file's robot in the bridge
and in every node that models it. Without a ROS 2 launch install, `tensegrity-sim2sim`
runs the same nodes with the same file and prints a summary.
"""
import os

from ament_index_python.packages import get_package_share_directory
from launch import LaunchDescription
from launch.actions import DeclareLaunchArgument
from launch.conditions import IfCondition, LaunchConfigurationEquals
from launch.substitution import Substitution
from launch.substitutions import LaunchConfiguration, PythonExpression
from launch.utilities import perform_substitutions
from launch_ros.actions import Node


class ModelRobot(Substitution):
    """A node's ``robot`` parameter: the launch argument's or its own, or the played robot's
    weighed YAML."""

    def __init__(self, params_file, node: str, robot):
        super().__init__()
        self._params, self._node, self._robot = params_file, node, robot

    def describe(self) -> str:
        return f"ModelRobot({self._node})"

    def perform(self, context) -> str:
        from tensegrity_ros.sim2sim import launch_robot
        return launch_robot(perform_substitutions(context, [self._params]), self._node,
                            perform_substitutions(context, [self._robot]))


def generate_launch_description():
    default_params = os.path.join(get_package_share_directory("tensegrity_ros"), "config", "sim2sim.yaml")
    params = LaunchConfiguration("params_file")
    device = LaunchConfiguration("device")
    robot = LaunchConfiguration("robot")
    checkpoint_dir = LaunchConfiguration("checkpoint_dir")
    camera = PythonExpression(["'", LaunchConfiguration("pose_source"), "' == 'camera'"])
    # the tracker's camera namespaces for the bridge's depth_cameras: /tensegrity/camera, /tensegrity/camera_1, ...
    namespaces = PythonExpression(["str(['/tensegrity/camera'] + ['/tensegrity/camera_%d' % k for k in range(1, int(",
                                   LaunchConfiguration("cameras"), "))])"])
    return LaunchDescription([
        DeclareLaunchArgument("params_file", default_value=default_params,
                              description="ROS parameter file of the nodes"),
        DeclareLaunchArgument("device", default_value="auto", description="auto|cpu|cuda"),
        DeclareLaunchArgument("robot", default_value="",
                              description="robot YAML (name in config/ or a path) the bridge plays and every "
                                          "node models ('' = the params file's)"),
        DeclareLaunchArgument("checkpoint_dir", default_value="",
                              description="identifier checkpoint directory ('' = none)"),
        DeclareLaunchArgument("rviz", default_value="false", description="start RViz2 with rviz/tensegrity.rviz"),
        DeclareLaunchArgument("pose_source", default_value="mocap", choices=["mocap", "camera"],
                              description="rod poses from the bridge (mocap) or its depth camera + camera_tracker"),
        DeclareLaunchArgument("cameras", default_value="1",
                              description="with pose_source:=camera, depth cameras around the robot (1-8)"),
        Node(package="tensegrity_ros", executable="mujoco_bridge", name="mujoco_bridge",
             output="screen",
             parameters=[params, {"depth_camera": camera, "publish_poses": PythonExpression(["not ", camera]),
                                  "depth_cameras": LaunchConfiguration("cameras"),
                                  "robot": ModelRobot(params, "mujoco_bridge", robot)}]),
        Node(package="tensegrity_ros", executable="camera_tracker", name="camera_tracker",
             output="screen", parameters=[params, {"cameras": namespaces,
                                                   "robot": ModelRobot(params, "camera_tracker", robot)}],
             condition=LaunchConfigurationEquals("pose_source", "camera")),
        Node(package="tensegrity_ros", executable="identifier", name="identifier",
             output="screen",
             parameters=[params, {"device": device, "checkpoint_dir": checkpoint_dir,
                                  "robot": ModelRobot(params, "identifier", robot)}]),
        Node(package="tensegrity_ros", executable="mppi_controller", name="mppi_controller",
             output="screen", parameters=[params, {"device": device,
                                                   "robot": ModelRobot(params, "mppi_controller", robot)}]),
        Node(package="rviz2", executable="rviz2", name="rviz2", output="screen",
             condition=IfCondition(LaunchConfiguration("rviz")),
             arguments=["-d", os.path.join(get_package_share_directory("tensegrity_ros"), "rviz",
                                           "tensegrity.rviz")]),
    ])
