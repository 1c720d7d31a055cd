"""Record PyTorch train()-mode results for tests/training/test_batchnorm.py (needs torch).

    .venv-export/bin/python tests/training/torch_bn_reference.py   # writes data/bn_torch.npz

A Conv/BatchNorm network (the architecture of tests.training.models.cnn_bn) trained STEPS steps
with each optimizer below; the .npz holds the initial weights (ONNX initializer names), the
batches, and per optimizer the weights and running statistics after the last step. Only numpy
and torch are imported, so the side venv needs nothing else.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import torch
from torch import nn

STEPS, BATCH, CLASSES = 8, 16, 5
BN_MOMENTUM = 0.2   # PyTorch's convention; ONNX's momentum attribute is 1 - this = 0.8
OUT = Path(__file__).with_name("data") / "bn_torch.npz"


def initial_weights(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)

    def normal(shape: tuple[int, ...], scale: float) -> np.ndarray:
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    def bn(c: int) -> dict[str, np.ndarray]:
        return {"scale": 1 + normal((c,), 0.1), "bias": normal((c,), 0.1), "mean": normal((c,), 0.3),
                "var": (1 + 0.5 * rng.random(c)).astype(np.float32)}

    # no conv biases: a bias before BatchNorm gets a zero gradient (rounding noise), which Adam
    # normalizes into full-size steps of arbitrary sign
    out = {"conv1.w": normal((4, 1, 3, 3), math.sqrt(2 / 9))}
    out |= {f"bn1.{k}": v for k, v in bn(4).items()}
    out["conv2.w"] = normal((6, 4, 3, 3), math.sqrt(2 / 36))
    out |= {f"bn2.{k}": v for k, v in bn(6).items()}
    out |= {"fc.w": normal((96, CLASSES), math.sqrt(2 / 96)), "fc.b": np.zeros(CLASSES, np.float32)}
    return out


def data(seed: int = 1) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((STEPS, BATCH, 1, 8, 8)).astype(np.float32) * 2 + 0.5
    teacher = rng.standard_normal((64, CLASSES))
    return x, (x.reshape(STEPS, BATCH, 64) @ teacher).argmax(-1).astype(np.int64)


class Net(nn.Module):
    def __init__(self, w: dict[str, np.ndarray]) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 4, 3, 1, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(4, momentum=BN_MOMENTUM)
        self.conv2 = nn.Conv2d(4, 6, 3, 2, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(6, momentum=BN_MOMENTUM)
        self.fc = nn.Linear(96, CLASSES)
        with torch.no_grad():
            for name, value in self.onnx_names().items():
                value.copy_(torch.from_numpy(w[name].T.copy() if name == "fc.w" else w[name]))

    def onnx_names(self) -> dict[str, torch.Tensor]:
        out = {"conv1.w": self.conv1.weight, "conv2.w": self.conv2.weight,
               "fc.w": self.fc.weight, "fc.b": self.fc.bias}
        for i, bn in ((1, self.bn1), (2, self.bn2)):
            out |= {f"bn{i}.scale": bn.weight, f"bn{i}.bias": bn.bias, f"bn{i}.mean": bn.running_mean,
                    f"bn{i}.var": bn.running_var}
        return out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.bn1(self.conv1(x)))
        h = torch.relu(self.bn2(self.conv2(h)))
        return self.fc(h.flatten(1))


def warmup_cosine(t: int) -> float:
    """Linear warm-up over 3 steps, then cosine to 0.1 over 8 (the Schedule the test writes)."""
    cosine = 0.1 + 0.9 * (1 + math.cos(math.pi * min(t, 8) / 8)) / 2
    return cosine * min(1.0, (t + 1) / 3)


def train(kind: str) -> dict[str, np.ndarray]:
    torch.manual_seed(0)
    net = Net(initial_weights())
    net.train()
    smoothing, clip = (0.1, 0.5) if kind == "recipe" else (0.0, None)
    if kind == "sgd":
        opt: torch.optim.Optimizer = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
    elif kind == "adam":
        opt = torch.optim.Adam(net.parameters(), lr=0.01, eps=1e-8)
    else:
        # ONNX's Adam adds epsilon to sqrt(h) before the bias correction, PyTorch after it: the
        # clipped (small) gradients of "recipe" make that visible at eps 1e-8 (7e-5 on fc.w)
        eps = 1e-12 if kind == "recipe" else 1e-8
        opt = torch.optim.AdamW(net.parameters(), lr=0.01, eps=eps, weight_decay=0.05)
    schedule = torch.optim.lr_scheduler.LambdaLR(opt, warmup_cosine if kind == "recipe" else lambda t: 1.0)
    xs, ys = data()
    loss_fn = nn.CrossEntropyLoss(label_smoothing=smoothing)
    for x, y in zip(xs, ys):
        opt.zero_grad()
        loss = loss_fn(net(torch.from_numpy(x)), torch.from_numpy(y))
        loss.backward()
        if clip is not None:
            nn.utils.clip_grad_norm_(net.parameters(), clip)
        opt.step()
        schedule.step()
    return {k: (v.detach().numpy().T if k == "fc.w" else v.detach().numpy()).copy()
            for k, v in net.onnx_names().items()}


def main() -> None:
    torch.set_num_threads(1)
    x, y = data()
    arrays = {f"init/{k}": v for k, v in initial_weights().items()} | {"x": x, "y": y}
    for kind in ("sgd", "adam", "adamw", "recipe"):
        arrays |= {f"{kind}/{k}": v for k, v in train(kind).items()}
    np.savez_compressed(OUT, **arrays, torch_version=np.array(torch.__version__))
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
