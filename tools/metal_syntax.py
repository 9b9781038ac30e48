# Copyright © 2026 Apple Inc.

"""Check that DeepSeek-V4.1's Sinkhorn kernel and mlx_lm.kernels' hyper-connection
kernels parse as Metal, on a machine with no Metal compiler.

Usage: PYTHONPATH=build/dev python tools/metal_syntax.py

Each kernel's source is wrapped in the signature ``mx.fast.metal_kernel``
gives it (inputs as ``const device`` pointers, outputs as ``device`` pointers,
template arguments as template parameters, the thread's grid position), Metal's
address spaces and attributes stubbed out, and the result compiled with
``g++ -fsyntax-only`` for float32 and bfloat16 inputs. This finds syntax and
type errors in what the kernels share with their CUDA form, not Metal's own
rules: a macOS run of tests/test_deepseek_v41.py and tests/test_kernels.py is
the real check.
"""

import subprocess
import sys
import tempfile
from unittest import mock

import mlx.core as mx

PRELUDE = """
#include <cmath>
#define device
#define constant
typedef unsigned int uint;
struct uint3 { uint x, y, z; };
struct bfloat16_t {
    float v;
    bfloat16_t() = default;
    bfloat16_t(float f) : v(f) {}
    operator float() const { return v; }
};
namespace metal {
using std::exp;
// Names in Metal's standard library that a kernel's arguments may shadow.
template <typename U> U mix(U a, U b, U t) { return a + (b - a) * t; }
template <typename U> U max(U a, U b) { return a > b ? a : b; }
}
using namespace metal;
"""

# The kernels' arguments: (name, dtype or "T"), and template parameters.
KERNELS = {
    "deepseek_v41_sinkhorn": {
        "inputs": [("comb", "float"), ("eps", "float")],
        "outputs": [("out", "float")],
        "template": "int HC, int ITERS",
        "args": "4, 20",
    },
    "hc_collapse": {
        "inputs": [
            ("streams", "T"),
            ("mix", "float"),
            ("scale", "float"),
            ("base", "float"),
            ("eps", "float"),
        ],
        "outputs": [("x", "T"), ("post", "float"), ("comb", "float")],
        "template": "int HC, int D, typename T, int ITERS",
        "args": "4, 4096, {T}, 20",
    },
    "hc_expand": {
        "inputs": [
            ("x", "T"),
            ("residual", "T"),
            ("post", "float"),
            ("comb", "float"),
        ],
        "outputs": [("out", "T")],
        "template": "int HC, int D, typename T",
        "args": "4, 4096, {T}",
    },
}


def sources():
    """The sources deepseek_v41 and the hyper-connection kernels give
    metal_kernel, by kernel name."""
    import importlib

    import mlx_lm.models.deepseek_v41  # noqa: F401

    # The package's names are its kernels' functions: the modules by name.
    names = ["_common", "hc_collapse", "hc_expand"]
    modules = [sys.modules[f"mlx_lm.kernels.{n}"] for n in names]
    modules.append(sys.modules["mlx_lm.models.deepseek_v41"])
    found = {}

    def record(name, input_names, output_names, source, **kwargs):
        found[name] = source
        return lambda **kw: None

    with mock.patch.object(mx.metal, "is_available", return_value=True), mock.patch(
        "mlx.core.fast.metal_kernel", side_effect=record
    ):
        for module in modules:
            importlib.reload(module)
    return found


def arguments(spec, dtype, source):
    """(type, name) of each argument, as metal_kernel writes the signature:
    the inputs, each with its shape where the source reads it, the outputs,
    the thread's position."""
    args = []
    for i, (name, kind) in enumerate(spec["inputs"] + spec["outputs"]):
        const = "const " if i < len(spec["inputs"]) else ""
        args.append((f"{const}device {dtype if kind == 'T' else kind}*", name))
        if f"{name}_shape" in source:
            args.append(("const constant int*", f"{name}_shape"))
    return args + [("uint3", "thread_position_in_grid")]


def wrap(name, source, dtype):
    spec = KERNELS[name]
    args = arguments(spec, dtype, source)
    return (
        f"template <{spec['template']}>\n"
        f"void {name}(\n    " + ",\n    ".join(f"{t} {n}" for t, n in args) + ") {\n"
        f"{source}\n}}\n"
        # Instantiate the template so its body is checked with types.
        f"template void {name}<{spec['args'].format(T=dtype)}>("
        + ", ".join(t for t, _ in args)
        + ");\n"
    )


def main():
    found = sources()
    missing = set(KERNELS) - set(found)
    if missing:
        sys.exit(f"no Metal source for {sorted(missing)}")
    failed = False
    for name, source in found.items():
        if name not in KERNELS:
            sys.exit(f"{name}: add its signature to KERNELS")
        generic = any(t == "T" for _, t in KERNELS[name]["inputs"])
        for dtype in ("float", "bfloat16_t") if generic else ("float",):
            code = PRELUDE + wrap(name, source, dtype)
            with tempfile.NamedTemporaryFile("w", suffix=".cpp") as f:
                f.write(code)
                f.flush()
                run = subprocess.run(
                    ["g++", "-std=c++14", "-fsyntax-only", f.name],
                    capture_output=True,
                    text=True,
                )
            failed |= run.returncode != 0
            status = "FAILED" if run.returncode else "ok"
            if run.returncode == 0 and run.stderr:
                status += ", with warnings"
            print(f"{name} ({dtype}): {status}")
            if run.returncode:
                print(run.stderr)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
