"""Typed models of artifacts (checkpoints, EXL3 linears, R7, bases, cartridges). No torch."""
