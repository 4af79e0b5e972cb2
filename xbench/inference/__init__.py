"""Running models over datasets: preflight checks, the decode-once input feed, precision options, the runner."""
