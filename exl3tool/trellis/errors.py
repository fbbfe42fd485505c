"""The trellis layer's one user-facing error type."""

from __future__ import annotations


class TrellisError(ValueError):
    """Bad input to the trellis codec: wrong shape, dtype, K or codebook."""
