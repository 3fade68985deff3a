"""The MLflow artifact repository of ``concord://`` URIs: ``models:/NAME@ALIAS`` gives the weights.

MLflow finds :class:`ConcordArtifactRepository` through the ``mlflow.artifact_repository`` entry
point (``concord`` and, for versions registered before, ``concord-file``), so any MLflow client
resolving a Concord model version (``mlflow.artifacts.download_artifacts("models:/minilm@champion")``,
``MlflowClient().download_artifacts``, notebooks, ``mlflow models`` tooling) reads the checkpoint's
files themselves: restored from the nearest store holding the snapshot, every byte checked, under
the trust policy of ``$CONCORD_TRUSTED_KEYS`` (:class:`~concord.lineage.sources.SnapshotSource`).

The stores tried are those the version's source names and, when the model registry is known (the
client resolving ``models:/`` passes it, or ``MLFLOW_TRACKING_URI`` / ``MLFLOW_REGISTRY_URI`` names
it), every replica lineage records for the root since (``replicas``, updated by replication).
Listing gives the snapshot's files and folders; a sub-path (``models:/minilm@champion/config.json``)
gives that file alone. Nothing is ever written through it.

MLflow imports this module when it loads its artifact repositories; the rest of Concord never
imports it.
"""

from __future__ import annotations

import logging
import os
import posixpath
import warnings

with warnings.catch_warnings():
    # this import starts MLflow's artifact registry, which loads its entry points; two of them
    # name this module, not yet defined: MLflow warns and leaves them out, and _register() below
    # adds them once the class exists, so that warning says nothing true
    warnings.filterwarnings("ignore", message=r'Failure attempting to register artifact repository for scheme "concord', category=UserWarning)
    from mlflow.entities.file_info import FileInfo
    from mlflow.store.artifact.artifact_repo import ArtifactRepository

from concord.errors import LineageError, ReadOnlyArtifactsError
from concord.hashing import is_digest
from concord.lineage.sources import SnapshotLocation, SnapshotSource, nearest_first, parse_source

_log = logging.getLogger(__name__)


class ConcordArtifactRepository(ArtifactRepository):
    """The files of the snapshot a ``concord://`` URI names, read-only."""

    def __init__(self, artifact_uri: str, tracking_uri: str | None = None, registry_uri: str | None = None) -> None:
        super().__init__(artifact_uri, tracking_uri, registry_uri)
        self.location: SnapshotLocation = parse_source(artifact_uri)
        self._sources: dict[str, SnapshotSource] = {}

    # ------------------------------------------------------------------ reading

    def list_artifacts(self, path: str | None = None) -> list[FileInfo]:
        """The files and folders directly under ``path`` in the snapshot (none for a file)."""
        root, rel = self._split(path or "")
        manifest = self._source(root).manifest()
        if any(f.path == rel for f in manifest.files):
            return []
        prefix = f"{rel}/" if rel else ""
        found: dict[str, FileInfo] = {}
        for f in manifest.files:
            if not f.path.startswith(prefix):
                continue
            head, sep, _ = f.path[len(prefix):].partition("/")
            shown = self._shown(root, prefix + head)
            found.setdefault(shown, FileInfo(shown, True, None) if sep else FileInfo(shown, False, f.size))
        if rel and not found:
            self._source(root).files_under(rel)  # raises, naming the snapshot's files
        return sorted(found.values(), key=lambda i: i.path)

    def download_artifacts(self, artifact_path: str, dst_path: str | None = None) -> str:
        """Restore the file or folder ``artifact_path`` (``""``: the whole snapshot) into
        ``dst_path`` (default: a new temporary folder); returns where it is there."""
        from mlflow.utils.file_utils import create_tmp_dir

        dest = os.path.abspath(dst_path) if dst_path else create_tmp_dir()
        if not os.path.isdir(dest):
            raise LineageError(f"download destination {dest} is not an existing folder: create it first")
        root, rel = self._split(artifact_path or "")
        return self._source(root).restore_into(dest, rel)

    def _download_file(self, remote_file_path: str, local_path: str) -> None:
        """Restore the one file ``remote_file_path`` to ``local_path``."""
        folder = os.path.dirname(os.path.abspath(local_path))
        os.makedirs(folder, exist_ok=True)
        root, rel = self._split(remote_file_path)
        placed = self._source(root).restore_into(folder, rel)
        if os.path.abspath(placed) != os.path.abspath(local_path):
            os.replace(placed, local_path)
            _remove_empty_parents(os.path.dirname(placed), folder)

    # ------------------------------------------------------------------ writing: never

    def log_artifact(self, local_file: str, artifact_path: str | None = None) -> None:
        raise ReadOnlyArtifactsError(self.artifact_uri)

    def log_artifacts(self, local_dir: str, artifact_path: str | None = None) -> None:
        raise ReadOnlyArtifactsError(self.artifact_uri)

    def delete_artifacts(self, artifact_path: str | None = None) -> None:
        raise ReadOnlyArtifactsError(self.artifact_uri)

    # ------------------------------------------------------------------ helpers

    def _split(self, path: str) -> tuple[str, str]:
        """The root and the path in the snapshot that ``path`` names. A URI whose path is only
        ``/`` (MLflow cuts the last part of ``concord:///<root>`` off as the artifact path) takes
        the root from the first part of ``path``."""
        rel = posixpath.normpath(path.strip("/")) if path.strip("/") else ""
        if rel.startswith("..") or rel.startswith("/"):
            raise LineageError(f"artifact path {path!r}: name a file inside the snapshot, without '..'")
        if self.location.root is not None:
            return self.location.root, rel
        head, _, rest = rel.partition("/")
        if not is_digest(head):
            raise LineageError(
                f"{self.artifact_uri} names no snapshot root: give concord:///<root>?store=STORE "
                "(the 64-hex root, as the model version's source has it)"
            )
        return head, rest

    def _shown(self, root: str, rel: str) -> str:
        """A path of the snapshot as a listing gives it (after the root, where the URI lacks one)."""
        return rel if self.location.root is not None else f"{root}/{rel}"

    def _source(self, root: str) -> SnapshotSource:
        source = self._sources.get(root)
        if source is None:
            from concord.progress import TqdmProgress

            stores = nearest_first(self.location.stores, self._replicas(root))
            source = self._sources[root] = SnapshotSource(root, stores, progress=TqdmProgress())
        return source

    def _replicas(self, root: str) -> list[dict]:
        """The replicas lineage records for ``root``, when a model registry is known; none when
        it cannot be asked (the URI's stores are then all there is)."""
        uri = self.registry_uri or self.tracking_uri or _registry_from_environment()
        if not uri or not uri.startswith(("http://", "https://", "sqlite:", "postgresql", "mysql")):
            return []
        from concord.lineage.client import Tracking
        from concord.lineage.registry import search_tagged
        from concord.lineage.tags import TAG_ROOT, read_tags, replicas_of

        try:
            versions = search_tagged(Tracking(uri), TAG_ROOT, root)
        except Exception as exc:  # the lineage only adds stores: without it the URI's are tried
            _log.debug("no replicas of %s from %s: %s", root, uri, exc)
            return []
        return [h for mv in versions for h in replicas_of(read_tags(mv.tags))]


def _registry_from_environment() -> str | None:
    """The model registry MLflow's client uses, when one is set (never MLflow's default, which
    would make a database where none was asked for)."""
    from mlflow.tracking._tracking_service.utils import is_tracking_uri_set

    if os.environ.get("MLFLOW_REGISTRY_URI"):
        return os.environ["MLFLOW_REGISTRY_URI"]
    if is_tracking_uri_set():
        import mlflow

        return str(mlflow.get_registry_uri())
    return None


def _remove_empty_parents(folder: str, stop: str) -> None:
    """Remove ``folder`` and its parents up to ``stop`` while they are empty."""
    while os.path.abspath(folder).startswith(os.path.abspath(stop) + os.sep):
        try:
            os.rmdir(folder)
        except OSError:
            return
        folder = os.path.dirname(folder)


__all__ = ["ConcordArtifactRepository"]


def _register() -> None:
    """Register the schemes with MLflow's registry. Its entry points name this module, but when
    this module is imported first MLflow loads them while the class is not yet defined (the import
    of ``ArtifactRepository`` above starts the registry), warns, and leaves the schemes out."""
    from mlflow.store.artifact.artifact_repository_registry import _artifact_repository_registry as registry

    for scheme in ("concord", "concord-file"):
        registry.register(scheme, ConcordArtifactRepository)


_register()
