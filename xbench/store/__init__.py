"""The results store: per-case scores and maps in atomic, indexed chunks, with fingerprints of their inputs."""
