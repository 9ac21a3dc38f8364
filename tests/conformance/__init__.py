"""The ONNX conformance suite: every node test case of the pinned onnx package, compiled with svodc and
run with svodrt in worker subprocesses. `python -m tests.conformance` writes docs/onnx-coverage.md."""
