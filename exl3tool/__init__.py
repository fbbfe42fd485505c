"""exl3tool: validate, identify, slice, stage and verify EXL3 checkpoints and MSRT cartridges."""

__version__ = "0.1.0"
