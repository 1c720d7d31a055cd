"""Export the benchmark suite's models (random weights, fixed seed) with PyTorch's exporter.

Run with a Python that has torch and transformers (neither is a dependency of oxla):

    python scripts/export_bench_models.py [--out benchmarks/.cache/suite] [--models a,b]

Writes `<name>.onnx` and `<name>.npz` (one sample of feeds, keyed by input name) per model, for
`python -m benchmarks.suite`. Architectures are written by hand after their reference layouts
(torchvision is not importable with this torch) or come from transformers' config classes with
random initialisation; nothing is downloaded. BatchNorm statistics are randomised so inference
really uses them; the TorchScript exporter folds them into the convolutions as an eval export does.
"""

from __future__ import annotations

import argparse
import os
import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import torch
from export_models import _randomize_bn  # scripts/ is on sys.path when run as a script
from onnx import TensorProto, helper
from torch import nn
from torch.nn import functional as F

warnings.filterwarnings("ignore")
OPSET = 17


def _bn_relu(cin: int, cout: int, k: int, stride: int = 1, groups: int = 1,
             act: type[nn.Module] | None = nn.ReLU) -> nn.Sequential:
    layers: list[nn.Module] = [nn.Conv2d(cin, cout, k, stride, k // 2, groups=groups, bias=False),
                               nn.BatchNorm2d(cout)]
    if act is not None:
        layers.append(act())
    return nn.Sequential(*layers)


# --- ResNet-50 (torchvision layout: Bottleneck [3, 4, 6, 3], v1.5 stride on the 3x3) -------------

class Bottleneck(nn.Module):
    def __init__(self, cin: int, width: int, stride: int, cout: int = 0, groups: int = 1) -> None:
        super().__init__()
        cout = cout or width * 4
        self.body = nn.Sequential(_bn_relu(cin, width, 1), _bn_relu(width, width, 3, stride, groups),
                                  _bn_relu(width, cout, 1, act=None))
        self.down = (_bn_relu(cin, cout, 1, stride, act=None) if stride != 1 or cin != cout
                     else nn.Identity())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(self.body(x) + self.down(x))


class ResNet50(nn.Module):
    """ResNet-50; with widths (128, 256, 512, 1024), expansion 2 and 32 groups ResNeXt-50 32x4d."""

    def __init__(self, classes: int = 1000, widths: tuple[int, ...] = (64, 128, 256, 512),
                 expansion: int = 4, groups: int = 1) -> None:
        super().__init__()
        layers: list[nn.Module] = [_bn_relu(3, 64, 7, 2), nn.MaxPool2d(3, 2, 1)]
        cin = 64
        for stage, (blocks, width) in enumerate(zip((3, 4, 6, 3), widths)):
            for i in range(blocks):
                layers.append(Bottleneck(cin, width, 2 if i == 0 and stage > 0 else 1,
                                         width * expansion, groups))
                cin = width * expansion
        self.features = nn.Sequential(*layers)
        self.fc = nn.Linear(cin, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(self.features(x), 1), 1))


# --- ResNeXt-50 32x4d (torchvision layout: ResNet-50's, its 3x3 in 32 groups, width x2) ----------

def _resnext50() -> nn.Module:
    return ResNet50(widths=(128, 256, 512, 1024), expansion=2, groups=32)


# --- MobileNetV3-small (torchvision's config: hardswish, SE with hardsigmoid, depthwise) ---------

class SqueezeExcite(nn.Module):
    def __init__(self, c: int, squeeze: int, gate: type[nn.Module] = nn.Hardsigmoid,
                 act: type[nn.Module] = nn.ReLU) -> None:
        super().__init__()
        self.fc1 = nn.Conv2d(c, squeeze, 1)
        self.fc2 = nn.Conv2d(squeeze, c, 1)
        self.act = act()
        self.gate = gate()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s = F.adaptive_avg_pool2d(x, 1)
        return x * self.gate(self.fc2(self.act(self.fc1(s))))


def _make_divisible(v: float, d: int = 8) -> int:
    return max(d, int(v + d / 2) // d * d)


class InvertedResidualV3(nn.Module):
    def __init__(self, cin: int, k: int, exp: int, cout: int, se: bool, hs: bool, stride: int) -> None:
        super().__init__()
        act = nn.Hardswish if hs else nn.ReLU
        layers: list[nn.Module] = []
        if exp != cin:
            layers.append(_bn_relu(cin, exp, 1, act=act))
        layers.append(_bn_relu(exp, exp, k, stride, groups=exp, act=act))
        if se:
            layers.append(SqueezeExcite(exp, _make_divisible(exp // 4)))
        layers.append(_bn_relu(exp, cout, 1, act=None))
        self.block = nn.Sequential(*layers)
        self.res = stride == 1 and cin == cout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.block(x) if self.res else self.block(x)


class MobileNetV3Small(nn.Module):
    CFG = ((16, 3, 16, 16, True, False, 2), (16, 3, 72, 24, False, False, 2),
           (24, 3, 88, 24, False, False, 1), (24, 5, 96, 40, True, True, 2),
           (40, 5, 240, 40, True, True, 1), (40, 5, 240, 40, True, True, 1),
           (40, 5, 120, 48, True, True, 1), (48, 5, 144, 48, True, True, 1),
           (48, 5, 288, 96, True, True, 2), (96, 5, 576, 96, True, True, 1),
           (96, 5, 576, 96, True, True, 1))

    def __init__(self, classes: int = 1000) -> None:
        super().__init__()
        layers: list[nn.Module] = [_bn_relu(3, 16, 3, 2, act=nn.Hardswish)]
        layers += [InvertedResidualV3(*c) for c in self.CFG]
        layers.append(_bn_relu(96, 576, 1, act=nn.Hardswish))
        self.features = nn.Sequential(*layers)
        self.head = nn.Sequential(nn.Linear(576, 1024), nn.Hardswish(), nn.Linear(1024, classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.flatten(F.adaptive_avg_pool2d(self.features(x), 1), 1))


# --- ShuffleNetV2 x1.0 (channel split, channel shuffle, depthwise) -------------------------------

def _shuffle(x: torch.Tensor, groups: int = 2) -> torch.Tensor:
    n, c, h, w = x.shape
    return x.view(n, groups, c // groups, h, w).transpose(1, 2).reshape(n, c, h, w)


class ShuffleUnit(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.stride = stride
        half = cout // 2
        if stride > 1:
            self.left = nn.Sequential(_bn_relu(cin, cin, 3, stride, groups=cin, act=None),
                                      _bn_relu(cin, half, 1))
        self.right = nn.Sequential(_bn_relu(cin if stride > 1 else half, half, 1),
                                   _bn_relu(half, half, 3, stride, groups=half, act=None),
                                   _bn_relu(half, half, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.stride == 1:
            a, b = x.chunk(2, dim=1)
            out = torch.cat([a, self.right(b)], 1)
        else:
            out = torch.cat([self.left(x), self.right(x)], 1)
        return _shuffle(out)


class ShuffleNetV2(nn.Module):
    def __init__(self, classes: int = 1000, widths: tuple[int, ...] = (116, 232, 464)) -> None:
        super().__init__()
        layers: list[nn.Module] = [_bn_relu(3, 24, 3, 2), nn.MaxPool2d(3, 2, 1)]
        cin = 24
        for repeats, w in zip((4, 8, 4), widths):
            for i in range(repeats):
                layers.append(ShuffleUnit(cin, w, 2 if i == 0 else 1))
                cin = w
        layers.append(_bn_relu(cin, 1024, 1))
        self.features = nn.Sequential(*layers)
        self.fc = nn.Linear(1024, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.features(x).mean((2, 3)))


# --- EfficientNet-B0 (MBConv: SiLU, SE, depthwise 3x3/5x5) --------------------------------------

class MBConv(nn.Module):
    """EfficientNet's block; with ReLU6 and no squeeze-excitation MobileNetV2's inverted residual."""

    def __init__(self, cin: int, cout: int, k: int, stride: int, expand: int,
                 act: type[nn.Module] = nn.SiLU, se: bool = True) -> None:
        super().__init__()
        exp = cin * expand
        layers: list[nn.Module] = []
        if expand != 1:
            layers.append(_bn_relu(cin, exp, 1, act=act))
        layers.append(_bn_relu(exp, exp, k, stride, groups=exp, act=act))
        if se:
            layers.append(SqueezeExcite(exp, max(1, cin // 4), gate=nn.Sigmoid, act=nn.SiLU))
        layers.append(_bn_relu(exp, cout, 1, act=None))
        self.block = nn.Sequential(*layers)
        self.res = stride == 1 and cin == cout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.block(x) if self.res else self.block(x)


class EfficientNetB0(nn.Module):
    CFG = ((1, 3, 1, 16, 1), (6, 3, 2, 24, 2), (6, 5, 2, 40, 2), (6, 3, 2, 80, 3),
           (6, 5, 1, 112, 3), (6, 5, 2, 192, 4), (6, 3, 1, 320, 1))  # expand, k, stride, out, repeats

    def __init__(self, classes: int = 1000, cfg: tuple[tuple[int, ...], ...] = CFG,
                 act: type[nn.Module] = nn.SiLU, se: bool = True) -> None:
        super().__init__()
        layers: list[nn.Module] = [_bn_relu(3, 32, 3, 2, act=act)]
        cin = 32
        for expand, k, stride, cout, repeats in cfg:
            for i in range(repeats):
                layers.append(MBConv(cin, cout, k, stride if i == 0 else 1, expand, act, se))
                cin = cout
        layers.append(_bn_relu(cin, 1280, 1, act=act))
        self.features = nn.Sequential(*layers)
        self.fc = nn.Linear(1280, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(self.features(x), 1), 1))



# MobileNetV2 (torchvision's config): EfficientNet-B0's layout with ReLU6 (torch exports it as
# Clip with Constant bounds), 3x3 depthwise kernels and no squeeze-excitation
MOBILENETV2_CFG = ((1, 3, 1, 16, 1), (6, 3, 2, 24, 2), (6, 3, 2, 32, 3), (6, 3, 2, 64, 4),
                   (6, 3, 1, 96, 3), (6, 3, 2, 160, 3), (6, 3, 1, 320, 1))


def _mobilenetv2() -> nn.Module:
    return EfficientNetB0(cfg=MOBILENETV2_CFG, act=nn.ReLU6, se=False)

# --- a GRU text classifier (embedding, 2-layer bidirectional GRU, linear) -----------------------

class GRUText(nn.Module):
    def __init__(self, vocab: int = 20000, d: int = 128, hidden: int = 256, classes: int = 4) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.rnn = nn.GRU(d, hidden, num_layers=2, batch_first=True, bidirectional=True)
        self.fc = nn.Linear(2 * hidden, classes)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        out, _ = self.rnn(self.embed(ids))
        return self.fc(out.mean(1))


# --- a single-shot detector with NonMaxSuppression at the end ------------------------------------

class NMS(torch.autograd.Function):
    """Exports as ONNX NonMaxSuppression (the way torchvision.ops.nms does); eager is a stub."""

    @staticmethod
    def forward(ctx, boxes, scores, max_out, iou, score_thr):  # type: ignore[no-untyped-def, override]
        return torch.zeros((1, 3), dtype=torch.int64)

    @staticmethod
    def symbolic(g, boxes, scores, max_out, iou, score_thr):  # type: ignore[no-untyped-def]
        return g.op("NonMaxSuppression", boxes, scores, max_out, iou, score_thr, center_point_box_i=0)


class Detector(nn.Module):
    """Conv backbone to stride 16 (20x20 at 320), 3 anchors per cell, 8 classes: 1200 boxes."""

    def __init__(self, size: int = 320, anchors: int = 3, classes: int = 8) -> None:
        super().__init__()
        self.backbone = nn.Sequential(
            _bn_relu(3, 32, 3, 2), _bn_relu(32, 32, 3, 1, groups=32), _bn_relu(32, 64, 1),
            _bn_relu(64, 64, 3, 2, groups=64), _bn_relu(64, 128, 1),
            _bn_relu(128, 128, 3, 2, groups=128), _bn_relu(128, 256, 1),
            _bn_relu(256, 256, 3, 2, groups=256), _bn_relu(256, 256, 1))
        self.box = nn.Conv2d(256, anchors * 4, 3, 1, 1)
        self.cls = nn.Conv2d(256, anchors * classes, 3, 1, 1)
        cells = size // 16
        ys, xs = torch.meshgrid(torch.arange(cells), torch.arange(cells), indexing="ij")
        centers = torch.stack([xs, ys], -1).float().add(0.5).mul(16.0)
        self.register_buffer("centers", centers.reshape(-1, 1, 2).expand(-1, anchors, 2).reshape(-1, 2))
        self.register_buffer("sizes", torch.tensor([[32.0, 32.0], [64.0, 32.0], [32.0, 64.0]]).repeat(cells * cells, 1))
        self.classes = classes

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        f = self.backbone(x)
        n = x.shape[0]
        raw = self.box(f).permute(0, 2, 3, 1).reshape(n, -1, 4)
        xy = self.centers + torch.tanh(raw[..., :2]) * 16.0
        wh = self.sizes * torch.exp(raw[..., 2:].clamp(max=2.0))
        boxes = torch.cat([xy - wh / 2, xy + wh / 2], -1)
        scores = torch.sigmoid(self.cls(f).permute(0, 2, 3, 1).reshape(n, -1, self.classes)).transpose(1, 2)
        keep = NMS.apply(boxes, scores, torch.tensor([50]), torch.tensor([0.5]), torch.tensor([0.3]))
        return keep, boxes, scores


# --- a DBNet-style text segmenter (ResNet-18-class backbone, FPN with Resize, ConvTranspose head) -

class BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.body = nn.Sequential(_bn_relu(cin, cout, 3, stride), _bn_relu(cout, cout, 3, act=None))
        self.down = _bn_relu(cin, cout, 1, stride, act=None) if stride != 1 or cin != cout else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(self.body(x) + self.down(x))


class DBNet(nn.Module):
    def __init__(self, widths: tuple[int, ...] = (64, 128, 256, 512), inner: int = 256) -> None:
        super().__init__()
        self.stem = nn.Sequential(_bn_relu(3, 64, 7, 2), nn.MaxPool2d(3, 2, 1))
        stages, cin = [], 64
        for i, w in enumerate(widths):
            stages.append(nn.Sequential(BasicBlock(cin, w, 1 if i == 0 else 2), BasicBlock(w, w, 1)))
            cin = w
        self.stages = nn.ModuleList(stages)
        self.lateral = nn.ModuleList(nn.Conv2d(w, inner, 1, bias=False) for w in widths)
        self.smooth = nn.ModuleList(nn.Conv2d(inner, inner // 4, 3, 1, 1, bias=False) for _ in widths)
        self.head = nn.Sequential(
            _bn_relu(inner, inner // 4, 3),
            nn.ConvTranspose2d(inner // 4, inner // 4, 2, 2), nn.BatchNorm2d(inner // 4), nn.ReLU(),
            nn.ConvTranspose2d(inner // 4, 1, 2, 2), nn.Sigmoid())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        feats, h = [], self.stem(x)
        for stage in self.stages:
            h = stage(h)
            feats.append(h)
        lat = [conv(f) for conv, f in zip(self.lateral, feats)]
        for i in range(len(lat) - 2, -1, -1):  # top-down: upsample and add
            lat[i] = lat[i] + F.interpolate(lat[i + 1], scale_factor=2.0, mode="nearest")
        outs = [F.interpolate(conv(p), scale_factor=2.0 ** i, mode="nearest")
                for i, (conv, p) in enumerate(zip(self.smooth, lat))]
        return self.head(torch.cat(outs[::-1], 1))


# --- a tiny voice-activity model (Silero-VAD-like: STFT conv, conv1d encoder, LSTM, sigmoid) -----

class VAD(nn.Module):
    def __init__(self, hidden: int = 64) -> None:
        super().__init__()
        self.stft = nn.Conv1d(1, 130, 128, 64, bias=False)  # real and imaginary bins as one conv
        self.encoder = nn.Sequential(
            nn.Conv1d(65, 64, 3, 1, 1), nn.ReLU(), nn.Conv1d(64, 64, 3, 2, 1), nn.ReLU(),
            nn.Conv1d(64, hidden, 3, 1, 1), nn.ReLU())
        self.lstm = nn.LSTM(hidden, hidden, batch_first=True)
        self.out = nn.Linear(hidden, 1)

    def forward(self, x: torch.Tensor, h: torch.Tensor, c: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        spec = self.stft(F.pad(x.unsqueeze(1), (32, 32), mode="reflect"))
        re, im = spec[:, :65], spec[:, 65:]
        mag = torch.sqrt(re * re + im * im + 1e-6)
        feats = self.encoder(torch.log1p(mag)).transpose(1, 2)
        out, (h, c) = self.lstm(feats, (h, c))
        prob = torch.sigmoid(self.out(out)).mean((1, 2))
        return prob, h, c


# --- transformers: BERT-base and ViT-S/16 with random weights -----------------------------------

class HFWrapper(nn.Module):
    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, *args: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        out = self.model(*args, return_dict=True)
        return out.last_hidden_state, out.pooler_output


def _bert() -> nn.Module:
    from transformers import BertConfig, BertModel

    return HFWrapper(BertModel(BertConfig(attn_implementation="eager")))


def _vit() -> nn.Module:
    from transformers import ViTConfig, ViTModel

    cfg = ViTConfig(hidden_size=384, num_hidden_layers=12, num_attention_heads=6, intermediate_size=1536,
                    image_size=224, patch_size=16, attn_implementation="eager")
    return HFWrapper(ViTModel(cfg))


# --- the suite ----------------------------------------------------------------------------------

def _image(size: int = 224) -> dict[str, np.ndarray]:
    return {"image": np.random.default_rng(0).standard_normal((1, 3, size, size)).astype(np.float32)}


Spec = tuple[Callable[[], nn.Module], Callable[[], dict[str, np.ndarray]], list[str], dict[str, dict[int, str]]]

SUITE: dict[str, Spec] = {
    "mobilenetv3_small": (MobileNetV3Small, _image, ["logits"], {}),
    "shufflenetv2": (ShuffleNetV2, _image, ["logits"], {}),
    "efficientnet_b0": (EfficientNetB0, _image, ["logits"], {}),
    "resnet50": (ResNet50, _image, ["logits"], {}),
    "mobilenetv2": (_mobilenetv2, _image, ["logits"], {}),
    "resnext50": (_resnext50, _image, ["logits"], {}),
    "gru_text": (GRUText, lambda: {"ids": np.random.default_rng(0).integers(0, 20000, (1, 50))},
                 ["logits"], {}),
    "detector_nms": (Detector, lambda: _image(320), ["selected", "boxes", "scores"], {}),
    "dbnet": (DBNet, lambda: _image(320), ["prob"], {}),
    "vad": (VAD, lambda: {"chunk": np.random.default_rng(0).standard_normal((1, 512)).astype(np.float32),
                          "h": np.zeros((1, 1, 64), np.float32), "c": np.zeros((1, 1, 64), np.float32)},
            ["prob", "h_out", "c_out"], {}),
    "bert_base": (_bert, lambda: {"input_ids": np.random.default_rng(0).integers(0, 30522, (1, 128)),
                                  "attention_mask": np.ones((1, 128), np.int64)},
                  ["last_hidden_state", "pooled"], {}),
    "vit_s16": (_vit, lambda: {"pixel_values": _image()["image"]}, ["last_hidden_state", "pooled"], {}),
}


def _int64(feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {k: v.astype(np.int64) if v.dtype.kind in "iu" else v for k, v in feeds.items()}


def export_one(name: str, out: Path) -> None:
    """Build `name` with seed 0, export it (TorchScript exporter, opset 17) and its sample feeds."""
    torch.manual_seed(0)
    build, make_feeds, outputs, dynamic = SUITE[name]
    model = build().eval()
    _randomize_bn(model)
    feeds = _int64(make_feeds())
    args = tuple(torch.from_numpy(v) for v in feeds.values())
    tmp = out / f"{name}.tmp.onnx"
    with torch.no_grad():
        torch.onnx.export(model, args, str(tmp), dynamo=False, opset_version=OPSET,
                          input_names=list(feeds), output_names=outputs, dynamic_axes=dynamic or None)
    proto = onnx.load(str(tmp))
    if name == "detector_nms":
        _gather_kept_boxes(proto)
    onnx.checker.check_model(proto, full_check=True)
    onnx.save(proto, str(tmp))
    os.replace(tmp, out / f"{name}.onnx")
    np.savez(out / f"{name}.npz", **feeds)
    print(f"{name}: {os.path.getsize(out / f'{name}.onnx') / 1e6:.1f} MB", flush=True)


def _gather_kept_boxes(model: onnx.ModelProto) -> None:
    """Add the detector's usual tail: the kept boxes, gathered by NonMaxSuppression's box indices."""
    g = model.graph
    const = {"kept_col": [2], "kept_axes": [1]}
    g.node.extend([helper.make_node("Constant", [], [k], value=helper.make_tensor(k, TensorProto.INT64, [1], v))
                   for k, v in const.items()])
    g.node.extend([
        helper.make_node("Constant", [], ["zero"], value=helper.make_tensor("zero", TensorProto.INT64, [], [0])),
        helper.make_node("Gather", ["selected", "kept_col"], ["kept_idx2"], axis=1),
        helper.make_node("Squeeze", ["kept_idx2", "kept_axes"], ["kept_idx"]),
        helper.make_node("Gather", ["boxes", "zero"], ["boxes0"], axis=0),
        helper.make_node("Gather", ["boxes0", "kept_idx"], ["kept_boxes"], axis=0),
    ])
    g.output.append(helper.make_tensor_value_info("kept_boxes", TensorProto.FLOAT, ["kept", 4]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="benchmarks/.cache/suite")
    parser.add_argument("--models", default=",".join(SUITE))
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(1)
    for name in args.models.split(","):
        export_one(name, out)


if __name__ == "__main__":
    main()
