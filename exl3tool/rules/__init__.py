"""The bottom layer: the rule registry, findings, user-facing error types and every family's rule catalogue."""
