"""Which packages Concord installs (everything else is in pyproject.toml).

The core (``concord``) and the demo are installed as they lie. The pipelines live in the folders
``flows/``, ``tasks/``, ``blocks/`` and ``deployments/`` (where ``prefect.yaml``'s entrypoints name
them) and are installed under the project's namespace, as ``concord_pipelines.flows``,
``concord_pipelines.tasks``, ``concord_pipelines.blocks`` and ``concord_pipelines.deployments``, so
that no generic top-level name (``flows``, ``tasks``, ...) lands in site-packages.
"""

from setuptools import find_packages, setup

PIPELINES = ("flows", "tasks", "blocks", "deployments")

setup(
    packages=[
        *find_packages(include=["concord", "concord.*", "demo", "demo.*"]),
        *(f"concord_pipelines.{folder}{sub}" for folder in PIPELINES
          for sub in ["", *(f".{p}" for p in find_packages(where=folder))]),
    ],
    package_dir={f"concord_pipelines.{folder}": folder for folder in PIPELINES},
)
