"""svodc command line: compile and inspect.

Errors print one line and exit non-zero; --debug shows the full traceback.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import click

from svodc.errors import SvodcError
from svodrt_tools.launch import version_line


def _pairs(values: tuple[str, ...], what: str) -> list[tuple[str, str]]:
    out = []
    for v in values:
        name, sep, val = v.rpartition("=")
        if not sep or not name or not val:
            raise click.BadParameter(f"{v!r}: expected NAME=VALUE", param_hint=what)
        out.append((name, val))
    return out


def _int(v: str, what: str) -> int:
    try:
        n = int(v)
    except ValueError:
        raise click.BadParameter(f"{v!r} is not an integer", param_hint=what) from None
    if n < 0:
        raise click.BadParameter(f"{v!r} must be >= 0", param_hint=what)
    return n


def _size(v: str, what: str) -> int | tuple[int, int]:
    """`N` or `LO..HI` (a bounded symbolic dim, svodc/frontend/dims.py)."""
    lo, sep, hi = v.partition("..")
    if not sep:
        return _int(v, what)
    a, b = _int(lo, what), _int(hi, what)
    if not 0 <= a <= b:  # LO 0: only for a run-time size (TENSOR:AXIS); an input dim needs LO >= 1
        raise click.BadParameter(f"{v!r}: a range LO..HI needs 0 <= LO <= HI", param_hint=what)
    return (a, b)


def _npy(path: str):
    import numpy as np

    try:
        return np.load(path, allow_pickle=False)
    except (OSError, ValueError) as e:
        raise click.BadParameter(f"{path!r}: cannot read a .npy array ({e})", param_hint="--input-value") from None


class _Group(click.Group):
    def invoke(self, ctx: click.Context):
        from svodrt.errors import SvodError

        try:
            return super().invoke(ctx)
        except (click.exceptions.Exit, click.exceptions.Abort, click.ClickException, BrokenPipeError):
            raise  # click's own usage errors and exits; a closed stdout ends quietly (svodrt_tools/launch.py)
        except (SvodcError, SvodError, OSError) as e:
            if ctx.obj and ctx.obj.get("debug"):
                raise
            click.echo(f"svodc: error: {e}", err=True)
            sys.exit(1)
        except Exception as e:  # a bug: still one line and a non-zero exit, never a partial output file
            if ctx.obj and ctx.obj.get("debug"):
                raise
            msg = " ".join(f"{type(e).__name__}: {e}".split())[:300]
            click.echo(f"svodc: internal error: {msg} (a bug in svodc: rerun with --debug for the traceback "
                       "and please report it)", err=True)
            sys.exit(1)


@click.group(cls=_Group)
@click.option("--debug", is_flag=True, help="Show full tracebacks on errors.")
@click.version_option(version="", message=version_line("svodc"))
@click.pass_context
def main(ctx: click.Context, debug: bool) -> None:
    """Svod ahead-of-time compiler: ONNX model -> .svod bundle."""
    ctx.obj = {"debug": debug}


@main.command()
@click.argument("model", type=click.Path(dir_okay=False))
@click.option("-o", "--output", type=click.Path(), help="Bundle path (default: MODEL with .svod).")
@click.option("--target", default="host", show_default=True,
              help="Comma-separated variants: host, ARCH[-linux-gnu][:CPU[+FEATURE...]] (x86_64, aarch64, riscv64, "
                   "ppc64le, s390x), a CPU continuing the previous ARCH, or a GPU (sm_80, sm_90, gfx942, gfx1100, "
                   "gfx1151, gfx1200). E.g. x86_64:x86-64-v3,x86-64,aarch64,sm_90.")
@click.option("--dim", "dims", multiple=True, metavar="NAME=N|LO..HI",
              help="Fix a symbolic input dimension (N) or bound it (LO..HI: one bundle for every size in the range); "
                   "TENSOR:AXIS=LO..HI bounds a size a run-time input's value decides (a Range's length, OneHot's "
                   "depth), checked per call.")
@click.option("--input-shape", "shapes", multiple=True, metavar="NAME=DxDx...",
              help="An input's shape; each D is N or LO..HI (a bounded dim).")
@click.option("--input-value", "values", multiple=True, metavar="NAME=FILE.npy",
              help="Fix an input's value at compile time (inputs that decide shapes); it leaves the bundle's inputs.")
@click.option("--loop-bound", "loop_bounds", multiple=True, metavar="NODE=N",
              help="The most iterations of a Loop whose trip count is known only at run time (a call needing more "
                   "runs N).")
@click.option("--weights", "weights", multiple=True, type=click.Path(dir_okay=False), metavar="FILE.safetensors",
              help="Supply or override initializers by name from a safetensors file (mmapped; repeatable).")
@click.option("-O", "opt_level", type=click.IntRange(0, 3), default=2, show_default=True,
              help="LLVM opt level (3 made no faster CPU code than 2, in more time).")
@click.option("-j", "--jobs", type=click.IntRange(0), default=0, help="Compile workers (0: one per core).")
@click.option("--test-vectors/--no-test-vectors", "test_vectors", default=None,
              help="Embed a reference input and its expected outputs for `svodrt verify` "
                   "(default: when inputs and outputs take at most 1 MiB).")
@click.option("--sign", "sign_key", type=click.Path(exists=True, dir_okay=False), metavar="KEY.pem",
              help="Sign the bundle with this Ed25519 private key (PEM; needs svod[sign]); load it with "
                   "`svodrt run --trust PUBKEY.pem`.")
@click.option("--precision", type=click.Choice(["fp32", "f16", "bf16"]), default="fp32", show_default=True,
              help="Store GEMM weights as float16/bfloat16 (GPU targets; float32 accumulation); prints the max "
                   "error against fp32.")
@click.option("--step-loops/--no-step-loops", "step_loops", default=True, show_default=True,
              help="Compile recurrent layers (RNN, GRU, LSTM) as loops over their steps; off: unrolled, one kernel "
                   "set per step (needed where sizes come from run-time values).")
@click.option("-q", "--quiet", is_flag=True, help="Print nothing on success.")
@click.option("-v", "--verbose", is_flag=True, help="Print each stage as it finishes (default on a terminal).")
def compile(model: str, output: str | None, target: str, dims: tuple[str, ...], shapes: tuple[str, ...],
            values: tuple[str, ...], loop_bounds: tuple[str, ...], weights: tuple[str, ...], opt_level: int, jobs: int,
            test_vectors: bool | None, sign_key: str | None, precision: str, step_loops: bool, quiet: bool,
            verbose: bool) -> None:
    """Compile MODEL (.onnx) into a .svod bundle."""
    from svodc.api import compile_to_file
    from svodc.options import CompileOptions

    dim_map = {n: _size(v, "--dim") for n, v in _pairs(dims, "--dim")}
    shape_map = {}
    for n, v in _pairs(shapes, "--input-shape"):
        shape_map[n] = tuple(_size(d, "--input-shape") for d in v.lower().split("x"))
    value_map = {n: _npy(v) for n, v in _pairs(values, "--input-value")}
    out = Path(output) if output else Path(model).with_suffix(".svod")
    bound_map = {n: _int(v, "--loop-bound") for n, v in _pairs(loop_bounds, "--loop-bound")}
    options = CompileOptions(dims=dim_map, input_shapes=shape_map, input_values=value_map, weights=tuple(weights),
                             loop_bounds=bound_map,
                             opt_level=opt_level, jobs=jobs, test_vectors=test_vectors, sign_key=sign_key,
                             precision=precision, step_loops=step_loops)
    t0 = time.perf_counter()
    show = not quiet and (verbose or sys.stderr.isatty())

    def progress(line: str) -> None:
        if show or (not quiet and line.startswith(("warning:", "precision "))):
            click.echo(f"  {line}", err=True)

    bar = _KernelBar() if not quiet and sys.stderr.isatty() else None
    path = compile_to_file(model, out, target=target, options=options, progress=progress,
                           kernels_done=bar.update if bar else None)
    if not quiet:
        click.echo(f"wrote {path} ({path.stat().st_size:,} bytes) in {time.perf_counter() - t0:.2f}s")
        if "host" in target.split(","):
            click.echo(host_note(path), err=True)


class _KernelBar:
    """click's progress bar over the LLVM modules of one target at a time (a TTY only)."""

    def __init__(self) -> None:
        self.bar = None

    def update(self, done: int, total: int) -> None:
        if self.bar is None:
            self.bar = click.progressbar(length=total, label="  compiling kernels", file=sys.stderr)
        self.bar.update(1)
        if done == total:
            self.bar.render_finish()
            self.bar = None


def host_note(path: Path) -> str:
    """What a --target host bundle needs of a CPU, and how to make one that runs elsewhere."""
    from svodrt.bundle import parse_bundle

    cpu = [v for v in parse_bundle(path.read_bytes()).variants if v.kind == "cpu"]
    needs = "; ".join(f"{v.arch}:{v.cpu} needs {len(v.features)} CPU features ({', '.join(v.features) or 'none'})"
                      for v in cpu)
    arch = cpu[0].arch if cpu else "x86_64"
    # the default CPU of every other architecture is its most portable one (svodc/arches.py)
    portable = "x86_64:x86-64-v3,x86-64 (a fat bundle: v3 where it runs, else baseline)" if arch == "x86_64" else arch
    return (f"note: --target host compiles for this machine's CPU: {needs}; the bundle runs only where all of them "
            f"are present. For one that runs on any {arch} machine: --target {portable}")


@main.command()
@click.argument("bundle", type=click.Path(exists=True, dir_okay=False))
@click.option("--graph", "graph", type=click.Path(dir_okay=False), metavar="FILE.svg|FILE.dot",
              help="Draw the kernel graph with each kernel's ONNX nodes (.dot text; .svg/.png need Graphviz).")
def inspect(bundle: str, graph: str | None) -> None:
    """Describe a bundle: inputs, outputs, code variants, kernels, memory."""
    from svodrt_tools.describe import describe

    click.echo(describe(bundle, verbose=True))
    if graph:
        from svodc.graph_draw import write_graph
        from svodrt.bundle import parse_bundle

        write_graph(parse_bundle(Path(bundle).read_bytes()), graph)


if __name__ == "__main__":
    main()
