"""Packaging shim: map the top-level ``data_manifests/`` and ``notebooks/`` folders into the wheel as
``xbench/data_manifests`` and ``xbench/notebooks`` (everything else is in pyproject.toml)."""
from setuptools import find_packages, setup

EXTRA = {"xbench.data_manifests": "data_manifests", "xbench.notebooks": "notebooks"}

setup(packages=find_packages(include=["xbench*"]) + list(EXTRA), package_dir=EXTRA)
