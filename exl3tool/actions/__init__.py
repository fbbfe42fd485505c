"""Actions: validate, stage, slice, verify-swap, check — typed options in, one Report out."""
