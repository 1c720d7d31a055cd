"""The PyTorch side of benchmarks/finetune.py, run by a Python that has torch (not an oxla
dependency). A ResNet-18-class network (torchvision's BasicBlock layout with BatchNorm, at a
quarter of the widths), trained with SGD momentum and a warm-up cosine schedule.

    python benchmarks/finetune_torch.py export OUT.onnx     # the initial weights, BN kept
    python benchmarks/finetune_torch.py curve INIT.onnx STEPS BATCH OUT.npz [float64]  # eager losses
    python benchmarks/finetune_torch.py serve INIT.onnx [THREADS]  # timing: JSON commands on stdin
    python benchmarks/finetune_torch.py plot CURVES.npz OUT.png   # matplotlib

serve answers one JSON line per command: {"mode": "eager"|"compile", "batch": B, "steps": K}
runs K steps and answers {"ms": [...]}; the first command of a (mode, batch) builds it (and for
"compile", compiles it). The weights come from INIT.onnx, so both sides start equal.
"""

from __future__ import annotations

import json
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import onnx
import torch
from onnx import numpy_helper
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.finetune_common import (
    BN_MOMENTUM,
    CLASSES,
    LR,
    MOMENTUM,
    SIDE,
    WIDTHS,
    digits,
    images,
    lr_factor,
    order,
)

warnings.filterwarnings("ignore")


def _bn(c: int) -> nn.BatchNorm2d:
    return nn.BatchNorm2d(c, momentum=BN_MOMENTUM)


class BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = _bn(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = _bn(cout)
        self.down = None
        if stride != 1 or cin != cout:
            self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), _bn(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.down is None else self.down(x)
        out = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(self.bn2(self.conv2(out)) + identity)


class ResNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, WIDTHS[0], 7, 2, 3, bias=False), _bn(WIDTHS[0]),
                                  nn.ReLU(), nn.MaxPool2d(3, 2, 1))
        layers, cin = [], WIDTHS[0]
        for i, w in enumerate(WIDTHS):
            layers += [BasicBlock(cin, w, 1 if i == 0 else 2), BasicBlock(w, w, 1)]
            cin = w
        self.layers = nn.Sequential(*layers)
        self.fc = nn.Linear(cin, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.flatten(torch.mean(self.layers(self.stem(x)), dim=(2, 3)), 1))


def export(path: str) -> None:
    torch.manual_seed(0)
    net = ResNet().eval()
    with torch.no_grad():  # as after pre-training; distinct values also keep the legacy exporter
        for m in net.modules():  # from sharing equal initializers (all-ones BN scales) via Identity
            if isinstance(m, nn.BatchNorm2d):
                m.weight.uniform_(0.5, 1.5)
                m.bias.uniform_(-0.2, 0.2)
                m.running_mean.uniform_(-0.2, 0.2)
                m.running_var.uniform_(0.5, 1.5)
    # the legacy exporter keeps BatchNormalization (the dynamo one folds it into Conv in eval mode)
    torch.onnx.export(net, (torch.randn(2, 3, SIDE, SIDE),), path, dynamo=False, opset_version=17,
                      do_constant_folding=False, training=torch.onnx.TrainingMode.EVAL,
                      input_names=["image"], output_names=["logits"],
                      dynamic_axes={"image": {0: "batch"}, "logits": {0: "batch"}})
    torch.save(net.state_dict(), Path(path).with_suffix(".pt"))


def load(init: str) -> ResNet:
    """The network with the exported initial weights (state_dict saved beside the .onnx)."""
    net = ResNet()
    net.load_state_dict(torch.load(Path(init).with_suffix(".pt")))
    onnx_weights = {t.name: numpy_helper.to_array(t) for t in onnx.load(init).graph.initializer}
    fc = onnx_weights.get("fc.weight")
    if fc is not None and not np.array_equal(fc, net.fc.weight.detach().numpy()):
        raise RuntimeError(f"{init} and its .pt disagree")
    return net.train()


def recipe(net: nn.Module, total: int) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
    opt = torch.optim.SGD(net.parameters(), lr=LR, momentum=MOMENTUM)
    return opt, torch.optim.lr_scheduler.LambdaLR(opt, lambda t: lr_factor(t, total))


def curve(init: str, steps: int, batch: int, out: str, dtype: str = "float32") -> None:
    net = load(init).to(getattr(torch, dtype))
    opt, sched = recipe(net, steps)
    x, y = digits()
    loss_fn = nn.CrossEntropyLoss()
    losses = []
    for idx in order(len(x), steps, batch):
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(net(torch.from_numpy(images(x[idx]).astype(dtype))), torch.from_numpy(y[idx]))
        loss.backward()
        opt.step()
        sched.step()
        losses.append(float(loss.detach()))
    np.savez(out, losses=np.array(losses), fc=net.fc.weight.detach().numpy())


def _timed_step(init: str, mode: str, batch: int) -> tuple:
    """A step function on one fixed batch (compiled by inductor for mode "compile"), and its
    schedule."""
    net = load(init)
    opt, sched = recipe(net, 10_000)
    x, y = digits()
    idx = order(len(x), 1, batch)[0]
    image, labels = torch.from_numpy(images(x[idx])), torch.from_numpy(y[idx])
    if mode == "compile":
        net.forward = torch.compile(net.forward)  # forward and backward through inductor
    loss_fn = nn.CrossEntropyLoss()

    def step() -> torch.Tensor:
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(net(image), labels)
        loss.backward()
        opt.step()
        return loss

    return step, sched


def serve(init: str, threads: str = "") -> None:
    if threads:
        torch.set_num_threads(int(threads))
    built: dict[tuple[str, int], tuple] = {}
    print(json.dumps({"torch": torch.__version__, "threads": torch.get_num_threads()}), flush=True)
    for line in sys.stdin:
        cmd = json.loads(line)
        key = (cmd["mode"], cmd["batch"])
        if key not in built:
            built[key] = _timed_step(init, *key)
        step, sched = built[key]
        times = []
        for _ in range(cmd["steps"]):
            start = time.perf_counter()
            float(step().detach())
            sched.step()
            times.append((time.perf_counter() - start) * 1e3)
        print(json.dumps({"ms": times}), flush=True)


def plot(curves: str, out: str) -> None:
    """Left: the float32 loss curves of both; right: |oxla - PyTorch| per step, float32 and
    float64. A small PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    data = np.load(curves)
    steps = np.arange(1, len(data["oxla"]) + 1)
    fig, (left, right) = plt.subplots(1, 2, figsize=(9, 3.4), dpi=80)
    left.plot(steps, data["torch"], color="tab:orange", lw=3, alpha=0.55, label="PyTorch eager")
    left.plot(steps, data["oxla"], color="tab:blue", lw=1, label="oxla")
    left.set_xlabel("step")
    left.set_ylabel("training loss (batch mean)")
    left.set_title(f"ResNet-18-class + BN, float32, batch {int(data['batch'])}", fontsize=10)
    left.legend()
    pairs = [("oxla", "torch", "tab:red", "oxla - PyTorch, float32")]
    if "oxla64" in data:
        pairs += [("torch", "torch64", "tab:purple", "PyTorch float32 - float64"),
                  ("oxla64", "torch64", "tab:green", "oxla - PyTorch, float64")]
    for a, b, color, label in pairs:
        n = min(len(data[a]), len(data[b]), 40)
        gap = np.abs(data[a][:n] - data[b][:n])
        right.semilogy(np.arange(1, n + 1), np.maximum(gap, 1e-16), color=color, lw=1, marker=".",
                       label=label)
    right.set_xlabel("step")
    right.set_title("|loss difference| (first 40 steps)", fontsize=10)
    right.legend()
    fig.tight_layout()
    fig.savefig(out)
    plt.close(fig)


def main(argv: list[str]) -> int:
    if argv[0] == "export":
        export(argv[1])
    elif argv[0] == "plot":
        plot(argv[1], argv[2])
    elif argv[0] == "curve":
        curve(argv[1], int(argv[2]), int(argv[3]), argv[4], *argv[5:6])
    else:
        serve(argv[1], *argv[2:3])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
