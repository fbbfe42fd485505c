"""MSRT expert cartridges (`fq-cartridge-adapter/3`): model, runtime tables, staging (no torch)."""
