"""The one compiled module: the Avro codec (postbacks/avro_c.pyx). Everything else is in
pyproject.toml."""

from Cython.Build import cythonize
from setuptools import Extension, setup

setup(ext_modules=cythonize(
    [Extension("postbacks.avro_c", ["postbacks/avro_c.pyx"], extra_compile_args=["-O2"])],
    compiler_directives={"language_level": "3"},
))
