"""The PyTorch-eager side of benchmarks/training.py, run by a Python that has torch.

    .venv-export/bin/python benchmarks/torch_training.py      # then reads commands on stdin

Protocol (one JSON object per line): {"model": "mlp"|"resnet18", "batch": B, "steps": K} runs K
training steps and answers {"ms": [per-step milliseconds]}; the first command for a model builds
it. The architectures match benchmarks/training.py's ONNX models layer for layer.
"""

from __future__ import annotations

import json
import sys
import time

import torch
from torch import nn


def mlp(sizes: tuple[int, ...] = (784, 1024, 1024, 1024, 10)) -> nn.Module:
    layers: list[nn.Module] = []
    for i in range(len(sizes) - 1):
        layers.append(nn.Linear(sizes[i], sizes[i + 1]))
        if i < len(sizes) - 2:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


class Block(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1)
        self.short = nn.Conv2d(cin, cout, 1, stride) if stride != 1 or cin != cout else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.conv2(torch.relu(self.conv1(x)))
        return torch.relu(h + (x if self.short is None else self.short(x)))


def resnet18(classes: int = 1000) -> nn.Module:
    layers: list[nn.Module] = [nn.Conv2d(3, 64, 7, 2, 3), nn.ReLU(), nn.Conv2d(64, 64, 3, 2, 1), nn.ReLU()]
    cin = 64
    for cout, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
        layers += [Block(cin, cout, stride), Block(cout, cout, 1)]
        cin = cout
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(512, classes)]
    return nn.Sequential(*layers)


def _setup(model: str, batch: int) -> tuple[nn.Module, torch.optim.Optimizer, torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    net = mlp() if model == "mlp" else resnet18()
    shape = (batch, 784) if model == "mlp" else (batch, 3, 112, 112)
    x = torch.randn(shape)
    y = torch.randint(0, 10, (batch,))
    return net, torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9), x, y


def main() -> int:
    built: dict[tuple[str, int], tuple] = {}
    loss_fn = nn.CrossEntropyLoss()
    print(json.dumps({"torch": torch.__version__, "threads": torch.get_num_threads()}), flush=True)
    for line in sys.stdin:
        cmd = json.loads(line)
        key = (cmd["model"], cmd["batch"])
        if key not in built:
            built[key] = _setup(*key)
        net, opt, x, y = built[key]
        times = []
        for _ in range(cmd["steps"]):
            start = time.perf_counter()
            opt.zero_grad(set_to_none=True)
            loss = loss_fn(net(x), y)
            loss.backward()
            opt.step()
            float(loss.detach())
            times.append((time.perf_counter() - start) * 1e3)
        print(json.dumps({"ms": times}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
