"""Builds the tokenloop package: runs the repository's Makefile for the shared
library (make BUILD=DIR DIR/libtokenloop.so, the library's own objects and
warnings-as-errors flags) and puts libtokenloop.so inside the package.

Environment:
  TOKENLOOP_ROOT       the repository (default: the folder above this one)
  TOKENLOOP_BUILD_DIR  make's BUILD folder (default: build-python in the
                       repository; a folder whose objects are built already,
                       e.g. build, only links)
  TOKENLOOP_SO         a libtokenloop.so built already: copied, make not run
  CC, SAN              passed to make as the Makefile reads them"""
import os
import re
import shutil
import subprocess
import sys

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.dist import Distribution

HERE = os.path.dirname(os.path.abspath(__file__))


def repo_root():
    root = os.environ.get("TOKENLOOP_ROOT") or os.path.dirname(HERE)
    if not (os.path.isfile(os.path.join(root, "Makefile")) and
            os.path.isfile(os.path.join(root, "include", "tokenloop.h"))):
        sys.exit(f"tokenloop: no repository at {root} (Makefile, include/tokenloop.h): build from a clone "
                 "('pip install ./python' in its root) or set TOKENLOOP_ROOT")
    return root


def version():
    try:
        with open(os.path.join(repo_root(), "include", "tokenloop.h")) as f:
            return re.search(r'#define TL_VERSION "([^"]+)"', f.read()).group(1)
    except (OSError, AttributeError):
        return "0.0.0"


def build_library():
    """The path of a built libtokenloop.so."""
    so = os.environ.get("TOKENLOOP_SO")
    if so:
        if not os.path.isfile(so):
            sys.exit(f"tokenloop: TOKENLOOP_SO={so}: no such file")
        return so
    root = repo_root()
    build = os.environ.get("TOKENLOOP_BUILD_DIR") or "build-python"
    target = os.path.join(build, "libtokenloop.so")
    cmd = ["make", "-C", root, f"-j{os.cpu_count() or 1}", f"BUILD={build}", target]
    print("tokenloop:", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True)
    return target if os.path.isabs(target) else os.path.join(root, target)


class BuildPy(build_py):
    """The Python files, then the library beside them."""

    def run(self):
        shutil.rmtree(os.path.join(self.build_lib, "tokenloop"), ignore_errors=True)  # no stale files
        super().run()
        so = build_library()
        dests = [os.path.join(self.build_lib, "tokenloop")]
        if getattr(self, "editable_mode", False):  # pip install -e: the source folder is the package
            dests.append(os.path.join(HERE, "tokenloop"))
        for d in dests:
            os.makedirs(d, exist_ok=True)
            out = os.path.join(d, "libtokenloop.so")
            shutil.copy2(so, out)
            if shutil.which("strip"):  # the debug information stays in the build folder's copy
                subprocess.run(["strip", "--strip-debug", out], check=True)


class BinaryDistribution(Distribution):
    """Not pure Python: the wheel carries a shared object."""

    def has_ext_modules(self):
        return True


cmdclass = {"build_py": BuildPy}

try:  # setuptools >= 70.1 has bdist_wheel; older ones take wheel's
    from setuptools.command.bdist_wheel import bdist_wheel
except ImportError:
    try:
        from wheel.bdist_wheel import bdist_wheel
    except ImportError:
        bdist_wheel = None

if bdist_wheel:
    class BdistWheel(bdist_wheel):
        """A platform wheel (it carries a shared object) for any Python 3:
        ctypes, no extension module."""

        def get_tag(self):
            return ("py3", "none", super().get_tag()[2])

    cmdclass["bdist_wheel"] = BdistWheel

setup(version=version(), cmdclass=cmdclass, distclass=BinaryDistribution,
      package_data={"tokenloop": ["libtokenloop.so"]}, zip_safe=False)
