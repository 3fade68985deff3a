"""The run forms of the Prefect UI: what the deployed flows' parameter schemas offer and refuse."""

from __future__ import annotations

import pytest
from prefect.exceptions import ParameterTypeError
from prefect.utilities.callables import parameter_schema

from concord_pipelines import flows


def _props(flow) -> dict:
    return parameter_schema(flow).model_dump_for_openapi()["properties"]


def _choices(prop: dict) -> list | None:
    if "enum" in prop:
        return prop["enum"]
    return next((alt["enum"] for alt in prop.get("anyOf", []) if "enum" in alt), None)


def test_every_parameter_of_every_pipeline_is_described():
    undescribed = [(getattr(flows, n).name, k) for n in flows.__all__ for k, p in _props(getattr(flows, n)).items()
                   if not p.get("description")]
    assert undescribed == []


def _deployed_flows() -> list:
    """Every flow prefect.yaml deploys, as the worker loads it."""
    from pathlib import Path

    import yaml
    from prefect.flows import load_flow_from_entrypoint

    root = Path(__file__).resolve().parents[3]
    entrypoints = {d["entrypoint"] for d in yaml.safe_load((root / "prefect.yaml").read_text())["deployments"]}
    return [load_flow_from_entrypoint(str(root / e)) for e in sorted(entrypoints)]


def test_no_form_or_deployment_text_hides_a_placeholder_in_angle_brackets():
    """The UI renders descriptions as markdown and drops <tags>: "the refs <tenant>/<name>" would
    read "the refs /". Placeholders are written in capitals (TENANT/NAME)."""
    import re

    tag = re.compile(r"<[A-Za-z_][A-Za-z0-9_ -]*>")
    hidden = []
    for fl in _deployed_flows():
        texts = {"description": fl.description or ""}
        texts |= {k: p.get("description", "") for k, p in _props(fl).items()}
        hidden += [(fl.name, k, t) for k, t in texts.items() if tag.search(t)]
    assert hidden == []


@pytest.mark.parametrize("flow, name, choices", [
    (flows.lora_federation, "method", ["exact", "stack", "fedavg", "fedex"]),
    (flows.lora_federation, "robust", ["none", "krum", "trimmed"]),
    (flows.restore_checkpoint_flow, "tier", ["nearest", "hot", "warm", "cold"]),
    (flows.nightly_drift_audit, "fail_on", ["critical", "warning", "never"]),
])
def test_choices_are_drop_downs(flow, name, choices):
    assert _choices(_props(flow)[name]) == choices


def test_refs_and_numbers_are_checked_in_the_form():
    snap = _props(flows.snapshot_checkpoint)
    assert snap["chunk_size_mib"]["minimum"] == 1 and snap["chunk_size_mib"]["maximum"] == 64
    ref_pattern = next(alt["pattern"] for alt in snap["ref"]["anyOf"] if "pattern" in alt)
    assert ref_pattern.startswith("^") and ref_pattern.endswith("$")
    assert _props(flows.rollback_ref)["ref"]["pattern"] == ref_pattern
    assert _props(flows.snapshot_checkpoint)["store"]["minLength"] == 1


@pytest.mark.parametrize("flow, params, named", [
    (flows.snapshot_checkpoint, {"source": "x", "store": "s3://"}, "store"),
    (flows.snapshot_checkpoint, {"source": "x", "store": "nosuchscheme:abc"}, "unknown scheme"),
    (flows.snapshot_checkpoint, {"source": "x", "store": "s3://Bad_Bucket/p"}, "bucket names"),
    (flows.snapshot_checkpoint, {"source": "x", "ref": "models/../x"}, "ref"),
    (flows.snapshot_checkpoint, {"source": "x", "ref": "a/b/c"}, "ref"),
    (flows.rollback_ref, {"store": "file://elsewhere/x"}, "file:// URIs must name a local path"),
    (flows.register_model_version, {"holders": ["data/stores/a", ""]}, "holders"),
    (flows.nightly_drift_audit, {"stores": ["s3://"]}, "stores"),
])
def test_a_bad_store_or_ref_is_refused_before_the_run_does_anything(flow, params, named):
    with pytest.raises(ParameterTypeError) as caught:
        flow.validate_parameters(params)
    assert named in str(caught.value)


@pytest.mark.parametrize("store", ["data/stores/us-east", "/abs/path", "file:///abs/path", "s3://bucket/prefix",
                                   "s3://bucket", "block:us-east"])
def test_good_store_addresses_pass(store):
    flows.snapshot_checkpoint.validate_parameters({"source": "x", "store": store, "ref": "models/m"})


NAMED = [  # (flow, parameter, the other parameters it needs)
    (flows.snapshot_checkpoint, "ref", {"source": "x"}),
    (flows.lora_federation, "tenant", {"clusters": ["data/stores/a"], "adapters": ["x"]}),
    (flows.lora_federation, "out_name", {"tenant": "t", "clusters": ["data/stores/a"], "adapters": ["x"]}),
    (flows.register_data_snapshot, "name", {"source": "x"}),
    (flows.tier_checkpoints, "name", {"policy": "p.yaml"}),
    (flows.restore_checkpoint_flow, "name", {"policy": "p.yaml", "out_dir": "o"}),
    (flows.nightly_drift_audit, "name", {}),
]


@pytest.mark.parametrize("flow, param, others", NAMED)
@pytest.mark.parametrize("name, ok", [("a.b_c-1", True), ("x" * 128, True), ("a..b", False), (".a", False),
                                      ("x" * 129, False), ("a b", False)])
def test_a_name_form_takes_what_the_core_takes(flow, param, others, name, ok):
    """The form's pattern (checked by the server as by the UI) and the run's own check agree with
    the core's name rule, '..' included."""
    from prefect.utilities.schema_tools import validate

    from concord.errors import InvalidNameError
    from concord.stores.base import validate_segment

    value = f"models/{name}" if param == "ref" else name
    try:
        validate_segment(name)
        core_ok = True
    except InvalidNameError:
        core_ok = False
    assert core_ok is ok
    schema = parameter_schema(flow).model_dump_for_openapi()
    form_errors = validate({**others, param: value}, schema, ignore_required=True)
    assert (not any(param in list(e.absolute_path) for e in form_errors)) is ok
    if ok:
        flow.validate_parameters({**others, param: value})
    else:
        with pytest.raises(ParameterTypeError) as caught:
            flow.validate_parameters({**others, param: value})
        assert param in str(caught.value)


def test_every_deployment_is_named_for_what_it_does():
    """Not 16 rows of "default" in the UI: each name says what its defaults do, and no two alike."""
    from pathlib import Path

    import yaml

    root = Path(__file__).resolve().parents[3]
    names = [d["name"] for d in yaml.safe_load((root / "prefect.yaml").read_text())["deployments"]]
    assert "default" not in names
    assert all(n == n.lower() and " " not in n and len(n) >= 5 for n in names), names
    # the UI's deployments list shows the name first: two alike, or one word ("nightly", "weekly",
    # "penguins"), say nothing on their own
    assert len(set(names)) == len(names), sorted(n for n in names if names.count(n) > 1)
    assert all("-" in n for n in names), [n for n in names if "-" not in n]
