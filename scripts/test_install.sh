#!/usr/bin/env bash
# make test-install: the installs the README promises, each in a fresh venv, from a copy of this checkout
# (tracked and untracked, not ignored, files), with the pinned versions of constraints.txt:
#   pip install .             -> runs a bundle (a golden one from artifacts/), svodc says which extra to install,
#                                and importing svodrt pulls in none of the compiler's packages;
#   pip install '.[compiler]' -> compiles an ONNX model that the installed svodrt then runs.
# Packages come from pip's cache or index.
set -euo pipefail
PY=${1:-python3}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
step() { printf '== %s (%ss)\n' "$1" "$SECONDS"; }

SRC=$WORK/src
mkdir -p "$SRC"
(cd "$ROOT" && git ls-files -co --exclude-standard -z | tar --null -T - --ignore-failed-read -cf - 2>/dev/null) \
  | tar -xf - -C "$SRC"
cd "$WORK"

step "runtime only: pip install ."
"$PY" -m venv rt
rt/bin/pip install -q -c "$SRC/constraints.txt" "$SRC"
rt/bin/svodrt --version
rt/bin/svodrt info "$SRC/artifacts/v1.4/relu_add.svod" >/dev/null
rt/bin/python - "$SRC/artifacts/v1.4/relu_add.svod" <<'EOF'
import sys

import numpy as np

import svodrt

path = sys.argv[1]
with np.load(path.replace(".svod", ".expected.npz")) as z:
    x, want = z["input.x"], {k.split(".", 1)[1]: z[k] for k in z.files if k.startswith("variant0.")}
with svodrt.load(path) as m:
    got = m.run({"x": x})
assert all(np.array_equal(got[k], v) for k, v in want.items()), "outputs differ from the stored ones"
blocked = {"onnx", "llvmlite", "click", "svodc"} & set(sys.modules)
assert not blocked, f"importing svodrt imported {blocked}"
print("runtime-only install runs the golden bundle")
EOF
set +e
msg=$(rt/bin/svodc --version 2>&1)
code=$?
set -e
echo "$msg"
[ "$code" = 1 ] && [[ "$msg" == *"pip install 'svod[compiler]'"* ]] && [[ "$msg" != *Traceback* ]] \
  || { echo "FAIL: svodc without the compiler extra (exit $code)"; exit 1; }

step "compiler: pip install '.[compiler]'"
"$PY" -m venv cc
cc/bin/pip install -q -c "$SRC/constraints.txt" "$SRC[compiler]"
cc/bin/svodc --version
cc/bin/python - <<'EOF'
import numpy as np
import onnx
from onnx import TensorProto, helper

g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                      [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
                      [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])])
onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), "m.onnx")
np.save("x.npy", np.array([-1, 2, -3, 4], np.float32))
EOF
cc/bin/svodc compile m.onnx -o m.svod -q
out=$(cc/bin/svodrt run m.svod -i x=x.npy 2>/dev/null)
echo "$out"
[[ "$out" == "y: float32[4] [0, 2, 0, 4]" ]] || { echo "FAIL: the compiled bundle's output"; exit 1; }
step "done"
