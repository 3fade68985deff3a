"""Where Concord keeps what nobody placed elsewhere: ``$CONCORD_HOME`` (default ``./data``).

Each default below has its own variable, which wins when set:

* the home folder: ``$CONCORD_HOME``, else ``data`` (relative to the working directory);
* the registry of data snapshots and contracts: ``$CONCORD_REGISTRY``, else ``<home>/registry``;
* MLflow: ``$MLFLOW_TRACKING_URI``, else a sqlite database ``<home>/mlflow.db`` (absolute path).

The CLI, the tasks and the flows all ask here, so one setting moves all of them together.
Standard library only.
"""

from __future__ import annotations

import os

#: the home folder when ``$CONCORD_HOME`` is not set (relative to the working directory)
DEFAULT_HOME = "data"


def concord_home() -> str:
    """``$CONCORD_HOME``, else ``data``; not created here."""
    return os.environ.get("CONCORD_HOME") or DEFAULT_HOME


def default_registry() -> str:
    """The store of data snapshots and contracts: ``$CONCORD_REGISTRY``, else ``<home>/registry``."""
    env = os.environ.get("CONCORD_REGISTRY", "").strip()
    if env:
        return env
    return os.path.join(concord_home(), "registry")


def default_tracking_uri() -> str:
    """``$MLFLOW_TRACKING_URI``, else a sqlite database in ``$CONCORD_HOME`` (default ``./data``)."""
    uri = os.environ.get("MLFLOW_TRACKING_URI", "").strip()
    if uri:
        return uri
    return f"sqlite:///{os.path.abspath(os.path.join(concord_home(), 'mlflow.db'))}"
