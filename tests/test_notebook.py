"""The quick-start notebook runs top to bottom (so it never rots)."""

from __future__ import annotations

import ast
import importlib
import inspect
from pathlib import Path

import nbformat
import pytest

# the notebook's heaviest import, loaded while collecting (as other test modules load theirs), not inside a test
pytest.importorskip("lightning.pytorch")

NOTEBOOK = Path(__file__).resolve().parents[1] / "notebooks" / "quickstart.ipynb"


@pytest.mark.slow  # a notebook kernel
def test_quickstart_notebook_executes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    nbclient = pytest.importorskip("nbclient")
    monkeypatch.setenv("TMPDIR", str(tmp_path))  # the kernel's tempfile.mkdtemp: nothing left in /tmp
    nb = nbformat.read(NOTEBOOK, as_version=4)
    client = nbclient.NotebookClient(
        nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    )
    client.execute()
    outputs = [o for cell in nb.cells if cell.cell_type == "code" for o in cell.get("outputs", [])]
    assert not [o for o in outputs if o.get("output_type") == "error"]
    text = "".join(o.get("text", "") for o in outputs if o.get("output_type") == "stream")
    assert "predicted:" in text and "CIDEr-D" in text
    assert any("image/png" in o.get("data", {}) for o in outputs)  # the pair and the relevance maps were drawn


def test_quickstart_notebook_names_what_namc_has() -> None:
    """The notebook's code, checked without running it: every cell compiles, every module and name it imports
    exists, and every call of a namc function or class passes arguments its signature accepts (what rots first
    when the library changes; the run above executes it)."""
    nb = nbformat.read(NOTEBOOK, as_version=4)
    names: dict[str, object] = {}
    calls = []
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        tree = ast.parse(cell.source)
        compile(tree, "<notebook cell>", "exec")
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    module = importlib.import_module(alias.name)
                    names[alias.asname or alias.name.split(".")[0]] = importlib.import_module(alias.name.split(".")[0])
                    assert module is not None
            elif isinstance(node, ast.ImportFrom):
                module = importlib.import_module(node.module)
                for alias in node.names:
                    assert hasattr(module, alias.name), f"{node.module} has no {alias.name}"
                    names[alias.asname or alias.name] = getattr(module, alias.name)
            elif isinstance(node, ast.Call):
                calls.append(node)
    checked = 0
    for call in calls:
        target = _resolve(call.func, names)
        if target is None or not getattr(target, "__module__", "").startswith("namc"):
            continue
        assert not any(isinstance(a, ast.Starred) for a in call.args) and all(k.arg for k in call.keywords)
        inspect.signature(target).bind(*call.args, **{k.arg: k.value for k in call.keywords})
        checked += 1
    assert checked >= 8  # create_model, the data modules, FinetuneModule, PretrainModule, the plots...


def _resolve(node: ast.expr, names: dict[str, object]) -> object | None:
    """The object an expression like ``namc.create_model`` or ``FinetuneModule`` names, if it is a module's name."""
    if isinstance(node, ast.Name):
        return names.get(node.id)
    if isinstance(node, ast.Attribute):
        owner = _resolve(node.value, names)
        return getattr(owner, node.attr, None) if inspect.ismodule(owner) else None
    return None
