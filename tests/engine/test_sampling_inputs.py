"""SamplingTensors: the per-request parameter rows the sampling kernels read."""

from __future__ import annotations

import pytest

from specserve.engine.request import Request
from specserve.engine.types import SamplingParams

torch = pytest.importorskip("torch")

from specserve.engine.runner.sampling_inputs import SamplingTensors  # noqa: E402


def _request(i: int) -> Request:
    params = SamplingParams(temperature=0.5 + i, top_k=i, top_p=0.9, min_p=0.01 * i, seed=i)
    return Request(f"r{i}", [1, 2, 3], params, seed=100 + i, eos_token_ids=(), max_tokens=8,
                   arrival=0.0)


@pytest.mark.parametrize("n", range(1, 10))
def test_every_row_holds_its_values_and_starts_16_byte_aligned(n):
    """Rows of one [3, B] tensor would start unaligned for B not a multiple of 4, and the Triton
    sampler compiles (or copies) for unaligned pointers; rows are padded so it never has to."""
    reqs = [_request(i) for i in range(n)]
    st = SamplingTensors.build(reqs, list(range(n)), torch.device("cpu"))
    fields = (st.temperature, st.top_k, st.top_p, st.min_p, st.seeds, st.positions)
    assert all(t.shape == (n,) and t.data_ptr() % 16 == 0 for t in fields)
    assert st.temperature.tolist() == pytest.approx([0.5 + i for i in range(n)])
    assert st.top_k.tolist() == list(range(n))
    assert st.seeds.tolist() == [100 + i for i in range(n)]
    assert st.positions.tolist() == list(range(n))
    assert st.min_p.tolist() == pytest.approx([0.01 * i for i in range(n)])
