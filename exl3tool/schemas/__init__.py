"""JSON Schemas (draft 2020-12) of every document exl3tool reads or writes, shipped as package data."""
