"""Schema versions oxla deliberately has no rule for, each with its reason."""

from __future__ import annotations

_PRE7_RNN = ("the opset 1-6 recurrent schema (output_sequence attribute, pre-7 activations); "
             "converters have emitted opset >= 7 RNNs since 2017: re-export or upgrade the model "
             "with onnx.version_converter")

# (domain, op_type, since_version) -> reason
UNSUPPORTED: dict[tuple[str, str, int], str] = {
    ("", "RNN", 1): _PRE7_RNN,
    ("", "GRU", 1): _PRE7_RNN,
    ("", "GRU", 3): _PRE7_RNN,
    ("", "LSTM", 1): _PRE7_RNN,
    ("", "Upsample", 1): ("experimental opset-1 Upsample (width_scale/height_scale attributes); "
                          "use Upsample v7+ or Resize"),
}


def reason(domain: str, op_type: str, since: int) -> str | None:
    """Why oxla does not lower this schema version, if that is a decision."""
    return UNSUPPORTED.get((domain, op_type, since))
