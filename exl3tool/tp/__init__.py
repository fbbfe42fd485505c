"""Tensor-parallel slicing: plans (pure) and writers."""
