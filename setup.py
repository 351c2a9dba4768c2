"""Build the compiled ARC core.

Environment variables:
    ARC_CY_SANITIZE   comma-separated sanitizers (e.g. "address,undefined")
                      added as -fsanitize=... to compile and link flags.
    ARC_CY_ANNOTATE   non-empty: write Cython's annotated HTML next to the .pyx.
"""

import os

from Cython.Build import cythonize
from setuptools import Extension, setup

compile_args = ["-O3"]
link_args = []
sanitize = os.environ.get("ARC_CY_SANITIZE", "").strip()
if sanitize:
    flags = [f"-fsanitize={sanitize}", "-fno-omit-frame-pointer", "-g"]
    compile_args = ["-O1", *flags, "-fno-sanitize-recover=undefined"]
    link_args = flags

extensions = [
    Extension(
        "arc_cy._arc_c",
        ["arc_cy/_arc_c.pyx"],
        extra_compile_args=compile_args,
        extra_link_args=link_args,
    )
]

setup(
    ext_modules=cythonize(
        extensions,
        annotate=bool(os.environ.get("ARC_CY_ANNOTATE")),
        compiler_directives={"language_level": "3"},
    ),
)
