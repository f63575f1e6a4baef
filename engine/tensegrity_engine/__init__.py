"""ROS-free core of tensegrity_ros, installed as ``tensegrity_engine``; imports no rclpy.

One package per concept, lowest layer first; a module imports only from its own package
or a lower one (``test/test_architecture.py`` checks it):

  physics         robot description (YAML), state layout, bounded parameters, collision,
                  the differentiable engine and its native kernel
  groundtruth     MuJoCo: the robot built from the same YAML, the paper's environments
  identification  trajectory files and tuples, live stream alignment, losses, solvers,
                  the progressive schedule (Algorithm 1), evaluation
  control         planners (RS/CEM/MPPI), costs, excitation, closed-loop execution
  cli             thin command-line programs over the packages above
"""
