"""Orchestration above every stage: run then evaluate, score your own maps, reproduce the notebooks, train the reference models."""
