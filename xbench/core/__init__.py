"""Foundations every stage uses: typed errors, the one atomic writer, logging and progress."""
