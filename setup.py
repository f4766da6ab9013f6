"""Build the optional C extension ``ojs_codec._speedups`` (the metadata is in pyproject.toml).

``optional=True``: without a C compiler the install still succeeds, and ``ojs_codec`` runs
its pure-Python code (see ``codec/ojs_codec/_accel.py``).
"""

from setuptools import Extension, setup

setup(ext_modules=[Extension("ojs_codec._speedups", ["codec/ojs_codec/_speedups.c"], optional=True)])
