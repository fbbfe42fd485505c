"""The one compiled module (`exl3tool.io._header_scan`, native/header_scan.c); everything else
is in pyproject.toml. `optional`: without a C compiler the build goes on, and the package uses
its pure-Python scan (same results, slower on headers of 10^5 tensors)."""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "exl3tool.io._header_scan",
            ["native/header_scan.c"],
            optional=True,
            extra_compile_args=["-O2"],
        )
    ]
)
