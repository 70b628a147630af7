"""kernels/pdl.py: when the layer kernels launch with programmatic dependent launch.

The launch itself is checked on a GPU (tests/gpu/test_pdl_gpu.py: bit-equal forwards with and
without it); here, the policy: never on a CPU tensor or under the interpreter, and --no-pdl
turns it off everywhere.
"""

from __future__ import annotations

import pytest
import torch

from specserve.kernels import pdl


@pytest.fixture(autouse=True)
def restore():
    yield
    pdl.set_enabled(True)


def test_cpu_tensors_never_launch_with_pdl() -> None:
    x = torch.zeros(4)
    assert pdl.enabled()
    assert not pdl.active(x)
    assert pdl.launch_options(x) == {"PDL": False}


def test_switch_off_wins_everywhere(monkeypatch) -> None:
    fake_cuda = torch.zeros(1)
    monkeypatch.setattr(pdl, "_device_supports", lambda device: True)
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda self: True))
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    if pdl.gdc_wait is None:
        pytest.skip("this Triton has no griddepcontrol helpers")
    assert pdl.launch_options(fake_cuda) == {"PDL": True, "launch_pdl": True}
    pdl.set_enabled(False)
    assert pdl.launch_options(fake_cuda) == {"PDL": False}
    pdl.set_enabled(True)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert pdl.launch_options(fake_cuda) == {"PDL": False}


def test_server_flag_reaches_the_engine_config() -> None:
    from specserve.server.cli import build_parser, engine_config

    parser = build_parser()
    assert engine_config(parser.parse_args(["serve"])).pdl is True
    assert engine_config(parser.parse_args(["serve", "--no-pdl"])).pdl is False
