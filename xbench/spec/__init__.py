"""What describes a run: the YAML schema, the registry of model and dataset YAMLs, manifests, findings, run configs."""
