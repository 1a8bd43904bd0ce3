"""``hami simulate``: place pods on nodes read from YAML files with the scheduler's own core."""
