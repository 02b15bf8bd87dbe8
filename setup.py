"""The package list (the rest of the metadata is in setup.cfg): the repository's spark/ and plugins/
folders install as ``federator_spark`` and ``federator_plugins``, so that they never collide with
another project's top-level ``spark`` or ``plugins`` in site-packages."""

from setuptools import find_packages, setup

RENAMED = {"federator_spark": "spark", "federator_plugins": "plugins"}


def renamed(package: str, folder: str) -> list[str]:
    return [package, *(f"{package}.{sub}" for sub in find_packages(folder))]


setup(
    packages=[*find_packages(include=["federator", "federator.*"]),
              *(p for package, folder in RENAMED.items() for p in renamed(package, folder))],
    package_dir=RENAMED,
)
