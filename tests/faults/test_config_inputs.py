"""Issue 12 item 9: a run config is typed and validated when it is read — a wrong type, a typo'd key or model
parameter, a non-UTF-8 file is a :class:`~xbench.core.errors.FormatError` naming the file and the field, never a raw
traceback or a silently changed value (``batch_size: 4.7`` used to become 4, ``fixed_threshold: yes`` 1.0,
``datasets: phantom`` "Unknown dataset 'p'", ``params: {sigmaa: 0.3}`` was ignored)."""
from __future__ import annotations

import pytest
import yaml

from xbench.spec.config import RunConfig
from xbench.core.errors import FormatError

MINIMAL = {"output_dir": "out", "datasets": ["phantom"], "models": ["center_prior"]}

pytestmark = pytest.mark.usefixtures("phantom_cache")


# -- typed config -------------------------------------------------------------------------
@pytest.mark.parametrize("change, field, text", [
    ({"batch_size": 4.7}, "batch_size", "must be an integer, got 4.7"),
    ({"fixed_threshold": True}, "fixed_threshold", "must be a number, got True"),  # YAML `yes`
    ({"datasets": "phantom"}, "datasets", "must be a non-empty list"),
    ({"datasets": []}, "datasets", "must be a non-empty list"),
    ({"models": []}, "models", "must be a non-empty list"),
    ({"output_dir": None}, "output_dir", "must be a non-empty path"),
    ({"output_dir": ""}, "output_dir", "must be a non-empty path"),
    ({"device": "gpu"}, "device", "must be cpu, cuda, cuda:N, mps or auto"),
    ({"datasets": [None]}, "datasets", "needs a 'name'"),
    ({"datasets": [{"name": "phantom", "spilt": "test"}]}, "datasets[0]", "'spilt' (did you mean 'split'?)"),
    ({"datasets": [{"name": "phantom", "cases": "ten"}]}, "datasets[0].cases", "must be an integer"),
    ({"datasets": [{"name": "phantom", "split": "tets"}]}, "datasets[0].split", "no split 'tets' (did you mean 'test'?)"),
    ({"models": [{"name": "center_prior", "params": {"sigmaa": 0.3}}]}, "models[0].params", "'sigmaa' (did you mean 'sigma'?)"),
    ({"models": [{"name": "center_prior", "params": {"sigma": "wide"}}]}, "models[0].params.sigma", "must be a number"),
    ({"models": [{"name": "center_prior", "optional": "yes please"}]}, "models[0].optional", "must be true or false"),
    ({"allow_random_init": "yes"}, "allow_random_init", "must be true or false"),
])
def test_config_errors_are_typed_and_name_file_and_field(tmp_path, change, field, text):
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump({**MINIMAL, **change}))
    with pytest.raises(FormatError) as err:
        RunConfig.from_yaml(path)
    assert err.value.field == field and text in str(err.value) and str(path) in str(err.value)


def test_yaml_yes_for_a_threshold_is_an_error_not_one(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("output_dir: out\ndatasets: [phantom]\nmodels: [center_prior]\nfixed_threshold: yes\n")
    with pytest.raises(FormatError, match="fixed_threshold.*must be a number, got True"):
        RunConfig.from_yaml(path)


def test_non_utf8_config_is_a_format_error_with_line(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_bytes(b"output_dir: out\n# caf\xe9\ndatasets: [phantom]\nmodels: [center_prior]\n")
    with pytest.raises(FormatError, match="not UTF-8") as err:
        RunConfig.from_yaml(path)
    assert err.value.line == 2
