"""Build arc_cy: the compiled ARC core, or a pure-Python package.

Environment variables read at build time:
    ARC_CY_NO_EXTENSIONS  true (1, true, yes, on; arc_cy/_flags.py): build no
                          extension (a pure-Python wheel). Interpreters other than CPython
                          always get that: the core reads CPython's ctypes
                          object layout.
    ARC_CY_SANITIZE       comma-separated sanitizers (e.g. "address,undefined")
                          added as -fsanitize=... to compile and link flags.
    ARC_CY_ANNOTATE       true: write Cython's annotated HTML next to the .pyx.

Cython runs at build_ext time (a build requirement in pyproject.toml), so an
sdist carries the .pyx and never a generated .c.
"""

import importlib.util
import os
import platform
import sysconfig

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext
from setuptools.command.build_py import build_py
from setuptools.errors import CCompilerError, CompileError, ExecError, PlatformError


def _load_env_flag():  # arc_cy/_flags.py by path: the package is not importable yet
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "arc_cy", "_flags.py")
    spec = importlib.util.spec_from_file_location("_arc_cy_env", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.env_flag


env_flag = _load_env_flag()
NO_EXTENSIONS = env_flag("ARC_CY_NO_EXTENSIONS")
PURE = NO_EXTENSIONS or platform.python_implementation() != "CPython"

HOW_TO_FIX = """
arc_cy: building the compiled core failed ({error}).
It needs a C compiler and the Python headers, e.g. on Debian/Ubuntu:
    apt-get install gcc python3-dev
or install a wheel built where a compiler is available: arc_cy is not on
PyPI, so build one there from a checkout with .ci/wheel.sh (it lands in
wheelhouse/) or `pip wheel --no-deps -w dist .` (in dist/), then
`pip install arc_cy-*.whl` here. To install the (much slower) pure-Python
implementation, build with ARC_CY_NO_EXTENSIONS=1, from a checkout or an
unpacked sdist:
    ARC_CY_NO_EXTENSIONS=1 pip install .
or from the sdist file:
    ARC_CY_NO_EXTENSIONS=1 pip install arc_cy-*.tar.gz
"""


class BuildExt(build_ext):
    """Cythonize at build time, and say what to do when compiling fails."""

    def finalize_options(self):
        from Cython import __version__ as cython_version
        from Cython.Build import cythonize

        for ext in self.distribution.ext_modules:
            # Recorded in the module: `python -m arc_cy` reports the Cython
            # that built it, not whichever one is installed at run time.
            ext.define_macros.append(("ARC_CY_CYTHON_VERSION", f'"{cython_version}"'))
        self.distribution.ext_modules[:] = cythonize(
            self.distribution.ext_modules,
            annotate=env_flag("ARC_CY_ANNOTATE"),
            compiler_directives={"language_level": "3"},
        )
        super().finalize_options()

    def run(self):
        try:
            super().run()
        except (CCompilerError, CompileError, ExecError, PlatformError) as exc:
            raise SystemExit(HOW_TO_FIX.format(error=exc)) from exc


class BuildPy(build_py):
    """Copy the package, then drop from the build directory every file that
    this build does not make. An in-tree build (`pip install .`) reuses
    build/lib and the wheel takes all of it: a module since deleted or
    renamed, or a core left by a compiled build in a pure one, would be
    installed."""

    def run(self):
        super().run()
        made = {os.path.normpath(path) for path in self.get_outputs()}
        suffix = sysconfig.get_config_var("EXT_SUFFIX")
        for ext in self.distribution.ext_modules or ():
            made.add(os.path.normpath(os.path.join(self.build_lib, *ext.name.split("."))) + suffix)
        for package in self.packages or ():
            folder = os.path.join(self.build_lib, *package.split("."))
            for name in sorted(os.listdir(folder)):
                path = os.path.normpath(os.path.join(folder, name))
                if os.path.isfile(path) and path not in made:
                    self.announce(f"removing {path}: not in this build", level=2)
                    os.remove(path)


# Release builds: optimised, no debug info in the shared object.
compile_args = ["-O3", "-g0"]
link_args = ["-Wl,--strip-debug"]
sanitize = os.environ.get("ARC_CY_SANITIZE", "").strip()
if sanitize:
    flags = [f"-fsanitize={sanitize}", "-fno-omit-frame-pointer", "-g"]
    compile_args = ["-O1", *flags, "-fno-sanitize-recover=undefined"]
    link_args = flags

extensions = []
if not PURE:
    extensions.append(
        Extension(
            "arc_cy._core.arc",
            ["arc_cy/_core/arc.pyx"],
            depends=[
                "arc_cy/_core/layout.h",
                "arc_cy/_core/siphash.h",
                "arc_cy/_core/capi.pxd",
                "arc_cy/_core/nodes.pxd",
                "arc_cy/_core/table.pxd",
                "arc_cy/_core/work.pxd",
            ],
            extra_compile_args=compile_args,
            extra_link_args=link_args,
        )
    )

setup(ext_modules=extensions, cmdclass={"build_ext": BuildExt, "build_py": BuildPy})
