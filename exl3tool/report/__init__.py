"""Renderers of a `Report`: rich text, JSON (exl3tool-report/1), SARIF 2.1.0, JUnit XML."""
