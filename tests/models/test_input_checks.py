"""Every adapter's ``predict`` refuses pixels of the wrong size with an error naming expected and received shapes."""
from __future__ import annotations

import re

import pytest
import torch

from xbench.models.base import create_model

MODELS = ["medklip", "mavl", "ref_xattn", "ref_patchsim", "kad", "carzero", "clip"]


@pytest.fixture(scope="module", params=MODELS)
def model(request):
    kwargs = {} if request.param.startswith("ref_") else {"random_init": True}
    return create_model(request.param, **kwargs)


def test_wrong_input_size_is_a_clear_error(model):
    size = model.input_size
    for shape in [(1, 3, size + 32, size + 32), (2, 1, size, size), (3, size, size)]:
        with pytest.raises(ValueError, match=re.escape(f"(B, 3, {size}, {size})")) as err:
            model.predict(torch.zeros(shape), ["pneumonia"])
        assert str(tuple(shape)) in str(err.value)
