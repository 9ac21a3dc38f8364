"""GpuModel: the CUDA and HIP executor on a Program (docs/architecture.md "GPU targets"): one executor for both,
since the two APIs mirror each other (svodrt_gpu/device.py); each driver's own file (cuda.py, hip.py) says which
image a variant loads on its device."""

from __future__ import annotations

import ctypes
import math
import os
import threading
from collections.abc import Mapping as MappingT

import numpy as np

from svodrt.abi import DIM_SIZE
from svodrt.bundle import Program, TrustSpec, Variant, check_section
from svodrt.errors import DeviceError, ModelClosedError, UnsupportedHostError
from svodrt.runner import Runner, real_output
from svodrt_gpu.abi import launch_blocks
from svodrt_gpu.device import CAPTURE_THREAD_LOCAL, Device, parse_device
from svodrt_gpu.plan import GpuVariant, gpu_variant


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
            self.bundle, self.signer, self.weights_verified = program.bundle, program.signer, program.weights_verified
            gpus = {v.index: gpu_variant(self.bundle, v) for v in self.bundle.variants if v.kind == kind}  # checked
            self.device = Device(kind, ordinal)  # then the driver
            self._load(program, gpus, variant, graph)
        except BaseException:
            self.close()
            raise
        finally:
            program.close()
        self._set_io()

    def _choose(self, program: Program, gpus: dict[int, GpuVariant], index: int | None) -> tuple[GpuVariant, str]:
        d, reasons = self.device, []
        for v in self.bundle.variants if index is None else [self.bundle.variants[index]]:
            if v.kind != d.kind:
                reasons.append(f"{v.describe()} (not a {d.kind} variant)")
                continue
            sec, what = d.driver.image(g := gpus[v.index], d)
            if sec is None:
                reasons.append(f"{v.describe()} ({what})")
                continue
            image = bytes(program.source.read(sec.offset, sec.length))  # private: the bytes loaded are those checked
            check_section(program.source, sec, image)
            try:
                self._module = d.handle("load", image)
            except DeviceError as e:
                reasons.append(f"{v.describe()} ({e})")
                continue
            return g, what
        raise UnsupportedHostError(f"no variant of this bundle runs on {d.kind}:{d.ordinal} ({d.name}"
                                   f"{d.driver.describe(d)}): "
                                   f"{'; '.join(reasons) or 'the bundle has no variants'}. Recompile with a "
                                   f"--target for this GPU")

    def _load(self, program: Program, gpus: dict[int, GpuVariant], index: int | None, graph: bool) -> None:
        d, b = self.device, self.bundle
        gpu, self.code_kind = self._choose(program, gpus, index)
        self.variant: Variant = gpu.variant
        host_weights, weights_address = program.weights()
        self._stream = d.handle("stream", 0)
        io_sizes = (t.nbytes for t in (*b.inputs, *b.outputs))
        for nbytes in (b.weights_size, b.arena_size, DIM_SIZE * len(b.dims), *io_sizes):
            self._buffers.append(d.alloc(nbytes))  # one at a time: close() frees them if one fails
        weights, arena, self._dims, *io = self._buffers
        if b.weights_size:
            d.call("h2d", weights, weights_address, b.weights_size, self._stream)
        base = {"weight": weights, "scratch": arena}
        where = {"input": 0, "output": len(b.inputs)}

        def address(buffer_id: int) -> int:
            kind, pos = b.placement[buffer_id]
            return base[kind] + pos if kind in base else io[where[kind] + pos]

        self._io = io
        self._launches, self._scales = [], []
        for x in gpu.launches:
            ptrs = [address(p) for p in b.kernels[x.kernel].params] + ([self._dims] if b.dims else [])
            values = (ctypes.c_uint64 * len(ptrs))(*ptrs)
            args = (ctypes.c_void_p * len(ptrs))(*(ctypes.addressof(values) + 8 * i for i in range(len(ptrs))))
            fn = d.handle("function", self._module, x.symbol.encode())
            self._launches.append((fn, *x.grid, *x.block, 0, self._stream, args, None, values))
            self._scales.append((x.dims, math.prod(b.dims[i].hi for i in x.dims)))
        d.call("sync", self._stream)  # the upload is done: host_weights may go
        del host_weights
        if graph and self._launches and not b.dims:  # a graph fixes the grids, which bounded dims scale
            self._capture()

    def _launch_all(self, dims: ctypes.Array | None = None) -> None:
        for launch, (slots, bounds) in zip(self._launches, self._scales, strict=True):
            if slots and dims is not None:
                blocks = launch_blocks(launch[1], math.prod(dims[i] for i in slots), bounds)
                launch = (launch[0], blocks, *launch[2:])
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
        feeds = self.edge_feeds(feeds)
        arrays, dims = self._prepare(feeds)  # dims: bounded dims' values, inputs in the bounds' layout
        outs = [np.empty(shape, dtype) for shape, dtype in self._output_specs]
        d, s = self.device, self._stream
        with self._lock:
            if self._closed:
                raise ModelClosedError("this model was closed; load the bundle again to run it")
            d.activate()
            for buf, a in zip(self._io[:len(arrays)], arrays, strict=True):
                if a.nbytes:
                    d.call("h2d", buf, a.ctypes.data, a.nbytes, s)
            if dims is not None:
                d.call("h2d", self._dims, ctypes.addressof(dims), DIM_SIZE * len(self.bundle.dims), s)
            if self._exec is not None:
                d.call("graph_launch", self._exec, s)
            else:
                self._launch_all(dims)
            for buf, o in zip(self._io[len(arrays):], outs, strict=True):
                if o.nbytes:
                    d.call("d2h", o.ctypes.data, buf, o.nbytes, s)
            d.call("sync", s)
        if dims is not None:
            outs = [real_output(t, o, dims, self._dim_slots) for t, o in zip(self.bundle.outputs, outs, strict=True)]
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
