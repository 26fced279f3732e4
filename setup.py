"""Maps the repository's top-level folders onto the ``gradient_doctor`` import namespace.

Everything else about the distribution is in pyproject.toml; only the package list, which
setuptools cannot prefix on its own, is computed here.
"""

from setuptools import find_packages, setup

FOLDERS = ("knowledge", "probes", "templates", "skill_server")

setup(
    packages=[
        f"gradient_doctor.{name}"
        for name in find_packages(include=[f"{folder}*" for folder in FOLDERS])
    ],
    package_dir={"gradient_doctor": "."},
)
