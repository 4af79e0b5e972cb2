"""Packaging shim: map the top-level ``data_manifests/`` and ``notebooks/`` folders into the wheel as
``xbench/data_manifests`` and ``xbench/notebooks`` (everything else is in pyproject.toml).

Data-only folders (``xbench/configs/models``, ``xbench/reference_weights/<model>``, ...) are listed as
namespace packages so that setuptools ships them without its "Package would be ignored" warning."""
from setuptools import find_namespace_packages, setup

EXTRA = {"xbench.data_manifests": "data_manifests", "xbench.notebooks": "notebooks"}

setup(packages=find_namespace_packages(include=["xbench", "xbench.*"], exclude=["*__pycache__*"]) + list(EXTRA),
      package_dir=EXTRA)
