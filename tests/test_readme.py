"""The README's commands and Python snippets run as written.

The fast tests lay out what `namc demo` writes (a shapes-world benchmark and a saved model) at the fast scale and run
the quick start's Python on it, and check that every command names a real subcommand and every config and link a
real file; the slow tests run the quick start's shell commands themselves, the demo included.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

import namc
from namc.cli import _COMMANDS
from namc.data.synthetic import generate_benchmark

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))


def _blocks(language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```", README.read_text(), re.S | re.M)


def _commands() -> list[list[str]]:
    """Every `namc ...` command of the README's shell blocks, as argument lists ($C and $D expanded)."""
    commands = []
    for block in _blocks("bash"):
        for name, value in re.findall(r"^(\w+)=(\S+)$", block, re.M):
            block = block.replace(f"${name}", value)
        for line in block.splitlines():
            line = line.split("  #", 1)[0].strip()
            for part in line.split("&&"):
                words = shlex.split(part)
                if words and words[0] == "namc":
                    commands.append(words)
    return commands


def _slug(heading: str) -> str:
    """GitHub's anchor of a markdown heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    return {_slug(h) for h in re.findall(r"^#+ (.+)$", path.read_text(), re.M)}


def test_readme_is_a_guide_of_about_200_lines() -> None:
    assert len(README.read_text().splitlines()) <= 220


def test_every_readme_command_is_a_namc_subcommand_with_real_configs() -> None:
    commands = _commands()
    assert len(commands) >= 10
    for words in commands:
        assert words[1] in _COMMANDS, f"README runs an unknown command: {' '.join(words)}"
        for flag, value in zip(words, words[1:]):
            if flag == "--config":
                assert (ROOT / value).is_file(), f"README names a missing config: {value}"


@pytest.mark.parametrize("page", [README, *DOCS], ids=lambda p: p.name)
def test_relative_links_point_at_files_and_headings(page: Path) -> None:
    text = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.S | re.M)
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+:", target):
            continue
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        assert file.exists(), f"{page.name} links to a missing file: {target}"
        if anchor and file.suffix == ".md":
            assert anchor in _anchors(file), f"{page.name} links to a missing heading: {target}"


def _lay_out_the_demo(root: Path) -> None:
    """What the quick start reads from `namc demo`, at the fast scale: the benchmark and the fine-tuned model."""
    generate_benchmark(root / "runs/demo/data/clevr_change", 12, image_size=64, seed=0)
    model = namc.create_model("namc_tiny", dim=32)
    model.save_pretrained(root / "runs/demo/runs/finetune/model")


def test_quick_start_python_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    _lay_out_the_demo(tmp_path)
    monkeypatch.chdir(tmp_path)
    scope: dict = {}
    exec(_blocks("python")[0], scope)
    assert len(scope["captions"]) == 4 and all(isinstance(c, str) for c in scope["captions"])
    assert capsys.readouterr().out.count("\n") == 1  # the described pair's caption (a random model's may be empty)


@pytest.mark.slow
def test_quick_start_commands_run(tmp_path: Path) -> None:
    # the demo command of the quick start (without its venv set-up), then the describe command after it
    env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE", "HF_HUB_OFFLINE": "1"}
    namc = [sys.executable, "-m", "namc"]
    demo = next(c for c in _commands() if c[1] == "demo")
    subprocess.run([*namc, *demo[1:], "--quiet"], cwd=tmp_path, env=env, check=True, capture_output=True, timeout=900)
    describe = next(c for c in _commands() if c[1] == "describe")
    out = subprocess.run([*namc, *describe[1:]], cwd=tmp_path, env=env, check=True, capture_output=True, text=True)
    assert out.stdout.strip()
