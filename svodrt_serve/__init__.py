"""svodrt_serve: .svod bundles behind the Open Inference Protocol (KServe v2) on MLServer.

Installed by the `serve` extra (`pip install 'svod[serve]'`) so the runtime stays small; `svodrt serve
PATH` (svodrt_tools/cli.py) imports it only for that subcommand. MLServer runs the REST and gRPC
servers, the model registry, readiness and metrics; this package adds the model (model.py), the
request/response tensors (tensors.py), the REST binary-tensor extension and body limit MLServer's
REST lacks (rest.py), a gRPC infer path without per-element copies (grpc.py), and the server's
lifecycle (server.py). docs/serving.md describes the whole."""
