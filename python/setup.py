"""Builds the cffi extension pdlink._pdlink against the repository's libpdlink (see pdlink/_build.py)."""
from setuptools import setup

setup(cffi_modules=["pdlink/_build.py:ffibuilder"])
