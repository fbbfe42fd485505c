"""Structure-aware fuzzing of exl3tool's library entry points (issue 15): `campaign` runs it."""
