"""Model definitions shared by the real workloads (PS training and the inference server).

All take CIFAR-shaped input ``(N, 3, 32, 32)`` and return 10 logits. No BatchNorm: a
parameter server only synchronises parameters, so models use GroupNorm (no running
buffers that would drift apart between workers) and export cleanly to ONNX.
"""

from __future__ import annotations

from typing import Any

INPUT_SHAPE = (3, 32, 32)
NUM_CLASSES = 10


def _torch() -> Any:
    import torch

    return torch


def small_cnn() -> Any:
    """Three conv layers and a linear head (~24k parameters)."""
    nn = _torch().nn
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(64, NUM_CLASSES),
    )


def _resnet_narrow() -> Any:
    torch = _torch()
    nn = torch.nn

    class Block(nn.Module):
        def __init__(self, cin: int, cout: int, stride: int):
            super().__init__()
            self.c1 = nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False)
            self.n1 = nn.GroupNorm(4, cout)
            self.c2 = nn.Conv2d(cout, cout, 3, padding=1, bias=False)
            self.n2 = nn.GroupNorm(4, cout)
            self.short = (
                nn.Sequential(nn.Conv2d(cin, cout, 1, stride=stride, bias=False), nn.GroupNorm(4, cout))
                if stride != 1 or cin != cout
                else nn.Identity()
            )

        def forward(self, x: Any) -> Any:
            y = torch.relu(self.n1(self.c1(x)))
            y = self.n2(self.c2(y))
            return torch.relu(y + self.short(x))

    class ResNetNarrow(nn.Module):
        """ResNet-8-style: a stem and three stages of one basic block, widths 16/32/64."""

        def __init__(self) -> None:
            super().__init__()
            self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1, bias=False), nn.GroupNorm(4, 16), nn.ReLU())
            self.layers = nn.Sequential(Block(16, 16, 1), Block(16, 32, 2), Block(32, 64, 2))
            self.pool = nn.AdaptiveAvgPool2d(1)
            self.fc = nn.Linear(64, NUM_CLASSES)

        def forward(self, x: Any) -> Any:
            return self.fc(torch.flatten(self.pool(self.layers(self.stem(x))), 1))

    return ResNetNarrow()


def _mobilenet_tiny() -> Any:
    nn = _torch().nn

    def dw_sep(cin: int, cout: int, stride: int) -> Any:
        return nn.Sequential(
            nn.Conv2d(cin, cin, 3, stride=stride, padding=1, groups=cin, bias=False),
            nn.GroupNorm(4, cin),
            nn.ReLU6(),
            nn.Conv2d(cin, cout, 1, bias=False),
            nn.GroupNorm(4, cout),
            nn.ReLU6(),
        )

    return nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1, bias=False),
        nn.GroupNorm(4, 16),
        nn.ReLU6(),
        dw_sep(16, 32, 1),
        dw_sep(32, 64, 2),
        dw_sep(64, 64, 1),
        dw_sep(64, 128, 2),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(128, NUM_CLASSES),
    )


def _vgg_cifar() -> Any:
    """VGG-11 (Simonyan & Zisserman, ICLR 2015, configuration A) on 32x32 input with
    GroupNorm and a single 512→10 head, the usual CIFAR adaptation (~9.2M parameters,
    ~0.15 GFLOPs forward per sample): heavy enough that an inference request costs
    milliseconds of CPU, so serving time dominates HTTP overhead."""
    nn = _torch().nn
    layers: list[Any] = []
    cin = 3
    for v in (64, "M", 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M"):
        if v == "M":
            layers.append(nn.MaxPool2d(2))
        else:
            layers += [nn.Conv2d(cin, int(v), 3, padding=1, bias=False), nn.GroupNorm(8, int(v)), nn.ReLU()]
            cin = int(v)
    return nn.Sequential(*layers, nn.Flatten(), nn.Linear(512, NUM_CLASSES))


MODELS = {
    "small_cnn": small_cnn,
    "resnet_narrow": _resnet_narrow,
    "mobilenet_tiny": _mobilenet_tiny,
    "vgg_cifar": _vgg_cifar,
}


def build_model(name: str, seed: int = 0) -> Any:
    """The model ``name`` with deterministic initial weights (``seed``)."""
    if name not in MODELS:
        raise ValueError(f"model: expected one of {sorted(MODELS)}, got {name!r}")
    torch = _torch()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return MODELS[name]()


def synthetic_batch(batch: int, seed: int, class_seed: int = 1234) -> tuple[Any, Any]:
    """A learnable synthetic CIFAR-shaped batch: each class has a fixed random pattern
    (from ``class_seed``, the same everywhere), samples are pattern + noise (from ``seed``)."""
    torch = _torch()
    g_cls = torch.Generator().manual_seed(class_seed)
    # spatially smooth patterns (a colour offset plus a 4x4 grid upsampled to 32x32) that a
    # convnet with global pooling can tell apart within a few steps
    colour = torch.randn((NUM_CLASSES, INPUT_SHAPE[0], 1, 1), generator=g_cls)
    coarse = torch.randn((NUM_CLASSES, INPUT_SHAPE[0], 4, 4), generator=g_cls)
    patterns = colour + torch.nn.functional.interpolate(coarse, size=INPUT_SHAPE[1:], mode="nearest")
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, NUM_CLASSES, (batch,), generator=g)
    x = patterns[y] + torch.randn((batch, *INPUT_SHAPE), generator=g)
    return x, y
