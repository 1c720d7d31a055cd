"""Export the small real-architecture models the tests and `make run` use, with PyTorch's exporters.

Run with a Python that has torch (not a dependency of oxla; the tests need only the .onnx files):

    python scripts/export_models.py [--out models]

Widths are reduced so the files stay small; the architectures are the real ones (torchvision's
ResNet BasicBlock layout, MobileNetV2 inverted residuals, nn.TransformerEncoder, a scripted module
with data-dependent If/Loop, and a detector head ending in NonMaxSuppression).
"""

from __future__ import annotations

import argparse
import os
import warnings

import torch
from torch import nn

warnings.filterwarnings("ignore")
torch.manual_seed(0)


# --- torchvision-style ResNet (BasicBlock, layers [2, 2, 2, 2]) ---------------------------------

class BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.relu = nn.ReLU(inplace=True)
        self.down = None
        if stride != 1 or cin != cout:
            self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.down is None else self.down(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + identity)


class ResNet(nn.Module):
    def __init__(self, widths: tuple[int, ...] = (8, 16, 32, 64), classes: int = 10) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, widths[0], 7, 2, 3, bias=False), nn.BatchNorm2d(widths[0]),
                                  nn.ReLU(inplace=True), nn.MaxPool2d(3, 2, 1))
        layers, cin = [], widths[0]
        for i, w in enumerate(widths):
            layers += [BasicBlock(cin, w, 1 if i == 0 else 2), BasicBlock(w, w, 1)]
            cin = w
        self.layers = nn.Sequential(*layers)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(cin, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.flatten(self.pool(self.layers(self.stem(x))), 1))


# --- MobileNetV2-style inverted residuals (depthwise convs, ReLU6) ------------------------------

class InvertedResidual(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int, expand: int) -> None:
        super().__init__()
        hidden = cin * expand
        self.use_res = stride == 1 and cin == cout
        self.block = nn.Sequential(
            nn.Conv2d(cin, hidden, 1, bias=False), nn.BatchNorm2d(hidden), nn.ReLU6(inplace=True),
            nn.Conv2d(hidden, hidden, 3, stride, 1, groups=hidden, bias=False), nn.BatchNorm2d(hidden),
            nn.ReLU6(inplace=True),
            nn.Conv2d(hidden, cout, 1, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.block(x) if self.use_res else self.block(x)


class MobileNet(nn.Module):
    def __init__(self, classes: int = 10) -> None:
        super().__init__()
        cfg = [(16, 1, 1), (24, 2, 4), (24, 1, 4), (32, 2, 4), (32, 1, 4), (64, 2, 4)]
        layers: list[nn.Module] = [nn.Conv2d(3, 16, 3, 2, 1, bias=False), nn.BatchNorm2d(16), nn.ReLU6()]
        cin = 16
        for cout, stride, expand in cfg:
            layers.append(InvertedResidual(cin, cout, stride, expand))
            cin = cout
        self.features = nn.Sequential(*layers)
        self.head = nn.Sequential(nn.Dropout(0.2), nn.Linear(cin, classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x).mean((2, 3)))


# --- a transformer encoder (BERT-style, reduced) ------------------------------------------------

class Encoder(nn.Module):
    def __init__(self, vocab: int = 100, d: int = 64, heads: int = 4, layers: int = 2) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.pos = nn.Parameter(torch.randn(1, 32, d) * 0.02)
        layer = nn.TransformerEncoderLayer(d, heads, 4 * d, dropout=0.0, activation="gelu",
                                           batch_first=True, norm_first=False)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(d)
        self.cls = nn.Linear(d, 2)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = self.embed(ids) + self.pos[:, : ids.shape[1]]
        h = self.norm(self.encoder(h))
        return self.cls(h[:, 0])


# --- data-dependent control flow (TorchScript -> If and Loop) -----------------------------------

class ControlFlow(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor, steps: torch.Tensor) -> torch.Tensor:
        h = self.lin(x)
        if bool(h.sum() > 0):
            h = torch.relu(h)
        else:
            h = torch.tanh(h) * 2.0
        for _ in range(int(steps)):
            h = self.lin(h) * 0.5 + h
        return h


# --- detector head with NonMaxSuppression (the way torchvision.ops.nms exports) -----------------

class NMSFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, boxes, scores, max_out, iou, score_thr):  # type: ignore[override]
        n = boxes.shape[1]
        idx = torch.arange(min(n, 5), dtype=torch.int64)
        return torch.stack([torch.zeros_like(idx), torch.zeros_like(idx), idx], 1)

    @staticmethod
    def symbolic(g, boxes, scores, max_out, iou, score_thr):  # type: ignore[no-untyped-def]
        return g.op("NonMaxSuppression", boxes, scores, max_out, iou, score_thr, center_point_box_i=0)


class Detector(nn.Module):
    def __init__(self, anchors: int = 64) -> None:
        super().__init__()
        self.backbone = nn.Sequential(nn.Conv2d(3, 16, 3, 2, 1), nn.ReLU(), nn.Conv2d(16, 32, 3, 2, 1),
                                      nn.ReLU(), nn.AdaptiveAvgPool2d(4), nn.Flatten())
        self.box = nn.Linear(32 * 16, anchors * 4)
        self.score = nn.Linear(32 * 16, anchors)
        self.anchors = anchors

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        f = self.backbone(x)
        raw = self.box(f).reshape(-1, self.anchors, 4)
        xy = torch.sigmoid(raw[..., :2]) * 64.0
        wh = torch.exp(raw[..., 2:].clamp(max=2.0)) * 8.0
        boxes = torch.cat([xy - wh / 2, xy + wh / 2], -1)
        scores = torch.sigmoid(self.score(f)).reshape(-1, 1, self.anchors)
        keep = NMSFunction.apply(boxes, scores, torch.tensor([10]), torch.tensor([0.5]), torch.tensor([0.3]))
        return keep, boxes[0].index_select(0, keep[:, 2])


def _randomize_bn(model: nn.Module) -> None:
    """Non-trivial BatchNorm statistics, so inference really uses the stored ones."""
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.uniform_(-0.2, 0.2)
            m.running_var.uniform_(0.5, 1.5)
            m.weight.data.uniform_(0.5, 1.5)
            m.bias.data.uniform_(-0.2, 0.2)


def export(out: str) -> None:
    os.makedirs(out, exist_ok=True)
    cnn = ResNet().eval()
    _randomize_bn(cnn)
    torch.onnx.export(cnn, (torch.randn(1, 3, 64, 64),), f"{out}/resnet_small.onnx", dynamo=True,
                      input_names=["image"], output_names=["logits"],
                      dynamic_shapes={"x": {0: torch.export.Dim("batch", max=64)}}, external_data=False)
    mobile = MobileNet().eval()
    _randomize_bn(mobile)
    torch.onnx.export(mobile, (torch.randn(1, 3, 64, 64),), f"{out}/mobilenet_small.onnx", dynamo=False,
                      opset_version=13, input_names=["image"], output_names=["logits"],
                      dynamic_axes={"image": {0: "batch"}, "logits": {0: "batch"}})
    enc = Encoder().eval()
    ids = torch.randint(0, 100, (2, 16))
    torch.onnx.export(enc, (ids,), f"{out}/transformer_encoder.onnx", dynamo=True,
                      input_names=["ids"], output_names=["logits"], external_data=False,
                      dynamic_shapes={"ids": {0: torch.export.Dim("batch", max=64),
                                              1: torch.export.Dim("seq", max=32)}})
    flow = torch.jit.script(ControlFlow().eval())
    torch.onnx.export(flow, (torch.randn(2, 8), torch.tensor(3)), f"{out}/control_flow.onnx", dynamo=False,
                      opset_version=17, input_names=["x", "steps"], output_names=["y"],
                      dynamic_axes={"x": {0: "batch"}})
    det = Detector().eval()
    torch.onnx.export(det, (torch.randn(1, 3, 64, 64),), f"{out}/detector_nms.onnx", dynamo=False,
                      opset_version=13, input_names=["image"], output_names=["selected", "boxes"])


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", default="models")
    export(parser.parse_args().out)
