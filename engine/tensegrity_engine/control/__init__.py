"""Model-predictive control over the engine or MuJoCo (``mpc``)."""
