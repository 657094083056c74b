"""The model zoo's CIFAR-10 builds: derived from the published ImageNet figures as documented."""

import pytest

from reamer.models.profiles import shipped_profiles
from reamer.models.training import Side, step
from reamer.models.zoo import ZOO


@pytest.mark.parametrize(("name", "features", "px", "published_px"), [
    ("resnet50", 2048, 32, 224), ("mobilenet_v2", 1280, 32, 224), ("densenet121", 1024, 32, 224),
    ("nasnet_mobile", 1056, 32, 224), ("inception_v3", 2048, 75, 299),
])  # fmt: skip
def test_cifar10_build_is_the_published_network_at_its_input_with_ten_classes(name, features, px, published_px):
    base, cifar = ZOO[name], ZOO[f"{name}_cifar10"]
    assert cifar.params_m == pytest.approx(base.params_m - features * 990e-6 - 990e-6, abs=1e-4)
    assert cifar.fwd_gflops == pytest.approx(base.fwd_gflops * (px / published_px) ** 2, rel=1e-3)
    assert cifar.batch == base.batch and cifar.gpu_samples_per_s == 0.0
    assert "CIFAR-10" in cifar.source and base.source in cifar.source


def test_a_cifar10_step_is_dominated_by_the_network_far_more_than_imagenet():
    """Same gradient, 1/49 of the compute: at a default TFJob's shape (4 workers, 2 PS, 1 core
    each, 10 GbE) the network and PS share of a ResNet-50 step rises from a few % to a large part."""
    cal = shipped_profiles().calibration
    share = {}
    for name in ("resnet50", "resnet50_cifar10"):
        st = step(ZOO[name], cal, 32, [Side(1.0, 10.0)] * 4, [Side(1.0, 10.0)] * 2)
        share[name] = (st.t_net + st.t_ps) / st.t
    assert share["resnet50"] < 0.1 and share["resnet50_cifar10"] > 0.3
    assert share["resnet50_cifar10"] > 10 * share["resnet50"]
