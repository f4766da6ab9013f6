"""Build the optional C extension ``codec._speedups`` (the metadata is in pyproject.toml).

``optional=True``: without a C compiler the install still succeeds, and ``codec`` runs
its pure-Python code (see ``codec/_accel.py``).
"""

from setuptools import Extension, setup

setup(ext_modules=[Extension("codec._speedups", ["codec/_speedups.c"], optional=True)])
