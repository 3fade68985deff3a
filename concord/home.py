"""Where Concord keeps what nobody placed elsewhere: ``$CONCORD_HOME`` (default ``./data``).

Each default below has its own variable, which wins when set:

* the home folder: ``$CONCORD_HOME``, else ``data`` (relative to the working directory);
* the registry of data snapshots and contracts: ``$CONCORD_REGISTRY``, else ``<home>/registry``;
* MLflow: ``$MLFLOW_TRACKING_URI``, else a sqlite database ``<home>/mlflow.db`` (absolute path);
* how far each federation ledger went when this machine last verified it: ``<home>/ledgers-seen.json``
  (:mod:`concord.federation.seen`);
* the SHA-256 of files this machine exported to OCI registries: ``<home>/oci-sha256/``
  (:mod:`concord.oci.memo`).

The CLI, the tasks and the flows all ask here, so one setting moves all of them together.
Standard library only.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

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


@contextmanager
def patched_environ(values: Mapping[str, str], cleared: tuple[str, ...] = ()) -> Iterator[None]:
    """Set ``values`` and remove ``cleared`` in ``os.environ``; restore everything afterwards."""
    saved = {k: os.environ.get(k) for k in (*values, *cleared)}
    for k in cleared:
        os.environ.pop(k, None)
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
