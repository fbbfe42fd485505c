"""The compiled modules (`exl3tool.io._header_scan`, native/header_scan.c; `exl3tool.io._spans`,
native/spans.c); everything else is in pyproject.toml. `optional`: without a C compiler the
build goes on, and the package uses its pure-Python code (same results, slower on headers of
10^5 tensors and on the R7 read-ahead)."""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "exl3tool.io._header_scan",
            ["native/header_scan.c"],
            optional=True,
            extra_compile_args=["-O2"],
        ),
        Extension(
            "exl3tool.io._spans",
            ["native/spans.c"],
            optional=True,
            extra_compile_args=["-O2"],
        ),
    ]
)
