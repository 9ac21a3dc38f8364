"""svodrt command line: run, verify, profile and info. Needs only the runtime's dependencies (argparse,
not click). Errors print one line and exit 1, usage errors exit 2 (as svodc); --debug shows the traceback."""

from __future__ import annotations

import argparse
import contextlib
import os
import stat
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from svodrt.errors import SvodError
from svodrt_tools.launch import quiet_broken_pipe, suggest, version_line


class _Parser(argparse.ArgumentParser):
    """argparse with 'did you mean' for a misspelt command or option."""

    def error(self, message: str):
        words = message.split("'")
        if "invalid choice" in message and len(words) > 1:
            message += suggest(words[1], [a for act in self._actions if act.choices for a in act.choices])
        elif message.startswith("unrecognized arguments"):
            subs = [act.choices.values() for act in self._actions if isinstance(act.choices, dict)]
            parsers = [self, *(c for group in subs for c in group)]
            opts = [o for p in parsers for act in p._actions for o in act.option_strings]
            message += suggest(message.split(": ", 1)[1].split()[0].split("=")[0], opts)
        super().error(message)


def _bundle(path: str) -> str:
    """The bundle path, or a one-line error for a missing path, a folder or something not a file."""
    try:
        st = os.stat(path)
    except OSError as e:
        raise SvodError(f"cannot open bundle {path!r}: {e.strerror}") from None
    if not stat.S_ISREG(st.st_mode):
        raise SvodError(f"bundle {path!r} is {'a directory' if stat.S_ISDIR(st.st_mode) else 'not a regular file'}")
    return path


def _npz(path: str) -> dict[str, np.ndarray]:
    try:
        with np.load(path, allow_pickle=False) as z:
            return {k: z[k] for k in z.files}
    except Exception as e:  # numpy raises OSError, ValueError, zipfile.BadZipFile, EOFError...
        raise SvodError(f"input file {path} is not a readable .npy/.npz: {type(e).__name__}: {e}") from None


def load_inputs(specs: list[str]) -> dict[str, np.ndarray]:
    """-i NAME=FILE.npy, -i NAME=FILE.npz (the array NAME in it) or -i FILE.npz (all of its arrays)."""
    feeds: dict[str, np.ndarray] = {}
    for spec in specs:
        name, sep, path = spec.partition("=")
        if not sep:
            if not spec.endswith(".npz"):
                raise SvodError(f"-i {spec}: name the input, -i NAME={spec} (a bare file must be a .npz of named "
                                "arrays)")
            feeds.update(_npz(spec))
        elif path.endswith(".npz"):
            arrays = _npz(path)
            if name not in arrays:
                raise SvodError(f"{path} has no array named {name!r} (it has {sorted(arrays)})")
            feeds[name] = arrays[name]
        else:
            try:
                feeds[name] = np.load(path, allow_pickle=False)
            except Exception as e:
                raise SvodError(f"input file {path} is not a readable .npy/.npz: {type(e).__name__}: {e}") from None
    return feeds


def drop_fixed_inputs(model, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """An inputs file made for the ONNX model may hold inputs the bundle fixed at compile time
    (--input-value): those are ignored, with a warning, since the bundle computes with its own value."""
    fixed = model.bundle.manifest.get("options", {}).get("input_values", [])
    names = {t.name for t in model.inputs}
    dropped = sorted(k for k in feeds if k not in names and k in fixed)
    if dropped:
        print(f"svodrt: warning: ignoring input{'s' if len(dropped) > 1 else ''} {dropped}: fixed at compile time "
              "(--input-value) in this bundle", file=sys.stderr)
    return {k: v for k, v in feeds.items() if k not in dropped}


def _summary(a: np.ndarray) -> str:
    flat = a.reshape(-1)
    head = ", ".join(f"{v:.6g}" if a.dtype.kind == "f" else str(v) for v in flat[:5])
    extra = ""
    if a.dtype.kind in "fiu" and a.size:
        extra = f"; top-5 indices {np.argsort(flat)[::-1][:5].tolist()}" if a.size > 5 else ""
    return f"{a.dtype}{list(a.shape)} [{head}{', ...' if a.size > 5 else ''}]{extra}"


def _host(args: argparse.Namespace):
    from svodrt.host import detect_host

    host = detect_host()
    return host.limited_to(args.as_cpu) if args.as_cpu else host


def _output_file(path: str):
    """A temp file next to `path`, made before the model runs (so a bad -o fails first)."""
    target = Path(path)
    if target.is_dir() or (target.exists() and not target.is_file()):
        raise SvodError(f"cannot write {path!r}: it is not a regular file")
    try:
        return tempfile.NamedTemporaryFile(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp", delete=False)
    except OSError as e:
        raise SvodError(f"cannot write {path!r}: {e.strerror}") from None


def cmd_run(args: argparse.Namespace) -> None:
    import svodrt

    out = _output_file(args.output) if args.output else None
    try:
        t0 = time.perf_counter()
        model = svodrt.load(_bundle(args.bundle), threads=args.threads, host=_host(args),
                            verify_weights=args.verify_weights, device=args.device, trust=args.trust)
        t1 = time.perf_counter()
        feeds = drop_fixed_inputs(model, load_inputs(args.input))
        t2 = time.perf_counter()
        outs = model.run(feeds)
        t3 = time.perf_counter()
        for _ in range(max(0, args.repeat - 1)):
            model.run(feeds)
        t4 = time.perf_counter()
        if out is not None:
            np.savez(out, **outs)
            out.close()
            os.replace(out.name, args.output)
    except BaseException:
        if out is not None:
            out.close()
            with contextlib.suppress(OSError):
                os.unlink(out.name)
        raise
    for name, a in outs.items():
        print(f"{name}: {_summary(a)}")
    per = (t4 - t2) / args.repeat if args.repeat > 1 else t3 - t2
    where = f"{args.device}, "
    if args.device == "cpu":  # code older than format 1.10 has no team: one thread
        where = f"{model.threads} threads, " if model.variant.team or model.threads == 1 else \
            f"1 thread: a bundle older than format 1.10 (recompile for {model.threads}), "
    unchecked = "" if model.weights_verified else "; weights not checksummed (svodrt verify, --verify-weights do)"
    print(f"load {1e3 * (t1 - t0):.2f} ms, run {1e3 * per:.2f} ms ({where}{model.variant.describe()}){unchecked}",
          file=sys.stderr)


def cmd_verify(args: argparse.Namespace) -> None:
    from svodrt_tools.verify import verify

    report = verify(_bundle(args.bundle), host=_host(args), threads=args.threads or 1, device=args.device,
                    trust=args.trust)
    print(report.text())
    if not report.ok:
        raise SvodError(f"{args.bundle} failed verification: {report.failures[0]}")


def cmd_profile(args: argparse.Namespace) -> None:
    import svodrt
    from svodrt_tools.profile import kernel_rows, kernel_times, print_table, write_chart, write_trace

    if args.threads is not None and args.threads > 1:
        from svodrt_tools.parts import NoPartTrace, part_trace, print_parts

        traces = []
        for n in (1, args.threads):
            with svodrt.load(_bundle(args.bundle), threads=n) as model:
                try:
                    traces.append(part_trace(model, drop_fixed_inputs(model, load_inputs(args.input)), args.repeat))
                except NoPartTrace as e:
                    raise SvodError(f"{args.bundle}: {e}; recompile it to see its parts") from None
        print_parts(*traces, args.top)
        return
    with svodrt.load(_bundle(args.bundle), threads=1) as model:
        feeds = drop_fixed_inputs(model, load_inputs(args.input))
        rows = kernel_rows(model, kernel_times(model, feeds, repeat=args.repeat))
    print_table(rows, args.top)
    if args.trace:
        write_trace(rows, args.trace)
    if args.chart:
        write_chart(rows, args.chart, Path(args.bundle).name)


def cmd_info(args: argparse.Namespace) -> None:
    from svodrt_tools.describe import describe

    print(describe(_bundle(args.bundle), verbose=args.verbose))


def cmd_serve(args: argparse.Namespace) -> None:
    try:
        from svodrt_serve.server import ServeOptions, serve
    except ImportError as e:  # the serve extra is not installed: its packages are the only imports missing
        raise SvodError(f"svodrt serve needs the serve extra: pip install 'svod[serve]' (missing: {e.name})") from None
    options = ServeOptions(host=args.host, http_port=args.http_port, grpc_port=args.grpc_port,
                           metrics_port=args.metrics_port, threads=args.threads, verify=args.verify,
                           max_request_bytes=int(args.max_request_mb * (1 << 20)), trust=tuple(args.trust or ()))
    failure = serve(args.path, options)
    if failure:
        raise SvodError(f"svodrt serve stopped: {failure}")


def parser() -> argparse.ArgumentParser:
    p = _Parser(prog="svodrt", description="Run .svod bundles.")
    p.add_argument("--version", action="version", version=version_line("svodrt"))
    p.add_argument("--debug", action="store_true", help="show full tracebacks on errors")
    sub = p.add_subparsers(dest="cmd", required=True, parser_class=_Parser)
    r = sub.add_parser("run", help="run a bundle on inputs from .npy/.npz files")
    r.add_argument("bundle")
    r.add_argument("--input", "-i", action="append", default=[], metavar="NAME=FILE.npy|FILE.npz",
                   help="an input array (repeat per input); a bare .npz supplies all arrays by name")
    r.add_argument("-o", "--output", help="write the outputs to this .npz")
    r.add_argument("--threads", type=int, default=None, help="threads per inference (default: this process's CPUs)")
    r.add_argument("--repeat", type=int, default=1, help="run this many times and report the mean time")
    r.add_argument("--verify-weights", action="store_true", default=None,
                   help="check the weights' sha256 at this load, whatever their size or record (svodrt verify "
                        "checks everything)")
    r.set_defaults(fn=cmd_run)
    v = sub.add_parser("verify", help="check a bundle completely and run its test vectors on this machine")
    v.add_argument("bundle")
    v.add_argument("--threads", type=int, default=1, help="threads per inference for the test vectors")
    v.set_defaults(fn=cmd_verify)
    for cmd in (r, v):
        cmd.add_argument("--device", default="cpu", help="cpu (default), cuda:N or hip:N (GPU variants)")
        cmd.add_argument("--trust", action="append", metavar="PUBKEY.pem", help="accept only bundles signed by "
                         "this Ed25519 public key (repeatable; docs/bundle-format.md \"Trust model\")")
        cmd.add_argument("--as-cpu", metavar="LEVEL", help="choose code as if this machine were only an x86-64 "
                         "LEVEL (x86-64, x86-64-v2, -v3, -v4): to try a fat bundle's smaller variants")
    pr = sub.add_parser("profile", help="time every kernel on its own (one thread), or each kernel's parts on N")
    pr.add_argument("bundle")
    pr.add_argument("--input", "-i", action="append", default=[], metavar="NAME=FILE.npy|FILE.npz")
    pr.add_argument("--repeat", type=int, default=10, help="runs per kernel; the median is shown")
    pr.add_argument("--top", type=int, default=25, help="show the slowest N kernels")
    pr.add_argument("--trace", metavar="TRACE.json", help="write a Chrome/Perfetto trace (one event per kernel)")
    pr.add_argument("--chart", metavar="PROFILE.svg", help="draw time by op type and the slowest kernels (SVG)")
    pr.add_argument("--threads", type=int, help="N > 1: run whole calls on one thread and on N, each kernel's parts "
                    "traced, and show what each kernel loses on N (x86_64 bundles; --repeat calls each)")
    pr.set_defaults(fn=cmd_profile)
    i = sub.add_parser("info", help="describe a bundle")
    i.add_argument("bundle")
    i.add_argument("-v", "--verbose", action="store_true", help="list kernels with their ONNX nodes")
    i.set_defaults(fn=cmd_info)
    s = sub.add_parser("serve", help="serve bundles over the Open Inference Protocol, REST and gRPC (svod[serve])")
    s.add_argument("path", help="a bundle, or a folder of NAME.svod bundles and/or NAME/VERSION/*.svod versions")
    s.add_argument("--host", default="0.0.0.0", help="address to listen on (default: all)")
    s.add_argument("--http-port", type=int, default=8080)
    s.add_argument("--grpc-port", type=int, default=8081)
    s.add_argument("--metrics-port", type=int, default=8082, help="Prometheus /metrics (0: off)")
    s.add_argument("--threads", type=int, default=None, help="threads per inference (default: this process's CPUs)")
    s.add_argument("--no-verify", dest="verify", action="store_false",
                   help="skip the checksums and test vectors before the server reports ready")
    s.add_argument("--max-request-mb", type=float, default=64.0, help="largest request body (413 beyond)")
    s.add_argument("--trust", action="append", metavar="PUBKEY.pem",
                   help="serve only bundles signed by this Ed25519 public key (repeatable)")
    s.set_defaults(fn=cmd_serve)
    return p


def _main(argv: list[str] | None) -> None:
    args = parser().parse_args(argv)
    try:
        args.fn(args)
    except BrokenPipeError:
        raise
    except (SvodError, OSError, ValueError) as e:
        if args.debug:
            raise
        print(f"svodrt: error: {e}", file=sys.stderr)
        sys.exit(1)


def main(argv: list[str] | None = None) -> None:
    quiet_broken_pipe(lambda: _main(argv))


if __name__ == "__main__":
    main()
