"""svodrt_session: onnxruntime's session API over svodrt's Model (README "Coming from onnxruntime"), outside the core
runtime's line budget (docs/architecture.md "Runtime"): a front door, not what every deployment runs. `svodrt` names
it (`svodrt.InferenceSession`) and imports it when first named; it imports svodrt, and only stdlib and numpy besides."""

from svodrt_session.session import InferenceSession, NodeArg, SessionOptions

__all__ = ["InferenceSession", "NodeArg", "SessionOptions"]
