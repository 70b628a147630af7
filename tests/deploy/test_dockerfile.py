"""The Dockerfile: hadolint at its strictest threshold, plus the promises the image makes.

No image can be built here (no Docker engine), so the text is checked instead: the final stage
installs a C compiler (Triton builds its launchers at run time), CUDA comes once (torch's wheels on a
plain Python base), torch is the GPU machine's tested 2.11, base images are pinned by digest, package
installs use BuildKit cache mounts, OCI labels are set, and every file a COPY names exists and is not
excluded by .dockerignore.
"""

from __future__ import annotations

import fnmatch
import json
import re

from tests.deploy._tools import ROOT, find_tool, run

DOCKERFILE = ROOT / "Dockerfile"


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs with line continuations joined and comments dropped."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def final_stage() -> list[tuple[str, str]]:
    ins = instructions()
    last_from = max(i for i, (word, _) in enumerate(ins) if word == "FROM")
    return ins[last_from:]


def named_stage(name: str) -> list[tuple[str, str]]:
    """The instructions of stage ``name`` (``FROM ... AS name``) up to the next FROM."""
    ins = instructions()
    start = next(i for i, (w, rest) in enumerate(ins) if w == "FROM" and rest.endswith(f" AS {name}"))
    end = next((i for i in range(start + 1, len(ins)) if ins[i][0] == "FROM"), len(ins))
    return ins[start:end]


def build_args() -> dict[str, str]:
    return dict(re.match(r"(\w+)=(\S+)", rest).groups() for word, rest in instructions()
                if word == "ARG" and "=" in rest)


def apt_packages(runs: list[str]) -> set[str]:
    """Package names (versions dropped) that ``apt-get install`` lines among ``runs`` install."""
    names = set()
    for cmd in runs:
        for part in re.findall(r"apt-get install ([^&|;]+)", cmd):
            names |= {w.split("=")[0] for w in part.split() if not w.startswith("-")}
    return names


def test_hadolint_clean() -> None:
    proc = run([find_tool("hadolint"), "--failure-threshold", "style", str(DOCKERFILE)])
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_base_images_are_pinned_by_digest() -> None:
    args = build_args()
    froms = [rest.split()[0] for word, rest in instructions() if word == "FROM"]
    images = {args[f[2:-1]] if f.startswith("${") else f for f in froms}
    images -= {rest.split()[-1] for w, rest in instructions() if w == "FROM" and " AS " in rest}  # stage names
    assert images, froms
    for image in images:
        assert re.fullmatch(r"[\w./-]+:[\w.-]+@sha256:[0-9a-f]{64}", image), f"{image}: pin a tag and a digest"


def test_final_stage_has_a_c_compiler_for_triton() -> None:
    stage = final_stage()
    runs = [rest for w, rest in stage if w == "RUN"]
    installed = apt_packages(runs)
    # Triton compiles its launcher stubs with the C compiler at first use, on the serving machine
    assert {"gcc", "libc6-dev"} <= installed, installed
    assert any("gcc --version" in r for r in runs), "the build should prove the compiler runs"
    env = " ".join(rest for w, rest in stage if w == "ENV")
    assert "CC=/usr/bin/gcc" in env
    # the compiler is installed as root, before the switch to the unprivileged user
    words = [w for w, _ in stage]
    gcc_run = next(i for i, (w, rest) in enumerate(stage) if w == "RUN" and "gcc" in rest)
    assert gcc_run < words.index("USER")
    # Python.h ships with the official python images (Triton's launcher includes it), so the final
    # stage must be such an image, the same one the venv was built on (its symlinks point into it)
    assert stage[0] == ("FROM", "${PYTHON_IMAGE}")
    assert named_stage("build")[0] == ("FROM", "${PYTHON_IMAGE} AS build")
    assert re.match(r"python:3\.\d+(\.\d+)?-slim", build_args()["PYTHON_IMAGE"])


def test_one_cuda_from_torch_wheels_pinned_to_the_tested_stack() -> None:
    args = build_args()
    # no CUDA base image, no CUDA toolkit packages: CUDA comes only with torch's nvidia-* wheels
    assert not any("nvidia/cuda" in v for v in args.values())
    assert not {p for p in apt_packages([r for w, r in instructions() if w == "RUN"]) if "cuda" in p}
    # torch 2.11 with CUDA 13.0: what the GPU machine's tests ran on
    assert args["TORCH_VERSION"] == "2.11.0"
    assert args["TORCH_INDEX_URL"] == "https://download.pytorch.org/whl/cu130"
    env = " ".join(rest for w, rest in final_stage() if w == "ENV")
    assert "NVIDIA_DRIVER_CAPABILITIES=compute,utility" in env, "ask the container toolkit for libcuda"


def test_builds_use_cache_mounts_and_layer_dependencies_before_sources() -> None:
    assert DOCKERFILE.read_text().startswith("# syntax=docker/dockerfile:1")
    for word, rest in instructions():
        if word == "RUN" and ("uv pip install" in rest or "apt-get install" in rest):
            assert rest.startswith("--mount=type=cache"), f"no cache mount: RUN {rest[:80]}"
    build = named_stage("build")
    copies = [rest for w, rest in build if w == "COPY" and "--from=" not in rest]
    runs = [i for i, (w, rest) in enumerate(build) if w == "RUN"]
    deps = next(i for i in runs if "-r pyproject.toml" in build[i][1])
    first_source = next(i for i, (w, rest) in enumerate(build) if w == "COPY" and rest.startswith("server"))
    assert deps < first_source, "dependencies install before any source is copied"
    assert copies[0] == "pyproject.toml ./"
    assert any("--no-deps ." in build[i][1] for i in runs if i > first_source)


def test_oci_labels() -> None:
    labels = " ".join(rest for w, rest in final_stage() if w == "LABEL")
    found = dict(re.findall(r"org\.opencontainers\.image\.([\w.]+)=\"([^\"]*)\"", labels))
    for key in ("title", "description", "licenses", "source", "version", "revision", "created", "base.name"):
        assert found.get(key), f"org.opencontainers.image.{key} is missing"
    assert found["version"] == "${VERSION}" and found["revision"] == "${REVISION}"


def test_runtime_stage_promises() -> None:
    stage = final_stage()
    words = [w for w, _ in stage]
    user = [rest for w, rest in stage if w == "USER"]
    assert user and not user[-1].startswith(("root", "0")), "the server must not run as root"
    assert ("EXPOSE", "8000") in stage
    health = next(rest for w, rest in stage if w == "HEALTHCHECK")
    assert "/health" in health and "--start-period" in health
    entry = json.loads(next(rest for w, rest in stage if w == "ENTRYPOINT"))
    assert entry[:2] == ["specserve", "serve"]
    assert entry[entry.index("--host") + 1] == "0.0.0.0" and entry[entry.index("--port") + 1] == "8000"
    assert words.index("USER") < words.index("ENTRYPOINT")


def _ignored(path: str, patterns: list[str]) -> bool:
    """Docker's rule: the last matching pattern wins; '!' re-includes."""
    ignored = False
    for pat in patterns:
        negate = pat.startswith("!")
        pat = pat.lstrip("!").rstrip("/")
        if fnmatch.fnmatch(path, pat) or path.startswith(pat + "/"):
            ignored = not negate
    return ignored


def test_copy_sources_exist_and_reach_the_build_context() -> None:
    patterns = [p.strip() for p in (ROOT / ".dockerignore").read_text().splitlines()
                if p.strip() and not p.startswith("#")]
    sources = []
    for word, rest in instructions():
        if word == "COPY" and "--from=" not in rest:
            sources += rest.split()[:-1]
    assert {"pyproject.toml", "specserve", "server", "engine", "kernels", "bench"} <= set(sources)
    for src in sources:
        assert (ROOT / src).exists(), f"COPY {src}: not in the repository"
        assert not _ignored(src, patterns), f"COPY {src}: excluded by .dockerignore"
    assert _ignored("tests/deploy/test_dockerfile.py", patterns) and _ignored(".venv", patterns)
