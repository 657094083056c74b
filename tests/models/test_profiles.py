"""The calibrated profile: shipped default, loader validation, measured models over the zoo."""

import json

import pytest

from reamer.errors import InputError
from reamer.models.profiles import (
    load_profiles,
    read_profile_json,
    shipped_profiles,
    with_parallel_fraction,
)
from reamer.models.training import Side, step
from reamer.models.zoo import ZOO

SHIPPED, _ = read_profile_json(None)


def write(tmp_path, doc, name="p.json"):
    p = tmp_path / name
    p.write_text(json.dumps(doc))
    return p


def with_model(core_s: float, f: float | None = None) -> dict:
    doc = json.loads(json.dumps(SHIPPED))
    doc["models"] = {"small_cnn": {"params_m": 0.024, "fwd_gflops": 0.0056, "core_s_per_sample": core_s,
                                   "parallel_fraction": f, "batch": 32, "measured": [[1, 1 / core_s]],
                                   "source": "test"}}  # fmt: skip
    return doc


def test_shipped_profile_is_the_default_everywhere():
    p = load_profiles()
    assert p is shipped_profiles()  # read and validated once
    from reamer.policies.harvest import Reamer

    assert Reamer().profiles == dict(p.inference)  # a harvesting policy without profiles gets the shipped ones
    assert p.machine.cpu and p.machine.nproc >= 1 and p.calibration.source
    assert set(ZOO) <= set(p.models)  # measured models are merged over the zoo


def test_measured_model_wins_over_flops(tmp_path):
    p = load_profiles(write(tmp_path, with_model(0.002, f=0.5)))
    m = p.models["small_cnn"]
    assert m.core_s_per_sample(p.calibration) == 0.002 and m.param_bytes == pytest.approx(0.024e6 * 4)
    one = step(m, p.calibration, 32, [Side(1.0, 10.0)], [Side(1.0, 10.0)])
    assert one.t_comp == pytest.approx(32 * 0.002)
    two = step(m, p.calibration, 32, [Side(2.0, 10.0)], [Side(1.0, 10.0)])
    assert one.t_comp / two.t_comp == pytest.approx(1 / (0.5 + 0.5 / 2))  # the model's own Amdahl f
    assert p.models["resnet50"] is ZOO["resnet50"]


def test_a_fraction_holds_up_to_the_cores_it_was_measured_at(tmp_path):
    doc = with_model(0.002, f=0.5)
    doc["models"]["small_cnn"]["measured"] = [[1, 500.0], [2, 700.0]]
    doc["models"]["big"] = {**doc["models"]["small_cnn"], "parallel_fraction": None}
    doc["training"]["max_cores"] = 2
    p = load_profiles(write(tmp_path, doc))
    assert p.models["small_cnn"].max_cores == 2 and p.calibration.max_cores == 2
    assert p.models["big"].max_cores is None  # no own fraction: the machine's (and its range) applies
    doc["training"].pop("max_cores")
    assert load_profiles(write(tmp_path, doc)).calibration.max_cores is None  # not recorded


def test_what_if_fraction_replaces_every_model_s_and_the_machine_s():
    p = with_parallel_fraction(shipped_profiles(), 0.9)
    assert p.calibration.parallel_fraction == 0.9 and p.calibration.max_cores is None
    assert set(p.models) == set(shipped_profiles().models)
    assert all(m.parallel_fraction == 0.9 and m.max_cores is None for m in p.models.values())
    m = p.models["resnet50"]
    one = step(m, p.calibration, 32, [Side(1.0, 10.0)], [Side(1.0, 10.0)])
    four = step(m, p.calibration, 32, [Side(4.0, 10.0)], [Side(1.0, 10.0)])
    assert one.t_comp / four.t_comp == pytest.approx(1 / (0.1 + 0.9 / 4))
    assert shipped_profiles().calibration.parallel_fraction != 0.9  # the shipped one is untouched
    with pytest.raises(ValueError, match="not in"):
        with_parallel_fraction(shipped_profiles(), 1.2)


@pytest.mark.parametrize(("edit", "where"), [
    (lambda d: d["training"].update(core_gflops=-1), "field training.core_gflops"),
    (lambda d: d["training"].pop("source"), "field training.source"),
    (lambda d: d.update(format="v0"), "field format"),
    (lambda d: d["machine"].update(nproc=0), "field machine.nproc"),
    (lambda d: d["inference"]["resnet50"].update(parallel_fraction=1.5), "field inference.resnet50.parallel_fraction"),
    (lambda d: d.update(interference={"training_interference": -1, "inference_interference": 0, "source": "x"}),
     "field interference.training_interference"),
    (lambda d: d["models"]["small_cnn"].update(batch=0), "field models.small_cnn.batch"),
    (lambda d: d.update(extra=1), "field extra"),
])  # fmt: skip
def test_bad_field_is_one_line_naming_file_and_field(tmp_path, edit, where):
    doc = with_model(0.001)
    edit(doc)
    with pytest.raises(InputError) as e:
        load_profiles(write(tmp_path, doc, "bad.json"))
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(f"{tmp_path / 'bad.json'}: {where}: expected"), msg


def test_missing_and_broken_files(tmp_path):
    with pytest.raises(InputError, match="nope.json: file"):
        load_profiles(tmp_path / "nope.json")
    bad = tmp_path / "broken.json"
    bad.write_text("{\n  nope")
    with pytest.raises(InputError, match="broken.json: line 2: expected valid JSON"):
        load_profiles(bad)
