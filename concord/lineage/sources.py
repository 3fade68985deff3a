"""What a model version's ``source`` names, and the weights it gives.

A Concord model version's source is a ``concord://`` URI naming the snapshot and the stores that
held it when it was registered::

    concord:///<root>?store=s3://models/us-east&store=/data/stores/eu-west

Nothing else is in it: a store is its address (an S3 endpoint and its credentials come from the
environment, as for every Concord command), so the URI means the same on every machine that can
reach one of the stores. Any MLflow client downloading ``models:/NAME@ALIAS`` gets the checkpoint's
files through the artifact repository :mod:`concord.lineage.artifacts` registers for the scheme:
:class:`SnapshotSource` restores them from the nearest store holding the root (the replicas
lineage records as well as the URI's stores), every byte checked against the root, under the
trust policy of ``$CONCORD_TRUSTED_KEYS`` as the CLI applies it.

Versions registered before name the manifest (``file:///…/manifests/<root>.json``,
``s3://…/manifests/<root>.json``, or ``concord-file://HOST/…/manifests/<root>.json`` for a
folder seen by a remote server); :func:`parse_source` reads each of them too.
"""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, quote, unquote, urlencode, urlparse

from concord.errors import ConcordError, LineageError, LocalFileError, UntrustedRootError
from concord.hashing import is_digest

if TYPE_CHECKING:  # pragma: no cover
    from concord.progress import Progress
    from concord.snapshots.manifest import FileEntry, Manifest
    from concord.stores.base import Store
    from concord.trust import TrustPolicy

#: the scheme of a Concord model version's source
SCHEME = "concord"
#: the scheme of sources registered before, for a folder seen by a remote tracking server
LEGACY_FOLDER_SCHEME = "concord-file"
#: the order tiers are tried in, nearest first
TIER_ORDER = {"hot": 0, "warm": 1, "cold": 2}


@dataclass(frozen=True)
class SnapshotLocation:
    """What a source names: the snapshot ``root`` (None when the URI's path is only ``/``, as
    MLflow leaves it after taking the last part of the path as the artifact) and the addresses of
    the ``stores`` that held it, in the order given."""

    root: str | None
    stores: tuple[str, ...]

    @property
    def uri(self) -> str:
        return snapshot_uri(self.root or "", self.stores)


def snapshot_uri(root: str, stores: Iterable[str]) -> str:
    """The source of a model version: ``concord:///<root>?store=…&store=…`` (each store once,
    in the order given)."""
    query = urlencode([("store", s) for s in dict.fromkeys(stores)], safe="/:", quote_via=quote)
    return f"{SCHEME}:///{root}" + (f"?{query}" if query else "")


def parse_source(uri: str) -> SnapshotLocation:
    """The snapshot and stores a model version's source names (``concord://`` or a source
    registered before); :class:`LineageError` naming the URI when it names none."""
    parsed = urlparse(uri)
    if parsed.scheme == SCHEME:
        path = unquote(parsed.path).strip("/")
        if path and not is_digest(path):
            raise LineageError(
                f"{uri}: the path of a concord:// URI is the 64-hex snapshot root "
                "(concord:///<root>?store=STORE); files inside it are artifact paths"
            )
        stores = tuple(s for s in parse_qs(parsed.query).get("store", []) if s.strip())
        if not stores:
            raise LineageError(f"{uri}: name the stores that hold the snapshot (concord:///<root>?store=STORE&store=...)")
        return SnapshotLocation(path or None, stores)
    folder, sep, name = unquote(parsed.path).rpartition("/manifests/")
    root = name[: -len(".json")] if name.endswith(".json") else ""
    if sep and is_digest(root) and parsed.scheme in (LEGACY_FOLDER_SCHEME, "file", "s3"):
        store = f"s3://{parsed.netloc}{folder}" if parsed.scheme == "s3" else folder
        return SnapshotLocation(root, (store,))
    raise LineageError(
        f"{uri} names no Concord snapshot: a model version registered by Concord has the source "
        "concord:///<root>?store=STORE (or, registered before, .../manifests/<root>.json)"
    )


def nearest_first(stores: Sequence[str], replicas: Iterable[Mapping[str, str]] = ()) -> list[str]:
    """``stores`` and the stores of ``replicas`` (``{"store", "tier"}``, what lineage records),
    each once, nearest first: by tier (hot, warm, cold; a store whose tier is not recorded counts
    as hot), then folders (this machine's disks) before S3, then in the order given."""
    from concord.stores.address import FOLDER, StoreAddress

    tiers: dict[str, str] = {}
    order: list[str] = []
    for r in replicas:
        order.append(r["store"])
        tiers.setdefault(r["store"], str(r.get("tier") or "hot"))
    order = list(dict.fromkeys([*stores, *order]))

    def remote(spec: str) -> int:
        try:
            return 0 if StoreAddress.parse(spec, check=False).kind == FOLDER else 1
        except ConcordError:
            return 2

    ranked = sorted(enumerate(order), key=lambda e: (TIER_ORDER.get(tiers.get(e[1], "hot"), 3), remote(e[1]), e[0]))
    return [spec for _, spec in ranked]


@dataclass(frozen=True)
class _Copy:
    """One store's copy of the snapshot, passed by the trust policy: its manifest, and the
    digests the policy wants the restored files to have (None: the root's signatures suffice)."""

    store: Store
    manifest: Manifest
    digests: Any


class SnapshotSource:
    """The files of snapshot ``root``, read from the nearest of ``stores`` that holds it and
    passes the trust ``policy`` (default: ``$CONCORD_TRUSTED_KEYS``, else none; ``False``: no
    check): what the MLflow artifact repository for ``concord://`` serves.

    A store that cannot be read, does not hold the root, is refused by the policy or gives a
    chunk that does not verify is passed over for the next; when none is left the error names
    each (:class:`UntrustedRootError` when the policy refused them all)."""

    def __init__(
        self,
        root: str,
        stores: Sequence[str],
        *,
        policy: TrustPolicy | None | bool = None,
        progress: Progress | None = None,
    ) -> None:
        if not is_digest(root):
            raise LineageError(f"snapshot root {root!r}: give the 64-hex root of a snapshot")
        if not stores:
            raise LineageError(f"snapshot {root}: no store is named to read it from; name one with ?store=STORE")
        self.root = root
        self.stores = list(stores)
        self._policy = policy
        self.progress = progress
        self._found: _Copy | None = None

    @property
    def policy(self) -> TrustPolicy | None:
        if self._policy is None:
            from concord.trust import load_policy

            self._policy = load_policy(None) or False
        return self._policy or None

    def manifest(self) -> Manifest:
        """The snapshot's manifest, from the nearest store that holds it and passes the policy."""
        return next(self._copies()).manifest

    def files_under(self, path: str = "") -> list[FileEntry]:
        """The snapshot's files at ``path`` (a file) or under it (a folder; ``""``: every file);
        :class:`ModelFileNotFoundError` when there are none."""
        from concord.errors import ModelFileNotFoundError

        manifest = self.manifest()
        rel = path.strip("/")
        if not rel:
            return list(manifest.files)
        found = [f for f in manifest.files if f.path == rel or f.path.startswith(rel + "/")]
        if not found:
            raise ModelFileNotFoundError(self.root, rel, [f.path for f in manifest.files])
        return found

    def restore_into(self, folder: str | os.PathLike[str], path: str = "") -> str:
        """Write the snapshot's files at or under ``path`` (``""``: all of them) into the existing
        ``folder``, at their paths in the snapshot (files there already are replaced); every byte
        is checked as it is written. Returns where ``path`` is in ``folder``."""
        from concord.progress import ensure
        from concord.snapshots.restore import restore

        dest = os.path.abspath(os.fspath(folder))
        rel = path.strip("/")
        wanted = {f.path for f in self.files_under(rel)}
        problems: list[str] = []
        for copy in self._copies(problems):
            files = tuple(f for f in copy.manifest.files if f.path in wanted)
            # digests from root-less signatures cover whole bundles: then every file is restored and checked
            part = copy.manifest if copy.digests is not None or len(files) == copy.manifest.n_files else replace(copy.manifest, files=files)
            staged = os.path.join(dest, f".concord-download-{uuid.uuid4().hex[:12]}")
            try:
                restore(copy.store, part, staged, progress=ensure(self.progress), check_root=lambda _s, _r, d=copy.digests: d)
                _move_in(staged, dest, sorted(wanted))
            except (LocalFileError, UntrustedRootError):
                raise  # this machine's disk, or the policy: another store would not help
            except ConcordError as exc:
                problems.append(f"{copy.store.uri}: {exc}")
                self._found = None
                continue
            finally:
                shutil.rmtree(staged, ignore_errors=True)
            return os.path.join(dest, *rel.split("/")) if rel else dest
        raise AssertionError("unreachable: _copies raises when no store is left")  # pragma: no cover

    def _copies(self, problems: list[str] | None = None) -> Iterator[_Copy]:
        """Each store's copy that passes the policy, nearest first (the one found before first);
        raises naming every store once none is left."""
        from concord.snapshots.refs import load_manifest
        from concord.stores import open_store_to_read

        problems = [] if problems is None else problems
        untrusted: list[UntrustedRootError] = []
        tried: set[str] = set()  # the stores' own URIs
        if self._found is not None:
            tried.add(self._found.store.uri)
            yield self._found
        for spec in self.stores:
            if spec in tried:
                continue
            try:
                store = open_store_to_read(spec)
                if store.uri in tried:  # the same store, under another address
                    continue
                tried.add(store.uri)
                if not store.has_manifest(self.root):
                    problems.append(f"{spec}: does not hold it")
                    continue
                policy = self.policy
                digests = policy.restore_check(store, self.root) if policy is not None else None
                manifest = load_manifest(store, self.root)
            except UntrustedRootError as exc:
                untrusted.append(exc)
                problems.append(f"{spec}: not signed by a trusted key")
                continue
            except ConcordError as exc:
                problems.append(f"{spec}: {exc}")
                continue
            self._found = _Copy(store, manifest, digests)
            yield self._found
        if untrusted:  # a copy was there, and the policy refused it: that is the answer
            raise untrusted[0]
        raise LineageError(
            f"snapshot {self.root} could not be read from any store that should hold it: {'; '.join(problems)}. "
            "Sync it into a store this machine reaches (`concord sync`), or check the stores' addresses and credentials"
        )


def _move_in(staged: str, dest: str, paths: list[str]) -> None:
    """Move the restored files ``paths`` from ``staged`` to the same paths in ``dest``."""
    for rel in paths:
        target = os.path.join(dest, *rel.split("/"))
        try:
            os.makedirs(os.path.dirname(target), exist_ok=True)
            os.replace(os.path.join(staged, *rel.split("/")), target)
        except OSError as exc:
            raise LocalFileError(target, exc.strerror or str(exc)) from exc


__all__ = ["SCHEME", "SnapshotLocation", "SnapshotSource", "nearest_first", "parse_source", "snapshot_uri"]
