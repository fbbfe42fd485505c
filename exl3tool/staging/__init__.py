"""Staging a cartridge into a verified, deployable, TP-ready directory (what the serving runtime does before a hot swap)."""
