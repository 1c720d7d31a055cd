"""Lowering ONNX nodes to JAX: the rule table, the context rules see, the interpreter."""
