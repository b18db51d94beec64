"""The package's shape: imports point down the layers, no import cycles, Lightning only in namc.lit, and the model
library (create, load, generate, describe, benchmark) works with the training stack blocked."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "namc"
GOLDEN = ROOT / "tests" / "data" / "golden"

# ops <- text <- models <- backends <- objectives / data <- eval <- lit / cli (a module may import its own layer or
# below)
# curate sits between eval and lit (lit's embedding and precompute loops read its sources); experiment drives whole
# `namc fit` / `namc test` runs and sits above lit
RANKS = {
    "ops": 0,
    "_version": 0,
    "runtime": 0,  # process-wide settings (the allocator): imports nothing of namc
    "thresholds": 0,  # the measured cut-offs, read by every layer: imports nothing of namc
    "jsonl": 0,  # the bounded JSON reader and the JSONL writer: imports nothing of namc
    "locks": 0.5,  # one owner per output folder: imports only namc.jsonl
    "paths": 0,  # file references kept inside their folder: imports nothing of namc
    "kernels": 0.5,  # PyTorch's private CPU kernels and the per-call thread count: imports only namc.thresholds
    "yamltext": 0,  # the bounded YAML reader: imports nothing of namc
    "text": 1,
    "models": 2,  # the architecture in eager PyTorch: imports no runtime (namc.backends)
    "backends": 2.5,  # what makes a trained model fast (fused steps, oneDNN, int8, CUDA graphs)
    "objectives": 3,
    "data": 3,
    "deploy": 2.4,  # ONNX export and the runtimes' captioners over a trained model (namc.compile's onnx backends)
    "llm": 3.5,  # the OpenAI-compatible client, store and runner: curation, `namc eval lmm` and the judge share it
    "eval": 4,
    "curate": 4.5,
    "lit": 5,
    "experiment": 5.5,
}
TOP = 6  # namc/__init__.py, __main__.py, cli.py, describe_cli.py, inference.py
TRAINING_STACK = ("lightning", "pytorch_lightning", "jsonargparse")
OPTIONAL = (
    "pycocoevalcap",
    "tensorboard",
    "matplotlib",
    "skimage",
)  # extras: imported inside the functions that need them
# the [curate] extra: imported at module level only inside namc.curate and namc.llm, elsewhere inside the functions
# that need them
CURATE = ("faiss", "sklearn", "webdataset", "pyarrow", "openai")
# the [deploy] extra: imported inside the functions that need them, so that namc.inference imports without it (not
# blocked in the core-install run below: torch itself looks for onnx)
DEPLOY = ("onnx", "onnxruntime", "openvino")
# the [edits] extra: imported inside the functions that need them, so that namc[curate] works without it
EDITS = ("diffusers", "transformers", "accelerate")


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _rank(module: str) -> int:
    parts = module.split(".")
    return TOP if len(parts) == 1 else RANKS.get(parts[1], TOP)


def _imports(path: Path) -> list[tuple[str, int, bool]]:
    """(imported module, line, at module top level) for every import statement of a file, nested ones included."""
    tree = ast.parse(path.read_text(), str(path))
    top = {id(node) for node in tree.body}
    package = _module_name(path) if path.name == "__init__.py" else _module_name(path).rpartition(".")[0]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(alias.name, node.lineno, id(node) in top) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            found.append((base, node.lineno, id(node) in top))
            found += [(f"{base}.{alias.name}", node.lineno, id(node) in top) for alias in node.names]
    return found


FILES = sorted(PACKAGE.rglob("*.py"))


def _namc_modules() -> set[str]:
    return {_module_name(f) for f in FILES}


def test_imports_point_down_the_layers() -> None:
    known = _namc_modules()
    upward = []
    for path in FILES:
        me = _module_name(path)
        for target, line, _ in _imports(path):
            if target not in known or target == "namc":
                continue
            same_package = target.split(".")[:2] == me.split(".")[:2]
            if not same_package and _rank(target) >= _rank(me) and _rank(me) != TOP:
                upward.append(f"{path.relative_to(ROOT)}:{line} imports {target}")
    assert not upward, "imports against the layering (ops <- text <- models <- objectives/data <- eval <- lit):\n" + (
        "\n".join(upward)
    )


def test_the_training_stack_is_imported_only_in_namc_lit() -> None:
    offending = []
    for path in FILES:
        inside_lit = _module_name(path).startswith("namc.lit")
        for target, line, at_top in _imports(path):
            root = target.split(".")[0]
            if root in TRAINING_STACK and not inside_lit:
                offending.append(f"{path.relative_to(ROOT)}:{line} imports {target}")
            if root in OPTIONAL and at_top and not inside_lit:
                offending.append(f"{path.relative_to(ROOT)}:{line} imports {target} at module level")
            if root in (*DEPLOY, *EDITS) and at_top:
                offending.append(f"{path.relative_to(ROOT)}:{line} imports {target} at module level")
            if root in CURATE and at_top and not _module_name(path).startswith(("namc.curate", "namc.llm")):
                offending.append(
                    f"{path.relative_to(ROOT)}:{line} imports {target} at module level outside namc.curate / namc.llm"
                )
    assert not offending, "\n".join(offending)


def test_no_import_cycles_between_modules() -> None:
    known = _namc_modules()
    graph: dict[str, set[str]] = {}
    for path in FILES:
        me = _module_name(path)
        graph[me] = {t for t, _, at_top in _imports(path) if at_top and t in known and t != me and t != "namc"}
    # a package's __init__ re-exporting its own submodules is not a cycle: drop edges from a package to its children
    for me, targets in graph.items():
        graph[me] = {t for t in targets if not t.startswith(me + ".")}
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                cycle = stack[stack.index(nxt) :] + [nxt]
                raise AssertionError("import cycle: " + " -> ".join(cycle))
            if nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node)


def test_the_table_of_thresholds_imports_nothing() -> None:
    """namc.thresholds sits under every layer, so it may import nothing at all (not even torch)."""
    imported = {target for target, _, _ in _imports(PACKAGE / "thresholds.py")}
    assert imported <= {"__future__", "__future__.annotations"}, imported


# PyTorch's private CPU interfaces: called in namc.kernels only (what a PyTorch release may change, in one file)
PRIVATE = ("torch.ops.mkldnn", "torch.ops.onednn", "torch.ops.quantized", "torch.ao", "torch.cpu._")
KERNELS = PACKAGE / "kernels.py"
# the thread count changes inside a forward in namc.kernels only; a benchmark sets it once for its run
SETS_THREADS = (KERNELS, PACKAGE / "eval" / "throughput" / "harness.py")


def _dotted(node: ast.AST) -> str:
    """``torch.ops.mkldnn._linear_pointwise`` for that attribute chain, ``getattr(torch.cpu, "_x")`` as
    ``torch.cpu._x``; "" for anything else."""
    if isinstance(node, ast.Attribute):
        base = _dotted(node.value)
        return f"{base}.{node.attr}" if base else ""
    if isinstance(node, ast.Name):
        return node.id
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id in ("getattr", "hasattr")
        and len(node.args) >= 2
        and isinstance(node.args[1], ast.Constant)
    ):
        base = _dotted(node.args[0])
        return f"{base}.{node.args[1].value}" if base else ""
    return ""


def _private_uses(source: str) -> list[tuple[int, str]]:
    """(line, name) of every private torch interface and thread-count change ``source`` reaches."""
    found = []
    for node in ast.walk(ast.parse(source)):
        names = [_dotted(node)]
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
        for name in names:
            if name.startswith(PRIVATE) or name == "torch.set_num_threads":
                found.append((node.lineno, name))
    # the longest chain of each line: torch.ops.mkldnn.x, not also torch.ops.mkldnn
    return sorted({(ln, n) for ln, n in found if not any(m != n and m.startswith(n) and k == ln for k, m in found)})


def test_private_torch_kernels_are_called_in_one_module() -> None:
    outside = [
        f"{path.relative_to(ROOT)}:{line} {name}"
        for path in FILES
        if path != KERNELS
        for line, name in _private_uses(path.read_text())
        if not (name == "torch.set_num_threads" and path in SETS_THREADS)
    ]
    assert not outside, f"call these through namc.kernels: {outside}"
    assert {name.rsplit(".", 1)[0] for _, name in _private_uses(KERNELS.read_text())} >= {
        "torch.ops.mkldnn",
        "torch.ops.onednn.qconv2d_pointwise",
        "torch.ops.quantized",
    }


def test_the_private_use_check_finds_each_form() -> None:
    source = """
import torch.ao.quantization
from torch.ao import nn
torch.ops.mkldnn._linear_pointwise(x)
y = getattr(torch.cpu, "_is_vnni_supported", None)
hasattr(torch.ops.quantized, "linear_dynamic")
torch.set_num_threads(1)
torch.ops.aten.gelu_(x)
torch.get_num_threads()
"""
    names = [name for _, name in _private_uses(source)]
    assert names == [
        "torch.ao.quantization",
        "torch.ao",
        "torch.ops.mkldnn._linear_pointwise",
        "torch.cpu._is_vnni_supported",
        "torch.ops.quantized.linear_dynamic",
        "torch.set_num_threads",
    ], names


# Size by concept: a function's branches and statements are bounded by ruff (C901, PLR0915; pyproject.toml); a module
# holds one idea, and one over LINE_BUDGET lines says why in the first lines of its docstring, in a line that starts
# with SIZE_NOTE ("Size: one parser whose states share one table; split, each half would need the other's.").
LINE_BUDGET = 600
SIZE_NOTE = "Size: "


def _unexplained_size(source: str) -> bool:
    """Whether a module's ``source`` is over LINE_BUDGET lines without a SIZE_NOTE line (a reason of a few words at
    least) among the first 10 lines of its docstring."""
    if len(source.splitlines()) <= LINE_BUDGET:
        return False
    head = (ast.get_docstring(ast.parse(source)) or "").splitlines()[:10]
    return not any(line.startswith(SIZE_NOTE) and len(line.split()) >= 5 for line in head)


def test_a_module_over_the_line_budget_says_why_at_its_top() -> None:
    unexplained = [str(p.relative_to(ROOT)) for p in FILES if _unexplained_size(p.read_text())]
    assert not unexplained, (
        f"over {LINE_BUDGET} lines without a '{SIZE_NOTE}...' line atop the docstring: {unexplained}"
    )


def test_the_line_budget_check_reads_the_top_of_the_docstring() -> None:
    body = "x = 1\n" * LINE_BUDGET
    assert not _unexplained_size('"""Short."""\n' + "x = 1\n" * (LINE_BUDGET - 1))
    assert _unexplained_size('"""Long."""\n' + body)
    assert not _unexplained_size('"""Long.\n\nSize: one parser whose states share a table."""\n' + body)
    assert _unexplained_size('"""Long.\n\nSize: big."""\n' + body)  # a reason, not a word
    assert _unexplained_size('"""Long."""\n' + body + "# Size: one parser whose states share a table.\n")


def test_no_function_is_too_complex() -> None:
    """ruff's C901 (branches) and PLR0915 (statements) at pyproject.toml's thresholds, where ruff is installed (the
    [dev] extra); ``ruff check`` runs the same rules with the others."""
    pytest.importorskip("ruff")
    cmd = [sys.executable, "-m", "ruff", "check", "--no-cache", "--select", "C901,PLR0915", "namc", "tests"]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]


_BLOCKER = """
import importlib.abc, sys
BLOCKED = {blocked!r}
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {{name!r}} (blocked by the core-install test)", name=name)
sys.meta_path.insert(0, Block())
"""


def _run_core(code: str, tmp_path: Path) -> subprocess.CompletedProcess:
    script = _BLOCKER.format(blocked=(*TRAINING_STACK, *OPTIONAL)) + textwrap.dedent(code)
    env = {"HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"}
    return subprocess.run(
        [sys.executable, "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )


@pytest.mark.slow  # a fresh interpreter
def test_the_model_library_works_without_the_training_stack(tmp_path: Path) -> None:
    from PIL import Image

    Image.new("RGB", (70, 50), (200, 30, 30)).save(tmp_path / "a.png")
    Image.new("RGB", (64, 64), (30, 30, 200)).save(tmp_path / "b.png")
    code = f"""
    import contextlib, io, json, sys
    import torch
    import namc
    from namc.cli import main
    model = namc.from_pretrained({str(GOLDEN / "namc_tiny")!r})
    g = torch.Generator().manual_seed(123)
    x1, x2 = torch.rand(3, 3, 64, 64, generator=g), torch.rand(3, 3, 64, 64, generator=g)
    ids = model.generate_ids(x1, x2).tolist()
    fresh = namc.create_model("namc_tiny").eval()
    caption = namc.describe(model, "a.png", "b.png")
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        described = main(["describe", "a.png", "b.png", "--model", {str(GOLDEN / "namc_tiny")!r}])
        try:
            main(["benchmark", "--help"])
        except SystemExit as exit:
            bench_help = exit.code
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        fit = main(["fit", "--help"])
    heavy = sorted({{"lightning", "jsonargparse", "pycocoevalcap", "tensorboard", "matplotlib"}} & set(sys.modules))
    print(json.dumps({{"ids": ids, "caption": caption, "cli": out.getvalue().splitlines()[0], "described": described,
                      "bench_help": bench_help, "fit": fit, "fit_err": err.getvalue(), "heavy": heavy}}))
    """
    proc = _run_core(code, tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    expected = json.loads((GOLDEN / "expected.json").read_text())
    assert result["ids"] == expected["ids"]
    assert result["described"] == 0 and result["cli"] == result["caption"]
    assert result["bench_help"] == 0
    assert result["fit"] == 2 and 'pip install "namc[train]"' in result["fit_err"]
    assert result["heavy"] == []


@pytest.mark.slow  # fresh interpreters
def test_import_namc_is_cheap_and_versioned() -> None:
    code = "import sys, namc; print(namc.__version__, 'torch' in sys.modules)"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    version, torch_loaded = proc.stdout.split()
    assert version.count(".") == 2 and torch_loaded == "False"
    proc = subprocess.run([sys.executable, "-m", "namc", "--version"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == f"namc {version}"


@pytest.mark.parametrize("name", ["NAMC", "create_model", "describe", "from_pretrained", "load_model", "ops"])
def test_public_names_resolve(name: str) -> None:
    import namc

    assert getattr(namc, name) is not None and name in dir(namc)
