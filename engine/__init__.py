"""ROS-free core of tensegrity_ros: differentiable engine, identification, control and
the MuJoCo ground truth. Installed as ``tensegrity_engine``; imports no rclpy."""
