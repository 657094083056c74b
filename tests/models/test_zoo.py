"""The model zoo's CIFAR-10 builds: derived from the published ImageNet figures as documented."""

import pytest

from reamer.models.profiles import shipped_profiles
from reamer.models.training import Side, step
from reamer.models.zoo import ZOO


@pytest.mark.parametrize(("name", "features", "keras_params_m"), [
    ("resnet50", 2048, 23.61), ("mobilenet_v2", 1280, 2.27), ("densenet121", 1024, 7.05),
    ("nasnet_mobile", 1056, 4.28),
])  # fmt: skip
def test_cifar10_build_is_the_published_network_at_32_px_with_ten_classes(name, features, keras_params_m):
    """Parameter counts within 2% of Keras applications' builds with ``classes=10``, from their
    exact ImageNet totals (ResNet50 25,636,712; MobileNetV2 3,538,984; DenseNet121 8,062,504;
    NASNetMobile 5,326,716) less the 1000-way classifier plus a 10-way one; the zoo starts from
    the rounded published counts."""
    base, cifar = ZOO[name], ZOO[f"{name}_cifar10"]
    assert cifar.params_m == pytest.approx(keras_params_m, rel=0.02)
    assert cifar.params_m < base.params_m - features * 0.98e-3
    assert cifar.fwd_gflops == pytest.approx(base.fwd_gflops / 49, rel=1e-3)
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
