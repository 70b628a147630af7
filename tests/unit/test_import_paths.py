"""specserve/_import_paths.py: a checkout's kernels/ folder on sys.path does not shadow an installed
package named ``kernels`` (transformers >= 5.25 imports Hugging Face's). Each case runs in a fresh
interpreter, since it changes how ``import kernels`` resolves."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _run(tmp_path: Path, call_it: bool) -> str:
    checkout = tmp_path / "checkout"
    (checkout / "kernels").mkdir(parents=True)
    (checkout / "kernels" / "__init__.py").write_text("WHO = 'checkout'\n")
    installed = tmp_path / "site"
    (installed / "kernels").mkdir(parents=True)
    (installed / "kernels" / "__init__.py").write_text("WHO = 'installed'\n")
    (installed / "kernels" / "layer.py").write_text("WHO = 'installed submodule'\n")
    code = textwrap.dedent(f"""
        import importlib.util, sys
        from pathlib import Path
        spec = importlib.util.spec_from_file_location("_ip", {str(ROOT / "specserve" / "_import_paths.py")!r})
        ip = importlib.util.module_from_spec(spec); spec.loader.exec_module(ip)
        sys.path[:0] = [{str(checkout)!r}, {str(installed)!r}]
        if {call_it}:
            assert ip.keep_installed_kernels_package(Path({str(checkout)!r}))
            assert not ip.keep_installed_kernels_package(Path({str(checkout)!r}))   # once
        import kernels, kernels.layer
        print(kernels.WHO, "|", kernels.layer.WHO if hasattr(kernels, "layer") else "-")
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    return out.stdout.strip() + out.stderr.strip()


def test_the_installed_kernels_package_wins_over_the_checkouts_folder(tmp_path):
    assert _run(tmp_path, call_it=True) == "installed | installed submodule"


def test_without_it_the_checkouts_folder_shadows_the_installed_package(tmp_path):
    """The failure the module prevents (so the case above can fail)."""
    assert "ModuleNotFoundError" in _run(tmp_path, call_it=False)   # checkout's kernels: no .layer
