"""Builds the cffi extension pdlink._pdlink, and libpdlink for it (see pdlink/_build.py)."""
import re
import sys
from pathlib import Path

from setuptools import setup
from setuptools.command.build_ext import build_ext

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "pdlink"))
import _build  # noqa: E402  (pdlink/_build.py; importing pdlink itself would need the extension)


def version() -> str:
    """The one version number: project(pdlink VERSION ...) in the repository's CMakeLists.txt."""
    text = (_build.REPO / "CMakeLists.txt").read_text()
    m = re.search(r"project\(pdlink\s+VERSION\s+([0-9.]+)", text)
    if m is None:
        raise RuntimeError(f"no project(pdlink VERSION ...) in {_build.REPO / 'CMakeLists.txt'}")
    return m.group(1)


class BuildExtWithLibpdlink(build_ext):
    """Builds (or finds) libpdlink.a before the extension is compiled, and links it."""

    def run(self):
        extra = _build.link_args(_build.build_libpdlink())
        for ext in self.extensions:
            ext.extra_objects = list(ext.extra_objects or []) + extra["extra_objects"]
            # Relinked whenever libpdlink.a is newer than the extension: setuptools only compares the
            # sources and `depends`, so a build directory left from an earlier library kept its copy.
            ext.depends = list(ext.depends or []) + extra["extra_objects"]
            ext.libraries = list(ext.libraries or []) + extra["libraries"]
            ext.library_dirs = list(ext.library_dirs or []) + extra["library_dirs"]
        super().run()


setup(
    version=version(),
    cffi_modules=["pdlink/_build.py:ffibuilder"],
    cmdclass={"build_ext": BuildExtWithLibpdlink},
    # The extension uses only CPython's limited API (cffi compiles it with Py_LIMITED_API): one wheel
    # serves every CPython from 3.9 on.
    options={"bdist_wheel": {"py_limited_api": "cp39"}},
)
