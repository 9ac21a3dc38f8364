"""svodrt command line: run and info. Needs only the runtime's dependencies (argparse, not click).

Errors print one line and exit non-zero; --debug shows the traceback."""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

from svodrt.errors import SvodError


def _load_inputs(specs: list[str]) -> dict[str, np.ndarray]:
    feeds: dict[str, np.ndarray] = {}
    for spec in specs:
        name, sep, path = spec.partition("=")
        try:
            if not sep:  # a bare .npz: every array in it, by key
                with np.load(spec, allow_pickle=False) as z:
                    feeds.update({k: z[k] for k in z.files})
            elif path.endswith(".npz"):
                with np.load(path, allow_pickle=False) as z:
                    if name not in z.files:
                        raise SvodError(f"{path} has no array named {name!r} (it has {z.files})")
                    feeds[name] = z[name]
            else:
                feeds[name] = np.load(path, allow_pickle=False)
        except (SvodError, OSError):
            raise
        except Exception as e:  # numpy and zipfile raise many types for a damaged file
            raise SvodError(f"input file {path or spec} is not a readable .npy/.npz: {type(e).__name__}: {e}") from None
    return feeds


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


def cmd_run(args: argparse.Namespace) -> None:
    import svodrt

    t0 = time.perf_counter()
    model = svodrt.load(args.bundle, threads=args.threads, host=_host(args), verify_weights=args.verify_weights,
                        device=args.device, trust=args.trust)
    t1 = time.perf_counter()
    feeds = _load_inputs(args.input)
    t2 = time.perf_counter()
    outs = model.run(feeds)
    t3 = time.perf_counter()
    for _ in range(max(0, args.repeat - 1)):
        model.run(feeds)
    t4 = time.perf_counter()
    if args.output:
        tmp = args.output + ".tmp.npz"
        np.savez(tmp, **outs)
        import os

        os.replace(tmp, args.output)
    for name, a in outs.items():
        print(f"{name}: {_summary(a)}")
    per = (t4 - t2) / args.repeat if args.repeat > 1 else t3 - t2
    where = f"{model.threads} threads, " if args.device == "cpu" else f"{args.device}, "
    unchecked = "" if model.weights_verified else "; weights over 16 MiB not checksummed: --verify-weights checks them"
    print(f"load {1e3 * (t1 - t0):.2f} ms, run {1e3 * per:.2f} ms ({where}{model.variant.describe()}){unchecked}",
          file=sys.stderr)


def cmd_verify(args: argparse.Namespace) -> None:
    from svodrt_tools.verify import verify

    report = verify(args.bundle, host=_host(args), threads=args.threads or 1, device=args.device, trust=args.trust)
    print(report.text())
    if not report.ok:
        raise SvodError(f"{args.bundle} failed verification: {report.failures[0]}")


def cmd_profile(args: argparse.Namespace) -> None:
    import svodrt

    model = svodrt.load(args.bundle, threads=1)
    rows = model.profile(_load_inputs(args.input), repeat=args.repeat)
    total = sum(t for _, t, _ in rows)
    rows_sorted = sorted(rows, key=lambda r: -r[1])[: args.top]
    print(f"{'kernel':40s} {'ms':>8s} {'%':>6s}  onnx nodes")
    for name, t, prov in rows_sorted:
        nodes = ", ".join(prov[:3]) + (f" (+{len(prov) - 3})" if len(prov) > 3 else "")
        print(f"{name[:40]:40s} {1e3 * t:8.3f} {100 * t / total:6.1f}  {nodes}")
    print(f"{'total (sum of medians)':40s} {1e3 * total:8.3f}")


def cmd_info(args: argparse.Namespace) -> None:
    from svodrt_tools.describe import describe

    print(describe(args.bundle, verbose=args.verbose))


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="svodrt", description="Run .svod bundles.")
    p.add_argument("--debug", action="store_true", help="show full tracebacks on errors")
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="run a bundle on inputs from .npy/.npz files")
    r.add_argument("bundle")
    r.add_argument("--input", "-i", action="append", default=[], metavar="NAME=FILE.npy|FILE.npz",
                   help="an input array (repeat per input); a bare .npz supplies all arrays by name")
    r.add_argument("-o", "--output", help="write the outputs to this .npz")
    r.add_argument("--threads", type=int, default=None, help="threads per inference (default: all cores)")
    r.add_argument("--repeat", type=int, default=1, help="run this many times and report the mean time")
    r.add_argument("--verify-weights", action="store_true", default=None,
                   help="check the weights' sha256 even when they are large")
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
    pr = sub.add_parser("profile", help="time every kernel on its own (one thread)")
    pr.add_argument("bundle")
    pr.add_argument("--input", "-i", action="append", default=[], metavar="NAME=FILE.npy|FILE.npz")
    pr.add_argument("--repeat", type=int, default=10, help="runs per kernel; the median is shown")
    pr.add_argument("--top", type=int, default=25, help="show the slowest N kernels")
    pr.set_defaults(fn=cmd_profile)
    i = sub.add_parser("info", help="describe a bundle")
    i.add_argument("bundle")
    i.add_argument("-v", "--verbose", action="store_true", help="list kernels with their ONNX nodes")
    i.set_defaults(fn=cmd_info)
    args = p.parse_args(argv)
    try:
        args.fn(args)
    except (SvodError, OSError, ValueError) as e:
        if args.debug:
            raise
        print(f"svodrt: error: {e}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
