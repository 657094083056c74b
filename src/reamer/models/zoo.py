"""Model zoo: published sizes and FLOPs of the training workloads NEARCHUS's papers use.

FLOPs are forward FLOPs per sample = 2 × multiply-accumulates, at the resolution / sequence
length given. ``gpu_samples_per_s`` is fp32 training throughput of one V100-class GPU from
NVIDIA's published DeepLearningExamples/MLPerf-style results (order of magnitude; only GPU
jobs use it). ``input_core_s_per_sample`` is CPU input-pipeline cost per sample for GPU jobs:
~8.6 ms per ImageNet image (decode + augment; Mohan et al., "Analyzing and Mitigating Data
Stalls in DNN Training", VLDB 2021, ~24 cores per V100 for ~2,800 img/s), tokenized text ~1 ms.

The ``*_cifar10`` entries are the same networks as Keras applications built for CIFAR-10
(``input_shape=(32, 32, 3)``, a 10-way classifier), the workloads of NEARCHUS's reference list:
derived from the published figures, not published themselves. Parameters: the published count
less the 1000-way classifier plus a 10-way one. FLOPs: a convolution's cost is proportional to
its output map's area, and with "same" padding and strides that divide both 224 and 32 every
map shrinks by the input's ratio, so the published FLOPs scale by (32/224)² = 1/49. (Inception-v3
has no such entry: its "valid" padding makes the ratio differ from stage to stage.) GPU figures
are not derived (CPU training only).
"""

from __future__ import annotations

from dataclasses import replace

from reamer.models.training import ModelProfile

_IMG = 0.0086  # core-s per ImageNet image, input pipeline (Mohan et al. VLDB 2021)
_TXT = 0.001  # core-s per pre-tokenized text sample

ZOO: dict[str, ModelProfile] = {
    m.name: m
    for m in (
        ModelProfile("resnet50", 25.6, 8.2, 32, 390.0, _IMG, "He et al. CVPR 2016; 4.1 GMACs @224"),
        ModelProfile("vgg16", 138.4, 31.0, 32, 230.0, _IMG, "Simonyan & Zisserman ICLR 2015; 15.5 GMACs @224"),
        ModelProfile("inception_v3", 23.8, 11.4, 32, 250.0, _IMG, "Szegedy et al. CVPR 2016; 5.7 GMACs @299"),
        ModelProfile("mobilenet_v2", 3.5, 0.6, 64, 1200.0, _IMG, "Sandler et al. CVPR 2018; 300M MACs @224"),
        ModelProfile("densenet121", 8.0, 5.7, 32, 350.0, _IMG, "Huang et al. CVPR 2017; 2.87 GMACs @224"),
        ModelProfile("nasnet_mobile", 5.3, 1.13, 64, 700.0, _IMG, "Zoph et al. CVPR 2018; 564M MACs @224"),
        ModelProfile("bert_base", 110.0, 22.5, 16, 100.0, _TXT, "Devlin et al. NAACL 2019; ≈2·86M·128 FLOPs, seq 128"),
        ModelProfile("gpt2_small", 124.0, 127.0, 8, 25.0, _TXT, "Radford et al. 2019; Kaplan et al. 2020 2N FLOPs/token, seq 512"),
        ModelProfile("vit_b16", 86.6, 35.1, 32, 180.0, _IMG, "Dosovitskiy et al. ICLR 2021; 17.6 GMACs @224"),
        ModelProfile("bilstm", 2.76, 0.079, 64, 5000.0, _TXT, "Keras IMDB BiLSTM example: 2×BiLSTM(64), emb 128, len 200"),
    )
}


def _cifar10(name: str, features: int) -> ModelProfile:
    """``name`` built for CIFAR-10: its ``features``-wide 1000-way classifier replaced by a
    10-way one, its FLOPs scaled from 224 to 32 px (see the module docstring)."""
    m = ZOO[name]
    params = m.params_m - (features * 1000 + 1000) / 1e6 + (features * 10 + 10) / 1e6
    return replace(m, name=f"{name}_cifar10", params_m=round(params, 4), fwd_gflops=round(m.fwd_gflops / 49, 5),
                   gpu_samples_per_s=0.0,
                   source=f"{m.source}; CIFAR-10 at 32 px: FLOPs × (32/224)², classifier {features}×1000 → {features}×10")


ZOO.update((m.name, m) for m in (
    _cifar10("resnet50", 2048),
    _cifar10("mobilenet_v2", 1280),
    _cifar10("densenet121", 1024),
    _cifar10("nasnet_mobile", 1056),
))
