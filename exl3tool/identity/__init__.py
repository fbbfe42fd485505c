"""Byte identities: one hashing engine (`engine`), the MSRT base compatibility identity
(`compat`, sha256, docs/formats/msrt.md §6) and exl3tool's fast logical identity (`fast`)."""
