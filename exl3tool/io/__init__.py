"""Bytes on disk: strict parsers, zero-copy views, safe paths and atomic writers. No torch."""
