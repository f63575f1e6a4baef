"""The differentiable tensegrity engine and what it is built from: the robot description
(``config``), the state layout (``state``), bounded parameters (``params``), the capsule
collision checker (``collision``), the engine (``engine``: a façade over ``topology``,
``actuators``, ``forces``, ``jacobians``, ``rigid_body``, ``integrators`` and
``rollouts``) and its native kernel (``native``). Imports nothing from the other packages."""
