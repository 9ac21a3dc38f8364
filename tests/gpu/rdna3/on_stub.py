"""svodrt's HIP path with its gfx1100 code object executed by the RDNA3 emulator: the stand-in driver
(tests/gpu/stub_driver.c) hands every hipModuleLaunchKernel to `RDNA3Launcher`, which builds the
kernarg segment from the launch's own argument array and runs the kernel over the stub's device
memory. So what runs is the machine code in the bundle, with the geometry and arguments svodrt
passes; the host arithmetic of the stub is not involved."""

from __future__ import annotations

import ctypes

import numpy as np

from tests.gpu.rdna3.runner import CodeObject, Emulator, stub_memory


class RDNA3Launcher:
    def __init__(self, stub, code_object: bytes, lockstep: bool = True):
        self.stub = stub
        self.emulator = Emulator(CodeObject(code_object), lockstep)
        self.errors: list[str] = []  # exceptions cannot cross the C callback: collected, checked by run()
        self.launched: list[str] = []

    def __call__(self, symbol: bytes, gx, gy, gz, bx, by, bz, params) -> None:
        if self.errors:
            return  # the first failure is the one reported
        name = symbol.decode()
        try:
            kernel = self.emulator.code.kernels[name]
            sizes = [a[".size"] for a in kernel.args if not a[".value_kind"].startswith("hidden_")]
            explicit = [ctypes.string_at(params[i], n) for i, n in enumerate(sizes)]
            self.emulator.dispatch(name, (gx, gy, gz), (bx, by, bz), explicit, stub_memory(self.stub.lib))
            self.launched.append(name)
        except Exception as e:  # reported by run_in_emulator: a callback cannot raise into C
            self.errors.append(f"{name}: {e}")


def run_in_emulator(stub, bundle: bytes, code_object: bytes, feeds: dict, lockstep: bool = True
                    ) -> dict[str, np.ndarray]:
    """Load a gfx1100 bundle on the stand-in driver (device hip:0) and run it, its kernels emulated
    (lockstep: see runner.Emulator)."""
    import svodrt

    launcher = RDNA3Launcher(stub, code_object, lockstep)
    stub.set_launcher(launcher)
    with svodrt.load(bundle, device="hip:0", graph=False) as m:
        out = m.run(feeds)
    assert not launcher.errors, launcher.errors[0]
    assert launcher.launched, "no kernel ran"
    return out
