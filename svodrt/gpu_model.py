"""GpuModel: the CUDA and HIP executor, built on a Program like the CPU's (the drivers mirror each
other, gpu_driver.py, so only the image choice differs: cuda_image). Load: the first variant of the
device's kind it can load (CUDA: its architecture's cubin, else PTX), as checked private bytes;
weights uploaded once; arena and I/O allocated; launches resolved and captured as a graph unless
graph=False. One set of device buffers per model, so concurrent run() calls take turns."""

from __future__ import annotations

import ctypes
import os
import threading
from collections.abc import Mapping as MappingT

import numpy as np

from svodrt.bundle import Section, Variant
from svodrt.errors import DeviceError, ModelClosedError, UnsupportedHostError
from svodrt.gpu_driver import CAPTURE_THREAD_LOCAL, Device, parse_device
from svodrt.program import Program
from svodrt.runner import Runner
from svodrt.trust import TrustSpec


def cuda_image(v: Variant, capability: int) -> tuple[Section | None, str]:
    """(the section a CUDA device of this compute capability loads, or None; why / what it is). A cubin
    runs on its architecture's major version with an equal or higher minor; PTX on any newer device."""
    if not (v.cpu.startswith("sm_") and v.cpu[3:].isdigit()):
        return None, f"unknown architecture {v.cpu!r}"
    want = int(v.cpu[3:])
    if v.cubin is not None and capability // 10 == want // 10 and capability >= want:
        return v.cubin, "cubin"
    if capability >= want:
        return v.section, "PTX, compiled by the driver"
    return None, f"needs compute capability {want // 10}.{want % 10}"


class GpuModel(Runner):
    def __init__(self, source: str | os.PathLike | bytes, device: str, verify_weights: bool | None = None,
                 variant: int | None = None, graph: bool = True, trust: TrustSpec | None = None):
        kind, ordinal = parse_device(device)
        self._closed = False
        self._lock = threading.Lock()
        self._buffers: list[int] = []
        self._module = self._graph = self._exec = self._stream = None
        program = Program(source, verify_weights, trust, variant)
        try:
            self.bundle, self.signer, self.weights_verified = program.bundle, program.signer, program.check_weights
            self.device = Device(kind, ordinal)
            self._load(program, variant, graph)
        except BaseException:
            self.close()
            raise
        finally:
            program.close()
        self._set_io()

    def _choose(self, program: Program, index: int | None) -> tuple[Variant, str]:
        d, reasons = self.device, []
        for v in self.bundle.variants if index is None else [self.bundle.variants[index]]:
            if v.kind != d.kind:
                reasons.append(f"{v.describe()} (not a {d.kind} variant)")
                continue
            sec, what = cuda_image(v, d.capability) if d.kind == "cuda" else (v.section, "code object")
            if sec is None:
                reasons.append(f"{v.describe()} ({what})")
                continue
            image = bytes(program.image(sec))  # the bytes loaded are the bytes checked
            try:
                self._module = d.handle("load", image)
            except DeviceError as e:
                reasons.append(f"{v.describe()} ({e})")
                continue
            return v, what
        cap = f", compute capability {d.capability // 10}.{d.capability % 10}" if d.kind == "cuda" else ""
        raise UnsupportedHostError(f"no variant of this bundle runs on {d.kind}:{d.ordinal} ({d.name}{cap}): "
                                   f"{'; '.join(reasons) or 'the bundle has no variants'}. Recompile with a "
                                   f"--target for this GPU")

    def _load(self, program: Program, index: int | None, graph: bool) -> None:
        d, b = self.device, self.bundle
        self.variant, self.code_kind = self._choose(program, index)
        host_weights, weights_address = program.weights()
        self._stream = d.handle("stream", 0)
        for nbytes in (b.weights_size, b.arena_size, *(t.nbytes for t in (*b.inputs, *b.outputs))):
            self._buffers.append(d.alloc(nbytes))  # one at a time: close() frees them if one fails
        weights, arena, *io = self._buffers
        if b.weights_size:
            d.call("h2d", weights, weights_address, b.weights_size, self._stream)
        base = {"weight": weights, "scratch": arena}
        where = {"input": 0, "output": len(b.inputs)}

        def address(buffer_id: int) -> int:
            kind, pos = b.placement[buffer_id]
            return base[kind] + pos if kind in base else io[where[kind] + pos]

        self._io = io
        self._launches = []
        for x in self.variant.launches:
            ptrs = [address(p) for p in b.kernels[x.kernel].params]
            values = (ctypes.c_uint64 * len(ptrs))(*ptrs)
            args = (ctypes.c_void_p * len(ptrs))(*(ctypes.addressof(values) + 8 * i for i in range(len(ptrs))))
            fn = d.handle("function", self._module, x.symbol.encode())
            self._launches.append((fn, *x.grid, *x.block, 0, self._stream, args, None, values))
        d.call("sync", self._stream)  # the upload is done: host_weights may go
        del host_weights
        if graph and self._launches:
            self._capture()

    def _launch_all(self) -> None:
        for launch in self._launches:
            self.device.call("launch", *launch[:-1])

    def _capture(self) -> None:
        """Record the launch list as a graph; where the driver cannot, run() launches one by one."""
        d = self.device
        try:
            d.call("capture", self._stream, CAPTURE_THREAD_LOCAL)
        except DeviceError:
            return
        self._graph = ctypes.c_void_p()
        try:
            self._launch_all()
        finally:
            d.call("end_capture", self._stream, ctypes.byref(self._graph))
        self._exec = d.handle("instantiate", self._graph, 0)

    def run(self, feeds: MappingT[str, object]) -> dict[str, np.ndarray]:
        """{input name: array} -> {output name: array}, like Model.run. Safe from many threads (they take turns)."""
        arrays = self.check_inputs(feeds)
        outs = [np.empty(shape, dtype) for shape, dtype in self._output_specs]
        d, s = self.device, self._stream
        with self._lock:
            if self._closed:
                raise ModelClosedError("this model was closed; load the bundle again to run it")
            d.activate()
            for buf, a in zip(self._io[:len(arrays)], arrays, strict=True):
                if a.nbytes:
                    d.call("h2d", buf, a.ctypes.data, a.nbytes, s)
            if self._exec is not None:
                d.call("graph_launch", self._exec, s)
            else:
                self._launch_all()
            for buf, o in zip(self._io[len(arrays):], outs, strict=True):
                if o.nbytes:
                    d.call("d2h", o.ctypes.data, buf, o.nbytes, s)
            d.call("sync", s)
        return self._results(outs, feeds)

    def close(self) -> None:
        """Wait for a running call, then free the device memory, the graph, the module and the stream."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            d = getattr(self, "device", None)
            if d is None:
                return
            d.activate()
            for op, h in (("exec_free", self._exec), ("graph_free", self._graph), ("unload", self._module),
                          ("stream_free", self._stream)):
                if h is not None:
                    d.call(op, h)
            for p in self._buffers:
                d.call("free", p)
            self._buffers.clear()
            d.release()
