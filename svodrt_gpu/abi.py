"""The GPU side of the compiler/runtime contract (docs/bundle-format.md "GPU variants"), shared by svodc's GPU code
generators and svodrt_gpu's executor: in a bundle with bounded dims every kernel takes the device address of the
`dims` array (svodrt/abi.py) after its buffers, and a launch that lists dims runs `launch_blocks` blocks."""

from __future__ import annotations


def launch_blocks(grid: int, values: int, bounds: int) -> int:
    """The launch's grid at the bounds times values / bounds (the products of the listed dims' values and upper
    bounds), rounded up. The kernel computes the same count and strides over the rest: it only affects speed."""
    return -(-grid * values // bounds)
