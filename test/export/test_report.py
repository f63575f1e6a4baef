"""The identification report (`tensegrity_engine.export.report`)."""
import dataclasses

import numpy as np
import pytest

from tensegrity_engine.export.report import cable_coverage, write_report
from tensegrity_engine.identification.dataset import generate_dataset, load_split
from tensegrity_engine.physics.params import PhysicalParameters


@pytest.fixture(scope="module")
def hanging(tmp_path_factory, three_bar):
    root = tmp_path_factory.mktemp("report")
    generate_dataset(three_bar, "noncontact", root, counts={"train": 2, "test": 1}, duration=1.5, dense=False, seed=2)
    return load_split(root / "noncontact", "train", "sparse", three_bar), load_split(root / "noncontact", "test",
                                                                                        "sparse", three_bar)


def test_coverage_flags_a_cable_held_still_and_cables_never_taut(three_bar, hanging):
    train, _ = hanging
    params = PhysicalParameters(three_bar)
    before = cable_coverage(params, train)
    assert (before["span"][three_bar.actuated_indices] > 0.5).all()      # random commands cover the range
    assert (before["taut"] > 0.5).all()
    still = int(three_bar.actuated_indices[0])
    edited = []
    for t in train:
        cmd = t.command.copy()
        cmd[:, 0] = train[0].command[0, 0]                               # the first actuated cable never moves
        edited.append(dataclasses.replace(t, command=cmd))
    after = cable_coverage(params, edited)
    assert after["span"][still] == 0 and after["taut"][still] > 0.5
    moved = np.delete(np.arange(three_bar.num_cables), still)
    np.testing.assert_array_equal(after["span"][moved], before["span"][moved])
    # a model whose rest lengths are far longer than the measured cables: never taut
    loose = PhysicalParameters(three_bar, {"actuator_gain": 1.45, "actuator_offset": 0.19})
    assert (cable_coverage(loose, train)["taut"][three_bar.actuated_indices] < before["taut"].min()).all()


def test_report_puts_nominal_identified_and_true_side_by_side(tmp_path, three_bar, hanging):
    train, test = hanging
    truth = three_bar.replace(cable_stiffness=1.5 * three_bar.cable_stiffness)
    identified = PhysicalParameters(three_bar, {"cable_stiffness": 1.4 * three_bar.cable_stiffness.mean(),
                                                "actuator_offset": 0.01})
    path = write_report(tmp_path, params=identified, nominal=PhysicalParameters(three_bar),
                        learn=("cable_stiffness", "actuator_offset"), train=train, heldout=test, truth=truth,
                        notes=["MJCF export: something"], title="unit")
    text = path.read_text()
    row = next(line for line in text.splitlines() if line.startswith("| cable_stiffness"))
    assert "+40.0 %" in row and "-6.7 %" in row                          # vs nominal, vs true
    offset = next(line for line in text.splitlines() if line.startswith("| actuator_offset"))
    assert "| +0.01 m |" in offset                                       # from a nominal of 0: absolute
    models = [line.split("|")[1].strip() for line in text.splitlines() if line.startswith("| ")
              and line.split("|")[1].strip() in ("nominal", "identified", "true values")]
    assert models == ["nominal", "identified", "true values"]
    assert "undetermined by these data: unknown (no uncertainty estimate was made)" in text
    assert "MJCF export: something" in text
    assert (tmp_path / "report_heldout.png").stat().st_size > 1000
