"""Export tiny transformers and rewrite them with onnxruntime's transformer optimizer.

Most transformer ONNX files in the wild went through `onnxruntime.transformers.optimizer`, which
writes com.microsoft fusions (Attention, SkipLayerNormalization, EmbedLayerNormalization,
BiasGelu / FastGelu, ...). This script builds small real architectures with random weights
(Hugging Face BERT, GPT-2 with past key/values, ViT; hidden size 32, 2 layers), exports them with
torch's TorchScript exporter (the graph patterns the optimizer's fusions were written for),
optimizes them, and converts each result to float16 as well. It writes to models/ort/:

    <name>.onnx          the optimizer's output (float32)
    <name>_fp16.onnx     the same, float16 inside, float32 inputs and outputs (keep_io_types)
    <name>.npz           one set of inputs for the tests

and one more file, bert_tiny_ort_extended.onnx, that onnxruntime's own graph optimizer rewrote
at its extended level (what `optimize_model(..., only_onnxruntime=True)` or a session's
optimized_model_filepath save): LayerNormalization at opset 14, FusedMatMul, FusedGemm.

Run it in a side environment with torch, transformers < 5 and onnxruntime (not oxla's
dependencies; the tests need only the files):

    python3.11 -m venv .venv-export
    .venv-export/bin/pip install torch==2.13.0 onnx onnxruntime onnxscript "transformers<5"
    .venv-export/bin/python scripts/export_ort_optimized.py [--out models/ort]
"""

from __future__ import annotations

import argparse
import math
import os
import tempfile
import warnings
from collections import Counter
from collections.abc import Callable

import numpy as np
import onnx
import torch
from onnxruntime.transformers.optimizer import optimize_model
from torch import nn
from transformers import BertConfig, BertModel, ViTConfig, ViTModel
from transformers.models.vit import modeling_vit

warnings.filterwarnings("ignore")
torch.manual_seed(0)
RNG = np.random.default_rng(0)

HIDDEN, HEADS, LAYERS, FFN, VOCAB, POSITIONS = 32, 4, 2, 64, 64, 32
BATCH, SEQ, PAST = 2, 8, 5


def _randomize_norms(model: nn.Module) -> None:
    """LayerNorm weights away from (1, 0), so a wrong scale or shift cannot go unnoticed."""
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.LayerNorm):
                m.weight.uniform_(0.5, 1.5)
                m.bias.uniform_(-0.2, 0.2)


# --- the three models -----------------------------------------------------------------------


def bert() -> tuple[nn.Module, dict[str, np.ndarray], list[str]]:
    config = BertConfig(vocab_size=VOCAB, hidden_size=HIDDEN, num_hidden_layers=LAYERS,
                        num_attention_heads=HEADS, intermediate_size=FFN,
                        max_position_embeddings=POSITIONS, type_vocab_size=2,
                        attn_implementation="eager")
    model = BertModel(config)
    mask = np.ones((BATCH, SEQ), np.int64)
    mask[1, 5:] = 0  # a right-padded second sequence
    feeds = {"input_ids": RNG.integers(0, VOCAB, (BATCH, SEQ)).astype(np.int64),
             "attention_mask": mask,
             "token_type_ids": (np.arange(SEQ) >= SEQ // 2).astype(np.int64)[None].repeat(BATCH, 0)}
    return model, feeds, ["last_hidden_state", "pooler_output"]


class Conv1D(nn.Module):
    """GPT-2's linear layer: x @ W + b through addmm (Reshape, Gemm, Reshape once exported)."""

    def __init__(self, nf: int, nx: int) -> None:
        super().__init__()
        self.nf = nf
        self.weight = nn.Parameter(torch.randn(nx, nf) * 0.2)
        self.bias = nn.Parameter(torch.randn(nf) * 0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.addmm(self.bias, x.view(-1, x.size(-1)), self.weight)
        return out.view(*x.size()[:-1], self.nf)


class GPT2Attention(nn.Module):
    """Masked self-attention over a (2, B, N, P, H) past, written as transformers 4.x had it."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("bias", torch.tril(torch.ones(POSITIONS, POSITIONS, dtype=torch.uint8))
                             .view(1, 1, POSITIONS, POSITIONS))
        self.register_buffer("masked_bias", torch.tensor(-1e4))
        self.c_attn, self.c_proj = Conv1D(3 * HIDDEN, HIDDEN), Conv1D(HIDDEN, HIDDEN)

    def _heads(self, x: torch.Tensor, key: bool = False) -> torch.Tensor:
        x = x.view(*x.size()[:-1], HEADS, x.size(-1) // HEADS)
        return x.permute(0, 2, 3, 1) if key else x.permute(0, 2, 1, 3)

    def forward(self, x, past, mask):  # type: ignore[no-untyped-def]
        query, key, value = self.c_attn(x).split(HIDDEN, dim=2)
        query, key, value = self._heads(query), self._heads(key, True), self._heads(value)
        key = torch.cat((past[0].transpose(-2, -1), key), dim=-1)
        value = torch.cat((past[1], value), dim=-2)
        present = torch.stack((key.transpose(-2, -1), value))
        w = torch.matmul(query, key) / (float(value.size(-1)) ** 0.5)
        nd, ns = w.size(-2), w.size(-1)
        w = torch.where(self.bias[:, :, ns - nd:ns, :ns].bool(), w, self.masked_bias.to(w.dtype))
        w = torch.softmax(w + mask, dim=-1)
        a = torch.matmul(w, value).permute(0, 2, 1, 3).contiguous()
        return self.c_proj(a.view(*a.size()[:-2], HIDDEN)), present


class GPT2Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.ln_1, self.ln_2 = nn.LayerNorm(HIDDEN), nn.LayerNorm(HIDDEN)
        self.attn = GPT2Attention()
        self.c_fc, self.c_proj = Conv1D(FFN, HIDDEN), Conv1D(HIDDEN, FFN)

    def forward(self, x, past, mask):  # type: ignore[no-untyped-def]
        a, present = self.attn(self.ln_1(x), past, mask)
        x = x + a
        h = self.c_fc(self.ln_2(x))
        h = 0.5 * h * (1 + torch.tanh(math.sqrt(2 / math.pi) * (h + 0.044715 * torch.pow(h, 3))))
        return x + self.c_proj(h), present


class GPT2WithPast(nn.Module):
    """GPT-2 (tied LM head) as transformers 4.x wrote it, the graph the optimizer's GPT-2
    attention fusion matches; transformers 4.5x's Cache objects and masks export differently."""

    def __init__(self) -> None:
        super().__init__()
        self.wte, self.wpe = nn.Embedding(VOCAB, HIDDEN), nn.Embedding(POSITIONS, HIDDEN)
        self.h = nn.ModuleList(GPT2Block() for _ in range(LAYERS))
        self.ln_f = nn.LayerNorm(HIDDEN)

    def forward(self, input_ids, position_ids, attention_mask, *past):  # type: ignore[no-untyped-def]
        mask = attention_mask.view(input_ids.size(0), -1)[:, None, None, :].to(torch.float32)
        mask = (1.0 - mask) * -10000.0
        x = self.wte(input_ids) + self.wpe(position_ids)
        presents = []
        for block, layer_past in zip(self.h, past):
            x, present = block(x, layer_past, mask)
            presents.append(present)
        return (torch.matmul(self.ln_f(x), self.wte.weight.t()), *presents)


def gpt2() -> tuple[nn.Module, dict[str, np.ndarray], list[str]]:
    model = GPT2WithPast()
    step = 2
    mask = np.ones((BATCH, PAST + step), np.int64)
    mask[1, :2] = 0  # a left-padded second sequence, as generation batches are
    feeds = {"input_ids": RNG.integers(0, VOCAB, (BATCH, step)).astype(np.int64),
             "position_ids": np.array([[PAST, PAST + 1], [PAST - 2, PAST - 1]], np.int64),
             "attention_mask": mask}
    for i in range(LAYERS):
        feeds[f"past_{i}"] = RNG.standard_normal((2, BATCH, HEADS, PAST, HIDDEN // HEADS)).astype(np.float32)
    return model, feeds, ["logits", *(f"present_{i}" for i in range(LAYERS))]


def _vit_attention(module, query, key, value, attention_mask, scaling, dropout=0.0, **kwargs):  # type: ignore[no-untyped-def]
    """ViT's attention as transformers 4.2x wrote it (scores / sqrt(d)): the optimizer's pattern."""
    scores = torch.matmul(query, key.transpose(-1, -2)) / math.sqrt(query.size(-1))
    probs = torch.softmax(scores, dim=-1)
    return torch.matmul(probs, value).transpose(1, 2).contiguous(), probs


def vit() -> tuple[nn.Module, dict[str, np.ndarray], list[str]]:
    config = ViTConfig(image_size=16, patch_size=4, hidden_size=HIDDEN, num_hidden_layers=LAYERS,
                       num_attention_heads=HEADS, intermediate_size=FFN, num_channels=3,
                       attn_implementation="eager")
    modeling_vit.eager_attention_forward = _vit_attention
    model = ViTModel(config, add_pooling_layer=False)
    feeds = {"pixel_values": RNG.standard_normal((BATCH, 3, 16, 16)).astype(np.float32)}
    return model, feeds, ["last_hidden_state"]


Maker = Callable[[], tuple[nn.Module, dict[str, np.ndarray], list[str]]]
# name -> (model, optimizer model_type, onnxruntime's own graph optimizer only, float16 copy)
MODELS: dict[str, tuple[Maker, str, bool, bool]] = {
    "bert_tiny": (bert, "bert", False, True),
    "gpt2_tiny_past": (gpt2, "gpt2", False, True),
    "vit_tiny": (vit, "vit", False, True),
    # onnxruntime's C++ fusions saved at the extended level: LayerNormalization at opset 14,
    # FusedMatMul, FusedGemm, BiasGelu
    "bert_tiny_ort_extended": (bert, "bert", True, False),
}


# --- export, optimize, convert --------------------------------------------------------------


def _dynamic_axes(feeds: dict[str, np.ndarray], outputs: list[str]) -> dict[str, dict[int, str]]:
    axes: dict[str, dict[int, str]] = {}
    for name, value in feeds.items():
        if name.startswith("past_"):
            axes[name] = {1: "batch", 3: "past_sequence"}
        elif value.ndim == 2:
            axes[name] = {0: "batch", 1: "total_sequence" if name == "attention_mask" else "sequence"}
        else:
            axes[name] = {0: "batch"}
    for name in outputs:
        axes[name] = {1: "batch", 3: "total_sequence"} if name.startswith("present_") else {0: "batch"}
    return axes


def _export(model: nn.Module, feeds: dict[str, np.ndarray], outputs: list[str], path: str) -> None:
    model.eval()
    _randomize_norms(model)
    args = tuple(torch.from_numpy(v) for v in feeds.values())
    torch.onnx.export(model, args, path, dynamo=False, opset_version=14,
                      input_names=list(feeds), output_names=outputs,
                      dynamic_axes=_dynamic_axes(feeds, outputs))


def _ops(model: onnx.ModelProto) -> str:
    counts = Counter(f"{n.domain + '::' if n.domain else ''}{n.op_type}" for n in model.graph.node)
    return ", ".join(f"{op} x{c}" for op, c in sorted(counts.items()))


def build(name: str, out: str) -> None:
    make, model_type, only_onnxruntime, fp16 = MODELS[name]
    model, feeds, outputs = make()
    with tempfile.TemporaryDirectory() as tmp:
        raw = os.path.join(tmp, "raw.onnx")
        with torch.no_grad():
            _export(model, feeds, outputs, raw)
        optimized = optimize_model(raw, model_type=model_type, num_heads=HEADS, hidden_size=HIDDEN,
                                   opt_level=2 if only_onnxruntime else 0, use_gpu=False,
                                   only_onnxruntime=only_onnxruntime)
    optimized.save_model_to_file(f"{out}/{name}.onnx")
    np.savez(f"{out}/{name}.npz", **feeds)
    print(f"{name}: {_ops(optimized.model)}")
    if fp16:
        optimized.convert_float_to_float16(keep_io_types=True)
        optimized.save_model_to_file(f"{out}/{name}_fp16.onnx")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="models/ort")
    out = parser.parse_args().out
    os.makedirs(out, exist_ok=True)
    for name in MODELS:
        build(name, out)


if __name__ == "__main__":
    main()
