"""The PyTorch side of scripts/gpu_check.py (issue 16 item 1): the same architectures as the svod cases, random
init, fp32, on the GPU, eager and torch.compile, at batch 1 and 8; median latency per (architecture, batch,
mode). Imported only where torch is (the device machine's python3 has torch, torchvision, transformers).

The architectures match the svod cases by design, not weight for weight: torchvision's resnet50, densenet121,
squeezenet1_0, googlenet (Inception v1), mobilenet_v2 and a transformers GPT-2 of gpt2_small_random's size
(4 layers, width 384, 6 heads, vocabulary 8192, 128 tokens). torchvision's shufflenet_v2_x1_0 is ShuffleNet v2,
the onnx light model is v1: its ratio compares two different networks and is marked so.
"""

from __future__ import annotations

import time

# svod case -> (torch architecture, input kind); "image": [batch, 3, 224, 224] float32, "tokens": [batch, 128]
ARCHS = {
    "resnet50": ("resnet50", "image"),
    "densenet121": ("densenet121", "image"),
    "squeezenet": ("squeezenet1_0", "image"),
    "inception_v1": ("googlenet", "image"),
    "shufflenet": ("shufflenet_v2_x1_0", "image"),  # v2 against the light model's v1: not the same network
    "mobilenetv2_random": ("mobilenet_v2", "image"),
    "gpt2_small_random": ("gpt2", "tokens"),
}
GPT2_SIZE = {"n_layer": 4, "n_embd": 384, "n_head": 6, "vocab_size": 8192, "n_positions": 1024}
SEQ = 128
BATCHES = (1, 8)


def available() -> str | None:
    """None when torch (with CUDA), torchvision and transformers can be used here, else why not."""
    try:
        import torch
        import torchvision  # noqa: F401
        import transformers  # noqa: F401
    except ImportError as e:
        return f"not importable here: {e}"
    return None if torch.cuda.is_available() else "torch sees no CUDA device"


def _model(arch: str):
    import torch

    torch.manual_seed(0)
    if arch == "gpt2":
        from transformers import GPT2Config, GPT2LMHeadModel

        return GPT2LMHeadModel(GPT2Config(**GPT2_SIZE)).eval()
    import torchvision

    kw = {"aux_logits": False, "init_weights": True} if arch == "googlenet" else {}
    return getattr(torchvision.models, arch)(weights=None, **kw).eval()


def _input(kind: str, batch: int):
    import torch

    g = torch.Generator().manual_seed(0)
    if kind == "tokens":
        return torch.randint(0, GPT2_SIZE["vocab_size"], (batch, SEQ), generator=g)
    return torch.randn(batch, 3, 224, 224, generator=g)


def _median_ms(fn, repeat: int) -> float:
    import torch

    times = []
    for _ in range(repeat):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return round(1e3 * sorted(times)[len(times) // 2], 3)


def bench(cases: list[str], repeat: int, deadline: float, compile_models: bool = True) -> list[dict]:
    """Rows {case, arch, batch, eager_ms, compiled_ms (or why not)}. torch.compile takes tens of seconds per
    model and shape: past `deadline` (time.monotonic) the remaining compiled measurements are skipped."""
    import torch

    rows = []
    for case in cases:
        arch, kind = ARCHS[case]
        model = _model(arch).cuda()
        compiled = torch.compile(model) if compile_models else None
        for batch in BATCHES:
            x = _input(kind, batch).cuda()
            row = {"case": case, "arch": arch, "batch": batch}
            with torch.inference_mode():
                model(x)  # warm-up: cuDNN picks its algorithms
                row["eager_ms"] = _median_ms(lambda m=model, x=x: m(x), repeat)
                if compiled is None:
                    row["compiled_ms"] = "not asked (--no-torch-compile)"
                elif time.monotonic() > deadline:
                    row["compiled_ms"] = "skipped: past the time budget"
                else:
                    t0 = time.perf_counter()
                    compiled(x)
                    row["compile_s"] = round(time.perf_counter() - t0, 1)
                    row["compiled_ms"] = _median_ms(lambda m=compiled, x=x: m(x), repeat)
            rows.append(row)
            print(f"  torch {arch} batch {batch}: eager {row['eager_ms']} ms, compiled {row['compiled_ms']}",
                  flush=True)
        del model, compiled
        torch.cuda.empty_cache()
    return rows
