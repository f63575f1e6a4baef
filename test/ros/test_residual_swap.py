"""The controller says when a swapped-in model leaves its residual inactive."""
from types import SimpleNamespace

from tensegrity_ros.mppi_controller import report_inactive_residual


class _Log:
    def __init__(self):
        self.warnings = []

    def warning(self, msg):
        self.warnings.append(msg)


def _node(residual, active):
    counts, log = {}, _Log()
    diag = SimpleNamespace(count=lambda k: counts.__setitem__(k, counts.get(k, 0) + 1))
    dyn = SimpleNamespace(residual=residual, residual_active=active)
    return SimpleNamespace(mpc=SimpleNamespace(dynamics=dyn), diag=diag, get_logger=lambda: log), counts, log


def test_an_inactive_residual_is_logged_and_counted():
    node, counts, log = _node(object(), False)
    report_inactive_residual(node)
    assert counts == {"residual_inactive_swaps": 1} and "other physics" in log.warnings[0]
    for residual, active in ((object(), True), (None, False)):      # active, or no residual: silent
        node, counts, log = _node(residual, active)
        report_inactive_residual(node)
        assert counts == {} and log.warnings == []
