"""Export the small converter-made models of models/converters/ (skl2onnx, onnxmltools, tf2onnx, paddle2onnx).

Each converter family lives in its own virtual environment (tensorflow and the scikit-learn
stack do not share one happily; none of them is a dependency of oxla, and the tests need only
the .onnx files):

    python3.11 -m venv /tmp/venv-skl && /tmp/venv-skl/bin/pip install skl2onnx onnxmltools lightgbm xgboost
    /tmp/venv-skl/bin/python scripts/export_converters.py sklearn [--out models/converters]

    python3.11 -m venv /tmp/venv-tf && /tmp/venv-tf/bin/pip install tensorflow tf2onnx
    /tmp/venv-tf/bin/python scripts/export_converters.py keras [--out models/converters]

    python3.11 -m venv /tmp/venv-paddle && /tmp/venv-paddle/bin/pip install paddlepaddle paddle2onnx packaging
    /tmp/venv-paddle/bin/python scripts/export_converters.py paddle [--out models/converters]

(paddle2onnx 2.1 pins onnx 1.17 and imports `packaging` without declaring it; paddle.onnx.export
folds constants with polygraphy, which installs onnxruntime into that environment on first use.)

Models are trained for a few steps on generated data (no downloads): what matters is the graph
each converter writes (ZipMap, TreeEnsemble, Tokenizer + TfIdfVectorizer, OneHotEncoder,
Resize tf_half_pixel_for_nn, RNNs), not their accuracy. Tested by tests/test_converters.py.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from typing import Any

import numpy as np

RNG = np.random.default_rng(0)
TEXTS = ["the cat sat on the mat", "dogs and cats, living together!", "a quick brown fox",
         "jumps over the lazy dog.", "cats; dogs; birds", "(hello) world: it's me",
         "nothing to see here", "the end?"]


def _save(out: str, name: str, model: Any) -> None:
    path = os.path.join(out, f"{name}.onnx")
    with open(path, "wb") as f:
        f.write(model.SerializeToString())
    print(f"{path}: {os.path.getsize(path)} bytes")


# --- scikit-learn (skl2onnx) and boosters (onnxmltools) ---------------------------------------

def _tabular() -> tuple[np.ndarray, np.ndarray]:
    x = RNG.standard_normal((120, 4)).astype(np.float32)
    y = (x[:, 0] + 0.5 * x[:, 1] > 0).astype(np.int64) + (x[:, 2] > 1).astype(np.int64)
    return x, y


def export_sklearn(out: str) -> None:
    from lightgbm import LGBMClassifier
    from onnxmltools import convert_lightgbm, convert_xgboost
    from onnxmltools.convert.common.data_types import FloatTensorType as MLFloat
    from skl2onnx import to_onnx
    from skl2onnx.common.data_types import FloatTensorType, Int64TensorType, StringTensorType
    from sklearn.ensemble import RandomForestClassifier
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import OneHotEncoder, StandardScaler
    from sklearn.svm import LinearSVC
    from xgboost import XGBClassifier

    x, y = _tabular()
    floats = [("x", FloatTensorType([None, 4]))]
    pipe = make_pipeline(StandardScaler(), LogisticRegression(max_iter=200)).fit(x, y)
    _save(out, "skl_scaler_logreg", to_onnx(pipe, initial_types=floats, target_opset=17))  # ZipMap kept
    forest = RandomForestClassifier(n_estimators=5, max_depth=4, random_state=0).fit(x, y)
    _save(out, "skl_random_forest", to_onnx(forest, initial_types=floats, target_opset=17,
                                            options={"zipmap": False}))
    labels = [i % 2 for i in range(len(TEXTS))]
    text = make_pipeline(TfidfVectorizer(), LinearSVC()).fit(TEXTS, labels)
    # skl2onnx 1.20 hands LinearSVC the default zipmap option it then rejects: any explicit
    # option for it avoids that
    _save(out, "skl_tfidf_linearsvc", to_onnx(text, initial_types=[("text", StringTensorType([None, 1]))],
                                              target_opset=17,
                                              options={LinearSVC: {"output_class_labels": False}}))
    cats = np.array([["red", "small"], ["blue", "large"], ["green", "small"], ["red", "large"]], dtype=object)
    onehot = OneHotEncoder(handle_unknown="ignore").fit(cats)
    _save(out, "skl_onehot", to_onnx(onehot, initial_types=[("cats", StringTensorType([None, 2]))],
                                     target_opset=17))
    ints = RNG.integers(0, 5, (20, 3))
    onehot_int = OneHotEncoder(handle_unknown="ignore").fit(ints)
    _save(out, "skl_onehot_int", to_onnx(onehot_int, initial_types=[("codes", Int64TensorType([None, 3]))],
                                         target_opset=17))
    # onnxmltools 1.16 converts to opset 15 at most
    lgbm = LGBMClassifier(n_estimators=8, num_leaves=7, verbose=-1).fit(x, y)
    _save(out, "lgbm_classifier", convert_lightgbm(lgbm, initial_types=[("x", MLFloat([None, 4]))],
                                                   target_opset=15, zipmap=False))
    xgb = XGBClassifier(n_estimators=8, max_depth=3).fit(x, y)
    _save(out, "xgb_classifier", convert_xgboost(xgb, initial_types=[("x", MLFloat([None, 4]))],
                                                 target_opset=15))


# --- Keras (tf2onnx) ------------------------------------------------------------------------------

def export_keras(out: str) -> None:
    import tensorflow as tf
    import tf2onnx

    tf.random.set_seed(0)

    def convert(name: str, fn: Callable[..., Any], spec: list[Any]) -> None:
        model, _ = tf2onnx.convert.from_function(tf.function(fn), input_signature=spec, opset=17)
        _save(out, name, model)

    k = tf.keras
    cnn = k.Sequential([k.Input((8, 8, 3)), k.layers.Conv2D(4, 3, padding="same", activation="relu"),
                        k.layers.MaxPooling2D(2), k.layers.UpSampling2D(2),
                        k.layers.UpSampling2D(2, interpolation="bilinear"), k.layers.Conv2D(2, 1)])
    # Keras 3 writes UpSampling2D "nearest" as a repeat (Tile in ONNX); tf.image.resize nearest
    # (half_pixel_centers) is what tf2onnx writes as Resize tf_half_pixel_for_nn
    convert("keras_cnn_upsampling", lambda x: tf.image.resize(cnn(x), (24, 20), method="nearest"),
            [tf.TensorSpec([None, 8, 8, 3], tf.float32, "x")])
    for kind, layer in [("lstm", k.layers.LSTM), ("gru", k.layers.GRU)]:
        rnn = k.Sequential([k.Input((None,), dtype="int32"), k.layers.Embedding(50, 8),
                            k.layers.Bidirectional(layer(6)), k.layers.Dense(2, activation="softmax")])
        convert(f"keras_bi{kind}_text", lambda t, rnn=rnn: rnn(t),
                [tf.TensorSpec([None, None], tf.int32, "tokens")])


# --- PaddlePaddle (paddle2onnx, through paddle.onnx.export as users call it) ----------------------

def export_paddle(out: str) -> None:
    import paddle
    from paddle import nn
    from paddle.nn import functional as F

    paddle.seed(0)

    class ConvBlocks(nn.Layer):
        """PP-LCNet-like: conv + BN + hardswish, depthwise conv, squeeze-excite with paddle's
        hardsigmoid (slope 1/6), max pooling with ceil_mode, adaptive average pooling."""

        def __init__(self) -> None:
            super().__init__()
            self.stem, self.bn = nn.Conv2D(3, 8, 3, stride=2, padding=1), nn.BatchNorm2D(8)
            self.dw, self.dw_bn = nn.Conv2D(8, 8, 3, padding=1, groups=8), nn.BatchNorm2D(8)
            self.se1, self.se2 = nn.Conv2D(8, 4, 1), nn.Conv2D(4, 8, 1)
            self.pw, self.fc = nn.Conv2D(8, 16, 1), nn.Linear(16, 5)

        def forward(self, x: Any) -> Any:
            y = F.hardswish(self.bn(self.stem(x)))
            y = F.hardswish(self.dw_bn(self.dw(y)))
            y = y * F.hardsigmoid(self.se2(F.relu(self.se1(F.adaptive_avg_pool2d(y, 1)))))
            y = F.max_pool2d(F.relu6(self.pw(y)), 3, stride=2, ceil_mode=True)
            return F.softmax(self.fc(paddle.flatten(F.adaptive_avg_pool2d(y, 1), 1)), axis=-1)

    class Text(nn.Layer):
        """Embedding, a recurrent layer (paddle's own RNN API), mean over time, a classifier."""

        def __init__(self, kind: str) -> None:
            super().__init__()
            self.emb = nn.Embedding(50, 8, padding_idx=0)
            self.rnn = (nn.GRU(8, 6, direction="bidirect") if kind == "gru"
                        else nn.LSTM(8, 6, num_layers=2))
            self.fc = nn.Linear(12 if kind == "gru" else 6, 2)

        def forward(self, tokens: Any) -> Any:
            y, _ = self.rnn(self.emb(tokens))
            return F.log_softmax(self.fc(y.mean(axis=1)), axis=-1)

    class Dense(nn.Layer):
        """Paddle idioms around resizing and normalization: interpolate with align_mode=1
        (asymmetric bilinear) and nearest, pixel_shuffle, layer_norm, gelu, L2 normalize, clip."""

        def __init__(self) -> None:
            super().__init__()
            self.conv = nn.Conv2D(4, 16, 3, padding=1)
            self.norm = nn.LayerNorm(12)
            self.proj = nn.Linear(12, 6)

        def forward(self, x: Any) -> Any:
            # paddle2onnx 2.1 cannot convert a float scale_factor here (a PIR attribute error)
            y = F.interpolate(x, size=[6, 6], mode="bilinear", align_corners=False, align_mode=1)
            y = F.pixel_shuffle(self.conv(y), 2)  # (N, 4, 4H, 4W)
            y = F.interpolate(y, size=[6, 12], mode="nearest")
            y = F.gelu(self.norm(y))
            y = paddle.clip(self.proj(y), -1.0, 1.0)
            return F.normalize(paddle.flatten(y, 1), axis=1)

    def export(name: str, layer: Any, spec: list[Any]) -> None:
        layer.eval()
        paddle.onnx.export(layer, os.path.join(out, name), input_spec=spec, opset_version=17)
        print(f"{os.path.join(out, name)}.onnx: {os.path.getsize(os.path.join(out, name) + '.onnx')} bytes")

    cnn = ConvBlocks()
    for _ in range(3):  # BatchNorm running statistics away from their initial 0 and 1
        cnn(paddle.randn([8, 3, 16, 16]) * 2.0 + 0.5)
    image = paddle.static.InputSpec([None, 3, 16, 16], "float32", "image")
    export("paddle_cnn_se", cnn, [image])
    tokens = paddle.static.InputSpec([None, None], "int64", "tokens")
    export("paddle_bigru_text", Text("gru"), [tokens])
    export("paddle_lstm2_text", Text("lstm"), [tokens])
    export("paddle_resize_norm", Dense(), [paddle.static.InputSpec([None, 4, 3, 3], "float32", "x")])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("family", choices=["sklearn", "keras", "paddle"])
    parser.add_argument("--out", default=os.path.join("models", "converters"))
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    {"sklearn": export_sklearn, "keras": export_keras, "paddle": export_paddle}[args.family](args.out)


if __name__ == "__main__":
    main()
