"""OCI interop: a snapshot published to a registry as a CNCF ModelPack artifact, and imported back
with the same root.

- :mod:`~concord.oci.reference`: ``REGISTRY/REPO:TAG`` parsed once;
- :mod:`~concord.oci.registry`: the distribution API over HTTP (blobs, manifests, referrers, auth);
- :mod:`~concord.oci.modelpack`: media types, annotations, the model config, the import checks;
- :mod:`~concord.oci.export` and :mod:`~concord.oci.importer`: the two directions;
- :mod:`~concord.oci.signatures`: signatures as OCI referrers;
- :mod:`~concord.oci.publish`: a model version's publication recorded in MLflow.
"""

from __future__ import annotations

from concord.oci.export import ExportResult, export_oci
from concord.oci.importer import ImportResult, import_oci
from concord.oci.reference import Reference, parse_reference

__all__ = ["ExportResult", "ImportResult", "Reference", "export_oci", "import_oci", "parse_reference"]
