"""Published architectures for inference profiles (defined in PyTorch, random weights, fp32).

* ``resnet50``      He et al. CVPR 2016, bottleneck blocks [3, 4, 6, 3], 3x224x224
* ``mobilenet_v2``  Sandler et al. CVPR 2018, width 1.0, 3x224x224
* ``vgg16``         Simonyan & Zisserman ICLR 2015, configuration D (no BN), 3x224x224
* ``bert_base``     Devlin et al. NAACL 2019, 12 layers, hidden 768, 12 heads, FFN 3072,
                    sequence 128 (token ids, no padding mask), pooler + 2-way classifier
* ``deepspeech2``   Amodei et al. ICML 2016 style: 2 conv layers (41x11 s2x2, 21x11 s2x1,
                    32 channels, BN + hardtanh), 5 bidirectional GRU layers (hidden 800),
                    linear to 29 characters; input a 2 s spectrogram: 161 bins x 200 frames
                    (20 ms window, 10 ms hop at 16 kHz)
* ``densenet121``   Huang et al. CVPR 2017, growth 32, blocks [6, 12, 24, 16], 3x224x224
* ``vit_b16``       Dosovitskiy et al. ICLR 2021, patch 16, 12 layers, hidden 768, 3x224x224
* ``bilstm``        the Keras IMDB example: embedding 20,000 x 128, two bidirectional
                    LSTM(64) layers, one sigmoid output, 200 token ids

``TRAIN_MODELS`` are the zoo's training models defined here (``bench/cpu_scaling.py`` trains them).

The real-workload models (what the local backend's inference server serves) are in
:mod:`reamer.workloads.real.nets`; :func:`reamer.calibration.inference.measure` takes both.
"""

from __future__ import annotations

import math
from pathlib import Path

MODELS = ("resnet50", "mobilenet_v2", "vgg16", "bert_base", "deepspeech2")
TRAIN_MODELS = ("resnet50", "mobilenet_v2", "vgg16", "densenet121", "vit_b16", "bert_base", "bilstm")


def build_model(torch, name: str):
    """(module in eval mode, example input for batch 1, input description)."""
    nn = torch.nn
    torch.manual_seed(0)

    def conv_bn(cin, cout, k, s=1, groups=1, act=nn.ReLU):
        layers = [nn.Conv2d(cin, cout, k, s, (k - 1) // 2, groups=groups, bias=False), nn.BatchNorm2d(cout)]
        if act is not None:
            layers.append(act(inplace=True))
        return nn.Sequential(*layers)

    if name == "resnet50":

        class Bottleneck(nn.Module):
            def __init__(self, cin, width, stride):
                super().__init__()
                self.body = nn.Sequential(conv_bn(cin, width, 1), conv_bn(width, width, 3, stride),
                                          conv_bn(width, 4 * width, 1, act=None))  # fmt: skip
                self.down = (conv_bn(cin, 4 * width, 1, stride, act=None)
                             if stride != 1 or cin != 4 * width else nn.Identity())  # fmt: skip
                self.relu = nn.ReLU(inplace=True)

            def forward(self, x):
                return self.relu(self.body(x) + self.down(x))

        layers: list = [conv_bn(3, 64, 7, 2), nn.MaxPool2d(3, 2, 1)]
        cin = 64
        for width, blocks, stride in ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)):
            for i in range(blocks):
                layers.append(Bottleneck(cin, width, stride if i == 0 else 1))
                cin = 4 * width
        layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(2048, 1000)]
        return nn.Sequential(*layers).eval(), torch.randn(1, 3, 224, 224), "3x224x224 image"

    if name == "mobilenet_v2":

        class InvertedResidual(nn.Module):
            def __init__(self, cin, cout, stride, t):
                super().__init__()
                hid = cin * t
                layers = [conv_bn(cin, hid, 1, act=nn.ReLU6)] if t != 1 else []
                layers += [conv_bn(hid, hid, 3, stride, groups=hid, act=nn.ReLU6), conv_bn(hid, cout, 1, act=None)]
                self.body = nn.Sequential(*layers)
                self.res = stride == 1 and cin == cout

            def forward(self, x):
                return x + self.body(x) if self.res else self.body(x)

        layers = [conv_bn(3, 32, 3, 2, act=nn.ReLU6)]
        cin = 32
        for t, c, n, s in ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2),
                           (6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1)):  # fmt: skip
            for i in range(n):
                layers.append(InvertedResidual(cin, c, s if i == 0 else 1, t))
                cin = c
        layers += [conv_bn(320, 1280, 1, act=nn.ReLU6), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                   nn.Dropout(0.2), nn.Linear(1280, 1000)]  # fmt: skip
        return nn.Sequential(*layers).eval(), torch.randn(1, 3, 224, 224), "3x224x224 image"

    if name == "vgg16":
        layers, cin = [], 3
        for v in (64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512, "M"):
            if v == "M":
                layers.append(nn.MaxPool2d(2, 2))
            else:
                layers += [nn.Conv2d(cin, v, 3, padding=1), nn.ReLU(inplace=True)]
                cin = v
        layers += [nn.Flatten(), nn.Linear(512 * 7 * 7, 4096), nn.ReLU(True), nn.Dropout(),
                   nn.Linear(4096, 4096), nn.ReLU(True), nn.Dropout(), nn.Linear(4096, 1000)]  # fmt: skip
        return nn.Sequential(*layers).eval(), torch.randn(1, 3, 224, 224), "3x224x224 image"

    if name == "bert_base":
        hidden, heads, ffn, n_layers, seq, vocab = 768, 12, 3072, 12, 128, 30522

        class Layer(nn.Module):
            def __init__(self):
                super().__init__()
                self.qkv = nn.Linear(hidden, 3 * hidden)
                self.out = nn.Linear(hidden, hidden)
                self.ln1 = nn.LayerNorm(hidden, eps=1e-12)
                self.ff = nn.Sequential(nn.Linear(hidden, ffn), nn.GELU(), nn.Linear(ffn, hidden))
                self.ln2 = nn.LayerNorm(hidden, eps=1e-12)

            def forward(self, x):
                b, t, _ = x.shape
                q, k, v = self.qkv(x).view(b, t, 3, heads, hidden // heads).permute(2, 0, 3, 1, 4)
                att = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(hidden // heads), dim=-1)
                ctx = (att @ v).transpose(1, 2).reshape(b, t, hidden)
                x = self.ln1(x + self.out(ctx))
                return self.ln2(x + self.ff(x))

        class Bert(nn.Module):
            def __init__(self):
                super().__init__()
                self.tok = nn.Embedding(vocab, hidden)
                self.pos = nn.Parameter(torch.randn(1, seq, hidden) * 0.02)
                self.typ = nn.Parameter(torch.randn(1, 1, hidden) * 0.02)  # segment 0 only
                self.ln = nn.LayerNorm(hidden, eps=1e-12)
                self.layers = nn.ModuleList(Layer() for _ in range(n_layers))
                self.pool = nn.Linear(hidden, hidden)
                self.cls = nn.Linear(hidden, 2)

            def forward(self, ids):
                x = self.ln(self.tok(ids) + self.pos + self.typ)
                for layer in self.layers:
                    x = layer(x)
                return self.cls(torch.tanh(self.pool(x[:, 0])))

        return Bert().eval(), torch.randint(0, vocab, (1, seq)), f"{seq} token ids"

    if name == "deepspeech2":
        bins, frames, hidden, n_rnn, chars = 161, 200, 800, 5, 29

        class DS2(nn.Module):
            def __init__(self):
                super().__init__()
                self.conv = nn.Sequential(
                    nn.Conv2d(1, 32, (41, 11), (2, 2), (20, 5), bias=False), nn.BatchNorm2d(32), nn.Hardtanh(0, 20),
                    nn.Conv2d(32, 32, (21, 11), (2, 1), (10, 5), bias=False), nn.BatchNorm2d(32), nn.Hardtanh(0, 20),
                )  # fmt: skip
                f = (bins + 1) // 2
                f = (f + 1) // 2
                self.rnn = nn.GRU(32 * f, hidden, n_rnn, batch_first=True, bidirectional=True)
                self.fc = nn.Linear(2 * hidden, chars)

            def forward(self, spec):  # spec: (batch, 1, bins, frames)
                x = self.conv(spec)
                b, c, f, t = x.shape
                x = x.permute(0, 3, 1, 2).reshape(b, t, c * f)
                x, _ = self.rnn(x)
                return self.fc(x).log_softmax(-1)

        return DS2().eval(), torch.randn(1, 1, bins, frames), f"2 s spectrogram, {bins} bins x {frames} frames"

    if name == "densenet121":
        growth, bn_size = 32, 4

        class Dense(nn.Module):
            def __init__(self, cin):
                super().__init__()
                self.body = nn.Sequential(nn.BatchNorm2d(cin), nn.ReLU(inplace=True),
                                          nn.Conv2d(cin, bn_size * growth, 1, bias=False),
                                          nn.BatchNorm2d(bn_size * growth), nn.ReLU(inplace=True),
                                          nn.Conv2d(bn_size * growth, growth, 3, padding=1, bias=False))  # fmt: skip

            def forward(self, x):
                return torch.cat([x, self.body(x)], 1)

        layers = [conv_bn(3, 64, 7, 2), nn.MaxPool2d(3, 2, 1)]
        cin = 64
        for i, n in enumerate((6, 12, 24, 16)):
            for _ in range(n):
                layers.append(Dense(cin))
                cin += growth
            if i < 3:
                layers += [nn.BatchNorm2d(cin), nn.ReLU(inplace=True), nn.Conv2d(cin, cin // 2, 1, bias=False),
                           nn.AvgPool2d(2, 2)]  # fmt: skip
                cin //= 2
        layers += [nn.BatchNorm2d(cin), nn.ReLU(inplace=True), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                   nn.Linear(cin, 1000)]  # fmt: skip
        return nn.Sequential(*layers).eval(), torch.randn(1, 3, 224, 224), "3x224x224 image"

    if name == "vit_b16":
        hidden, heads, ffn, n_layers, patch = 768, 12, 3072, 12, 16

        class ViT(nn.Module):
            def __init__(self):
                super().__init__()
                self.embed = nn.Conv2d(3, hidden, patch, patch)
                self.cls_tok = nn.Parameter(torch.zeros(1, 1, hidden))
                self.pos = nn.Parameter(torch.randn(1, (224 // patch) ** 2 + 1, hidden) * 0.02)
                layer = nn.TransformerEncoderLayer(hidden, heads, ffn, 0.0, "gelu", batch_first=True, norm_first=True)
                self.enc = nn.TransformerEncoder(layer, n_layers, enable_nested_tensor=False)
                self.ln = nn.LayerNorm(hidden)
                self.head = nn.Linear(hidden, 1000)

            def forward(self, img):
                x = self.embed(img).flatten(2).transpose(1, 2)
                x = torch.cat([self.cls_tok.expand(x.shape[0], -1, -1), x], 1) + self.pos
                return self.head(self.ln(self.enc(x))[:, 0])

        return ViT().eval(), torch.randn(1, 3, 224, 224), "3x224x224 image"

    if name == "bilstm":
        vocab, emb, hid, seq = 20000, 128, 64, 200

        class BiLSTM(nn.Module):
            def __init__(self):
                super().__init__()
                self.emb = nn.Embedding(vocab, emb)
                self.l1 = nn.LSTM(emb, hid, batch_first=True, bidirectional=True)
                self.l2 = nn.LSTM(2 * hid, hid, batch_first=True, bidirectional=True)
                self.out = nn.Linear(2 * hid, 1)

            def forward(self, ids):
                x, _ = self.l1(self.emb(ids))
                _, (h, _) = self.l2(x)
                return torch.sigmoid(self.out(torch.cat([h[0], h[1]], 1)))

        return BiLSTM().eval(), torch.randint(0, vocab, (1, seq)), f"{seq} token ids"

    raise ValueError(f"unknown model {name!r}")


def export(torch, model, x, path: Path) -> None:
    with torch.no_grad():
        torch.onnx.export(model, (x,), str(path), input_names=["input"], output_names=["output"],
                          dynamic_axes={"input": {0: "batch"}, "output": {0: "batch"}},
                          opset_version=17, dynamo=False)  # fmt: skip

