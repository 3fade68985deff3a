"""Publish a model version to an OCI registry as a CNCF ModelPack artifact.

Run by hand, or by the ``publish-oci`` deployment's trigger when a version is promoted to the
``champion`` alias (``concord.model.promoted`` labelled ``concord.alias: champion``). The
artifact is pushed to ``<repository>/<model name>:v<version>``; only the files the registry
lacks are uploaded; the reference and digest are recorded on the MLflow model version
(``oci.reference``, ``oci.digest``) and in a markdown artifact. Credentials come from the
worker's ``CONCORD_REGISTRY_USERNAME``/``CONCORD_REGISTRY_PASSWORD`` or its Docker config.
"""

from __future__ import annotations

from typing import Annotated

from prefect import flow
from prefect.artifacts import create_markdown_artifact
from pydantic import AfterValidator, Field

from concord_pipelines.flows._ended import ENDED_HOOKS
from concord_pipelines.flows._params import ModelName
from concord_pipelines.flows._report import human, short
from concord_pipelines.tasks.oci import publish_oci_task

DEFAULT_REPOSITORY = "127.0.0.1:5000/models"
#: what a run without a repository says (``make serve`` deploys publish-oci so when it found no registry to start)
NO_REGISTRY = (
    "no OCI registry to publish to (repository is empty): `make serve` starts one when docker-registry is installed "
    "(sudo apt-get install -y docker-registry, or `make test-prereqs`; then `make stop` and `make serve`), "
    "or give repository=REGISTRY/PATH"
)


class NoRegistryError(ValueError):
    """The run names no registry: nothing was read or pushed (a ValueError: never retried)."""


def _repository(value: str) -> str:
    from concord.errors import OciReferenceError
    from concord.oci import parse_reference

    try:
        parse_reference(f"{value.rstrip('/')}/model:v1")
    except OciReferenceError as exc:
        raise ValueError(str(exc).replace("/model:v1", "")) from None
    return value


Repository = Annotated[
    str,
    Field(min_length=3, examples=["registry.example.com:5000/models", "ghcr.io/org/models"], description="REGISTRY/PATH; the model's name and tag are added."),
    AfterValidator(_repository),
]
Tag = Annotated[str, Field(pattern=r"^[A-Za-z0-9_][A-Za-z0-9._-]{0,127}$", description="The tag to push (default: vVERSION).")]


@flow(name="publish-oci", **ENDED_HOOKS)
def publish_oci(
    name: ModelName,
    version: Annotated[int, Field(ge=1, description="The model version number.")],
    repository: Repository | None = DEFAULT_REPOSITORY,
    tag: Tag | None = None,
    plain_http: bool = False,
    tracking_uri: str | None = None,
) -> dict:
    """Push model version ``name``/``version`` to ``repository``/``name``:``tag`` as a ModelPack
    artifact and record the pushed reference and digest on the MLflow model version.

    Args:
        name: The registered model's name.
        version: The version to publish.
        repository: Registry and path the artifact goes under (REGISTRY/PATH); `make serve` gives the
            registry it starts, or none when it could not start one (the run then says how to get one).
        tag: The tag (default vVERSION).
        plain_http: Speak plain HTTP to the registry (HTTPS by default).
        tracking_uri: MLflow tracking URI; empty for the worker's MLFLOW_TRACKING_URI (else the
            embedded sqlite database).
    """
    if not repository:
        raise NoRegistryError(NO_REGISTRY)
    r = publish_oci_task(name, version, repository, tag or None, plain_http, tracking_uri=tracking_uri or None)
    create_markdown_artifact(
        f"## `{name}` version {version} published\n\n"
        f"- reference: `{r['reference']}`\n- digest: `{r['digest']}`\n- snapshot: {short(r['root'])}\n"
        f"- {r['layers']} layers, {human(r['bytes'])}; uploaded {r['layers_uploaded']} layer(s), {human(r['bytes_uploaded'])}\n"
        + (f"- signatures attached: {', '.join(f'`{k[:12]}`' for k in r['signatures'])}\n" if r["signatures"] else ""),
        key="oci-publication",
        description=f"{name}/{version} → {r['reference']}",
    )
    return r
