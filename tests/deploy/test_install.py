"""``pip install .`` into a fresh virtual environment: one ``specserve`` namespace and nothing generic.

The working tree (tracked files plus untracked ones git does not ignore) is copied to a temporary
folder and installed from there the ordinary way: pip builds the wheel in an isolated build
environment (setuptools from the index, as for any user) and installs it with ``--no-deps`` into a
venv created for the test, so torch and the other dependencies are not downloaded. A Python started
outside the checkout then imports ``specserve`` from site-packages and finds none of ``server``,
``engine``, ``kernels``, ``bench`` or ``benchmarks``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tomllib
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
GENERIC = ("server", "engine", "kernels", "bench", "benchmarks")
# modules that import no torch, so the venv without dependencies can import them for real
TORCH_FREE = ("specserve.engine.scheduler", "specserve.engine.kv_cache", "specserve.engine.request")
SUBPACKAGES = ("specserve.server", "specserve.engine", "specserve.kernels", "specserve.bench",
               "specserve.engine.runner", "specserve.engine.models", "specserve.engine.demo")

PROBE = """
import importlib, importlib.util, json, sys
import specserve
out = {"specserve": specserve.__file__, "version": specserve.__version__, "path": sys.path,
       "generic": {name: importlib.util.find_spec(name) is not None for name in %(generic)r}}
for name in %(torch_free)r:
    out.setdefault("imported", {})[name] = importlib.import_module(name).__file__
for name in %(subpackages)r:
    out.setdefault("found", {})[name] = importlib.util.find_spec(name).origin
print(json.dumps(out))
"""


def _copy_worktree(dest: Path) -> None:
    names = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                           cwd=ROOT, capture_output=True, check=True).stdout.decode().split("\0")
    for name in filter(None, names):
        src = ROOT / name
        if src.is_file():   # a tracked file deleted in the working tree is not copied
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)


def _source_packages(src: Path) -> set[str]:
    """Every folder with an ``__init__.py`` below the package-dir roots, as a dotted name."""
    roots = tomllib.loads((src / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    found = set()
    for name, folder in roots.items():
        for init in (src / folder).rglob("__init__.py"):
            rel = init.parent.relative_to(src / folder).parts
            found.add(".".join((name, *rel)))
    return found


def _clean_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    return env


@pytest.mark.slow   # about 20-30 s: a real build in an isolated environment
def test_pip_install_gives_one_specserve_namespace(tmp_path: Path) -> None:
    src, env_dir, elsewhere = tmp_path / "src", tmp_path / "venv", tmp_path / "elsewhere"
    _copy_worktree(src)
    elsewhere.mkdir()
    venv.create(env_dir, with_pip=True, clear=True)
    python = env_dir / "bin" / "python"
    env = _clean_env()
    install = subprocess.run([str(python), "-m", "pip", "install", "--no-deps", "."],
                             cwd=src, env=env, capture_output=True, text=True, timeout=600)
    assert install.returncode == 0, install.stdout[-3000:] + install.stderr[-3000:]

    probe = PROBE % dict(generic=GENERIC, torch_free=TORCH_FREE, subpackages=SUBPACKAGES)
    run = subprocess.run([str(python), "-c", probe], cwd=elsewhere, env=env,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-3000:]
    found = json.loads(run.stdout)
    site = next(Path(p) for p in found["path"] if p.endswith("site-packages") and p.startswith(str(env_dir)))
    assert Path(found["specserve"]).is_relative_to(site), found["specserve"]
    assert found["generic"] == {name: False for name in GENERIC}
    for where in [*found["imported"].values(), *found["found"].values()]:
        assert Path(where).is_relative_to(site / "specserve"), where
    assert str(ROOT) not in json.dumps(found["path"]), "the checkout leaked onto sys.path"

    # what the wheel put into site-packages: the package, its metadata, the console script
    dist_info = next(site.glob("specserve-*.dist-info"))
    assert (dist_info / "top_level.txt").read_text().split() == ["specserve"]
    tops = {line.split(",")[0].split("/")[0] for line in (dist_info / "RECORD").read_text().splitlines()}
    assert tops == {"specserve", dist_info.name, ".."}, tops
    assert (env_dir / "bin" / "specserve").is_file()
    assert (site / "specserve" / "engine" / "demo" / "target" / "config.json").is_file()
    assert not any((site / name).exists() for name in GENERIC)
    installed = {".".join(init.parent.relative_to(site).parts) for init in (site / "specserve").rglob("__init__.py")}
    missing = _source_packages(src) - installed
    assert not missing, f"packages in the tree but not in the wheel (add them to pyproject.toml): {missing}"
