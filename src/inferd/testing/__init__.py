"""Test support: ONNX models built by code and a real `inferd serve` subprocess."""
